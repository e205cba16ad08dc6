/*
 * manifest_emit.c - edited manifests written back as YAML that kubectl
 * reads as the same documents (mf_emit_yaml in manifest.h).
 *
 * Pure: libc, libyaml and jansson only; no I/O, no globals.
 */
#include "codec/manifest.h"

#include "codec/jsonpatch.h"
#include "util/buf.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <yaml.h>

#define MF_MAX_EMIT_DEPTH (MF_MAX_DEPTH + JP_MAX_DEPTH)
#define MF_MAX_EMIT_BYTES ((size_t)1 << 30)

struct emit {
    yaml_emitter_t em;
    struct buf out;
    struct gg_err *err;
    enum gg_status st;
};

static int emit_write(void *data, unsigned char *buffer, size_t size)
{
    struct emit *x = data;
    if (buf_append(&x->out, buffer, size) != GG_OK) {
        x->st = GG_ERR_TOOBIG;
        return 0;
    }
    return 1;
}

/* Would go-yaml v2 read s, written plain, as this same string?  Conservative. */
static bool plain_safe(const char *s, size_t n)
{
    static const char *const words[] = {"y",  "n",   "yes",  "no", "true", "false",
                                        "on", "off", "null", "~",  "nan",  "inf"};
    if (n == 0 || n > 4096)
        return false;
    unsigned char first = (unsigned char)s[0];
    if (!((first >= 'a' && first <= 'z') || (first >= 'A' && first <= 'Z') || first == '/' ||
          first == '_'))
        return false;
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)s[i];
        bool alnum =
            (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9');
        if (alnum || (ch && strchr("._/=+@-", ch)))
            continue;
        if (ch == ':' && i + 1 < n && s[i + 1] != ' ')
            continue;
        if (ch == ' ' && i > 0 && i + 1 < n && s[i + 1] != ' ' && s[i - 1] != ':')
            continue;
        return false;
    }
    for (size_t i = 0; i < sizeof(words) / sizeof(words[0]); i++)
        if (strlen(words[i]) == n && strncasecmp(words[i], s, n) == 0)
            return false;
    return true;
}

static int emit_event(struct emit *x, yaml_event_t *ev)
{
    if (yaml_emitter_emit(&x->em, ev))
        return 0;
    if (x->st == GG_OK)
        x->st = gg_fail(x->err, GG_ERR_INVALID, "YAML writer: %s",
                        x->em.problem ? x->em.problem : "failed");
    else
        gg_fail(x->err, x->st, "the YAML output is larger than %zu bytes", MF_MAX_EMIT_BYTES);
    return -1;
}

static int emit_scalar(struct emit *x, const char *s, size_t n, bool is_string)
{
    yaml_event_t ev;
    yaml_scalar_style_t style = YAML_PLAIN_SCALAR_STYLE;
    if (n > INT_MAX) {
        x->st = gg_fail(x->err, GG_ERR_TOOBIG, "a string of %zu bytes is too long to write", n);
        return -1;
    }
    if (is_string && !plain_safe(s, n))
        style = memchr(s, '\n', n) ? YAML_LITERAL_SCALAR_STYLE : YAML_DOUBLE_QUOTED_SCALAR_STYLE;
    if (!yaml_scalar_event_initialize(&ev, NULL, NULL, (const yaml_char_t *)s, (int)n, 1, 1,
                                      style)) {
        x->st = gg_fail(x->err, GG_ERR_NOMEM, "out of memory");
        return -1;
    }
    return emit_event(x, &ev);
}

/* The shortest decimal that reads back as d, always with a '.' or an exponent. */
static void format_real(double d, char *out, size_t size)
{
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(out, size, "%.*g", prec, d);
        if (strtod(out, NULL) == d)
            break;
    }
    if (!strpbrk(out, ".eE")) {
        size_t n = strlen(out);
        snprintf(out + n, size - n, ".0");
    }
}

static int emit_value(struct emit *x, const json_t *v, size_t depth);

/* An object or an array, its items in order: block style, flow style when empty. */
static int emit_container(struct emit *x, const json_t *v, size_t depth)
{
    yaml_event_t ev;
    bool map = json_is_object(v);
    size_t n = map ? json_object_size(v) : json_array_size(v);
    if (map)
        yaml_mapping_start_event_initialize(&ev, NULL, NULL, 1,
                                            n ? YAML_BLOCK_MAPPING_STYLE : YAML_FLOW_MAPPING_STYLE);
    else
        yaml_sequence_start_event_initialize(
            &ev, NULL, NULL, 1, n ? YAML_BLOCK_SEQUENCE_STYLE : YAML_FLOW_SEQUENCE_STYLE);
    if (emit_event(x, &ev))
        return -1;
    const char *key;
    json_t *item;
    if (map) {
        json_object_foreach((json_t *)v, key, item)
        {
            if (emit_scalar(x, key, strlen(key), true) || emit_value(x, item, depth + 1))
                return -1;
        }
        yaml_mapping_end_event_initialize(&ev);
    } else {
        for (size_t i = 0; i < n; i++)
            if (emit_value(x, json_array_get(v, i), depth + 1))
                return -1;
        yaml_sequence_end_event_initialize(&ev);
    }
    return emit_event(x, &ev);
}

static int emit_value(struct emit *x, const json_t *v, size_t depth)
{
    char num[64];
    if (depth > MF_MAX_EMIT_DEPTH) {
        x->st = gg_fail(x->err, GG_ERR_TOOBIG, "nesting deeper than %d levels", MF_MAX_EMIT_DEPTH);
        return -1;
    }
    switch (json_typeof(v)) {
    case JSON_OBJECT:
    case JSON_ARRAY:
        return emit_container(x, v, depth);
    case JSON_STRING:
        return emit_scalar(x, json_string_value(v), json_string_length(v), true);
    case JSON_INTEGER:
        snprintf(num, sizeof(num), "%" JSON_INTEGER_FORMAT, json_integer_value(v));
        return emit_scalar(x, num, strlen(num), false);
    case JSON_REAL:
        format_real(json_real_value(v), num, sizeof(num));
        return emit_scalar(x, num, strlen(num), false);
    case JSON_TRUE:
        return emit_scalar(x, "true", 4, false);
    case JSON_FALSE:
        return emit_scalar(x, "false", 5, false);
    default:
        return emit_scalar(x, "null", 4, false);
    }
}

enum gg_status mf_emit_yaml(const json_t *docs, char **out, size_t *len, struct gg_err *err)
{
    struct emit x = {.err = err, .st = GG_OK};
    yaml_event_t ev;
    size_t i;
    json_t *doc;
    if (!json_is_array(docs))
        return gg_fail(err, GG_ERR_INVALID, "the documents must be an array");
    buf_init(&x.out, MF_MAX_EMIT_BYTES);
    if (!yaml_emitter_initialize(&x.em)) {
        buf_clear(&x.out);
        return gg_fail(err, GG_ERR_NOMEM, "out of memory");
    }
    yaml_emitter_set_output(&x.em, emit_write, &x);
    yaml_emitter_set_unicode(&x.em, 1);
    yaml_emitter_set_width(&x.em, -1);
    yaml_emitter_set_indent(&x.em, 2);
    yaml_stream_start_event_initialize(&ev, YAML_UTF8_ENCODING);
    if (emit_event(&x, &ev))
        goto out;
    json_array_foreach(docs, i, doc)
    {
        yaml_document_start_event_initialize(&ev, NULL, NULL, NULL, i == 0);
        if (emit_event(&x, &ev) || emit_value(&x, doc, 1))
            goto out;
        yaml_document_end_event_initialize(&ev, 1);
        if (emit_event(&x, &ev))
            goto out;
    }
    yaml_stream_end_event_initialize(&ev);
    if (emit_event(&x, &ev) == 0 && !yaml_emitter_flush(&x.em))
        emit_event(&x, &ev);
out:
    yaml_emitter_delete(&x.em);
    if (x.st != GG_OK) {
        buf_clear(&x.out);
        return x.st;
    }
    size_t n = x.out.len;
    char *text = buf_steal(&x.out, &n);
    if (!text)
        text = strdup("");
    if (!text)
        return gg_fail(err, GG_ERR_NOMEM, "out of memory");
    *out = text;
    *len = n;
    return GG_OK;
}
