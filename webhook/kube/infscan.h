/*
 * infscan.h - the informer's JSON scanner: reads JSON text, checking every
 * byte it skips, and builds only what is asked (a pod trimmed to what
 * accounting needs).
 *
 * The scanner builds no tree: a pod of the API server is read in one pass
 * into a small object, the rest of its text checked to be JSON and dropped.
 * The informer reads whole objects with inf_read_pod and inf_read_object,
 * and uses the scanner's steps for what it cuts out of a larger text (the
 * members of a watch event, a list item in place).
 */
#ifndef GG_INFSCAN_H
#define GG_INFSCAN_H

#include "util/gpuguard.h"

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

#define INF_RV_MAX 64
#define INF_SCAN_MAX_DEPTH 256
#define INF_SCAN_KEY_MAX 320 /* label and annotation keys are at most 317 bytes */

/* ---- whole texts --------------------------------------------------------- */

/*
 * A new pod object with only what the charge model (lua/intent.lua) reads:
 * metadata.namespace, name, generateName, uid, the gpuguard.io/workload-class
 * label, the gpuguard.io/charge and KAI (gpu-fraction, gpu-memory,
 * gpu-fraction-num-devices) annotations, the controller's ownerReference
 * (kind and name, for rightsizing's owner folding); spec.nodeName,
 * spec.nodeSelector, spec.resourceClaims; the name, restartPolicy and
 * extended resources (names with a "/") of spec.containers[] and
 * spec.initContainers[] (limits and requests); status.phase.  The charge of
 * the result equals that of the pod.  Read straight from the JSON text of a
 * pod, building nothing else; the rest of the text is checked to be JSON and
 * skipped.  rv (INF_RV_MAX bytes, may be NULL) gets metadata.resourceVersion
 * ("" when absent).  NULL with err set when the text is not one JSON object.
 */
json_t *inf_read_pod(const char *text, size_t len, char *rv, struct gg_err *err);

/*
 * A whole object (a ResourceClaim or ResourceClaimTemplate: small, and kept
 * trimmed by the inventory), parsed from its JSON text; rv as for
 * inf_read_pod.  NULL with err set when the text is not one JSON object.
 */
json_t *inf_read_object(const char *text, size_t len, char *rv, struct gg_err *err);

/* How list items and watch objects are read: inf_read_pod, or inf_read_object. */
typedef json_t *(*inf_read_fn)(const char *text, size_t len, char *rv, struct gg_err *err);

/* ---- the scanner's steps ------------------------------------------------- */

struct inf_scan {
    const char *p, *end; /* the text not read yet */
    int depth;           /* containers open */
    const char *why;     /* the first problem found */
};

/* Past whitespace. */
void inf_scan_ws(struct inf_scan *s);
/* At a '{' or '[': past it, one level deeper (false past INF_SCAN_MAX_DEPTH). */
bool inf_scan_enter(struct inf_scan *s);
/*
 * The next member of an object whose '{' was consumed (first true before
 * the first): 1 with its key in key (INF_SCAN_KEY_MAX bytes; "" when longer
 * or when key is NULL) and s->p at its value, 0 after the closing '}', -1 on
 * malformed input.
 */
int inf_scan_member(struct inf_scan *s, bool *first, char *key);
/* Past one JSON value, checked; false when it is not one. */
bool inf_scan_skip(struct inf_scan *s);
/* The string value at s->p (its quote) as a jansson string; NULL when invalid. */
json_t *inf_scan_string(struct inf_scan *s);
/*
 * The pod object at s->p trimmed as by inf_read_pod, s->p then past it; rv
 * as for inf_read_pod (not cleared first).  NULL when the text there is not
 * a whole JSON object (s->why says why; unset: out of memory).
 */
json_t *inf_scan_pod(struct inf_scan *s, char *rv);

#endif
