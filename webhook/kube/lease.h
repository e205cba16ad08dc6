/*
 * lease.h - leader election on a coordination.k8s.io/v1 Lease, for the work
 * that one replica at a time may do (the quota controller).  It follows
 * client-go's leaderelection package:
 *
 *  - A candidate tries every retry period, jittered (x 1 to x 2.2): GET the
 *    Lease, POST it when absent (a 409 AlreadyExists loses the round), else
 *    PUT it with the resourceVersion just read when its holder is empty,
 *    is this candidate, or has not changed the Lease for the holder's
 *    leaseDurationSeconds (a 409 Conflict loses the round: someone else
 *    wrote).  A takeover counts a leaseTransition and sets acquireTime.
 *  - The leader renews every retry period (a PUT of the Lease it last
 *    wrote; on failure a GET and a PUT as above) and leads only while a
 *    renewal succeeded within the renew deadline: past it, or when it sees
 *    another holder, it steps down and becomes a candidate again.
 *  - Expiry is judged on this process's CLOCK_MONOTONIC, from when the
 *    record (the Lease's spec) was last seen to change: the times written
 *    in the Lease (MicroTime, UTC, 6 fractional digits) are never compared
 *    with the local clock, so clock skew between replicas does not matter.
 *  - lease_stop releases a held Lease (holderIdentity "",
 *    leaseDurationSeconds 1), so that a candidate takes over at its next try
 *    instead of after the lease duration.
 *
 * There is no fencing: leader-only work must check lease_is_leader() and
 * stop when it turns false (renew deadline < lease duration is the margin
 * before another replica can take over).  Every request is bounded in time
 * (at most the renew deadline, and never past the time leadership would
 * end) and in size (LEASE_MAX_BODY); lease_stop returns within about a
 * second plus the release (at most LEASE_RELEASE_MAX_MS).  Leadership
 * changes are logged (JSON lines) and exported as gpuguard_leader and
 * gpuguard_leader_changes_total (util/metrics.h): one elector per process.
 *
 * RBAC: get, update on leases (both may name the lease), create on leases.
 */
#ifndef GG_LEASE_H
#define GG_LEASE_H

#include "kube/kubeclient.h"
#include "util/gpuguard.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#define LEASE_DEFAULT_DURATION_MS 15000
#define LEASE_DEFAULT_RENEW_DEADLINE_MS 10000
#define LEASE_DEFAULT_RETRY_MS 2000
#define LEASE_MAX_BODY (256 * 1024) /* a Lease as the API server answers it */
#define LEASE_RELEASE_MAX_MS 2000   /* the release's PUT in lease_stop */
#define LEASE_IDENTITY_MAX 256      /* bytes of holderIdentity */
#define LEASE_MICROTIME_LEN 28      /* "2026-01-02T03:04:05.000000Z" and its NUL */

struct lease_config {
    const char *namespace, *name; /* the Lease object */
    const char *identity;         /* this candidate: "<hostname>_<random>" when NULL */
    /* 0: 15000, 10000, 2000; refused unless duration > renew_deadline > 1.2 x retry > 0 */
    int64_t duration_ms, renew_deadline_ms, retry_ms;
};

struct lease;

/*
 * Start electing in a thread of its own, with its own client made from c's
 * credentials (kc_clone: c stays the caller's, and may be in use by another
 * thread).  Refused (GG_ERR_INVALID) for a namespace that is not a DNS label,
 * a name that is not a DNS subdomain, an identity empty, longer than
 * LEASE_IDENTITY_MAX or not UTF-8, or timings as lease_timing refuses them.
 */
enum gg_status lease_start(struct kc_client *c, const struct lease_config *cfg, struct lease **out,
                           struct gg_err *err);
/* Leading, and the last renewal within renew_deadline.  Any thread; false for NULL. */
bool lease_is_leader(const struct lease *l);
/* Increments each time this candidate becomes leader (0: never).  Any thread. */
uint64_t lease_term(const struct lease *l);
/* This candidate's identity, as written in holderIdentity. */
const char *lease_identity(const struct lease *l);
/* Stop the thread; release the lease when leading; free.  NULL is a no-op. */
void lease_stop(struct lease *l);

/* ---- pure helpers (exposed for tests) ---------------------------------- */

/* The timings of cfg with its defaults applied, or GG_ERR_INVALID with a message. */
struct lease_timing {
    int64_t duration_ms, renew_deadline_ms, retry_ms;
};
enum gg_status lease_timing(const struct lease_config *cfg, struct lease_timing *out,
                            struct gg_err *err);

/* A UTC time as a Kubernetes MicroTime, "YYYY-MM-DDTHH:MM:SS.ffffffZ" (microseconds
 * truncated); false for a time outside years 0000 to 9999. */
bool lease_microtime(const struct timespec *utc, char out[LEASE_MICROTIME_LEN]);

/* The wait before a candidate's next try: period_ms x (1 + 1.2 x unit), unit in [0, 1). */
int64_t lease_jitter_ms(int64_t period_ms, double unit);

/* leaseDurationSeconds for a duration: whole seconds, rounded up (at least 1). */
int64_t lease_duration_seconds(int64_t duration_ms);

#endif
