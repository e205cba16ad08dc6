/*
 * rightsize.c - the rightsizing: settings, the two PromQL queries, and
 * Prometheus answers folded into per-workload usage (see rightsize.h).
 */
#include "kube/rightsize.h"

#include "kube/ownerfold.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* "namespace/name" keys: a namespace is at most 63 bytes, the names here at most 511. */
#define KEY_SIZE 640

/* ---- settings ----------------------------------------------------------- */

static const struct {
    char unit;
    int64_t seconds;
} UNITS[] = {{'w', 604800}, {'d', 86400}, {'h', 3600}, {'m', 60}, {'s', 1}};

bool rs_parse_duration(const char *text, int64_t *seconds)
{
    int64_t total = 0;
    const char *p = text;
    if (!p || !*p)
        return false;
    while (*p) {
        char *end;
        if (*p < '0' || *p > '9')
            return false;
        long long n = strtoll(p, &end, 10);
        size_t u = 0;
        while (u < sizeof(UNITS) / sizeof(UNITS[0]) && UNITS[u].unit != *end)
            u++;
        if (u == sizeof(UNITS) / sizeof(UNITS[0]) || n > 100000000LL)
            return false;
        total += n * UNITS[u].seconds;
        if (total > 100LL * 365 * 86400)
            return false;
        p = end + 1;
    }
    if (total <= 0)
        return false;
    *seconds = total;
    return true;
}

void rs_format_duration(int64_t seconds, char *out, size_t size)
{
    size_t n = 0;
    out[0] = '\0';
    for (size_t u = 1; u < sizeof(UNITS) / sizeof(UNITS[0]) && seconds > 0; u++) { /* no weeks */
        if (seconds < UNITS[u].seconds)
            continue;
        int w = snprintf(out + n, size - n, "%lld%c", (long long)(seconds / UNITS[u].seconds),
                         UNITS[u].unit);
        if (w < 0 || (size_t)w >= size - n)
            return;
        n += (size_t)w;
        seconds %= UNITS[u].seconds;
    }
}

/* A string member into out; absent leaves out as it is. */
static enum gg_status string_key(const json_t *obj, const char *key, const char *where, char *out,
                                 size_t size, struct gg_err *err)
{
    const json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v))
        return GG_OK;
    if (!json_is_string(v) || strlen(json_string_value(v)) >= size)
        return gg_fail(err, GG_ERR_INVALID,
                       "rightsizing.%s%s: must be a string of at most %zu bytes", where, key,
                       size - 1);
    strcpy(out, json_string_value(v));
    return GG_OK;
}

static enum gg_status duration_key(const json_t *obj, const char *key, int64_t *out,
                                   struct gg_err *err)
{
    const json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v))
        return GG_OK;
    if (!json_is_string(v) || !rs_parse_duration(json_string_value(v), out))
        return gg_fail(err, GG_ERR_INVALID,
                       "rightsizing.%s: must be a duration such as 7d, 5m or 1h30m", key);
    return GG_OK;
}

/* A Prometheus label name: [a-zA-Z_][a-zA-Z0-9_]*; the metric name may also hold ':'. */
static bool is_name(const char *s, bool metric)
{
    if (!*s || (*s >= '0' && *s <= '9'))
        return false;
    for (; *s; s++)
        if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9') ||
              *s == '_' || (metric && *s == ':')))
            return false;
    return true;
}

enum gg_status rs_settings_parse(const json_t *config, struct rs_settings *out, struct gg_err *err)
{
    struct rs_settings s = {.mode = RS_OFF,
                            .metric = "DCGM_FI_DEV_FB_USED",
                            .ns_label = "namespace",
                            .pod_label = "pod",
                            .window_s = 7 * 86400,
                            .refresh_s = 300,
                            .timeout_s = 30};
    const json_t *rs = json_object_get(config, "rightsizing");
    enum gg_status st = GG_OK;
    if (rs && !json_is_null(rs)) {
        if (!json_is_object(rs))
            return gg_fail(err, GG_ERR_INVALID, "rightsizing: must be a mapping");
        const char *mode = json_string_value(json_object_get(rs, "mode"));
        if (json_is_false(json_object_get(rs, "mode"))) /* YAML 1.1 reads an unquoted off so */
            mode = "off";
        if (json_object_get(rs, "mode")) {
            static const char *const modes[] = {"off", "recommend", "apply"};
            int m = -1;
            for (int i = 0; mode && i < 3; i++)
                if (strcmp(mode, modes[i]) == 0)
                    m = i;
            if (m < 0)
                return gg_fail(err, GG_ERR_INVALID,
                               "rightsizing.mode: must be off, recommend or apply");
            s.mode = (enum rs_mode)m;
        }
        const json_t *prom = json_object_get(rs, "prometheus");
        const json_t *labels = json_object_get(rs, "labels");
        if ((prom && !json_is_object(prom)) || (labels && !json_is_object(labels)))
            return gg_fail(err, GG_ERR_INVALID, "rightsizing.%s: must be a mapping",
                           prom && !json_is_object(prom) ? "prometheus" : "labels");
        if ((st = string_key(prom, "url", "prometheus.", s.url, sizeof(s.url), err)) ||
            (st = string_key(prom, "token_file", "prometheus.", s.token_file, sizeof(s.token_file),
                             err)) ||
            (st = string_key(prom, "ca_file", "prometheus.", s.ca_file, sizeof(s.ca_file), err)) ||
            (st = string_key(prom, "cert_file", "prometheus.", s.cert_file, sizeof(s.cert_file),
                             err)) ||
            (st = string_key(prom, "key_file", "prometheus.", s.key_file, sizeof(s.key_file),
                             err)) ||
            (st = string_key(rs, "metric", "", s.metric, sizeof(s.metric), err)) ||
            (st =
                 string_key(labels, "namespace", "labels.", s.ns_label, sizeof(s.ns_label), err)) ||
            (st = string_key(labels, "pod", "labels.", s.pod_label, sizeof(s.pod_label), err)) ||
            (st = duration_key(rs, "window", &s.window_s, err)) ||
            (st = duration_key(rs, "refresh", &s.refresh_s, err)) ||
            (st = duration_key(prom, "timeout", &s.timeout_s, err)))
            return st;
        size_t n = strlen(s.url);
        if (n && strncmp(s.url, "http://", 7) != 0 && strncmp(s.url, "https://", 8) != 0)
            return gg_fail(err, GG_ERR_INVALID,
                           "rightsizing.prometheus.url: must start with http:// or https://");
        while (n && s.url[n - 1] == '/')
            s.url[--n] = '\0';
        if (!*s.cert_file != !*s.key_file)
            return gg_fail(err, GG_ERR_INVALID,
                           "rightsizing.prometheus: cert_file and key_file go together");
        if (!is_name(s.metric, true) || !is_name(s.ns_label, false) || !is_name(s.pod_label, false))
            return gg_fail(err, GG_ERR_INVALID,
                           "rightsizing: metric and labels must be Prometheus names");
        if (s.window_s < 60 || s.refresh_s < 1)
            return gg_fail(err, GG_ERR_INVALID,
                           "rightsizing: window must be at least 1m and refresh at least 1s");
    }
    *out = s;
    return GG_OK;
}

/* ---- queries ------------------------------------------------------------ */

bool rs_query(const struct rs_settings *s, enum rs_query which, char *out, size_t size)
{
    const char *m = s->metric, *n = s->ns_label, *p = s->pod_label;
    char window[32], alone[768];
    rs_format_duration(s->window_s, window, sizeof(window));
    /* The metric for pods alone on their device (GPU or MIG instance) at each instant. */
    int w = snprintf(alone, sizeof(alone),
                     "%s{%s!=\"\"} unless on (Hostname, UUID, GPU_I_ID) "
                     "(count by (Hostname, UUID, GPU_I_ID) (%s{%s!=\"\"}) > 1)",
                     m, p, m, p);
    if (w < 0 || (size_t)w >= sizeof(alone))
        return false;
    if (which == RS_QUERY_PEAK)
        w = snprintf(out, size, "max by (%s, %s) (max_over_time((sum by (%s, %s) (%s))[%s:1m]))", n,
                     p, n, p, alone, window);
    else
        w = snprintf(out, size,
                     "label_replace(min_over_time(timestamp(max by (%s, %s) (%s))[%s:1m]), "
                     "\"edge\", \"first\", \"\", \"\") or "
                     "label_replace(max_over_time(timestamp(max by (%s, %s) (%s))[%s:1m]), "
                     "\"edge\", \"last\", \"\", \"\")",
                     n, p, alone, window, n, p, alone, window);
    return w >= 0 && (size_t)w < size;
}

/* ---- answers -------------------------------------------------------------- */

/* data.result of an instant-vector answer into *out. */
static enum gg_status vector_of(const json_t *answer, const char *which, const json_t **out,
                                struct gg_err *err)
{
    const char *status = json_string_value(json_object_get(answer, "status"));
    if (status && strcmp(status, "error") == 0) {
        const char *e = json_string_value(json_object_get(answer, "error"));
        return gg_fail(err, GG_ERR_INVALID, "%s query: Prometheus answered an error: %.160s", which,
                       e ? e : "(no message)");
    }
    const json_t *data = json_object_get(answer, "data");
    const char *type = json_string_value(json_object_get(data, "resultType"));
    const json_t *result = json_object_get(data, "result");
    if (!status || strcmp(status, "success") != 0 || !type || strcmp(type, "vector") != 0 ||
        !json_is_array(result))
        return gg_fail(err, GG_ERR_INVALID,
                       "%s query: not a Prometheus answer with an instant vector "
                       "(status success, data.resultType vector, data.result a list)",
                       which);
    if (json_array_size(result) > RS_MAX_SERIES)
        return gg_fail(err, GG_ERR_TOOBIG, "%s query: more than %zu series", which, RS_MAX_SERIES);
    *out = result;
    return GG_OK;
}

/* The workload of a pod: its controller when owners knows it, else its name. */
static bool workload_of(const json_t *owners, const char *ns, const char *pod, char *out,
                        size_t size)
{
    char key[KEY_SIZE];
    snprintf(key, sizeof(key), "%s/%s", ns, pod);
    const char *owner = json_string_value(json_object_get(owners, key));
    const char *slash = owner ? strchr(owner, '/') : NULL;
    if (slash) {
        char kind[128];
        size_t k = (size_t)(slash - owner);
        if (k < sizeof(kind)) {
            memcpy(kind, owner, k);
            kind[k] = '\0';
            return of_from_owner(kind, slash + 1, out, size);
        }
    }
    return of_from_pod_name(pod, out, size);
}

/*
 * One sample: the "namespace/workload" key of its pod (KEY_SIZE bytes), its
 * labels and value; false when el is not {metric: {...}, value: [t, "v"]}
 * or its pod name is too long for Kubernetes.
 */
static bool sample_of(const json_t *el, const char *ns_label, const char *pod_label,
                      const json_t *owners, char *key, const json_t **metric, double *value)
{
    *metric = json_object_get(el, "metric");
    const json_t *v = json_object_get(el, "value");
    const char *ns = json_string_value(json_object_get(*metric, ns_label));
    const char *pod = json_string_value(json_object_get(*metric, pod_label));
    const char *text = json_string_value(json_array_get(v, 1));
    if (!ns || !pod || !*ns || !*pod || !text || json_array_size(v) != 2)
        return false;
    char *end, workload[512];
    *value = strtod(text, &end);
    if (end == text || *end || !isfinite(*value) || *value < 0 ||
        !workload_of(owners, ns, pod, workload, sizeof(workload)))
        return false;
    snprintf(key, KEY_SIZE, "%s/%s", ns, workload);
    return true;
}

/* The record of key, created as [0, 0, 0, 0] when missing. */
static json_t *record_of(json_t *workloads, const char *key)
{
    json_t *r = json_object_get(workloads, key);
    if (!r) {
        r = json_pack("[f,I,I,I]", 0.0, (json_int_t)0, (json_int_t)0, (json_int_t)0);
        if (json_object_set_new(workloads, key, r) != 0)
            return NULL;
    }
    return r;
}

/* A peak sample: the workload's largest peak and its number of pods; false when out of memory. */
static bool fold_peak(struct rs_data *d, const char *key, double mib)
{
    json_t *r = record_of(d->workloads, key);
    if (!r)
        return false;
    if (mib > json_real_value(json_array_get(r, 0)))
        json_array_set_new(r, 0, json_real(mib));
    json_array_set_new(r, 3, json_integer(json_integer_value(json_array_get(r, 3)) + 1));
    d->series++;
    return true;
}

/* A history sample: the workload's first or last time seen, for workloads with a peak only. */
static void fold_edge(struct rs_data *d, const char *key, const json_t *metric, double t)
{
    const char *edge = json_string_value(json_object_get(metric, "edge"));
    json_t *r = json_object_get(d->workloads, key);
    if (!r || !edge)
        return;
    bool first = strcmp(edge, "first") == 0;
    size_t at = first ? 1 : 2;
    json_int_t old = json_integer_value(json_array_get(r, at)), now = (json_int_t)t;
    if (!old || (first ? now < old : now > old))
        json_array_set_new(r, at, json_integer(now));
    d->series++;
}

/* Every sample of result, folded as a peak or as a history edge. */
static enum gg_status fold(struct rs_data *d, const json_t *result, bool peak, const char *ns_label,
                           const char *pod_label, const json_t *owners, struct gg_err *err)
{
    size_t i;
    const json_t *el;
    json_array_foreach(result, i, el)
    {
        const json_t *metric;
        double v;
        char key[KEY_SIZE];
        if (!sample_of(el, ns_label, pod_label, owners, key, &metric, &v))
            continue;
        if (!peak)
            fold_edge(d, key, metric, v);
        else if (!fold_peak(d, key, v))
            return gg_fail(err, GG_ERR_NOMEM, "out of memory");
    }
    return GG_OK;
}

enum gg_status rs_data_fold(struct rs_data *d, const json_t *peak, const json_t *history,
                            const char *ns_label, const char *pod_label, const json_t *owners,
                            struct gg_err *err)
{
    const json_t *pr, *hr;
    enum gg_status st = vector_of(peak, "peak", &pr, err);
    if (st != GG_OK || (st = vector_of(history, "history", &hr, err)) != GG_OK)
        return st;
    if (!d->workloads && !(d->workloads = json_object()))
        return gg_fail(err, GG_ERR_NOMEM, "out of memory");
    st = fold(d, pr, true, ns_label, pod_label, owners, err);
    if (st == GG_OK)
        st = fold(d, hr, false, ns_label, pod_label, owners, err);
    return st;
}

void rs_data_clear(struct rs_data *d)
{
    if (!d)
        return;
    json_decref(d->workloads);
    memset(d, 0, sizeof(*d));
}

bool rs_data_get(const struct rs_data *d, const char *ns, const char *workload,
                 struct rs_usage *out)
{
    char key[KEY_SIZE];
    snprintf(key, sizeof(key), "%s/%s", ns, workload);
    const json_t *r = json_object_get(d->workloads, key);
    if (!r)
        return false;
    out->peak_mib = json_real_value(json_array_get(r, 0));
    out->first_s = json_integer_value(json_array_get(r, 1));
    out->last_s = json_integer_value(json_array_get(r, 2));
    out->pods = (unsigned)json_integer_value(json_array_get(r, 3));
    return true;
}

/* ---- the saved form --------------------------------------------------------- */

json_t *rs_file_new(const struct rs_settings *s, int64_t time_s, const json_t *peak,
                    const json_t *history)
{
    char window[32], qpeak[RS_QUERY_MAX], qhistory[RS_QUERY_MAX];
    rs_format_duration(s->window_s, window, sizeof(window));
    if (!rs_query(s, RS_QUERY_PEAK, qpeak, sizeof(qpeak)) ||
        !rs_query(s, RS_QUERY_HISTORY, qhistory, sizeof(qhistory)))
        return NULL;
    return json_pack("{s:i,s:s,s:I,s:{s:s,s:s},s:{s:s,s:s},s:O,s:O}", "version", RS_FILE_VERSION,
                     "window", window, "time", (json_int_t)time_s, "labels", "namespace",
                     s->ns_label, "pod", s->pod_label, "queries", "peak", qpeak, "history",
                     qhistory, "peak", peak, "history", history);
}

enum gg_status rs_file_load(const char *path, struct rs_data *d, struct gg_err *err)
{
    char *text = NULL;
    size_t len = 0;
    enum gg_status st = gg_read_file(path, RS_MAX_RESPONSE, &text, &len, err);
    if (st != GG_OK)
        return st;
    json_error_t je;
    json_t *doc = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
    free(text);
    if (!doc)
        return gg_fail(err, GG_ERR_PARSE, "%s:%d:%d: %s", path, je.line, je.column, je.text);
    const json_t *labels = json_object_get(doc, "labels");
    const char *ns_label = json_string_value(json_object_get(labels, "namespace"));
    const char *pod_label = json_string_value(json_object_get(labels, "pod"));
    const char *window = json_string_value(json_object_get(doc, "window"));
    const json_t *time = json_object_get(doc, "time");
    if (json_integer_value(json_object_get(doc, "version")) != RS_FILE_VERSION || !ns_label ||
        !pod_label || !window || !rs_parse_duration(window, &d->window_s) ||
        !json_is_integer(time)) {
        json_decref(doc);
        return gg_fail(err, GG_ERR_INVALID,
                       "%s: not a usage file (version 1, window, time, labels.namespace, "
                       "labels.pod, peak, history; written by gpuguard usage)",
                       path);
    }
    d->time_s = json_integer_value(time);
    struct gg_err inner = {{0}};
    st = rs_data_fold(d, json_object_get(doc, "peak"), json_object_get(doc, "history"), ns_label,
                      pod_label, NULL, &inner);
    json_decref(doc);
    if (st != GG_OK)
        return gg_fail(err, st, "%s: %s", path, inner.msg);
    return GG_OK;
}
