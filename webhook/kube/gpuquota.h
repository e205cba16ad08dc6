/*
 * gpuquota.h - GPUQuota objects (gpuquotas.gpuguard.io): a namespace's GPU
 * limit in GPU-equivalents, and in its status the ledger the servers charge
 * (docs/quotas.md, docs/inventory.md).
 *
 *   spec.hard:      {gpu: "8", pools: {h100-train: "4"}}
 *   status.used:    {gpu: "5.250", pools: {h100-train: "4.000"}}
 *   status.entries: [{uid, pod, charge, pool, admitted}]: pods admitted and
 *                   not yet seen by the controller's watch
 *
 * Two parts: reading an object and writing its next status (no I/O), and
 * the store of the objects the watch shows, by namespace (thread-safe),
 * which admission and the controller read.
 */
#ifndef GG_GPUQUOTA_H
#define GG_GPUQUOTA_H

#include "util/gpuguard.h"

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#define GQ_GROUP "gpuguard.io"
#define GQ_VERSION "v1alpha1"
#define GQ_PLURAL "gpuquotas"
#define GQ_MAX_POOLS 64     /* pools a limit may name */
#define GQ_MAX_ENTRIES 2048 /* ledger entries one object holds: the CRD's maxItems */
#define GQ_NAME_MAX 254     /* a namespace, object or pod name, with its NUL */

struct gq_amount {
    char pool[GQ_NAME_MAX];
    int64_t milli;
};

/* What admission needs of an object: its limits and the usage its status says. */
struct gq_view {
    char ns[GQ_NAME_MAX], name[GQ_NAME_MAX], rv[64];
    int64_t hard; /* spec.hard.gpu, milli-GPU */
    bool counted; /* status.used.gpu is there: the controller has counted */
    int64_t used; /* status.used.gpu */
    size_t n_hard_pools, n_used_pools;
    struct gq_amount hard_pools[GQ_MAX_POOLS], used_pools[GQ_MAX_POOLS];
    size_t n_entries;
};

/* A quantity of GPU-equivalents written as a number (8) or a string ("0.5", "500m") into milli;
 * false when it is neither, or negative. */
bool gq_amount(const json_t *v, int64_t *milli);

/* Read obj; err names the field that is wrong (the CRD's schema should have refused it). */
enum gg_status gq_read(const json_t *obj, struct gq_view *out, struct gg_err *err);

/* The used amount of pool in v (0 when it has none). */
int64_t gq_used_pool(const struct gq_view *v, const char *pool);
/* The hard limit of pool in v, or -1 when it has none. */
int64_t gq_hard_pool(const struct gq_view *v, const char *pool);

/* Whether the entry for uid is in obj's ledger already (a review sent again). */
bool gq_has_entry(const json_t *obj, const char *uid);

/*
 * Why a pod charging charge milli-GPU (on pool, NULL or "" for none) does not
 * fit in v, into why ("" and true when it fits).  A quota not counted yet
 * admits nothing: its usage is unknown.
 */
bool gq_fits(const struct gq_view *v, int64_t charge, const char *pool, char *why, size_t size);

struct gq_charge {
    const char *uid, *pod, *pool; /* pool NULL or "": none */
    int64_t charge;               /* milli-GPU */
    int64_t now_us;               /* wall clock, for the entry's admitted time */
};

/*
 * obj as it is written back with c charged: status.used (and the pool's,
 * when spec.hard limits that pool) raised by the charge, an entry appended.  A new reference with
 * obj's metadata.resourceVersion (the write's precondition); NULL when out of memory or the ledger
 * holds GQ_MAX_ENTRIES already.
 */
json_t *gq_charged(const json_t *obj, const struct gq_charge *c);

/* "5.250": milli as GPU-equivalents, exactly, into out (at least 32 bytes). */
void gq_format(int64_t milli, char *out, size_t size);

/* ---- the store: the GPUQuota objects the watch shows, by namespace --------- */

struct gq_store;

struct gq_store *gq_store_new(void);
void gq_store_free(struct gq_store *s);
/* Keep (or replace) obj; relist: the number of the relist showing it (the caller's, rising;
 * 0: an event, kept as shown by the latest relist). */
void gq_store_put(struct gq_store *s, const json_t *obj, uint64_t relist);
void gq_store_delete(struct gq_store *s, const json_t *obj);
/* The end of relist: forget the objects it did not show. */
void gq_store_relist_end(struct gq_store *s, uint64_t relist);
/*
 * A copy of the namespace's GPUQuota when it has exactly one; *count says
 * how many it has (0: none, the caller's other rules apply; more than one:
 * refused, the caller says so).
 */
json_t *gq_store_get(struct gq_store *s, const char *ns, size_t *count);
/* How many GPUQuotas the namespace has, without copying any. */
size_t gq_store_count(struct gq_store *s, const char *ns);
/* Copies of every object kept, for the controller: a new array. */
json_t *gq_store_all(struct gq_store *s);

#endif
