/*
 * metrics.h - process-wide metrics in Prometheus text format.
 *
 * Counters and histograms are fixed arrays of atomics indexed by small
 * enums, so recording on the request path is a few relaxed atomic adds and
 * never allocates or locks.
 */
#ifndef GG_METRICS_H
#define GG_METRICS_H

#include "util/buf.h"

#include <stdbool.h>
#include <stdint.h>

enum metrics_endpoint { MET_MUTATE, MET_VALIDATE, MET_ENDPOINTS };

enum metrics_verdict { MET_ALLOWED, MET_PATCHED, MET_DENIED, MET_ERROR, MET_VERDICTS };

/* The review's operation (http/review.c maps enum adm_operation onto it); MET_OP_NONE when it
 * did not decode. */
enum metrics_operation {
    MET_OP_CREATE,
    MET_OP_UPDATE,
    MET_OP_DELETE,
    MET_OP_CONNECT,
    MET_OP_NONE,
    MET_OPERATIONS
};

enum metrics_policy_result {
    MET_POLICY_OK,      /* ran, reported nothing that blocks */
    MET_POLICY_DENIED,  /* denied (enforce mode) */
    MET_POLICY_WARNED,  /* denial turned into a warning or audit annotation by its mode */
    MET_POLICY_ERROR,   /* raised an error */
    MET_POLICY_BUDGET,  /* stopped: instruction budget */
    MET_POLICY_MEMORY,  /* stopped: memory limit */
    MET_POLICY_TIMEOUT, /* stopped: out of time */
    MET_POLICY_RESULTS
};

/* One answered admission request and how long it took. */
void metrics_observe_admission(enum metrics_endpoint ep, enum metrics_operation op,
                               enum metrics_verdict verdict, double seconds);

/* The metric slot of a policy name (registered on first use); -1 when the table is full. */
int metrics_policy_slot(const char *name);
void metrics_policy_observe(int slot, enum metrics_policy_result result, double seconds);

/* An evaluation that ended past its request's deadline. */
void metrics_deadline_overrun(void);

/* A Lua VM's memory high-water mark, in bytes; the largest seen is exported. */
void metrics_lua_memory(size_t peak);

/* A request answered with an HTTP error status (400, 404, 405, 413, 415, ...). */
void metrics_http_error(int status);

void metrics_inflight_add(int delta);
void metrics_connections_add(int delta);
long metrics_inflight(void);

/* A policy reload and the generation serving after it. */
void metrics_reload(bool ok, uint64_t generation);

/* A serving certificate load and the notAfter of the certificate serving after it. */
void metrics_tls(bool ok, int64_t not_after);

/*
 * The quota controller's leader election (kube/lease.c, one elector per
 * process): gpuguard_leader is 1 while this replica leads, and
 * gpuguard_leader_changes_total counts the times it became leader.  Both
 * are exported from the first call on (an elector calls it when it starts).
 */
void metrics_leader(bool leading);

/*
 * The quota ledger (GPUQuota objects written by admission, corrected by the
 * controller).  Its series are exported from the first call of any of these
 * on, or from metrics_ledger_enable() (call it when the ledger starts, so
 * that a ledger without traffic shows zeros rather than nothing).
 *
 * Namespace labels are bounded: the first METRICS_LEDGER_NAMESPACES
 * namespaces (by first use) get series of their own; later ones, and a
 * namespace that is NULL or not a DNS label, are counted under
 * namespace="_other".  Safe from any thread; after a namespace's first use,
 * a call is a hash lookup and relaxed atomic adds, no lock or allocation.
 */
#define METRICS_LEDGER_NAMESPACES 256

enum metrics_ledger_result {
    MET_LEDGER_OK,       /* the PUT of a GPUQuota's status succeeded */
    MET_LEDGER_CONFLICT, /* 409: written by someone else since it was read */
    MET_LEDGER_ERROR,    /* any other failure (status, transport, timeout) */
    MET_LEDGER_RESULTS
};

void metrics_ledger_enable(void);
/* gpuguard_quota_ledger_writes_total{namespace,result}: one PUT of a GPUQuota's status. */
void metrics_ledger_write(const char *ns, enum metrics_ledger_result r);
/* gpuguard_quota_ledger_seconds: the time a review spent on the ledger (1 ms to 5 s buckets). */
void metrics_ledger_seconds(double s);
/* gpuguard_quota_ledger_corrections_total{namespace}: n entries or usages the controller fixed. */
void metrics_ledger_correction(const char *ns, unsigned n);
/* gpuguard_quota_ledger_denials_total{namespace,reason}: a review denied by the ledger, reason
 * "over" (past the quota) or "unavailable" (the ledger could not be read or written); any other
 * reason is not counted. */
void metrics_ledger_denial(const char *ns, const char *reason);

/*
 * Append these metrics to out.  Those kept by higher layers (inventory,
 * rightsizing, quotas) follow them in the ops port's /metrics (http/server.c).
 */
enum gg_status metrics_render(struct buf *out);

#endif
