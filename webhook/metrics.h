/*
 * metrics.h - process-wide metrics in Prometheus text format.
 *
 * Counters and histograms are fixed arrays of atomics indexed by small
 * enums, so recording on the request path is a few relaxed atomic adds and
 * never allocates or locks.
 */
#ifndef GG_METRICS_H
#define GG_METRICS_H

#include "buf.h"

#include <stdbool.h>
#include <stdint.h>

enum metrics_endpoint { MET_MUTATE, MET_VALIDATE, MET_ENDPOINTS };

enum metrics_verdict { MET_ALLOWED, MET_PATCHED, MET_DENIED, MET_ERROR, MET_VERDICTS };

/* One answered admission request and how long it took. */
void metrics_observe_admission(enum metrics_endpoint ep, enum metrics_verdict verdict,
                               double seconds);

/* A request answered with an HTTP error status (400, 404, 405, 413, 415, ...). */
void metrics_http_error(int status);

void metrics_inflight_add(int delta);
void metrics_connections_add(int delta);
long metrics_inflight(void);

/* A policy reload and the generation serving after it. */
void metrics_reload(bool ok, uint64_t generation);

/* A serving certificate load and the notAfter of the certificate serving after it. */
void metrics_tls(bool ok, int64_t not_after);

/* Append the whole exposition to out. */
enum gg_status metrics_render(struct buf *out);

#endif
