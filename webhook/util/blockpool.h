/*
 * blockpool.h - small blocks for one Lua VM, from free lists by size class.
 *
 * A request creates and frees thousands of small Lua objects (tables,
 * strings, hash parts); through glibc each costs a malloc and a free of
 * ~100 instructions.  A pool hands them out from one reserved region in
 * 16-byte size classes, with a free list per class and no headers: Lua
 * tells the allocator each block's size when it frees or resizes it.
 *
 * The region is reserved address space, touched page by page as blocks are
 * first used, so a VM's resident memory grows only as far as its peak use
 * of small blocks, and never past the reservation.  Blocks over
 * BLOCKPOOL_MAX bytes, and every block once the region is used up, are
 * for malloc.  Under AddressSanitizer there is no pool (blockpool_new
 * returns NULL), so every block stays visible to it.
 */
#ifndef GG_BLOCKPOOL_H
#define GG_BLOCKPOOL_H

#include <stdbool.h>
#include <stddef.h>

#define BLOCKPOOL_MAX 256

struct blockpool;

/* A pool over reserve bytes of address space; NULL when there is none. */
struct blockpool *blockpool_new(size_t reserve);
void blockpool_free(struct blockpool *p);

/* A block of size (1..BLOCKPOOL_MAX) bytes, or NULL when the region is used up. */
void *blockpool_get(struct blockpool *p, size_t size);
/* Give back a block of this pool, with the size it was asked for with. */
void blockpool_put(struct blockpool *p, void *block, size_t size);
/* True when block is in p's region. */
bool blockpool_owns(const struct blockpool *p, const void *block);
/* True when blocks of sizes a and b are interchangeable (same class). */
bool blockpool_same_class(size_t a, size_t b);

#endif
