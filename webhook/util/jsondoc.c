/*
 * jsondoc.c - the memory of a struct jf_doc, and its nodes read, built from
 * jansson values and turned into them.
 *
 * A document's nodes live in chunks that never move: a container's members
 * are one run of nodes, found by pointer.  jf_parse (jsonfast.c) sizes the
 * first chunk from the text's length, so a review's nodes usually take one
 * allocation; later chunks double.
 */
#include "util/jsonfast.h"
#include "util/buf.h"

#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#define CHUNK_MIN 64   /* nodes */
#define CHUNK_MAX 4096 /* nodes a chunk is sized for ahead of need (128 KiB) */

struct jf_chunk {
    struct jf_chunk *next;
    size_t used, cap;
    struct jf_node nodes[];
};

/* The bytes of a chunk of n nodes; 0 when that does not fit a size_t. */
static size_t chunk_bytes(size_t n)
{
    if (n > (SIZE_MAX - sizeof(struct jf_chunk)) / sizeof(struct jf_node))
        return 0;
    return sizeof(struct jf_chunk) + n * sizeof(struct jf_node);
}

/* A chunk with room for cap nodes, used of them taken. */
static struct jf_chunk *new_chunk(size_t cap, size_t used)
{
    size_t bytes = chunk_bytes(cap);
    struct jf_chunk *c = bytes ? malloc(bytes) : NULL;
    if (c) {
        c->next = NULL;
        c->used = used;
        c->cap = cap;
    }
    return c;
}

static struct jf_chunk *add_chunk(struct jf_doc *doc, size_t cap)
{
    struct jf_chunk *c = new_chunk(cap, 0);
    if (c) {
        c->next = doc->chunks;
        doc->chunks = c;
    }
    return c;
}

bool jf_doc_reserve(struct jf_doc *doc, size_t n)
{
    if (n < CHUNK_MIN)
        n = CHUNK_MIN;
    if (n > CHUNK_MAX)
        n = CHUNK_MAX;
    return add_chunk(doc, n) != NULL;
}

struct jf_node *jf_doc_nodes(struct jf_doc *doc, size_t n)
{
    struct jf_chunk *c = doc->chunks;
    if (!c || c->cap - c->used < n) {
        size_t cap = c ? c->cap * 2 : CHUNK_MIN;
        if (cap > CHUNK_MAX)
            cap = CHUNK_MAX;
        if (!(c = add_chunk(doc, n > cap ? n : cap)))
            return NULL;
    }
    struct jf_node *at = &c->nodes[c->used];
    c->used += n;
    return at;
}

static struct jf_chunk *chunk_of(struct jf_node *run)
{
    return (struct jf_chunk *)(void *)((char *)run - offsetof(struct jf_chunk, nodes));
}

struct jf_node *jf_run_alloc(size_t n)
{
    struct jf_chunk *c = new_chunk(n, n);
    /* The block is found again from its nodes (chunk_of): not lost. */
    // cppcheck-suppress memleak
    return c ? c->nodes : NULL;
}

struct jf_node *jf_run_realloc(struct jf_node *run, size_t n)
{
    size_t bytes = chunk_bytes(n);
    struct jf_chunk *c = bytes ? realloc(chunk_of(run), bytes) : NULL;
    if (!c)
        return NULL;
    c->used = c->cap = n;
    // cppcheck-suppress memleak
    return c->nodes;
}

void jf_run_free(struct jf_node *run)
{
    if (run)
        free(chunk_of(run));
}

/* Behind the chunk nodes are taken from, which stays first: the run is full. */
void jf_doc_adopt(struct jf_doc *doc, struct jf_node *run)
{
    struct jf_chunk *c = chunk_of(run);
    if (doc->chunks) {
        c->next = doc->chunks->next;
        doc->chunks->next = c;
    } else {
        c->next = NULL;
        doc->chunks = c;
    }
}

void jf_doc_free(struct jf_doc *doc)
{
    for (struct jf_chunk *c = doc->chunks, *next; c; c = next) {
        next = c->next;
        free(c);
    }
    free(doc->text);
    memset(doc, 0, sizeof(*doc));
}

const struct jf_node *jf_get(const struct jf_node *o, const char *key, size_t len)
{
    if (!o || o->type != JF_OBJECT)
        return NULL;
    /* The first byte before memcmp: most keys of an object differ there or in length. */
    for (uint32_t i = 0; i < o->n; i++) {
        const struct jf_node *m = &o->u.items[i];
        if (m->key_len == len &&
            (len == 0 || (m->key[0] == key[0] && memcmp(m->key, key, len) == 0)))
            return m;
    }
    return NULL;
}

const struct jf_node *jf_get_str(const struct jf_node *o, const char *key)
{
    return jf_get(o, key, strlen(key));
}

json_t *jf_to_json(const struct jf_node *node)
{
    json_t *v;
    switch (node->type) {
    case JF_NULL:
        return json_null();
    case JF_FALSE:
        return json_false();
    case JF_TRUE:
        return json_true();
    case JF_INTEGER:
        return json_integer(node->u.i);
    case JF_REAL:
        return json_real(node->u.d);
    case JF_STRING:
        return json_stringn_nocheck(node->u.s, node->n);
    case JF_ARRAY:
        if (!(v = json_array()))
            return NULL;
        for (uint32_t i = 0; i < node->n; i++)
            if (json_array_append_new(v, jf_to_json(&node->u.items[i])))
                goto fail;
        return v;
    default:
        if (!(v = json_object()))
            return NULL;
        for (uint32_t i = 0; i < node->n; i++) {
            const struct jf_node *m = &node->u.items[i];
            if (json_object_setn_new_nocheck(v, m->key, m->key_len, jf_to_json(m)))
                goto fail;
        }
        return v;
    }
fail:
    json_decref(v);
    return NULL;
}

int jf_node_of_json(const json_t *v, struct jf_node *node, struct jf_doc *doc)
{
    size_t n = 0, i;
    const char *key;
    size_t key_len;
    json_t *item;
    switch (json_typeof(v)) {
    case JSON_NULL:
        node->type = JF_NULL;
        return 0;
    case JSON_FALSE:
        node->type = JF_FALSE;
        return 0;
    case JSON_TRUE:
        node->type = JF_TRUE;
        return 0;
    case JSON_INTEGER:
        node->type = JF_INTEGER;
        node->u.i = json_integer_value(v);
        return 0;
    case JSON_REAL:
        node->type = JF_REAL;
        node->u.d = json_real_value(v);
        return 0;
    case JSON_STRING:
        if (json_string_length(v) > UINT32_MAX)
            return -1;
        node->type = JF_STRING;
        node->u.s = json_string_value(v);
        node->n = (uint32_t)json_string_length(v);
        return 0;
    case JSON_ARRAY:
        n = json_array_size(v);
        break;
    case JSON_OBJECT:
        n = json_object_size(v);
        break;
    }
    if (n > UINT32_MAX)
        return -1;
    struct jf_node *items = n ? jf_doc_nodes(doc, n) : NULL;
    if (n && !items)
        return -1;
    node->type = json_is_object(v) ? JF_OBJECT : JF_ARRAY;
    node->n = (uint32_t)n;
    node->u.items = items;
    if (json_is_array(v)) {
        json_array_foreach(v, i, item)
        {
            items[i].key = NULL;
            items[i].key_len = 0;
            if (jf_node_of_json(item, &items[i], doc))
                return -1;
        }
        return 0;
    }
    i = 0;
    json_object_keylen_foreach((json_t *)v, key, key_len, item)
    {
        if (key_len > UINT32_MAX)
            return -1;
        items[i].key = key;
        items[i].key_len = (uint32_t)key_len;
        if (jf_node_of_json(item, &items[i++], doc))
            return -1;
    }
    return 0;
}

int jf_from_json(const json_t *v, struct jf_doc *doc)
{
    memset(doc, 0, sizeof(*doc));
    struct jf_node *root = jf_doc_nodes(doc, 1);
    if (!root)
        return -1;
    root->key = NULL;
    root->key_len = 0;
    if (jf_node_of_json(v, root, doc)) {
        jf_doc_free(doc);
        return -1;
    }
    doc->root = root;
    return 0;
}

bool jf_same(const struct jf_node *a, const struct jf_node *b)
{
    if (a == b)
        return true;
    if (a->type != b->type)
        return false;
    switch (a->type) {
    case JF_INTEGER:
        return a->u.i == b->u.i;
    case JF_REAL:
        return a->u.d == b->u.d && signbit(a->u.d) == signbit(b->u.d);
    case JF_STRING:
        return a->n == b->n && memcmp(a->u.s, b->u.s, a->n) == 0;
    case JF_ARRAY:
        if (a->n != b->n)
            return false;
        for (uint32_t i = 0; i < a->n; i++)
            if (!jf_same(&a->u.items[i], &b->u.items[i]))
                return false;
        return true;
    case JF_OBJECT:
        if (a->n != b->n)
            return false;
        for (uint32_t i = 0; i < a->n; i++) {
            const struct jf_node *m = &a->u.items[i], *o = jf_get(b, m->key, m->key_len);
            if (!o || !jf_same(m, o))
                return false;
        }
        return true;
    default:
        return true;
    }
}

/* A type byte and a 32-bit count or length, then len bytes of data. */
static bool key_part(struct buf *b, uint8_t type, uint32_t n, const void *data, size_t len)
{
    char head[5] = {(char)type};
    memcpy(head + 1, &n, 4);
    return buf_append(b, head, 5) == GG_OK && buf_append(b, data, len) == GG_OK;
}

bool jf_key(struct buf *b, const struct jf_node *n)
{
    switch (n->type) {
    case JF_INTEGER:
    case JF_REAL: /* the union's 8 bytes: an int64_t or a double */
        return key_part(b, n->type, 0, &n->u, 8);
    case JF_STRING:
        return key_part(b, n->type, n->n, n->u.s, n->n);
    case JF_ARRAY:
    case JF_OBJECT:
        if (!key_part(b, n->type, n->n, NULL, 0))
            return false;
        for (uint32_t i = 0; i < n->n; i++) {
            const struct jf_node *m = &n->u.items[i];
            if ((n->type == JF_OBJECT && !key_part(b, 0xff, m->key_len, m->key, m->key_len)) ||
                !jf_key(b, m))
                return false;
        }
        return true;
    default: /* null, true, false: the type says it all */
        return key_part(b, n->type, 0, NULL, 0);
    }
}
