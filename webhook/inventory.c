/*
 * inventory.c - pod records, usage sums and reservations under one mutex.
 *
 * Records live in an open-addressing map keyed by pod uid; usage is kept as
 * running sums per namespace and per namespace/class, so a quota check is
 * two hash lookups whatever the number of pods.  A relist builds a whole new
 * state (records and sums) with no lock held and swaps it in at once, so a
 * quota check never waits for more than a pointer swap.
 */
#include "inventory.h"

#include "quantity.h"

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

struct record {
    char *ns;
    char *cls;
    int64_t charge;
    char *name, *owner; /* the pod's name and its controller's "<kind>/<name>" (or "") */
};

struct reservation {
    char *ns, *name, *cls;
    int64_t charge;
    int64_t expires_ms;
};

/* The pods and their sums: what a relist replaces as a whole. */
struct state {
    struct map pods; /* uid -> record */
    struct map sums; /* "ns" and "ns\x1f" "class" -> milli-GPU */
};

struct inventory {
    pthread_mutex_t lock;
    struct state st;
    struct reservation *res;
    size_t n_res, cap_res;
    bool ready;
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

static void free_record(struct record *r)
{
    if (!r)
        return;
    free(r->ns);
    free(r->cls);
    free(r->name);
    free(r->owner);
    free(r);
}

static void map_clear(struct map *m, bool records)
{
    for (size_t i = 0; i < m->cap; i++) {
        if (!m->slots[i].key)
            continue;
        free(m->slots[i].key);
        if (records)
            free_record(m->slots[i].ptr);
    }
    free(m->slots);
    memset(m, 0, sizeof(*m));
}

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

struct inventory *inv_new(void)
{
    struct inventory *inv = calloc(1, sizeof(*inv));
    if (inv)
        pthread_mutex_init(&inv->lock, NULL);
    return inv;
}

static void clear_reservations(struct inventory *inv)
{
    for (size_t i = 0; i < inv->n_res; i++) {
        free(inv->res[i].ns);
        free(inv->res[i].name);
        free(inv->res[i].cls);
    }
    inv->n_res = 0;
}

static void state_clear(struct state *st)
{
    map_clear(&st->pods, true);
    map_clear(&st->sums, false);
}

void inv_free(struct inventory *inv)
{
    if (!inv)
        return;
    state_clear(&inv->st);
    clear_reservations(inv);
    free(inv->res);
    pthread_mutex_destroy(&inv->lock);
    free(inv);
}

/* ---- charges ---------------------------------------------------------- */

/* Whole units of a quantity value (JSON string or number); 0 when malformed. */
static int64_t units(const json_t *v)
{
    if (json_is_integer(v))
        return json_integer_value(v) > 0 ? json_integer_value(v) : 0;
    int64_t milli;
    if (!json_is_string(v) || qty_parse(json_string_value(v), &milli, NULL, NULL) != GG_OK)
        return 0;
    return milli > 0 ? milli / 1000 : 0;
}

/* milli-GPU of one resource entry, e.g. ("nvidia.com/mig-3g.40gb", 2). */
static int64_t resource_charge(const char *name, int64_t n)
{
    if (strcmp(name, "nvidia.com/gpu") == 0 || strcmp(name, "nvidia.com/gpu.shared") == 0)
        return n * 1000;
    int g, mem;
    if (sscanf(name, "nvidia.com/mig-%dg.%dgb", &g, &mem) == 2 && g > 0) {
        /* A30's profiles are 1g.6gb, 2g.12gb and 4g.24gb: four slices; others have seven. */
        int slices = mem == 6 * g && (g == 1 || g == 2 || g == 4) ? 4 : 7;
        return n * ((g * 1000 + slices - 1) / slices);
    }
    return 0;
}

static int64_t container_charge(const json_t *c)
{
    json_t *res = json_object_get(c, "resources");
    json_t *section = json_object_get(res, "limits");
    if (!section)
        section = json_object_get(res, "requests");
    const char *name;
    json_t *v;
    int64_t total = 0;
    json_object_foreach(section, name, v) total += resource_charge(name, units(v));
    return total;
}

int64_t inv_pod_charge(const json_t *pod)
{
    json_t *meta = json_object_get(pod, "metadata");
    const char *note = json_string_value(
        json_object_get(json_object_get(meta, "annotations"), INV_CHARGE_ANNOTATION));
    if (note) {
        char *end;
        long long v = strtoll(note, &end, 10);
        if (*note && !*end && v >= 0)
            return v;
    }
    json_t *spec = json_object_get(pod, "spec");
    size_t i;
    json_t *c;
    int64_t regular = 0, init = 0;
    json_array_foreach(json_object_get(spec, "containers"), i, c) regular += container_charge(c);
    json_array_foreach(json_object_get(spec, "initContainers"), i, c)
    {
        int64_t charge = container_charge(c);
        init = charge > init ? charge : init;
    }
    return regular > init ? regular : init;
}

/* ---- records and sums --------------------------------------------------- */

static void add_sum(struct state *st, const char *ns, const char *cls, int64_t delta)
{
    char key[512];
    struct slot *s = map_put(&st->sums, ns);
    if (s)
        s->value += delta;
    if (cls && *cls) {
        snprintf(key, sizeof(key), "%s\x1f%s", ns, cls);
        if ((s = map_put(&st->sums, key)))
            s->value += delta;
    }
}

static const char *meta_string(const json_t *pod, const char *key)
{
    const char *s = json_string_value(json_object_get(json_object_get(pod, "metadata"), key));
    return s ? s : "";
}

static bool counts(const json_t *pod)
{
    const char *phase = json_string_value(json_object_get(json_object_get(pod, "status"), "phase"));
    return !phase || (strcmp(phase, "Succeeded") != 0 && strcmp(phase, "Failed") != 0);
}

/* A pod the watch shows settles the reservation made when it was admitted. */
static void settle_reservation(struct inventory *inv, const char *ns, const char *name)
{
    for (size_t i = 0; i < inv->n_res; i++) {
        struct reservation *r = &inv->res[i];
        size_t n = strlen(r->name);
        if (strcmp(r->ns, ns) == 0 && n && strncmp(r->name, name, n) == 0 &&
            (name[n] == '\0' || r->name[n - 1] == '-')) {
            free(r->ns);
            free(r->name);
            free(r->cls);
            inv->res[i] = inv->res[--inv->n_res];
            return;
        }
    }
}

static void state_remove(struct state *st, const char *uid)
{
    struct slot *s = map_find(&st->pods, uid);
    if (!s)
        return;
    struct record *r = s->ptr;
    add_sum(st, r->ns, r->cls, -r->charge);
    free_record(r);
    map_remove(&st->pods, s);
}

/* "<kind>/<name>" of the pod's controller ownerReference, "" when it has none. */
static char *controller_of(const json_t *pod)
{
    size_t i;
    const json_t *ref;
    json_array_foreach(json_object_get(json_object_get(pod, "metadata"), "ownerReferences"), i, ref)
    {
        const char *kind = json_string_value(json_object_get(ref, "kind"));
        const char *name = json_string_value(json_object_get(ref, "name"));
        char *out;
        if (json_is_true(json_object_get(ref, "controller")) && kind && name)
            return asprintf(&out, "%s/%s", kind, name) < 0 ? NULL : out;
    }
    return strdup("");
}

/* Record a pod (replacing the record of its uid); true when it holds GPUs. */
static bool state_add(struct state *st, const json_t *pod)
{
    const char *uid = meta_string(pod, "uid"), *ns = meta_string(pod, "namespace");
    if (!*uid)
        return false;
    state_remove(st, uid);
    int64_t charge = counts(pod) ? inv_pod_charge(pod) : 0;
    if (charge <= 0)
        return false;
    struct record *r = calloc(1, sizeof(*r));
    const char *cls = json_string_value(json_object_get(
        json_object_get(json_object_get(pod, "metadata"), "labels"), INV_CLASS_LABEL));
    struct slot *s = r ? map_put(&st->pods, uid) : NULL;
    if (!s) {
        free(r);
        return false;
    }
    r->ns = strdup(ns);
    r->cls = strdup(cls ? cls : "");
    r->charge = charge;
    r->name = strdup(meta_string(pod, "name"));
    r->owner = controller_of(pod);
    s->ptr = r;
    add_sum(st, r->ns, r->cls, charge);
    return true;
}

static void upsert_locked(struct inventory *inv, const json_t *pod)
{
    if (!*meta_string(pod, "uid"))
        return;
    settle_reservation(inv, meta_string(pod, "namespace"), meta_string(pod, "name"));
    state_add(&inv->st, pod);
}

void inv_upsert(struct inventory *inv, const json_t *pod)
{
    pthread_mutex_lock(&inv->lock);
    upsert_locked(inv, pod);
    pthread_mutex_unlock(&inv->lock);
}

void inv_delete(struct inventory *inv, const json_t *pod)
{
    pthread_mutex_lock(&inv->lock);
    state_remove(&inv->st, meta_string(pod, "uid"));
    pthread_mutex_unlock(&inv->lock);
}

/* ---- relists: a new state built aside, then swapped in ------------------- */

struct inv_stage {
    struct state st;
    struct map names; /* "ns\x1f" "name" and "ns\x1f" "generateName" of the GPU pods */
    size_t seen;
};

struct inv_stage *inv_stage_new(void)
{
    return calloc(1, sizeof(struct inv_stage));
}

void inv_stage_free(struct inv_stage *stage)
{
    if (!stage)
        return;
    state_clear(&stage->st);
    map_clear(&stage->names, false);
    free(stage);
}

static void stage_name(struct inv_stage *stage, const char *ns, const char *name)
{
    char key[512];
    if (*name && (size_t)snprintf(key, sizeof(key), "%s\x1f%s", ns, name) < sizeof(key))
        map_put(&stage->names, key);
}

void inv_stage_add(struct inv_stage *stage, const json_t *pod)
{
    stage->seen++;
    if (!state_add(&stage->st, pod))
        return;
    /* Only a pod that holds GPUs can settle a reservation. */
    const char *ns = meta_string(pod, "namespace");
    stage_name(stage, ns, meta_string(pod, "name"));
    stage_name(stage, ns, meta_string(pod, "generateName"));
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
        struct reservation *r = &inv->res[i];
        char key[512];
        snprintf(key, sizeof(key), "%s\x1f%s", r->ns, r->name);
        if (map_find(&stage->names, key)) {
            free(r->ns);
            free(r->name);
            free(r->cls);
            inv->res[i] = inv->res[--inv->n_res];
            continue;
        }
        i++;
    }
    pthread_mutex_unlock(&inv->lock);
    memset(&stage->st, 0, sizeof(stage->st));
    state_clear(&old);
    inv_stage_free(stage);
}

void inv_replace(struct inventory *inv, const json_t *items)
{
    struct inv_stage *stage = inv_stage_new();
    if (!stage)
        return;
    size_t i;
    json_t *pod;
    json_array_foreach(items, i, pod) inv_stage_add(stage, pod);
    inv_stage_commit(inv, stage);
}

void inv_reserve(struct inventory *inv, const char *ns, const char *name, const char *cls,
                 int64_t charge, int64_t ttl_ms)
{
    pthread_mutex_lock(&inv->lock);
    if (inv->n_res == inv->cap_res) {
        size_t cap = inv->cap_res ? inv->cap_res * 2 : 16;
        struct reservation *res = realloc(inv->res, cap * sizeof(*res));
        if (!res) {
            pthread_mutex_unlock(&inv->lock);
            return;
        }
        inv->res = res;
        inv->cap_res = cap;
    }
    inv->res[inv->n_res++] = (struct reservation){strdup(ns), strdup(name), strdup(cls ? cls : ""),
                                                  charge, now_ms() + ttl_ms};
    pthread_mutex_unlock(&inv->lock);
}

int64_t inv_usage(struct inventory *inv, const char *ns, const char *cls)
{
    char key[512];
    if (cls && *cls)
        snprintf(key, sizeof(key), "%s\x1f%s", ns, cls);
    pthread_mutex_lock(&inv->lock);
    struct slot *s = map_find(&inv->st.sums, cls && *cls ? key : ns);
    int64_t used = s ? s->value : 0;
    int64_t now = now_ms();
    for (size_t i = 0; i < inv->n_res;) {
        struct reservation *r = &inv->res[i];
        if (r->expires_ms <= now) { /* never seen: a later webhook denied it */
            free(r->ns);
            free(r->name);
            free(r->cls);
            inv->res[i] = inv->res[--inv->n_res];
            continue;
        }
        if (strcmp(r->ns, ns) == 0 && (!cls || !*cls || strcmp(r->cls, cls) == 0))
            used += r->charge;
        i++;
    }
    pthread_mutex_unlock(&inv->lock);
    return used;
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

size_t inv_usage_by_namespace(struct inventory *inv, struct inv_ns_usage **out)
{
    *out = NULL;
    pthread_mutex_lock(&inv->lock);
    size_t n = 0, text = 0;
    for (size_t i = 0; i < inv->st.sums.cap; i++) {
        const char *key = inv->st.sums.slots[i].key;
        if (key && !strchr(key, '\x1f')) {
            n++;
            text += strlen(key) + 1;
        }
    }
    struct inv_ns_usage *list = n ? malloc(n * sizeof(*list) + text) : NULL;
    if (list) {
        char *p = (char *)(list + n);
        size_t k = 0;
        for (size_t i = 0; i < inv->st.sums.cap; i++) {
            const struct slot *s = &inv->st.sums.slots[i];
            if (!s->key || strchr(s->key, '\x1f'))
                continue;
            size_t len = strlen(s->key) + 1;
            memcpy(p, s->key, len);
            list[k++] = (struct inv_ns_usage){p, s->value};
            p += len;
        }
    }
    pthread_mutex_unlock(&inv->lock);
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

enum gg_status inv_load_snapshot(struct inventory *inv, const char *path, struct gg_err *err)
{
    json_error_t jerr;
    json_t *doc = json_load_file(path, 0, &jerr);
    if (!doc)
        return gg_fail(err, GG_ERR_PARSE, "%s:%d:%d: %s", path, jerr.line, jerr.column, jerr.text);
    json_t *items = json_object_get(doc, "items");
    enum gg_status st = GG_OK;
    if (!json_is_array(items))
        st = gg_fail(err, GG_ERR_INVALID,
                     "%s: not a pod list (want the output of kubectl get pods -A -o json)", path);
    else {
        inv_replace(inv, items);
        inv_set_ready(inv, true);
    }
    json_decref(doc);
    return st;
}

void inv_each_owner(struct inventory *inv,
                    void (*fn)(void *ctx, const char *ns, const char *pod, const char *owner),
                    void *ctx)
{
    pthread_mutex_lock(&inv->lock);
    for (size_t i = 0; i < inv->st.pods.cap; i++) {
        const struct record *r = inv->st.pods.slots[i].ptr;
        if (inv->st.pods.slots[i].key && r->name && r->owner && *r->owner)
            fn(ctx, r->ns, r->name, r->owner);
    }
    pthread_mutex_unlock(&inv->lock);
}
