/*
 * promsource.h - the rightsizing usage source: the two queries of
 * rightsize.h against a Prometheus HTTP API (GET /api/v1/query, through
 * kubeclient's client: bearer token file, CA bundle, client certificate),
 * and a thread that runs them every `refresh` and publishes the folded
 * snapshot (rsstore.h).
 *
 * Off the admission path: admissions only ever read the last published
 * snapshot.  A failing query keeps the last snapshot (until it goes stale,
 * after three refreshes) and retries with backoff, capped at `refresh`;
 * an answer refused for its size waits a whole `refresh`.  Each answer is
 * bounded by RS_MAX_RESPONSE bytes, rightsizing.max_series series and the
 * query timeout, and is folded as it arrives: what a refresh holds is the
 * workload table it builds beside the published one.
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

/* Which bound an answer passed (the query failed with GG_ERR_TOOBIG). */
enum ps_over { PS_OVER_NONE, PS_OVER_BYTES, PS_OVER_SERIES };

/* Where an answer's bytes go too, as they arrive (gpuguard usage saves them); false aborts. */
struct ps_sink {
    bool (*write)(void *ctx, const char *data, size_t len);
    void *ctx;
};

/*
 * Run one query and fold its answer into d as it arrives (rs_reader_new:
 * what is held is d, not the answer).  owners as in rs_fold_opts; sink may
 * be NULL.  An HTTP error, an answer over RS_MAX_RESPONSE bytes or
 * s->max_series series (*over says which; over may be NULL), not JSON or
 * not an instant vector fails with err naming the query.
 */
enum gg_status ps_query(struct kc_client *c, const struct rs_settings *s, enum rs_query which,
                        const atomic_bool *cancel, const json_t *owners, const struct ps_sink *sink,
                        struct rs_data *d, enum ps_over *over, struct gg_err *err);

/* Both queries, peak first, then rs_data_finish. */
enum gg_status ps_fetch(struct kc_client *c, const struct rs_settings *s, const atomic_bool *cancel,
                        const json_t *owners, struct rs_data *d, enum ps_over *over,
                        struct gg_err *err);

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
