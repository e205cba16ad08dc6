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
 * Pure: no I/O but rs_file_load, no globals but the seed of the tables' hash.
 */
#ifndef GG_RIGHTSIZE_H
#define GG_RIGHTSIZE_H

#include "util/gpuguard.h"

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#define RS_MAX_RESPONSE ((size_t)32 << 20) /* one Prometheus answer */
/* A saved file: both answers and what says how they were taken. */
#define RS_MAX_FILE (2 * RS_MAX_RESPONSE + ((size_t)1 << 20))
#define RS_MAX_SERIES_DEFAULT ((size_t)200000) /* rightsizing.max_series */
#define RS_MAX_SERIES ((size_t)1000000)        /* the most it may be set to; files' bound */
/*
 * A workload whose peak is below this (MiB) is no evidence of a small one: a
 * history of zeros is an idle, broken or lying exporter, and the smallest
 * allocation rightsize.lua could name (1 GiB) would be a guess.  It is left
 * out of the snapshot and counted (rs_data.no_evidence).
 */
#define RS_MIN_EVIDENCE_MIB 1024.0
#define RS_NS_MAX 63   /* a namespace's length (a DNS label) */
#define RS_POD_MAX 253 /* a pod name's (a DNS subdomain) */
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
    size_t max_series;                      /* the most series one answer may have: 200000 */
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

struct rs_entry; /* a workload of rs_data (rightsize.c) */

/*
 * Workloads of a snapshot: "<namespace>/<workload>" -> rs_usage, in a table
 * of its own (about 50 bytes and the key per workload).  Zeroed is empty.
 */
struct rs_data {
    struct rs_entry *entries;
    size_t n, cap;   /* workloads; room in entries */
    uint32_t *slots; /* open addressing: 1 + the entry's index, 0 free; a power of two */
    size_t n_slots;  /* 0 until the first workload */
    char *keys;      /* the keys, each NUL-terminated */
    size_t keys_len, keys_cap;
    int64_t window_s;
    int64_t time_s;        /* when the queries ran (unix seconds) */
    size_t series;         /* series read from the two answers */
    size_t peak_series;    /* of the peak answer (its pods) */
    size_t history_series; /* of the history answer */
    size_t no_evidence;    /* workloads left out: peak below RS_MIN_EVIDENCE_MIB */
};

/*
 * How answers are folded: the labels naming a sample's namespace and pod;
 * owners (may be NULL), mapping "<namespace>/<pod>" to the "<kind>/<name>"
 * of the pod's controller where it is known (the inventory's pods; other
 * pods are folded by their names, ownerfold.h); and the most series one
 * answer may have (0: RS_MAX_SERIES).
 */
struct rs_fold_opts {
    const char *ns_label, *pod_label;
    const json_t *owners;
    size_t max_series;
};

/*
 * An answer of /api/v1/query read as it arrives, a piece at a time, and
 * folded into a workload table as each sample is read: what is held is the
 * table and a few hundred bytes, however the answer is shaped.  JSON is
 * checked as jansson does (UTF-8, escapes, numbers), nesting is bounded
 * (RS_DEPTH_MAX), and strings are kept only where a name or value is
 * wanted, at most RS_TOKEN_MAX bytes (a longer label is no Kubernetes
 * name: its sample is skipped).
 *
 * Fold the peak answer first: a history sample only dates a workload the
 * peak answer named.  Then rs_data_finish.
 */
#define RS_DEPTH_MAX 32
#define RS_TOKEN_MAX 512
struct rs_reader;
/* NULL when out of memory; which names the query in messages. */
struct rs_reader *rs_reader_new(struct rs_data *d, enum rs_query which,
                                const struct rs_fold_opts *o);
/*
 * The next piece of the answer.  Fails with err naming the query: not JSON
 * (GG_ERR_PARSE, at which byte), nested too deep (GG_ERR_PARSE), more
 * series than the bound (GG_ERR_TOOBIG) or out of memory; once failed it
 * fails again.
 */
enum gg_status rs_reader_feed(struct rs_reader *r, const char *data, size_t len,
                              struct gg_err *err);
/*
 * The answer is over: GG_OK when it was a whole Prometheus answer with an
 * instant vector; GG_ERR_INVALID for status "error" (with Prometheus'
 * message) or any other shape; GG_ERR_PARSE when cut short.
 */
enum gg_status rs_reader_end(struct rs_reader *r, struct gg_err *err);
void rs_reader_free(struct rs_reader *r);

/*
 * After both answers: workloads whose peak is below RS_MIN_EVIDENCE_MIB
 * are left out and counted in d->no_evidence.
 */
void rs_data_finish(struct rs_data *d);

/* Both answers (as Prometheus sends them) read and finished: the readers above in one call. */
enum gg_status rs_data_fold(struct rs_data *d, const char *peak, size_t peak_len,
                            const char *history, size_t history_len, const struct rs_fold_opts *o,
                            struct gg_err *err);
void rs_data_clear(struct rs_data *d);
/* The usage of workload in ns; false when there is none. */
bool rs_data_get(const struct rs_data *d, const char *ns, const char *workload,
                 struct rs_usage *out);

/*
 * The saved form of the two answers, for `gpuguard check --usage`:
 * {"version": 1, "window": "7d", "time": <unix s>, "labels": {"namespace":
 * ..., "pod": ...}, "queries": {"peak": ..., "history": ...}, "peak":
 * <answer>, "history": <answer>}, the answers as Prometheus sent them.
 * It is written as it is read: rs_file_head (malloc'ed; NULL when out of
 * memory or a query does not fit), the peak answer, RS_FILE_BETWEEN, the
 * history answer, RS_FILE_END.
 */
char *rs_file_head(const struct rs_settings *s, int64_t time_s);
#define RS_FILE_BETWEEN ",\n\"history\": "
#define RS_FILE_END "\n}\n"
/*
 * Read such a file (at most RS_MAX_FILE bytes, its members in any order) and
 * fold it into d (zeroed), finished; read a piece at a time, three times
 * over, so that what is held is d.  On failure d is cleared again.
 */
enum gg_status rs_file_load(const char *path, struct rs_data *d, struct gg_err *err);

#endif
