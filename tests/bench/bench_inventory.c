/*
 * bench_inventory.c - how long a relist of N pods takes and what the
 * inventory then holds: a PodList of N realistic pods (managedFields,
 * env, probes, volumes, status; every pod holds GPUs, the worst case) is
 * built in memory, then fed in 64 KiB reads, as the network would, through
 * what the informer does: the list splitter, inf_read_pod (parse + trim),
 * inv_stage_add (each pod charged by the Lua charge model, lua/intent.lua,
 * through the charger, with deploy/gpuguard.yaml), inv_stage_commit.  RSS
 * comes from /proc/self/statm before and after (and the peak from VmHWM).
 * Run from the repository's root (it reads policies/, lua/ and deploy/).
 *
 *   build/bench/bench_inventory [-n PODS] [--compare]
 *
 * --compare also times keeping every trimmed pod in one array and calling
 * inv_replace at the end, to show what the stage saves.
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

/* One pod as `kubectl get pods -o json` shows it, about 3.5 KB. */
static int pod_json(char *out, size_t size, size_t i)
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
        "\"name\":\"train-%zu-x7k2p\",\"namespace\":\"ns-%zu\",\"ownerReferences\":[{"
        "\"apiVersion\":\"batch/v1\",\"blockOwnerDeletion\":true,\"controller\":true,\"kind\":"
        "\"Job\",\"name\":\"train-%zu\",\"uid\":\"5f0c9b1e-0000-4000-8000-%012zu\"}],"
        "\"resourceVersion\":\"%zu\",\"uid\":\"0a1b2c3d-0000-4000-8000-%012zu\"},\"spec\":{"
        "\"containers\":[{\"args\":[\"--epochs\",\"10\",\"--data\",\"/data/imagenet\"],"
        "\"command\":[\"python\",\"train.py\"],\"env\":[{\"name\":\"NCCL_DEBUG\",\"value\":"
        "\"INFO\"},{\"name\":\"POD_NAME\",\"valueFrom\":{\"fieldRef\":{\"apiVersion\":\"v1\","
        "\"fieldPath\":\"metadata.name\"}}}],\"image\":\"nvcr.io/nvidia/pytorch:24.04-py3\","
        "\"imagePullPolicy\":\"IfNotPresent\",\"name\":\"main\",\"resources\":{\"limits\":{"
        "\"cpu\":\"8\",\"memory\":\"64Gi\",%s},\"requests\":{\"cpu\":\"8\",\"memory\":\"64Gi\","
        "%s}},\"terminationMessagePath\":\"/dev/termination-log\",\"terminationMessagePolicy\":"
        "\"File\",\"volumeMounts\":[{\"mountPath\":\"/data\",\"name\":\"data\"},{\"mountPath\":"
        "\"/var/run/secrets/kubernetes.io/serviceaccount\",\"name\":\"kube-api-access-abcde\","
        "\"readOnly\":true}]}],\"dnsPolicy\":\"ClusterFirst\",\"enableServiceLinks\":true,"
        "\"nodeName\":\"gpu-node-%zu\",\"nodeSelector\":{\"gpuguard.io/pool\":\"h100-train\"},"
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
        "\"Ready\"}],\"containerStatuses\":[{\"containerID\":\"containerd://%064zu\","
        "\"image\":\"nvcr.io/nvidia/pytorch:24.04-py3\",\"imageID\":\"nvcr.io/nvidia/"
        "pytorch@sha256:%064zu\",\"lastState\":{},\"name\":\"main\",\"ready\":true,"
        "\"restartCount\":0,\"started\":true,\"state\":{\"running\":{\"startedAt\":"
        "\"2024-05-01T10:00:08Z\"}}}],\"hostIP\":\"10.0.%zu.%zu\",\"phase\":\"Running\","
        "\"podIP\":\"10.244.%zu.%zu\",\"qosClass\":\"Guaranteed\",\"startTime\":"
        "\"2024-05-01T10:00:00Z\"}}",
        i % 3 == 0 ? ",\"gpuguard.io/charge\":\"1000\"" : "", i, i, i % 2 ? "training" : "batch",
        i % 200, i, i % 200, i, i, 1000 + i, i, resources[i % 4], resources[i % 4], i % 500, i, i,
        i % 250, i % 250, i % 250, i % 250);
}

struct ingest {
    struct inv_stage *stage;
    json_t *trimmed; /* --compare */
    size_t malformed;
};

static bool on_pod(void *ctx, json_t *pod, const char *why)
{
    struct ingest *in = ctx;
    (void)why;
    if (!pod)
        in->malformed++;
    else if (in->stage)
        inv_stage_add(in->stage, pod);
    else
        json_array_append(in->trimmed, pod);
    return true;
}

static int run(const char *list, size_t len, size_t n, bool whole)
{
    struct ingest in = {0};
    struct inventory *inv = inv_new();
    struct gg_err err = {{0}};
    struct inf_list_meta meta;
    struct policy_paths paths = {
        .policies = "policies", .lua = "lua", .config = "deploy/gpuguard.yaml"};
    struct engine *engine = NULL;
    struct charger *charger = NULL;
    if (engine_new(&paths, &engine, &err) != GG_OK ||
        charger_new(engine, inv, &charger, &err) != GG_OK) {
        fprintf(stderr, "bench_inventory: the charge model: %s\n", err.msg);
        return 1;
    }
    malloc_trim(0);
    double rss0 = rss_mb(), peak0 = peak_mb(), t0 = now_s(), c0 = cpu_s();
    struct inf_list_reader *r = inf_list_reader_new(on_pod, &in);
    if (whole)
        in.trimmed = json_array();
    else
        in.stage = inv_stage_new(inv);
    for (size_t off = 0; off < len; off += 65536)
        if (inf_list_feed(r, list + off, len - off < 65536 ? len - off : 65536, &err) != GG_OK) {
            fprintf(stderr, "bench_inventory: %s\n", err.msg);
            return 1;
        }
    if (inf_list_finish(r, &meta, &err) != GG_OK) {
        fprintf(stderr, "bench_inventory: %s\n", err.msg);
        return 1;
    }
    inf_list_reader_free(r);
    if (whole) {
        inv_replace(inv, in.trimmed);
        json_decref(in.trimmed);
    } else {
        inv_stage_commit(inv, in.stage);
    }
    malloc_trim(0); /* as the informer does after a relist */
    double t1 = now_s(), c1 = cpu_s(), rss1 = rss_mb(), peak1 = peak_mb();
    size_t held = inv_pod_count(inv);
    int64_t usage = inv_usage(inv, "ns-7", NULL);
    printf("%-38s %zu pods (%zu held, %zu malformed, ns-7 uses %lld milli-GPU)\n",
           whole ? "trimmed pods in one array + inv_replace" : "stream + inf_read_pod + stage",
           meta.items, held, in.malformed, (long long)usage);
    printf("  %.3f s wall, %.3f s CPU (%.1f us/pod, %.0f MB/s); RSS +%.1f MB after (%.0f B/pod), "
           "peak +%.1f MB\n",
           t1 - t0, c1 - c0, (t1 - t0) * 1e6 / (double)n, len / 1e6 / (t1 - t0), rss1 - rss0,
           (rss1 - rss0) * 1e6 / (double)n, peak1 > peak0 ? peak1 - peak0 : 0.0);
    charger_free(charger);
    engine_free(engine);
    inv_free(inv);
    return held == n && !in.malformed ? 0 : 1;
}

int main(int argc, char **argv)
{
    size_t n = 50000;
    bool compare = false;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "-n") == 0 && i + 1 < argc)
            n = strtoul(argv[++i], NULL, 10);
        else if (strcmp(argv[i], "--compare") == 0)
            compare = true;
        else {
            fprintf(stderr, "usage: bench_inventory [-n PODS] [--compare]\n");
            return 2;
        }
    }
    size_t cap = n * 5000 + 256, len = 0;
    char *list = malloc(cap);
    if (!list)
        return 1;
    len += (size_t)snprintf(list, cap,
                            "{\"apiVersion\":\"v1\",\"kind\":\"PodList\",\"metadata\":{"
                            "\"resourceVersion\":\"987654\"},\"items\":[");
    for (size_t i = 0; i < n; i++) {
        if (i)
            list[len++] = ',';
        len += (size_t)pod_json(list + len, cap - len, i);
    }
    len += (size_t)snprintf(list + len, cap - len, "]}");
    printf("PodList of %zu pods: %.1f MB of JSON (%.0f B/pod)\n", n, len / 1e6,
           (double)len / (double)n);
    int rc = run(list, len, n, false);
    if (compare && rc == 0)
        rc = run(list, len, n, true);
    free(list);
    return rc;
}
