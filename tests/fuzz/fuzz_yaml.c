/*
 * fuzz_yaml.c - libFuzzer target for the YAML (and JSON) stream reader
 * (yamldoc.c).
 *
 * The input is a manifest text, read with small limits so that alias bombs
 * and deep nesting hit a bound quickly.  It must never crash or hang, and
 * what it returns must respect the limits: no more values than max_nodes,
 * no deeper than max_depth, one position per document, document numbers
 * increasing.  yd_load_one runs on the same text.  A broken invariant
 * aborts.
 */
#include "codec/yamldoc.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

static void check(int ok, const char *what)
{
    if (!ok) {
        fprintf(stderr, "fuzz_yaml: %s\n", what);
        abort();
    }
}

/* Values in v, and its nesting (a scalar is 0, a collection 1 + its deepest child). */
static size_t count_nodes(const json_t *v, size_t *depth)
{
    size_t n = 1, d = 0, sub;
    const char *key;
    json_t *item;
    *depth = 0;
    if (json_is_object(v)) {
        json_object_foreach((json_t *)v, key, item)
        {
            n += count_nodes(item, &sub);
            d = sub > d ? sub : d;
        }
        *depth = d + 1;
    } else if (json_is_array(v)) {
        for (size_t i = 0; i < json_array_size(v); i++) {
            n += count_nodes(json_array_get(v, i), &sub);
            d = sub > d ? sub : d;
        }
        *depth = d + 1;
    }
    return n;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const struct yd_limits limits = {
        .max_bytes = 64 * 1024, .max_depth = 32, .max_nodes = 20000, .max_alias_nodes = 2000};
    const char *text = (const char *)data;
    struct gg_err err = {{0}};
    struct yd_stream s;
    if (yd_load_stream(text, size, "fuzz.yaml", &limits, &s, &err) == GG_OK) {
        check(json_is_array(s.docs) && json_array_size(s.docs) == s.count,
              "docs and count disagree");
        size_t nodes = 0, prev = 0;
        for (size_t i = 0; i < s.count; i++) {
            size_t depth = 0;
            nodes += count_nodes(json_array_get(s.docs, i), &depth);
            check(depth <= limits.max_depth, "a document deeper than max_depth");
            check(s.pos[i].number > prev, "document numbers do not increase");
            check(s.pos[i].line >= 1 && s.pos[i].column >= 1, "a position before line 1");
            prev = s.pos[i].number;
        }
        check(nodes <= limits.max_nodes, "more values than max_nodes");
        yd_stream_clear(&s);
    } else {
        check(err.msg[0] != '\0', "a failure without a message");
    }
    json_t *doc = NULL;
    if (yd_load_one(text, size, "fuzz.yaml", &limits, &doc, NULL) == GG_OK)
        check(doc != NULL, "yd_load_one succeeded without a document");
    json_decref(doc);
    return 0;
}
