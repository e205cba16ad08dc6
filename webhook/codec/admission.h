/*
 * admission.h - AdmissionReview (admission.k8s.io/v1 and v1beta1) decode
 * and encode.
 *
 * Pure: no I/O, no Lua, no globals.  Decoding checks the envelope the way
 * the API server writes it and keeps the parsed document; encoding builds
 * the response the API server accepts: same apiVersion, kind and uid, and
 * patch/patchType only on mutating responses, both or neither.
 */
#ifndef GG_ADMISSION_H
#define GG_ADMISSION_H

#include "util/gpuguard.h"
#include "util/jsonfast.h"

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

enum adm_version { ADM_V1, ADM_V1BETA1 };

enum adm_operation { ADM_CREATE, ADM_UPDATE, ADM_DELETE, ADM_CONNECT };

/* Which kind of webhook is answering: decides whether a patch may be sent. */
enum adm_endpoint { ADM_MUTATING, ADM_VALIDATING };

struct adm_request {
    struct jf_doc doc; /* the whole review; owned, the pointers below borrow it */
    json_t *source;    /* adm_decode_value's review, which doc points into; owned */
    enum adm_version version;
    const char *api_version;
    const char *uid;
    enum adm_operation operation;
    const char *kind;      /* request.kind.kind, "" when absent */
    const char *group;     /* request.kind.group */
    const char *resource;  /* request.resource.resource, the plural ("pods"), "" when absent */
    const char *namespace; /* "" when absent */
    const char *name;      /* "" on CREATE with generateName */
    const char *sub_resource;
    bool dry_run;
    const struct jf_node *object;     /* NULL when null or absent */
    const struct jf_node *old_object; /* NULL when null or absent */
    const struct jf_node *options;    /* NULL when null or absent */
    const struct jf_node *user_info;  /* NULL when absent */
    size_t depth; /* a bound on the review's nesting (it is depth 1); 0: unknown */
    /* Not from the review: set by gpuguard when the object is the Pod it built from a
     * workload's pod template, that template's path ("spec.template"); NULL otherwise. */
    const char *template_path;
    /* Not from the review: the object is one the API server stores, audited in the background
     * (engine/audit.h); policies see req.background true.  Always with dry_run. */
    bool background;
};

/* The object's name, or its generateName prefix on CREATE; "" when neither is known. */
const char *adm_object_name(const struct adm_request *req);

/* What to answer.  All json_t members are borrowed; NULL means none. */
struct adm_verdict {
    bool allowed;
    int code;            /* status.code when denied; 403 when 0 */
    const char *message; /* status.message when denied */
    const char *reason;  /* status.reason when denied; "Forbidden" when NULL */
    json_t *patch;       /* RFC 6902 array; ignored unless mutating and non-empty */
    json_t *warnings;    /* array of strings */
    json_t *audit;       /* object of string values: auditAnnotations */
};

/*
 * Parse and check a review into nodes (util/jsonfast.h): the engine reads
 * the object from them, no jansson values are made.  Nesting is bounded as
 * jansson bounds it (2048 levels).  GG_ERR_PARSE for malformed JSON, GG_ERR_INVALID
 * for JSON that is not an AdmissionReview request; err says what and where.
 * On success req owns the document; release it with adm_request_clear.
 */
enum gg_status adm_decode(const char *body, size_t len, struct adm_request *req,
                          struct gg_err *err);
void adm_request_clear(struct adm_request *req);

/*
 * adm_decode for a review that is already JSON (the CLI builds its own):
 * the same checks, on nodes that point into root; root is stolen, kept in
 * req on success and released on failure.
 */
enum gg_status adm_decode_value(json_t *root, struct adm_request *req, struct gg_err *err);

const char *adm_operation_name(enum adm_operation op);

/*
 * Build the response review for req.  *out is a NUL-terminated JSON text
 * from plain malloc that the caller frees.
 */
enum gg_status adm_encode(const struct adm_request *req, const struct adm_verdict *verdict,
                          enum adm_endpoint endpoint, char **out, size_t *out_len,
                          struct gg_err *err);

/*
 * Replace b's bytes from offset from to the end with their standard base64
 * (padded, no line breaks), in place: the patch is encoded where its JSON
 * text was written.
 */
struct buf;
enum gg_status adm_base64(struct buf *b, size_t from);

#endif
