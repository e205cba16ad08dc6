/*
 * jsonpatch.c - RFC 6901 pointers, RFC 6902 diff (original vs edited) and
 * apply, over jansson.  See jsonpatch.h for the contract and the limits.
 *
 * Pure: no I/O, no globals, no Lua.  Memory comes from jansson's allocator so
 * the whole module shares one accounting (and one failure injector in tests).
 */
#include "codec/jsonpatch.h"
#include "util/jsonfast.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- memory and small helpers ------------------------------------------- */

static void *jp_malloc(size_t size)
{
    json_malloc_t alloc_fn;
    json_free_t free_fn;

    json_get_alloc_funcs(&alloc_fn, &free_fn);
    return alloc_fn(size);
}

static void jp_free(void *ptr)
{
    json_malloc_t alloc_fn;
    json_free_t free_fn;

    if (!ptr)
        return;
    json_get_alloc_funcs(&alloc_fn, &free_fn);
    free_fn(ptr);
}

static enum gg_status nomem(struct gg_err *err)
{
    return gg_fail(err, GG_ERR_NOMEM, "out of memory");
}

static const char *type_name(const json_t *v)
{
    if (!v)
        return "nothing";
    switch (json_typeof(v)) {
    case JSON_OBJECT:
        return "object";
    case JSON_ARRAY:
        return "array";
    case JSON_STRING:
        return "string";
    case JSON_INTEGER:
        return "integer";
    case JSON_REAL:
        return "real";
    case JSON_TRUE:
        return "true";
    case JSON_FALSE:
        return "false";
    case JSON_NULL:
        return "null";
    }
    return "value";
}

/* ---- equality ------------------------------------------------------------ */

static int values_equal(const json_t *a, const json_t *b, int strict);

/* An integer equals a real only when the real is integral and in range. */
static int int_real_equal(json_int_t i, double r)
{
    json_int_t t;

    if (!(r >= -9223372036854775808.0 && r < 9223372036854775808.0))
        return 0; /* out of range, or NaN */
    t = (json_int_t)r;
    return (double)t == r && t == i;
}

static int numbers_equal(const json_t *a, const json_t *b, int strict)
{
    if (json_is_integer(a) && json_is_integer(b))
        return json_integer_value(a) == json_integer_value(b);
    if (json_is_real(a) && json_is_real(b)) {
        double x = json_real_value(a), y = json_real_value(b);
        /* Strictly, -0.0 and 0.0 differ: they serialize differently. */
        return x == y && (!strict || !signbit(x) == !signbit(y));
    }
    if (strict)
        return 0; /* 1 and 1.0 are different documents */
    if (json_is_integer(a))
        return int_real_equal(json_integer_value(a), json_real_value(b));
    return int_real_equal(json_integer_value(b), json_real_value(a));
}

/* jansson's iteration API takes non-const objects; nothing is modified. */
static int objects_equal(const json_t *a, const json_t *b, int strict)
{
    const char *key;
    size_t key_len;
    json_t *va;

    if (json_object_size(a) != json_object_size(b))
        return 0;
    json_object_keylen_foreach((json_t *)a, key, key_len, va)
    {
        const json_t *vb = json_object_getn(b, key, key_len);
        if (!vb || !values_equal(va, vb, strict))
            return 0;
    }
    return 1;
}

static int arrays_equal(const json_t *a, const json_t *b, int strict)
{
    size_t i, n = json_array_size(a);

    if (n != json_array_size(b))
        return 0;
    for (i = 0; i < n; i++)
        if (!values_equal(json_array_get(a, i), json_array_get(b, i), strict))
            return 0;
    return 1;
}

/*
 * strict: the diff's notion (integers and reals never equal); otherwise the
 * RFC 6902 `test` notion (numbers by value).
 */
static int values_equal(const json_t *a, const json_t *b, int strict)
{
    if (a == b)
        return 1;
    if (json_is_number(a) && json_is_number(b))
        return numbers_equal(a, b, strict);
    if (json_typeof(a) != json_typeof(b))
        return 0;
    switch (json_typeof(a)) {
    case JSON_OBJECT:
        return objects_equal(a, b, strict);
    case JSON_ARRAY:
        return arrays_equal(a, b, strict);
    case JSON_STRING:
        return json_string_length(a) == json_string_length(b) &&
               memcmp(json_string_value(a), json_string_value(b), json_string_length(a)) == 0;
    default:
        return 1; /* true, false, null */
    }
}

int jp_equal(const json_t *a, const json_t *b)
{
    if (!a || !b)
        return a == b;
    return values_equal(a, b, 0);
}

int jp_same(const json_t *a, const json_t *b)
{
    if (!a || !b)
        return a == b;
    return values_equal(a, b, 1);
}

/* ---- pointers ------------------------------------------------------------- */

size_t jp_escape(const char *key, size_t key_len, char *out, size_t size)
{
    size_t i, n = 0;

    for (i = 0; i < key_len; i++) {
        char c = key[i];
        char esc = c == '~' ? '0' : c == '/' ? '1' : 0;
        if (esc) {
            if (n + 1 < size)
                out[n] = '~';
            n++;
            c = esc;
        }
        if (n + 1 < size)
            out[n] = c;
        n++;
    }
    if (size)
        out[n < size ? n : size - 1] = '\0';
    return n;
}

/* A parsed pointer: tokens unescaped, each NUL-terminated, all in buf. */
struct ptr {
    char *buf;
    size_t ntok;
    char *tok[JP_MAX_DEPTH];
};

static void ptr_init(struct ptr *p)
{
    p->buf = NULL;
    p->ntok = 0;
}

static void ptr_clear(struct ptr *p)
{
    jp_free(p->buf);
    ptr_init(p);
}

/* RFC 6901: "" is the whole document, otherwise "/" token ("/" token)*. */
static enum gg_status ptr_parse(const char *s, struct ptr *p, struct gg_err *err)
{
    char *w;

    ptr_init(p);
    if (*s == '\0')
        return GG_OK;
    if (*s != '/')
        return gg_fail(err, GG_ERR_PARSE, "a pointer must be empty or start with '/'");
    /* Unescaped tokens plus their NULs never take more than strlen(s) bytes. */
    p->buf = jp_malloc(strlen(s));
    if (!p->buf)
        return nomem(err);
    w = p->buf;
    p->tok[p->ntok++] = w;
    for (s++; *s; s++) {
        if (*s == '/') {
            *w++ = '\0';
            if (p->ntok == JP_MAX_DEPTH)
                goto too_deep;
            p->tok[p->ntok++] = w;
        } else if (*s == '~') {
            s++;
            if (*s != '0' && *s != '1')
                goto bad_escape;
            *w++ = *s == '0' ? '~' : '/';
        } else {
            *w++ = *s;
        }
    }
    *w = '\0';
    return GG_OK;
too_deep:
    ptr_clear(p);
    return gg_fail(err, GG_ERR_TOOBIG, "pointer has more than %d reference tokens", JP_MAX_DEPTH);
bad_escape:
    ptr_clear(p);
    return gg_fail(err, GG_ERR_PARSE, "'~' must be followed by '0' or '1'");
}

/* RFC 6901 array index: "0" or digits without a leading zero; no sign. */
static int parse_index(const char *tok, size_t *out)
{
    size_t v = 0;

    if (tok[0] == '\0' || (tok[0] == '0' && tok[1] != '\0'))
        return -1;
    for (; *tok; tok++) {
        if (*tok < '0' || *tok > '9' || v > ((size_t)-1 - 9) / 10)
            return -1;
        v = v * 10 + (size_t)(*tok - '0');
    }
    *out = v;
    return 0;
}

/* Index of an existing element of arr. */
static enum gg_status element_index(const json_t *arr, const char *tok, size_t *out,
                                    struct gg_err *err)
{
    size_t size = json_array_size(arr);

    if (strcmp(tok, "-") == 0)
        return gg_fail(err, GG_ERR_INVALID, "\"-\" names no existing array element");
    if (parse_index(tok, out))
        return gg_fail(err, GG_ERR_INVALID, "\"%s\" is not an array index", tok);
    if (*out >= size)
        return gg_fail(err, GG_ERR_INVALID, "index %zu is out of range (array size %zu)", *out,
                       size);
    return GG_OK;
}

/* Where `add` inserts into arr: an index up to the size, or "-" (the end). */
static enum gg_status insert_index(const json_t *arr, const char *tok, size_t *out,
                                   struct gg_err *err)
{
    size_t size = json_array_size(arr);

    if (strcmp(tok, "-") == 0) {
        *out = size;
        return GG_OK;
    }
    if (parse_index(tok, out))
        return gg_fail(err, GG_ERR_INVALID, "\"%s\" is not an array index", tok);
    if (*out > size)
        return gg_fail(err, GG_ERR_INVALID, "index %zu is past the end (array size %zu)", *out,
                       size);
    return GG_OK;
}

static enum gg_status child(json_t *v, const char *tok, json_t **out, struct gg_err *err)
{
    size_t i;
    enum gg_status st;

    if (json_is_object(v)) {
        *out = json_object_get(v, tok);
        return *out ? GG_OK : gg_fail(err, GG_ERR_INVALID, "member \"%s\" not found", tok);
    }
    if (json_is_array(v)) {
        st = element_index(v, tok, &i, err);
        if (st == GG_OK)
            *out = json_array_get(v, i);
        return st;
    }
    return gg_fail(err, GG_ERR_INVALID, "cannot look up \"%s\" in a %s", tok, type_name(v));
}

/* The value named by the first n tokens of p. */
static enum gg_status walk(json_t *root, const struct ptr *p, size_t n, json_t **out,
                           struct gg_err *err)
{
    json_t *v = root;
    size_t i;
    enum gg_status st;

    for (i = 0; i < n; i++) {
        st = child(v, p->tok[i], &v, err);
        if (st != GG_OK)
            return st;
    }
    *out = v;
    return GG_OK;
}

enum gg_status jp_pointer_parse(const char *pointer, json_t **tokens, struct gg_err *err)
{
    struct ptr p;
    json_t *arr;
    size_t i;
    enum gg_status st;

    if (!pointer || !tokens)
        return gg_fail(err, GG_ERR_INVALID, "pointer: NULL argument");
    st = ptr_parse(pointer, &p, err);
    if (st != GG_OK)
        return st;
    arr = json_array();
    for (i = 0; arr && i < p.ntok; i++) {
        /* Bytes are kept as they are; a valid UTF-8 pointer gives valid tokens. */
        if (json_array_append_new(arr, json_string_nocheck(p.tok[i]))) {
            json_decref(arr);
            arr = NULL;
        }
    }
    ptr_clear(&p);
    if (!arr)
        return nomem(err);
    *tokens = arr;
    return GG_OK;
}

enum gg_status jp_pointer_get(const json_t *doc, const char *pointer, json_t **value,
                              struct gg_err *err)
{
    struct ptr p;
    struct gg_err why;
    json_t *v = NULL;
    enum gg_status st;

    if (!doc || !pointer || !value)
        return gg_fail(err, GG_ERR_INVALID, "pointer: NULL argument");
    why.msg[0] = '\0';
    st = ptr_parse(pointer, &p, &why);
    /* Lookups do not modify doc; walk() is shared with the mutating ops. */
    if (st == GG_OK)
        st = walk((json_t *)doc, &p, p.ntok, &v, &why);
    ptr_clear(&p);
    if (st != GG_OK)
        return gg_fail(err, st, "pointer \"%s\": %s", pointer, why.msg);
    *value = v;
    return GG_OK;
}

/* ---- diff ------------------------------------------------------------------ */

static int pb_reserve(struct jp_path *pb, size_t extra)
{
    size_t need = pb->len + extra + 1, cap = pb->cap ? pb->cap : 64;
    char *p;

    if (need <= pb->cap)
        return 0;
    while (cap < need)
        cap *= 2;
    p = jp_malloc(cap);
    if (!p)
        return -1;
    if (pb->len)
        memcpy(p, pb->data, pb->len);
    jp_free(pb->data);
    pb->data = p;
    pb->cap = cap;
    return 0;
}

static int pb_push_key(struct jp_path *pb, const char *key, size_t key_len)
{
    size_t n = jp_escape(key, key_len, NULL, 0);

    if (pb_reserve(pb, n + 1))
        return -1;
    pb->data[pb->len++] = '/';
    jp_escape(key, key_len, pb->data + pb->len, n + 1);
    pb->len += n;
    return 0;
}

static int pb_push_index(struct jp_path *pb, size_t i)
{
    char tok[24];
    int n = snprintf(tok, sizeof(tok), "%zu", i);

    return pb_push_key(pb, tok, (size_t)n);
}

enum gg_status jp_differ_begin(struct jp_differ *d, struct gg_err *err)
{
    memset(d, 0, sizeof(*d));
    d->err = err;
    d->patch = json_array();
    return d->patch ? GG_OK : nomem(err);
}

json_t *jp_differ_end(struct jp_differ *d, bool keep)
{
    json_t *patch = d->patch;

    jp_free(d->path.data);
    if (!keep)
        json_decref(patch);
    memset(d, 0, sizeof(*d));
    return keep ? patch : NULL;
}

enum gg_status jp_differ_key(struct jp_differ *d, const char *key, size_t key_len)
{
    if (memchr(key, '\0', key_len))
        return gg_fail(d->err, GG_ERR_INVALID, "diff: an object key contains a NUL byte");
    return pb_push_key(&d->path, key, key_len) ? nomem(d->err) : GG_OK;
}

enum gg_status jp_differ_index(struct jp_differ *d, size_t i)
{
    return pb_push_index(&d->path, i) ? nomem(d->err) : GG_OK;
}

/* Append {"op", "path": current path, "value": value (if any)}. */
enum gg_status jp_differ_emit(struct jp_differ *d, const char *op, const json_t *value)
{
    json_t *o;
    int bad;

    if (json_array_size(d->patch) >= JP_MAX_OPS)
        return gg_fail(d->err, GG_ERR_TOOBIG, "diff: the patch would exceed %d operations",
                       JP_MAX_OPS);
    o = json_object();
    /* The path holds only keys entered by callers, which are UTF-8 (the original's, or
     * checked): no check here. */
    bad = !o || json_object_set_new_nocheck(o, "op", json_string_nocheck(op)) ||
          json_object_set_new_nocheck(o, "path", json_stringn_nocheck(d->path.data, d->path.len)) ||
          (value && json_object_set_new_nocheck(o, "value", json_incref((json_t *)value)));
    if (bad) {
        json_decref(o);
        return gg_fail(d->err, GG_ERR_NOMEM, "diff: out of memory");
    }
    if (json_array_append_new(d->patch, o))
        return nomem(d->err);
    return GG_OK;
}

int jp_key_cmp(const void *pa, const void *pb)
{
    const struct jp_key *a = pa, *b = pb;
    size_t n = a->len < b->len ? a->len : b->len;
    int c = memcmp(a->s, b->s, n);

    if (c)
        return c;
    return (a->len > b->len) - (a->len < b->len);
}

/* The keys of obj in byte order, so the patch does not depend on insertion order. */
static enum gg_status sorted_keys(const json_t *obj, struct jp_key **out, size_t *count,
                                  struct gg_err *err)
{
    size_t n = json_object_size(obj), i = 0;
    struct jp_key *keys = NULL;
    const char *key;
    size_t key_len;
    json_t *v;

    if (n) {
        keys = jp_malloc(n * sizeof(*keys));
        if (!keys)
            return nomem(err);
    }
    json_object_keylen_foreach((json_t *)obj, key, key_len, v)
    {
        (void)v;
        if (memchr(key, '\0', key_len)) {
            jp_free(keys);
            return gg_fail(err, GG_ERR_INVALID, "diff: an object key contains a NUL byte");
        }
        keys[i].s = key;
        keys[i].len = key_len;
        i++;
    }
    if (n > 1)
        qsort(keys, n, sizeof(*keys), jp_key_cmp);
    *out = keys;
    *count = n;
    return GG_OK;
}

/* One member present in a, b or both; the path already names it. */
static enum gg_status diff_member(struct jp_differ *d, const json_t *a, const json_t *b,
                                  const struct jp_key *k, size_t depth)
{
    const json_t *va = json_object_getn(a, k->s, k->len);
    const json_t *vb = json_object_getn(b, k->s, k->len);

    if (!vb)
        return jp_differ_emit(d, "remove", NULL);
    if (!va)
        return jp_differ_emit(d, "add", vb); /* a missing parent is added whole */
    return jp_differ_value(d, va, vb, depth);
}

static enum gg_status diff_object(struct jp_differ *d, const json_t *a, const json_t *b,
                                  size_t depth)
{
    struct jp_key *ka = NULL, *kb = NULL;
    size_t na = 0, nb = 0, i = 0, j = 0;
    enum gg_status st = sorted_keys(a, &ka, &na, d->err);

    if (st == GG_OK)
        st = sorted_keys(b, &kb, &nb, d->err);
    /* Merge the two sorted key lists; each key is visited once. */
    while (st == GG_OK && (i < na || j < nb)) {
        int c = i == na ? 1 : j == nb ? -1 : jp_key_cmp(&ka[i], &kb[j]);
        const struct jp_key *k = c <= 0 ? &ka[i] : &kb[j];
        size_t mark = d->path.len;

        if (pb_push_key(&d->path, k->s, k->len))
            st = nomem(d->err);
        else
            st = diff_member(d, a, b, k, depth + 1);
        d->path.len = mark;
        i += c <= 0;
        j += c >= 0;
    }
    jp_free(ka);
    jp_free(kb);
    return st;
}

static int same_prefix(const json_t *a, const json_t *b, size_t n)
{
    size_t i;

    for (i = 0; i < n; i++)
        if (!values_equal(json_array_get(a, i), json_array_get(b, i), 1))
            return 0;
    return 1;
}

static enum gg_status diff_elements(struct jp_differ *d, const json_t *a, const json_t *b,
                                    size_t depth)
{
    size_t i, n = json_array_size(a), mark = d->path.len;
    enum gg_status st = GG_OK;

    for (i = 0; i < n && st == GG_OK; i++) {
        if (pb_push_index(&d->path, i))
            return nomem(d->err);
        st = jp_differ_value(d, json_array_get(a, i), json_array_get(b, i), depth + 1);
        d->path.len = mark;
    }
    return st;
}

static enum gg_status append_tail(struct jp_differ *d, const json_t *b, size_t from)
{
    size_t i, n = json_array_size(b), mark = d->path.len;
    enum gg_status st = GG_OK;

    if (pb_push_key(&d->path, "-", 1))
        return nomem(d->err);
    for (i = from; i < n && st == GG_OK; i++)
        st = jp_differ_emit(d, "add", json_array_get(b, i));
    d->path.len = mark;
    return st;
}

/* Highest index first, so every remove names an element that still exists. */
static enum gg_status remove_tail(struct jp_differ *d, size_t size, size_t keep)
{
    size_t i = size, mark = d->path.len;
    enum gg_status st = GG_OK;

    while (i-- > keep && st == GG_OK) {
        if (pb_push_index(&d->path, i))
            return nomem(d->err);
        st = jp_differ_emit(d, "remove", NULL);
        d->path.len = mark;
    }
    return st;
}

static enum gg_status diff_array(struct jp_differ *d, const json_t *a, const json_t *b,
                                 size_t depth)
{
    size_t na = json_array_size(a), nb = json_array_size(b);

    if (na == nb)
        return diff_elements(d, a, b, depth);
    if (nb > na && same_prefix(a, b, na))
        return append_tail(d, b, na);
    if (nb < na && same_prefix(a, b, nb))
        return remove_tail(d, na, nb);
    return jp_differ_emit(d, "replace", b);
}

/*
 * depth = reference tokens in the current path.  At JP_MAX_DEPTH the whole
 * differing subtree is replaced, so no emitted path is deeper than jp_apply
 * (or anything else with a similar bound) accepts.
 */
enum gg_status jp_differ_value(struct jp_differ *d, const json_t *a, const json_t *b, size_t depth)
{
    if (a == b)
        return GG_OK; /* a shared subtree */
    if (depth < JP_MAX_DEPTH) {
        if (json_is_object(a) && json_is_object(b))
            return diff_object(d, a, b, depth);
        if (json_is_array(a) && json_is_array(b))
            return diff_array(d, a, b, depth);
    }
    if (values_equal(a, b, 1))
        return GG_OK;
    return jp_differ_emit(d, "replace", b);
}

enum gg_status jp_diff(const json_t *original, const json_t *edited, json_t **patch,
                       struct gg_err *err)
{
    struct jp_differ d;
    enum gg_status st;

    if (!original || !edited || !patch)
        return gg_fail(err, GG_ERR_INVALID, "diff: NULL argument");
    if (!json_is_object(original) || !json_is_object(edited)) {
        if (values_equal(original, edited, 1)) {
            *patch = json_array();
            return *patch ? GG_OK : nomem(err);
        }
        return gg_fail(err, GG_ERR_INVALID,
                       "diff: the documents must both be objects (got %s and %s); "
                       "a patch may not replace the root",
                       type_name(original), type_name(edited));
    }
    st = jp_differ_begin(&d, err);
    if (st == GG_OK)
        st = diff_object(&d, original, edited, 0);
    json_t *done = jp_differ_end(&d, st == GG_OK);
    if (st == GG_OK)
        *patch = done;
    return st;
}

/* ---- apply ----------------------------------------------------------------- */

enum opcode { OP_ADD, OP_REMOVE, OP_REPLACE, OP_MOVE, OP_COPY, OP_TEST };

static const char *const OP_NAMES[] = {"add", "remove", "replace", "move", "copy", "test"};

/* One decoded operation; strings and value are borrowed from the patch. */
struct op {
    enum opcode code;
    const char *name;
    const char *path;
    const char *from;
    const json_t *value;
};

struct applier {
    json_t *root;  /* the working copy; root ops replace it */
    size_t copied; /* bytes duplicated by copy ops so far */
};

static enum gg_status string_member(const json_t *o, const char *name, const char **out,
                                    struct gg_err *err)
{
    const json_t *v = json_object_get(o, name);

    if (!json_is_string(v))
        return gg_fail(err, GG_ERR_PARSE, "\"%s\" is missing or not a string", name);
    if (strlen(json_string_value(v)) != json_string_length(v))
        return gg_fail(err, GG_ERR_PARSE, "\"%s\" contains a NUL byte", name);
    *out = json_string_value(v);
    return GG_OK;
}

/* RFC 6902 section 4: members other than op/path/from/value are ignored. */
static enum gg_status parse_op(const json_t *o, struct op *op, struct gg_err *err)
{
    size_t i;
    enum gg_status st;

    memset(op, 0, sizeof(*op));
    if (!json_is_object(o))
        return gg_fail(err, GG_ERR_PARSE, "an operation must be an object");
    st = string_member(o, "op", &op->name, err);
    if (st != GG_OK)
        return st;
    for (i = 0; i < sizeof(OP_NAMES) / sizeof(OP_NAMES[0]); i++)
        if (strcmp(op->name, OP_NAMES[i]) == 0)
            break;
    if (i == sizeof(OP_NAMES) / sizeof(OP_NAMES[0]))
        return gg_fail(err, GG_ERR_PARSE, "unknown op \"%s\"", op->name);
    op->code = (enum opcode)i;
    st = string_member(o, "path", &op->path, err);
    if (st == GG_OK && (op->code == OP_MOVE || op->code == OP_COPY))
        st = string_member(o, "from", &op->from, err);
    if (st != GG_OK)
        return st;
    if (op->code == OP_ADD || op->code == OP_REPLACE || op->code == OP_TEST) {
        op->value = json_object_get(o, "value");
        if (!op->value)
            return gg_fail(err, GG_ERR_PARSE, "\"value\" is missing");
    }
    return GG_OK;
}

/*
 * Where an add or a replace puts value (stolen) at p: when p is the root,
 * value becomes the root (*parent NULL); else *parent and *last are p's
 * parent and last token.  On failure value is freed.
 */
static enum gg_status put_target(struct applier *a, const struct ptr *p, json_t *value,
                                 json_t **parent, const char **last, struct gg_err *err)
{
    *parent = NULL;
    if (p->ntok == 0) {
        json_decref(a->root);
        a->root = value;
        return GG_OK;
    }
    *last = p->tok[p->ntok - 1];
    enum gg_status st = walk(a->root, p, p->ntok - 1, parent, err);
    if (st != GG_OK)
        json_decref(value);
    return st;
}

/* Put value (stolen) at p: a member is set, an array element inserted. */
static enum gg_status do_add(struct applier *a, const struct ptr *p, json_t *value,
                             struct gg_err *err)
{
    json_t *parent;
    const char *last;
    size_t i;
    enum gg_status st = put_target(a, p, value, &parent, &last, err);

    if (st != GG_OK || !parent)
        return st;
    if (json_is_object(parent))
        return json_object_set_new_nocheck(parent, last, value) ? nomem(err) : GG_OK;
    if (json_is_array(parent)) {
        st = insert_index(parent, last, &i, err);
        if (st == GG_OK)
            return json_array_insert_new(parent, i, value) ? nomem(err) : GG_OK;
    } else {
        st = gg_fail(err, GG_ERR_INVALID, "cannot add \"%s\" to a %s", last, type_name(parent));
    }
    json_decref(value);
    return st;
}

/* Detach the value at p; *removed (if asked for) gets a reference to it. */
static enum gg_status do_remove(struct applier *a, const struct ptr *p, json_t **removed,
                                struct gg_err *err)
{
    json_t *parent, *v;
    const char *last;
    size_t i;
    enum gg_status st;

    if (p->ntok == 0) {
        /* RFC 6902 does not define removing the root; the suite expects null. */
        v = a->root;
        a->root = json_null();
        if (removed)
            *removed = v;
        else
            json_decref(v);
        return GG_OK;
    }
    last = p->tok[p->ntok - 1];
    st = walk(a->root, p, p->ntok - 1, &parent, err);
    if (st == GG_OK)
        st = child(parent, last, &v, err);
    if (st != GG_OK)
        return st;
    if (removed)
        *removed = json_incref(v);
    if (json_is_object(parent))
        json_object_del(parent, last);
    else if (element_index(parent, last, &i, err) == GG_OK)
        json_array_remove(parent, i);
    return GG_OK;
}

/* Replace the existing value at p with value (stolen). */
static enum gg_status do_replace(struct applier *a, const struct ptr *p, json_t *value,
                                 struct gg_err *err)
{
    json_t *parent, *old;
    const char *last;
    size_t i;
    enum gg_status st = put_target(a, p, value, &parent, &last, err);

    if (st != GG_OK || !parent)
        return st;
    st = child(parent, last, &old, err);
    if (st != GG_OK) {
        json_decref(value);
        return st;
    }
    if (json_is_object(parent))
        return json_object_set_new_nocheck(parent, last, value) ? nomem(err) : GG_OK;
    st = element_index(parent, last, &i, err);
    if (st != GG_OK) {
        json_decref(value);
        return st;
    }
    return json_array_set_new(parent, i, value) ? nomem(err) : GG_OK;
}

/* True when pointer `from` names a proper ancestor of pointer `path`. */
static int is_proper_prefix(const char *from, const char *path)
{
    size_t n = strlen(from);

    return strncmp(from, path, n) == 0 && path[n] == '/';
}

static enum gg_status op_move(struct applier *a, const struct op *op, const struct ptr *from,
                              const struct ptr *path, struct gg_err *err)
{
    json_t *v;
    enum gg_status st;

    if (strcmp(op->from, op->path) == 0)
        return walk(a->root, from, from->ntok, &v, err); /* must exist; no effect */
    if (is_proper_prefix(op->from, op->path))
        return gg_fail(err, GG_ERR_INVALID, "cannot move a value into its own child");
    st = do_remove(a, from, &v, err);
    if (st != GG_OK)
        return st;
    return do_add(a, path, v, err);
}

/*
 * Approximate compact-JSON size of v (strings counted unescaped), for the
 * copy budget; counting stops as soon as it passes limit.
 */
static size_t approx_size(const json_t *v, size_t limit)
{
    const char *key;
    size_t key_len, i, n = 2;
    json_t *m;

    switch (json_typeof(v)) {
    case JSON_OBJECT:
        json_object_keylen_foreach((json_t *)v, key, key_len, m)
        {
            n += key_len + 4; /* quotes, colon, comma */
            if (n > limit)
                return n;
            n += approx_size(m, limit - n);
            if (n > limit)
                return n;
        }
        return n;
    case JSON_ARRAY:
        for (i = 0; i < json_array_size(v) && n <= limit; i++)
            n += 1 + approx_size(json_array_get(v, i), limit - n);
        return n;
    case JSON_STRING:
        return json_string_length(v) + 2;
    case JSON_INTEGER:
    case JSON_REAL:
        return 20;
    default:
        return 5;
    }
}

static enum gg_status op_copy(struct applier *a, const struct ptr *from, const struct ptr *path,
                              struct gg_err *err)
{
    json_t *v, *dup;
    size_t size;
    enum gg_status st = walk(a->root, from, from->ntok, &v, err);

    if (st != GG_OK)
        return st;
    size = approx_size(v, JP_MAX_COPY_BYTES - a->copied);
    if (size > JP_MAX_COPY_BYTES - a->copied)
        return gg_fail(err, GG_ERR_TOOBIG, "the copies in this patch exceed %u bytes",
                       JP_MAX_COPY_BYTES);
    a->copied += size;
    dup = json_deep_copy(v);
    if (!dup)
        return nomem(err);
    return do_add(a, path, dup, err);
}

static enum gg_status op_test(struct applier *a, const struct op *op, const struct ptr *path,
                              struct gg_err *err)
{
    json_t *v;
    enum gg_status st = walk(a->root, path, path->ntok, &v, err);

    if (st == GG_OK && !jp_equal(v, op->value))
        st = gg_fail(err, GG_ERR_INVALID, "test failed: the value differs");
    return st;
}

static enum gg_status run_op(struct applier *a, const struct op *op, const struct ptr *path,
                             const struct ptr *from, struct gg_err *err)
{
    json_t *v;

    switch (op->code) {
    case OP_ADD:
    case OP_REPLACE:
        /* The document never shares nodes with the patch. */
        v = json_deep_copy(op->value);
        if (!v)
            return nomem(err);
        return op->code == OP_ADD ? do_add(a, path, v, err) : do_replace(a, path, v, err);
    case OP_REMOVE:
        return do_remove(a, path, NULL, err);
    case OP_MOVE:
        return op_move(a, op, from, path, err);
    case OP_COPY:
        return op_copy(a, from, path, err);
    case OP_TEST:
        return op_test(a, op, path, err);
    }
    return gg_fail(err, GG_ERR_INVALID, "unknown op");
}

static enum gg_status apply_op(struct applier *a, const json_t *o, size_t idx, struct gg_err *err)
{
    struct op op;
    struct ptr path, from;
    struct gg_err why;
    enum gg_status st;

    ptr_init(&path);
    ptr_init(&from);
    why.msg[0] = '\0';
    st = parse_op(o, &op, &why);
    if (st == GG_OK)
        st = ptr_parse(op.path, &path, &why);
    if (st == GG_OK && op.from)
        st = ptr_parse(op.from, &from, &why);
    if (st == GG_OK)
        st = run_op(a, &op, &path, &from, &why);
    ptr_clear(&path);
    ptr_clear(&from);
    if (st != GG_OK)
        gg_fail(err, st, "patch op %zu (%s %s%s%s): %s", idx, op.name ? op.name : "?",
                op.path ? op.path : "?", op.from ? " from " : "", op.from ? op.from : "", why.msg);
    return st;
}

enum gg_status jp_apply_copy(const json_t *doc, const json_t *patch, json_t **out,
                             struct gg_err *err)
{
    struct applier a = {NULL, 0};
    size_t i, n;
    enum gg_status st = GG_OK;

    if (!doc || !out)
        return gg_fail(err, GG_ERR_INVALID, "patch: NULL argument");
    if (!json_is_array(patch))
        return gg_fail(err, GG_ERR_PARSE, "patch: not a JSON array");
    n = json_array_size(patch);
    if (n > JP_MAX_OPS)
        return gg_fail(err, GG_ERR_TOOBIG, "patch: %zu operations, over the limit of %d", n,
                       JP_MAX_OPS);
    a.root = json_deep_copy(doc);
    if (!a.root)
        return nomem(err);
    for (i = 0; i < n && st == GG_OK; i++)
        st = apply_op(&a, json_array_get(patch, i), i, err);
    if (st != GG_OK) {
        json_decref(a.root);
        return st;
    }
    *out = a.root;
    return GG_OK;
}

/*
 * Make object doc hold src's members.  Setting comes first: overwriting an
 * existing key does not allocate, so running out of memory half-way leaves
 * extra members rather than lost ones.
 */
static enum gg_status transplant_object(json_t *doc, json_t *src, struct gg_err *err)
{
    void *next;
    const char *key;
    size_t key_len;
    json_t *v;

    if (json_object_update(doc, src))
        return nomem(err);
    json_object_keylen_foreach_safe(doc, next, key, key_len, v)
    {
        (void)v;
        if (!json_object_getn(src, key, key_len))
            json_object_deln(doc, key, key_len);
    }
    return GG_OK;
}

/* Move the contents of src (same type as doc) into doc, keeping doc's identity. */
static enum gg_status transplant(json_t *doc, json_t *src, struct gg_err *err)
{
    switch (json_typeof(doc)) {
    case JSON_OBJECT:
        return transplant_object(doc, src, err);
    case JSON_ARRAY:
        if (json_array_clear(doc) || json_array_extend(doc, src))
            return nomem(err);
        return GG_OK;
    case JSON_STRING:
        if (json_string_setn_nocheck(doc, json_string_value(src), json_string_length(src)))
            return nomem(err);
        return GG_OK;
    case JSON_INTEGER:
        json_integer_set(doc, json_integer_value(src));
        return GG_OK;
    case JSON_REAL:
        json_real_set(doc, json_real_value(src));
        return GG_OK;
    default:
        return GG_OK; /* true, false and null carry no contents */
    }
}

enum gg_status jp_apply(json_t *doc, const json_t *patch, struct gg_err *err)
{
    json_t *result = NULL;
    enum gg_status st = jp_apply_copy(doc, patch, &result, err);

    if (st != GG_OK)
        return st;
    if (json_typeof(result) != json_typeof(doc))
        st = gg_fail(err, GG_ERR_INVALID,
                     "patch: turns the document root from %s into %s, which cannot be done "
                     "in place (use jp_apply_copy)",
                     type_name(doc), type_name(result));
    else
        st = transplant(doc, result, err);
    json_decref(result);
    return st;
}

/* ---- a patch applied to nodes, sharing what it does not reach ------------------------------ */

/* node's members copied into doc, with room for extra more: node may then be changed. */
static struct jf_node *own_members(struct jf_node *node, uint32_t extra, struct jf_doc *doc)
{
    struct jf_node *items = jf_doc_nodes(doc, (size_t)node->n + extra);
    if (items && node->n)
        memcpy(items, node->u.items, node->n * sizeof(*items));
    if (items)
        node->u.items = items;
    return items;
}

/* The position of token in the container node: a member's, an array index (or n for "-" when
 * appending); -1 when there is none. */
static long position(const struct jf_node *node, const json_t *token, bool append)
{
    const char *t = json_string_value(token);
    size_t len = json_string_length(token);
    if (node->type == JF_OBJECT) {
        for (uint32_t i = 0; i < node->n; i++)
            if (node->u.items[i].key_len == len && memcmp(node->u.items[i].key, t, len) == 0)
                return i;
        return -1;
    }
    if (node->type != JF_ARRAY)
        return -1;
    if (append && strcmp(t, "-") == 0)
        return node->n;
    char *end;
    long i = (len && (len == 1 || t[0] != '0')) ? strtol(t, &end, 10) : -1;
    if (i < 0 || *end || i > (long)node->n || (!append && i == (long)node->n))
        return -1;
    return i;
}

/* One op on the copy rooted at root. */
static enum gg_status patch_op(struct jf_node *root, const json_t *op, const json_t *tokens,
                               struct jf_doc *doc, struct gg_err *err)
{
    const char *name = json_string_value(json_object_get(op, "op"));
    size_t n = json_array_size(tokens);
    bool add = name && strcmp(name, "add") == 0, remove = name && strcmp(name, "remove") == 0;
    if (!n || !(add || remove || (name && strcmp(name, "replace") == 0)))
        return gg_fail(err, GG_ERR_INVALID, "patch: op %s at the root or unknown",
                       name ? name : "");
    struct jf_node *at = root, *items;
    for (size_t t = 0; t + 1 < n; t++) {
        long i = position(at, json_array_get(tokens, t), false);
        if (i < 0 || !(items = own_members(at, 0, doc)))
            return gg_fail(err, GG_ERR_INVALID, "patch: a path that is not there");
        at = &items[i];
    }
    const json_t *last = json_array_get(tokens, n - 1);
    long i = position(at, last, add);
    bool member = at->type == JF_OBJECT, grow = add && (i < 0 ? member : !member);
    if ((i < 0 && !(add && member)) || !(items = own_members(at, grow ? 1 : 0, doc)))
        return gg_fail(err, GG_ERR_INVALID, "patch: a path that is not there");
    if (grow && member) {
        i = at->n; /* a new member, last */
        items[i].key = json_string_value(last);
        items[i].key_len = (uint32_t)json_string_length(last);
    } else if (grow) { /* an array element inserted at i */
        memmove(&items[i + 1], &items[i], (at->n - (size_t)i) * sizeof(*items));
        items[i].key = NULL;
        items[i].key_len = 0;
    }
    if (remove) {
        memmove(&items[i], &items[i + 1], (at->n - (size_t)i - 1) * sizeof(*items));
        at->n--;
        return GG_OK;
    }
    if (grow)
        at->n++;
    const json_t *value = json_object_get(op, "value");
    if (!value || jf_node_of_json(value, &items[i], doc))
        return gg_fail(err, value ? GG_ERR_NOMEM : GG_ERR_INVALID, "patch: %s without a value",
                       name);
    return GG_OK;
}

enum gg_status jp_patched_nodes(const struct jf_node *original, const json_t *patch,
                                const json_t *paths, struct jf_doc *doc, struct gg_err *err)
{
    memset(doc, 0, sizeof(*doc));
    struct jf_node *root = jf_doc_nodes(doc, 1);
    if (!root)
        return nomem(err);
    *root = *original;
    size_t i;
    const json_t *op;
    json_array_foreach(patch, i, op)
    {
        enum gg_status st = patch_op(root, op, json_array_get(paths, i), doc, err);
        if (st != GG_OK) {
            jf_doc_free(doc);
            return st;
        }
    }
    doc->root = root;
    return GG_OK;
}
