/*
 * review.c - the request flow: decode the review, decide, encode the answer.
 */
#include "review.h"

#include "log.h"

#include <stdlib.h>
#include <time.h>

int64_t review_now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

void review_result_clear(struct review_result *r)
{
    if (!r)
        return;
    free(r->body);
    r->body = NULL;
    r->len = 0;
}

enum gg_status review_handle(const char *body, size_t len, enum adm_endpoint endpoint,
                             int64_t deadline_us, struct review_result *out, struct gg_err *err)
{
    (void)deadline_us;
    struct adm_request req;
    enum gg_status st = adm_decode(body, len, &req, err);
    if (st != GG_OK)
        return st;
    struct adm_verdict verdict = {.allowed = true};
    st = adm_encode(&req, &verdict, endpoint, &out->body, &out->len, err);
    out->verdict = MET_ALLOWED;
    adm_request_clear(&req);
    return st;
}
