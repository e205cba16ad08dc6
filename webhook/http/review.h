/*
 * review.h - one admission review from request body to response body:
 * decode, evaluate, encode.  No HTTP here: the server maps the status this
 * returns to an HTTP status.  The CLI's dry run (engine/dryrun.h) shares the
 * decode and the engine but not this function: it reads the verdict, which
 * says more than the encoded response.
 */
#ifndef GG_REVIEW_H
#define GG_REVIEW_H

#include "codec/admission.h"
#include "util/metrics.h"
#include "engine/policy.h"

#include <stdint.h>

struct review_result {
    char *body; /* response AdmissionReview JSON, malloc'ed */
    size_t len;
    enum metrics_verdict verdict;
    enum metrics_operation operation;
};

/*
 * Answer the review in body.  deadline_us is the CLOCK_MONOTONIC time in
 * microseconds by which the answer must be ready.  GG_ERR_PARSE or
 * GG_ERR_INVALID mean the body is not a review (err says why); any other
 * failure is ours.
 */
enum gg_status review_handle(struct engine *engine, const char *body, size_t len,
                             enum adm_endpoint endpoint, int64_t deadline_us,
                             struct review_result *out, struct gg_err *err);

void review_result_clear(struct review_result *r);

#endif
