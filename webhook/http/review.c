/*
 * review.c - the request flow: decode the review, evaluate the policies,
 * encode the answer, log the decision.  The JSON of one request lives in
 * the thread's arena (arena.h) and is all released before returning.
 * Workloads (objects with pod templates) go through their templates'
 * pods (workloads.h), everything else through the policies as it is.
 */
#include "http/review.h"
#include "util/clock.h"

#include "util/arena.h"
#include "util/log.h"
#include "engine/workloads.h"

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

void review_result_clear(struct review_result *r)
{
    if (!r)
        return;
    free(r->body);
    r->body = NULL;
    r->len = 0;
}

static void log_decision(const struct adm_request *req, enum adm_endpoint endpoint,
                         const struct policy_verdict *v, enum metrics_verdict verdict,
                         int64_t start_us)
{
    static const char *const names[] = {"allowed", "patched", "denied", "error"};
    struct log_line l;
    if (!log_begin(&l, LOG_INFO, "decision"))
        return;
    log_str(&l, "uid", req->uid);
    log_str(&l, "kind", req->kind);
    if (*req->resource) { /* "deployments.apps", as kubectl names it; "pods" */
        char resource[256];
        snprintf(resource, sizeof(resource), "%s%s%s", req->resource, *req->group ? "." : "",
                 req->group);
        log_str(&l, "resource", resource);
    }
    log_str(&l, "namespace", req->namespace);
    log_str(&l, "name", adm_object_name(req));
    log_str(&l, "operation", adm_operation_name(req->operation));
    if (req->sub_resource && *req->sub_resource)
        log_str(&l, "subresource", req->sub_resource);
    const char *user = jf_string(jf_get_str(req->user_info, "username"));
    if (user)
        log_str(&l, "user", user);
    log_str(&l, "endpoint", endpoint == ADM_MUTATING ? "mutate" : "validate");
    log_str(&l, "verdict", names[verdict]);
    if (v->errors)
        log_int(&l, "policy_errors", (int64_t)v->errors);
    if (v->fired)
        log_json(&l, "policies", v->fired);
    log_int(&l, "patch_ops", (int64_t)json_array_size(v->patch));
    log_millis(&l, "latency_ms", gg_now_us() - start_us);
    if (v->message)
        log_str(&l, "message", v->message);
    const json_t *charge = json_object_get(v->audit, WL_CHARGE_AUDIT_KEY);
    if (charge)
        log_json(&l, "charge", charge);
    json_t *object = log_get_level() == LOG_DEBUG && req->object ? jf_to_json(req->object) : NULL;
    if (object)
        log_json(&l, "object", object);
    json_decref(object);
    log_end(&l);
}

static enum metrics_operation metrics_operation_of(enum adm_operation op)
{
    switch (op) {
    case ADM_CREATE:
        return MET_OP_CREATE;
    case ADM_UPDATE:
        return MET_OP_UPDATE;
    case ADM_DELETE:
        return MET_OP_DELETE;
    case ADM_CONNECT:
        break;
    }
    return MET_OP_CONNECT;
}

enum gg_status review_handle(struct engine *engine, const char *body, size_t len,
                             enum adm_endpoint endpoint, int64_t deadline_us,
                             struct review_result *out, struct gg_err *err)
{
    int64_t start_us = gg_now_us();
    struct adm_request req;
    arena_begin();
    enum gg_status st = adm_decode(body, len, &req, err);
    if (st != GG_OK) {
        arena_end();
        return st;
    }
    struct policy_verdict v;
    bool workload = false;
    st = wl_review(engine, &req, endpoint, deadline_us, &workload, &v, err);
    if (st == GG_OK && !workload)
        st = engine_evaluate(engine, &req, endpoint == ADM_MUTATING ? PHASE_MUTATE : PHASE_VALIDATE,
                             deadline_us, &v, err);
    if (st == GG_OK) {
        struct adm_verdict answer = {.allowed = v.allowed,
                                     .message = v.message,
                                     .patch = v.patch,
                                     .warnings = v.warnings,
                                     .audit = v.audit};
        st = adm_encode(&req, &answer, endpoint, &out->body, &out->len, err);
        out->verdict = v.errors                                               ? MET_ERROR
                       : !v.allowed                                           ? MET_DENIED
                       : endpoint == ADM_MUTATING && json_array_size(v.patch) ? MET_PATCHED
                                                                              : MET_ALLOWED;
        out->operation = metrics_operation_of(req.operation);
        log_decision(&req, endpoint, &v, out->verdict, start_us);
        policy_verdict_clear(&v);
    }
    adm_request_clear(&req); /* the review's nodes */
    arena_end();             /* the answer's and the verdict's JSON */
    return st;
}
