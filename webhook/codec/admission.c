/*
 * admission.c - AdmissionReview decode and encode.
 *
 * The API server decodes our answer case-sensitively and checks, for v1,
 * that apiVersion, kind and uid are echoed exactly and that a validating
 * answer carries neither patch nor patchType; v1beta1 checks less but gets
 * the same shape.  Decoding accepts what current API servers send: null
 * object/oldObject/options, every operation, empty names, sub-resources.
 */
#include "codec/admission.h"

#include "util/buf.h"
#include "util/jsonfast.h"
#include "util/jsonwrite.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static const char *const operation_names[] = {"CREATE", "UPDATE", "DELETE", "CONNECT"};

const char *adm_operation_name(enum adm_operation op)
{
    return operation_names[op];
}

void adm_request_clear(struct adm_request *req)
{
    if (!req)
        return;
    jf_doc_free(&req->doc);
    json_decref(req->source);
    memset(req, 0, sizeof(*req));
}

/* An optional string member: "" when absent or null, error when another type. */
static enum gg_status opt_string(const struct jf_node *obj, const char *key, const char *where,
                                 const char **out, struct gg_err *err)
{
    const struct jf_node *v = jf_get_str(obj, key);
    if (!v || v->type == JF_NULL) {
        *out = "";
        return GG_OK;
    }
    if (v->type != JF_STRING)
        return gg_fail(err, GG_ERR_INVALID, "%s.%s must be a string", where, key);
    *out = v->u.s;
    return GG_OK;
}

/* An embedded object that the API server may send as null. */
static enum gg_status opt_object(const struct jf_node *obj, const char *key,
                                 const struct jf_node **out, struct gg_err *err)
{
    const struct jf_node *v = jf_get_str(obj, key);
    if (!v || v->type == JF_NULL) {
        *out = NULL;
        return GG_OK;
    }
    if (v->type != JF_OBJECT)
        return gg_fail(err, GG_ERR_INVALID, "request.%s must be an object or null", key);
    *out = v;
    return GG_OK;
}

static enum gg_status decode_envelope(const struct jf_node *root, struct adm_request *req,
                                      struct gg_err *err)
{
    if (root->type != JF_OBJECT)
        return gg_fail(err, GG_ERR_INVALID,
                       "not an AdmissionReview: the body is not a JSON object");
    const char *api_version = jf_string(jf_get_str(root, "apiVersion"));
    if (!api_version)
        return gg_fail(err, GG_ERR_INVALID, "not an AdmissionReview: apiVersion is missing");
    if (strcmp(api_version, "admission.k8s.io/v1") == 0)
        req->version = ADM_V1;
    else if (strcmp(api_version, "admission.k8s.io/v1beta1") == 0)
        req->version = ADM_V1BETA1;
    else
        return gg_fail(err, GG_ERR_INVALID,
                       "unsupported apiVersion \"%.64s\": want admission.k8s.io/v1 or "
                       "admission.k8s.io/v1beta1",
                       api_version);
    req->api_version = api_version;
    const char *kind = jf_string(jf_get_str(root, "kind"));
    if (!kind || strcmp(kind, "AdmissionReview") != 0)
        return gg_fail(err, GG_ERR_INVALID, "not an AdmissionReview: kind is \"%.64s\"",
                       kind ? kind : "");
    return GG_OK;
}

static enum gg_status decode_operation(const struct jf_node *request, struct adm_request *req,
                                       struct gg_err *err)
{
    const char *op = jf_string(jf_get_str(request, "operation"));
    for (int i = 0; op && i < 4; i++) {
        if (strcmp(op, operation_names[i]) == 0) {
            req->operation = (enum adm_operation)i;
            return GG_OK;
        }
    }
    return gg_fail(err, GG_ERR_INVALID,
                   "request.operation must be CREATE, UPDATE, DELETE or CONNECT, got \"%.32s\"",
                   op ? op : "");
}

static enum gg_status decode_request(const struct jf_node *request, struct adm_request *req,
                                     struct gg_err *err)
{
    enum gg_status st;
    req->uid = jf_string(jf_get_str(request, "uid"));
    if (!req->uid || !*req->uid)
        return gg_fail(err, GG_ERR_INVALID, "request.uid must be a non-empty string");
    if ((st = decode_operation(request, req, err)) != GG_OK)
        return st;
    const struct jf_node *gvk = jf_get_str(request, "kind");
    if (gvk && gvk->type != JF_OBJECT)
        return gg_fail(err, GG_ERR_INVALID, "request.kind must be an object");
    const struct jf_node *gvr = jf_get_str(request, "resource");
    if (gvr && gvr->type != JF_OBJECT && gvr->type != JF_NULL)
        return gg_fail(err, GG_ERR_INVALID, "request.resource must be an object");
    if ((st = opt_string(gvk, "kind", "request.kind", &req->kind, err)) != GG_OK ||
        (st = opt_string(gvr, "resource", "request.resource", &req->resource, err)) != GG_OK ||
        (st = opt_string(gvk, "group", "request.kind", &req->group, err)) != GG_OK ||
        (st = opt_string(request, "namespace", "request", &req->namespace, err)) != GG_OK ||
        (st = opt_string(request, "name", "request", &req->name, err)) != GG_OK ||
        (st = opt_string(request, "subResource", "request", &req->sub_resource, err)) != GG_OK)
        return st;
    const struct jf_node *dry_run = jf_get_str(request, "dryRun");
    if (dry_run && dry_run->type != JF_TRUE && dry_run->type != JF_FALSE &&
        dry_run->type != JF_NULL)
        return gg_fail(err, GG_ERR_INVALID, "request.dryRun must be a boolean");
    req->dry_run = dry_run && dry_run->type == JF_TRUE;
    if ((st = opt_object(request, "object", &req->object, err)) != GG_OK ||
        (st = opt_object(request, "oldObject", &req->old_object, err)) != GG_OK ||
        (st = opt_object(request, "options", &req->options, err)) != GG_OK)
        return st;
    const struct jf_node *user = jf_get_str(request, "userInfo");
    req->user_info = user && user->type == JF_OBJECT ? user : NULL;
    return GG_OK;
}

const char *adm_object_name(const struct adm_request *req)
{
    if (*req->name)
        return req->name;
    const char *gen = jf_string(jf_get_str(jf_get_str(req->object, "metadata"), "generateName"));
    return gen ? gen : "";
}

/* Check the review in req->doc and fill req from it; req is cleared on failure. */
static enum gg_status decode_doc(struct adm_request *req, struct gg_err *err)
{
    const struct jf_node *root = req->doc.root;
    enum gg_status st = decode_envelope(root, req, err);
    if (st == GG_OK) {
        const struct jf_node *request = jf_get_str(root, "request");
        if (!request || request->type != JF_OBJECT)
            st = gg_fail(err, GG_ERR_INVALID, "not an AdmissionReview request: request is %s",
                         request ? "not an object" : "missing");
        else
            st = decode_request(request, req, err);
    }
    if (st != GG_OK)
        adm_request_clear(req);
    return st;
}

enum gg_status adm_decode(const char *body, size_t len, struct adm_request *req, struct gg_err *err)
{
    memset(req, 0, sizeof(*req));
    struct jf_error jerr;
    size_t depth = 0;
    if (jf_parse(body, len, JF_DEFAULT_MAX_DEPTH, &req->doc, &depth, &jerr) != 0)
        return gg_fail(err, GG_ERR_PARSE, "malformed JSON at line %d column %d: %s", jerr.line,
                       jerr.column, jerr.text);
    enum gg_status st = decode_doc(req, err);
    if (st == GG_OK)
        req->depth = depth;
    return st;
}

enum gg_status adm_decode_value(json_t *root, struct adm_request *req, struct gg_err *err)
{
    memset(req, 0, sizeof(*req));
    if (jf_from_json(root, &req->doc) != 0) {
        json_decref(root);
        return gg_fail(err, GG_ERR_NOMEM, "out of memory reading the review");
    }
    req->source = root;
    return decode_doc(req, err);
}

enum gg_status adm_base64(struct buf *b, size_t from)
{
    static const char alphabet[] =
        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    size_t len = b->len - from, groups = len / 3, tail = len % 3;
    char *out;
    /* Each group of 3 bytes grows by one character, a tail to 4. */
    enum gg_status st = buf_extend(b, groups + (tail ? 4 - tail : 0), &out);
    if (st != GG_OK)
        return st;
    out = b->data + b->len;
    const unsigned char *in = (const unsigned char *)b->data + from;
    /*
     * Last group first: group k's text starts at 4k, at or after its bytes
     * at 3k, so every byte is read before a character overwrites it.
     */
    if (tail) {
        const unsigned char *g = in + groups * 3;
        unsigned v = (unsigned)g[0] << 16 | (tail == 2 ? (unsigned)g[1] << 8 : 0);
        out -= 4;
        out[0] = alphabet[v >> 18];
        out[1] = alphabet[(v >> 12) & 63];
        out[2] = tail == 2 ? alphabet[(v >> 6) & 63] : '=';
        out[3] = '=';
    }
    for (size_t k = groups; k-- > 0;) {
        const unsigned char *g = in + k * 3;
        unsigned v = (unsigned)g[0] << 16 | (unsigned)g[1] << 8 | g[2];
        out -= 4;
        out[0] = alphabet[v >> 18];
        out[1] = alphabet[(v >> 12) & 63];
        out[2] = alphabet[(v >> 6) & 63];
        out[3] = alphabet[v & 63];
    }
    return GG_OK;
}

static void put_cstring(struct buf *b, const char *s)
{
    jw_string(b, s, strlen(s));
}

/* The patch's JSON text goes into the answer and is then base64-encoded where it lies. */
static enum gg_status put_patch(struct buf *b, const json_t *patch, struct gg_err *err)
{
    enum gg_status st = BUF_LITERAL(b, ",\"patch\":\"");
    size_t from = b->len;
    if (st == GG_OK && (st = jw_value(b, patch)) == GG_OK && (st = adm_base64(b, from)) == GG_OK)
        st = BUF_LITERAL(b, "\",\"patchType\":\"JSONPatch\"");
    return st == GG_OK ? GG_OK : gg_fail(err, st, "cannot encode the patch: %s", gg_strerror(st));
}

static void put_status(struct buf *b, const struct adm_verdict *v)
{
    /* The API server forces codes below 400 to 400; say what we mean. */
    BUF_LITERAL(b, ",\"status\":{\"code\":");
    jw_integer(b, v->code >= 400 ? v->code : 403);
    BUF_LITERAL(b, ",\"message\":");
    put_cstring(b, v->message ? v->message : "denied");
    BUF_LITERAL(b, ",\"reason\":");
    put_cstring(b, v->reason ? v->reason : "Forbidden");
    BUF_LITERAL(b, ",\"status\":\"Failure\"}");
}

static void put_warnings_and_audit(struct buf *b, const struct adm_verdict *v)
{
    size_t i;
    json_t *item;
    const char *key;
    if (json_array_size(v->warnings) > 0) {
        BUF_LITERAL(b, ",\"warnings\":[");
        json_array_foreach(v->warnings, i, item)
        {
            if (i)
                BUF_LITERAL(b, ",");
            jw_string(b, json_string_value(item), json_string_length(item));
        }
        BUF_LITERAL(b, "]");
    }
    if (json_object_size(v->audit) > 0) {
        BUF_LITERAL(b, ",\"auditAnnotations\":{");
        int first = 1;
        json_object_foreach(v->audit, key, item)
        {
            if (!first)
                BUF_LITERAL(b, ",");
            first = 0;
            put_cstring(b, key);
            BUF_LITERAL(b, ":");
            jw_string(b, json_string_value(item), json_string_length(item));
        }
        BUF_LITERAL(b, "}");
    }
}

/*
 * The answer is written directly rather than built as jansson values and
 * dumped: its shape is fixed, and the patch's base64 text is long enough
 * that jansson's character-by-character escaping showed in profiles (as
 * did json_dumpb of the patch itself, hence jsonwrite).  The text comes
 * from plain malloc (buf), as the HTTP layer frees it.
 */
enum gg_status adm_encode(const struct adm_request *req, const struct adm_verdict *verdict,
                          enum adm_endpoint endpoint, char **out, size_t *out_len,
                          struct gg_err *err)
{
    struct buf b;
    buf_init(&b, (size_t)1 << 30);
    BUF_LITERAL(&b, "{\"apiVersion\":");
    put_cstring(&b, req->api_version);
    BUF_LITERAL(&b, ",\"kind\":\"AdmissionReview\",\"response\":{\"uid\":");
    put_cstring(&b, req->uid);
    enum gg_status st = GG_OK;
    if (!verdict->allowed) {
        BUF_LITERAL(&b, ",\"allowed\":false");
        put_status(&b, verdict);
    } else {
        BUF_LITERAL(&b, ",\"allowed\":true");
        if (endpoint == ADM_MUTATING && json_array_size(verdict->patch) > 0)
            st = put_patch(&b, verdict->patch, err);
    }
    put_warnings_and_audit(&b, verdict);
    BUF_LITERAL(&b, "}}");
    if (st == GG_OK && (!b.data || b.failed)) /* never send a response with a piece missing */
        st = gg_fail(err, GG_ERR_NOMEM, "cannot serialize the response");
    if (st != GG_OK) {
        buf_clear(&b);
        return st;
    }
    *out = buf_steal(&b, out_len);
    return GG_OK;
}
