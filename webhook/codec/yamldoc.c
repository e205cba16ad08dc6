/*
 * yamldoc.c - YAML (and JSON) text to jansson values, resolved the way
 * sigs.k8s.io/yaml (go-yaml v2, then JSON) reads Kubernetes manifests.
 * The rules and bounds are documented in yamldoc.h.
 *
 * libyaml's event parser drives an explicit stack of open collections, so
 * nesting is a checked limit and never C recursion, and every bound is
 * checked before the memory for it is spent.  Pure: no I/O, no globals.
 */
#include "codec/yamldoc.h"

#include <locale.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <yaml.h>

#define YD_TAG_PREFIX "tag:yaml.org,2002:"
#define YD_SHOW 40 /* bytes of a scalar quoted in a message */

enum yd_kind { YD_NULL, YD_BOOL, YD_INT, YD_FLOAT, YD_STR };

/* A resolved scalar. */
struct yd_scalar {
    enum yd_kind kind;
    int boolean;
    long long integer;
    double real;
};

/* How resolving a plain scalar went. */
enum yd_res { YD_RES_OK, YD_RES_INT_RANGE, YD_RES_FLOAT_RANGE, YD_RES_NOMEM };

/* go-yaml v2's resolve table (resolve.go); "<<" is handled as a key. */
static const struct {
    const char *words[7]; /* NULL-terminated */
    enum yd_kind kind;
    int boolean;
    double real;
} yd_words[] = {
    {{"y", "Y", "yes", "Yes", "YES"}, YD_BOOL, 1, 0},
    {{"true", "True", "TRUE", "on", "On", "ON"}, YD_BOOL, 1, 0},
    {{"n", "N", "no", "No", "NO"}, YD_BOOL, 0, 0},
    {{"false", "False", "FALSE", "off", "Off", "OFF"}, YD_BOOL, 0, 0},
    {{"", "~", "null", "Null", "NULL"}, YD_NULL, 0, 0},
    {{".nan", ".NaN", ".NAN"}, YD_FLOAT, 0, NAN},
    {{".inf", ".Inf", ".INF", "+.inf", "+.Inf", "+.INF"}, YD_FLOAT, 0, HUGE_VAL},
    {{"-.inf", "-.Inf", "-.INF"}, YD_FLOAT, 0, -HUGE_VAL},
};

struct yd_anchor {
    json_t *value; /* NULL while the anchored node is still open */
    size_t nodes;  /* values an alias to it adds */
    size_t bytes;  /* bytes of keys and scalar text an alias to it copies */
    size_t height; /* collection levels inside it, 0 for a scalar */
};

/* An open mapping or sequence. */
struct yd_frame {
    json_t *node;        /* the object or array being filled */
    json_t *merged;      /* mappings: keys from "<<", added at the end unless written */
    char *key;           /* mappings: the key waiting for its value, NULL if none */
    int key_is_merge;    /* that key is "<<" */
    yaml_mark_t mark;    /* where the node starts */
    size_t index;        /* sequences: items so far, i.e. the index being read */
    size_t height;       /* collection levels in this node, itself included */
    size_t anchor;       /* anchor slot + 1, or 0 */
    size_t nodes_before; /* loader's node count before this node */
    size_t bytes_before; /* loader's byte count before this node */
};

/* A byte offset turned into line and column as libyaml counts them. */
struct yd_cursor {
    size_t off, line, column;
};

struct yd_loader {
    const char *src;
    struct yd_limits lim;
    struct gg_err *err;
    locale_t c_locale; /* for strtod_l, made on first use */
    struct yd_frame *frames;
    size_t nframes, frames_cap;
    struct yd_anchor *anchors;
    size_t nanchors, anchors_cap;
    json_t *anchor_slots; /* anchor name -> index into anchors */
    size_t nodes, alias_nodes;
    size_t bytes, alias_bytes; /* keys and scalar text built, and copied by aliases */
    json_t *root;              /* the current document's value once complete */
    yaml_mark_t root_mark;
    size_t doc_number;
    json_t *docs;
    struct yd_doc *pos;
    size_t npos, pos_cap;
};

/* ---- messages and positions --------------------------------------------- */

static enum gg_status yd_fail_lc(const struct yd_loader *ld, enum gg_status st, size_t line,
                                 size_t col, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static enum gg_status yd_fail(const struct yd_loader *ld, enum gg_status st,
                              const yaml_mark_t *mark, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static enum gg_status yd_vfail(const struct yd_loader *ld, enum gg_status st, size_t line,
                               size_t col, const char *fmt, va_list ap)
{
    char msg[sizeof(((struct gg_err *)0)->msg)];

    vsnprintf(msg, sizeof(msg), fmt, ap);
    return gg_fail(ld->err, st, "%s:%zu:%zu: %s", ld->src, line, col, msg);
}

static enum gg_status yd_fail_lc(const struct yd_loader *ld, enum gg_status st, size_t line,
                                 size_t col, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    st = yd_vfail(ld, st, line, col, fmt, ap);
    va_end(ap);
    return st;
}

static enum gg_status yd_fail(const struct yd_loader *ld, enum gg_status st,
                              const yaml_mark_t *mark, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    st = yd_vfail(ld, st, mark->line + 1, mark->column + 1, fmt, ap);
    va_end(ap);
    return st;
}

static enum gg_status yd_nomem(const struct yd_loader *ld)
{
    return gg_fail(ld->err, GG_ERR_NOMEM, "%s: out of memory reading YAML", ld->src);
}

static size_t yd_bom_len(const char *text, size_t len)
{
    return len >= 3 && memcmp(text, "\xEF\xBB\xBF", 3) == 0 ? 3 : 0;
}

/* libyaml does not count the BOM as a column, so neither does the cursor. */
static void yd_cursor_init(struct yd_cursor *c, const char *text, size_t len)
{
    c->off = yd_bom_len(text, len);
    c->line = 1;
    c->column = 1;
}

/* Columns count characters: UTF-8 continuation bytes are skipped. */
static void yd_cursor_advance(struct yd_cursor *c, const char *text, size_t to)
{
    for (; c->off < to; c->off++) {
        unsigned char b = (unsigned char)text[c->off];
        if (b == '\n') {
            c->line++;
            c->column = 1;
        } else if ((b & 0xC0) != 0x80) {
            c->column++;
        }
    }
}

/* The key path of the value being read, e.g. spec.containers[0].name. */
static void yd_path(const struct yd_loader *ld, char *buf, size_t size)
{
    size_t used = 0;

    buf[0] = '\0';
    for (size_t i = 0; i < ld->nframes && used < size; i++) {
        const struct yd_frame *f = &ld->frames[i];
        int n;

        if (json_is_array(f->node))
            n = snprintf(buf + used, size - used, "[%zu]", f->index);
        else if (!f->key)
            break;
        else if (f->key[0] && strcspn(f->key, ".[]\" ") == strlen(f->key) && !f->key_is_merge)
            n = snprintf(buf + used, size - used, "%s%s", used ? "." : "", f->key);
        else
            n = snprintf(buf + used, size - used, "[\"%s\"]", f->key);
        if (n < 0)
            break;
        used += (size_t)n;
    }
}

/* ---- the input as a whole ------------------------------------------------ */

/* Size, then encoding: UTF-8 only, no NUL, no overlongs or surrogates. */
static enum gg_status yd_check_text(const struct yd_loader *ld, const char *text, size_t len)
{
    const unsigned char *p = (const unsigned char *)text;
    struct yd_cursor cur;
    size_t i = 0;

    yd_cursor_init(&cur, text, len);
    if (len >= 2 && ((p[0] == 0xFF && p[1] == 0xFE) || (p[0] == 0xFE && p[1] == 0xFF)))
        return yd_fail_lc(ld, GG_ERR_PARSE, 1, 1,
                          "UTF-16 text is not supported; convert the file to UTF-8");
    if (len > ld->lim.max_bytes) {
        yd_cursor_advance(&cur, text, ld->lim.max_bytes);
        return yd_fail_lc(ld, GG_ERR_TOOBIG, cur.line, cur.column,
                          "input is %zu bytes, over the limit of %zu", len, ld->lim.max_bytes);
    }
    while (i < len) {
        uint32_t cp = p[i], min = 0;
        size_t n = 1;

        if (cp == 0) {
            yd_cursor_advance(&cur, text, i);
            return yd_fail_lc(ld, GG_ERR_PARSE, cur.line, cur.column,
                              "NUL byte in the text (binary data is not YAML)");
        }
        if (cp >= 0xC2 && cp <= 0xDF)
            n = 2, min = 0x80, cp &= 0x1F;
        else if (cp >= 0xE0 && cp <= 0xEF)
            n = 3, min = 0x800, cp &= 0x0F;
        else if (cp >= 0xF0 && cp <= 0xF4)
            n = 4, min = 0x10000, cp &= 0x07;
        else if (cp >= 0x80)
            goto bad;
        if (n > len - i)
            goto bad;
        for (size_t k = 1; k < n; k++) {
            if ((p[i + k] & 0xC0) != 0x80)
                goto bad;
            cp = (cp << 6) | (p[i + k] & 0x3F);
        }
        if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
            goto bad;
        i += n;
    }
    return GG_OK;
bad:
    yd_cursor_advance(&cur, text, i);
    return yd_fail_lc(ld, GG_ERR_PARSE, cur.line, cur.column,
                      "invalid UTF-8 (byte 0x%02x); YAML text must be UTF-8", p[i]);
}

/* ---- scalars -------------------------------------------------------------- */

static int yd_digit(char c)
{
    return c >= '0' && c <= '9';
}

/* The whole of s matches [-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)? */
static int yd_float_syntax(const char *s, size_t n)
{
    size_t i = 0, d;

    if (i < n && (s[i] == '+' || s[i] == '-'))
        i++;
    if (i < n && s[i] == '.') {
        d = ++i;
        while (i < n && yd_digit(s[i]))
            i++;
        if (i == d)
            return 0;
    } else {
        d = i;
        while (i < n && yd_digit(s[i]))
            i++;
        if (i == d)
            return 0;
        if (i < n && s[i] == '.')
            for (i++; i < n && yd_digit(s[i]);)
                i++;
    }
    if (i < n && (s[i] == 'e' || s[i] == 'E')) {
        i++;
        if (i < n && (s[i] == '+' || s[i] == '-'))
            i++;
        d = i;
        while (i < n && yd_digit(s[i]))
            i++;
        if (i == d)
            return 0;
    }
    return i == n;
}

/*
 * Go's strconv.ParseInt(s, 0, 64): optional sign, then 0x / 0o / 0b
 * prefixes or a leading 0 for octal.  0 = ok, 1 = not an integer,
 * 2 = an integer outside int64.
 */
static int yd_parse_int(const char *s, size_t n, long long *out)
{
    uint64_t v = 0;
    unsigned base = 10;
    size_t i = 0;
    int neg = 0, range = 0;

    if (n && (s[0] == '+' || s[0] == '-')) {
        neg = s[0] == '-';
        i = 1;
    }
    if (i == n)
        return 1;
    if (s[i] == '0') {
        char c = n - i >= 3 ? (char)(s[i + 1] | 0x20) : 0;
        base = c == 'x' ? 16 : c == 'o' ? 8 : c == 'b' ? 2 : 8;
        i += c == 'x' || c == 'o' || c == 'b' ? 2 : 1;
    }
    for (; i < n; i++) {
        char c = s[i];
        unsigned d = yd_digit(c)                              ? (unsigned)(c - '0')
                     : (c | 0x20) >= 'a' && (c | 0x20) <= 'f' ? (unsigned)((c | 0x20) - 'a' + 10)
                                                              : 99;
        if (d >= base)
            return 1;
        if (v > (UINT64_MAX - d) / base)
            range = 1;
        else
            v = v * base + d;
    }
    if (range || v > (uint64_t)INT64_MAX + (neg ? 1 : 0))
        return 2;
    *out = neg ? (v == (uint64_t)INT64_MAX + 1 ? INT64_MIN : -(long long)v) : (long long)v;
    return 0;
}

/* s is NUL-terminated and has float syntax; parse it in the C locale. */
static enum yd_res yd_to_double(struct yd_loader *ld, const char *s, struct yd_scalar *out)
{
    double d;

    if (!ld->c_locale) {
        ld->c_locale = newlocale(LC_NUMERIC_MASK, "C", (locale_t)0);
        if (!ld->c_locale)
            return YD_RES_NOMEM;
    }
    d = strtod_l(s, NULL, ld->c_locale);
    if (isinf(d))
        return YD_RES_FLOAT_RANGE;
    out->kind = YD_FLOAT;
    out->real = d;
    return YD_RES_OK;
}

/* go-yaml v2's resolve() for an untagged plain scalar (s[n] is a NUL). */
static enum yd_res yd_resolve_plain(struct yd_loader *ld, const char *s, size_t n,
                                    struct yd_scalar *out)
{
    char small[128], *plain = NULL;
    size_t pn = 0;
    enum yd_res res = YD_RES_OK;
    int r;

    out->kind = YD_STR;
    for (size_t i = 0; n <= 5 && i < sizeof(yd_words) / sizeof(yd_words[0]); i++) {
        for (const char *const *w = yd_words[i].words; *w; w++) {
            if (strlen(*w) == n && memcmp(*w, s, n) == 0) {
                out->kind = yd_words[i].kind;
                out->boolean = yd_words[i].boolean;
                out->real = yd_words[i].real;
                return YD_RES_OK;
            }
        }
    }
    /* A leading dot: Go's ParseFloat on the text as written. */
    if (s[0] == '.')
        return yd_float_syntax(s, n) ? yd_to_double(ld, s, out) : YD_RES_OK;
    if (!yd_digit(s[0]) && s[0] != '+' && s[0] != '-')
        goto out;
    /* Numbers are read with every '_' removed, as go-yaml does. */
    plain = n < sizeof(small) ? small : malloc(n + 1);
    if (!plain) {
        res = YD_RES_NOMEM;
        goto out;
    }
    for (size_t i = 0; i < n; i++)
        if (s[i] != '_')
            plain[pn++] = s[i];
    plain[pn] = '\0';
    r = yd_parse_int(plain, pn, &out->integer);
    if (r == 0)
        out->kind = YD_INT;
    else if (r == 2)
        res = YD_RES_INT_RANGE;
    else if (yd_float_syntax(plain, pn))
        res = yd_to_double(ld, plain, out);
out:
    if (plain != small)
        free(plain);
    return res;
}

/* Resolve a scalar event: tags, quoting, then the plain rules. */
static enum gg_status yd_scalar_resolve(struct yd_loader *ld, const yaml_event_t *ev,
                                        struct yd_scalar *out)
{
    const char *s = (const char *)ev->data.scalar.value;
    size_t n = ev->data.scalar.length;
    const char *tag = (const char *)ev->data.scalar.tag;
    const char *want = NULL;
    const yaml_mark_t *m = &ev->start_mark;
    int show = n < YD_SHOW ? (int)n : YD_SHOW;
    int ok;

    out->kind = YD_STR;
    if (memchr(s, '\0', n))
        return yd_fail(ld, GG_ERR_PARSE, m, "string contains a NUL character (a \\0 escape)");
    if (!tag) {
        if (!ev->data.scalar.plain_implicit)
            return GG_OK;
    } else if (strncmp(tag, YD_TAG_PREFIX, sizeof(YD_TAG_PREFIX) - 1) == 0) {
        want = tag + sizeof(YD_TAG_PREFIX) - 1;
        if (strcmp(want, "binary") == 0)
            return yd_fail(ld, GG_ERR_PARSE, m,
                           "!!binary is not supported; write the base64 text as a plain string");
        if (strcmp(want, "int") && strcmp(want, "float") && strcmp(want, "bool") &&
            strcmp(want, "null"))
            return GG_OK; /* !!str, !!timestamp, ...: the text */
    } else {
        return GG_OK; /* local tags (!foo, !) keep the text, as in go-yaml */
    }
    switch (yd_resolve_plain(ld, s, n, out)) {
    case YD_RES_OK:
        break;
    case YD_RES_NOMEM:
        return yd_nomem(ld);
    case YD_RES_INT_RANGE:
        return yd_fail(ld, GG_ERR_PARSE, m,
                       "integer %.*s does not fit in 64 bits; quote it to keep it as a string",
                       show, s);
    case YD_RES_FLOAT_RANGE:
        return yd_fail(ld, GG_ERR_PARSE, m,
                       "number %.*s is out of range; quote it to keep it as a string", show, s);
    }
    if (!want)
        return GG_OK;
    ok = (!strcmp(want, "int") && out->kind == YD_INT) ||
         (!strcmp(want, "float") && (out->kind == YD_FLOAT || out->kind == YD_INT)) ||
         (!strcmp(want, "bool") && out->kind == YD_BOOL) ||
         (!strcmp(want, "null") && out->kind == YD_NULL);
    if (!ok)
        return yd_fail(ld, GG_ERR_PARSE, m, "cannot read \"%.*s\" as !!%s", show, s, want);
    if (out->kind == YD_INT && !strcmp(want, "float")) {
        out->kind = YD_FLOAT;
        out->real = (double)out->integer;
    }
    return GG_OK;
}

/* An integral float in int64 range is an integer, as after the JSON round trip. */
static int yd_integral(double d)
{
    return d >= -9223372036854775808.0 && d < 9223372036854775808.0 && (double)(long long)d == d;
}

static json_t *yd_number(double d)
{
    return yd_integral(d) ? json_integer((json_int_t)d) : json_real(d);
}

static json_t *yd_scalar_json(const struct yd_scalar *sc, const char *s, size_t n)
{
    switch (sc->kind) {
    case YD_NULL:
        return json_null();
    case YD_BOOL:
        return json_boolean(sc->boolean);
    case YD_INT:
        return json_integer(sc->integer);
    case YD_FLOAT:
        return yd_number(sc->real);
    case YD_STR:
        break;
    }
    return json_stringn(s, n);
}

/*
 * A float key's text: Go's strconv.FormatFloat(v, 'g', -1, 32), which
 * sigs.k8s.io/yaml uses for float keys.  The shortest digits that read
 * back as the same float32, %e when the exponent is < -4 or >= 6.
 */
static void yd_float_key(double v, char *buf, size_t size)
{
    float f = (float)v;
    char e[32], digits[16];
    int prec, exp, nd = 0;
    const char *p;

    if (isnan(f) || isinf(f) || f == 0) {
        snprintf(buf, size, "%s",
                 isnan(f)     ? ".nan"
                 : isinf(f)   ? (f > 0 ? ".inf" : "-.inf")
                 : signbit(f) ? "-0"
                              : "0");
        return;
    }
    for (prec = 1; prec < 9; prec++) {
        snprintf(e, sizeof(e), "%.*e", prec - 1, (double)f);
        if (strtof(e, NULL) == f)
            break;
    }
    snprintf(e, sizeof(e), "%.*e", prec - 1, (double)f);
    for (p = e; *p && *p != 'e'; p++)
        if (yd_digit(*p))
            digits[nd++] = *p;
    while (nd > 1 && digits[nd - 1] == '0')
        nd--;
    digits[nd] = '\0';
    exp = atoi(p + 1);
    if (exp < -4 || exp >= 6)
        snprintf(buf, size, "%s%c%s%se%c%02d", f < 0 ? "-" : "", digits[0], nd > 1 ? "." : "",
                 digits + 1, exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
    else if (exp < 0)
        snprintf(buf, size, "%s0.%.*s%s", f < 0 ? "-" : "", -exp - 1, "0000", digits);
    else if (nd <= exp + 1)
        snprintf(buf, size, "%s%s%.*s", f < 0 ? "-" : "", digits, exp + 1 - nd, "000000");
    else
        snprintf(buf, size, "%s%.*s.%s", f < 0 ? "-" : "", exp + 1, digits, digits + exp + 1);
}

static char *yd_strndup(const char *s, size_t n)
{
    char *d = malloc(n + 1);

    if (d) {
        memcpy(d, s, n);
        d[n] = '\0';
    }
    return d;
}

/* The string a resolved scalar key becomes (sigs.k8s.io/yaml's rules). */
static enum gg_status yd_key_text(struct yd_loader *ld, const struct yd_scalar *sc, const char *s,
                                  size_t n, const yaml_mark_t *m, char **key)
{
    char buf[64];
    const char *text = buf;

    switch (sc->kind) {
    case YD_STR:
        *key = yd_strndup(s, n);
        return *key ? GG_OK : yd_nomem(ld);
    case YD_NULL:
        return yd_fail(ld, GG_ERR_PARSE, m,
                       "null is not allowed as a mapping key (quote it if it is a name)");
    case YD_BOOL:
        text = sc->boolean ? "true" : "false";
        break;
    case YD_INT:
        snprintf(buf, sizeof(buf), "%lld", sc->integer);
        break;
    case YD_FLOAT:
        yd_float_key(sc->real, buf, sizeof(buf));
        break;
    }
    *key = yd_strndup(text, strlen(text));
    return *key ? GG_OK : yd_nomem(ld);
}

/* The string an aliased value becomes when used as a key. */
static enum gg_status yd_key_from_json(struct yd_loader *ld, const json_t *v, const char *alias,
                                       const yaml_mark_t *m, char **key)
{
    char buf[64];
    const char *text = buf;

    switch (json_typeof(v)) {
    case JSON_STRING:
        text = json_string_value(v);
        break;
    case JSON_INTEGER:
        snprintf(buf, sizeof(buf), "%" JSON_INTEGER_FORMAT, json_integer_value(v));
        break;
    case JSON_REAL:
        yd_float_key(json_real_value(v), buf, sizeof(buf));
        break;
    case JSON_TRUE:
        text = "true";
        break;
    case JSON_FALSE:
        text = "false";
        break;
    case JSON_NULL:
        return yd_fail(ld, GG_ERR_PARSE, m, "alias *%s is null and cannot be a mapping key", alias);
    default:
        return yd_fail(ld, GG_ERR_PARSE, m, "alias *%s is a %s and cannot be a mapping key", alias,
                       json_is_object(v) ? "mapping" : "sequence");
    }
    *key = yd_strndup(text, strlen(text));
    return *key ? GG_OK : yd_nomem(ld);
}

/* ---- anchors -------------------------------------------------------------- */

static void yd_anchors_reset(struct yd_loader *ld)
{
    for (size_t i = 0; i < ld->nanchors; i++)
        json_decref(ld->anchors[i].value);
    ld->nanchors = 0;
    json_object_clear(ld->anchor_slots);
}

/* Define an anchor; it refers to nothing until yd_anchor_close(). */
static enum gg_status yd_anchor_open(struct yd_loader *ld, const char *name, size_t *slot)
{
    if (ld->nanchors == ld->anchors_cap) {
        size_t cap = ld->anchors_cap ? ld->anchors_cap * 2 : 16;
        struct yd_anchor *a = realloc(ld->anchors, cap * sizeof(*a));
        if (!a)
            return yd_nomem(ld);
        ld->anchors = a;
        ld->anchors_cap = cap;
    }
    /* A later anchor with the same name replaces the earlier one. */
    if (json_object_set_new(ld->anchor_slots, name, json_integer((json_int_t)ld->nanchors)))
        return yd_nomem(ld);
    ld->anchors[ld->nanchors] = (struct yd_anchor){NULL, 0, 0, 0};
    *slot = ld->nanchors++;
    return GG_OK;
}

static void yd_anchor_close(struct yd_loader *ld, size_t slot, json_t *value, size_t nodes,
                            size_t bytes, size_t height)
{
    struct yd_anchor *a = &ld->anchors[slot];

    a->value = json_incref(value);
    a->nodes = nodes;
    a->bytes = bytes;
    a->height = height;
}

static enum gg_status yd_anchor_find(struct yd_loader *ld, const char *name, const yaml_mark_t *m,
                                     const struct yd_anchor **out)
{
    json_t *slot = json_object_get(ld->anchor_slots, name);
    const struct yd_anchor *a;

    if (!slot)
        return yd_fail(ld, GG_ERR_PARSE, m,
                       "alias *%s has no anchor &%s before it in this document", name, name);
    a = &ld->anchors[json_integer_value(slot)];
    if (!a->value)
        return yd_fail(ld, GG_ERR_PARSE, m, "alias *%s refers to a node that contains it", name);
    *out = a;
    return GG_OK;
}

/* ---- building the tree ---------------------------------------------------- */

static struct yd_frame *yd_top(struct yd_loader *ld)
{
    return ld->nframes ? &ld->frames[ld->nframes - 1] : NULL;
}

static int yd_expecting_key(struct yd_loader *ld)
{
    struct yd_frame *f = yd_top(ld);

    return f && json_is_object(f->node) && !f->key;
}

/* The sequence on top is the value of a "<<" key. */
static int yd_in_merge_seq(const struct yd_loader *ld)
{
    return ld->nframes >= 2 && json_is_array(ld->frames[ld->nframes - 1].node) &&
           ld->frames[ld->nframes - 2].key_is_merge;
}

static void yd_raise(struct yd_frame *f, size_t height)
{
    if (height > f->height)
        f->height = height;
}

static enum gg_status yd_count(struct yd_loader *ld, const yaml_mark_t *m)
{
    if (ld->nodes >= ld->lim.max_nodes)
        return yd_fail(ld, GG_ERR_TOOBIG, m, "more than %zu values (the node limit)",
                       ld->lim.max_nodes);
    ld->nodes++;
    return GG_OK;
}

/* Take key (stolen) as the pending key of the mapping on top. */
static enum gg_status yd_set_key(struct yd_loader *ld, char *key, int is_merge,
                                 const yaml_mark_t *m)
{
    struct yd_frame *f = yd_top(ld);
    char path[128];

    f->key = key; /* first, so that the path names it */
    f->key_is_merge = is_merge;
    ld->bytes += strlen(key);
    if (is_merge && f->merged) {
        yd_path(ld, path, sizeof(path));
        return yd_fail(ld, GG_ERR_PARSE, m, "duplicate merge key << at %s", path);
    }
    if (!is_merge && json_object_get(f->node, key)) {
        yd_path(ld, path, sizeof(path));
        return yd_fail(ld, GG_ERR_PARSE, m, "duplicate key \"%s\" at %s", key, path);
    }
    return GG_OK;
}

/* The value of a "<<" key (stolen): keep its keys for the end of the mapping. */
static enum gg_status yd_merge(struct yd_loader *ld, struct yd_frame *f, json_t *v, size_t height,
                               const yaml_mark_t *m)
{
    enum gg_status st = GG_OK;
    json_t *merged = NULL;

    if (json_is_object(v)) {
        merged = json_incref(v);
        yd_raise(f, height);
    } else if (json_is_array(v)) {
        /* The first mapping listed wins. */
        merged = json_object();
        if (!merged) {
            st = yd_nomem(ld);
            goto out;
        }
        for (size_t i = 0; i < json_array_size(v); i++) {
            json_t *item = json_array_get(v, i), *value;
            const char *k;

            /* Items written in place were checked as they came; an alias's were not. */
            if (!json_is_object(item)) {
                st = yd_fail(ld, GG_ERR_PARSE, m,
                             "item %zu of a merge key (<<) sequence is not a mapping", i);
                goto out;
            }
            json_object_foreach(item, k, value)
            {
                if (!json_object_get(merged, k) && json_object_set(merged, k, value)) {
                    st = yd_nomem(ld);
                    goto out;
                }
            }
        }
        yd_raise(f, height - 1);
    } else {
        st = yd_fail(ld, GG_ERR_PARSE, m,
                     "the value of a merge key (<<) must be a mapping or a sequence of mappings");
        goto out;
    }
    f->merged = merged;
    merged = NULL;
    free(f->key);
    f->key = NULL;
    f->key_is_merge = 0;
out:
    json_decref(merged);
    json_decref(v);
    return st;
}

/*
 * Put a finished value (stolen) where it belongs: the document root, the
 * sequence on top, or the mapping on top under its pending key.  height is
 * the number of collection levels in it.
 */
static enum gg_status yd_deliver(struct yd_loader *ld, json_t *v, size_t height,
                                 const yaml_mark_t *m)
{
    enum gg_status st = GG_OK;
    struct yd_frame *f = yd_top(ld);

    if (!f) {
        ld->root = v;
        ld->root_mark = *m;
        return GG_OK;
    }
    if (json_is_array(f->node)) {
        if (yd_in_merge_seq(ld) && !json_is_object(v)) {
            st = yd_fail(ld, GG_ERR_PARSE, m,
                         "item %zu of a merge key (<<) sequence is not a mapping", f->index);
            goto out;
        }
        if (json_array_append(f->node, v)) {
            st = yd_nomem(ld);
            goto out;
        }
        f->index++;
        yd_raise(f, height + 1);
    } else if (f->key_is_merge) {
        st = yd_merge(ld, f, json_incref(v), height, m);
    } else {
        if (json_object_set(f->node, f->key, v)) {
            st = yd_nomem(ld);
            goto out;
        }
        free(f->key);
        f->key = NULL;
        yd_raise(f, height + 1);
    }
out:
    json_decref(v);
    return st;
}

/* A mapping or sequence starts. */
static enum gg_status yd_push(struct yd_loader *ld, const yaml_event_t *ev, int is_map)
{
    const yaml_mark_t *m = &ev->start_mark;
    const char *anchor =
        (const char *)(is_map ? ev->data.mapping_start.anchor : ev->data.sequence_start.anchor);
    struct yd_frame *f;
    enum gg_status st;
    size_t slot;

    if (yd_expecting_key(ld))
        return yd_fail(ld, GG_ERR_PARSE, m,
                       "a %s cannot be a mapping key (complex keys are not supported)",
                       is_map ? "mapping" : "sequence");
    if (ld->nframes >= ld->lim.max_depth)
        return yd_fail(ld, GG_ERR_TOOBIG, m, "nesting deeper than %zu levels", ld->lim.max_depth);
    if (ld->nframes == ld->frames_cap) {
        size_t cap = ld->frames_cap ? ld->frames_cap * 2 : 16;
        f = realloc(ld->frames, cap * sizeof(*f));
        if (!f)
            return yd_nomem(ld);
        ld->frames = f;
        ld->frames_cap = cap;
    }
    st = yd_count(ld, m);
    if (st != GG_OK)
        return st;
    f = &ld->frames[ld->nframes];
    memset(f, 0, sizeof(*f));
    f->node = is_map ? json_object() : json_array();
    if (!f->node)
        return yd_nomem(ld);
    f->mark = *m;
    f->height = 1;
    f->nodes_before = ld->nodes - 1;
    f->bytes_before = ld->bytes;
    ld->nframes++;
    if (anchor) {
        st = yd_anchor_open(ld, anchor, &slot);
        if (st != GG_OK)
            return st;
        f->anchor = slot + 1;
    }
    return GG_OK;
}

/* The mapping or sequence on top ends. */
static enum gg_status yd_pop(struct yd_loader *ld)
{
    /* A copy: once popped, the slot belongs to the next push. */
    struct yd_frame f = ld->frames[--ld->nframes];
    enum gg_status st = GG_OK;

    if (f.merged) {
        const char *k;
        json_t *v;
        json_object_foreach(f.merged, k, v)
        {
            if (!json_object_get(f.node, k) && json_object_set(f.node, k, v)) {
                st = yd_nomem(ld);
                goto out;
            }
        }
    }
    if (f.anchor)
        yd_anchor_close(ld, f.anchor - 1, f.node, ld->nodes - f.nodes_before,
                        ld->bytes - f.bytes_before, f.height);
    st = yd_deliver(ld, f.node, f.height, &f.mark);
    f.node = NULL;
out:
    json_decref(f.node);
    json_decref(f.merged);
    free(f.key);
    return st;
}

static enum gg_status yd_on_scalar(struct yd_loader *ld, const yaml_event_t *ev)
{
    const char *s = (const char *)ev->data.scalar.value;
    size_t n = ev->data.scalar.length;
    const char *tag = (const char *)ev->data.scalar.tag;
    const char *anchor = (const char *)ev->data.scalar.anchor;
    const yaml_mark_t *m = &ev->start_mark;
    enum gg_status st = GG_OK;
    struct yd_scalar sc;
    json_t *v = NULL;
    char *key = NULL;
    size_t slot;

    /* An empty or comments-only document: nothing to keep. */
    if (!ld->nframes && n == 0 && !tag && !anchor && ev->data.scalar.plain_implicit)
        return GG_OK;
    if (yd_expecting_key(ld)) {
        /* go-yaml's isMerge: the text "<<", untagged and plain, or tagged !!merge. */
        int merge =
            n == 2 && memcmp(s, "<<", 2) == 0 &&
            (tag ? strcmp(tag, YD_TAG_PREFIX "merge") == 0 : ev->data.scalar.plain_implicit);
        if (merge) {
            key = yd_strndup("<<", 2);
            st = key ? GG_OK : yd_nomem(ld);
        } else {
            st = yd_scalar_resolve(ld, ev, &sc);
            if (st == GG_OK)
                st = yd_key_text(ld, &sc, s, n, m, &key);
        }
        if (st == GG_OK && anchor) {
            st = yd_anchor_open(ld, anchor, &slot);
            v = st == GG_OK ? json_string(key) : NULL;
            if (st == GG_OK && !v)
                st = yd_nomem(ld);
            if (st == GG_OK)
                yd_anchor_close(ld, slot, v, 1, strlen(key), 0);
        }
        if (st == GG_OK) {
            st = yd_set_key(ld, key, merge, m);
            key = NULL;
        }
        goto out;
    }
    st = yd_scalar_resolve(ld, ev, &sc);
    if (st != GG_OK)
        goto out;
    if (sc.kind == YD_FLOAT && (isinf(sc.real) || isnan(sc.real))) {
        st = yd_fail(ld, GG_ERR_PARSE, m,
                     "%.*s is not a number JSON can hold; quote it to keep it as a string",
                     n < YD_SHOW ? (int)n : YD_SHOW, s);
        goto out;
    }
    st = yd_count(ld, m);
    if (st != GG_OK)
        goto out;
    v = yd_scalar_json(&sc, s, n);
    if (!v) {
        st = yd_nomem(ld);
        goto out;
    }
    ld->bytes += n;
    if (anchor) {
        st = yd_anchor_open(ld, anchor, &slot);
        if (st != GG_OK)
            goto out;
        yd_anchor_close(ld, slot, v, 1, n, 0);
    }
    st = yd_deliver(ld, v, 0, m);
    v = NULL;
out:
    free(key);
    json_decref(v);
    return st;
}

/* An alias refused: what it adds (verb n unit) takes all the aliases of the stream past limit. */
static enum gg_status yd_alias_bomb(struct yd_loader *ld, const yaml_mark_t *m, const char *name,
                                    const char *verb, size_t n, const char *unit, size_t limit)
{
    return yd_fail(ld, GG_ERR_TOOBIG, m,
                   "alias *%s %s %zu %s, over the alias limit of %zu in all (an alias bomb?)", name,
                   verb, n, unit, limit);
}

/*
 * An alias is a deep copy of its anchor's value.  Its expanded size is
 * charged before copying, so nested aliases (a "billion laughs") stop at the
 * first copy that would go over a limit.
 */
static enum gg_status yd_on_alias(struct yd_loader *ld, const yaml_event_t *ev)
{
    const char *name = (const char *)ev->data.alias.anchor;
    const yaml_mark_t *m = &ev->start_mark;
    const struct yd_anchor *a = NULL;
    enum gg_status st;
    char *key = NULL;
    size_t adjust;
    json_t *v;

    st = yd_anchor_find(ld, name, m, &a);
    if (st != GG_OK)
        return st;
    if (yd_expecting_key(ld)) {
        st = yd_key_from_json(ld, a->value, name, m, &key);
        return st == GG_OK ? yd_set_key(ld, key, 0, m) : st;
    }
    /* Merged into a mapping, its top level adds no depth (nor the list of a merge). */
    adjust = yd_in_merge_seq(ld) ? 2 : (yd_top(ld) && yd_top(ld)->key_is_merge) ? 1 : 0;
    if (a->height > ld->lim.max_depth - ld->nframes + adjust)
        return yd_fail(ld, GG_ERR_TOOBIG, m, "alias *%s nests deeper than %zu levels", name,
                       ld->lim.max_depth);
    if (a->nodes > ld->lim.max_alias_nodes - ld->alias_nodes)
        return yd_alias_bomb(ld, m, name, "expands to", a->nodes, "values",
                             ld->lim.max_alias_nodes);
    if (a->nodes > ld->lim.max_nodes - ld->nodes)
        return yd_fail(ld, GG_ERR_TOOBIG, m, "alias *%s expands past the limit of %zu values", name,
                       ld->lim.max_nodes);
    /* A few values can still be a lot of text: aliases copy at most max_bytes. */
    if (a->bytes > ld->lim.max_bytes - ld->alias_bytes)
        return yd_alias_bomb(ld, m, name, "copies", a->bytes, "bytes", ld->lim.max_bytes);
    v = json_deep_copy(a->value);
    if (!v)
        return yd_nomem(ld);
    ld->nodes += a->nodes;
    ld->alias_nodes += a->nodes;
    ld->bytes += a->bytes;
    ld->alias_bytes += a->bytes;
    return yd_deliver(ld, v, a->height, m);
}

/* A document ends: keep its value unless it was empty. */
static enum gg_status yd_doc_end(struct yd_loader *ld, size_t number, size_t line, size_t column)
{
    json_t *v = ld->root;

    ld->root = NULL;
    if (!v)
        return GG_OK;
    if (ld->npos == ld->pos_cap) {
        size_t cap = ld->pos_cap ? ld->pos_cap * 2 : 8;
        struct yd_doc *p = realloc(ld->pos, cap * sizeof(*p));
        if (!p) {
            json_decref(v);
            return yd_nomem(ld);
        }
        ld->pos = p;
        ld->pos_cap = cap;
    }
    if (json_array_append_new(ld->docs, v))
        return yd_nomem(ld);
    ld->pos[ld->npos++] = (struct yd_doc){number, line, column};
    return GG_OK;
}

static enum gg_status yd_parser_error(const struct yd_loader *ld, const yaml_parser_t *p,
                                      const char *text, size_t len)
{
    const char *problem = p->problem ? p->problem : "invalid YAML";
    const yaml_mark_t *pm = &p->problem_mark, *cm = &p->context_mark;
    struct yd_cursor cur;

    switch (p->error) {
    case YAML_MEMORY_ERROR:
        return yd_nomem(ld);
    case YAML_READER_ERROR:
        /* Only an offset: turn it into line and column. */
        yd_cursor_init(&cur, text, len);
        yd_cursor_advance(&cur, text, p->problem_offset < len ? p->problem_offset : len);
        if (p->problem_value >= 0)
            return yd_fail_lc(ld, GG_ERR_PARSE, cur.line, cur.column, "%s (U+%04X)", problem,
                              (unsigned)p->problem_value);
        return yd_fail_lc(ld, GG_ERR_PARSE, cur.line, cur.column, "%s", problem);
    default:
        break;
    }
    if (p->context && (cm->line != pm->line || cm->column != pm->column))
        return yd_fail(ld, GG_ERR_PARSE, pm, "%s (%s at line %zu, column %zu)", problem, p->context,
                       cm->line + 1, cm->column + 1);
    if (p->context)
        return yd_fail(ld, GG_ERR_PARSE, pm, "%s (%s)", problem, p->context);
    return yd_fail(ld, GG_ERR_PARSE, pm, "%s", problem);
}

static enum gg_status yd_load_yaml(struct yd_loader *ld, const char *text, size_t len)
{
    enum gg_status st = GG_OK;
    yaml_parser_t parser;
    int have_parser = 0, done = 0;

    if (!yaml_parser_initialize(&parser)) {
        st = yd_nomem(ld);
        goto out;
    }
    have_parser = 1;
    yaml_parser_set_input_string(&parser, (const unsigned char *)text, len);
    while (!done && st == GG_OK) {
        yaml_event_t ev;

        if (!yaml_parser_parse(&parser, &ev)) {
            st = yd_parser_error(ld, &parser, text, len);
            goto out;
        }
        switch (ev.type) {
        case YAML_DOCUMENT_START_EVENT:
            ld->doc_number++;
            yd_anchors_reset(ld); /* anchors are per document */
            break;
        case YAML_DOCUMENT_END_EVENT:
            st = yd_doc_end(ld, ld->doc_number, ld->root_mark.line + 1, ld->root_mark.column + 1);
            break;
        case YAML_SCALAR_EVENT:
            st = yd_on_scalar(ld, &ev);
            break;
        case YAML_SEQUENCE_START_EVENT:
            st = yd_push(ld, &ev, 0);
            break;
        case YAML_MAPPING_START_EVENT:
            st = yd_push(ld, &ev, 1);
            break;
        case YAML_SEQUENCE_END_EVENT:
        case YAML_MAPPING_END_EVENT:
            st = yd_pop(ld);
            break;
        case YAML_ALIAS_EVENT:
            st = yd_on_alias(ld, &ev);
            break;
        case YAML_STREAM_END_EVENT:
            done = 1;
            break;
        default:
            break;
        }
        yaml_event_delete(&ev);
    }
out:
    if (have_parser)
        yaml_parser_delete(&parser);
    return st;
}

/* ---- JSON input ------------------------------------------------------------ */

static size_t yd_skip_space(const char *text, size_t len, size_t off)
{
    while (off < len &&
           (text[off] == ' ' || text[off] == '\t' || text[off] == '\n' || text[off] == '\r'))
        off++;
    return off;
}

/*
 * Limits and number normalization over a JSON value jansson built: the
 * same node and depth counting as the YAML reading, integral reals made
 * integers.  level is the collection level of v.
 */
static enum gg_status yd_json_check(struct yd_loader *ld, json_t *v, size_t level,
                                    const struct yd_cursor *at)
{
    enum gg_status st = GG_OK;

    if (ld->nodes >= ld->lim.max_nodes)
        return yd_fail_lc(ld, GG_ERR_TOOBIG, at->line, at->column,
                          "more than %zu values in this JSON document (the node limit)",
                          ld->lim.max_nodes);
    ld->nodes++;
    if (!json_is_object(v) && !json_is_array(v))
        return GG_OK;
    if (level > ld->lim.max_depth)
        return yd_fail_lc(ld, GG_ERR_TOOBIG, at->line, at->column,
                          "this JSON document nests deeper than %zu levels", ld->lim.max_depth);
    if (json_is_array(v)) {
        for (size_t i = 0; i < json_array_size(v) && st == GG_OK; i++) {
            json_t *c = json_array_get(v, i);
            st = yd_json_check(ld, c, level + 1, at);
            if (st == GG_OK && json_is_real(c) && yd_integral(json_real_value(c)) &&
                json_array_set_new(v, i, json_integer((json_int_t)json_real_value(c))))
                st = yd_nomem(ld);
        }
        return st;
    }
    for (void *it = json_object_iter(v); it && st == GG_OK; it = json_object_iter_next(v, it)) {
        json_t *c = json_object_iter_value(it);
        st = yd_json_check(ld, c, level + 1, at);
        if (st == GG_OK && json_is_real(c) && yd_integral(json_real_value(c)) &&
            json_object_iter_set_new(v, it, json_integer((json_int_t)json_real_value(c))))
            st = yd_nomem(ld);
    }
    return st;
}

/*
 * kubectl's YAMLOrJSONDecoder reads text starting with '{' as a stream of
 * JSON values; so do we (and for '[').  Whenever the first value fails, or
 * the text goes on with something that is not JSON (a `---`), *as_yaml is
 * set and the caller reads the whole text as YAML, whose messages point at
 * the exact spot.  Only a later value of a concatenated JSON stream, which
 * YAML cannot read at all, fails here.
 */
static enum gg_status yd_load_json(struct yd_loader *ld, const char *text, size_t len, int *as_yaml)
{
    enum gg_status st = GG_OK;
    struct gg_err *err = ld->err;
    struct yd_cursor cur;
    size_t off = yd_skip_space(text, len, yd_bom_len(text, len));
    json_t *v = NULL;

    *as_yaml = off == len || (text[off] != '{' && text[off] != '[');
    yd_cursor_init(&cur, text, len);
    while (!*as_yaml) {
        json_error_t je;

        off = yd_skip_space(text, len, off);
        if (off == len)
            break;
        if (text[off] != '{' && text[off] != '[') {
            *as_yaml = 1;
            break;
        }
        yd_cursor_advance(&cur, text, off);
        v = json_loadb(text + off, len - off, JSON_DISABLE_EOF_CHECK | JSON_REJECT_DUPLICATES, &je);
        /* Some allocation failures deep in jansson's parser leave no message at all. */
        if (!v && (json_error_code(&je) == json_error_out_of_memory || !je.text[0])) {
            st = yd_nomem(ld);
            goto out;
        }
        if (!v && ld->npos == 0) {
            *as_yaml = 1;
            break;
        }
        if (!v) {
            st = yd_fail_lc(ld, GG_ERR_PARSE, cur.line + (size_t)je.line - 1,
                            je.line == 1 ? cur.column + (size_t)je.column - 1 : (size_t)je.column,
                            "%s", je.text);
            goto out;
        }
        /* No message for the first value: the YAML reading will give a better one. */
        ld->err = ld->npos ? err : NULL;
        st = yd_json_check(ld, v, 1, &cur);
        ld->err = err;
        if (st == GG_ERR_NOMEM)
            st = yd_nomem(ld);
        if (st == GG_ERR_TOOBIG && ld->npos == 0) {
            st = GG_OK;
            *as_yaml = 1;
            break;
        }
        if (st == GG_OK) {
            ld->root = v;
            v = NULL;
            st = yd_doc_end(ld, ld->npos + 1, cur.line, cur.column);
        }
        if (st != GG_OK)
            goto out;
        off += je.position;
    }
    if (*as_yaml) {
        json_array_clear(ld->docs);
        ld->npos = 0;
        ld->nodes = 0;
    }
out:
    json_decref(v);
    return st;
}

/* ---- public API ------------------------------------------------------------ */

void yd_limits_init(struct yd_limits *limits)
{
    limits->max_bytes = YD_DEFAULT_MAX_BYTES;
    limits->max_depth = YD_DEFAULT_MAX_DEPTH;
    limits->max_nodes = YD_DEFAULT_MAX_NODES;
    limits->max_alias_nodes = YD_DEFAULT_MAX_ALIAS_NODES;
}

static void yd_loader_clear(struct yd_loader *ld)
{
    for (size_t i = 0; i < ld->nframes; i++) {
        json_decref(ld->frames[i].node);
        json_decref(ld->frames[i].merged);
        free(ld->frames[i].key);
    }
    free(ld->frames);
    if (ld->anchor_slots)
        yd_anchors_reset(ld);
    free(ld->anchors);
    json_decref(ld->anchor_slots);
    json_decref(ld->root);
    json_decref(ld->docs);
    free(ld->pos);
    if (ld->c_locale)
        freelocale(ld->c_locale);
}

enum gg_status yd_load_stream(const char *text, size_t len, const char *source_name,
                              const struct yd_limits *limits, struct yd_stream *out,
                              struct gg_err *err)
{
    struct yd_loader ld;
    enum gg_status st;
    int as_yaml = 1;

    memset(&ld, 0, sizeof(ld));
    ld.src = source_name ? source_name : "<input>";
    ld.err = err;
    yd_limits_init(&ld.lim);
    if (limits) {
        ld.lim.max_bytes = limits->max_bytes ? limits->max_bytes : ld.lim.max_bytes;
        ld.lim.max_depth = limits->max_depth ? limits->max_depth : ld.lim.max_depth;
        ld.lim.max_nodes = limits->max_nodes ? limits->max_nodes : ld.lim.max_nodes;
        ld.lim.max_alias_nodes =
            limits->max_alias_nodes ? limits->max_alias_nodes : ld.lim.max_alias_nodes;
    }
    if (!text)
        text = "";
    st = yd_check_text(&ld, text, len);
    if (st != GG_OK)
        goto out;
    ld.docs = json_array();
    ld.anchor_slots = json_object();
    if (!ld.docs || !ld.anchor_slots) {
        st = yd_nomem(&ld);
        goto out;
    }
    st = yd_load_json(&ld, text, len, &as_yaml);
    if (st == GG_OK && as_yaml)
        st = yd_load_yaml(&ld, text, len);
    if (st != GG_OK)
        goto out;
    out->docs = ld.docs;
    out->pos = ld.pos;
    out->count = ld.npos;
    ld.docs = NULL;
    ld.pos = NULL;
out:
    yd_loader_clear(&ld);
    return st;
}

void yd_stream_clear(struct yd_stream *s)
{
    if (!s)
        return;
    json_decref(s->docs);
    free(s->pos);
    memset(s, 0, sizeof(*s));
}

enum gg_status yd_load_all(const char *text, size_t len, const char *source_name,
                           const struct yd_limits *limits, json_t **docs, struct gg_err *err)
{
    struct yd_stream s;
    enum gg_status st = yd_load_stream(text, len, source_name, limits, &s, err);

    if (st != GG_OK)
        return st;
    *docs = s.docs;
    free(s.pos);
    return GG_OK;
}

enum gg_status yd_load_one(const char *text, size_t len, const char *source_name,
                           const struct yd_limits *limits, json_t **doc, struct gg_err *err)
{
    struct yd_stream s = {0};
    enum gg_status st = yd_load_stream(text, len, source_name, limits, &s, err);

    if (st != GG_OK)
        goto out;
    if (s.count > 1) {
        st = gg_fail(err, GG_ERR_PARSE,
                     "%s:%zu:%zu: expected one YAML document, found another one (document %zu)",
                     source_name ? source_name : "<input>", s.pos[1].line, s.pos[1].column,
                     s.pos[1].number);
        goto out;
    }
    *doc = s.count ? json_incref(json_array_get(s.docs, 0)) : json_null();
out:
    yd_stream_clear(&s);
    return st;
}
