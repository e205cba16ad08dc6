/*
 * rsstore.h - the process's rightsizing snapshot: the latest usage history
 * (from the Prometheus source, or a file saved by `gpuguard usage`), how
 * fresh it is, and what policies made of it.  Policies read it through
 * gpuguard.rightsize() and report through gpuguard.rightsize_report().
 *
 * Every function is thread-safe; an admission holds the lock for one
 * lookup and never waits on the network: the source publishes whole
 * snapshots.
 */
#ifndef GG_RSSTORE_H
#define GG_RSSTORE_H

#include "util/buf.h"
#include "util/gpuguard.h"
#include "kube/rightsize.h"

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

/* Workloads whose last report is kept for the per-namespace metrics. */
#define RSS_MAX_REPORTED 100000

/*
 * Make d (finished) the snapshot (its contents are taken and d is zeroed).
 * stale_after_s: lookups answer RSS_STALE once the snapshot is older than
 * that (0: never, for saved files).
 */
void rss_publish(struct rs_data *d, int64_t stale_after_s);

/* How a refresh of the source ended. */
enum rss_refresh {
    RSS_REFRESH_OK,
    RSS_REFRESH_FAILED,
    RSS_REFRESH_OVER_SERIES, /* refused: an answer past rightsizing.max_series */
    RSS_REFRESH_OVER_BYTES,  /* refused: an answer past RS_MAX_RESPONSE */
};
/*
 * The source's last refresh: ok, or the error (kept for /readyz, logs and
 * metrics; a refusal counts as an error and as a refusal).
 */
void rss_source_result(enum rss_refresh result, const char *error);
/* The source's rightsizing.max_series, for the metrics. */
void rss_set_max_series(size_t max_series);
/* There is a source (the server's thread) or a file: lookups no longer answer RSS_OFF. */
void rss_set_source(const char *what);

enum rss_result { RSS_FOUND, RSS_OFF, RSS_NO_DATA_YET, RSS_STALE, RSS_UNKNOWN };

/*
 * The usage of workload in ns; RSS_FOUND fills *u, *window_s and *age_s
 * (the snapshot's age in seconds).
 */
enum rss_result rss_lookup(const char *ns, const char *workload, struct rs_usage *u,
                           int64_t *window_s, int64_t *age_s);

/*
 * A policy's finding for a workload: what it requests and what its peak x
 * headroom needs, in milli-GPU, and what was done: "none" (it fits),
 * "recommend" or "apply".
 */
void rss_report(const char *ns, const char *workload, const char *action, int64_t requested_milli,
                int64_t needed_milli);

/* One /readyz line, "rightsizing: ok (N workloads, updated 40s ago)", ...; "" while off. */
void rss_describe(char *out, size_t size);

/* The last rss_report of this thread, for `gpuguard report` and the audit, which review one pod
 * at a time: after rss_record_last, this thread's reports are kept for it and not counted in
 * the metrics (the server's reviews do not pay for it). */
struct rss_last {
    char ns[256], workload[384], action[16];
    int64_t requested, needed; /* milli-GPU */
};
/* The last report since the previous call, if any (then forgotten). */
bool rss_take_last(struct rss_last *out);
void rss_record_last(void);

/*
 * The last audit's figures (engine/audit.h), taken over: per namespace, an array of the
 * milli-GPU its running workloads with history hold, need and hold beyond that, and those
 * without history hold.  They replace the reviews' sums in the metrics (an empty object: none
 * shown, as by a replica that does not lead); NULL: back to those.
 */
void rss_publish_audit(json_t *by_namespace);

/* The gpuguard_rightsizing_* metrics in Prometheus text (the source's only while it is on). */
enum gg_status rss_render_metrics(struct buf *out);

/* Forget everything (the CLI at exit, tests). */
void rss_reset(void);

#endif
