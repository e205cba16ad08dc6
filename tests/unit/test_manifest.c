/*
 * test_manifest.c - unit tests for the manifest module (webhook/codec/manifest.c,
 * manifest_emit.c, manifest_lines.c): the pod templates of every supported kind (table-driven),
 * List items, skipped documents, the Pod built for a template (metadata, owner, namespace), pointer
 * and patch mapping back onto the document, the YAML writer (round trips through yamldoc), node
 * line numbers, the cluster-state reader and the bounds.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/gpuguard.h"
#include "codec/jsonpatch.h"
#include "codec/manifest.h"
#include "codec/yamldoc.h"
#include "testjson.h"

/* ---- helpers ---------------------------------------------------------------- */

/* Load text and collect; fails the test on error. */
static void collect(const char *text, struct yd_stream *s, struct mf_set *set)
{
    struct gg_err err = {{0}};
    struct yd_limits lim;
    mf_yd_limits(&lim);
    if (yd_load_stream(text, strlen(text), "t.yaml", &lim, s, &err) != GG_OK)
        fail_msg("yamldoc: %s\n%s", err.msg, text);
    if (mf_collect(s, "t.yaml", set, &err) != GG_OK)
        fail_msg("mf_collect: %s", err.msg);
}

static const struct mf_entry *nth_template(const struct mf_set *set, size_t n)
{
    for (size_t i = 0; i < set->count; i++)
        if (set->entries[i].type == MF_TEMPLATE && n-- == 0)
            return &set->entries[i];
    fail_msg("no template number %zu", n);
    return NULL;
}

static void assert_json_eq(const json_t *got, const char *want_text)
{
    json_t *want = js(want_text);
    if (!json_equal(got, want)) {
        char *g = json_dumps(got, JSON_COMPACT | JSON_SORT_KEYS | JSON_ENCODE_ANY);
        fail_msg("got %s\nwant %s", g ? g : "(null)", want_text);
    }
    json_decref(want);
}

/* ---- every kind ------------------------------------------------------------- */

struct want_tpl {
    const char *ptr;
    const char *path;
    const char *owner; /* "" for none */
};

struct kind_case {
    const char *name;
    const char *yaml;
    struct want_tpl t[4];
    size_t n;
};

#define CONTAINERS "{containers: [{name: c, image: x}]}"

static const struct kind_case kind_cases[] = {
    {"Pod",
     "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec: " CONTAINERS "\n",
     {{"", "", ""}},
     1},
    {"PodTemplate",
     "apiVersion: v1\nkind: PodTemplate\nmetadata: {name: t}\ntemplate:\n  spec: " CONTAINERS "\n",
     {{"/template", "template", ""}},
     1},
    {"ReplicationController",
     "apiVersion: v1\nkind: ReplicationController\nmetadata: {name: rc}\nspec:\n  template:\n"
     "    spec: " CONTAINERS "\n",
     {{"/spec/template", "spec.template", "ReplicationController"}},
     1},
    {"Deployment",
     "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: d}\nspec:\n  template:\n"
     "    spec: " CONTAINERS "\n",
     {{"/spec/template", "spec.template", "ReplicaSet"}},
     1},
    {"Deployment (extensions)",
     "apiVersion: extensions/v1beta1\nkind: Deployment\nmetadata: {name: d}\nspec:\n  template:\n"
     "    spec: " CONTAINERS "\n",
     {{"/spec/template", "spec.template", "ReplicaSet"}},
     1},
    {"Deployment (no apiVersion)",
     "kind: Deployment\nmetadata: {name: d}\nspec:\n  template:\n    spec: " CONTAINERS "\n",
     {{"/spec/template", "spec.template", "ReplicaSet"}},
     1},
    {"ReplicaSet",
     "apiVersion: apps/v1\nkind: ReplicaSet\nmetadata: {name: rs}\nspec:\n  template:\n"
     "    spec: " CONTAINERS "\n",
     {{"/spec/template", "spec.template", "ReplicaSet"}},
     1},
    {"StatefulSet",
     "apiVersion: apps/v1\nkind: StatefulSet\nmetadata: {name: s}\nspec:\n  template:\n"
     "    spec: " CONTAINERS "\n",
     {{"/spec/template", "spec.template", "StatefulSet"}},
     1},
    {"DaemonSet",
     "apiVersion: apps/v1\nkind: DaemonSet\nmetadata: {name: ds}\nspec:\n  template:\n"
     "    spec: " CONTAINERS "\n",
     {{"/spec/template", "spec.template", "DaemonSet"}},
     1},
    {"Job",
     "apiVersion: batch/v1\nkind: Job\nmetadata: {name: j}\nspec:\n  template:\n"
     "    spec: " CONTAINERS "\n",
     {{"/spec/template", "spec.template", "Job"}},
     1},
    {"CronJob",
     "apiVersion: batch/v1\nkind: CronJob\nmetadata: {name: cj}\nspec:\n  schedule: '@daily'\n"
     "  jobTemplate:\n    spec:\n      template:\n        spec: " CONTAINERS "\n",
     {{"/spec/jobTemplate/spec/template", "spec.jobTemplate.spec.template", "Job"}},
     1},
    {"PyTorchJob",
     "apiVersion: kubeflow.org/v1\nkind: PyTorchJob\nmetadata: {name: pt}\nspec:\n"
     "  pytorchReplicaSpecs:\n    Worker:\n      replicas: 2\n      template:\n        "
     "spec: " CONTAINERS "\n    Master:\n      template:\n        spec: " CONTAINERS "\n",
     {{"/spec/pytorchReplicaSpecs/Master/template", "spec.pytorchReplicaSpecs.Master.template",
       "PyTorchJob"},
      {"/spec/pytorchReplicaSpecs/Worker/template", "spec.pytorchReplicaSpecs.Worker.template",
       "PyTorchJob"}},
     2},
    {"TFJob",
     "apiVersion: kubeflow.org/v1\nkind: TFJob\nmetadata: {name: tf}\nspec:\n  tfReplicaSpecs:\n"
     "    PS:\n      template:\n        spec: " CONTAINERS "\n",
     {{"/spec/tfReplicaSpecs/PS/template", "spec.tfReplicaSpecs.PS.template", "TFJob"}},
     1},
    {"MPIJob",
     "apiVersion: kubeflow.org/v2beta1\nkind: MPIJob\nmetadata: {name: m}\nspec:\n"
     "  mpiReplicaSpecs:\n    Launcher:\n      template:\n        spec: " CONTAINERS "\n",
     {{"/spec/mpiReplicaSpecs/Launcher/template", "spec.mpiReplicaSpecs.Launcher.template",
       "MPIJob"}},
     1},
    {"XGBoostJob",
     "kind: XGBoostJob\nmetadata: {name: x}\nspec:\n  xgbReplicaSpecs:\n    Master:\n"
     "      template:\n        spec: " CONTAINERS "\n",
     {{"/spec/xgbReplicaSpecs/Master/template", "spec.xgbReplicaSpecs.Master.template",
       "XGBoostJob"}},
     1},
    {"PaddleJob",
     "apiVersion: kubeflow.org/v1\nkind: PaddleJob\nmetadata: {name: pd}\nspec:\n"
     "  paddleReplicaSpecs:\n    Worker:\n      template:\n        spec: " CONTAINERS "\n",
     {{"/spec/paddleReplicaSpecs/Worker/template", "spec.paddleReplicaSpecs.Worker.template",
       "PaddleJob"}},
     1},
    {"RayCluster",
     "apiVersion: ray.io/v1\nkind: RayCluster\nmetadata: {name: rc}\nspec:\n  headGroupSpec:\n"
     "    template:\n      spec: " CONTAINERS "\n  workerGroupSpecs:\n  - groupName: a\n"
     "    template:\n      spec: " CONTAINERS
     "\n  - groupName: b\n    template:\n      spec: " CONTAINERS "\n",
     {{"/spec/headGroupSpec/template", "spec.headGroupSpec.template", "RayCluster"},
      {"/spec/workerGroupSpecs/0/template", "spec.workerGroupSpecs[0].template", "RayCluster"},
      {"/spec/workerGroupSpecs/1/template", "spec.workerGroupSpecs[1].template", "RayCluster"}},
     3},
    {"RayJob",
     "apiVersion: ray.io/v1\nkind: RayJob\nmetadata: {name: rj}\nspec:\n  rayClusterSpec:\n"
     "    headGroupSpec:\n      template:\n        spec: " CONTAINERS "\n    workerGroupSpecs:\n"
     "    - template:\n        spec: " CONTAINERS "\n  submitterPodTemplate:\n    spec: " CONTAINERS
     "\n",
     {{"/spec/rayClusterSpec/headGroupSpec/template", "spec.rayClusterSpec.headGroupSpec.template",
       "RayCluster"},
      {"/spec/rayClusterSpec/workerGroupSpecs/0/template",
       "spec.rayClusterSpec.workerGroupSpecs[0].template", "RayCluster"},
      {"/spec/submitterPodTemplate", "spec.submitterPodTemplate", "Job"}},
     3},
    {"RayService",
     "apiVersion: ray.io/v1\nkind: RayService\nmetadata: {name: rs}\nspec:\n  rayClusterConfig:\n"
     "    headGroupSpec:\n      template:\n        spec: " CONTAINERS "\n",
     {{"/spec/rayClusterConfig/headGroupSpec/template",
       "spec.rayClusterConfig.headGroupSpec.template", "RayCluster"}},
     1},
    {"JobSet",
     "apiVersion: jobset.x-k8s.io/v1alpha2\nkind: JobSet\nmetadata: {name: js}\nspec:\n"
     "  replicatedJobs:\n  - name: leader\n    template:\n      spec:\n        template:\n"
     "          spec: " CONTAINERS "\n  - name: workers\n    template:\n      spec:\n"
     "        template:\n          spec: " CONTAINERS "\n",
     {{"/spec/replicatedJobs/0/template/spec/template",
       "spec.replicatedJobs[0].template.spec.template", "Job"},
      {"/spec/replicatedJobs/1/template/spec/template",
       "spec.replicatedJobs[1].template.spec.template", "Job"}},
     2},
    {"LeaderWorkerSet",
     "apiVersion: leaderworkerset.x-k8s.io/v1\nkind: LeaderWorkerSet\nmetadata: {name: lws}\n"
     "spec:\n  leaderWorkerTemplate:\n    size: 4\n    leaderTemplate:\n      spec: " CONTAINERS
     "\n    workerTemplate:\n      spec: " CONTAINERS "\n",
     {{"/spec/leaderWorkerTemplate/leaderTemplate", "spec.leaderWorkerTemplate.leaderTemplate",
       "StatefulSet"},
      {"/spec/leaderWorkerTemplate/workerTemplate", "spec.leaderWorkerTemplate.workerTemplate",
       "StatefulSet"}},
     2},
    {"LeaderWorkerSet (workers only)",
     "apiVersion: leaderworkerset.x-k8s.io/v1\nkind: LeaderWorkerSet\nmetadata: {name: lws}\n"
     "spec:\n  leaderWorkerTemplate:\n    workerTemplate:\n      spec: " CONTAINERS "\n",
     {{"/spec/leaderWorkerTemplate/workerTemplate", "spec.leaderWorkerTemplate.workerTemplate",
       "StatefulSet"}},
     1},
    {"Volcano Job",
     "apiVersion: batch.volcano.sh/v1alpha1\nkind: Job\nmetadata: {name: vj}\nspec:\n  tasks:\n"
     "  - name: ps\n    template:\n      spec: " CONTAINERS "\n  - name: worker\n    template:\n"
     "      spec: " CONTAINERS "\n",
     {{"/spec/tasks/0/template", "spec.tasks[0].template", "Job"},
      {"/spec/tasks/1/template", "spec.tasks[1].template", "Job"}},
     2},
    {"List",
     "apiVersion: v1\nkind: List\nitems:\n- apiVersion: v1\n  kind: Pod\n  metadata: {name: a}\n"
     "  spec: " CONTAINERS "\n- apiVersion: apps/v1\n  kind: Deployment\n  metadata: {name: d}\n"
     "  spec:\n    template:\n      spec: " CONTAINERS "\n",
     {{"/items/0", "items[0]", ""},
      {"/items/1/spec/template", "items[1].spec.template", "ReplicaSet"}},
     2},
    {"PodList",
     "apiVersion: v1\nkind: PodList\nitems:\n- apiVersion: v1\n  kind: Pod\n  metadata: {name: a}\n"
     "  spec: " CONTAINERS "\n",
     {{"/items/0", "items[0]", ""}},
     1},
};

static void test_every_kind(void **state)
{
    (void)state;
    for (size_t i = 0; i < N_ELEMS(kind_cases); i++) {
        const struct kind_case *kc = &kind_cases[i];
        struct yd_stream s;
        struct mf_set set;
        collect(kc->yaml, &s, &set);
        if (set.templates != kc->n)
            fail_msg("%s: %zu templates, want %zu", kc->name, set.templates, kc->n);
        assert_int_equal(set.skipped, 0);
        for (size_t t = 0; t < kc->n; t++) {
            const struct mf_entry *e = nth_template(&set, t);
            if (strcmp(e->template_ptr, kc->t[t].ptr) || strcmp(e->path, kc->t[t].path) ||
                strcmp(e->owner_kind, kc->t[t].owner))
                fail_msg("%s[%zu]: got %s %s %s, want %s %s %s", kc->name, t, e->template_ptr,
                         e->path, e->owner_kind, kc->t[t].ptr, kc->t[t].path, kc->t[t].owner);
            /* The Pod's spec is the template's. */
            json_t *tpl = NULL;
            assert_int_equal(
                jp_pointer_get(json_array_get(s.docs, e->doc), e->template_ptr, &tpl, NULL), GG_OK);
            assert_true(json_equal(json_object_get(e->pod, "spec"), json_object_get(tpl, "spec")));
            assert_string_equal(json_string_value(json_object_get(e->pod, "kind")), "Pod");
            assert_string_equal(json_string_value(json_object_get(e->pod, "apiVersion")), "v1");
        }
        mf_set_clear(&set);
        yd_stream_clear(&s);
    }
}

/* ---- skipped documents -------------------------------------------------------- */

static void test_skipped_documents(void **state)
{
    (void)state;
    static const struct {
        const char *yaml;
        const char *reason;
    } cases[] = {
        {"apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\ndata: {a: b}\n", "no pod template"},
        {"metadata: {name: nokind}\n", "no kind"},
        {"just a string\n", "not an object"},
        {"[1, 2]\n", "not an object"},
        {"null\n", "not an object"},
        {"apiVersion: v1\nkind: Pod\nmetadata: {name: p}\n", "no pod spec"},
        {"apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec: []\n", "no pod spec"},
        {"apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: d}\nspec: {replicas: 1}\n",
         "no pod template with a spec"},
        {"apiVersion: example.com/v1\nkind: Job\nmetadata: {name: j}\nspec:\n  template:\n"
         "    spec: " CONTAINERS "\n",
         "no pod template"},
        {"apiVersion: v1\nkind: List\nitems: []\n", "an empty List"},
        {"apiVersion: ray.io/v1\nkind: RayCluster\nmetadata: {name: r}\nspec: {}\n",
         "no pod template"},
        {"apiVersion: v1\nkind: List\nitems:\n- kind: List\n  items:\n  - kind: List\n    items:\n"
         "    - kind: List\n      items:\n      - kind: List\n        items:\n        - kind: Pod\n"
         "          spec: " CONTAINERS "\n",
         "a List nested too deep"},
    };
    for (size_t i = 0; i < N_ELEMS(cases); i++) {
        struct yd_stream s;
        struct mf_set set;
        collect(cases[i].yaml, &s, &set);
        assert_int_equal(set.templates, 0);
        assert_int_equal(set.count, 1);
        assert_int_equal(set.entries[0].type, MF_SKIPPED);
        if (strcmp(set.entries[0].reason, cases[i].reason) != 0)
            fail_msg("case %zu: reason \"%s\", want \"%s\"", i, set.entries[0].reason,
                     cases[i].reason);
        mf_set_clear(&set);
        yd_stream_clear(&s);
    }
}

static void test_stream_positions_and_order(void **state)
{
    (void)state;
    const char *text =
        "# leading comment\n"
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c, namespace: n1}\n"
        "---\n"
        "---\n"
        "apiVersion: v1\nkind: Pod\nmetadata: {name: p, namespace: n2}\n"
        "spec: " CONTAINERS "\n"
        "---\n"
        "apiVersion: v1\nkind: List\nitems:\n- kind: Service\n  metadata: {name: s}\n"
        "- kind: Pod\n  metadata: {name: q}\n  spec: " CONTAINERS "\n";
    struct yd_stream s;
    struct mf_set set;
    collect(text, &s, &set);
    assert_int_equal(set.count, 4);
    assert_int_equal(set.templates, 2);
    assert_int_equal(set.skipped, 2);
    assert_int_equal(set.entries[0].type, MF_SKIPPED);
    assert_int_equal(set.entries[0].doc_number, 1);
    assert_int_equal(set.entries[0].line, 2);
    assert_string_equal(set.entries[0].namespace, "n1");
    assert_int_equal(set.entries[1].type, MF_TEMPLATE);
    assert_int_equal(set.entries[1].doc, 1);
    assert_int_equal(set.entries[1].doc_number, 3);
    assert_int_equal(set.entries[1].line, 7);
    assert_string_equal(set.entries[1].name, "p");
    assert_int_equal(set.entries[2].type, MF_SKIPPED);
    assert_string_equal(set.entries[2].object_ptr, "/items/0");
    assert_string_equal(set.entries[2].kind, "Service");
    assert_int_equal(set.entries[3].type, MF_TEMPLATE);
    assert_string_equal(set.entries[3].template_ptr, "/items/1");
    assert_int_equal(set.entries[3].doc_number, 4);
    mf_set_clear(&set);
    yd_stream_clear(&s);
}

/* ---- the Pod built ---------------------------------------------------------------- */

static void test_pod_from_template(void **state)
{
    (void)state;
    const char *text = "apiVersion: apps/v1\nkind: Deployment\n"
                       "metadata: {name: train, namespace: ml, labels: {team: a}}\n"
                       "spec:\n  template:\n"
                       "    metadata:\n      name: ignored\n      namespace: ignored\n"
                       "      labels: {app: train}\n      annotations: {a: b}\n"
                       "      creationTimestamp: null\n"
                       "    spec: " CONTAINERS "\n";
    struct yd_stream s;
    struct mf_set set;
    collect(text, &s, &set);
    const struct mf_entry *e = nth_template(&set, 0);
    json_t *meta = json_object_get(e->pod, "metadata");
    assert_json_eq(json_object_get(meta, "labels"), "{\"app\":\"train\"}");
    assert_json_eq(json_object_get(meta, "annotations"), "{\"a\":\"b\"}");
    assert_string_equal(json_string_value(json_object_get(meta, "namespace")), "ml");
    assert_null(json_object_get(meta, "name"));
    assert_null(json_object_get(meta, "creationTimestamp"));
    const char *gen = json_string_value(json_object_get(meta, "generateName"));
    assert_non_null(gen);
    assert_int_equal(strncmp(gen, "train-", 6), 0);
    json_t *owner = json_array_get(json_object_get(meta, "ownerReferences"), 0);
    assert_string_equal(json_string_value(json_object_get(owner, "kind")), "ReplicaSet");
    assert_string_equal(json_string_value(json_object_get(owner, "apiVersion")), "apps/v1");
    assert_true(json_is_true(json_object_get(owner, "controller")));
    char want_gen[600];
    snprintf(want_gen, sizeof(want_gen), "%s-", json_string_value(json_object_get(owner, "name")));
    assert_string_equal(gen, want_gen);
    assert_int_equal(strlen(json_string_value(json_object_get(owner, "uid"))), 36);
    assert_string_equal(e->owner_name, json_string_value(json_object_get(owner, "name")));
    assert_string_equal(e->namespace, "ml");
    mf_set_clear(&set);
    yd_stream_clear(&s);

    /* A StatefulSet's pods have fixed names; a bare Pod keeps its own metadata. */
    collect("apiVersion: apps/v1\nkind: StatefulSet\nmetadata: {name: db}\nspec:\n  template:\n"
            "    spec: " CONTAINERS
            "\n---\nkind: Pod\nmetadata: {name: p, uid: x}\nspec: " CONTAINERS "\n",
            &s, &set);
    assert_string_equal(json_string_value(json_object_get(
                            json_object_get(nth_template(&set, 0)->pod, "metadata"), "name")),
                        "db-0");
    assert_json_eq(json_object_get(nth_template(&set, 1)->pod, "metadata"),
                   "{\"name\":\"p\",\"uid\":\"x\"}");
    mf_set_clear(&set);
    yd_stream_clear(&s);
}

/* A pointer into an entry's Pod and where it maps in the document (NULL: nowhere). */
struct map_case {
    const char *in;
    const char *out;
};

static void expect_maps(const struct mf_entry *e, const struct map_case *cases, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        char *out = NULL;
        enum gg_status st = mf_map_pointer(e, cases[i].in, &out);
        if (cases[i].out) {
            if (st != GG_OK || strcmp(out, cases[i].out) != 0)
                fail_msg("%s: got %s", cases[i].in, out ? out : "(unmappable)");
        } else if (st != GG_ERR_INVALID) {
            fail_msg("%s: mapped to %s, want unmappable", cases[i].in, out);
        }
        free(out);
    }
}

/* The labels an operator adds and the owner chain of the pods built for its kinds. */
static const struct {
    const char *text;
    size_t n;             /* which template */
    const char *labels;   /* the pod's labels, exactly */
    const char *owners;   /* the entry's owner chain, exactly */
    const char *pod_name; /* metadata.name, or NULL for generateName */
} operator_cases[] = {
    {"apiVersion: leaderworkerset.x-k8s.io/v1\nkind: LeaderWorkerSet\nmetadata: {name: vllm}\n"
     "spec:\n  leaderWorkerTemplate:\n    leaderTemplate:\n      metadata: {labels: {role: l}}\n"
     "      spec: " CONTAINERS "\n    workerTemplate:\n      spec: " CONTAINERS "\n",
     1,
     "{\"leaderworkerset.sigs.k8s.io/name\":\"vllm\",\"leaderworkerset.sigs.k8s.io/group-index\":"
     "\"0\",\"leaderworkerset.sigs.k8s.io/worker-index\":\"1\"}",
     "[{\"kind\":\"LeaderWorkerSet\",\"name\":\"vllm\"},{\"kind\":\"StatefulSet\",\"name\":"
     "\"vllm\"},"
     "{\"kind\":\"Pod\",\"name\":\"vllm-0\"},{\"kind\":\"StatefulSet\",\"name\":\"vllm-0\"}]",
     "vllm-0-1"},
    {"apiVersion: ray.io/v1\nkind: RayService\nmetadata: {name: llm}\nspec:\n  rayClusterConfig:\n"
     "    headGroupSpec:\n      template:\n        spec: " CONTAINERS "\n    workerGroupSpecs:\n"
     "    - groupName: gpu\n      template:\n        metadata: {labels: {ray.io/group: forged}}\n"
     "        spec: " CONTAINERS "\n",
     1,
     "{\"ray.io/group\":\"gpu\",\"ray.io/cluster\":\"llm\",\"ray.io/node-type\":\"worker\","
     "\"ray.io/is-ray-node\":\"yes\",\"ray.io/identifier\":\"llm-worker\","
     "\"app.kubernetes.io/name\":\"kuberay\",\"app.kubernetes.io/created-by\":\"kuberay-operator\","
     "\"ray.io/serve\":\"true\",\"ray.io/originated-from-crd\":\"RayService\","
     "\"ray.io/originated-from-cr-name\":\"llm\"}",
     "[{\"kind\":\"RayService\",\"name\":\"llm\"},{\"kind\":\"RayCluster\",\"name\":\"llm\"}]",
     NULL},
    {"apiVersion: kubeflow.org/v1\nkind: PyTorchJob\nmetadata: {name: ft}\nspec:\n"
     "  pytorchReplicaSpecs:\n    Master:\n      template:\n        spec: " CONTAINERS "\n",
     0,
     "{\"training.kubeflow.org/job-name\":\"ft\",\"training.kubeflow.org/replica-type\":\"master\","
     "\"training.kubeflow.org/replica-index\":\"0\",\"training.kubeflow.org/operator-name\":"
     "\"pytorchjob-controller\",\"training.kubeflow.org/job-role\":\"master\"}",
     "[{\"kind\":\"PyTorchJob\",\"name\":\"ft\"}]", "ft-master-0"},
    {"apiVersion: kubeflow.org/v1\nkind: Notebook\nmetadata: {name: nb, labels: {team: a}}\n"
     "spec:\n  template:\n    metadata: {labels: {dropped: x}}\n    spec: " CONTAINERS "\n",
     0, "{\"team\":\"a\",\"statefulset\":\"nb\",\"notebook-name\":\"nb\"}",
     "[{\"kind\":\"Notebook\",\"name\":\"nb\"},{\"kind\":\"StatefulSet\",\"name\":\"nb\"}]",
     "nb-0"},
    {"apiVersion: batch.volcano.sh/v1alpha1\nkind: Job\nmetadata: {name: vj, namespace: ml}\n"
     "spec:\n  queue: q\n  tasks:\n  - name: w\n    template:\n      spec: " CONTAINERS "\n",
     0,
     "{\"volcano.sh/job-name\":\"vj\",\"volcano.sh/job-namespace\":\"ml\",\"volcano.sh/"
     "queue-name\":"
     "\"q\",\"volcano.sh/task-spec\":\"w\"}",
     "[{\"kind\":\"Job\",\"name\":\"vj\"}]", "vj-w-0"},
};

static void test_operator_labels_and_owners(void **state)
{
    (void)state;
    for (size_t i = 0; i < N_ELEMS(operator_cases); i++) {
        struct yd_stream s;
        struct mf_set set;
        collect(operator_cases[i].text, &s, &set);
        const struct mf_entry *e = nth_template(&set, operator_cases[i].n);
        json_t *meta = json_object_get(e->pod, "metadata");
        assert_json_eq(json_object_get(meta, "labels"), operator_cases[i].labels);
        assert_json_eq(e->owners, operator_cases[i].owners);
        const char *name = json_string_value(json_object_get(meta, "name"));
        if (operator_cases[i].pod_name)
            assert_string_equal(name, operator_cases[i].pod_name);
        else
            assert_null(name);
        mf_set_clear(&set);
        yd_stream_clear(&s);
    }
}

/* A Notebook's pod takes the Notebook's own metadata: patches on it go there. */
static void test_notebook_metadata_maps_to_the_notebook(void **state)
{
    (void)state;
    struct yd_stream s;
    struct mf_set set;
    collect("apiVersion: kubeflow.org/v1\nkind: Notebook\nmetadata: {name: nb}\nspec:\n"
            "  template:\n    spec: " CONTAINERS "\n",
            &s, &set);
    static const struct map_case ptrs[] = {
        {"/metadata/annotations/a", "/metadata/annotations/a"},
        {"/spec/containers/0/image", "/spec/template/spec/containers/0/image"},
        {"/metadata/name", NULL},
    };
    expect_maps(nth_template(&set, 0), ptrs, N_ELEMS(ptrs));
    mf_set_clear(&set);
    yd_stream_clear(&s);
}

/* A KServe predictor: the model spec becomes kserve-container, and patches map back there. */
static void test_kserve_predictor(void **state)
{
    (void)state;
    struct yd_stream s;
    struct mf_set set;
    collect("apiVersion: serving.kserve.io/v1beta1\nkind: InferenceService\n"
            "metadata: {name: llama, labels: {team: a}}\nspec:\n  predictor:\n"
            "    minReplicas: 1\n    nodeSelector: {zone: a}\n    labels: {tier: gold}\n"
            "    model:\n      modelFormat: {name: huggingface}\n      storageUri: hf://x\n"
            "      resources: {limits: {nvidia.com/gpu: '2'}}\n",
            &s, &set);
    assert_int_equal(set.templates, 1);
    const struct mf_entry *e = nth_template(&set, 0);
    assert_string_equal(e->path, "spec.predictor");
    assert_string_equal(e->owner_kind, "ReplicaSet");
    assert_int_equal(strncmp(e->owner_name, "llama-predictor-", 16), 0);
    assert_json_eq(
        json_object_get(e->pod, "spec"),
        "{\"nodeSelector\":{\"zone\":\"a\"},\"containers\":[{\"name\":\"kserve-container\","
        "\"resources\":{\"limits\":{\"nvidia.com/gpu\":\"2\"}}}]}");
    assert_json_eq(json_object_get(json_object_get(e->pod, "metadata"), "labels"),
                   "{\"team\":\"a\",\"tier\":\"gold\",\"serving.kserve.io/inferenceservice\":"
                   "\"llama\",\"component\":\"predictor\",\"app\":\"isvc.llama-predictor\"}");
    assert_string_equal(json_string_value(json_object_get(json_array_get(e->owners, 1), "kind")),
                        "Deployment");
    /* Back onto the component: its fields, labels, annotations; the model for container 0. */
    static const struct map_case ptrs[] = {
        {"/spec/containers/0/resources/limits", "/spec/predictor/model/resources/limits"},
        {"/spec/nodeSelector/x", "/spec/predictor/nodeSelector/x"},
        {"/metadata/annotations/a", "/spec/predictor/annotations/a"},
        {"/metadata/labels", "/spec/predictor/labels"},
        {"/spec/containers/1", NULL},
        {"/spec/containers", NULL},
        {"/spec", NULL},
        {"/metadata/finalizers", NULL},
        {"/metadata", NULL},
    };
    expect_maps(e, ptrs, N_ELEMS(ptrs));
    /* A key added to annotations the component lacks: the map is added first. */
    json_t *patch = js("[{\"op\":\"add\",\"path\":\"/metadata/annotations/a\",\"value\":\"b\"}]");
    json_t *mapped = NULL, *dropped = NULL;
    struct gg_err err = {{0}};
    assert_int_equal(mf_map_patch(e, json_array_get(s.docs, 0), patch, &mapped, &dropped, &err),
                     GG_OK);
    assert_json_eq(mapped,
                   "[{\"op\":\"add\",\"path\":\"/spec/predictor/annotations\",\"value\":{}},"
                   "{\"op\":\"add\",\"path\":\"/spec/predictor/annotations/a\",\"value\":\"b\"}]");
    assert_int_equal(json_array_size(dropped), 0);
    json_decref(patch);
    json_decref(mapped);
    json_decref(dropped);
    mf_set_clear(&set);
    yd_stream_clear(&s);
}

/* ---- mapping back ----------------------------------------------------------------- */

static void test_map_pointer(void **state)
{
    (void)state;
    struct yd_stream s;
    struct mf_set set;
    collect("apiVersion: v1\nkind: List\nitems:\n- apiVersion: batch/v1\n  kind: CronJob\n"
            "  metadata: {name: cj}\n  spec:\n    jobTemplate:\n      spec:\n        template:\n"
            "          spec: " CONTAINERS "\n---\nkind: Pod\nmetadata: {name: p}\nspec: " CONTAINERS
            "\n",
            &s, &set);
    const struct mf_entry *cj = nth_template(&set, 0), *pod = nth_template(&set, 1);
    static const struct map_case tpl_cases[] = {
        {"/metadata/labels/a~1b", "/items/0/spec/jobTemplate/spec/template/metadata/labels/a~1b"},
        {"/metadata", "/items/0/spec/jobTemplate/spec/template/metadata"},
        {"/spec/containers/0/image",
         "/items/0/spec/jobTemplate/spec/template/spec/containers/0/image"},
        {"/spec", "/items/0/spec/jobTemplate/spec/template/spec"},
        {"/metadata/namespace", NULL},
        {"/metadata/name", NULL},
        {"/metadata/generateName", NULL},
        {"/metadata/ownerReferences/0", NULL},
        {"/metadata/namespaces", "/items/0/spec/jobTemplate/spec/template/metadata/namespaces"},
        {"/status/phase", NULL},
        {"/apiVersion", NULL},
        {"", NULL},
        {"/specs", NULL},
    };
    expect_maps(cj, tpl_cases, N_ELEMS(tpl_cases));
    /* A Pod document is its own template: only the namespace is off limits. */
    char *out = NULL;
    assert_int_equal(mf_map_pointer(pod, "/metadata/name", &out), GG_OK);
    assert_string_equal(out, "/metadata/name");
    free(out);
    assert_int_equal(mf_map_pointer(pod, "/metadata/namespace", &out), GG_ERR_INVALID);
    mf_set_clear(&set);
    yd_stream_clear(&s);
}

static void test_map_patch_applies_to_the_template(void **state)
{
    (void)state;
    struct yd_stream s;
    struct mf_set set;
    struct gg_err err = {{0}};
    collect("apiVersion: ray.io/v1\nkind: RayCluster\nmetadata: {name: r}\nspec:\n"
            "  headGroupSpec:\n    template:\n      spec: " CONTAINERS "\n"
            "  workerGroupSpecs:\n  - template:\n      metadata: {labels: {a: b}}\n"
            "      spec: " CONTAINERS "\n",
            &s, &set);
    json_t *doc = json_array_get(s.docs, 0);
    json_t *original = json_deep_copy(doc);
    json_t *patch = js("[{\"op\":\"add\",\"path\":\"/metadata/labels/x\",\"value\":\"1\"},"
                       "{\"op\":\"add\",\"path\":\"/spec/tolerations\",\"value\":[]},"
                       "{\"op\":\"add\",\"path\":\"/metadata/ownerReferences/-\",\"value\":{}},"
                       "{\"op\":\"replace\",\"path\":\"/metadata/namespace\",\"value\":\"x\"}]");
    /* The head template has no metadata: it is added first. */
    const struct mf_entry *head = nth_template(&set, 0);
    json_t *mapped = NULL, *dropped = NULL;
    json_t *head_patch =
        js("[{\"op\":\"add\",\"path\":\"/metadata/labels\",\"value\":{\"x\":\"1\"}},"
           "{\"op\":\"add\",\"path\":\"/spec/tolerations\",\"value\":[]}]");
    assert_int_equal(mf_map_patch(head, doc, head_patch, &mapped, &dropped, &err), GG_OK);
    assert_json_eq(mapped, "[{\"op\":\"add\",\"path\":\"/spec/headGroupSpec/template/metadata\","
                           "\"value\":{}},"
                           "{\"op\":\"add\",\"path\":\"/spec/headGroupSpec/template/metadata/"
                           "labels\",\"value\":{\"x\":\"1\"}},"
                           "{\"op\":\"add\",\"path\":\"/spec/headGroupSpec/template/spec/"
                           "tolerations\",\"value\":[]}]");
    assert_int_equal(json_array_size(dropped), 0);
    assert_int_equal(jp_apply(doc, mapped, &err), GG_OK);
    assert_json_eq(
        json_object_get(json_object_get(json_object_get(doc, "spec"), "headGroupSpec"), "template"),
        "{\"metadata\":{\"labels\":{\"x\":\"1\"}},\"spec\":{\"containers\":"
        "[{\"name\":\"c\",\"image\":\"x\"}],\"tolerations\":[]}}");
    json_decref(dropped);
    json_decref(head_patch);
    json_decref(mapped);
    json_object_del(json_object_get(json_object_get(doc, "spec"), "headGroupSpec"), "template");
    json_object_del(json_object_get(json_object_get(original, "spec"), "headGroupSpec"),
                    "template");

    /* The worker template has labels; controller-set fields are dropped. */
    const struct mf_entry *worker = nth_template(&set, 1);
    assert_int_equal(mf_map_patch(worker, doc, patch, &mapped, &dropped, &err), GG_OK);
    assert_int_equal(json_array_size(mapped), 2);
    assert_int_equal(json_array_size(dropped), 2);
    assert_int_equal(jp_apply(doc, mapped, &err), GG_OK);
    assert_json_eq(
        json_object_get(
            json_array_get(json_object_get(json_object_get(doc, "spec"), "workerGroupSpecs"), 0),
            "template"),
        "{\"metadata\":{\"labels\":{\"a\":\"b\",\"x\":\"1\"}},\"spec\":{\"containers\":"
        "[{\"name\":\"c\",\"image\":\"x\"}],\"tolerations\":[]}}");
    /* Nothing else in the document moved. */
    json_object_del(
        json_array_get(json_object_get(json_object_get(doc, "spec"), "workerGroupSpecs"), 0),
        "template");
    json_object_del(
        json_array_get(json_object_get(json_object_get(original, "spec"), "workerGroupSpecs"), 0),
        "template");
    assert_true(json_equal(doc, original));
    json_decref(mapped);
    json_decref(dropped);
    json_decref(patch);
    json_decref(original);

    /* A whole metadata value loses what the controller sets. */
    patch = js("[{\"op\":\"replace\",\"path\":\"/metadata\",\"value\":{\"name\":\"n\","
               "\"namespace\":\"ns\",\"labels\":{\"l\":\"v\"}}}]");
    assert_int_equal(mf_map_patch(worker, doc, patch, &mapped, NULL, &err), GG_OK);
    assert_json_eq(mapped, "[{\"op\":\"replace\",\"path\":\"/spec/workerGroupSpecs/0/template/"
                           "metadata\",\"value\":{\"labels\":{\"l\":\"v\"}}}]");
    json_decref(mapped);
    json_decref(patch);
    mf_set_clear(&set);
    yd_stream_clear(&s);
}

/* ---- YAML out ----------------------------------------------------------------------- */

static void round_trip(const char *json_text)
{
    json_t *docs = js(json_text), *back = NULL;
    char *yaml = NULL;
    size_t len = 0;
    struct gg_err err = {{0}};
    if (mf_emit_yaml(docs, &yaml, &len, &err) != GG_OK)
        fail_msg("emit: %s", err.msg);
    assert_int_equal(strlen(yaml), len);
    if (yd_load_all(yaml, len, "out.yaml", NULL, &back, &err) != GG_OK)
        fail_msg("reading back: %s\n%s", err.msg, yaml);
    if (!json_equal(docs, back)) {
        char *b = json_dumps(back, JSON_COMPACT);
        fail_msg("round trip changed the documents:\n%s\nback: %s\nwant: %s", yaml, b, json_text);
    }
    free(yaml);
    json_decref(docs);
    json_decref(back);
}

static void test_emit_round_trips(void **state)
{
    (void)state;
    round_trip("[{\"a\":1}]");
    round_trip("[{\"a\":1},{\"b\":[1,2,{\"c\":null}]},[],{},\"text\",7,null]");
    round_trip("[{\"strings\":[\"yes\",\"no\",\"on\",\"off\",\"y\",\"n\",\"Y\",\"True\",\"NULL\","
               "\"~\",\"\",\"1\",\"0777\",\"0x1f\",\"1e3\",\"1.5\",\".inf\",\"-.inf\",\".NaN\","
               "\"-\",\"- a\",\"a: b\",\"a:b\",\"#c\",\"a #c\",\" lead\",\"trail \",\"@x\","
               "\"`x\",\"!x\",\"&x\",\"*x\",\"|\",\">\",\"%x\",\"{x}\",\"[x]\",\"a,b\","
               "\"nvidia/cuda:12.0-base\",\"2024-01-01\",\"12:30\",\"<<\",\"=\",\"?\","
               "\"multi\\nline\\n\",\"no newline\\nat end\",\"trailing spaces  \\nx\","
               "\"tab\\there\",\"bell\\u0007\",\"\\u00e9\\u4e2d\\ud83d\\ude00\",\"\\u2028x\"]}]");
    round_trip("[{\"numbers\":[0,-1,9223372036854775807,-9223372036854775808,1.5,-0.5,0.1,"
               "1e300,5e-324,123456789.123,1.0000000000000002]}]");
    round_trip("[{\"keys\":{\"on\":1,\"yes\":2,\"1\":3,\"\":4,\"a b\":5,\"a/b~c\":6,\"null\":7,"
               "\"<<\":8,\"x: y\":9}}]");
    round_trip("[{\"empty\":{\"o\":{},\"a\":[],\"s\":\"\"},\"bools\":[true,false]}]");
    /* Deep but within the bound. */
    char deep[4096] = "[";
    for (int i = 0; i < 100; i++)
        strcat(deep, "{\"d\":");
    strcat(deep, "1");
    for (int i = 0; i < 100; i++)
        strcat(deep, "}");
    strcat(deep, "]");
    round_trip(deep);
}

static void test_emit_corpus_like_manifest(void **state)
{
    (void)state;
    const char *text = "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: d\n"
                       "  annotations:\n    note: |\n      line one\n      line two\n"
                       "spec:\n  replicas: 3\n  template:\n    spec:\n      containers:\n"
                       "      - name: c\n        image: nvidia/cuda:12.2.0-base\n"
                       "        args: [\"--flag=on\", \"yes\"]\n        resources:\n"
                       "          limits: {nvidia.com/gpu: 1, memory: 18Gi, cpu: 500m}\n---\n"
                       "kind: ConfigMap\ndata: {enabled: \"true\", port: \"8080\"}\n";
    struct gg_err err = {{0}};
    json_t *docs = NULL, *back = NULL;
    char *yaml = NULL;
    size_t len = 0;
    assert_int_equal(yd_load_all(text, strlen(text), "in", NULL, &docs, &err), GG_OK);
    assert_int_equal(mf_emit_yaml(docs, &yaml, &len, &err), GG_OK);
    assert_int_equal(yd_load_all(yaml, len, "out", NULL, &back, &err), GG_OK);
    assert_true(json_equal(docs, back));
    assert_non_null(strstr(yaml, "\n---\n"));
    assert_non_null(strstr(yaml, "image: nvidia/cuda:12.2.0-base\n"));
    free(yaml);
    json_decref(docs);
    json_decref(back);
}

static void test_emit_refuses_too_deep(void **state)
{
    (void)state;
    json_t *v = json_integer(1);
    for (int i = 0; i < 400; i++)
        v = json_pack("{s:o}", "d", v);
    json_t *docs = json_pack("[o]", v);
    char *yaml = NULL;
    size_t len = 0;
    struct gg_err err = {{0}};
    assert_int_equal(mf_emit_yaml(docs, &yaml, &len, &err), GG_ERR_TOOBIG);
    assert_non_null(strstr(err.msg, "nesting deeper"));
    json_decref(docs);
}

/* ---- node lines ------------------------------------------------------------------------ */

static void test_node_lines(void **state)
{
    (void)state;
    const char *text = "name: s\n"
                       "cases:\n"
                       "  - name: one\n"
                       "    expect:\n"
                       "      allowed: true\n"
                       "  - name: two\n"
                       "    object: {kind: Pod, \"a/b\": 1}\n"
                       "---\n"
                       "x: [1,\n"
                       "  2]\n";
    json_t *lines = NULL;
    struct gg_err err = {{0}};
    assert_int_equal(mf_node_lines(text, strlen(text), 1000, &lines, &err), GG_OK);
    assert_int_equal(json_array_size(lines), 2);
    const json_t *d = json_array_get(lines, 0);
    assert_int_equal(mf_line_of(d, ""), 1);
    assert_int_equal(mf_line_of(d, "/name"), 1);
    assert_int_equal(mf_line_of(d, "/cases/0"), 3);
    assert_int_equal(mf_line_of(d, "/cases/0/expect/allowed"), 5);
    assert_int_equal(mf_line_of(d, "/cases/0/expect/nothing/here"), 4);
    assert_int_equal(mf_line_of(d, "/cases/1/object/a~1b"), 7);
    assert_int_equal(mf_line_of(json_array_get(lines, 1), "/x/1"), 10);
    json_decref(lines);
    assert_int_equal(mf_node_lines("a: [\n", 5, 10, &lines, &err), GG_ERR_PARSE);
}

/* ---- cluster state ---------------------------------------------------------------------- */

static void test_cluster_state(void **state)
{
    (void)state;
    static const struct {
        const char *text;
        enum gg_status st;
        const char *msg;
        size_t kept, counts[MF_STATE_N]; /* items left; pods, claims, templates, classes, slices,
                                            GPUQuotas, other */
    } cases[] = {
        {"{\"apiVersion\":\"v1\",\"kind\":\"List\",\"items\":[{\"apiVersion\":\"v1\",\"kind\":"
         "\"Pod\",\"metadata\":{\"name\":\"a\",\"namespace\":\"n\"},\"spec\":{}}]}",
         GG_OK,
         NULL,
         1,
         {1, 0, 0, 0, 0, 0, 0}},
        {"{\"kind\":\"PodList\",\"items\":[]}", GG_OK, NULL, 0, {0}},
        /* kubectl get pods,resourceclaims,resourceclaimtemplates,deviceclasses,gpuquotas,
         * services: any order */
        {"{\"kind\":\"List\",\"items\":[{\"kind\":\"ResourceClaim\",\"metadata\":{}},"
         "{\"kind\":\"Service\",\"metadata\":{}},{\"metadata\":{}},"
         "{\"kind\":\"ResourceClaimTemplate\",\"metadata\":{}},{\"kind\":\"Deployment\","
         "\"metadata\":{}},{\"kind\":\"DeviceClass\",\"metadata\":{}},"
         "{\"kind\":\"GPUQuota\",\"metadata\":{}}]}",
         GG_OK,
         NULL,
         5,
         {1, 1, 1, 1, 0, 1, 2}},
        {"{\"kind\":\"List\"}", GG_ERR_INVALID, "items must be an array", 0, {0}},
        {"{\"kind\":\"Pod\",\"items\":[]}", GG_ERR_INVALID, "want List or PodList", 0, {0}},
        {"{\"kind\":\"List\",\"items\":[7]}", GG_ERR_INVALID, "items[0] is not an object", 0, {0}},
        {"{\"kind\":\"List\",\"items\":[{\"kind\":\"Pod\"}]}",
         GG_ERR_INVALID,
         "items[0].metadata must be an object",
         0,
         {0}},
        {"[]", GG_ERR_INVALID, "an object", 0, {0}},
        {"kind: List\n", GG_ERR_PARSE, "state.json:1:", 0, {0}},
    };
    for (size_t i = 0; i < N_ELEMS(cases); i++) {
        json_t *st_json = NULL;
        struct gg_err err = {{0}};
        size_t counts[MF_STATE_N];
        enum gg_status st = mf_cluster_state(cases[i].text, strlen(cases[i].text), "state.json",
                                             &st_json, counts, &err);
        if (st != cases[i].st)
            fail_msg("case %zu: status %d, want %d (%s)", i, st, cases[i].st, err.msg);
        if (cases[i].msg && !strstr(err.msg, cases[i].msg))
            fail_msg("case %zu: message \"%s\" lacks \"%s\"", i, err.msg, cases[i].msg);
        if (st == GG_OK) {
            assert_int_equal(json_array_size(json_object_get(st_json, "items")), cases[i].kept);
            assert_memory_equal(counts, cases[i].counts, sizeof(counts));
        }
        json_decref(st_json);
    }
}

/* ---- bounds ------------------------------------------------------------------------------- */

static void test_object_bound(void **state)
{
    (void)state;
    json_t *items = json_array();
    for (int i = 0; i < MF_MAX_OBJECTS + 1; i++)
        json_array_append_new(items, json_integer(i));
    struct yd_doc pos = {1, 3, 1};
    struct yd_stream s = {json_pack("[{s:s,s:o}]", "kind", "List", "items", items), &pos, 1};
    struct mf_set set;
    struct gg_err err = {{0}};
    assert_int_equal(mf_collect(&s, "big.yaml", &set, &err), GG_ERR_TOOBIG);
    assert_non_null(strstr(err.msg, "big.yaml:3:"));
    json_decref(s.docs);
}

static void test_limits(void **state)
{
    (void)state;
    struct yd_limits lim;
    mf_yd_limits(&lim);
    assert_int_equal(lim.max_bytes, MF_MAX_FILE_BYTES);
    assert_int_equal(lim.max_depth, MF_MAX_DEPTH);
    assert_int_equal(lim.max_nodes, MF_MAX_NODES);
    mf_set_clear(NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_kind),
        cmocka_unit_test(test_skipped_documents),
        cmocka_unit_test(test_stream_positions_and_order),
        cmocka_unit_test(test_pod_from_template),
        cmocka_unit_test(test_operator_labels_and_owners),
        cmocka_unit_test(test_notebook_metadata_maps_to_the_notebook),
        cmocka_unit_test(test_kserve_predictor),
        cmocka_unit_test(test_map_pointer),
        cmocka_unit_test(test_map_patch_applies_to_the_template),
        cmocka_unit_test(test_emit_round_trips),
        cmocka_unit_test(test_emit_corpus_like_manifest),
        cmocka_unit_test(test_emit_refuses_too_deep),
        cmocka_unit_test(test_node_lines),
        cmocka_unit_test(test_cluster_state),
        cmocka_unit_test(test_object_bound),
        cmocka_unit_test(test_limits),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
