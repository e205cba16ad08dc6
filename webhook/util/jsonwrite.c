/*
 * jsonwrite.c - a direct, recursive compact JSON writer over jansson values and
 * jsonfast's nodes.
 *
 * Containers write every member followed by a comma and let the closing
 * bracket take the last comma's place, so there is no first-member test.
 * Numbers are formatted on the stack: integers by hand, reals with
 * snprintf (shortest round-trip output would need a Ryu-like algorithm,
 * and jansson's own "%.17g" is what the text must match).
 */
#include "util/jsonwrite.h"

#include "util/jsonfast.h"

#include <stdio.h>
#include <string.h>

/* One character: most of the punctuation, without buf_append's memcpy call. */
static enum gg_status put_char(struct buf *b, char c)
{
    char *at;
    enum gg_status st = buf_extend(b, 1, &at);
    if (st == GG_OK)
        *at = c;
    return st;
}

/* The first byte in [p, end) that needs an escape, or end. */
static const char *next_escape(const char *p, const char *end)
{
    while ((p = jf_scan_plain(p, end)) != end && (unsigned char)*p >= 0x80)
        p++; /* UTF-8 goes through as it is */
    return p;
}

/* '"', '\\' or a control character. */
static enum gg_status put_escape(struct buf *b, unsigned char c)
{
    static const char hex[] = "0123456789abcdef";
    char esc[6] = {'\\', (char)c, 0, 0, 0, 0};
    size_t n = 2;
    if (c == '\n')
        esc[1] = 'n';
    else if (c == '\t')
        esc[1] = 't';
    else if (c == '\r')
        esc[1] = 'r';
    else if (c < 0x20) {
        esc[1] = 'u';
        esc[2] = '0';
        esc[3] = '0';
        esc[4] = hex[c >> 4];
        esc[5] = hex[c & 15];
        n = 6;
    }
    return buf_append(b, esc, n);
}

enum gg_status jw_string(struct buf *b, const char *s, size_t len)
{
    const char *end = s + len, *p = s;
    /*
     * One copy per run of bytes up to an escape, the opening quote with the
     * first run and the closing one with the last: a plain string is one copy.
     */
    size_t open = 1;
    for (;;) {
        const char *run = p;
        p = next_escape(p, end);
        size_t n = (size_t)(p - run);
        char *out;
        enum gg_status st = buf_extend(b, open + n + (p == end), &out);
        if (st != GG_OK)
            return st;
        if (open)
            *out++ = '"';
        memcpy(out, run, n);
        if (p == end) {
            out[n] = '"';
            return GG_OK;
        }
        open = 0;
        if ((st = put_escape(b, (unsigned char)*p++)) != GG_OK)
            return st;
    }
}

enum gg_status jw_integer(struct buf *b, json_int_t v)
{
    char text[24], *p = text + sizeof(text);
    /* The magnitude in unsigned arithmetic: -INT64_MIN does not fit. */
    unsigned long long u = v < 0 ? 0ULL - (unsigned long long)v : (unsigned long long)v;
    do {
        *--p = (char)('0' + u % 10);
        u /= 10;
    } while (u);
    if (v < 0)
        *--p = '-';
    return buf_append(b, p, (size_t)(text + sizeof(text) - p));
}

/*
 * jansson's jsonp_dtostr with its default precision.  jansson refuses
 * non-finite reals, so there is no inf or nan; the process never calls
 * setlocale, so the decimal point is '.'.
 */
enum gg_status jw_real(struct buf *b, double d)
{
    char text[40]; /* "-1.2345678901234567e-308" is the longest */
    int n = snprintf(text, sizeof(text), "%.17g", d);
    if (n < 0 || (size_t)n >= sizeof(text) - 2)
        return GG_ERR_INVALID;
    char *e = memchr(text, 'e', (size_t)n);
    if (!e) {
        /* "1" would load back as an integer. */
        if (!memchr(text, '.', (size_t)n)) {
            text[n++] = '.';
            text[n++] = '0';
        }
        return buf_append(b, text, (size_t)n);
    }
    /* "e+05" becomes "e5" and "e-05" "e-5". */
    char *out = e + 1, *in = e + 1;
    if (*in == '-')
        out = ++in;
    else if (*in == '+')
        in++;
    while (*in == '0')
        in++;
    size_t digits = (size_t)(text + n - in);
    memmove(out, in, digits);
    return buf_append(b, text, (size_t)(out - text) + digits);
}

static enum gg_status put_value(struct buf *b, const json_t *v, int depth);

/* The closing bracket of a container that had count members, each followed by a comma. */
static enum gg_status close_container(struct buf *b, size_t count, char bracket)
{
    if (count == 0)
        return put_char(b, bracket);
    b->data[b->len - 1] = bracket;
    return GG_OK;
}

static enum gg_status put_array(struct buf *b, const json_t *v, int depth)
{
    size_t n = json_array_size(v);
    enum gg_status st = put_char(b, '[');
    for (size_t i = 0; i < n && st == GG_OK; i++)
        if ((st = put_value(b, json_array_get(v, i), depth)) == GG_OK)
            st = put_char(b, ',');
    return st == GG_OK ? close_container(b, n, ']') : st;
}

static enum gg_status put_object(struct buf *b, const json_t *v, int depth)
{
    /* jansson's iterators take a non-const object; nothing here changes it. */
    json_t *obj = (json_t *)v;
    enum gg_status st = put_char(b, '{');
    for (void *it = json_object_iter(obj); it && st == GG_OK; it = json_object_iter_next(obj, it))
        if ((st = jw_string(b, json_object_iter_key(it), json_object_iter_key_len(it))) == GG_OK &&
            (st = put_char(b, ':')) == GG_OK &&
            (st = put_value(b, json_object_iter_value(it), depth)) == GG_OK)
            st = put_char(b, ',');
    return st == GG_OK ? close_container(b, json_object_size(v), '}') : st;
}

static enum gg_status put_value(struct buf *b, const json_t *v, int depth)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT:
        return depth < JW_MAX_DEPTH ? put_object(b, v, depth + 1) : GG_ERR_TOOBIG;
    case JSON_ARRAY:
        return depth < JW_MAX_DEPTH ? put_array(b, v, depth + 1) : GG_ERR_TOOBIG;
    case JSON_STRING:
        return jw_string(b, json_string_value(v), json_string_length(v));
    case JSON_INTEGER:
        return jw_integer(b, json_integer_value(v));
    case JSON_REAL:
        return jw_real(b, json_real_value(v));
    case JSON_TRUE:
        return BUF_LITERAL(b, "true");
    case JSON_FALSE:
        return BUF_LITERAL(b, "false");
    case JSON_NULL:
        return BUF_LITERAL(b, "null");
    }
    return GG_ERR_INVALID;
}

enum gg_status jw_value(struct buf *b, const json_t *v)
{
    return v ? put_value(b, v, 0) : GG_ERR_INVALID;
}

static enum gg_status put_node(struct buf *b, const struct jf_node *n, int depth)
{
    bool object = n->type == JF_OBJECT;
    switch (n->type) {
    case JF_OBJECT:
    case JF_ARRAY: {
        if (depth >= JW_MAX_DEPTH)
            return GG_ERR_TOOBIG;
        enum gg_status st = put_char(b, object ? '{' : '[');
        for (uint32_t i = 0; i < n->n && st == GG_OK; i++) {
            const struct jf_node *m = &n->u.items[i];
            if (object && ((st = jw_string(b, m->key, m->key_len)) != GG_OK ||
                           (st = put_char(b, ':')) != GG_OK))
                break;
            if ((st = put_node(b, m, depth + 1)) == GG_OK)
                st = put_char(b, ',');
        }
        return st == GG_OK ? close_container(b, n->n, object ? '}' : ']') : st;
    }
    case JF_STRING:
        return jw_string(b, n->u.s, n->n);
    case JF_INTEGER:
        return jw_integer(b, n->u.i);
    case JF_REAL:
        return jw_real(b, n->u.d);
    case JF_TRUE:
        return BUF_LITERAL(b, "true");
    case JF_FALSE:
        return BUF_LITERAL(b, "false");
    case JF_NULL:
        return BUF_LITERAL(b, "null");
    }
    return GG_ERR_INVALID;
}

enum gg_status jw_node(struct buf *b, const struct jf_node *n)
{
    return n ? put_node(b, n, 0) : GG_ERR_INVALID;
}
