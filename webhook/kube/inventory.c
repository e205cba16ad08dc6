/*
 * inventory.c - pod records, usage sums and reservations under one mutex.
 *
 * Records live in an open-addressing map keyed by pod uid; usage is kept as
 * running sums per namespace and per namespace/class, so a quota check is
 * two hash lookups whatever the number of pods.  A relist builds a whole new
 * state (records and sums) with no lock held and swaps it in at once, so a
 * quota check never waits for more than a pointer swap.
 */
#include "kube/inventory.h"
#include "kube/gpuquota.h"
#include "util/clock.h"

#include "util/arena.h"
#include "util/log.h"
#include "codec/manifest.h"
#include "codec/quantity.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* An open-addressing map from strings to values; keys are owned. */
struct slot {
    char *key;
    void *ptr;     /* a pod record (pods map) */
    int64_t value; /* a sum (sums map) */
};

struct map {
    struct slot *slots;
    size_t cap; /* a power of two */
    size_t used;
};

struct dra_entry {
    json_t *obj;
    uint64_t seen;  /* the relist that last showed it */
    int64_t charge; /* a claim charged on its own; added to dra_sums */
};

/*
 * What the inventory keeps of a pod: one allocation with the pod's name in
 * it; the strings many pods share (namespace, class, pool, controller) are
 * its state's, interned (see intern).
 */
struct record {
    const char *ns;
    const char *cls;
    const char *pool;  /* gpuguard.io/pool, "" when none */
    const char *owner; /* the controller's "<kind>/<name>" (or "") */
    int64_t charge;
    char name[]; /* the pod's */
};

/*
 * A review's reservation, numbered in the order reviews reserved: a review
 * reads the usage with the reservations of the reviews that began before it
 * (see inv_read_before), so two concurrent admissions never both take the
 * last room.  The pod (or claim) settles it by uid, or by name when the
 * review had no uid (outside the API server's validating call).
 */
struct reservation {
    char *ns, *uid, *name, *cls, *pool;
    int64_t charge;
    int64_t expires_ms;
    uint64_t seq;
};

/* The pods and their sums: what a relist replaces as a whole. */
struct state {
    struct map pods;    /* uid -> record */
    struct map sums;    /* "ns" and "ns\x1f" "class" -> milli-GPU */
    struct map strings; /* the records' shared strings -> how many records hold each */
};

struct inventory {
    pthread_mutex_t lock;
    inv_charge_fn charge; /* NULL: nothing is charged */
    void *charge_ctx;
    pthread_mutex_t dra_lock; /* the DRA objects, apart: charges read them under lock */
    struct map dra;           /* "kind\x1fns\x1fname" -> struct dra_entry */
    struct map dra_sums;      /* ns -> milli-GPU of the claims charged on their own */
    uint64_t dra_relist;      /* numbers relists; entries keep the last that showed them */
    uint64_t class_changes;   /* DeviceClasses added, changed or removed (inv_class_changes) */
    uint64_t dra_version;     /* DRA objects changed or asked of the API server (inv_dra_version) */
    inv_fetch_fn fetch;       /* a template not kept yet; NULL: none */
    void *fetch_ctx;
    struct state st;
    struct reservation *res;
    size_t n_res, cap_res;
    uint64_t next_seq; /* the last reservation's number */
    bool ready;
    struct map gone;         /* uid -> ms: pods seen deleted or finished, lately (note_gone) */
    struct gq_store *quotas; /* the GPUQuota objects the watch shows */
};

static uint64_t hash(const char *s)
{
    uint64_t h = 1469598103934665603ULL; /* FNV-1a */
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 1099511628211ULL;
    return h;
}

static struct slot *map_find(struct map *m, const char *key)
{
    if (!m->cap)
        return NULL;
    for (size_t i = hash(key) & (m->cap - 1);; i = (i + 1) & (m->cap - 1)) {
        if (!m->slots[i].key)
            return NULL;
        if (strcmp(m->slots[i].key, key) == 0)
            return &m->slots[i];
    }
}

static bool map_grow(struct map *m)
{
    size_t cap = m->cap ? m->cap * 2 : 64;
    struct slot *slots = calloc(cap, sizeof(*slots));
    if (!slots)
        return false;
    for (size_t i = 0; i < m->cap; i++) {
        if (!m->slots[i].key)
            continue;
        size_t j = hash(m->slots[i].key) & (cap - 1);
        while (slots[j].key)
            j = (j + 1) & (cap - 1);
        slots[j] = m->slots[i];
    }
    free(m->slots);
    m->slots = slots;
    m->cap = cap;
    return true;
}

/* The slot for key, created empty when missing; NULL when out of memory. */
static struct slot *map_put(struct map *m, const char *key)
{
    struct slot *s = map_find(m, key);
    if (s)
        return s;
    if ((m->used + 1) * 10 > m->cap * 7 && !map_grow(m))
        return NULL;
    size_t i = hash(key) & (m->cap - 1);
    while (m->slots[i].key)
        i = (i + 1) & (m->cap - 1);
    m->slots[i].key = strdup(key);
    if (!m->slots[i].key)
        return NULL;
    m->used++;
    return &m->slots[i];
}

/* Remove by re-inserting the rest of the cluster (linear probing). */
static void map_remove(struct map *m, struct slot *s)
{
    size_t i = (size_t)(s - m->slots);
    free(s->key);
    *s = (struct slot){0};
    m->used--;
    for (size_t j = (i + 1) & (m->cap - 1); m->slots[j].key; j = (j + 1) & (m->cap - 1)) {
        struct slot moved = m->slots[j];
        m->slots[j] = (struct slot){0};
        size_t k = hash(moved.key) & (m->cap - 1);
        while (m->slots[k].key)
            k = (k + 1) & (m->cap - 1);
        m->slots[k] = moved;
    }
}

/* Free each slot's ptr too (a record) with records. */
static void map_clear(struct map *m, bool records)
{
    for (size_t i = 0; i < m->cap; i++) {
        if (!m->slots[i].key)
            continue;
        free(m->slots[i].key);
        if (records)
            free(m->slots[i].ptr);
    }
    free(m->slots);
    memset(m, 0, sizeof(*m));
}

static void free_dra_entry(struct dra_entry *d)
{
    if (!d)
        return;
    json_decref(d->obj);
    free(d);
}

static void dra_clear(struct map *m)
{
    for (size_t i = 0; i < m->cap; i++)
        if (m->slots[i].key)
            free_dra_entry(m->slots[i].ptr);
    map_clear(m, false);
}

struct inventory *inv_new(void)
{
    struct inventory *inv = calloc(1, sizeof(*inv));
    if (inv && !(inv->quotas = gq_store_new())) {
        free(inv);
        return NULL;
    }
    if (inv) {
        pthread_mutex_init(&inv->lock, NULL);
        pthread_mutex_init(&inv->dra_lock, NULL);
    }
    return inv;
}

/* The reservation this thread's review holds: its usage reads count older ones only. */
static _Thread_local uint64_t reading_before;
/* The pod this thread's usage reads leave out (inv_read_without). */
static _Thread_local const char *reading_without;

static void drop_reservation(struct inventory *inv, size_t i)
{
    struct reservation *r = &inv->res[i];
    free(r->ns);
    free(r->uid);
    free(r->name);
    free(r->cls);
    free(r->pool);
    inv->res[i] = inv->res[--inv->n_res];
}

static void clear_reservations(struct inventory *inv)
{
    while (inv->n_res)
        drop_reservation(inv, inv->n_res - 1);
}

static void state_clear(struct state *st)
{
    map_clear(&st->pods, true);
    map_clear(&st->sums, false);
    map_clear(&st->strings, false);
}

void inv_free(struct inventory *inv)
{
    if (!inv)
        return;
    state_clear(&inv->st);
    clear_reservations(inv);
    free(inv->res);
    dra_clear(&inv->dra);
    map_clear(&inv->dra_sums, false);
    map_clear(&inv->gone, false);
    gq_store_free(inv->quotas);
    pthread_mutex_destroy(&inv->lock);
    pthread_mutex_destroy(&inv->dra_lock);
    free(inv);
}

/* ---- charges: the charger's, never the inventory's own ------------------ */

void inv_set_charger(struct inventory *inv, inv_charge_fn fn, void *ctx)
{
    pthread_mutex_lock(&inv->lock);
    inv->charge = fn;
    inv->charge_ctx = ctx;
    pthread_mutex_unlock(&inv->lock);
}

/* The charger's answer for a pod or obj (see inv_charge_fn). */
static int64_t charge_of(struct inventory *inv, const struct inf_pod *pod,
                         const struct jf_node *obj)
{
    pthread_mutex_lock(&inv->lock);
    inv_charge_fn fn = inv->charge;
    void *ctx = inv->charge_ctx;
    pthread_mutex_unlock(&inv->lock);
    /* Outside the lock: the charger reads DRA objects back through inv_dra_get. */
    return fn ? fn(ctx, pod, obj) : 0;
}

int64_t inv_charge(struct inventory *inv, const struct jf_node *obj)
{
    return charge_of(inv, NULL, obj);
}

int64_t inv_charge_pod(struct inventory *inv, const struct inf_pod *pod)
{
    return charge_of(inv, pod, NULL);
}

/* ---- records and sums --------------------------------------------------- */

/* The sums a record adds to: "ns", "ns\x1f" class and "ns\x1e" pool. */
static void add_sum(struct state *st, const struct record *r, int64_t delta)
{
    char key[512];
    struct slot *s = map_put(&st->sums, r->ns);
    if (s)
        s->value += delta;
    if (*r->cls) {
        snprintf(key, sizeof(key), "%s\x1f%s", r->ns, r->cls);
        if ((s = map_put(&st->sums, key)))
            s->value += delta;
    }
    if (*r->pool) {
        snprintf(key, sizeof(key), "%s\x1e%s", r->ns, r->pool);
        if ((s = map_put(&st->sums, key)))
            s->value += delta;
    }
}

static const char *meta_string(const json_t *obj, const char *key)
{
    const char *s = json_string_value(json_object_get(json_object_get(obj, "metadata"), key));
    return s ? s : "";
}

/* ---- pods seen gone: what the quota controller asks of a ledger entry ----- */

#define GONE_TTL_MS (10 * 60 * 1000) /* well above the ledger's bound on unseen entries */
#define GONE_MAX 200000

/* Remember that the pod of uid was deleted or finished (inv->lock held). */
static void note_gone(struct inventory *inv, const char *uid)
{
    if (!*uid)
        return;
    int64_t now = gg_now_us() / 1000;
    if (inv->gone.used >= GONE_MAX) { /* the oldest first would need order: forget them all */
        map_clear(&inv->gone, false);
        log_fields(LOG_WARN,
                   "inventory: forgot the pods seen gone (too many); ledger entries "
                   "for them wait for their bound",
                   json_pack("{s:i}", "max", GONE_MAX));
    }
    struct slot *s = map_put(&inv->gone, uid);
    if (s)
        s->value = now;
}

bool inv_pod_holding(struct inventory *inv, const char *uid)
{
    pthread_mutex_lock(&inv->lock);
    bool holding = map_find(&inv->st.pods, uid) != NULL;
    pthread_mutex_unlock(&inv->lock);
    return holding;
}

enum inv_pod_seen inv_pod_seen(struct inventory *inv, const char *uid)
{
    pthread_mutex_lock(&inv->lock);
    enum inv_pod_seen seen = INV_POD_UNSEEN;
    struct slot *s;
    if (map_find(&inv->st.pods, uid))
        seen = INV_POD_HOLDING;
    else if ((s = map_find(&inv->gone, uid)) && gg_now_us() / 1000 - s->value < GONE_TTL_MS)
        seen = INV_POD_GONE;
    pthread_mutex_unlock(&inv->lock);
    if (seen != INV_POD_UNSEEN)
        return seen;
    /* A ResourceClaim charged on its own (kept by kind and name: its uid is looked for). */
    pthread_mutex_lock(&inv->dra_lock);
    for (size_t i = 0; seen == INV_POD_UNSEEN && i < inv->dra.cap; i++) {
        const struct dra_entry *d = inv->dra.slots[i].ptr;
        if (inv->dra.slots[i].key && d->charge > 0 && strcmp(meta_string(d->obj, "uid"), uid) == 0)
            seen = INV_POD_HOLDING;
    }
    pthread_mutex_unlock(&inv->dra_lock);
    return seen;
}

enum obj_kind { K_POD, K_CLAIM, K_TEMPLATE, K_CLASS, K_SLICE, K_QUOTA, K_OTHER };

/* Objects without a kind are pods (the informer's trimmed pods carry none). */
static enum obj_kind kind_of(const json_t *obj)
{
    const char *kind = json_string_value(json_object_get(obj, "kind"));
    if (!kind || strcmp(kind, "Pod") == 0)
        return K_POD;
    if (strcmp(kind, "ResourceClaim") == 0)
        return K_CLAIM;
    if (strcmp(kind, "DeviceClass") == 0)
        return K_CLASS;
    if (strcmp(kind, "ResourceSlice") == 0)
        return K_SLICE;
    if (strcmp(kind, "GPUQuota") == 0)
        return K_QUOTA;
    return strcmp(kind, "ResourceClaimTemplate") == 0 ? K_TEMPLATE : K_OTHER;
}

/* Whether a pod holds devices: pods that Succeeded or Failed hold none. */
static bool counts(const struct inf_pod *pod)
{
    return strcmp(pod->phase, "Succeeded") != 0 && strcmp(pod->phase, "Failed") != 0;
}

/* The charge a pod holds, from the charger, outside every lock. */
static int64_t pod_holding(struct inventory *inv, const struct inf_pod *pod)
{
    return *pod->uid && counts(pod) ? charge_of(inv, pod, NULL) : 0;
}

/* The charge a ResourceClaim holds on its own, from the charger, outside every lock. */
static int64_t claim_holding(struct inventory *inv, const json_t *claim)
{
    if (!*meta_string(claim, "uid"))
        return 0;
    struct jf_doc doc;
    if (jf_from_json(claim, &doc) != 0)
        return 1000; /* out of memory, so no nodes for the charger: one GPU, as it would count */
    int64_t charge = inv_charge(inv, doc.root);
    jf_doc_free(&doc);
    return charge;
}

/* Whether the object (namespace, uid, name) is the one reservation r was made for. */
static bool reserved_for(const struct reservation *r, const char *ns, const char *uid,
                         const char *name)
{
    if (*r->uid)
        return strcmp(r->uid, uid) == 0;
    return *r->name && strcmp(r->ns, ns) == 0 && strcmp(r->name, name) == 0;
}

/* A pod (or claim) the watch shows settles the reservation made when it was admitted. */
static void settle_reservation(struct inventory *inv, const char *ns, const char *uid,
                               const char *name)
{
    for (size_t i = 0; i < inv->n_res; i++) {
        if (reserved_for(&inv->res[i], ns, uid, name)) {
            drop_reservation(inv, i);
            return;
        }
    }
}

/* a, sep and b into out (size bytes): false, and out unusable, when they do not fit. */
static bool join(char *out, size_t size, const char *a, char sep, const char *b)
{
    size_t na = strlen(a), nb = strlen(b);
    if (na + nb + 2 > size)
        return false;
    memcpy(out, a, na);
    out[na] = sep;
    memcpy(out + na + 1, b, nb + 1);
    return true;
}

/* st's copy of s, held once more; NULL when out of memory.  A million pods hold a few
 * thousand namespaces, pools and controllers. */
static const char *intern(struct state *st, const char *s)
{
    struct slot *slot = map_put(&st->strings, s);
    if (!slot)
        return NULL;
    slot->value++;
    return slot->key;
}

/* Held once less: freed with its last holder (NULL: nothing). */
static void release(struct state *st, const char *s)
{
    struct slot *slot = s ? map_find(&st->strings, s) : NULL;
    if (slot && --slot->value == 0)
        map_remove(&st->strings, slot);
}

static void free_record(struct state *st, struct record *r)
{
    release(st, r->ns);
    release(st, r->cls);
    release(st, r->pool);
    release(st, r->owner);
    free(r);
}

static void state_remove(struct state *st, const char *uid)
{
    struct slot *s = map_find(&st->pods, uid);
    if (!s)
        return;
    struct record *r = s->ptr;
    add_sum(st, r, -r->charge);
    free_record(st, r);
    map_remove(&st->pods, s);
}

const json_t *inv_controller_ref(const json_t *obj)
{
    size_t i;
    const json_t *ref;
    json_array_foreach(json_object_get(json_object_get(obj, "metadata"), "ownerReferences"), i, ref)
    {
        const char *kind = json_string_value(json_object_get(ref, "kind")),
                   *name = json_string_value(json_object_get(ref, "name"));
        if (json_is_true(json_object_get(ref, "controller")) && kind && *kind && name && *name)
            return ref;
    }
    return NULL;
}

char *inv_controller(const json_t *obj)
{
    const json_t *ref = inv_controller_ref(obj);
    char *out;
    if (!ref)
        return strdup("");
    return asprintf(&out, "%s/%s", json_string_value(json_object_get(ref, "kind")),
                    json_string_value(json_object_get(ref, "name"))) < 0
               ? NULL
               : out;
}

/* Record what a pod holds (replacing the record of its uid); true when it holds GPUs. */
static bool state_add(struct state *st, const struct inf_pod *pod, int64_t charge)
{
    if (!*pod->uid)
        return false;
    state_remove(st, pod->uid);
    if (charge <= 0)
        return false;
    size_t name_size = strlen(pod->name) + 1;
    struct record *r = calloc(1, sizeof(*r) + name_size);
    struct slot *s = r ? map_put(&st->pods, pod->uid) : NULL;
    if (!s) {
        free(r);
        return false;
    }
    char owner[2 * INF_SCAN_KEY_MAX];
    if (!*pod->owner_kind || !join(owner, sizeof(owner), pod->owner_kind, '/', pod->owner_name))
        *owner = '\0';
    memcpy(r->name, pod->name, name_size);
    r->ns = intern(st, pod->ns);
    r->cls = intern(st, pod->cls);
    r->pool = intern(st, pod->pool);
    r->owner = intern(st, owner);
    r->charge = charge;
    s->ptr = r;
    if (!r->ns || !r->cls || !r->pool || !r->owner) {
        map_remove(&st->pods, s);
        free_record(st, r);
        return false;
    }
    add_sum(st, r, charge);
    return true;
}

/* ---- DRA objects (ResourceClaims, ResourceClaimTemplates, DeviceClasses) --
 *
 * Apart from the pods, under their own lock: a pod relist never touches them,
 * and each kind is relisted on its own (inv_dra_relist_begin/end).  A claim
 * charged on its own adds to the sums of dra_sums.  A DeviceClass holds no
 * charge; it tells the charge model whether its devices are GPUs.  A
 * ResourceSlice is kept as the names of its devices, and each device as an
 * entry of kind "Device" named by "<driver>/<pool>" and its name, with its
 * attributes: what a claim's allocation result names, the charge model looks
 * up.  A slice's devices come and go with it.
 */

static const char CLASS_PREFIX[] = "DeviceClass\x1f";

/* Whether a key of inv->dra is a DeviceClass's. */
static bool class_key(const char *key)
{
    return strncmp(key, CLASS_PREFIX, sizeof(CLASS_PREFIX) - 1) == 0;
}

static bool dra_key(char *key, size_t size, const char *kind, const char *ns, const char *name)
{
    return (size_t)snprintf(key, size, "%s\x1f%s\x1f%s", kind, ns, name) < size;
}

/* Of an allocated claim's status, the devices allocated: what the charge model reads. */
static json_t *allocation_trim(const json_t *obj)
{
    const json_t *results = json_object_get(
        json_object_get(json_object_get(json_object_get(obj, "status"), "allocation"), "devices"),
        "results");
    if (!json_is_array(results))
        return NULL;
    json_t *kept = json_array();
    size_t i;
    const json_t *r;
    json_array_foreach(results, i, r)
    {
        json_t *one = json_object();
        static const char *const keys[] = {"request", "driver", "pool", "device", "adminAccess"};
        for (size_t k = 0; k < sizeof(keys) / sizeof(keys[0]); k++) {
            json_t *v = json_object_get(r, keys[k]);
            if (v)
                json_object_set_new(one, keys[k], json_deep_copy(v));
        }
        json_array_append_new(kept, one);
    }
    return json_pack("{s:{s:{s:o}}}", "allocation", "devices", "results", kept);
}

/* What the charge model reads of a claim, template or class: no managedFields, of the status
 * only a claim's allocation. */
static json_t *dra_trim(const json_t *obj)
{
    const json_t *meta = json_object_get(obj, "metadata");
    json_t *m = json_object(), *out = json_object();
    static const char *const keys[] = {"namespace", "name", "uid", "annotations"};
    for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++) {
        json_t *v = json_object_get(meta, keys[i]);
        if (v)
            json_object_set_new(m, keys[i], json_deep_copy(v));
    }
    json_object_set_new(out, "metadata", m);
    static const char *const top[] = {"apiVersion", "kind", "spec"};
    for (size_t i = 0; i < sizeof(top) / sizeof(top[0]); i++) {
        json_t *v = json_object_get(obj, top[i]);
        if (v)
            json_object_set_new(out, top[i], json_deep_copy(v));
    }
    json_t *allocation = allocation_trim(obj);
    if (allocation)
        json_object_set_new(out, "status", allocation);
    return out;
}

static const char DEVICE_PREFIX[] = "Device\x1f";

/* The key of a slice's device: "Device\x1f<driver>/<pool>\x1f<device>". */
static bool device_key(char *key, size_t size, const json_t *slice_spec, const json_t *device)
{
    const char *driver = json_string_value(json_object_get(slice_spec, "driver"));
    const char *pool =
        json_string_value(json_object_get(json_object_get(slice_spec, "pool"), "name"));
    const char *name = json_string_value(json_object_get(device, "name"));
    return driver && pool && name &&
           (size_t)snprintf(key, size, "%s%s/%s\x1f%s", DEVICE_PREFIX, driver, pool, name) < size;
}

/* Under dra_lock: put each device of a slice's spec as an entry of its own. */
static void devices_put(struct inventory *inv, const json_t *spec, uint64_t seen)
{
    size_t i;
    const json_t *dev;
    json_array_foreach(json_object_get(spec, "devices"), i, dev)
    {
        char key[1024];
        struct dra_entry *d = device_key(key, sizeof(key), spec, dev) ? malloc(sizeof(*d)) : NULL;
        if (!d)
            continue;
        json_t *attributes = json_object_get(dev, "attributes");
        *d = (struct dra_entry){json_pack("{s:s,s:O?}", "kind", "Device", "attributes", attributes),
                                seen, 0};
        struct slot *s = map_find(&inv->dra, key);
        if (s) {
            free_dra_entry(s->ptr);
            s->ptr = d;
        } else if (d->obj && (s = map_put(&inv->dra, key))) {
            s->ptr = d;
        } else {
            free_dra_entry(d);
        }
    }
}

/* Under dra_lock: drop the device entries of a kept slice (or of anything else: none). */
static void devices_drop(struct inventory *inv, const json_t *kept)
{
    const json_t *spec = json_object_get(kept, "spec");
    size_t i;
    const json_t *dev;
    json_array_foreach(json_object_get(spec, "devices"), i, dev)
    {
        char key[1024];
        struct slot *s = device_key(key, sizeof(key), spec, dev) ? map_find(&inv->dra, key) : NULL;
        if (s) {
            free_dra_entry(s->ptr);
            map_remove(&inv->dra, s);
        }
    }
}

/* What is kept of a slice: its driver, pool and the names of its devices. */
static json_t *slice_trim(const json_t *obj)
{
    const json_t *spec = json_object_get(obj, "spec");
    json_t *names = json_array();
    size_t i;
    const json_t *dev;
    json_array_foreach(json_object_get(spec, "devices"), i, dev)
        json_array_append_new(names, json_pack("{s:O?}", "name", json_object_get(dev, "name")));
    return json_pack("{s:s,s:{s:O?},s:{s:O?,s:O?,s:o}}", "kind", "ResourceSlice", "metadata",
                     "name", json_object_get(json_object_get(obj, "metadata"), "name"), "spec",
                     "driver", json_object_get(spec, "driver"), "pool",
                     json_object_get(spec, "pool"), "devices", names);
}

/* Under dra_lock: drop the entry of a slot, its charge and a slice's devices with it. */
static void dra_drop(struct inventory *inv, struct slot *s)
{
    struct dra_entry *d = s->ptr;
    if (d->charge) {
        struct slot *sum = map_find(&inv->dra_sums, meta_string(d->obj, "namespace"));
        if (sum)
            sum->value -= d->charge;
    }
    inv->dra_version++;
    map_remove(&inv->dra, s); /* first: dropping the devices moves entries around */
    devices_drop(inv, d->obj);
    free_dra_entry(d);
}

/* Keep (or replace) a claim or template that holds charge; seen: the relist showing it. */
static void dra_put(struct inventory *inv, const json_t *obj, uint64_t seen, int64_t charge)
{
    char key[1024];
    const char *kind = json_string_value(json_object_get(obj, "kind"));
    const char *ns = meta_string(obj, "namespace");
    if (!dra_key(key, sizeof(key), kind, ns, meta_string(obj, "name")))
        return;
    struct dra_entry *d = malloc(sizeof(*d));
    if (!d)
        return;
    bool slice = kind_of(obj) == K_SLICE;
    bool in_request = arena_pause(); /* kept beyond the request that may be running */
    *d = (struct dra_entry){slice ? slice_trim(obj) : dra_trim(obj), seen, charge};
    pthread_mutex_lock(&inv->dra_lock);
    if (!seen)
        d->seen = inv->dra_relist;
    struct slot *s = map_find(&inv->dra, key);
    if (class_key(key) &&
        (!s || !json_equal(json_object_get(((struct dra_entry *)s->ptr)->obj, "spec"),
                           json_object_get(d->obj, "spec"))))
        inv->class_changes++;
    if (s)
        dra_drop(inv, s); /* moves the version */
    else
        inv->dra_version++;
    struct slot *sum = charge ? map_put(&inv->dra_sums, ns) : NULL;
    if (charge && !sum)
        d->charge = 0; /* out of memory: counted nowhere, so never subtracted */
    if (sum)
        sum->value += charge;
    if ((s = map_put(&inv->dra, key))) {
        s->ptr = d;
        if (slice)
            devices_put(inv, json_object_get(obj, "spec"), d->seen);
    } else if (sum) {
        sum->value -= charge;
        free_dra_entry(d);
    } else {
        free_dra_entry(d);
    }
    pthread_mutex_unlock(&inv->dra_lock);
    arena_resume(in_request);
}

static void dra_remove(struct inventory *inv, const json_t *obj)
{
    char key[1024];
    const char *kind = json_string_value(json_object_get(obj, "kind"));
    if (!dra_key(key, sizeof(key), kind, meta_string(obj, "namespace"), meta_string(obj, "name")))
        return;
    pthread_mutex_lock(&inv->dra_lock);
    struct slot *s = map_find(&inv->dra, key);
    if (s && class_key(key))
        inv->class_changes++;
    if (s)
        dra_drop(inv, s);
    pthread_mutex_unlock(&inv->dra_lock);
}

uint64_t inv_class_changes(struct inventory *inv)
{
    pthread_mutex_lock(&inv->dra_lock);
    uint64_t n = inv->class_changes;
    pthread_mutex_unlock(&inv->dra_lock);
    return n;
}

uint64_t inv_dra_version(struct inventory *inv)
{
    pthread_mutex_lock(&inv->dra_lock);
    uint64_t v = inv->dra_version;
    pthread_mutex_unlock(&inv->dra_lock);
    return v;
}

uint64_t inv_dra_relist_begin(struct inventory *inv)
{
    pthread_mutex_lock(&inv->dra_lock);
    uint64_t relist = ++inv->dra_relist;
    pthread_mutex_unlock(&inv->dra_lock);
    return relist;
}

/* A claim the API server shows settles the reservation made when it was admitted. */
static void settle_claim(struct inventory *inv, const json_t *claim)
{
    pthread_mutex_lock(&inv->lock);
    settle_reservation(inv, meta_string(claim, "namespace"), meta_string(claim, "uid"),
                       meta_string(claim, "name"));
    pthread_mutex_unlock(&inv->lock);
}

void inv_dra_add(struct inventory *inv, const json_t *obj, uint64_t relist)
{
    enum obj_kind k = kind_of(obj);
    if (k == K_QUOTA)
        gq_store_put(inv->quotas, obj, relist);
    else if (k == K_CLASS || k == K_SLICE)
        dra_put(inv, obj, relist, 0);
    else if (k == K_CLAIM || k == K_TEMPLATE)
        dra_put(inv, obj, relist, k == K_CLAIM ? claim_holding(inv, obj) : 0);
    if (k == K_CLAIM)
        settle_claim(inv, obj);
}

void inv_dra_relist_end(struct inventory *inv, const char *kind, uint64_t relist)
{
    if (!kind || strcmp(kind, "GPUQuota") == 0)
        gq_store_relist_end(inv->quotas, relist);
    if (kind && strcmp(kind, "GPUQuota") == 0)
        return;
    size_t n = strlen(kind ? kind : "");
    pthread_mutex_lock(&inv->dra_lock);
    /* The keys first, then the removals: a removal moves entries around the table. */
    char **doomed = calloc(inv->dra.used + 1, sizeof(*doomed));
    size_t count = 0;
    for (size_t i = 0; doomed && i < inv->dra.cap; i++) {
        const struct slot *s = &inv->dra.slots[i];
        if (s->key && ((struct dra_entry *)s->ptr)->seen < relist &&
            strncmp(s->key, DEVICE_PREFIX, sizeof(DEVICE_PREFIX) - 1) != 0 && /* go with slices */
            (!kind || (strncmp(s->key, kind, n) == 0 && s->key[n] == '\x1f')))
            doomed[count++] = s->key;
    }
    for (size_t i = 0; i < count; i++) {
        struct slot *s = map_find(&inv->dra, doomed[i]);
        if (s && class_key(doomed[i]))
            inv->class_changes++;
        if (s)
            dra_drop(inv, s);
    }
    free(doomed);
    pthread_mutex_unlock(&inv->dra_lock);
}

json_t *inv_dra_get(struct inventory *inv, const char *kind, const char *ns, const char *name,
                    int64_t deadline_us, struct gg_err *err)
{
    char key[1024];
    if (!dra_key(key, sizeof(key), kind, ns, name))
        return NULL;
    pthread_mutex_lock(&inv->dra_lock);
    struct slot *s = map_find(&inv->dra, key);
    json_t *copy = s ? json_deep_copy(((struct dra_entry *)s->ptr)->obj) : NULL;
    inv_fetch_fn fetch = inv->fetch;
    void *ctx = inv->fetch_ctx;
    pthread_mutex_unlock(&inv->dra_lock);
    if (s && !copy) { /* kept but not copied: "absent" would pass a claim its checks deny */
        gg_fail(err, GG_ERR_NOMEM, "out of memory reading %s %s/%s", kind, ns, name);
        return NULL;
    }
    if (copy || !fetch || strcmp(kind, "ResourceClaimTemplate") != 0)
        return copy;
    /* A template applied with its pod may not have reached the watch yet: ask for it (outside
     * the request's arena: the answer is kept, and handed back to a caller who frees it). */
    pthread_mutex_lock(&inv->dra_lock);
    inv->dra_version++; /* an answer the inventory did not hold, whatever it is */
    pthread_mutex_unlock(&inv->dra_lock);
    bool in_request = arena_pause();
    json_t *got = fetch(ctx, kind, ns, name, deadline_us, err);
    if (got)
        inv_upsert(inv, got);
    arena_resume(in_request);
    return got;
}

void inv_set_fetcher(struct inventory *inv, inv_fetch_fn fn, void *ctx)
{
    pthread_mutex_lock(&inv->dra_lock);
    inv->fetch = fn;
    inv->fetch_ctx = ctx;
    pthread_mutex_unlock(&inv->dra_lock);
}

size_t inv_dra_count(struct inventory *inv)
{
    pthread_mutex_lock(&inv->dra_lock);
    size_t n = inv->dra.used;
    pthread_mutex_unlock(&inv->dra_lock);
    return n;
}

static int64_t dra_usage(struct inventory *inv, const char *ns)
{
    pthread_mutex_lock(&inv->dra_lock);
    struct slot *s = map_find(&inv->dra_sums, ns);
    int64_t used = s ? s->value : 0;
    pthread_mutex_unlock(&inv->dra_lock);
    return used;
}

/* A pod object read as the informer reads pods; false (logged) when it is not one. */
static bool read_pod(const json_t *obj, struct inf_pod *pod)
{
    struct gg_err err = {{0}};
    if (inf_pod_of_json(obj, pod, &err))
        return true;
    log_fields(LOG_WARN, "inventory: an object that is not a pod skipped",
               json_pack("{s:s,s:s}", "error", err.msg, "uid", meta_string(obj, "uid")));
    return false;
}

void inv_upsert(struct inventory *inv, const json_t *obj)
{
    enum obj_kind k = kind_of(obj);
    if (k == K_OTHER)
        return;
    if (k == K_QUOTA) {
        gq_store_put(inv->quotas, obj, 0);
        return;
    }
    if (k != K_POD) {
        dra_put(inv, obj, 0, k == K_CLAIM ? claim_holding(inv, obj) : 0);
        if (k == K_CLAIM)
            settle_claim(inv, obj);
        return;
    }
    struct inf_pod pod;
    inf_pod_init(&pod);
    if (read_pod(obj, &pod))
        inv_upsert_pod(inv, &pod);
    inf_pod_free(&pod);
}

void inv_upsert_pod(struct inventory *inv, const struct inf_pod *pod)
{
    if (!*pod->uid)
        return;
    int64_t charge = pod_holding(inv, pod);
    pthread_mutex_lock(&inv->lock);
    settle_reservation(inv, pod->ns, pod->uid, pod->name);
    state_add(&inv->st, pod, charge);
    if (!counts(pod))
        note_gone(inv, pod->uid);
    pthread_mutex_unlock(&inv->lock);
}

void inv_delete(struct inventory *inv, const json_t *obj)
{
    enum obj_kind k = kind_of(obj);
    if (k == K_QUOTA) {
        gq_store_delete(inv->quotas, obj);
        return;
    }
    if (k != K_POD) {
        dra_remove(inv, obj);
        return;
    }
    inv_delete_pod(inv, meta_string(obj, "uid"));
}

void inv_delete_pod(struct inventory *inv, const char *uid)
{
    pthread_mutex_lock(&inv->lock);
    state_remove(&inv->st, uid);
    note_gone(inv, uid);
    pthread_mutex_unlock(&inv->lock);
}

/* ---- relists: a new state built aside, then swapped in ------------------- */

struct inv_stage {
    struct inventory *inv; /* its charger */
    struct state st;
    struct map names; /* the uids and "ns\x1f" "name" of the GPU pods */
    size_t seen;
};

struct inv_stage *inv_stage_new(struct inventory *inv)
{
    struct inv_stage *stage = calloc(1, sizeof(struct inv_stage));
    if (!stage)
        return NULL;
    stage->inv = inv;
    return stage;
}

void inv_stage_free(struct inv_stage *stage)
{
    if (!stage)
        return;
    state_clear(&stage->st);
    map_clear(&stage->names, false);
    free(stage);
}

/* The key of a namespace's name in a stage's names (a uid has no \x1f). */
static bool name_key(char *key, size_t size, const char *ns, const char *name)
{
    return *name && join(key, size, ns, '\x1f', name);
}

static void stage_name(struct inv_stage *stage, const char *ns, const char *name)
{
    char key[512];
    if (name_key(key, sizeof(key), ns, name))
        map_put(&stage->names, key);
}

/* Whether the stage holds the pod reservation r was made for. */
static bool stage_settles(struct inv_stage *stage, const struct reservation *r)
{
    char key[512];
    if (*r->uid)
        return map_find(&stage->names, r->uid) != NULL;
    return name_key(key, sizeof(key), r->ns, r->name) && map_find(&stage->names, key);
}

void inv_stage_add_pod(struct inv_stage *stage, const struct inf_pod *pod)
{
    stage->seen++;
    if (!state_add(&stage->st, pod, pod_holding(stage->inv, pod)))
        return;
    /* Only a pod that holds GPUs can settle a reservation. */
    stage_name(stage, pod->ns, pod->name);
    map_put(&stage->names, pod->uid);
}

void inv_stage_add(struct inv_stage *stage, const json_t *pod)
{
    struct inf_pod p;
    inf_pod_init(&p);
    if (kind_of(pod) == K_POD && read_pod(pod, &p))
        inv_stage_add_pod(stage, &p);
    else
        stage->seen++;
    inf_pod_free(&p);
}

size_t inv_stage_pods(const struct inv_stage *stage)
{
    return stage->st.pods.used;
}

void inv_stage_commit(struct inventory *inv, struct inv_stage *stage)
{
    struct state old;
    pthread_mutex_lock(&inv->lock);
    old = inv->st;
    inv->st = stage->st;
    for (size_t i = 0; i < inv->n_res;) {
        if (stage_settles(stage, &inv->res[i]))
            drop_reservation(inv, i);
        else
            i++;
    }
    pthread_mutex_unlock(&inv->lock);
    memset(&stage->st, 0, sizeof(stage->st));
    state_clear(&old);
    inv_stage_free(stage);
}

void inv_replace(struct inventory *inv, const json_t *items)
{
    struct inv_stage *stage = inv_stage_new(inv);
    if (!stage)
        return;
    uint64_t relist = inv_dra_relist_begin(inv);
    size_t i;
    json_t *obj;
    /* Classes, slices and templates first, in whatever order the list holds them: claims' and
     * pods' charges read them. */
    json_array_foreach(items, i, obj) if (kind_of(obj) == K_CLASS) inv_dra_add(inv, obj, relist);
    json_array_foreach(items, i, obj) if (kind_of(obj) == K_SLICE) inv_dra_add(inv, obj, relist);
    json_array_foreach(items, i, obj) if (kind_of(obj) == K_TEMPLATE) inv_dra_add(inv, obj, relist);
    json_array_foreach(items, i, obj) if (kind_of(obj) == K_CLAIM) inv_dra_add(inv, obj, relist);
    json_array_foreach(items, i, obj) if (kind_of(obj) == K_QUOTA) inv_dra_add(inv, obj, relist);
    json_array_foreach(items, i, obj) inv_stage_add(stage, obj);
    inv_stage_commit(inv, stage);
    inv_dra_relist_end(inv, NULL, relist);
}

static bool grow_reservations(struct inventory *inv)
{
    if (inv->n_res < inv->cap_res)
        return true;
    size_t cap = inv->cap_res ? inv->cap_res * 2 : 16;
    struct reservation *res = realloc(inv->res, cap * sizeof(*res));
    if (!res)
        return false;
    inv->res = res;
    inv->cap_res = cap;
    return true;
}

uint64_t inv_reserve(struct inventory *inv, const struct inv_hold *h, int64_t ttl_ms)
{
    struct reservation r = {strdup(h->ns),
                            strdup(h->uid ? h->uid : ""),
                            strdup(h->name ? h->name : ""),
                            strdup(h->cls ? h->cls : ""),
                            strdup(h->pool ? h->pool : ""),
                            h->charge,
                            (gg_now_us() / 1000) + ttl_ms,
                            0};
    pthread_mutex_lock(&inv->lock);
    bool kept = r.ns && r.uid && r.name && r.cls && r.pool && grow_reservations(inv);
    if (kept) {
        r.seq = ++inv->next_seq;
        inv->res[inv->n_res++] = r;
    }
    pthread_mutex_unlock(&inv->lock);
    if (!kept) {
        free(r.ns);
        free(r.uid);
        free(r.name);
        free(r.cls);
        free(r.pool);
    }
    return r.seq;
}

void inv_unreserve(struct inventory *inv, uint64_t seq)
{
    pthread_mutex_lock(&inv->lock);
    for (size_t i = 0; i < inv->n_res; i++) {
        if (inv->res[i].seq == seq) {
            drop_reservation(inv, i);
            break;
        }
    }
    pthread_mutex_unlock(&inv->lock);
}

void inv_read_before(uint64_t seq)
{
    reading_before = seq;
}

void inv_read_without(const char *uid)
{
    reading_without = uid;
}

/* The sum at key and the reservations of ns matching cls, or pool (either NULL or "": any);
 * inv->lock held. */
static int64_t usage_at(struct inventory *inv, const char *key, const char *ns, const char *cls,
                        const char *pool)
{
    struct slot *s = map_find(&inv->st.sums, key);
    int64_t used = s ? s->value : 0;
    const struct slot *self = reading_without ? map_find(&inv->st.pods, reading_without) : NULL;
    const struct record *own = s && self ? self->ptr : NULL; /* in this sum, when it has one */
    if (own && strcmp(own->ns, ns) == 0 && (!cls || !*cls || strcmp(own->cls, cls) == 0) &&
        (!pool || strcmp(own->pool, pool) == 0))
        used -= own->charge;
    int64_t now = (gg_now_us() / 1000);
    for (size_t i = 0; i < inv->n_res;) {
        struct reservation *r = &inv->res[i];
        if (r->expires_ms <= now) { /* never seen: a later webhook denied it */
            drop_reservation(inv, i);
            continue;
        }
        if (strcmp(r->ns, ns) == 0 && (!cls || !*cls || strcmp(r->cls, cls) == 0) &&
            (!pool || !*pool || strcmp(r->pool, pool) == 0) &&
            (!reading_before || r->seq < reading_before))
            used += r->charge;
        i++;
    }
    return used;
}

int64_t inv_usage(struct inventory *inv, const char *ns, const char *cls)
{
    char key[512];
    if (cls && *cls)
        snprintf(key, sizeof(key), "%s\x1f%s", ns, cls);
    pthread_mutex_lock(&inv->lock);
    int64_t used = usage_at(inv, cls && *cls ? key : ns, ns, cls, NULL);
    pthread_mutex_unlock(&inv->lock);
    return cls && *cls ? used : used + dra_usage(inv, ns); /* claims have no class */
}

int64_t inv_pool_usage(struct inventory *inv, const char *ns, const char *pool)
{
    char key[512];
    snprintf(key, sizeof(key), "%s\x1e%s", ns, pool);
    pthread_mutex_lock(&inv->lock);
    int64_t used = usage_at(inv, key, ns, NULL, pool);
    pthread_mutex_unlock(&inv->lock);
    return used;
}

int64_t inv_held(struct inventory *inv, const char *ns, const char *pool)
{
    char key[512];
    if (pool)
        snprintf(key, sizeof(key), "%s\x1e%s", ns, pool);
    pthread_mutex_lock(&inv->lock);
    struct slot *s = map_find(&inv->st.sums, pool ? key : ns);
    int64_t held = s ? s->value : 0;
    pthread_mutex_unlock(&inv->lock);
    return pool ? held : held + dra_usage(inv, ns);
}

json_t *inv_quota(struct inventory *inv, const char *ns, size_t *count)
{
    return gq_store_get(inv->quotas, ns, count);
}

size_t inv_quota_count(struct inventory *inv, const char *ns)
{
    return gq_store_count(inv->quotas, ns);
}

json_t *inv_quotas(struct inventory *inv)
{
    return gq_store_all(inv->quotas);
}

size_t inv_pod_count(struct inventory *inv)
{
    pthread_mutex_lock(&inv->lock);
    size_t n = inv->st.pods.used;
    pthread_mutex_unlock(&inv->lock);
    return n;
}

void inv_clear_reservations(struct inventory *inv)
{
    pthread_mutex_lock(&inv->lock);
    clear_reservations(inv);
    pthread_mutex_unlock(&inv->lock);
}

static int by_namespace(const void *a, const void *b)
{
    return strcmp(((const struct inv_ns_usage *)a)->ns, ((const struct inv_ns_usage *)b)->ns);
}

/* Add the per-namespace sums of from (keys without a class) into to. */
static void merge_sums(struct map *to, const struct map *from)
{
    for (size_t i = 0; i < from->cap; i++) {
        const struct slot *s = &from->slots[i];
        struct slot *t = s->key && !strchr(s->key, '\x1f') ? map_put(to, s->key) : NULL;
        if (t)
            t->value += s->value;
    }
}

size_t inv_usage_by_namespace(struct inventory *inv, struct inv_ns_usage **out)
{
    *out = NULL;
    struct map all = {0};
    pthread_mutex_lock(&inv->lock);
    merge_sums(&all, &inv->st.sums);
    pthread_mutex_unlock(&inv->lock);
    pthread_mutex_lock(&inv->dra_lock);
    merge_sums(&all, &inv->dra_sums);
    pthread_mutex_unlock(&inv->dra_lock);
    size_t n = 0, text = 0;
    for (size_t i = 0; i < all.cap; i++) {
        if (all.slots[i].key) {
            n++;
            text += strlen(all.slots[i].key) + 1;
        }
    }
    struct inv_ns_usage *list = n ? malloc(n * sizeof(*list) + text) : NULL;
    if (list) {
        char *p = (char *)(list + n);
        size_t k = 0;
        for (size_t i = 0; i < all.cap; i++) {
            const struct slot *s = &all.slots[i];
            if (!s->key)
                continue;
            size_t len = strlen(s->key) + 1;
            memcpy(p, s->key, len);
            list[k++] = (struct inv_ns_usage){p, s->value};
            p += len;
        }
    }
    map_clear(&all, false);
    if (!list)
        return 0;
    qsort(list, n, sizeof(*list), by_namespace);
    *out = list;
    return n;
}

void inv_set_ready(struct inventory *inv, bool ready)
{
    pthread_mutex_lock(&inv->lock);
    inv->ready = ready;
    pthread_mutex_unlock(&inv->lock);
}

bool inv_ready(struct inventory *inv)
{
    pthread_mutex_lock(&inv->lock);
    bool ready = inv->ready;
    pthread_mutex_unlock(&inv->lock);
    return ready;
}

enum gg_status inv_read_snapshot(const char *path, json_t **state, size_t counts[MF_STATE_N],
                                 struct gg_err *err)
{
    char *text = NULL;
    size_t len = 0;
    enum gg_status st = gg_read_file(path, MF_MAX_CLUSTER_STATE, &text, &len, err);
    if (st == GG_OK)
        st = mf_cluster_state(text, len, path, state, counts, err);
    free(text);
    if (st == GG_ERR_INVALID) {
        struct gg_err inner = *err;
        return gg_fail(
            err, st,
            "%s (not a pod list: want the JSON of 'kubectl get pods,"
            "resourceclaims,resourceclaimtemplates,deviceclasses,resourceslices,gpuquotas -A "
            "-o json')",
            inner.msg);
    }
    return st;
}

enum gg_status inv_load_snapshot(struct inventory *inv, const char *path, struct gg_err *err)
{
    json_t *state = NULL;
    size_t counts[MF_STATE_N];
    enum gg_status st = inv_read_snapshot(path, &state, counts, err);
    if (st != GG_OK)
        return st;
    inv_replace(inv, json_object_get(state, "items"));
    inv_set_ready(inv, true);
    json_decref(state);
    return GG_OK;
}

void inv_each_owner(struct inventory *inv,
                    void (*fn)(void *ctx, const char *ns, const char *pod, const char *owner),
                    void *ctx)
{
    pthread_mutex_lock(&inv->lock);
    for (size_t i = 0; i < inv->st.pods.cap; i++) {
        const struct record *r = inv->st.pods.slots[i].ptr;
        if (inv->st.pods.slots[i].key && *r->owner)
            fn(ctx, r->ns, r->name, r->owner);
    }
    pthread_mutex_unlock(&inv->lock);
}
