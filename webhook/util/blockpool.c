/*
 * blockpool.c - size-class free lists over an mmap'd reservation.
 */
#include "util/blockpool.h"

#include "util/gpuguard.h"

#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>

#define GRAIN 16
#define N_CLASSES (BLOCKPOOL_MAX / GRAIN)

#ifdef GG_ASAN
#define NO_POOL 1
#endif

struct free_block {
    struct free_block *next;
};

struct blockpool {
    char *base, *next, *end; /* the region; next: first never-used byte */
    struct free_block *free[N_CLASSES];
};

static size_t class_of(size_t size)
{
    return (size - 1) / GRAIN;
}

struct blockpool *blockpool_new(size_t reserve)
{
#ifdef NO_POOL
    (void)reserve;
    return NULL;
#else
    struct blockpool *p = calloc(1, sizeof(*p));
    if (!p)
        return NULL;
    void *region = mmap(NULL, reserve, PROT_READ | PROT_WRITE,
                        MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (region == MAP_FAILED) {
        free(p);
        return NULL;
    }
    p->base = p->next = region;
    p->end = p->base + reserve;
    return p;
#endif
}

void blockpool_free(struct blockpool *p)
{
    if (!p)
        return;
    munmap(p->base, (size_t)(p->end - p->base));
    free(p);
}

void *blockpool_get(struct blockpool *p, size_t size)
{
    size_t c = class_of(size);
    struct free_block *b = p->free[c];
    if (b) {
        p->free[c] = b->next;
        return b;
    }
    size_t bytes = (c + 1) * GRAIN;
    if ((size_t)(p->end - p->next) < bytes)
        return NULL;
    void *fresh = p->next;
    p->next += bytes;
    return fresh;
}

void blockpool_put(struct blockpool *p, void *block, size_t size)
{
    struct free_block *b = block;
    size_t c = class_of(size);
    b->next = p->free[c];
    p->free[c] = b;
}

bool blockpool_owns(const struct blockpool *p, const void *block)
{
    return p && (uintptr_t)block >= (uintptr_t)p->base && (uintptr_t)block < (uintptr_t)p->end;
}

bool blockpool_same_class(size_t a, size_t b)
{
    return class_of(a) == class_of(b);
}
