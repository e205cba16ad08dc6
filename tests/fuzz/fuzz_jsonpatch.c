/*
 * fuzz_jsonpatch.c - libFuzzer target for JSON Patch diff and apply
 * (jsonpatch.c).
 *
 * The input is up to three concatenated JSON values A B C.  When A and B
 * are objects, jp_diff(A, B) applied to A must give B exactly: json_equal,
 * and a second diff of the result against B must be empty (that one also
 * tells 1 from 1.0 and 0.0 from -0.0).  The diff applied in place must give
 * the same.  When B or C is an array it is applied as an arbitrary patch to
 * A (and C to B): jp_apply_copy and jp_apply must not crash, must agree,
 * and a failed jp_apply must leave the document as it was.  A broken
 * invariant aborts.
 */
#include "codec/jsonpatch.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

static void check(int ok, const char *what)
{
    if (!ok) {
        fprintf(stderr, "fuzz_jsonpatch: %s\n", what);
        abort();
    }
}

/* A strict equality: json_equal and an empty strict diff, for objects. */
static int same(const json_t *a, const json_t *b)
{
    if (!json_equal(a, b))
        return 0;
    if (!json_is_object(a) || !json_is_object(b))
        return 1;
    json_t *patch = NULL;
    enum gg_status st = jp_diff(a, b, &patch, NULL);
    int empty = st != GG_OK || json_array_size(patch) == 0;
    json_decref(patch);
    return empty;
}

static void round_trip(const json_t *a, const json_t *b)
{
    json_t *patch = NULL, *out = NULL;
    enum gg_status st = jp_diff(a, b, &patch, NULL);
    if (st != GG_OK) {
        /* Only the documented failures: too many ops, a key with a NUL byte. */
        check(st == GG_ERR_TOOBIG || st == GG_ERR_INVALID, "jp_diff failed unexpectedly");
        return;
    }
    check(json_is_array(patch) && json_array_size(patch) <= JP_MAX_OPS, "bad patch from jp_diff");
    check(json_array_size(patch) > 0 || json_equal(a, b), "an empty patch between different docs");
    st = jp_apply_copy(a, patch, &out, NULL);
    check(st == GG_OK, "the diff does not apply to its original");
    check(json_equal(out, b), "applying the diff does not reproduce the target");
    check(same(out, b), "applying the diff reproduces the target only loosely");
    json_t *doc = json_deep_copy(a);
    st = jp_apply(doc, patch, NULL);
    check(st == GG_OK && json_equal(doc, b), "the diff applied in place differs");
    json_decref(doc);
    json_decref(out);
    json_decref(patch);
}

static void apply_any(const json_t *doc, const json_t *patch)
{
    json_t *out = NULL;
    enum gg_status copy_st = jp_apply_copy(doc, patch, &out, NULL);
    check(copy_st == GG_OK || out == NULL, "jp_apply_copy wrote *out on failure");
    if (!json_is_object(doc) && !json_is_array(doc)) {
        json_decref(out);
        return; /* jp_apply changes containers in place only */
    }
    json_t *in_place = json_deep_copy(doc);
    enum gg_status st = jp_apply(in_place, patch, NULL);
    if (st == GG_OK)
        check(copy_st == GG_OK && json_equal(in_place, out), "jp_apply and jp_apply_copy differ");
    else
        check(st == GG_ERR_NOMEM || json_equal(in_place, doc), "a failed jp_apply changed the doc");
    if (copy_st != GG_OK)
        check(st != GG_OK, "jp_apply succeeded where jp_apply_copy failed");
    json_decref(in_place);
    json_decref(out);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    json_t *v[3] = {NULL, NULL, NULL};
    size_t n = 0, off = 0;
    while (n < 3 && off < size) {
        json_error_t jerr;
        v[n] = json_loadb((const char *)data + off, size - off,
                          JSON_DECODE_ANY | JSON_DISABLE_EOF_CHECK | JSON_ALLOW_NUL, &jerr);
        if (!v[n] || jerr.position <= 0)
            break;
        off += (size_t)jerr.position;
        n++;
    }
    if (n >= 2 && json_is_object(v[0]) && json_is_object(v[1]))
        round_trip(v[0], v[1]);
    if (n >= 2 && json_is_array(v[1]))
        apply_any(v[0], v[1]);
    if (n >= 3 && json_is_array(v[2])) {
        apply_any(v[0], v[2]);
        apply_any(v[1], v[2]);
    }
    for (size_t i = 0; i < 3; i++)
        json_decref(v[i]);
    return 0;
}
