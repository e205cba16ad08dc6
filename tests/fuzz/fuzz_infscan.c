/*
 * fuzz_infscan.c - libFuzzer target for the informer's pod reader (kube/infscan.c): the input
 * is the JSON text of a pod, as a list item or a watch event would hold it.
 *
 * A pod it reads has a charge spec that loads as JSON (unless one of the numbers it copied is
 * out of range, which the charger then counts as a whole GPU), and the pod it makes of it,
 * written out and read again, is the same pod: the same strings and a charge spec with the
 * same value.  That is what lets admission (a pod's nodes written out) and the informer (the
 * API server's text) share the charges remembered under a spec.  A broken invariant aborts.
 */
#include "kube/infscan.h"
#include "util/jsonfast.h"
#include "util/jsonwrite.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void check(int ok, const char *what)
{
    if (!ok) {
        fprintf(stderr, "fuzz_infscan: %s\n", what);
        abort();
    }
}

/* The charge spec's document; false when a number in it is out of range. */
static bool spec_loads(const struct inf_pod *p, struct jf_doc *doc)
{
    struct jf_error err;
    size_t deepest;
    if (jf_parse(p->spec, p->spec_len, 0, doc, &deepest, &err) == 0)
        return true;
    check(strstr(err.text, "too big") || strstr(err.text, "overflow") || strstr(err.text, "range"),
          err.text);
    return false;
}

static void same_pods(const struct inf_pod *a, const struct inf_pod *b)
{
    const char *const fa[] = {a->uid,  a->ns,    a->name, a->generate_name, a->cls,
                              a->pool, a->phase, a->node, a->owner_kind,    a->owner_name};
    const char *const fb[] = {b->uid,  b->ns,    b->name, b->generate_name, b->cls,
                              b->pool, b->phase, b->node, b->owner_kind,    b->owner_name};
    for (size_t i = 0; i < sizeof(fa) / sizeof(*fa); i++)
        check(strcmp(fa[i], fb[i]) == 0, "a string of the pod changed on the way round");
    check(a->claims == b->claims, "the claims changed on the way round");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct inf_pod p, again;
    struct gg_err err = {{0}};
    struct jf_doc spec, spec_again;
    inf_pod_init(&p);
    inf_pod_init(&again);
    if (inf_pod_of_text((const char *)data, size, &p, &err) && spec_loads(&p, &spec)) {
        json_t *obj = inf_pod_json(&p);
        check(obj != NULL, "a pod whose spec loads makes no object");
        check(inf_pod_of_json(obj, &again, &err), "the pod's object does not read as a pod");
        same_pods(&p, &again);
        check(spec_loads(&again, &spec_again), "the spec written again does not load");
        check(jf_same(spec.root, spec_again.root), "the charge spec changed on the way round");
        jf_doc_free(&spec_again);
        jf_doc_free(&spec);
        json_decref(obj);
    }
    inf_pod_free(&again);
    inf_pod_free(&p);
    return 0;
}
