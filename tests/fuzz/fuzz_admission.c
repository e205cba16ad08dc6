/*
 * fuzz_admission.c - libFuzzer target for AdmissionReview decode and encode
 * (admission.c).
 *
 * The input is a request body.  When it decodes, the verdicts the server
 * can give (allowed, allowed with a patch, denied with a message taken from
 * the input) are encoded for both endpoints, and each answer must be JSON
 * that json_loads accepts, echo apiVersion and uid, and carry patch and
 * patchType together and only on an allowed mutating answer, the patch
 * being the base64 of JSON equal to the verdict's.  Everything
 * runs twice: on plain malloc (so ASan sees every byte) and inside a
 * request arena, as review.c runs it.  Short inputs also go through
 * duration_parse_ms.  A broken invariant aborts.
 */
#include "codec/admission.h"
#include "util/duration.h"
#include "util/arena.h"
#include "kube/kubeclient.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void check(int ok, const char *what)
{
    if (!ok) {
        fprintf(stderr, "fuzz_admission: %s\n", what);
        abort();
    }
}

static void check_answer(const struct adm_request *req, const struct adm_verdict *v,
                         enum adm_endpoint ep)
{
    char *out = NULL;
    size_t len = 0;
    if (adm_encode(req, v, ep, &out, &len, NULL) != GG_OK)
        return; /* only out of memory, which the fuzzer does not simulate */
    check(strlen(out) == len, "encoded length differs from the text");
    json_error_t jerr;
    json_t *doc = json_loads(out, 0, &jerr);
    check(doc != NULL, "the answer is not JSON");
    json_t *resp = json_object_get(doc, "response");
    check(json_is_object(resp), "the answer has no response object");
    const char *uid = json_string_value(json_object_get(resp, "uid"));
    check(uid && strcmp(uid, req->uid) == 0, "the answer does not echo the uid");
    const char *api = json_string_value(json_object_get(doc, "apiVersion"));
    check(api && strcmp(api, req->api_version) == 0, "the answer does not echo apiVersion");
    check(json_is_boolean(json_object_get(resp, "allowed")), "allowed is not a boolean");
    int has_patch = json_object_get(resp, "patch") != NULL;
    check(has_patch == (json_object_get(resp, "patchType") != NULL),
          "patch and patchType not together");
    check(!has_patch || (ep == ADM_MUTATING && v->allowed), "a patch where none may be");
    if (has_patch) {
        size_t n = 0;
        unsigned char *text =
            kc_base64_decode(json_string_value(json_object_get(resp, "patch")), &n);
        check(text != NULL, "the patch is not base64");
        json_t *back = json_loadb((const char *)text, n, 0, &jerr);
        check(back && json_equal(back, v->patch), "the patch does not decode to the one given");
        json_decref(back);
        free(text);
    }
    check(v->allowed || json_is_object(json_object_get(resp, "status")), "a denial has no status");
    json_decref(doc);
    free(out);
}

static void run(const uint8_t *data, size_t size)
{
    struct adm_request req;
    if (adm_decode((const char *)data, size, &req, NULL) != GG_OK)
        return;
    check(req.doc.root && req.uid && *req.uid && req.api_version, "decoded request lacks fields");
    check(req.kind && req.group && req.namespace && req.name && req.sub_resource,
          "decoded request has a NULL string");
    check(strcmp(adm_operation_name(req.operation), "") != 0, "operation has no name");

    /* A patch that touches the object, and one built from the input itself. */
    json_t *patch = json_pack("[{s:s,s:s,s:s}]", "op", "add", "path", "/metadata/labels/fuzz",
                              "value", req.uid);
    json_t *warnings = json_pack("[s,s]", req.namespace, req.name);
    json_t *audit = json_pack("{s:s}", "gpuguard.io/kind", req.kind);
    if (req.object)
        json_array_append_new(patch, json_pack("{s:s,s:s,s:o}", "op", "replace", "path", "/spec",
                                               "value", jf_to_json(req.object)));
    const struct adm_verdict verdicts[] = {
        {.allowed = true},
        {.allowed = true, .patch = patch, .warnings = warnings, .audit = audit},
        {.allowed = false, .code = 422, .message = req.name, .reason = req.kind},
        {.allowed = false, .message = req.uid, .patch = patch},
    };
    for (size_t i = 0; i < sizeof(verdicts) / sizeof(verdicts[0]); i++) {
        check_answer(&req, &verdicts[i], ADM_MUTATING);
        check_answer(&req, &verdicts[i], ADM_VALIDATING);
    }
    json_decref(patch);
    json_decref(warnings);
    json_decref(audit);
    adm_request_clear(&req);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static int installed;
    if (!installed) {
        arena_install();
        installed = 1;
    }
    run(data, size);
    arena_begin();
    run(data, size);
    arena_end();

    if (size < 64) {
        char text[64];
        memcpy(text, data, size);
        text[size] = '\0';
        int64_t ms = -1;
        if (duration_parse_ms(text, &ms) == GG_OK)
            check(ms >= 0, "a negative timeout");
    }
    return 0;
}
