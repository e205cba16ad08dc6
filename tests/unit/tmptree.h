/*
 * tmptree.h - removing a unit test's temporary directory tree in its
 * teardown.
 */
#ifndef GG_TEST_TMPTREE_H
#define GG_TEST_TMPTREE_H

#include <ftw.h>
#include <stdio.h>
#include <sys/stat.h>

static inline int tmptree_remove_entry(const char *path, const struct stat *sb, int type,
                                       struct FTW *ftw)
{
    (void)sb;
    (void)type;
    (void)ftw;
    return remove(path);
}

/* Remove dir and everything under it; 0 on success (nftw's result). */
static inline int tmptree_remove(const char *dir)
{
    return nftw(dir, tmptree_remove_entry, 16, FTW_DEPTH | FTW_PHYS);
}

#endif
