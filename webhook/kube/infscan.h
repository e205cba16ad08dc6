/*
 * infscan.h - the informer's JSON scanner: reads JSON text, checking every
 * byte it skips, and builds only what is asked (a pod trimmed to what
 * accounting needs).
 *
 * The scanner builds no tree: a pod of the API server is read in one pass
 * into a small object, the rest of its text checked to be JSON and dropped.
 * The informer reads a pod with inf_pod_of_text (a watch event's, a list
 * item's) and other objects with inf_read_object, and uses the scanner's
 * steps for what it cuts out of a larger text (the members of a watch
 * event, a list item in place); inf_read_pod gives a pod as JSON, for the
 * list reader's JSON mode and the tests.
 */
#ifndef GG_INFSCAN_H
#define GG_INFSCAN_H

#include "util/buf.h"
#include "util/gpuguard.h"

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

#define INF_RV_MAX 64
#define INF_SCAN_MAX_DEPTH 256
#define INF_SCAN_KEY_MAX 320 /* label and annotation keys are at most 317 bytes */

/* ---- pods ------------------------------------------------------------------ */

/*
 * A pod as the inventory reads it, straight from its JSON text, building
 * nothing else (the rest of the text is checked to be JSON and skipped):
 *
 * - who it is: the strings below ("" when absent), its controller being
 *   the first ownerReference with controller: true (kind and name, for
 *   rightsizing's owner folding);
 * - its charge spec: exactly what the charge model (lua/intent.lua) reads
 *   of a pod, as a JSON text of its own: metadata.namespace, the
 *   annotations of GG_CHARGE_ANNOTATIONS; spec.nodeSelector,
 *   spec.resourceClaims, and the name, restartPolicy and extended resources
 *   (names with a "/", strings or numbers) of the limits and requests of
 *   spec.containers[] and spec.initContainers[]; status.resourceClaimStatuses.
 *   Values are copied as the text has them (strings checked to be UTF-8),
 *   objects the pod does not have are left out, and the charger hands the
 *   model this text, never the pod, so that a pod's charge is a function of
 *   its charge spec alone (engine/chargememo.h).
 */
#define INF_POD_SECTIONS 3

struct inf_pod {
    const char *uid, *ns, *name, *generate_name;
    const char *cls;   /* label gpuguard.io/workload-class */
    const char *pool;  /* annotation gpuguard.io/pool */
    const char *phase; /* status.phase */
    const char *node;  /* spec.nodeName */
    const char *owner_kind, *owner_name;
    const char *rv; /* metadata.resourceVersion, shorter than INF_RV_MAX */
    const char *spec;
    size_t spec_len;
    bool claims; /* spec.resourceClaims names some: the charge reads cluster state too */
    /* The strings and the charge spec, reused pod after pod; the spec's parts while scanning. */
    struct buf text, sections[INF_POD_SECTIONS];
};

/* The names the charge spec keeps: of a pod's annotations, and of a container's limits and
 * requests (the extended resources, vendor.domain/name). */
bool inf_charge_annotation(const char *key);
bool inf_charged_resource(const char *key);

void inf_pod_init(struct inf_pod *p);
void inf_pod_free(struct inf_pod *p);

/* The pod of a whole JSON text; false with err set when it is none. */
bool inf_pod_of_text(const char *text, size_t len, struct inf_pod *p, struct gg_err *err);

/* The pod of a jansson object (written out and read); false with err set when it is none. */
bool inf_pod_of_json(const json_t *obj, struct inf_pod *p, struct gg_err *err);
/* The same of a document's node (a review's object, util/jsonfast.h). */
struct jf_node;
bool inf_pod_of_nodes(const struct jf_node *node, struct inf_pod *p, struct gg_err *err);

/*
 * The pod as a trimmed object: the charge spec with the pod's own strings
 * put back where the pod had them (uid, name, generateName, the class label,
 * the pool annotation, the controller as ownerReferences [{kind, name,
 * controller: true}], spec.nodeName, status.phase).  NULL when out of
 * memory or when a number of the spec does not load.
 */
json_t *inf_pod_json(const struct inf_pod *p);

/*
 * inf_pod_json of the pod read from text; rv (INF_RV_MAX bytes, may be NULL)
 * gets metadata.resourceVersion ("" when absent).  NULL with err set when
 * the text is not one JSON object.
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
 * The pod at s->p into p (emptied first), s->p then past it.  False when the
 * text there is not a whole JSON object (s->why says why; unset: out of
 * memory).
 */
bool inf_scan_pod(struct inf_scan *s, struct inf_pod *p);

#endif
