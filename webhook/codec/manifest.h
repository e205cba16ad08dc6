/*
 * manifest.h - the pods in a stream of Kubernetes manifests: every Pod and
 * every pod template of a pod-bearing controller or custom resource, each
 * turned into the Pod its controller would create, with the way back from
 * a patch on that Pod to a patch on the manifest (manifest.c, with the
 * cluster-state snapshot reader).  Also the YAML writer for edited
 * manifests (manifest_emit.c) and node line numbers for messages
 * (manifest_lines.c).
 *
 * Pure: libc, libyaml and jansson only; no I/O, no Lua, no globals.  The
 * caller reads files and parses them with yamldoc (mf_yd_limits gives the
 * bounds for manifests).
 *
 * What is found (the same coverage as lua/k8s.lua's pod_templates; kinds
 * are matched with their API group, and an object without apiVersion is
 * taken to be in its kind's usual group):
 *
 *   kind (group)                              template pointer(s)       pod's controller
 *   Pod (core)                                "" (the object itself)    none
 *   PodTemplate (core)                        /template                 none
 *   ReplicationController (core)              /spec/template            ReplicationController
 *   Deployment (apps, extensions)             /spec/template            ReplicaSet
 *   ReplicaSet, DaemonSet (apps, extensions)  /spec/template            itself
 *   StatefulSet (apps)                        /spec/template            itself
 *   Job (batch)                               /spec/template            itself
 *   CronJob (batch)                           /spec/jobTemplate/spec/template   Job
 *   any kubeflow.org kind (PyTorchJob, TFJob, MPIJob, XGBoostJob, PaddleJob, JAXJob)
 *                                             /spec/<x>ReplicaSpecs/<Role>/template
 *                                             (fields and roles in name order)  itself
 *   RayCluster (ray.io)                       /spec/headGroupSpec/template,
 *                                             /spec/workerGroupSpecs/<i>/template  itself
 *   RayJob (ray.io)                           the same under /spec/rayClusterSpec  RayCluster
 *                                             /spec/submitterPodTemplate          Job
 *   RayService (ray.io)                       the same under /spec/rayClusterConfig  RayCluster
 *   JobSet (jobset.x-k8s.io)                  /spec/replicatedJobs/<i>/template/spec/template  Job
 *   LeaderWorkerSet (leaderworkerset.x-k8s.io) /spec/leaderWorkerTemplate/leaderTemplate,
 *                                             /spec/leaderWorkerTemplate/workerTemplate StatefulSet
 *   Job (batch.volcano.sh)                    /spec/tasks/<i>/template  itself
 *   Notebook (kubeflow.org)                   /spec/template            StatefulSet
 *   InferenceService (serving.kserve.io)      /spec/predictor, /spec/transformer,
 *                                             /spec/explainer (assembled)  ReplicaSet
 *   List, and any kind ending in "List" with an items array: each item as above
 *
 * A template counts only when its spec is an object.  Every other document
 * (or List item) is reported as skipped with a reason.
 *
 * The Pod built for a template: apiVersion v1, kind Pod, the template's
 * metadata (without name and namespace, which the controller sets) plus the
 * object's namespace when it has one, a name or generateName as the
 * controller would make it, an ownerReference (controller: true) to the
 * object that really owns the pod, and a deep copy of the template's spec.
 * The labels the operator adds to its pods are added (they win over the
 * template's): LeaderWorkerSet, KubeRay (with ray.io/serve and the
 * originated-from labels of RayService and RayJob clusters), the Kubeflow
 * training operator and mpi-operator, JobSet, Volcano, the notebook
 * controller (whose pods take the Notebook's own labels and annotations,
 * not the template's) and KServe (raw deployment: the component's PodSpec
 * fields, its model spec as the container kserve-container).  The entry's
 * owners list the chain above the pod as the cluster has it, root first:
 * LeaderWorkerSet > StatefulSet > Pod > StatefulSet for an LWS worker.
 * The API server's defaulting is not applied.  A Pod document is copied as
 * it is.
 */
#ifndef GG_MANIFEST_H
#define GG_MANIFEST_H

#include "util/gpuguard.h"
#include "codec/yamldoc.h"

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

#define MF_MAX_FILE_BYTES ((size_t)64 << 20) /* one manifest file or stdin */
#define MF_MAX_DEPTH 128                     /* nesting of mappings and sequences */
#define MF_MAX_NODES 4000000                 /* values in one file, aliases expanded */
#define MF_MAX_OBJECTS 100000                /* documents plus List items in one file */
#define MF_MAX_LIST_NESTING 4                /* a List inside a List inside ... */
#define MF_MAX_CLUSTER_STATE ((size_t)256 << 20)

/* The yamldoc bounds for manifest files. */
void mf_yd_limits(struct yd_limits *out);

enum mf_type {
    MF_TEMPLATE, /* a Pod or a pod template: pod is set */
    MF_SKIPPED,  /* an object without a pod spec: reason is set */
};

/* One object of a stream, or one pod template of an object. */
struct mf_entry {
    enum mf_type type;
    size_t doc;        /* index into the stream's docs, 0-based */
    size_t doc_number; /* 1-based number of the document in the file, as yamldoc counts */
    size_t line;       /* line where the document starts */
    char *object_ptr;  /* JSON pointer of the object in the document: "" or "/items/3" */
    char *api_version; /* of the object; "" when absent */
    char *kind;        /* of the object; "" when absent */
    char *name;        /* metadata.name, else metadata.generateName, else "" */
    char *namespace;   /* metadata.namespace of the object; "" when absent */
    /* MF_TEMPLATE only */
    char *template_ptr;  /* JSON pointer of the template in the document ("" for a Pod doc) */
    char *path;          /* its field path for people: "spec.template", "items[2]", "" */
    char *owner_kind;    /* kind of the pod's controller; "" for none */
    char *owner_name;    /* name of that controller; "" for none */
    json_t *owners;      /* [{kind, name}]: the pod's owners, root first, the controller last */
    char *meta_ptr;      /* where the pod's metadata maps: the template's, a Notebook's own, or
                          * a KServe component (its labels and annotations) */
    char *container_ptr; /* KServe: where the pod's first container maps (the model); or NULL */
    bool assembled;      /* KServe: the pod's spec is the component's PodSpec fields */
    json_t *pod;         /* the Pod the controller would create */
    /* MF_SKIPPED only */
    const char *reason; /* static text: "no pod template", "not an object", ... */
};

struct mf_set {
    struct mf_entry *entries; /* in document order, templates in the order of the table above */
    size_t count;
    size_t templates; /* entries of type MF_TEMPLATE */
    size_t skipped;   /* entries of type MF_SKIPPED */
};

/*
 * Find every pod and pod template in the stream read from source (a name
 * for messages).  Every document gives at least one entry.  Over
 * MF_MAX_OBJECTS is GG_ERR_TOOBIG with "<source>:<line>: ..." in err.
 * *out is written only on success; release it with mf_set_clear.
 */
enum gg_status mf_collect(const struct yd_stream *stream, const char *source, struct mf_set *out,
                          struct gg_err *err);
void mf_set_clear(struct mf_set *set);

/*
 * Whether e's Pod is built from a workload's pod template (a Deployment's
 * spec.template, ...), not a Pod document of its own.
 */
bool mf_is_template(const struct mf_entry *e);

/* The API group of a kind whose pods or templates gpuguard reads (Pod, Deployment, PyTorchJob,
 * ...: the group an object of it without apiVersion is taken to be in); NULL for another. */
const char *mf_kind_group(const char *kind);

/*
 * mf_collect for one object already parsed (the object of an admission
 * request): its entries have doc 0, document number 1 and line 0.
 */
enum gg_status mf_collect_object(const json_t *obj, const char *source, struct mf_set *out,
                                 struct gg_err *err);

/*
 * Map a JSON pointer into e's Pod onto the document: /metadata/... under
 * e->meta_ptr, /spec/... under the template pointer (for a KServe
 * component, /spec/<field> is the component's <field> and the first
 * container the model spec).  *out is a malloc'ed pointer.  GG_ERR_INVALID
 * for pointers that have no place in the template: the root, anything
 * outside metadata and spec, the metadata the controller sets (namespace,
 * name, generateName, ownerReferences), and for a KServe component the
 * whole spec, metadata other than labels and annotations, and containers
 * other than the model's.
 */
enum gg_status mf_map_pointer(const struct mf_entry *e, const char *pod_pointer, char **out);

/*
 * The patch on the document (*mapped, a new array) that does to e's
 * template what patch does to e's Pod.  doc is the document as it is now,
 * used to add the template's metadata first when it is missing or not an
 * object.  Ops that cannot be mapped are left out and listed in *dropped
 * (a new array; may be NULL when the caller does not want it).  A whole
 * /metadata value loses the keys the controller sets.
 */
enum gg_status mf_map_patch(const struct mf_entry *e, const json_t *doc, const json_t *patch,
                            json_t **mapped, json_t **dropped, struct gg_err *err);

/*
 * Write docs (an array of JSON values) as a YAML stream, one document each,
 * in order, separated by "---".  Strings that YAML 1.1 (and so kubectl)
 * would read as something else are quoted; numbers, booleans and nulls
 * stay what they are, so reading the text back with yamldoc gives docs
 * again.  Nesting is bounded by MF_MAX_DEPTH plus JP_MAX_DEPTH.  *out is
 * malloc'ed and NUL-terminated.
 */
enum gg_status mf_emit_yaml(const json_t *docs, char **out, size_t *len, struct gg_err *err);

/*
 * Line numbers of the nodes of a YAML stream, for messages about content
 * that parsed: *out is an array with one object per document of the stream
 * (empty ones included, so element number-1 belongs to yd_doc.number),
 * mapping the JSON pointer of each node to its 1-based line.  Keys are
 * taken as written (a key `on` stays "on"); aliases count as one node; at
 * most max_nodes nodes are recorded.  GG_ERR_PARSE when libyaml cannot read
 * the text.
 */
enum gg_status mf_node_lines(const char *text, size_t len, size_t max_nodes, json_t **out,
                             struct gg_err *err);

/* The line of pointer, or of its nearest recorded ancestor, in one element of
 * mf_node_lines' array; 0 when nothing is known. */
size_t mf_line_of(const json_t *lines, const char *pointer);

/*
 * Check a cluster-state snapshot (the JSON of `kubectl get pods,
 * resourceclaims,resourceclaimtemplates,deviceclasses,resourceslices,
 * gpuquotas -A -o json`): an object with kind List or PodList and an items
 * array of objects with an object metadata, in any order.  Pods (kind Pod or
 * no kind), ResourceClaims, ResourceClaimTemplates, DeviceClasses,
 * ResourceSlices and GPUQuotas are kept; items of other kinds are dropped from
 * *state's items and counted in counts[MF_STATE_OTHER].  *state (a new
 * reference) is the parsed snapshot.  Messages start with source.
 */
enum mf_state_kind {
    MF_STATE_POD,
    MF_STATE_CLAIM,
    MF_STATE_TEMPLATE,
    MF_STATE_CLASS,
    MF_STATE_SLICE,
    MF_STATE_QUOTA,
    MF_STATE_OTHER,
    MF_STATE_N
};
enum gg_status mf_cluster_state(const char *text, size_t len, const char *source, json_t **state,
                                size_t counts[MF_STATE_N], struct gg_err *err);

#endif
