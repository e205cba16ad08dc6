/*
 * informer.h - keeps an inventory in sync with the API server's pods, the
 * way Kubernetes controllers do: LIST /api/v1/pods a page at a time, then
 * WATCH from the list's resourceVersion, on one thread of its own.
 *
 * - The list is read as a stream: each pod is cut out of the response,
 *   read into a trimmed pod (only what accounting needs, see
 *   inf_read_pod in infscan.h), added to an inventory stage and freed; the stage is
 *   swapped in as the whole state once the last page is in
 *   (inv_stage_commit), so a relist of 50,000 pods never holds the parsed
 *   list, and admissions wait for a pointer swap at most.
 * - The watch is read a line (one JSON event) at a time, each line bounded
 *   by INF_MAX_LINE; ADDED and MODIFIED upsert, DELETED deletes, BOOKMARK
 *   only moves the resourceVersion on.  A malformed line is skipped and
 *   counted.  A watch that ends is resumed from the last resourceVersion;
 *   410 Gone (as the HTTP status or an ERROR event) means a relist.
 *   Failures back off exponentially (capped, with jitter); a 401 makes
 *   the client read its token file again first.
 * - The first complete list marks the inventory ready.  Nothing here ever
 *   waits on an admission, and admissions never wait on the network.
 *
 * The pure pieces (the list splitter, event decoding) are exported for
 * the tests and the benchmark.
 */
#ifndef GG_INFORMER_H
#define GG_INFORMER_H

#include "util/buf.h"
#include "util/gpuguard.h"
#include "kube/infscan.h"
#include "kube/inventory.h"
#include "kube/kubeclient.h"

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* One pod of a list, or one watch event line (etcd objects are at most 1.5 MiB). */
#define INF_MAX_LINE ((size_t)4 << 20)
/* Pods in one list, all pages together. */
#define INF_MAX_LIST_PODS ((size_t)5000000)

/* ---- watch events -------------------------------------------------------- */

enum inf_event_type { INF_ADDED, INF_MODIFIED, INF_DELETED, INF_BOOKMARK, INF_ERROR };

struct inf_event {
    enum inf_event_type type;
    struct inf_pod *pod; /* inf_parse_event's ADDED, MODIFIED, DELETED: the caller's, read */
    json_t *obj;         /* inf_parse_event_as's, trimmed by its read */
    char rv[INF_RV_MAX]; /* the object's resourceVersion; "" when none */
    long code;           /* ERROR: the Status code (410: resourceVersion too old) */
    char message[160];   /* ERROR: the Status message */
};

/*
 * Decode one watch line of pods, {"type": ..., "object": ...}, the object
 * read once, into pod (inf_pod_of_text: its strings and charge spec; pod is
 * reused from line to line, and holds nothing to read after an error).
 * GG_ERR_PARSE or GG_ERR_INVALID (err says why) for a line that is not
 * JSON, has an unknown type, a pod without uid, or a bookmark without
 * resourceVersion.
 */
enum gg_status inf_parse_event(const char *line, size_t len, struct inf_pod *pod,
                               struct inf_event *ev, struct gg_err *err);
/* The same for another kind, the object read by read into ev->obj (an object without
 * metadata.uid refused alike). */
enum gg_status inf_parse_event_as(const char *line, size_t len, inf_read_fn read,
                                  struct inf_event *ev, struct gg_err *err);
void inf_event_clear(struct inf_event *ev);

/* ---- lists, read as a stream -------------------------------------------- */

/*
 * Reads the elements of a List's "items" as the response arrives, each with
 * inf_read_pod, and hands each trimmed pod to on_pod (borrowed; NULL with
 * why set for a malformed item), which returns false to stop.  An item
 * that lies whole in one chunk is read in place, in one pass; one that
 * spans chunks is copied (up to INF_MAX_LINE bytes; a longer one is
 * skipped and counted as oversized) and read once complete.  The list's
 * own "metadata" is kept for inf_list_finish; other members are skipped.
 */
struct inf_list_reader;
struct inf_list_reader *inf_list_reader_new(bool (*on_pod)(void *ctx, json_t *pod, const char *why),
                                            void *ctx);
void inf_list_reader_free(struct inf_list_reader *r);
/* Read items with read instead of inf_read_pod (each item is then copied, then read). */
void inf_list_reader_read_with(struct inf_list_reader *r, inf_read_fn read);
/* Hand each pod to on_pod as the informer reads a pod, with no object made of it (the relist's
 * way: what a charge reads is the pod's charge spec, kube/infscan.h). */
void inf_list_reader_read_pods(struct inf_list_reader *r,
                               bool (*on_pod)(void *ctx, const struct inf_pod *pod,
                                              const char *why));
enum gg_status inf_list_feed(struct inf_list_reader *r, const char *data, size_t len,
                             struct gg_err *err);

struct inf_list_meta {
    char resource_version[INF_RV_MAX];
    char *continue_token; /* malloc'ed; NULL on the last page */
    size_t items;         /* items handed to on_pod, malformed ones included */
    size_t oversized;     /* items skipped for their size */
};
/* The input is complete: check it ended with the list object and read its metadata. */
enum gg_status inf_list_finish(struct inf_list_reader *r, struct inf_list_meta *meta,
                               struct gg_err *err);

/* ---- the informer thread ------------------------------------------------- */

/*
 * What an informer keeps in sync: pods (/api/v1/pods; they mark the inventory
 * ready), or ResourceClaims, ResourceClaimTemplates, DeviceClasses or
 * ResourceSlices (resource.k8s.io v1, else v1beta2, else v1beta1, whichever
 * the API server serves; a cluster with none is retried with the longest
 * backoff), or GPUQuotas (gpuguard.io v1alpha1, kept in the inventory's
 * store, kube/gpuquota.h).
 */
enum inf_kind { INF_PODS, INF_CLAIMS, INF_TEMPLATES, INF_CLASSES, INF_SLICES, INF_QUOTAS };

struct inf_options {
    unsigned page_size;          /* LIST limit; 0: 500 */
    unsigned watch_timeout_s;    /* timeoutSeconds of a watch; 0: random in [300, 600) */
    unsigned backoff_initial_ms; /* 0: 500 */
    unsigned backoff_max_ms;     /* 0: 30000 */
    enum inf_kind kind;          /* what to list and watch: pods (the default) */
    /* INF_TEMPLATES: a second client (taken over) for inv's fetcher, the GET of a template the
     * watch has not shown yet; NULL: none. */
    struct kc_client *fetch_client;
    /* What the charges depend on (the configuration, the DeviceClasses); when it changes, the
     * watch ends within about a second and every object is listed (so charged) again.
     * NULL: never. */
    uint64_t (*generation)(void *ctx);
    void *generation_ctx;
};

struct informer;

/*
 * Start syncing inv from the API server; client is taken over (freed by
 * inf_stop, also on failure).  The inventory is registered for
 * inf_render_metrics until inf_stop.
 */
enum gg_status inf_start(struct kc_client *client, struct inventory *inv,
                         const struct inf_options *opts, struct informer **out, struct gg_err *err);
/* Stop the thread (within about a second) and free everything but the inventory. */
void inf_stop(struct informer *inf);

/* "ready (N pods)" or "syncing" (with the last error, if any) into out. */
void inf_describe(struct informer *inf, char *out, size_t size);

/*
 * The gpuguard_inventory_* metrics in Prometheus text, when an informer
 * runs (nothing otherwise); the ops port's /metrics appends them.
 */
enum gg_status inf_render_metrics(struct buf *out);

#endif
