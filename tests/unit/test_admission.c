/*
 * test_admission.c - AdmissionReview decode/encode, base64 and ?timeout=.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "codec/admission.h"
#include "util/buf.h"

#include <stdlib.h>
#include <string.h>

#define REVIEW(version, request)                                                                   \
    "{\"apiVersion\":\"admission.k8s.io/" version                                                  \
    "\",\"kind\":\"AdmissionReview\",\"request\":" request "}\n"

static const char pod_create[] = REVIEW(
    "v1", "{\"uid\":\"705ab4f5-6393-11e8-b7cc-42010a800002\","
          "\"kind\":{\"group\":\"\",\"version\":\"v1\",\"kind\":\"Pod\"},"
          "\"resource\":{\"group\":\"\",\"version\":\"v1\",\"resource\":\"pods\"},"
          "\"requestKind\":{\"group\":\"\",\"version\":\"v1\",\"kind\":\"Pod\"},"
          "\"namespace\":\"team-a\",\"operation\":\"CREATE\","
          "\"userInfo\":{\"username\":\"alice\",\"groups\":[\"dev\"],\"extra\":{}},"
          "\"object\":{\"apiVersion\":\"v1\",\"kind\":\"Pod\",\"metadata\":{\"generateName\":"
          "\"web-\",\"labels\":{\"a\":\"\\u003cb\\u003e\"}}},"
          "\"oldObject\":null,\"dryRun\":false,"
          "\"options\":{\"kind\":\"CreateOptions\",\"apiVersion\":\"meta.k8s.io/v1\"}}");

static void decode_ok(const char *body, struct adm_request *req)
{
    struct gg_err err = {{0}};
    enum gg_status st = adm_decode(body, strlen(body), req, &err);
    if (st != GG_OK)
        fail_msg("decode failed: %s", err.msg);
}

static char *encode(const struct adm_request *req, const struct adm_verdict *v,
                    enum adm_endpoint ep)
{
    char *out = NULL;
    size_t len = 0;
    assert_int_equal(adm_encode(req, v, ep, &out, &len, NULL), GG_OK);
    assert_int_equal(strlen(out), len);
    return out;
}

static void test_decode_pod_create(void **state)
{
    (void)state;
    struct adm_request req;
    decode_ok(pod_create, &req);
    assert_int_equal(req.version, ADM_V1);
    assert_string_equal(req.uid, "705ab4f5-6393-11e8-b7cc-42010a800002");
    assert_int_equal(req.operation, ADM_CREATE);
    assert_string_equal(req.kind, "Pod");
    assert_string_equal(req.group, "");
    assert_string_equal(req.namespace, "team-a");
    assert_string_equal(req.name, "");
    assert_string_equal(req.sub_resource, "");
    assert_false(req.dry_run);
    assert_non_null(req.object);
    assert_null(req.old_object);
    assert_non_null(req.options);
    assert_non_null(req.user_info);
    /* Go's \u003c escapes decode to the characters. */
    const struct jf_node *labels = jf_get_str(jf_get_str(req.object, "metadata"), "labels");
    assert_string_equal(jf_string(jf_get_str(labels, "a")), "<b>");
    adm_request_clear(&req);
}

/* Every operation, with the nulls the API server sends for it. */
static void test_decode_operations(void **state)
{
    (void)state;
    static const struct {
        const char *body;
        enum adm_operation op;
        int has_object, has_old, has_options;
    } cases[] = {
        {REVIEW("v1", "{\"uid\":\"u\",\"operation\":\"CREATE\",\"object\":{},\"oldObject\":null,"
                      "\"options\":null}"),
         ADM_CREATE, 1, 0, 0},
        {REVIEW("v1", "{\"uid\":\"u\",\"operation\":\"UPDATE\",\"object\":{},\"oldObject\":{},"
                      "\"options\":{}}"),
         ADM_UPDATE, 1, 1, 1},
        {REVIEW("v1", "{\"uid\":\"u\",\"operation\":\"DELETE\",\"object\":null,\"oldObject\":{},"
                      "\"options\":{}}"),
         ADM_DELETE, 0, 1, 1},
        {REVIEW("v1beta1", "{\"uid\":\"u\",\"operation\":\"CONNECT\",\"subResource\":\"attach\","
                           "\"object\":{\"kind\":\"PodAttachOptions\"},\"oldObject\":null,"
                           "\"options\":null}"),
         ADM_CONNECT, 1, 0, 0},
        /* Absent members are read as null. */
        {REVIEW("v1", "{\"uid\":\"u\",\"operation\":\"DELETE\"}"), ADM_DELETE, 0, 0, 0},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct adm_request req;
        decode_ok(cases[i].body, &req);
        assert_int_equal(req.operation, cases[i].op);
        assert_int_equal(req.object != NULL, cases[i].has_object);
        assert_int_equal(req.old_object != NULL, cases[i].has_old);
        assert_int_equal(req.options != NULL, cases[i].has_options);
        adm_request_clear(&req);
    }
}

static void test_decode_dry_run_and_subresource(void **state)
{
    (void)state;
    struct adm_request req;
    decode_ok(REVIEW("v1", "{\"uid\":\"u\",\"operation\":\"UPDATE\",\"dryRun\":true,"
                           "\"subResource\":\"status\",\"name\":\"p\",\"object\":{}}"),
              &req);
    assert_true(req.dry_run);
    assert_string_equal(req.sub_resource, "status");
    assert_string_equal(req.name, "p");
    adm_request_clear(&req);
}

/* Whether the object is a workload's template is gpuguard's to say, never the review's. */
static void test_decode_never_takes_the_template_path(void **state)
{
    (void)state;
    struct adm_request req;
    decode_ok(REVIEW("v1", "{\"uid\":\"u\",\"operation\":\"CREATE\",\"template\":"
                           "\"spec.template\",\"templatePath\":\"spec.template\",\"object\":{}}"),
              &req);
    assert_null(req.template_path);
    adm_request_clear(&req);
}

static void test_decode_rejects(void **state)
{
    (void)state;
    static const struct {
        const char *body;
        enum gg_status st;
        const char *msg;
    } cases[] = {
        {"", GG_ERR_PARSE, "malformed JSON at line 1"},
        {"{\"apiVersion\":", GG_ERR_PARSE, "malformed JSON"},
        {"[1,2]", GG_ERR_INVALID, "the body is not a JSON object"},
        {"{}", GG_ERR_INVALID, "apiVersion is missing"},
        {"{\"apiVersion\":\"admission.k8s.io/v2\",\"kind\":\"AdmissionReview\"}", GG_ERR_INVALID,
         "unsupported apiVersion \"admission.k8s.io/v2\""},
        {"{\"apiVersion\":\"admission.k8s.io/v1\",\"kind\":\"Pod\"}", GG_ERR_INVALID,
         "kind is \"Pod\""},
        {"{\"apiVersion\":\"admission.k8s.io/v1\",\"kind\":\"AdmissionReview\"}", GG_ERR_INVALID,
         "request is missing"},
        {REVIEW("v1", "[]"), GG_ERR_INVALID, "request is not an object"},
        {REVIEW("v1", "{\"operation\":\"CREATE\"}"), GG_ERR_INVALID, "request.uid"},
        {REVIEW("v1", "{\"uid\":\"\",\"operation\":\"CREATE\"}"), GG_ERR_INVALID, "request.uid"},
        {REVIEW("v1", "{\"uid\":\"u\",\"operation\":\"PATCH\"}"), GG_ERR_INVALID,
         "request.operation must be CREATE, UPDATE, DELETE or CONNECT, got \"PATCH\""},
        {REVIEW("v1", "{\"uid\":\"u\",\"operation\":\"CREATE\",\"object\":[]}"), GG_ERR_INVALID,
         "request.object must be an object or null"},
        {REVIEW("v1", "{\"uid\":\"u\",\"operation\":\"CREATE\",\"oldObject\":3}"), GG_ERR_INVALID,
         "request.oldObject must be an object or null"},
        {REVIEW("v1", "{\"uid\":\"u\",\"operation\":\"CREATE\",\"namespace\":7}"), GG_ERR_INVALID,
         "request.namespace must be a string"},
        {REVIEW("v1", "{\"uid\":\"u\",\"operation\":\"CREATE\",\"dryRun\":\"yes\"}"),
         GG_ERR_INVALID, "request.dryRun must be a boolean"},
        {REVIEW("v1", "{\"uid\":\"u\",\"operation\":\"CREATE\",\"kind\":\"Pod\"}"), GG_ERR_INVALID,
         "request.kind must be an object"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct adm_request req;
        struct gg_err err = {{0}};
        enum gg_status st = adm_decode(cases[i].body, strlen(cases[i].body), &req, &err);
        if (st != cases[i].st || !strstr(err.msg, cases[i].msg))
            fail_msg("case %zu: status %d, message \"%s\", want %d with \"%s\"", i, st, err.msg,
                     cases[i].st, cases[i].msg);
        assert_null(req.doc.root);
        assert_null(req.doc.chunks);
        assert_null(req.doc.text);
    }
}

static void test_decode_depth_bounded(void **state)
{
    (void)state;
    size_t depth = 5000;
    char *body = malloc(depth * 2 + 1);
    memset(body, '[', depth);
    memset(body + depth, ']', depth);
    body[depth * 2] = '\0';
    struct adm_request req;
    struct gg_err err = {{0}};
    assert_int_equal(adm_decode(body, depth * 2, &req, &err), GG_ERR_PARSE);
    assert_non_null(strstr(err.msg, "depth"));
    free(body);
}

/* Echo apiVersion, kind and uid, in the version received. */
static void test_encode_allow_round_trip(void **state)
{
    (void)state;
    static const char *const bodies[] = {
        REVIEW("v1", "{\"uid\":\"u-1\",\"operation\":\"CREATE\",\"object\":{}}"),
        REVIEW("v1beta1", "{\"uid\":\"u-2\",\"operation\":\"CREATE\",\"object\":{}}"),
    };
    static const char *const want[] = {
        "{\"apiVersion\":\"admission.k8s.io/v1\",\"kind\":\"AdmissionReview\","
        "\"response\":{\"uid\":\"u-1\",\"allowed\":true}}",
        "{\"apiVersion\":\"admission.k8s.io/v1beta1\",\"kind\":\"AdmissionReview\","
        "\"response\":{\"uid\":\"u-2\",\"allowed\":true}}",
    };
    for (int i = 0; i < 2; i++) {
        struct adm_request req;
        decode_ok(bodies[i], &req);
        struct adm_verdict v = {.allowed = true};
        char *out = encode(&req, &v, ADM_MUTATING);
        assert_string_equal(out, want[i]);
        free(out);
        adm_request_clear(&req);
    }
}

static void test_encode_patch_only_when_mutating(void **state)
{
    (void)state;
    struct adm_request req;
    decode_ok(pod_create, &req);
    json_t *patch =
        json_loads("[{\"op\":\"add\",\"path\":\"/metadata/labels/x\",\"value\":\"y\"}]", 0, NULL);
    struct adm_verdict v = {.allowed = true, .patch = patch};
    char *out = encode(&req, &v, ADM_MUTATING);
    json_t *doc = json_loads(out, 0, NULL);
    json_t *resp = json_object_get(doc, "response");
    assert_string_equal(json_string_value(json_object_get(resp, "patchType")), "JSONPatch");
    /* base64 of the compact patch, standard alphabet with padding */
    assert_string_equal(json_string_value(json_object_get(resp, "patch")),
                        "W3sib3AiOiJhZGQiLCJwYXRoIjoiL21ldGFkYXRhL2xhYmVscy94IiwidmFsdWUiOiJ5In1d");
    json_decref(doc);
    free(out);

    out = encode(&req, &v, ADM_VALIDATING);
    assert_null(strstr(out, "patch"));
    free(out);

    /* An empty patch is no patch: neither member. */
    json_t *empty = json_array();
    v.patch = empty;
    out = encode(&req, &v, ADM_MUTATING);
    assert_null(strstr(out, "patch"));
    free(out);
    json_decref(empty);
    json_decref(patch);
    adm_request_clear(&req);
}

static void test_encode_deny(void **state)
{
    (void)state;
    struct adm_request req;
    decode_ok(pod_create, &req);
    json_t *warnings = json_pack("[s]", "w1");
    json_t *audit = json_pack("{s:s}", "policy", "gpu-quota");
    struct adm_verdict v = {.allowed = false,
                            .message = "gpu-quota: over quota; ask for less",
                            .warnings = warnings,
                            .audit = audit};
    char *out = encode(&req, &v, ADM_VALIDATING);
    assert_string_equal(out, "{\"apiVersion\":\"admission.k8s.io/v1\",\"kind\":\"AdmissionReview\","
                             "\"response\":{\"uid\":\"705ab4f5-6393-11e8-b7cc-42010a800002\","
                             "\"allowed\":false,\"status\":{\"code\":403,\"message\":\"gpu-quota: "
                             "over quota; ask for less\",\"reason\":\"Forbidden\",\"status\":"
                             "\"Failure\"},\"warnings\":[\"w1\"],\"auditAnnotations\":{\"policy\":"
                             "\"gpu-quota\"}}}");
    free(out);
    /* A code below 400 would be forced to 400 by the API server: send 403. */
    v.code = 200;
    out = encode(&req, &v, ADM_VALIDATING);
    assert_non_null(strstr(out, "\"code\":403"));
    free(out);
    json_decref(warnings);
    json_decref(audit);
    adm_request_clear(&req);
}

static void test_base64(void **state)
{
    (void)state;
    static const char *const vectors[][2] = {
        {"", ""},
        {"f", "Zg=="},
        {"fo", "Zm8="},
        {"foo", "Zm9v"},
        {"foob", "Zm9vYg=="},
        {"fooba", "Zm9vYmE="},
        {"foobar", "Zm9vYmFy"},
        {"\xff\xfe", "//4="},
    };
    /* In place after what the buf already holds, which stays as it is. */
    for (size_t i = 0; i < sizeof(vectors) / sizeof(vectors[0]); i++) {
        struct buf b;
        buf_init(&b, 64);
        assert_int_equal(buf_append(&b, "p=", 2), GG_OK);
        assert_int_equal(buf_append(&b, vectors[i][0], strlen(vectors[i][0])), GG_OK);
        assert_int_equal(adm_base64(&b, 2), GG_OK);
        assert_int_equal(b.len, 2 + strlen(vectors[i][1]));
        assert_memory_equal(b.data, "p=", 2);
        assert_string_equal(b.data + 2, vectors[i][1]);
        buf_clear(&b);
    }
    /* Every byte value, and every length mod 3, against a plain encoder. */
    static const char alphabet[] =
        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    for (size_t len = 254; len <= 256; len++) {
        struct buf b;
        buf_init(&b, 1024);
        char want[400];
        size_t n = 0;
        for (size_t i = 0; i < len; i++) {
            unsigned char c = (unsigned char)(255 - i);
            assert_int_equal(buf_append(&b, &c, 1), GG_OK);
        }
        for (size_t i = 0; i < len * 8; i += 6) {
            unsigned bits = 0;
            for (size_t j = i; j < i + 6; j++)
                bits = bits << 1 | (j < len * 8 ? (unsigned)(255 - j / 8) >> (7 - j % 8) & 1 : 0);
            want[n++] = alphabet[bits];
        }
        while (n % 4)
            want[n++] = '=';
        want[n] = '\0';
        assert_int_equal(adm_base64(&b, 0), GG_OK);
        assert_string_equal(b.data, want);
        buf_clear(&b);
    }
    /* Past the buf's limit the data is left as it was. */
    struct buf b;
    buf_init(&b, 3);
    assert_int_equal(buf_append(&b, "abc", 3), GG_OK);
    assert_int_equal(adm_base64(&b, 0), GG_ERR_TOOBIG);
    assert_string_equal(b.data, "abc");
    buf_clear(&b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_decode_pod_create),
        cmocka_unit_test(test_decode_operations),
        cmocka_unit_test(test_decode_dry_run_and_subresource),
        cmocka_unit_test(test_decode_never_takes_the_template_path),
        cmocka_unit_test(test_decode_rejects),
        cmocka_unit_test(test_decode_depth_bounded),
        cmocka_unit_test(test_encode_allow_round_trip),
        cmocka_unit_test(test_encode_patch_only_when_mutating),
        cmocka_unit_test(test_encode_deny),
        cmocka_unit_test(test_base64),
    };
    return cmocka_run_group_tests_name("admission", tests, NULL, NULL);
}
