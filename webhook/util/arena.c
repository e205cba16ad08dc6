/*
 * arena.c - per-thread bump allocator behind json_set_alloc_funcs.
 */
#include "util/arena.h"

#include <jansson.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>

#define FIRST_CHUNK (64 * 1024)
/* The largest chunk kept between requests (see arena_end). */
#define KEEP_MAX (1024 * 1024)
#define ALIGN 16

struct chunk {
    struct chunk *next;
    size_t size;
    size_t used;
    _Alignas(ALIGN) unsigned char data[];
};

struct arena {
    bool active;
    struct chunk *head; /* the current chunk; older ones follow */
    struct chunk *keep; /* the chunk kept between requests */
};

static _Thread_local struct arena arena;

/* The kept chunk is also a thread-specific value, so it is freed when its
 * thread exits (server worker threads at shutdown). */
static pthread_key_t keep_key;
static pthread_once_t keep_once = PTHREAD_ONCE_INIT;
static bool keep_key_ok;

static void keep_free(void *chunk)
{
    free(chunk);
}

static void keep_key_create(void)
{
    keep_key_ok = pthread_key_create(&keep_key, keep_free) == 0;
}

static struct chunk *new_chunk(size_t size)
{
    struct chunk *c = malloc(sizeof(*c) + size);
    if (c) {
        c->next = NULL;
        c->size = size;
        c->used = 0;
    }
    return c;
}

/* A new chunk at the head, for a request that does not fit in the current one
 * (out of line: the bump below is jansson's every allocation, and stays short). */
static __attribute__((noinline)) void *arena_grow(size_t size)
{
    struct chunk *c = arena.head;
    size_t want = c ? c->size * 2 : FIRST_CHUNK;
    while (want < size)
        want *= 2;
    struct chunk *fresh = new_chunk(want);
    if (!fresh)
        return NULL;
    fresh->next = c;
    arena.head = fresh;
    fresh->used = size;
    return fresh->data;
}

static void *arena_malloc(size_t size)
{
    if (!arena.active)
        return malloc(size);
    size = (size + ALIGN - 1) & ~(size_t)(ALIGN - 1);
    struct chunk *c = arena.head;
    if (!c || c->size - c->used < size)
        return arena_grow(size);
    void *p = c->data + c->used;
    c->used += size;
    return p;
}

static bool in_arena(const void *p)
{
    for (struct chunk *c = arena.head; c; c = c->next)
        if ((const unsigned char *)p >= c->data && (const unsigned char *)p < c->data + c->size)
            return true;
    return false;
}

static void arena_free(void *p)
{
    if (p && !(arena.active && in_arena(p)))
        free(p);
}

void arena_install(void)
{
    json_set_alloc_funcs(arena_malloc, arena_free);
}

void arena_begin(void)
{
    if (!arena.keep) {
        arena.keep = new_chunk(FIRST_CHUNK);
        pthread_once(&keep_once, keep_key_create);
        if (arena.keep && keep_key_ok)
            pthread_setspecific(keep_key, arena.keep);
    }
    arena.head = arena.keep;
    if (arena.head)
        arena.head->used = 0;
    arena.active = true;
}

/*
 * The newest chunk is the largest: it becomes the kept one (up to
 * KEEP_MAX), so a thread that serves large reviews stops allocating
 * chunks, and malloc stops returning their pages to the kernel (and
 * faulting them in again) on every request.
 */
void arena_end(void)
{
    struct chunk *keep = arena.head && arena.head->size <= KEEP_MAX ? arena.head : arena.keep;
    struct chunk *c = arena.head;
    while (c) {
        struct chunk *next = c->next;
        if (c != keep)
            free(c);
        c = next;
    }
    if (keep && keep != arena.keep && keep_key_ok)
        pthread_setspecific(keep_key, keep);
    if (keep)
        keep->next = NULL;
    arena.head = arena.keep = keep;
    arena.active = false;
}

bool arena_pause(void)
{
    bool active = arena.active;
    arena.active = false;
    return active;
}

void arena_resume(bool active)
{
    arena.active = active;
}
