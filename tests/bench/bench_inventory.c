/*
 * bench_inventory.c - how long a relist of N pods takes and what the
 * inventory then holds: a PodList of N realistic pods (managedFields,
 * env, probes, volumes, status; every pod holds GPUs, the worst case),
 * made from T templates as a cluster's controllers make them (the pods of
 * one template differ in name, uid, node and container id, not in what a
 * charge reads), is generated as it is read, in 64 KiB reads as the network
 * would hand it over, through what the informer does: the list splitter,
 * inf_scan_pod (parse + trim), inv_stage_add_pod (each pod charged by the Lua
 * charge model, lua/intent.lua, through the charger and its memo, with
 * deploy/gpuguard.yaml), inv_stage_commit.  The list is never whole in
 * memory, and the generator's own CPU (measured in a pass of its own) is
 * left out of the figure.  RSS comes from /proc/self/statm before and after
 * (and the peak from VmHWM).  Run from the repository's root (it reads
 * policies/, lua/ and deploy/).
 *
 *   build/bench/bench_inventory [-n PODS] [--templates T] [--events E] [--compare]
 *
 * Without --templates every pod is a spec of its own (T = N).  --events
 * then sends E MODIFIED watch events, event i of pod i (the listed pods,
 * then new ones of the same templates), through the watch's path
 * (inf_parse_event, inv_upsert_pod) and times them apart.  --compare also times keeping every
 * trimmed pod in one array and calling inv_replace at the end, to show what the stage saves.
 */
#include "engine/charger.h"
#include "kube/informer.h"
#include "kube/inventory.h"
#include "engine/policy.h"

#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static double cpu_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static double rss_mb(void)
{
    long pages = 0, resident = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    if (f) {
        if (fscanf(f, "%ld %ld", &pages, &resident) != 2)
            resident = 0;
        fclose(f);
    }
    return resident * (double)sysconf(_SC_PAGESIZE) / 1e6;
}

static double peak_mb(void)
{
    char line[256];
    double kb = 0;
    FILE *f = fopen("/proc/self/status", "r");
    while (f && fgets(line, sizeof(line), f))
        if (sscanf(line, "VmHWM: %lf kB", &kb) == 1)
            break;
    if (f)
        fclose(f);
    return kb * 1024 / 1e6;
}

static const char *const resources[] = {"\"nvidia.com/gpu\":\"1\"", "\"nvidia.com/gpu\":\"8\"",
                                        "\"nvidia.com/mig-1g.10gb\":\"1\"",
                                        "\"nvidia.com/gpu.shared\":\"1\""};

#define TEMPLATE_MAX 8192 /* bytes of a template's pod */
#define ID_DIGITS 12      /* a pod's own number, written into its template's text */
#define ID_MARK "@@@@@@@@@@@@"

/*
 * Template t's pod as `kubectl get pods -o json` shows it, about 3.5 KB, with ID_MARK where
 * each pod's own number goes (name, uid, resourceVersion, node, container).  What a charge
 * reads (namespace, annotations, containers, nodeSelector) is the template's; its container's
 * name makes each template a spec of its own.
 */
static int template_json(char *out, size_t size, size_t t)
{
    return snprintf(
        out, size,
        "{\"apiVersion\":\"v1\",\"kind\":\"Pod\",\"metadata\":{\"annotations\":{"
        "\"gpuguard.io/decision\":\"exclusive on pool h100-train\",\"gpuguard.io/pool\":"
        "\"h100-train\"%s},\"creationTimestamp\":\"2024-05-01T10:00:00Z\",\"generateName\":"
        "\"train-%zu-\",\"labels\":{\"app\":\"train\",\"batch.kubernetes.io/job-name\":"
        "\"train-%zu\",\"gpuguard.io/workload-class\":\"%s\",\"team\":\"team-%zu\"},"
        "\"managedFields\":[{\"apiVersion\":\"v1\",\"fieldsType\":\"FieldsV1\",\"fieldsV1\":{"
        "\"f:metadata\":{\"f:generateName\":{},\"f:labels\":{\".\":{},\"f:app\":{}}},\"f:spec\":{"
        "\"f:containers\":{\"k:{\\\"name\\\":\\\"main\\\"}\":{\".\":{},\"f:image\":{},"
        "\"f:resources\":{\".\":{},\"f:limits\":{}}}}}},\"manager\":\"kube-controller-manager\","
        "\"operation\":\"Update\",\"time\":\"2024-05-01T10:00:00Z\"},{\"apiVersion\":\"v1\","
        "\"fieldsType\":\"FieldsV1\",\"fieldsV1\":{\"f:status\":{\"f:conditions\":{},"
        "\"f:containerStatuses\":{},\"f:phase\":{},\"f:podIP\":{}}},\"manager\":\"kubelet\","
        "\"operation\":\"Update\",\"subresource\":\"status\",\"time\":\"2024-05-01T10:00:09Z\"}],"
        "\"name\":\"train-%zu-" ID_MARK "\",\"namespace\":\"ns-%zu\",\"ownerReferences\":[{"
        "\"apiVersion\":\"batch/v1\",\"blockOwnerDeletion\":true,\"controller\":true,\"kind\":"
        "\"Job\",\"name\":\"train-%zu\",\"uid\":\"5f0c9b1e-0000-4000-8000-%012zu\"}],"
        "\"resourceVersion\":\"" ID_MARK "\",\"uid\":\"0a1b2c3d-0000-4000-8000-" ID_MARK "\"},"
        "\"spec\":{"
        "\"containers\":[{\"args\":[\"--epochs\",\"10\",\"--data\",\"/data/imagenet\"],"
        "\"command\":[\"python\",\"train.py\"],\"env\":[{\"name\":\"NCCL_DEBUG\",\"value\":"
        "\"INFO\"},{\"name\":\"POD_NAME\",\"valueFrom\":{\"fieldRef\":{\"apiVersion\":\"v1\","
        "\"fieldPath\":\"metadata.name\"}}}],\"image\":\"nvcr.io/nvidia/pytorch:24.04-py3\","
        "\"imagePullPolicy\":\"IfNotPresent\",\"name\":\"main-%zu\",\"resources\":{\"limits\":{"
        "\"cpu\":\"8\",\"memory\":\"64Gi\",%s},\"requests\":{\"cpu\":\"8\",\"memory\":\"64Gi\","
        "%s}},\"terminationMessagePath\":\"/dev/termination-log\",\"terminationMessagePolicy\":"
        "\"File\",\"volumeMounts\":[{\"mountPath\":\"/data\",\"name\":\"data\"},{\"mountPath\":"
        "\"/var/run/secrets/kubernetes.io/serviceaccount\",\"name\":\"kube-api-access-abcde\","
        "\"readOnly\":true}]}],\"dnsPolicy\":\"ClusterFirst\",\"enableServiceLinks\":true,"
        "\"nodeName\":\"gpu-node-" ID_MARK "\",\"nodeSelector\":{\"gpuguard.io/pool\":"
        "\"h100-train\"},"
        "\"preemptionPolicy\":\"PreemptLowerPriority\",\"priority\":0,\"restartPolicy\":"
        "\"Never\",\"schedulerName\":\"default-scheduler\",\"securityContext\":{},"
        "\"serviceAccountName\":\"default\",\"terminationGracePeriodSeconds\":30,"
        "\"tolerations\":[{\"effect\":\"NoSchedule\",\"key\":\"nvidia.com/gpu\",\"operator\":"
        "\"Equal\",\"value\":\"h100-train\"},{\"effect\":\"NoExecute\",\"key\":"
        "\"node.kubernetes.io/not-ready\",\"operator\":\"Exists\",\"tolerationSeconds\":300}],"
        "\"volumes\":[{\"name\":\"data\",\"persistentVolumeClaim\":{\"claimName\":\"imagenet\"}},"
        "{\"name\":\"kube-api-access-abcde\",\"projected\":{\"defaultMode\":420,\"sources\":[{"
        "\"serviceAccountToken\":{\"expirationSeconds\":3607,\"path\":\"token\"}},{"
        "\"configMap\":{\"items\":[{\"key\":\"ca.crt\",\"path\":\"ca.crt\"}],\"name\":"
        "\"kube-root-ca.crt\"}}]}}]},\"status\":{\"conditions\":[{\"lastProbeTime\":null,"
        "\"lastTransitionTime\":\"2024-05-01T10:00:09Z\",\"status\":\"True\",\"type\":"
        "\"Ready\"}],\"containerStatuses\":[{\"containerID\":\"containerd://%052zu" ID_MARK "\","
        "\"image\":\"nvcr.io/nvidia/pytorch:24.04-py3\",\"imageID\":\"nvcr.io/nvidia/"
        "pytorch@sha256:%064zu\",\"lastState\":{},\"name\":\"main-%zu\",\"ready\":true,"
        "\"restartCount\":0,\"started\":true,\"state\":{\"running\":{\"startedAt\":"
        "\"2024-05-01T10:00:08Z\"}}}],\"hostIP\":\"10.0.%zu.%zu\",\"phase\":\"Running\","
        "\"podIP\":\"10.244.%zu.%zu\",\"qosClass\":\"Guaranteed\",\"startTime\":"
        "\"2024-05-01T10:00:00Z\"}}",
        t % 3 == 0 ? ",\"gpuguard.io/charge\":\"1000\"" : "", t, t, t % 2 ? "training" : "batch",
        t % 200, t, t % 200, t, t, t, resources[t % 4], resources[t % 4], t, t, t, t % 250, t % 250,
        t % 250, t % 250);
}

/* A template's text and where a pod's number goes in it. */
struct template
{
    char *text;
    size_t len;
    size_t marks[8], n_marks;
};

static bool template_make(struct template *tp, size_t t)
{
    char text[TEMPLATE_MAX];
    int n = template_json(text, sizeof(text), t);
    if (n <= 0 || (size_t)n >= sizeof(text) || !(tp->text = malloc((size_t)n)))
        return false;
    memcpy(tp->text, text, (size_t)n);
    tp->len = (size_t)n;
    tp->n_marks = 0;
    for (const char *p = text; (p = strstr(p, ID_MARK)) && tp->n_marks < 8; p += ID_DIGITS)
        tp->marks[tp->n_marks++] = (size_t)(p - text);
    return true;
}

/*
 * The PodList of n pods, pod i made from template i % n_templates, written piece by piece
 * into a buffer of 1 MiB and handed to feed as 64 KiB reads, as the network would: the list
 * is never whole in memory.  feed may be NULL (the generator's own cost).
 */
struct generator {
    struct template *templates;
    size_t n_templates;
    char *buf;
    size_t len;
    size_t bytes;
};

#define GEN_BUF (1u << 20)

static bool flush(struct generator *g, bool (*feed)(void *ctx, const char *p, size_t n), void *ctx)
{
    for (size_t off = 0; off < g->len; off += 65536)
        if (feed && !feed(ctx, g->buf + off, g->len - off < 65536 ? g->len - off : 65536))
            return false;
    g->bytes += g->len;
    g->len = 0;
    return true;
}

/* Pod i's text at out (room for its template's length), from its template. */
static size_t pod_text(const struct generator *g, size_t i, char *out)
{
    const struct template *tp = &g->templates[i % g->n_templates];
    char id[ID_DIGITS];
    memcpy(out, tp->text, tp->len);
    for (size_t d = ID_DIGITS, v = i; d > 0; d--, v /= 10)
        id[d - 1] = (char)('0' + v % 10);
    for (size_t m = 0; m < tp->n_marks; m++)
        memcpy(out + tp->marks[m], id, ID_DIGITS);
    return tp->len;
}

static bool generate(struct generator *g, size_t n,
                     bool (*feed)(void *ctx, const char *p, size_t n), void *ctx)
{
    static const char head[] = "{\"apiVersion\":\"v1\",\"kind\":\"PodList\",\"metadata\":{"
                               "\"resourceVersion\":\"987654\"},\"items\":[";
    g->bytes = 0;
    memcpy(g->buf, head, sizeof(head) - 1);
    g->len = sizeof(head) - 1;
    for (size_t i = 0; i < n; i++) {
        const struct template *tp = &g->templates[i % g->n_templates];
        if (g->len + tp->len + 3 > GEN_BUF && !flush(g, feed, ctx)) /* ",", the pod, "]}" */
            return false;
        char *at = g->buf + g->len;
        if (i)
            *at++ = ',';
        g->len = (size_t)(at + pod_text(g, i, at) - g->buf);
    }
    memcpy(g->buf + g->len, "]}", 2);
    g->len += 2;
    return flush(g, feed, ctx);
}

struct ingest {
    struct inv_stage *stage;
    json_t *trimmed; /* --compare */
    size_t malformed;
};

static bool on_pod(void *ctx, const struct inf_pod *pod, const char *why)
{
    struct ingest *in = ctx;
    (void)why;
    if (!pod)
        in->malformed++;
    else
        inv_stage_add_pod(in->stage, pod);
    return true;
}

static bool on_object(void *ctx, json_t *pod, const char *why)
{
    struct ingest *in = ctx;
    (void)why;
    if (!pod)
        in->malformed++;
    else
        json_array_append(in->trimmed, pod);
    return true;
}

struct reading {
    struct inf_list_reader *reader;
    struct gg_err err;
};

static bool feed_reader(void *ctx, const char *p, size_t n)
{
    struct reading *rd = ctx;
    return inf_list_feed(rd->reader, p, n, &rd->err) == GG_OK;
}

/*
 * events MODIFIED watch lines, line i of pod i (the n listed pods, then new ones), through the
 * watch's path; their making is timed in a pass of its own and left out.  False on an event
 * the path refuses, or when the pods held after are not the listed and the new ones.
 */
static bool watch_events(const struct generator *g, struct inventory *inv, size_t n, size_t events)
{
    static const char head[] = "{\"type\":\"MODIFIED\",\"object\":";
    char line[TEMPLATE_MAX + sizeof(head) + 1];
    memcpy(line, head, sizeof(head) - 1);
    double c0 = cpu_s();
    for (size_t e = 0; e < events; e++)
        line[sizeof(head) - 1 + pod_text(g, e, line + sizeof(head) - 1)] = '}';
    double made = cpu_s() - c0, c1 = cpu_s();
    struct inf_pod pod;
    inf_pod_init(&pod);
    bool ok = true;
    for (size_t e = 0; ok && e < events; e++) {
        size_t len = sizeof(head) - 1 + pod_text(g, e, line + sizeof(head) - 1);
        line[len++] = '}';
        struct inf_event ev;
        struct gg_err err = {{0}};
        if ((ok = inf_parse_event(line, len, &pod, &ev, &err) == GG_OK))
            inv_upsert_pod(inv, ev.pod);
        else
            fprintf(stderr, "bench_inventory: event %zu: %s\n", e, err.msg);
        inf_event_clear(&ev);
    }
    double cpu = cpu_s() - c1 - made;
    inf_pod_free(&pod);
    printf("  %zu watch events (MODIFIED): %.3f s CPU (%.2f us/event; making the lines, %.3f s, "
           "left out), %zu pods held after\n",
           events, cpu, cpu * 1e6 / (double)events, made, inv_pod_count(inv));
    return ok && inv_pod_count(inv) == (events > n ? events : n);
}

/* One relist of n pods through the informer's path; gen_cpu: the generator's own CPU seconds. */
static int run(struct generator *g, size_t n, bool whole, double gen_cpu, size_t events)
{
    struct ingest in = {0};
    struct inventory *inv = inv_new();
    struct reading rd = {0};
    struct inf_list_meta meta;
    struct policy_paths paths = {
        .policies = "policies", .lua = "lua", .config = "deploy/gpuguard.yaml"};
    struct engine *engine = NULL;
    struct charger *charger = NULL;
    if (engine_new(&paths, &engine, &rd.err) != GG_OK ||
        charger_new(engine, inv, &charger, &rd.err) != GG_OK) {
        fprintf(stderr, "bench_inventory: the charge model: %s\n", rd.err.msg);
        return 1;
    }
    malloc_trim(0);
    double rss0 = rss_mb(), peak0 = peak_mb(), t0 = now_s(), c0 = cpu_s();
    rd.reader = inf_list_reader_new(on_object, &in);
    if (whole) {
        in.trimmed = json_array();
    } else {
        in.stage = inv_stage_new(inv);
        inf_list_reader_read_pods(rd.reader, on_pod);
    }
    if (!generate(g, n, feed_reader, &rd) || inf_list_finish(rd.reader, &meta, &rd.err) != GG_OK) {
        fprintf(stderr, "bench_inventory: %s\n", rd.err.msg);
        return 1;
    }
    inf_list_reader_free(rd.reader);
    if (whole) {
        inv_replace(inv, in.trimmed);
        json_decref(in.trimmed);
    } else {
        inv_stage_commit(inv, in.stage);
    }
    malloc_trim(0); /* as the informer does after a relist */
    double t1 = now_s(), c1 = cpu_s() - gen_cpu, rss1 = rss_mb(), peak1 = peak_mb();
    size_t held = inv_pod_count(inv);
    int64_t usage = inv_usage(inv, "ns-7", NULL);
    struct charger_stats cs = charger_stats(charger);
    printf("%-38s %zu pods (%zu held, %zu malformed, ns-7 uses %lld milli-GPU)\n",
           whole ? "trimmed pods in one array + inv_replace" : "stream + inf_scan_pod + stage",
           meta.items, held, in.malformed, (long long)usage);
    printf("  %.3f s CPU (%.2f us/pod; the generator's %.3f s left out), %.3f s wall\n"
           "  RSS +%.1f MB after (%.0f B/pod), peak +%.1f MB\n"
           "  charges: %llu by the model, %llu remembered (%zu specs held)\n",
           c1 - c0, (c1 - c0) * 1e6 / (double)n, gen_cpu, t1 - t0, rss1 - rss0,
           (rss1 - rss0) * 1e6 / (double)n, peak1 > peak0 ? peak1 - peak0 : 0.0,
           (unsigned long long)cs.evaluated, (unsigned long long)cs.remembered, cs.remembering);
    bool events_ok = !events || watch_events(g, inv, n, events);
    charger_free(charger);
    engine_free(engine);
    inv_free(inv);
    return held == n && !in.malformed && events_ok ? 0 : 1;
}

int main(int argc, char **argv)
{
    size_t n = 50000, n_templates = 0, events = 0;
    bool compare = false;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "-n") == 0 && i + 1 < argc)
            n = strtoul(argv[++i], NULL, 10);
        else if (strcmp(argv[i], "--templates") == 0 && i + 1 < argc)
            n_templates = strtoul(argv[++i], NULL, 10);
        else if (strcmp(argv[i], "--events") == 0 && i + 1 < argc)
            events = strtoul(argv[++i], NULL, 10);
        else if (strcmp(argv[i], "--compare") == 0)
            compare = true;
        else {
            fprintf(stderr, "usage: bench_inventory [-n PODS] [--templates T] [--events E] "
                            "[--compare]\n");
            return 2;
        }
    }
    if (!n_templates || n_templates > n)
        n_templates = n; /* by default every pod a spec of its own */
    struct generator g = {calloc(n_templates, sizeof(struct template)), n_templates,
                          malloc(GEN_BUF), 0, 0};
    if (!g.templates || !g.buf)
        return 1;
    for (size_t t = 0; t < n_templates; t++)
        if (!template_make(&g.templates[t], t))
            return 1;
    /* The generator alone, to leave its CPU out of the relist's. */
    double c0 = cpu_s();
    generate(&g, n, NULL, NULL);
    double gen_cpu = cpu_s() - c0;
    printf("PodList of %zu pods from %zu templates: %.1f MB of JSON (%.0f B/pod), generated "
           "as read\n",
           n, n_templates, (double)g.bytes / 1e6, (double)g.bytes / (double)n);
    int rc = run(&g, n, false, gen_cpu, events);
    if (compare && rc == 0)
        rc = run(&g, n, true, gen_cpu, 0);
    for (size_t t = 0; t < n_templates; t++)
        free(g.templates[t].text);
    free(g.templates);
    free(g.buf);
    return rc;
}
