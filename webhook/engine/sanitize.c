/*
 * sanitize.c - policy text made acceptable to the API server: warnings as it
 * keeps them, reports cut to a length, and audit annotation keys it accepts.
 */
#include "engine/sanitize.h"
#include "util/gpuguard.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* One warning: control characters become spaces, at most max characters. */
static char *clean_warning(const char *in, size_t max)
{
    size_t n = strlen(in), chars = 0, used = 0;
    char *out = malloc(n + 4);
    if (!out)
        return NULL;
    for (size_t i = 0; i < n;) {
        unsigned char c = (unsigned char)in[i];
        size_t len = gg_utf8_len(c);
        if (chars == max - 1 && i + len < n) {
            memcpy(out + used, "\xe2\x80\xa6", 3); /* an ellipsis */
            used += 3;
            break;
        }
        if (c < 0x20 || c == 0x7f) {
            out[used++] = ' ';
            i++;
        } else {
            memcpy(out + used, in + i, len);
            used += len;
            i += len;
        }
        chars++;
    }
    out[used] = '\0';
    return out;
}

json_t *sanitize_warnings(const json_t *warnings, size_t left_out)
{
    json_t *out = json_array();
    size_t total = 0, i, dropped = left_out;
    json_t *item;
    json_array_foreach(warnings, i, item)
    {
        char *w = clean_warning(json_string_value(item), SANITIZE_WARNING_MAX);
        json_t *s = w && *w ? json_string(w) : NULL;
        free(w);
        if (!s)
            continue;
        bool dup = false;
        size_t j;
        json_t *seen;
        json_array_foreach(out, j, seen) dup = dup || json_equal(seen, s);
        if (dup) {
            json_decref(s);
        } else if (total + json_string_length(s) > SANITIZE_WARNINGS_TOTAL - 64) {
            json_decref(s);
            dropped++;
        } else {
            total += json_string_length(s);
            json_array_append_new(out, s);
        }
    }
    if (dropped) {
        char note[96];
        snprintf(note, sizeof(note), "gpuguard: %zu more warnings left out", dropped);
        json_array_append_new(out, json_string(note));
    }
    return out;
}

size_t sanitize_prefix(const char *s, size_t len, size_t max_bytes, size_t max_chars)
{
    size_t at = 0;
    for (size_t chars = 0; at < len && chars < max_chars; chars++) {
        size_t n = gg_utf8_len((unsigned char)s[at]);
        if (n > len - at || at + n > max_bytes)
            break;
        at += n;
    }
    return at;
}

char *sanitize_cut(const char *s, size_t len, size_t max, size_t *out_len)
{
    size_t keep = len <= max ? len : sanitize_prefix(s, len, max, SIZE_MAX);
    char mark[64] = "";
    if (keep < len)
        snprintf(mark, sizeof(mark), SANITIZE_CUT_MARK, len - keep);
    size_t n = strlen(mark);
    char *out = malloc(keep + n + 1);
    if (!out)
        return NULL;
    memcpy(out, s, keep);
    memcpy(out + keep, mark, n + 1);
    *out_len = keep + n;
    return out;
}

static bool key_char(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
           c == '_' || c == '.';
}

static bool key_edge(char c)
{
    return key_char(c) && c != '-' && c != '_' && c != '.';
}

void sanitize_audit_key(const char *in, char *out, size_t size)
{
    size_t n = 0, max = size - 1 < 63 ? size - 1 : 63;
    for (const char *c = in; *c && n < max; c++)
        out[n++] = key_char(*c) ? *c : '-';
    out[n] = '\0';
    size_t start = 0;
    while (start < n && !key_edge(out[start]))
        start++;
    while (n > start && !key_edge(out[n - 1]))
        n--;
    memmove(out, out + start, n - start);
    out[n - start] = '\0';
    if (!out[0])
        snprintf(out, size, "annotation");
}
