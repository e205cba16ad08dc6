/*
 * rightsize.h - GPU memory history for rightsizing: the `rightsizing:`
 * configuration, the two Prometheus queries, and their answers folded from
 * pods into workloads (what each used at most and over how long).
 *
 * The history is DCGM exporter's DCGM_FI_DEV_FB_USED (framebuffer MiB in
 * use per GPU or MIG instance, labelled with the pod that holds it):
 *
 *   peak     max by (ns, pod) (max_over_time(sum by (ns, pod) (F)[window:1m]))
 *   history  the first and the last minute each pod had samples
 *            (label edge="first" | "last", unix seconds)
 *
 * where F is the metric for pods alone on their device: a device (Hostname,
 * UUID, GPU_I_ID) reported for several pods at once is time-sliced or MPS,
 * its memory is the whole device's, and it is left out.  A workload's peak
 * is the highest of its pods', its history from its pods' first sample to
 * their last.
 *
 * Pure: jansson only, no I/O but rs_file_load, no globals.
 */
#ifndef GG_RIGHTSIZE_H
#define GG_RIGHTSIZE_H

#include "util/gpuguard.h"

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#define RS_MAX_RESPONSE ((size_t)32 << 20) /* one Prometheus answer, or a saved file */
#define RS_MAX_SERIES ((size_t)1000000)    /* series in one answer */
#define RS_QUERY_MAX 2048
#define RS_PATH_MAX 1024
#define RS_FILE_VERSION 1

enum rs_mode { RS_OFF, RS_RECOMMEND, RS_APPLY };

/* The rightsizing: section (what the C side reads; policies read the rest). */
struct rs_settings {
    enum rs_mode mode;
    char url[RS_PATH_MAX]; /* prometheus.url without a trailing '/'; "" when unset */
    char token_file[RS_PATH_MAX], ca_file[RS_PATH_MAX], cert_file[RS_PATH_MAX],
        key_file[RS_PATH_MAX];
    char metric[128];                       /* DCGM_FI_DEV_FB_USED */
    char ns_label[64], pod_label[64];       /* labels.namespace, labels.pod */
    int64_t window_s, refresh_s, timeout_s; /* 7d, 5m, 30s */
};

/*
 * Read the rightsizing: section of a configuration (absent: mode off);
 * err names the key.  Mode recommend or apply needs prometheus.url only for
 * the server's source, so it is not required here.
 */
enum gg_status rs_settings_parse(const json_t *config, struct rs_settings *out, struct gg_err *err);

/* "7d", "1h30m", "90s", "2w" -> seconds (> 0); false when malformed. */
bool rs_parse_duration(const char *text, int64_t *seconds);
/* Seconds in days, hours, minutes, seconds: 604800 -> "7d", 5400 -> "1h30m". */
void rs_format_duration(int64_t seconds, char *out, size_t size);

enum rs_query { RS_QUERY_PEAK, RS_QUERY_HISTORY };
/* The PromQL text of a query; false when it does not fit. */
bool rs_query(const struct rs_settings *s, enum rs_query which, char *out, size_t size);

/* What the history says about one workload. */
struct rs_usage {
    double peak_mib; /* the most framebuffer memory one of its pods held at once */
    int64_t first_s; /* unix seconds of its pods' first and last samples */
    int64_t last_s;
    unsigned pods; /* pods with samples */
};

/* Workloads of a snapshot: "<namespace>/<workload>" -> rs_usage. */
struct rs_data {
    json_t *workloads; /* object: key -> [peak_mib, first_s, last_s, pods] */
    int64_t window_s;
    int64_t time_s; /* when the queries ran (unix seconds) */
    size_t series;  /* series read from the two answers */
};

/*
 * Fold the answers to the two queries (the JSON of /api/v1/query, as
 * Prometheus sends it) into d, which the caller zeroed.  owners (may be
 * NULL) maps "<namespace>/<pod>" to the "<kind>/<name>" of the pod's
 * controller where it is known (the inventory's pods); other pods are
 * folded by their names (ownerfold.h).  An answer with status "error", or
 * not shaped as Prometheus answers, is GG_ERR_INVALID naming what.
 */
enum gg_status rs_data_fold(struct rs_data *d, const json_t *peak, const json_t *history,
                            const char *ns_label, const char *pod_label, const json_t *owners,
                            struct gg_err *err);
void rs_data_clear(struct rs_data *d);
/* The usage of workload in ns; false when there is none. */
bool rs_data_get(const struct rs_data *d, const char *ns, const char *workload,
                 struct rs_usage *out);

/*
 * The saved form of the two answers, for `gpuguard check --usage`:
 * {"version": 1, "window": "7d", "time": <unix s>, "labels": {"namespace":
 * ..., "pod": ...}, "queries": {"peak": ..., "history": ...}, "peak":
 * <answer>, "history": <answer>}.  A new reference.
 */
json_t *rs_file_new(const struct rs_settings *s, int64_t time_s, const json_t *peak,
                    const json_t *history);
/* Read such a file (at most RS_MAX_RESPONSE bytes) and fold it into d (zeroed). */
enum gg_status rs_file_load(const char *path, struct rs_data *d, struct gg_err *err);

#endif
