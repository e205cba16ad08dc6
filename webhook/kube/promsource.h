/*
 * promsource.h - the rightsizing usage source: the two queries of
 * rightsize.h against a Prometheus HTTP API (GET /api/v1/query, through
 * kubeclient's client: bearer token file, CA bundle, client certificate),
 * and a thread that runs them every `refresh` and publishes the folded
 * snapshot (rsstore.h).
 *
 * Off the admission path: admissions only ever read the last published
 * snapshot.  A failing query keeps the last snapshot (until it goes stale,
 * after three refreshes) and retries with backoff, capped at `refresh`.
 * Each answer is bounded by RS_MAX_RESPONSE and by the query timeout.
 */
#ifndef GG_PROMSOURCE_H
#define GG_PROMSOURCE_H

#include "util/gpuguard.h"
#include "kube/inventory.h"
#include "kube/kubeclient.h"
#include "kube/rightsize.h"

#include <jansson.h>
#include <stdatomic.h>

/* A client for s's prometheus: url, token_file, ca_file, cert_file and key_file. */
enum gg_status ps_client_new(const struct rs_settings *s, struct kc_client **out,
                             struct gg_err *err);

/*
 * Run both queries: *peak and *history are Prometheus' answers (new
 * references).  An HTTP error, a body over RS_MAX_RESPONSE or one that is
 * not JSON fails with err naming the query.
 */
enum gg_status ps_fetch(struct kc_client *c, const struct rs_settings *s, const atomic_bool *cancel,
                        json_t **peak, json_t **history, struct gg_err *err);

struct ps_source;

/*
 * Start the thread (s->url must be set).  inv (may be NULL) lends the
 * controller owners of live pods to the folding.
 */
enum gg_status ps_start(const struct rs_settings *s, struct inventory *inv, struct ps_source **out,
                        struct gg_err *err);
/* Stop the thread (within a second or the query timeout) and free it; NULL is a no-op. */
void ps_stop(struct ps_source *p);

#endif
