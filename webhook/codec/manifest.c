/*
 * manifest.c - the pods Kubernetes manifests hold: each pod template turned
 * into the Pod its controller would create, patches on that Pod mapped back
 * onto the template, and the objects of a cluster-state snapshot checked.
 * The coverage and the rules are documented in manifest.h.
 *
 * Pure: libc and jansson only (YAML comes read by yamldoc); no I/O, no
 * globals.
 */
#include "codec/manifest.h"

#include "codec/jsonpatch.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void mf_yd_limits(struct yd_limits *out)
{
    yd_limits_init(out);
    out->max_bytes = MF_MAX_FILE_BYTES;
    out->max_depth = MF_MAX_DEPTH;
    out->max_nodes = MF_MAX_NODES;
}

/* ---- small helpers ------------------------------------------------------ */

static const char *str_member(const json_t *obj, const char *key)
{
    const char *s = json_string_value(json_object_get(obj, key));
    return s ? s : "";
}

/* base + "/" + the escaped token, malloc'ed. */
static char *ptr_key(const char *base, const char *key)
{
    size_t klen = strlen(key), blen = strlen(base);
    size_t elen = jp_escape(key, klen, NULL, 0);
    char *out = malloc(blen + elen + 2);
    if (!out)
        return NULL;
    memcpy(out, base, blen);
    out[blen] = '/';
    jp_escape(key, klen, out + blen + 1, elen + 1);
    return out;
}

/* base + "/items/" + i, malloc'ed. */
static char *ptr_index(const char *base, size_t i)
{
    char *out = NULL;
    return asprintf(&out, "%s/items/%zu", base, i) < 0 ? NULL : out;
}

/* a + b, malloc'ed. */
static char *concat(const char *a, const char *b)
{
    char *out = NULL;
    return asprintf(&out, "%s%s", a, b) < 0 ? NULL : out;
}

/* A field path for people: prefix and suffix joined with a dot when both are non-empty. */
static char *path_join(const char *prefix, const char *suffix)
{
    char *out = NULL;
    if (!*prefix || !*suffix)
        return concat(prefix, suffix);
    return asprintf(&out, "%s.%s", prefix, suffix) < 0 ? NULL : out;
}

static uint32_t fnv32(const char *s, uint32_t h)
{
    for (; *s; s++) {
        h ^= (unsigned char)*s;
        h *= 16777619u;
    }
    return h;
}

/* Like Kubernetes' pod-template-hash: the decimal FNV-32a of the template
 * spelled in the alphabet of rand.SafeEncodeString. */
static int hash_text(const char *buffer, size_t size, void *data)
{
    uint32_t *h = data;
    for (size_t i = 0; i < size; i++) {
        *h ^= (unsigned char)buffer[i];
        *h *= 16777619u;
    }
    return 0;
}

/* The text is hashed as it is written, without a copy: inside the server's
 * arena (arena.h) a jansson-allocated string could not go to free(). */
static void template_hash(const json_t *tpl, char *out, size_t size)
{
    static const char alphabet[] = "bcdfghjklmnpqrstvwxz2456789";
    uint32_t h = 2166136261u;
    char digits[16];
    if (tpl)
        json_dump_callback(tpl, hash_text, &h, JSON_COMPACT | JSON_SORT_KEYS);
    snprintf(digits, sizeof(digits), "%u", h);
    size_t i;
    for (i = 0; digits[i] && i + 1 < size; i++)
        out[i] = alphabet[(unsigned char)digits[i] % (sizeof(alphabet) - 1)];
    out[i] = '\0';
}

/* A stable uid for an owner, shaped like a UUID. */
static void owner_uid(const char *kind, const char *name, char out[37])
{
    uint32_t a = fnv32(name, fnv32(kind, 2166136261u));
    uint32_t b = fnv32(kind, fnv32(name, a));
    uint32_t c = fnv32("owner", b), d = fnv32("uid", c);
    snprintf(out, 37, "%08x-%04x-4%03x-8%03x-%04x%08x", a, b >> 16, b & 0xfff, c & 0xfff, c >> 16,
             d);
}

/* ---- kinds -------------------------------------------------------------- */

/* Where the one pod template of a built-in kind is, and who owns the pods. */
struct single_kind {
    const char *group;
    const char *kind;
    const char *tpl_ptr;  /* relative to the object; "" for a Pod */
    const char *tpl_path; /* field path for people */
    const char *owner_api;
    const char *owner_kind; /* NULL: no controller; "" the object itself */
};

static const struct single_kind singles[] = {
    {"", "Pod", "", "", NULL, NULL},
    {"", "PodTemplate", "/template", "template", NULL, NULL},
    {"", "ReplicationController", "/spec/template", "spec.template", "v1", ""},
    {"apps", "Deployment", "/spec/template", "spec.template", "apps/v1", "ReplicaSet"},
    {"apps", "ReplicaSet", "/spec/template", "spec.template", "apps/v1", ""},
    {"apps", "StatefulSet", "/spec/template", "spec.template", "apps/v1", ""},
    {"apps", "DaemonSet", "/spec/template", "spec.template", "apps/v1", ""},
    {"extensions", "Deployment", "/spec/template", "spec.template", "apps/v1", "ReplicaSet"},
    {"extensions", "ReplicaSet", "/spec/template", "spec.template", "apps/v1", ""},
    {"extensions", "DaemonSet", "/spec/template", "spec.template", "apps/v1", ""},
    {"batch", "Job", "/spec/template", "spec.template", "batch/v1", ""},
    {"batch", "CronJob", "/spec/jobTemplate/spec/template", "spec.jobTemplate.spec.template",
     "batch/v1", "Job"},
};

/* The API group assumed for a kind when the object has no apiVersion. */
static const struct {
    const char *kind;
    const char *group;
} default_groups[] = {
    {"Pod", ""},
    {"PodTemplate", ""},
    {"ReplicationController", ""},
    {"Deployment", "apps"},
    {"ReplicaSet", "apps"},
    {"StatefulSet", "apps"},
    {"DaemonSet", "apps"},
    {"Job", "batch"},
    {"CronJob", "batch"},
    {"PyTorchJob", "kubeflow.org"},
    {"TFJob", "kubeflow.org"},
    {"MPIJob", "kubeflow.org"},
    {"XGBoostJob", "kubeflow.org"},
    {"PaddleJob", "kubeflow.org"},
    {"JAXJob", "kubeflow.org"},
    {"RayCluster", "ray.io"},
    {"RayJob", "ray.io"},
    {"RayService", "ray.io"},
    {"JobSet", "jobset.x-k8s.io"},
    {"LeaderWorkerSet", "leaderworkerset.x-k8s.io"},
    {"Notebook", "kubeflow.org"},
    {"InferenceService", "serving.kserve.io"},
};

#define N_ELEMS(a) (sizeof(a) / sizeof((a)[0]))

const char *mf_kind_group(const char *kind)
{
    for (size_t i = 0; kind && i < N_ELEMS(default_groups); i++)
        if (strcmp(default_groups[i].kind, kind) == 0)
            return default_groups[i].group;
    return NULL;
}

/* The object's API group into out; false when it cannot be told. */
static bool object_group(const json_t *obj, const char *kind, char *out, size_t size)
{
    const char *av = json_string_value(json_object_get(obj, "apiVersion"));
    if (av) {
        const char *slash = strrchr(av, '/');
        size_t n = slash ? (size_t)(slash - av) : 0;
        if (n >= size)
            return false;
        memcpy(out, av, n);
        out[n] = '\0';
        return true;
    }
    const char *group = mf_kind_group(kind);
    if (group)
        snprintf(out, size, "%s", group);
    return group != NULL;
}

/* ---- collecting --------------------------------------------------------- */

struct collector {
    const char *source;
    size_t doc, number, line;
    size_t objects;
    struct mf_entry *entries;
    size_t count, cap;
    size_t templates, skipped;
    struct gg_err *err;
};

/* What one object being visited is. */
struct object_ctx {
    const json_t *obj;
    const char *ptr;  /* of the object in the document */
    const char *path; /* field path prefix for people: "" or "items[2]" */
    const char *api_version, *kind, *namespace;
    char base[256]; /* name used to build owner and pod names */
    size_t found;   /* templates with a spec found in it */
    size_t seen;    /* templates looked at, with a spec or not */
};

#define MF_MAX_OP_LABELS 12 /* the most labels one operator adds to a pod, below */
#define MF_MAX_CHAIN 3      /* owners above a pod's controller: LWS > StatefulSet > Pod */

/* A label the operator adds to the pods it creates; it wins over the template's. */
struct op_label {
    const char *key;
    char value[64]; /* a label value is at most 63 characters */
};

/* A link of the owner chain. */
struct link {
    const char *kind;
    char name[512];
};

/*
 * The controller of a pod, the pod's own name, the labels its operator adds
 * (documented in docs/gpu-policies.md, "Workload classes", with the upstream
 * sources) and the owners above the controller, root first.
 */
struct owner {
    const char *api_version; /* NULL: the pod has no controller */
    const char *kind;
    char name[512];
    char pod_name[512]; /* the pod's name, or "" for generateName "<owner name>-" */
    struct op_label labels[MF_MAX_OP_LABELS];
    size_t n_labels;
    struct link chain[MF_MAX_CHAIN];
    size_t n_chain;
    const json_t *meta;        /* metadata the pod gets instead of the template's (a Notebook's) */
    const char *meta_rel;      /* where the pod's metadata is, relative to the object, if not
                                * in the template: a Notebook's own, a KServe component */
    const char *container_rel; /* KServe: where the pod's first container is (the model spec) */
    bool assembled;            /* KServe: the template is a component's PodSpec fields */
};

static void entry_clear(struct mf_entry *e)
{
    free(e->object_ptr);
    free(e->api_version);
    free(e->kind);
    free(e->name);
    free(e->namespace);
    free(e->template_ptr);
    free(e->path);
    free(e->owner_kind);
    free(e->owner_name);
    free(e->meta_ptr);
    free(e->container_ptr);
    json_decref(e->owners);
    json_decref(e->pod);
    memset(e, 0, sizeof(*e));
}

void mf_set_clear(struct mf_set *set)
{
    if (!set)
        return;
    for (size_t i = 0; i < set->count; i++)
        entry_clear(&set->entries[i]);
    free(set->entries);
    memset(set, 0, sizeof(*set));
}

static enum gg_status nomem(struct collector *c)
{
    return gg_fail(c->err, GG_ERR_NOMEM, "%s:%zu: out of memory", c->source, c->line);
}

/* A new entry for the object, with its identity filled in. */
static enum gg_status new_entry(struct collector *c, const struct object_ctx *o, enum mf_type type,
                                struct mf_entry **out)
{
    if (c->count == c->cap) {
        size_t cap = c->cap ? c->cap * 2 : 16;
        struct mf_entry *grown = realloc(c->entries, cap * sizeof(*grown));
        if (!grown)
            return nomem(c);
        c->entries = grown;
        c->cap = cap;
    }
    struct mf_entry *e = &c->entries[c->count];
    memset(e, 0, sizeof(*e));
    e->type = type;
    e->doc = c->doc;
    e->doc_number = c->number;
    e->line = c->line;
    const json_t *meta = json_object_get(o->obj, "metadata");
    const char *name = str_member(meta, "name");
    if (!*name)
        name = str_member(meta, "generateName");
    e->object_ptr = strdup(o->ptr);
    e->api_version = strdup(o->api_version);
    e->kind = strdup(o->kind);
    e->name = strdup(name);
    e->namespace = strdup(o->namespace);
    if (!e->object_ptr || !e->api_version || !e->kind || !e->name || !e->namespace) {
        entry_clear(e);
        return nomem(c);
    }
    c->count++;
    *out = e;
    return GG_OK;
}

static enum gg_status add_skipped(struct collector *c, const struct object_ctx *o,
                                  const char *reason)
{
    struct mf_entry *e;
    enum gg_status st = new_entry(c, o, MF_SKIPPED, &e);
    if (st == GG_OK) {
        e->reason = reason;
        c->skipped++;
    }
    return st;
}

/* The Pod the controller makes from tpl (a template, or the Pod itself). */
static json_t *build_pod(const struct object_ctx *o, const json_t *tpl, const struct owner *w)
{
    if (!w->api_version && strcmp(o->kind, "Pod") == 0 && tpl == o->obj) {
        json_t *pod = json_deep_copy(tpl);
        json_t *meta = json_object_get(pod, "metadata");
        if (pod && !json_is_object(meta)) {
            meta = json_object();
            json_object_set_new(pod, "metadata", meta);
        }
        if (pod && *o->namespace && !json_object_get(meta, "namespace"))
            json_object_set_new(meta, "namespace", json_string(o->namespace));
        return pod;
    }
    json_t *pod = json_object(), *meta = json_object();
    const json_t *tmeta = w->meta ? w->meta : json_object_get(tpl, "metadata");
    static const char *const copied[] = {"labels", "annotations", "finalizers"};
    for (size_t i = 0; i < N_ELEMS(copied); i++) {
        json_t *v = json_object_get(tmeta, copied[i]);
        if (v && !(w->meta && strcmp(copied[i], "finalizers") == 0)) /* not a Notebook's own */
            json_object_set_new(meta, copied[i], json_deep_copy(v));
    }
    if (w->n_labels) {
        json_t *labels = json_object_get(meta, "labels");
        if (!json_is_object(labels)) {
            labels = json_object();
            json_object_set_new(meta, "labels", labels);
        }
        for (size_t i = 0; i < w->n_labels; i++)
            json_object_set_new(labels, w->labels[i].key, json_string(w->labels[i].value));
    }
    if (*w->pod_name)
        json_object_set_new(meta, "name", json_string(w->pod_name));
    else if (w->api_version) {
        char gen[520];
        snprintf(gen, sizeof(gen), "%s-", w->name);
        json_object_set_new(meta, "generateName", json_string(gen));
    }
    if (*o->namespace)
        json_object_set_new(meta, "namespace", json_string(o->namespace));
    if (w->api_version) {
        char uid[37];
        owner_uid(w->kind, w->name, uid);
        json_object_set_new(meta, "ownerReferences",
                            json_pack("[{s:s,s:s,s:s,s:s,s:b,s:b}]", "apiVersion", w->api_version,
                                      "kind", w->kind, "name", w->name, "uid", uid, "controller", 1,
                                      "blockOwnerDeletion", 1));
    }
    json_object_set_new(pod, "apiVersion", json_string("v1"));
    json_object_set_new(pod, "kind", json_string("Pod"));
    json_object_set_new(pod, "metadata", meta);
    json_object_set_new(pod, "spec", json_deep_copy(json_object_get(tpl, "spec")));
    if (!json_object_get(pod, "spec") || json_object_size(pod) != 4) {
        json_decref(pod);
        return NULL;
    }
    return pod;
}

/* The owners of a pod, root first, as [{kind, name}]; [] for none. */
static json_t *owner_chain(const struct owner *w)
{
    json_t *out = json_array();
    for (size_t i = 0; out && i < w->n_chain; i++) {
        if (json_array_append_new(
                out, json_pack("{s:s,s:s}", "kind", w->chain[i].kind, "name", w->chain[i].name))) {
            json_decref(out);
            return NULL;
        }
    }
    if (out && w->api_version &&
        json_array_append_new(out, json_pack("{s:s,s:s}", "kind", w->kind, "name", w->name))) {
        json_decref(out);
        return NULL;
    }
    return out;
}

/*
 * One template found at rel_ptr (relative to the object; rel_path for
 * people) and owned as w says.  Templates without an object spec only
 * count as seen.
 */
static enum gg_status add_template(struct collector *c, struct object_ctx *o, const json_t *tpl,
                                   const char *rel_ptr, const char *rel_path, const struct owner *w)
{
    o->seen++;
    if (!json_is_object(tpl) || !json_is_object(json_object_get(tpl, "spec")))
        return GG_OK;
    struct mf_entry *e;
    enum gg_status st = new_entry(c, o, MF_TEMPLATE, &e);
    if (st != GG_OK)
        return st;
    e->template_ptr = concat(o->ptr, rel_ptr);
    e->path = path_join(o->path, rel_path);
    e->owner_kind = strdup(w->api_version ? w->kind : "");
    e->owner_name = strdup(w->api_version ? w->name : "");
    e->owners = owner_chain(w);
    e->meta_ptr = w->meta_rel ? concat(o->ptr, w->meta_rel) : concat(e->template_ptr, "/metadata");
    e->container_ptr = w->container_rel ? concat(o->ptr, w->container_rel) : NULL;
    e->assembled = w->assembled;
    e->pod = build_pod(o, tpl, w);
    if (!e->template_ptr || !e->path || !e->owner_kind || !e->owner_name || !e->owners ||
        !e->meta_ptr || (w->container_rel && !e->container_ptr) || !e->pod) {
        c->count--;
        entry_clear(e);
        return nomem(c);
    }
    o->found++;
    c->templates++;
    return GG_OK;
}

/* An owner: the object itself when kind is "" (owner_api NULL for none).  A
 * controller other than the object has the object at the root of its chain. */
static void set_owner(struct owner *w, const struct object_ctx *o, const char *api,
                      const char *kind, const char *name)
{
    memset(w, 0, sizeof(*w));
    if (!api)
        return;
    w->api_version = api;
    w->kind = *kind ? kind : o->kind;
    snprintf(w->name, sizeof(w->name), "%s", name ? name : o->base);
    if (*kind) {
        w->chain[0].kind = o->kind;
        snprintf(w->chain[0].name, sizeof(w->chain[0].name), "%s", o->base);
        w->n_chain = 1;
    }
}

/* Add a link to the chain of owners above the controller. */
static void add_link(struct owner *w, const char *kind, const char *name)
{
    if (w->n_chain < MF_MAX_CHAIN) {
        w->chain[w->n_chain].kind = kind;
        snprintf(w->chain[w->n_chain].name, sizeof(w->chain[0].name), "%s", name);
        w->n_chain++;
    }
}

/* Add an operator label; values are cut to a label value's 63 characters. */
__attribute__((format(printf, 3, 4))) static void op_label(struct owner *w, const char *key,
                                                           const char *fmt, ...)
{
    if (w->n_labels == MF_MAX_OP_LABELS)
        return; /* not reached: MF_MAX_OP_LABELS is the most any kind below adds */
    struct op_label *l = &w->labels[w->n_labels++];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(l->value, sizeof(l->value), fmt, ap);
    va_end(ap);
    l->key = key;
}

static enum gg_status find_single(struct collector *c, struct object_ctx *o,
                                  const struct single_kind *k)
{
    const json_t *tpl = o->obj;
    if (*k->tpl_ptr) {
        enum gg_status got = jp_pointer_get(o->obj, k->tpl_ptr, (json_t **)&tpl, NULL);
        if (got == GG_ERR_NOMEM) /* not "no template": that would let the object pass */
            return nomem(c);
        if (got != GG_OK)
            tpl = NULL;
    }
    struct owner w;
    char name[512];
    const char *api = k->owner_api;
    if (api && !*k->owner_kind && strcmp(k->group, "apps") != 0 &&
        strcmp(k->group, "extensions") != 0 && *o->api_version)
        api = o->api_version;
    if (k->owner_kind && strcmp(k->owner_kind, "ReplicaSet") == 0) {
        char hash[16];
        template_hash(tpl, hash, sizeof(hash));
        snprintf(name, sizeof(name), "%s-%s", o->base, hash);
        set_owner(&w, o, api, k->owner_kind, name);
    } else if (k->owner_kind && strcmp(k->owner_kind, "Job") == 0) {
        /* A CronJob's Job is named after its scheduled time in minutes. */
        snprintf(name, sizeof(name), "%s-%u", o->base, 28000000u + fnv32(o->base, 0) % 1000000u);
        set_owner(&w, o, api, k->owner_kind, name);
    } else {
        set_owner(&w, o, k->owner_kind ? api : NULL, k->owner_kind ? k->owner_kind : "", NULL);
    }
    if (strcmp(k->kind, "StatefulSet") == 0)
        snprintf(w.pod_name, sizeof(w.pod_name), "%s-0", o->base);
    return add_template(c, o, tpl, k->tpl_ptr, k->tpl_path, &w);
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* The keys of obj in byte order (a malloc'ed array of borrowed strings). */
static const char **sorted_keys(const json_t *obj, size_t *n)
{
    size_t count = json_object_size(obj), i = 0;
    const char **keys = malloc((count ? count : 1) * sizeof(*keys));
    const char *key;
    json_t *v;
    if (!keys)
        return NULL;
    json_object_foreach((json_t *)obj, key, v) keys[i++] = key;
    qsort(keys, i, sizeof(*keys), cmp_str);
    *n = i;
    return keys;
}

static bool has_suffix(const char *s, const char *suffix)
{
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

/* a, lowercased, into out. */
static void lower(const char *a, char *out, size_t size)
{
    size_t i = 0;
    for (; a[i] && i + 1 < size; i++)
        out[i] = (char)(a[i] >= 'A' && a[i] <= 'Z' ? a[i] - 'A' + 'a' : a[i]);
    out[i] = '\0';
}

/*
 * The labels of the training operator (kubeflow/training-operator,
 * pkg/apis/kubeflow.org/v1/common_types.go) and of mpi-operator for MPIJob
 * v2: job name, replica type and index, operator name, and the job role of
 * the master (or of the MPI launcher and workers).
 */
static void kubeflow_labels(struct owner *w, const struct object_ctx *o, const char *role)
{
    char rtype[64], kind[64];
    lower(role, rtype, sizeof(rtype));
    lower(o->kind, kind, sizeof(kind));
    bool mpi = strcmp(o->kind, "MPIJob") == 0;
    op_label(w, "training.kubeflow.org/job-name", "%s", o->base);
    op_label(w, "training.kubeflow.org/replica-type", "%s", rtype);
    op_label(w, "training.kubeflow.org/replica-index", "0");
    if (mpi)
        op_label(w, "training.kubeflow.org/operator-name", "mpi-operator");
    else
        op_label(w, "training.kubeflow.org/operator-name", "%s-controller", kind);
    if (mpi || strcmp(rtype, "master") == 0 || strcmp(rtype, "chief") == 0)
        op_label(w, "training.kubeflow.org/job-role", "%s", mpi ? rtype : "master");
}

/* Kubeflow training operator: spec.<x>ReplicaSpecs.<Role>.template. */
static enum gg_status find_kubeflow(struct collector *c, struct object_ctx *o, const json_t *spec)
{
    size_t nf = 0, nr = 0;
    enum gg_status st = GG_OK;
    const char **fields = sorted_keys(spec, &nf);
    if (!fields)
        return nomem(c);
    for (size_t i = 0; st == GG_OK && i < nf; i++) {
        const json_t *roles = json_object_get(spec, fields[i]);
        if (!has_suffix(fields[i], "ReplicaSpecs") || !json_is_object(roles))
            continue;
        const char **names = sorted_keys(roles, &nr);
        if (!names) {
            st = nomem(c);
            break;
        }
        for (size_t j = 0; st == GG_OK && j < nr; j++) {
            char *fptr = ptr_key("/spec", fields[i]), *rptr = fptr ? ptr_key(fptr, names[j]) : NULL;
            char *tptr = rptr ? concat(rptr, "/template") : NULL, *path = NULL;
            if (tptr && asprintf(&path, "spec.%s.%s.template", fields[i], names[j]) < 0)
                path = NULL;
            if (!path) {
                st = nomem(c);
            } else {
                struct owner w;
                set_owner(&w, o, *o->api_version ? o->api_version : "kubeflow.org/v1", "", NULL);
                snprintf(w.pod_name, sizeof(w.pod_name), "%s-%s-0", o->base, names[j]);
                for (char *p = w.pod_name; *p; p++)
                    if (*p >= 'A' && *p <= 'Z')
                        *p = (char)(*p - 'A' + 'a');
                kubeflow_labels(&w, o, names[j]);
                const json_t *tpl = json_object_get(json_object_get(roles, names[j]), "template");
                st = add_template(c, o, tpl, tptr, path, &w);
            }
            free(fptr);
            free(rptr);
            free(tptr);
            free(path);
        }
        free(names);
    }
    free(fields);
    return st;
}

/*
 * The labels KubeRay puts on the pods of a RayCluster (labelPod and BuildPod
 * in ray-operator/controllers/ray/common/pod.go): ray.io/serve on a
 * RayService's pods ("false" on the head, "true" on workers) and the
 * originated-from labels of a RayJob's or RayService's cluster.  w already
 * has the owner; group is the worker group's name or NULL for the head.
 */
static void ray_labels(struct owner *w, const struct object_ctx *o, const char *group)
{
    const char *type = group ? "worker" : "head";
    op_label(w, "ray.io/cluster", "%s", w->name);
    op_label(w, "ray.io/node-type", "%s", type);
    op_label(w, "ray.io/group", "%s", group ? group : "headgroup");
    op_label(w, "ray.io/is-ray-node", "yes");
    op_label(w, "ray.io/identifier", "%s-%s", w->name, type);
    op_label(w, "app.kubernetes.io/name", "kuberay");
    op_label(w, "app.kubernetes.io/created-by", "kuberay-operator");
    if (strcmp(o->kind, "RayService") == 0)
        op_label(w, "ray.io/serve", "%s", group ? "true" : "false");
    if (strcmp(o->kind, "RayCluster") != 0) {
        op_label(w, "ray.io/originated-from-crd", "%s", o->kind);
        op_label(w, "ray.io/originated-from-cr-name", "%s", o->base);
    }
}

/* A RayCluster spec at rel (relative pointer) / rel_path, owned by base. */
static enum gg_status find_ray_cluster(struct collector *c, struct object_ctx *o, const json_t *rc,
                                       const char *rel, const char *rel_path,
                                       const struct owner *base)
{
    char ptr[128], path[128];
    struct owner w = *base;
    snprintf(ptr, sizeof(ptr), "%s/headGroupSpec/template", rel);
    snprintf(path, sizeof(path), "%s.headGroupSpec.template", rel_path);
    enum gg_status st = GG_OK;
    const json_t *head = json_object_get(json_object_get(rc, "headGroupSpec"), "template");
    if (head) {
        ray_labels(&w, o, NULL);
        st = add_template(c, o, head, ptr, path, &w);
    }
    const json_t *groups = json_object_get(rc, "workerGroupSpecs");
    for (size_t i = 0; st == GG_OK && i < json_array_size(groups); i++) {
        const json_t *group = json_array_get(groups, i);
        const char *name = str_member(group, "groupName");
        char fallback[32];
        snprintf(fallback, sizeof(fallback), "group-%zu", i);
        snprintf(ptr, sizeof(ptr), "%s/workerGroupSpecs/%zu/template", rel, i);
        snprintf(path, sizeof(path), "%s.workerGroupSpecs[%zu].template", rel_path, i);
        w = *base;
        ray_labels(&w, o, *name ? name : fallback);
        st = add_template(c, o, json_object_get(group, "template"), ptr, path, &w);
    }
    return st;
}

/* The labels of LeaderWorkerSet pods (lws api/leaderworkerset/v1/leaderworkerset_types.go)
 * of group 0; worker is "0" for the leader.  The group key and revision hash are left out. */
static void lws_labels(struct owner *w, const struct object_ctx *o, const char *worker)
{
    op_label(w, "leaderworkerset.sigs.k8s.io/name", "%s", o->base);
    op_label(w, "leaderworkerset.sigs.k8s.io/group-index", "0");
    op_label(w, "leaderworkerset.sigs.k8s.io/worker-index", "%s", worker);
}

/*
 * A Kubeflow Notebook: the notebook controller (kubeflow components/
 * notebook-controller/controllers/notebook_controller.go, generateStatefulSet)
 * makes a StatefulSet of the notebook's name whose pod has the template's
 * spec, the labels statefulset and notebook-name, and the Notebook's own
 * labels and annotations (the template's metadata is not used).
 */
static enum gg_status find_notebook(struct collector *c, struct object_ctx *o, const json_t *spec)
{
    struct owner w;
    set_owner(&w, o, "apps/v1", "StatefulSet", NULL);
    snprintf(w.pod_name, sizeof(w.pod_name), "%s-0", o->base);
    op_label(&w, "statefulset", "%s", o->base);
    op_label(&w, "notebook-name", "%s", o->base);
    w.meta = json_object_get(o->obj, "metadata");
    w.meta_rel = "/metadata";
    return add_template(c, o, json_object_get(spec, "template"), "/spec/template", "spec.template",
                        &w);
}

/* Fields of a KServe component that are not a PodSpec's (ComponentExtensionSpec, multi-node
 * workers), and its model specs: "model" or a framework's, each a container. */
static const char *const kserve_not_pod[] = {
    "minReplicas",
    "maxReplicas",
    "scaleTarget",
    "scaleMetric",
    "scaleMetricType",
    "autoScaling",
    "containerConcurrency",
    "timeout",
    "canaryTrafficPercent",
    "logger",
    "batcher",
    "labels",
    "annotations",
    "deploymentStrategy",
    "workerSpec",
};
static const char *const kserve_models[] = {
    "model", "sklearn",     "xgboost", "tensorflow", "pytorch", "triton",
    "onnx",  "huggingface", "pmml",    "lightgbm",   "paddle",
};

/* Fields of a KServe model spec that are not its container's. */
static const char *const kserve_not_container[] = {
    "modelFormat", "runtime", "runtimeVersion", "protocolVersion", "storageUri", "storage",
};

/*
 * The pod template of one KServe component (spec.predictor, ...): its PodSpec
 * fields, with the model spec (or a framework's; its key in *model_key, else
 * NULL) as the container "kserve-container" KServe merges into the serving
 * runtime's; labels and annotations from the InferenceService and the
 * component.  NULL when out of memory.
 */
static json_t *kserve_template(const json_t *obj, const json_t *comp, const char **model_key)
{
    json_t *spec = json_deep_copy(comp), *model = NULL;
    *model_key = NULL;
    if (!spec)
        return NULL;
    for (size_t i = 0; i < N_ELEMS(kserve_not_pod); i++)
        json_object_del(spec, kserve_not_pod[i]);
    for (size_t i = 0; i < N_ELEMS(kserve_models); i++) {
        json_t *v = json_object_get(comp, kserve_models[i]);
        if (json_is_object(v) && !model) {
            model = v; /* the first one given */
            *model_key = kserve_models[i];
        }
        json_object_del(spec, kserve_models[i]);
    }
    if (!model || json_object_get(spec, "containers")) {
        *model_key = NULL;
    } else {
        json_t *ctr = json_deep_copy(model);
        for (size_t i = 0; ctr && i < N_ELEMS(kserve_not_container); i++)
            json_object_del(ctr, kserve_not_container[i]);
        if (ctr && !json_object_get(ctr, "name"))
            json_object_set_new(ctr, "name", json_string("kserve-container"));
        json_object_set_new(spec, "containers", json_pack("[o]", ctr));
    }
    const json_t *ometa = json_object_get(obj, "metadata");
    json_t *meta = json_object();
    static const char *const maps[] = {"labels", "annotations"};
    for (size_t i = 0; meta && i < N_ELEMS(maps); i++) {
        json_t *m = json_object();
        if (json_is_object(json_object_get(ometa, maps[i])))
            json_object_update(m, json_object_get(ometa, maps[i]));
        if (json_is_object(json_object_get(comp, maps[i])))
            json_object_update(m, json_object_get(comp, maps[i]));
        json_object_set_new(meta, maps[i], m);
    }
    return json_pack("{s:o?,s:o?}", "metadata", meta, "spec", spec);
}

/*
 * A KServe InferenceService in raw deployment mode: each component
 * (predictor, transformer, explainer) is a Deployment <name>-<component>
 * whose pods (owned by its ReplicaSet) carry serving.kserve.io/
 * inferenceservice, component and app (kserve pkg/constants/constants.go).
 * The template is assembled from the component: a patch maps back onto the
 * component's PodSpec fields, labels and annotations, and the model spec for
 * the first container.
 */
static enum gg_status find_kserve(struct collector *c, struct object_ctx *o, const json_t *spec)
{
    static const char *const components[] = {"predictor", "transformer", "explainer"};
    enum gg_status st = GG_OK;
    for (size_t i = 0; st == GG_OK && i < N_ELEMS(components); i++) {
        const json_t *comp = json_object_get(spec, components[i]);
        if (!json_is_object(comp))
            continue;
        const char *model_key;
        json_t *tpl = kserve_template(o->obj, comp, &model_key);
        if (!tpl)
            return nomem(c);
        char deploy[400], rs[420], ptr[64], path[64], hash[16], model_ptr[96];
        snprintf(deploy, sizeof(deploy), "%s-%s", o->base, components[i]);
        template_hash(tpl, hash, sizeof(hash));
        snprintf(rs, sizeof(rs), "%s-%s", deploy, hash);
        snprintf(ptr, sizeof(ptr), "/spec/%s", components[i]);
        snprintf(path, sizeof(path), "spec.%s", components[i]);
        struct owner w;
        set_owner(&w, o, "apps/v1", "ReplicaSet", rs);
        add_link(&w, "Deployment", deploy);
        w.assembled = true;
        w.meta_rel = ptr;
        if (model_key) {
            snprintf(model_ptr, sizeof(model_ptr), "%s/%s", ptr, model_key);
            w.container_rel = model_ptr;
        }
        op_label(&w, "serving.kserve.io/inferenceservice", "%s", o->base);
        op_label(&w, "component", "%s", components[i]);
        op_label(&w, "app", "isvc.%s", deploy);
        st = add_template(c, o, tpl, ptr, path, &w);
        json_decref(tpl);
    }
    return st;
}

static enum gg_status find_multi(struct collector *c, struct object_ctx *o, const char *group,
                                 bool *known)
{
    const json_t *spec = json_object_get(o->obj, "spec");
    const char *api = *o->api_version ? o->api_version : NULL;
    struct owner w;
    char ptr[96], path[96], name[400];
    enum gg_status st = GG_OK;
    *known = true;
    if (strcmp(group, "kubeflow.org") == 0 && strcmp(o->kind, "Notebook") == 0)
        return find_notebook(c, o, spec);
    if (strcmp(group, "kubeflow.org") == 0)
        return find_kubeflow(c, o, spec);
    if (strcmp(group, "serving.kserve.io") == 0 && strcmp(o->kind, "InferenceService") == 0)
        return find_kserve(c, o, spec);
    if (strcmp(group, "ray.io") == 0 && strcmp(o->kind, "RayCluster") == 0) {
        set_owner(&w, o, api ? api : "ray.io/v1", "", NULL);
        return find_ray_cluster(c, o, spec, "/spec", "spec", &w);
    }
    if (strcmp(group, "ray.io") == 0 &&
        (strcmp(o->kind, "RayJob") == 0 || strcmp(o->kind, "RayService") == 0)) {
        bool job = strcmp(o->kind, "RayJob") == 0;
        const char *field = job ? "rayClusterSpec" : "rayClusterConfig";
        snprintf(ptr, sizeof(ptr), "/spec/%s", field);
        snprintf(path, sizeof(path), "spec.%s", field);
        set_owner(&w, o, "ray.io/v1", "RayCluster", NULL);
        st = find_ray_cluster(c, o, json_object_get(spec, field), ptr, path, &w);
        const json_t *submitter = json_object_get(spec, "submitterPodTemplate");
        if (st == GG_OK && job && submitter) {
            set_owner(&w, o, "batch/v1", "Job", NULL);
            st = add_template(c, o, submitter, "/spec/submitterPodTemplate",
                              "spec.submitterPodTemplate", &w);
        }
        return st;
    }
    if (strcmp(group, "jobset.x-k8s.io") == 0 && strcmp(o->kind, "JobSet") == 0) {
        const json_t *jobs = json_object_get(spec, "replicatedJobs");
        for (size_t i = 0; st == GG_OK && i < json_array_size(jobs); i++) {
            const json_t *rj = json_array_get(jobs, i);
            const char *rj_name = str_member(rj, "name");
            snprintf(ptr, sizeof(ptr), "/spec/replicatedJobs/%zu/template/spec/template", i);
            snprintf(path, sizeof(path), "spec.replicatedJobs[%zu].template.spec.template", i);
            if (*rj_name)
                snprintf(name, sizeof(name), "%s-%s-0", o->base, rj_name);
            else
                snprintf(name, sizeof(name), "%s-%zu-0", o->base, i);
            set_owner(&w, o, "batch/v1", "Job", name);
            /* jobset api/jobset/v1alpha2/jobset_types.go */
            op_label(&w, "jobset.sigs.k8s.io/jobset-name", "%s", o->base);
            op_label(&w, "jobset.sigs.k8s.io/replicatedjob-name", "%s", *rj_name ? rj_name : "0");
            op_label(&w, "jobset.sigs.k8s.io/job-index", "0");
            op_label(&w, "jobset.sigs.k8s.io/restart-attempt", "0");
            const json_t *tpl = json_object_get(
                json_object_get(json_object_get(rj, "template"), "spec"), "template");
            st = add_template(c, o, tpl, ptr, path, &w);
        }
        return st;
    }
    if (strcmp(group, "leaderworkerset.x-k8s.io") == 0 && strcmp(o->kind, "LeaderWorkerSet") == 0) {
        const json_t *lwt = json_object_get(spec, "leaderWorkerTemplate");
        const json_t *leader = json_object_get(lwt, "leaderTemplate");
        if (leader) {
            set_owner(&w, o, "apps/v1", "StatefulSet", NULL);
            snprintf(w.pod_name, sizeof(w.pod_name), "%s-0", o->base);
            lws_labels(&w, o, "0");
            st = add_template(c, o, leader, "/spec/leaderWorkerTemplate/leaderTemplate",
                              "spec.leaderWorkerTemplate.leaderTemplate", &w);
        }
        if (st == GG_OK) {
            /* Each group's workers: a StatefulSet owned by the group's leader pod. */
            snprintf(name, sizeof(name), "%s-0", o->base);
            set_owner(&w, o, "apps/v1", "StatefulSet", name);
            add_link(&w, "StatefulSet", o->base);
            add_link(&w, "Pod", name);
            snprintf(w.pod_name, sizeof(w.pod_name), "%s-0-1", o->base);
            lws_labels(&w, o, "1");
            st = add_template(c, o, json_object_get(lwt, "workerTemplate"),
                              "/spec/leaderWorkerTemplate/workerTemplate",
                              "spec.leaderWorkerTemplate.workerTemplate", &w);
        }
        return st;
    }
    if (strcmp(group, "batch.volcano.sh") == 0 && strcmp(o->kind, "Job") == 0) {
        const json_t *tasks = json_object_get(spec, "tasks");
        for (size_t i = 0; st == GG_OK && i < json_array_size(tasks); i++) {
            const json_t *task = json_array_get(tasks, i);
            snprintf(ptr, sizeof(ptr), "/spec/tasks/%zu/template", i);
            snprintf(path, sizeof(path), "spec.tasks[%zu].template", i);
            set_owner(&w, o, api ? api : "batch.volcano.sh/v1alpha1", "", NULL);
            const char *task_name = str_member(task, "name");
            if (*task_name)
                snprintf(w.pod_name, sizeof(w.pod_name), "%s-%s-0", o->base, task_name);
            else
                snprintf(w.pod_name, sizeof(w.pod_name), "%s-%zu-0", o->base, i);
            /* volcano pkg/controllers/job/job_controller_util.go (createJobPod) */
            const char *queue = str_member(spec, "queue");
            op_label(&w, "volcano.sh/job-name", "%s", o->base);
            if (*o->namespace)
                op_label(&w, "volcano.sh/job-namespace", "%s", o->namespace);
            op_label(&w, "volcano.sh/queue-name", "%s", *queue ? queue : "default");
            op_label(&w, "volcano.sh/task-spec", "%s", *task_name ? task_name : "");
            st = add_template(c, o, json_object_get(task, "template"), ptr, path, &w);
        }
        return st;
    }
    *known = false;
    return GG_OK;
}

static bool is_list(const json_t *obj, const char *kind)
{
    return (strcmp(kind, "List") == 0 || has_suffix(kind, "List")) &&
           json_is_array(json_object_get(obj, "items"));
}

static enum gg_status visit(struct collector *c, const json_t *obj, const char *ptr,
                            const char *path, int nesting);

static enum gg_status visit_list(struct collector *c, struct object_ctx *o, int nesting)
{
    const json_t *items = json_object_get(o->obj, "items");
    if (nesting >= MF_MAX_LIST_NESTING)
        return add_skipped(c, o, "a List nested too deep");
    if (json_array_size(items) == 0)
        return add_skipped(c, o, "an empty List");
    enum gg_status st = GG_OK;
    for (size_t i = 0; st == GG_OK && i < json_array_size(items); i++) {
        char *ptr = ptr_index(o->ptr, i), *path = NULL;
        if (asprintf(&path, "%s%sitems[%zu]", o->path, *o->path ? "." : "", i) < 0)
            path = NULL;
        st = (ptr && path) ? visit(c, json_array_get(items, i), ptr, path, nesting + 1) : nomem(c);
        free(ptr);
        free(path);
    }
    return st;
}

static enum gg_status visit(struct collector *c, const json_t *obj, const char *ptr,
                            const char *path, int nesting)
{
    struct object_ctx o = {.obj = obj, .ptr = ptr, .path = path};
    if (++c->objects > MF_MAX_OBJECTS)
        return gg_fail(c->err, GG_ERR_TOOBIG, "%s:%zu: more than %d documents and List items",
                       c->source, c->line, MF_MAX_OBJECTS);
    o.api_version = str_member(obj, "apiVersion");
    o.kind = str_member(obj, "kind");
    const json_t *meta = json_object_get(obj, "metadata");
    o.namespace = str_member(meta, "namespace");
    const char *base = str_member(meta, "name");
    if (!*base)
        base = str_member(meta, "generateName");
    snprintf(o.base, sizeof(o.base), "%s", *base ? base : "unnamed");
    size_t blen = strlen(o.base);
    while (blen > 1 && o.base[blen - 1] == '-')
        o.base[--blen] = '\0';

    if (!json_is_object(obj))
        return add_skipped(c, &o, "not an object");
    if (!*o.kind)
        return add_skipped(c, &o, "no kind");
    if (is_list(obj, o.kind))
        return visit_list(c, &o, nesting);
    char group[256];
    if (!object_group(obj, o.kind, group, sizeof(group)))
        return add_skipped(c, &o, "no pod template");
    /* The API server refuses such an object, so there is no verdict to give: evaluated
     * in it, a template's placeholder ("FILLED BY THE OPERATOR") would get the verdicts of
     * a namespace that cannot exist. */
    if (*o.namespace && !gg_dns_label(o.namespace))
        return add_skipped(c, &o,
                           "metadata.namespace is not a namespace name (a-z, 0-9 and '-', at "
                           "most 63 characters), so the API server refuses it; set the namespace "
                           "it runs in");
    enum gg_status st = GG_OK;
    bool known = false;
    for (size_t i = 0; i < N_ELEMS(singles); i++) {
        if (strcmp(singles[i].kind, o.kind) == 0 && strcmp(singles[i].group, group) == 0) {
            known = true;
            st = find_single(c, &o, &singles[i]);
            break;
        }
    }
    if (!known)
        st = find_multi(c, &o, group, &known);
    if (st != GG_OK || o.found > 0)
        return st;
    if (!known)
        return add_skipped(c, &o, "no pod template");
    if (strcmp(o.kind, "Pod") == 0 && !*group)
        return add_skipped(c, &o, "no pod spec");
    return add_skipped(c, &o, o.seen ? "no pod template with a spec" : "no pod template");
}

/* The collector's entries into *out, or released on failure. */
static enum gg_status collected(struct collector *c, enum gg_status st, struct mf_set *out)
{
    if (st != GG_OK) {
        struct mf_set tmp = {c->entries, c->count, 0, 0};
        mf_set_clear(&tmp);
        return st;
    }
    *out = (struct mf_set){c->entries, c->count, c->templates, c->skipped};
    return GG_OK;
}

enum gg_status mf_collect(const struct yd_stream *stream, const char *source, struct mf_set *out,
                          struct gg_err *err)
{
    struct collector c = {.source = source ? source : "<input>", .err = err};
    enum gg_status st = GG_OK;
    for (size_t i = 0; st == GG_OK && i < stream->count; i++) {
        c.doc = i;
        c.number = stream->pos[i].number;
        c.line = stream->pos[i].line;
        st = visit(&c, json_array_get(stream->docs, i), "", "", 0);
    }
    return collected(&c, st, out);
}

enum gg_status mf_collect_object(const json_t *obj, const char *source, struct mf_set *out,
                                 struct gg_err *err)
{
    struct collector c = {.source = source ? source : "<object>", .number = 1, .err = err};
    return collected(&c, visit(&c, obj, "", "", 0), out);
}

/* ---- patches back onto templates ---------------------------------------- */

/* Is token (escaped, up to its end) the first token of rest ("/tok..." ) ? */
static bool first_token_is(const char *rest, const char *token)
{
    size_t n = strlen(token);
    return rest[0] == '/' && strncmp(rest + 1, token, n) == 0 &&
           (rest[1 + n] == '\0' || rest[1 + n] == '/');
}

/* Does a pod pointer edit a key inside /metadata (key NULL) or inside /metadata/<key>? */
static bool edits_in(const char *pointer, const char *key)
{
    if (strncmp(pointer, "/metadata/", 10) != 0)
        return false;
    return !key || (first_token_is(pointer + 9, key) && pointer[10 + strlen(key)] == '/');
}

static bool is_pod_doc(const struct mf_entry *e)
{
    return !*e->owner_kind && strcmp(e->kind, "Pod") == 0 &&
           strcmp(e->template_ptr, e->object_ptr) == 0;
}

bool mf_is_template(const struct mf_entry *e)
{
    return e->type == MF_TEMPLATE && strcmp(e->template_ptr, e->object_ptr) != 0;
}

enum gg_status mf_map_pointer(const struct mf_entry *e, const char *pod_pointer, char **out)
{
    static const char *const controller_set[] = {"namespace", "name", "generateName",
                                                 "ownerReferences"};
    if (e->type != MF_TEMPLATE || !pod_pointer || pod_pointer[0] != '/')
        return GG_ERR_INVALID;
    bool pod_doc = is_pod_doc(e);
    if (first_token_is(pod_pointer, "metadata")) {
        const char *rest = pod_pointer + strlen("/metadata");
        for (size_t i = 0; i < N_ELEMS(controller_set); i++) {
            if ((!pod_doc || i == 0) && first_token_is(rest, controller_set[i]))
                return GG_ERR_INVALID;
        }
        if (e->assembled && !first_token_is(rest, "labels") && !first_token_is(rest, "annotations"))
            return GG_ERR_INVALID; /* a component has labels and annotations, nothing else */
        *out = concat(e->meta_ptr, rest);
        return *out ? GG_OK : GG_ERR_NOMEM;
    }
    if (e->assembled) {
        /* /spec/<field> is the component's <field>; the first container may be the model. */
        const char *rest = pod_pointer + strlen("/spec");
        if (!first_token_is(pod_pointer, "spec") || !*rest)
            return GG_ERR_INVALID;
        if (e->container_ptr && first_token_is(rest, "containers")) {
            const char *tail = rest + strlen("/containers");
            if (!first_token_is(tail, "0"))
                return GG_ERR_INVALID;
            *out = concat(e->container_ptr, tail + 2);
            return *out ? GG_OK : GG_ERR_NOMEM;
        }
        *out = concat(e->template_ptr, rest);
        return *out ? GG_OK : GG_ERR_NOMEM;
    }
    if (!pod_doc && !first_token_is(pod_pointer, "spec"))
        return GG_ERR_INVALID;
    *out = concat(e->template_ptr, pod_pointer);
    return *out ? GG_OK : GG_ERR_NOMEM;
}

/* A whole metadata value for a template: without what the controller sets. */
static json_t *template_metadata(const struct mf_entry *e, const json_t *value)
{
    json_t *copy = json_deep_copy(value);
    if (json_is_object(copy)) {
        json_object_del(copy, "namespace");
        if (!is_pod_doc(e)) {
            json_object_del(copy, "name");
            json_object_del(copy, "generateName");
            json_object_del(copy, "ownerReferences");
        }
    }
    return copy;
}

enum gg_status mf_map_patch(const struct mf_entry *e, const json_t *doc, const json_t *patch,
                            json_t **mapped, json_t **dropped, struct gg_err *err)
{
    json_t *ops = json_array(), *left = json_array();
    /* The maps whose keys the patch edits: the metadata, or a component's labels and
     * annotations; each must be an object in the document before the mapped ops run. */
    bool touches[3] = {false, false, false};
    static const char *const parents[3] = {"", "/labels", "/annotations"};
    enum gg_status st = GG_OK;
    size_t i;
    json_t *op;
    if (!ops || !left) {
        st = gg_fail(err, GG_ERR_NOMEM, "out of memory");
        goto out;
    }
    if (e->type != MF_TEMPLATE || !json_is_array(patch)) {
        st = gg_fail(err, GG_ERR_INVALID, "not a patch on a pod template");
        goto out;
    }
    json_array_foreach(patch, i, op)
    {
        const char *path = json_string_value(json_object_get(op, "path"));
        const char *from = json_string_value(json_object_get(op, "from"));
        char *mpath = NULL, *mfrom = NULL;
        enum gg_status ps = path ? mf_map_pointer(e, path, &mpath) : GG_ERR_INVALID;
        enum gg_status fs = from ? mf_map_pointer(e, from, &mfrom) : GG_OK;
        if (ps == GG_ERR_NOMEM || fs == GG_ERR_NOMEM) {
            free(mpath);
            free(mfrom);
            st = gg_fail(err, GG_ERR_NOMEM, "out of memory");
            goto out;
        }
        if (ps != GG_OK || fs != GG_OK) {
            json_array_append(left, op);
        } else {
            json_t *copy = json_copy(op);
            json_object_set_new(copy, "path", json_string(mpath));
            if (mfrom)
                json_object_set_new(copy, "from", json_string(mfrom));
            if (strcmp(path, "/metadata") == 0 && json_object_get(op, "value"))
                json_object_set_new(copy, "value",
                                    template_metadata(e, json_object_get(op, "value")));
            json_array_append_new(ops, copy);
            for (size_t k = 0; k < 3; k++) {
                const char *key = k ? parents[k] + 1 : NULL;
                touches[k] = touches[k] || ((!key || e->assembled) &&
                                            (edits_in(path, key) || (from && edits_in(from, key))));
            }
        }
        free(mpath);
        free(mfrom);
    }
    for (size_t k = 3; k-- > 0;) {
        if (!touches[k] || (k == 0 && e->assembled))
            continue;
        char *ptr = concat(e->meta_ptr, parents[k]);
        json_t *map = NULL;
        if (!ptr) {
            st = gg_fail(err, GG_ERR_NOMEM, "out of memory");
            goto out;
        }
        enum gg_status got = jp_pointer_get(doc, ptr, &map, NULL);
        bool missing = got != GG_OK || !json_is_object(map);
        if (got == GG_ERR_NOMEM ||
            (missing &&
             json_array_insert_new(
                 ops, 0, json_pack("{s:s,s:s,s:{}}", "op", "add", "path", ptr, "value")) != 0)) {
            free(ptr);
            st = gg_fail(err, GG_ERR_NOMEM, "out of memory");
            goto out;
        }
        free(ptr);
    }
out:
    if (st != GG_OK) {
        json_decref(ops);
        json_decref(left);
        return st;
    }
    *mapped = ops;
    if (dropped)
        *dropped = left;
    else
        json_decref(left);
    return GG_OK;
}

/* ---- cluster state ------------------------------------------------------ */

/* What a cluster-state item is, by kind (no kind: a Pod, as kubectl's PodList items). */
static enum mf_state_kind state_kind(const json_t *item)
{
    const json_t *k = json_object_get(item, "kind");
    const char *kind = json_string_value(k);
    if (!k || (kind && strcmp(kind, "Pod") == 0))
        return MF_STATE_POD;
    if (kind && strcmp(kind, "ResourceClaim") == 0)
        return MF_STATE_CLAIM;
    if (kind && strcmp(kind, "DeviceClass") == 0)
        return MF_STATE_CLASS;
    if (kind && strcmp(kind, "ResourceSlice") == 0)
        return MF_STATE_SLICE;
    if (kind && strcmp(kind, "GPUQuota") == 0)
        return MF_STATE_QUOTA;
    return kind && strcmp(kind, "ResourceClaimTemplate") == 0 ? MF_STATE_TEMPLATE : MF_STATE_OTHER;
}

enum gg_status mf_cluster_state(const char *text, size_t len, const char *source, json_t **state,
                                size_t counts[MF_STATE_N], struct gg_err *err)
{
    json_error_t jerr;
    const char *src = source ? source : "<cluster state>";
    if (len > MF_MAX_CLUSTER_STATE)
        return gg_fail(err, GG_ERR_TOOBIG, "%s: larger than %zu bytes", src, MF_MAX_CLUSTER_STATE);
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
    enum gg_status st = GG_OK;
    if (!root)
        return gg_fail(err, GG_ERR_PARSE, "%s:%d:%d: not JSON: %s", src, jerr.line, jerr.column,
                       jerr.text);
    const char *kind = json_string_value(json_object_get(root, "kind"));
    json_t *items = json_object_get(root, "items");
    if (!json_is_object(root)) {
        st = gg_fail(err, GG_ERR_INVALID,
                     "%s: want the JSON of 'kubectl get pods,resourceclaims,"
                     "resourceclaimtemplates,deviceclasses,resourceslices,gpuquotas -A -o json', "
                     "an object",
                     src);
        goto out;
    }
    if (!kind || (strcmp(kind, "List") != 0 && strcmp(kind, "PodList") != 0)) {
        st = gg_fail(err, GG_ERR_INVALID, "%s: kind is \"%.40s\", want List or PodList", src,
                     kind ? kind : "");
        goto out;
    }
    if (!json_is_array(items)) {
        st = gg_fail(err, GG_ERR_INVALID, "%s: items must be an array of objects", src);
        goto out;
    }
    memset(counts, 0, MF_STATE_N * sizeof(counts[0]));
    json_t *kept = json_array();
    size_t i;
    json_t *item;
    json_array_foreach(items, i, item)
    {
        if (!json_is_object(item)) {
            st = gg_fail(err, GG_ERR_INVALID, "%s: items[%zu] is not an object", src, i);
            break;
        }
        if (!json_is_object(json_object_get(item, "metadata"))) {
            st = gg_fail(err, GG_ERR_INVALID, "%s: items[%zu].metadata must be an object", src, i);
            break;
        }
        enum mf_state_kind k = state_kind(item);
        counts[k]++;
        if (k != MF_STATE_OTHER)
            json_array_append(kept, item);
    }
    json_object_set_new(root, "items", kept);
    if (st != GG_OK)
        goto out;
out:
    if (st != GG_OK) {
        json_decref(root);
        return st;
    }
    *state = root;
    return GG_OK;
}
