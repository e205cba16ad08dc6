/*
 * keys.h - the annotation and label keys gpuguard's C code and its Lua
 * library share, written once: the gpuguard module hands them to Lua as
 * gpuguard.keys, and lua/ names them from there.
 */
#ifndef GG_KEYS_H
#define GG_KEYS_H

#define GG_KEY_CHARGE "gpuguard.io/charge"     /* a pod's charge in milli-GPU */
#define GG_KEY_DECISION "gpuguard.io/decision" /* the sharing decision, for people */
#define GG_KEY_POOL "gpuguard.io/pool"         /* the pool gpu-sharing placed the pod in */
#define GG_KEY_WORKLOAD_CLASS "gpuguard.io/workload-class"
#define GG_KEY_KUEUE_QUEUE "kueue.x-k8s.io/queue-name" /* set by lua/queues.lua */
#define GG_KEY_KUEUE_PRIORITY "kueue.x-k8s.io/priority-class"
#define GG_KEY_KAI_QUEUE "kai.scheduler/queue"
/* The annotations a pod's charge reads (lua/intent.lua: gpuguard's charge of a shared replica
 * and KAI's share): what the informer keeps of a pod's annotations beside its pool, and what the
 * key of a remembered charge holds of them (engine/chargememo.c). */
#define GG_CHARGE_ANNOTATIONS                                                                      \
    GG_KEY_CHARGE, "gpu-fraction", "gpu-memory", "gpu-fraction-num-devices"
/* A namespace label "true" keeps the namespace from the webhooks
 * (charts/gpuguard/templates/webhooks.yaml). */
#define GG_KEY_IGNORE "gpuguard.io/ignore"

/* The keys by their name in gpuguard.keys: X(name, key) for each. */
#define GG_KEYS(X)                                                                                 \
    X("charge", GG_KEY_CHARGE)                                                                     \
    X("decision", GG_KEY_DECISION)                                                                 \
    X("pool", GG_KEY_POOL)                                                                         \
    X("workload_class", GG_KEY_WORKLOAD_CLASS)                                                     \
    X("kueue_queue", GG_KEY_KUEUE_QUEUE)                                                           \
    X("kueue_priority", GG_KEY_KUEUE_PRIORITY)                                                     \
    X("kai_queue", GG_KEY_KAI_QUEUE)

#endif
