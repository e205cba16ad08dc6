/*
 * cfgkeys.c - the message that refuses an unknown key, with the nearest known
 * one (cfgkeys.h).
 */
#include "engine/cfgkeys.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Names are compared on at most this many bytes. */
#define NAME_MAX_CMP 64

/* The same name spelled another way: case, '-' and '_' left out (nodeSelector, node-selector). */
static void fold(const char *s, char *out)
{
    size_t n = 0;
    for (; *s && n < NAME_MAX_CMP; s++)
        if (*s != '-' && *s != '_')
            out[n++] = (char)tolower((unsigned char)*s);
    out[n] = '\0';
}

/* The edit distance of a and b (their first NAME_MAX_CMP bytes). */
static size_t distance(const char *a, const char *b)
{
    size_t la = strnlen(a, NAME_MAX_CMP), lb = strnlen(b, NAME_MAX_CMP);
    size_t prev[NAME_MAX_CMP + 1], cur[NAME_MAX_CMP + 1];
    for (size_t j = 0; j <= lb; j++)
        prev[j] = j;
    for (size_t i = 1; i <= la; i++) {
        cur[0] = i;
        for (size_t j = 1; j <= lb; j++) {
            size_t best = prev[j - 1] + (a[i - 1] != b[j - 1]);
            if (prev[j] + 1 < best)
                best = prev[j] + 1;
            if (cur[j - 1] + 1 < best)
                best = cur[j - 1] + 1;
            cur[j] = best;
        }
        memcpy(prev, cur, (lb + 1) * sizeof(prev[0]));
    }
    return prev[lb];
}

const char *cfgkeys_nearest(const char *key, const char *const *known, size_t n)
{
    char fk[NAME_MAX_CMP + 1], fn[NAME_MAX_CMP + 1];
    fold(key, fk);
    const char *best = NULL;
    size_t best_d = 0;
    for (size_t i = 0; i < n; i++) {
        fold(known[i], fn);
        size_t d = strcmp(fk, fn) == 0 ? 0 : distance(key, known[i]);
        size_t near = strlen(known[i]) / 3 > 2 ? strlen(known[i]) / 3 : 2;
        if (d <= near && (!best || d < best_d)) {
            best = known[i];
            best_d = d;
        }
    }
    return best;
}

static int compare_names(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* "; did you mean <nearest>? (known: <known, sorted, each once>)" after the k bytes of out. */
static void append_known(char *out, size_t size, int k, const char *name, const char *const *known,
                         size_t n)
{
    const char *near = cfgkeys_nearest(name, known, n);
    if (near && k >= 0 && (size_t)k < size)
        k += snprintf(out + k, size - (size_t)k, "; did you mean %s?", near);
    if (k >= 0 && (size_t)k < size)
        k += snprintf(out + k, size - (size_t)k, " (known: ");
    const char **sorted = malloc((n + 1) * sizeof(*sorted));
    if (sorted) {
        memcpy(sorted, known, n * sizeof(*sorted));
        qsort(sorted, n, sizeof(*sorted), compare_names);
    }
    for (size_t i = 0, shown = 0; sorted && i < n && k >= 0 && (size_t)k < size; i++)
        if (i == 0 || strcmp(sorted[i - 1], sorted[i]) != 0)
            k += snprintf(out + k, size - (size_t)k, "%s%s", shown++ ? ", " : "", sorted[i]);
    if (k >= 0 && (size_t)k < size)
        snprintf(out + k, size - (size_t)k, ")");
    free(sorted);
}

void cfgkeys_unknown(char *out, size_t size, const char *path, const char *key,
                     const char *const *known, size_t n)
{
    int k = snprintf(out, size, "%s%.*s: unknown key", path, NAME_MAX_CMP, key);
    append_known(out, size, k, key, known, n);
}

void cfgkeys_unknown_name(char *out, size_t size, const char *path, const char *what,
                          const char *name, const char *const *known, size_t n)
{
    int k = snprintf(out, size, "%s: unknown %s \"%.*s\"", path, what, NAME_MAX_CMP, name);
    append_known(out, size, k, name, known, n);
}
