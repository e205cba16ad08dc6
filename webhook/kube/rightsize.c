/*
 * rightsize.c - the rightsizing: settings, the two PromQL queries, and
 * Prometheus answers folded into per-workload usage (see rightsize.h).
 */
#include "kube/rightsize.h"

#include "kube/ownerfold.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>

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

static enum gg_status max_series_key(const json_t *rs, size_t *out, struct gg_err *err)
{
    const json_t *v = json_object_get(rs, "max_series");
    if (!v || json_is_null(v))
        return GG_OK;
    if (!json_is_integer(v) || json_integer_value(v) < 1 ||
        json_integer_value(v) > (json_int_t)RS_MAX_SERIES)
        return gg_fail(err, GG_ERR_INVALID,
                       "rightsizing.max_series: must be a whole number from 1 to %zu",
                       RS_MAX_SERIES);
    *out = (size_t)json_integer_value(v);
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
                            .timeout_s = 30,
                            .max_series = RS_MAX_SERIES_DEFAULT};
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
            (st = duration_key(prom, "timeout", &s.timeout_s, err)) ||
            (st = max_series_key(rs, &s.max_series, err)))
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

/* ---- the workload table --------------------------------------------------- */

struct rs_entry {
    double peak_mib;
    int64_t first_s, last_s;
    uint32_t key_off, hash, pods;
    uint16_t key_len;
};

/*
 * SipHash-1-3 of a key under a seed drawn once per process: the keys come
 * from the usage source, which may be hostile, and keys made to collide
 * would turn each insert into a walk of the table.
 */
static uint64_t rotl(uint64_t x, int b)
{
    return (x << b) | (x >> (64 - b));
}

static void sip_round(uint64_t v[4])
{
    v[0] += v[1];
    v[1] = rotl(v[1], 13) ^ v[0];
    v[0] = rotl(v[0], 32);
    v[2] += v[3];
    v[3] = rotl(v[3], 16) ^ v[2];
    v[0] += v[3];
    v[3] = rotl(v[3], 21) ^ v[0];
    v[2] += v[1];
    v[1] = rotl(v[1], 17) ^ v[2];
    v[2] = rotl(v[2], 32);
}

/* The process's key: one atomic word, so that every thread agrees on it from its first use. */
static void hash_seed(uint64_t k[2])
{
    static _Atomic uint64_t seed;
    uint64_t s = atomic_load(&seed);
    if (!s) {
        uint64_t mine;
        if (getrandom(&mine, sizeof(mine), GRND_NONBLOCK) != (ssize_t)sizeof(mine))
            mine = ((uint64_t)time(NULL) * 0x9e3779b97f4a7c15ULL) ^ (uintptr_t)&seed ^
                   ((uint64_t)clock() << 32);
        mine |= 1;
        if (atomic_compare_exchange_strong(&seed, &s, mine))
            s = mine; /* else s is the one another thread set */
    }
    uint64_t z = s + 0x9e3779b97f4a7c15ULL; /* splitmix64: the second half */
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    k[0] = s;
    k[1] = z ^ (z >> 31);
}

static uint32_t hash_key(const char *key, size_t len)
{
    uint64_t k[2];
    hash_seed(k);
    uint64_t v[4] = {k[0] ^ 0x736f6d6570736575ULL, k[1] ^ 0x646f72616e646f6dULL,
                     k[0] ^ 0x6c7967656e657261ULL, k[1] ^ 0x7465646279746573ULL};
    const unsigned char *p = (const unsigned char *)key;
    size_t left = len;
    for (; left >= 8; p += 8, left -= 8) {
        uint64_t m;
        memcpy(&m, p, 8);
        v[3] ^= m;
        sip_round(v);
        v[0] ^= m;
    }
    uint64_t last = (uint64_t)len << 56;
    for (size_t i = 0; i < left; i++)
        last |= (uint64_t)p[i] << (8 * i);
    v[3] ^= last;
    sip_round(v);
    v[0] ^= last;
    v[2] ^= 0xff;
    sip_round(v);
    sip_round(v);
    sip_round(v);
    uint64_t h = v[0] ^ v[1] ^ v[2] ^ v[3];
    return (uint32_t)(h ^ (h >> 32));
}

/* The index of key, or SIZE_MAX. */
static size_t find(const struct rs_data *d, const char *key, size_t len, uint32_t hash)
{
    if (!d->n_slots)
        return SIZE_MAX;
    for (size_t i = hash & (d->n_slots - 1);; i = (i + 1) & (d->n_slots - 1)) {
        uint32_t s = d->slots[i];
        if (!s)
            return SIZE_MAX;
        const struct rs_entry *e = &d->entries[s - 1];
        if (e->hash == hash && e->key_len == len && memcmp(d->keys + e->key_off, key, len) == 0)
            return s - 1;
    }
}

static void place(struct rs_data *d, size_t index)
{
    size_t i = d->entries[index].hash & (d->n_slots - 1);
    while (d->slots[i])
        i = (i + 1) & (d->n_slots - 1);
    d->slots[i] = (uint32_t)(index + 1);
}

/* Slots for n workloads at most 3/4 full; false when out of memory. */
static bool reslot(struct rs_data *d, size_t n)
{
    size_t want = 16;
    while (want * 3 < n * 4)
        want *= 2;
    if (want == d->n_slots)
        return true;
    uint32_t *slots = calloc(want, sizeof(*slots));
    if (!slots)
        return false;
    free(d->slots);
    d->slots = slots;
    d->n_slots = want;
    for (size_t i = 0; i < d->n; i++)
        place(d, i);
    return true;
}

/* Grow *p (of *cap elements of size) to hold need; false when out of memory. */
static bool room(void **p, size_t *cap, size_t need, size_t size, size_t first)
{
    if (need <= *cap)
        return true;
    size_t n = *cap ? *cap : first;
    while (n < need)
        n *= 2;
    void *q = realloc(*p, n * size);
    if (!q)
        return false;
    *p = q;
    *cap = n;
    return true;
}

/* A new workload (zero usage) under key; SIZE_MAX when out of memory or past 2^32 bytes. */
static size_t insert(struct rs_data *d, const char *key, size_t len, uint32_t hash)
{
    if (d->n >= UINT32_MAX - 1 || d->keys_len + len + 1 > UINT32_MAX || len > UINT16_MAX)
        return SIZE_MAX;
    void *entries = d->entries, *keys = d->keys;
    bool ok = room(&entries, &d->cap, d->n + 1, sizeof(*d->entries), 64);
    d->entries = entries;
    ok = ok && room(&keys, &d->keys_cap, d->keys_len + len + 1, 1, 4096);
    d->keys = keys;
    if (!ok || ((d->n + 1) * 4 > d->n_slots * 3 && !reslot(d, d->n + 1)))
        return SIZE_MAX;
    memcpy(d->keys + d->keys_len, key, len);
    d->keys[d->keys_len + len] = '\0';
    d->entries[d->n] =
        (struct rs_entry){.key_off = (uint32_t)d->keys_len, .key_len = (uint16_t)len, .hash = hash};
    d->keys_len += len + 1;
    place(d, d->n);
    return d->n++;
}

void rs_data_finish(struct rs_data *d)
{
    size_t kept = 0, keys_len = 0;
    for (size_t i = 0; i < d->n; i++) {
        struct rs_entry e = d->entries[i];
        if (!(e.peak_mib >= RS_MIN_EVIDENCE_MIB)) {
            d->no_evidence++;
            continue;
        }
        /* Keys sit in the entries' order: each moves down, if at all. */
        memmove(d->keys + keys_len, d->keys + e.key_off, (size_t)e.key_len + 1);
        e.key_off = (uint32_t)keys_len;
        keys_len += (size_t)e.key_len + 1;
        d->entries[kept++] = e;
    }
    d->n = kept;
    d->keys_len = keys_len;
    /* Held from here on: give back what growing left spare. */
    void *p;
    if (!kept) {
        free(d->entries);
        free(d->keys);
        d->entries = NULL;
        d->keys = NULL;
        d->cap = d->keys_cap = 0;
    }
    if (kept && kept < d->cap && (p = realloc(d->entries, kept * sizeof(*d->entries)))) {
        d->entries = p;
        d->cap = kept;
    }
    if (keys_len && keys_len < d->keys_cap && (p = realloc(d->keys, keys_len))) {
        d->keys = p;
        d->keys_cap = keys_len;
    }
    free(d->slots);
    d->slots = NULL;
    d->n_slots = 0;
    if (d->n && !reslot(d, d->n)) { /* smaller than the table it replaces: unlikely */
        d->no_evidence += d->n;
        d->n = 0;
    }
}

void rs_data_clear(struct rs_data *d)
{
    if (!d)
        return;
    free(d->entries);
    free(d->slots);
    free(d->keys);
    memset(d, 0, sizeof(*d));
}

bool rs_data_get(const struct rs_data *d, const char *ns, const char *workload,
                 struct rs_usage *out)
{
    char key[KEY_SIZE];
    int n = snprintf(key, sizeof(key), "%s/%s", ns, workload);
    if (n < 0 || (size_t)n >= sizeof(key))
        return false;
    size_t i = find(d, key, (size_t)n, hash_key(key, (size_t)n));
    if (i == SIZE_MAX)
        return false;
    const struct rs_entry *e = &d->entries[i];
    out->peak_mib = e->peak_mib;
    out->first_s = e->first_s;
    out->last_s = e->last_s;
    out->pods = e->pods;
    return true;
}

/* ---- answers, read as they arrive ------------------------------------------- */

/* What a value is to the reader, from where it sits. */
enum role {
    R_SKIP,   /* read and checked, not kept */
    R_ANSWER, /* {"status", "data", "error"} */
    R_STATUS,
    R_ERROR,
    R_DATA, /* {"resultType", "result"} */
    R_RTYPE,
    R_RESULT, /* [sample, ...] */
    R_SAMPLE, /* {"metric", "value"} */
    R_METRIC, /* {label: value} */
    R_LABEL,  /* the namespace, pod or edge label (which in label_bits) */
    R_VALUE,  /* [t, "v"] */
    R_VALUE_V,
    R_FILE, /* a saved file: {"version", "window", "time", "labels", "peak", "history"} */
    R_VERSION,
    R_WINDOW,
    R_TIME,
    R_LABELS,
    R_LABELS_NS,
    R_LABELS_POD,
};

enum state {
    T_START,     /* before the top value */
    T_VALUE,     /* a value (after ':', or ',' in a list) */
    T_FIRST,     /* after '[': a value or ']' */
    T_KEY_FIRST, /* after '{': a key or '}' */
    T_KEY,       /* after ',' in an object */
    T_COLON,
    T_AFTER, /* after a value in a container: ',' or its end */
    T_DONE,  /* after the top value: white space only */
    T_STRING,
    T_NUMBER,
    T_LITERAL,
    T_FAILED,
};

/* Where a number is: after '-', the leading 0, integer digits, '.', fraction, 'e', its sign, its
 * digits. */
enum { N_MINUS, N_ZERO, N_INT, N_DOT, N_FRAC, N_EXP, N_EXP_SIGN, N_EXP_DIGITS };

enum file_pass { PASS_NONE, PASS_META, PASS_PEAK, PASS_HISTORY };

enum { LABEL_NS = 1, LABEL_POD = 2, LABEL_EDGE = 4 };

struct rs_reader {
    struct rs_data *d;
    enum rs_query which;
    enum file_pass pass;
    char ns_label[64], pod_label[64];
    const json_t *owners;
    size_t max_series;
    bool configured_bound; /* max_series is rightsizing.max_series */
    const char *what;      /* "peak query: ", "history query: " or "" */

    /* the JSON */
    enum state state;
    unsigned depth;
    uint64_t arrays; /* bit i: the container at depth i + 1 is a list */
    uint8_t role[RS_DEPTH_MAX + 1];
    enum role pending; /* of the value to come */
    unsigned label_bits;
    size_t offset; /* bytes read before this piece */
    bool in_key, capture, tok_over;
    char tok[RS_TOKEN_MAX + 1];
    size_t tok_len;
    uint8_t esc;        /* 0; 1 after '\'; 2-5: the hex digits of \u */
    uint8_t after_high; /* 1: a low surrogate's '\' must come; 2: its 'u' */
    uint8_t utf8_need;  /* continuation bytes to come */
    uint8_t utf8_lo, utf8_hi;
    uint32_t code, high; /* the \u being read; a high surrogate */
    uint8_t num;         /* N_* */
    bool num_int;
    const char *lit; /* the literal's remaining letters */
    enum gg_status failed;
    struct gg_err err;

    /* the answer */
    bool answer_seen, vector, result_list;
    int status; /* 0 none, 1 success, 2 error, 3 other */
    char error[161];
    size_t series;

    /* the sample being read */
    struct {
        char ns[RS_NS_MAX + 1], pod[RS_POD_MAX + 1], value[64];
        bool has_ns, has_pod, has_value;
        int edge; /* 0 none or other, 1 first, 2 last */
        unsigned value_elems;
    } s;

    /* a saved file's own members */
    bool has_version, has_time;
    int64_t version, time_s;
    char window[32], file_ns[64], file_pod[64];
};

static enum gg_status reader_fail(struct rs_reader *r, enum gg_status st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static enum gg_status reader_fail(struct rs_reader *r, enum gg_status st, const char *fmt, ...)
{
    char msg[sizeof(r->err.msg)];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    snprintf(r->err.msg, sizeof(r->err.msg), "%s%s", r->what, msg);
    r->failed = st;
    r->state = T_FAILED;
    return st;
}

static enum gg_status not_json(struct rs_reader *r, size_t at, const char *why)
{
    return reader_fail(r, GG_ERR_PARSE, "the answer is not JSON: %s at byte %zu", why,
                       r->offset + at);
}

static enum gg_status unexpected(struct rs_reader *r, size_t at, unsigned char c)
{
    char why[40];
    if (c >= 0x20 && c < 0x7f)
        snprintf(why, sizeof(why), "unexpected '%c'", c);
    else
        snprintf(why, sizeof(why), "unexpected byte 0x%02x", c);
    return not_json(r, at, why);
}

static struct rs_reader *reader_new(struct rs_data *d, enum rs_query which,
                                    const struct rs_fold_opts *o, enum file_pass pass)
{
    struct rs_reader *r = calloc(1, sizeof(*r));
    if (!r)
        return NULL;
    r->d = d;
    r->which = which;
    r->pass = pass;
    snprintf(r->ns_label, sizeof(r->ns_label), "%s", o && o->ns_label ? o->ns_label : "namespace");
    snprintf(r->pod_label, sizeof(r->pod_label), "%s", o && o->pod_label ? o->pod_label : "pod");
    r->owners = o ? o->owners : NULL;
    r->configured_bound = o && o->max_series;
    r->max_series = r->configured_bound ? o->max_series : RS_MAX_SERIES;
    r->what = pass == PASS_META ? "" : which == RS_QUERY_PEAK ? "peak query: " : "history query: ";
    r->pending = pass == PASS_NONE ? R_ANSWER : R_FILE;
    return r;
}

struct rs_reader *rs_reader_new(struct rs_data *d, enum rs_query which,
                                const struct rs_fold_opts *o)
{
    return reader_new(d, which, o, PASS_NONE);
}

void rs_reader_free(struct rs_reader *r)
{
    free(r);
}

static bool is_container_role(enum role role, bool array)
{
    switch (role) {
    case R_RESULT:
    case R_VALUE:
        return array;
    case R_ANSWER:
    case R_DATA:
    case R_SAMPLE:
    case R_METRIC:
    case R_FILE:
    case R_LABELS:
        return !array;
    default:
        return false;
    }
}

static bool is_string_role(enum role role)
{
    return role == R_STATUS || role == R_ERROR || role == R_RTYPE || role == R_LABEL ||
           role == R_VALUE_V || role == R_WINDOW || role == R_LABELS_NS || role == R_LABELS_POD;
}

static enum role top_role(const struct rs_reader *r)
{
    return (enum role)r->role[r->depth];
}

static bool top_is_list(const struct rs_reader *r)
{
    return r->depth && (r->arrays >> (r->depth - 1) & 1);
}

/* The role of the value under key in the object on top. */
static enum role key_role(struct rs_reader *r)
{
    const char *k = r->tok;
    if (r->tok_over)
        return R_SKIP;
    switch (top_role(r)) {
    case R_ANSWER:
        return strcmp(k, "status") == 0  ? R_STATUS
               : strcmp(k, "error") == 0 ? R_ERROR
               : strcmp(k, "data") == 0  ? R_DATA
                                         : R_SKIP;
    case R_DATA:
        return strcmp(k, "resultType") == 0 ? R_RTYPE
               : strcmp(k, "result") == 0   ? R_RESULT
                                            : R_SKIP;
    case R_SAMPLE:
        return strcmp(k, "metric") == 0 ? R_METRIC : strcmp(k, "value") == 0 ? R_VALUE : R_SKIP;
    case R_METRIC:
        r->label_bits = (strcmp(k, r->ns_label) == 0 ? LABEL_NS : 0) |
                        (strcmp(k, r->pod_label) == 0 ? LABEL_POD : 0) |
                        (strcmp(k, "edge") == 0 ? LABEL_EDGE : 0);
        return r->label_bits ? R_LABEL : R_SKIP;
    case R_FILE:
        if (r->pass == PASS_META)
            return strcmp(k, "version") == 0  ? R_VERSION
                   : strcmp(k, "window") == 0 ? R_WINDOW
                   : strcmp(k, "time") == 0   ? R_TIME
                   : strcmp(k, "labels") == 0 ? R_LABELS
                                              : R_SKIP;
        return strcmp(k, r->pass == PASS_PEAK ? "peak" : "history") == 0 ? R_ANSWER : R_SKIP;
    case R_LABELS:
        return strcmp(k, "namespace") == 0 ? R_LABELS_NS
               : strcmp(k, "pod") == 0     ? R_LABELS_POD
                                           : R_SKIP;
    default:
        return R_SKIP;
    }
}

/* A value begins in the list on top: a series of the answer, or an element of a sample's value. */
static enum gg_status element(struct rs_reader *r)
{
    switch (top_role(r)) {
    case R_RESULT:
        if (++r->series > r->max_series)
            return reader_fail(r, GG_ERR_TOOBIG, "more than %zu series%s: refused", r->max_series,
                               r->configured_bound ? " (rightsizing.max_series)" : "");
        r->pending = R_SAMPLE;
        break;
    case R_VALUE:
        r->pending = ++r->s.value_elems == 2 ? R_VALUE_V : R_SKIP;
        break;
    default:
        r->pending = R_SKIP;
    }
    return GG_OK;
}

static void value_done(struct rs_reader *r)
{
    r->state = r->depth ? T_AFTER : T_DONE;
    r->pending = R_SKIP;
}

static enum gg_status open_container(struct rs_reader *r, size_t at, bool array)
{
    if (r->depth == RS_DEPTH_MAX)
        return reader_fail(r, GG_ERR_PARSE, "the answer nests deeper than %d levels at byte %zu",
                           RS_DEPTH_MAX, r->offset + at);
    enum role role = is_container_role(r->pending, array) ? r->pending : R_SKIP;
    r->depth++;
    r->arrays = (r->arrays & ~(1ULL << (r->depth - 1))) | ((uint64_t)array << (r->depth - 1));
    r->role[r->depth] = (uint8_t)role;
    r->pending = R_SKIP;
    r->state = array ? T_FIRST : T_KEY_FIRST;
    if (role == R_ANSWER)
        r->answer_seen = true;
    else if (role == R_RESULT)
        r->result_list = true;
    else if (role == R_SAMPLE)
        memset(&r->s, 0, sizeof(r->s));
    else if (role == R_VALUE) {
        r->s.value_elems = 0;
        r->s.has_value = false;
    }
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
 * A whole sample: a peak is the workload's when larger (a pod more); a
 * history edge dates a workload the peak answer named.  One that is not
 * {metric: {namespace, pod}, value: [t, "v"]} with v a number >= 0 is skipped.
 */
static enum gg_status sample_done(struct rs_reader *r)
{
    if (!r->d || r->pass == PASS_META || !r->s.has_ns || !r->s.has_pod || !r->s.has_value ||
        r->s.value_elems != 2)
        return GG_OK;
    char *end, workload[512], key[KEY_SIZE];
    double v = strtod(r->s.value, &end);
    if (end == r->s.value || *end || !isfinite(v) || v < 0 ||
        !workload_of(r->owners, r->s.ns, r->s.pod, workload, sizeof(workload)))
        return GG_OK;
    int n = snprintf(key, sizeof(key), "%s/%s", r->s.ns, workload);
    if (n < 0 || (size_t)n >= sizeof(key))
        return GG_OK;
    uint32_t hash = hash_key(key, (size_t)n);
    size_t i = find(r->d, key, (size_t)n, hash);
    if (r->which == RS_QUERY_PEAK) {
        if (i == SIZE_MAX && (i = insert(r->d, key, (size_t)n, hash)) == SIZE_MAX)
            return reader_fail(r, GG_ERR_NOMEM, "out of memory");
        struct rs_entry *e = &r->d->entries[i];
        if (v > e->peak_mib)
            e->peak_mib = v;
        e->pods++;
    } else {
        if (i == SIZE_MAX || !r->s.edge || v >= 9e18)
            return GG_OK;
        struct rs_entry *e = &r->d->entries[i];
        int64_t t = (int64_t)v;
        if (r->s.edge == 1 && (!e->first_s || t < e->first_s))
            e->first_s = t;
        else if (r->s.edge == 2 && (!e->last_s || t > e->last_s))
            e->last_s = t;
    }
    r->d->series++;
    return GG_OK;
}

static enum gg_status close_container(struct rs_reader *r, size_t at, bool array)
{
    if (!r->depth || top_is_list(r) != array)
        return unexpected(r, at, array ? ']' : '}');
    enum role role = top_role(r);
    r->depth--;
    value_done(r);
    return role == R_SAMPLE ? sample_done(r) : GG_OK;
}

/* The token as a name of at most max bytes into out (size > max); false when it is none. */
static bool take_name(const struct rs_reader *r, size_t max, char *out)
{
    if (r->tok_over || !r->tok_len || r->tok_len > max)
        return false;
    memcpy(out, r->tok, r->tok_len + 1);
    return true;
}

/* The token as a whole number (no fraction, no exponent). */
static bool take_integer(const struct rs_reader *r, int64_t *out)
{
    if (!r->num_int || r->tok_over)
        return false;
    errno = 0;
    char *end;
    long long v = strtoll(r->tok, &end, 10);
    if (errno || *end)
        return false;
    *out = v;
    return true;
}

static void string_value(struct rs_reader *r)
{
    switch (r->pending) {
    case R_STATUS:
        r->status = r->tok_over                      ? 3
                    : strcmp(r->tok, "success") == 0 ? 1
                    : strcmp(r->tok, "error") == 0   ? 2
                                                     : 3;
        break;
    case R_ERROR:
        snprintf(r->error, sizeof(r->error), "%.160s", r->tok);
        break;
    case R_RTYPE:
        r->vector = !r->tok_over && strcmp(r->tok, "vector") == 0;
        break;
    case R_LABEL:
        if (r->label_bits & LABEL_NS)
            r->s.has_ns = take_name(r, RS_NS_MAX, r->s.ns);
        if (r->label_bits & LABEL_POD)
            r->s.has_pod = take_name(r, RS_POD_MAX, r->s.pod);
        if (r->label_bits & LABEL_EDGE)
            r->s.edge = r->tok_over                    ? 0
                        : strcmp(r->tok, "first") == 0 ? 1
                        : strcmp(r->tok, "last") == 0  ? 2
                                                       : 0;
        break;
    case R_VALUE_V:
        r->s.has_value = take_name(r, sizeof(r->s.value) - 1, r->s.value);
        break;
    case R_WINDOW:
        if (!take_name(r, sizeof(r->window) - 1, r->window))
            r->window[0] = '\0';
        break;
    case R_LABELS_NS:
        if (!take_name(r, sizeof(r->file_ns) - 1, r->file_ns))
            r->file_ns[0] = '\0';
        break;
    case R_LABELS_POD:
        if (!take_name(r, sizeof(r->file_pod) - 1, r->file_pod))
            r->file_pod[0] = '\0';
        break;
    default:
        break;
    }
}

static void number_value(struct rs_reader *r)
{
    if (r->pending == R_VERSION)
        r->has_version = take_integer(r, &r->version);
    else if (r->pending == R_TIME)
        r->has_time = take_integer(r, &r->time_s);
}

static void keep(struct rs_reader *r, char c)
{
    if (!r->capture)
        return;
    if (r->tok_len < RS_TOKEN_MAX)
        r->tok[r->tok_len++] = c;
    else
        r->tok_over = true;
}

static void keep_code_point(struct rs_reader *r, uint32_t cp)
{
    if (cp < 0x80) {
        keep(r, (char)cp);
    } else if (cp < 0x800) {
        keep(r, (char)(0xc0 | cp >> 6));
        keep(r, (char)(0x80 | (cp & 0x3f)));
    } else if (cp < 0x10000) {
        keep(r, (char)(0xe0 | cp >> 12));
        keep(r, (char)(0x80 | (cp >> 6 & 0x3f)));
        keep(r, (char)(0x80 | (cp & 0x3f)));
    } else {
        keep(r, (char)(0xf0 | cp >> 18));
        keep(r, (char)(0x80 | (cp >> 12 & 0x3f)));
        keep(r, (char)(0x80 | (cp >> 6 & 0x3f)));
        keep(r, (char)(0x80 | (cp & 0x3f)));
    }
}

static void token_start(struct rs_reader *r, bool capture)
{
    r->capture = capture;
    r->tok_len = 0;
    r->tok_over = false;
}

static void token_end(struct rs_reader *r)
{
    r->tok[r->tok_len] = '\0';
}

/* A string is over: a key (its value's role follows) or a value. */
static void string_done(struct rs_reader *r)
{
    token_end(r);
    if (r->in_key) {
        r->pending = key_role(r);
        r->state = T_COLON;
        return;
    }
    string_value(r);
    value_done(r);
}

static int hex_digit(unsigned char c)
{
    return c >= '0' && c <= '9'   ? c - '0'
           : c >= 'a' && c <= 'f' ? c - 'a' + 10
           : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                  : -1;
}

/* Bytes of a string from data[*i]; *i past what was read. */
static enum gg_status in_string(struct rs_reader *r, const unsigned char *data, size_t len,
                                size_t *i)
{
    while (*i < len) {
        size_t at = *i;
        unsigned char c = data[at];
        if (!r->esc && !r->after_high && !r->utf8_need) {
            /* The common run: printable ASCII. */
            size_t j = at;
            while (j < len && data[j] >= 0x20 && data[j] < 0x80 && data[j] != '"' &&
                   data[j] != '\\')
                j++;
            if (r->capture)
                for (size_t k = at; k < j; k++)
                    keep(r, (char)data[k]);
            *i = j;
            if (j == len)
                return GG_OK;
            at = j;
            c = data[at];
        }
        (*i)++;
        if (r->after_high == 1) {
            if (c != '\\')
                return not_json(r, at, "a lone UTF-16 surrogate in a string");
            r->after_high = 2;
        } else if (r->after_high == 2) {
            if (c != 'u')
                return not_json(r, at, "a lone UTF-16 surrogate in a string");
            r->after_high = 0;
            r->esc = 2;
            r->code = 0;
        } else if (r->esc == 1) {
            static const char from[] = "\"\\/bfnrt", to[] = "\"\\/\b\f\n\r\t";
            const char *p = c ? strchr(from, c) : NULL;
            if (c == 'u') {
                r->esc = 2;
                r->code = 0;
            } else if (p) {
                keep(r, to[p - from]);
                r->esc = 0;
            } else {
                return not_json(r, at, "an invalid escape in a string");
            }
        } else if (r->esc >= 2) {
            int v = hex_digit(c);
            if (v < 0)
                return not_json(r, at, "an invalid \\u escape in a string");
            r->code = r->code << 4 | (uint32_t)v;
            if (++r->esc < 6)
                continue;
            r->esc = 0;
            uint32_t u = r->code;
            if (r->high) {
                if (u < 0xdc00 || u > 0xdfff)
                    return not_json(r, at, "a lone UTF-16 surrogate in a string");
                keep_code_point(r, 0x10000 + ((r->high - 0xd800) << 10) + (u - 0xdc00));
                r->high = 0;
            } else if (u >= 0xd800 && u <= 0xdbff) {
                r->high = u;
                r->after_high = 1;
            } else if (u >= 0xdc00 && u <= 0xdfff) {
                return not_json(r, at, "a lone UTF-16 surrogate in a string");
            } else if (u == 0) {
                return not_json(r, at, "\\u0000 in a string");
            } else {
                keep_code_point(r, u);
            }
        } else if (r->utf8_need) {
            if (c < r->utf8_lo || c > r->utf8_hi)
                return not_json(r, at, "invalid UTF-8 in a string");
            keep(r, (char)c);
            r->utf8_need--;
            r->utf8_lo = 0x80;
            r->utf8_hi = 0xbf;
        } else if (c == '"') {
            string_done(r);
            return GG_OK;
        } else if (c == '\\') {
            r->esc = 1;
        } else if (c < 0x20) {
            return not_json(r, at, "a control character in a string");
        } else { /* the lead byte of a UTF-8 sequence */
            r->utf8_lo = 0x80;
            r->utf8_hi = 0xbf;
            if (c >= 0xc2 && c <= 0xdf)
                r->utf8_need = 1;
            else if (c >= 0xe0 && c <= 0xef) {
                r->utf8_need = 2;
                if (c == 0xe0)
                    r->utf8_lo = 0xa0; /* not overlong */
                else if (c == 0xed)
                    r->utf8_hi = 0x9f; /* no surrogates */
            } else if (c >= 0xf0 && c <= 0xf4) {
                r->utf8_need = 3;
                if (c == 0xf0)
                    r->utf8_lo = 0x90;
                else if (c == 0xf4)
                    r->utf8_hi = 0x8f; /* at most U+10FFFF */
            } else {
                return not_json(r, at, "invalid UTF-8 in a string");
            }
            keep(r, (char)c);
        }
    }
    return GG_OK;
}

/* Whether c goes on the number; false when it ends it (c is read again after). */
static bool number_goes_on(struct rs_reader *r, unsigned char c)
{
    bool digit = c >= '0' && c <= '9';
    switch (r->num) {
    case N_MINUS:
        if (!digit)
            return false;
        r->num = c == '0' ? N_ZERO : N_INT;
        break;
    case N_ZERO:
    case N_INT:
        if (digit && r->num == N_INT)
            break;
        if (c == '.')
            r->num = N_DOT;
        else if (c == 'e' || c == 'E')
            r->num = N_EXP;
        else
            return false;
        r->num_int = false;
        break;
    case N_DOT:
    case N_FRAC:
        if (digit)
            r->num = N_FRAC;
        else if (r->num == N_FRAC && (c == 'e' || c == 'E'))
            r->num = N_EXP;
        else
            return false;
        break;
    case N_EXP:
        if (c == '+' || c == '-')
            r->num = N_EXP_SIGN;
        else if (digit)
            r->num = N_EXP_DIGITS;
        else
            return false;
        break;
    case N_EXP_SIGN:
    case N_EXP_DIGITS:
        if (!digit)
            return false;
        r->num = N_EXP_DIGITS;
        break;
    }
    keep(r, (char)c);
    return true;
}

static enum gg_status number_done(struct rs_reader *r, size_t at)
{
    if (r->num != N_ZERO && r->num != N_INT && r->num != N_FRAC && r->num != N_EXP_DIGITS)
        return not_json(r, at, "a number cut short");
    token_end(r);
    number_value(r);
    value_done(r);
    return GG_OK;
}

/* A value begins with c. */
static enum gg_status value_begins(struct rs_reader *r, size_t at, unsigned char c)
{
    enum gg_status st;
    if (top_is_list(r) && (st = element(r)) != GG_OK)
        return st;
    switch (c) {
    case '{':
    case '[':
        return open_container(r, at, c == '[');
    case '"':
        r->in_key = false;
        token_start(r, is_string_role(r->pending));
        r->state = T_STRING;
        return GG_OK;
    case 't':
    case 'f':
    case 'n':
        r->lit = c == 't' ? "rue" : c == 'f' ? "alse" : "ull";
        r->state = T_LITERAL;
        return GG_OK;
    default:
        if (c != '-' && (c < '0' || c > '9'))
            return unexpected(r, at, c);
        token_start(r, r->pending == R_VERSION || r->pending == R_TIME);
        r->num = c == '-' ? N_MINUS : c == '0' ? N_ZERO : N_INT;
        r->num_int = true;
        keep(r, (char)c);
        r->state = T_NUMBER;
        return GG_OK;
    }
}

enum gg_status rs_reader_feed(struct rs_reader *r, const char *data, size_t len, struct gg_err *err)
{
    const unsigned char *p = (const unsigned char *)data;
    enum gg_status st = GG_OK;
    size_t i = 0;
    while (i < len && st == GG_OK && r->state != T_FAILED) {
        unsigned char c = p[i];
        switch (r->state) {
        case T_STRING:
            st = in_string(r, p, len, &i);
            continue;
        case T_NUMBER:
            if (number_goes_on(r, c))
                i++;
            else
                st = number_done(r, i); /* c is read again, after the number */
            continue;
        case T_LITERAL:
            if (c != (unsigned char)*r->lit)
                st = unexpected(r, i, c);
            else if (!*++r->lit)
                value_done(r);
            i++;
            continue;
        default:
            break;
        }
        if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
            i++;
            continue;
        }
        switch (r->state) {
        case T_START:
        case T_VALUE:
            st = value_begins(r, i, c);
            break;
        case T_FIRST:
            st = c == ']' ? close_container(r, i, true) : value_begins(r, i, c);
            break;
        case T_KEY_FIRST:
        case T_KEY:
            if (c == '}' && r->state == T_KEY_FIRST) {
                st = close_container(r, i, false);
            } else if (c == '"') {
                r->in_key = true;
                token_start(r, top_role(r) != R_SKIP);
                r->state = T_STRING;
            } else {
                st = unexpected(r, i, c);
            }
            break;
        case T_COLON:
            if (c == ':')
                r->state = T_VALUE;
            else
                st = unexpected(r, i, c);
            break;
        case T_AFTER:
            if (c == ',')
                r->state = top_is_list(r) ? T_VALUE : T_KEY;
            else if (c == ']' || c == '}')
                st = close_container(r, i, c == ']');
            else
                st = unexpected(r, i, c);
            break;
        default: /* T_DONE */
            st = not_json(r, i, "more after the end");
            break;
        }
        i++;
    }
    r->offset += i;
    if (r->state == T_FAILED) {
        if (err)
            *err = r->err;
        return r->failed;
    }
    return GG_OK;
}

static enum gg_status not_an_answer(struct rs_reader *r)
{
    return reader_fail(r, GG_ERR_INVALID,
                       "not a Prometheus answer with an instant vector (status success, "
                       "data.resultType vector, data.result a list)");
}

/* The end of the input: the top value is whole. */
static enum gg_status reader_finish(struct rs_reader *r)
{
    if (r->state == T_FAILED)
        return r->failed;
    if (r->state == T_NUMBER && !r->depth && number_done(r, 0) != GG_OK)
        return r->failed;
    if (r->state == T_START)
        return reader_fail(r, GG_ERR_PARSE, "the answer is not JSON: it is empty");
    if (r->state != T_DONE)
        return reader_fail(r, GG_ERR_PARSE,
                           "the answer is not JSON: it ends early, after %zu bytes", r->offset);
    return GG_OK;
}

enum gg_status rs_reader_end(struct rs_reader *r, struct gg_err *err)
{
    enum gg_status st = reader_finish(r);
    if (st == GG_OK && r->pass != PASS_META) {
        if (r->answer_seen && r->status == 2)
            st = reader_fail(r, GG_ERR_INVALID, "Prometheus answered an error: %.160s",
                             r->error[0] ? r->error : "(no message)");
        else if (!r->answer_seen || r->status != 1 || !r->vector || !r->result_list)
            st = not_an_answer(r);
        else if (r->d && r->which == RS_QUERY_PEAK)
            r->d->peak_series += r->series;
        else if (r->d)
            r->d->history_series += r->series;
    }
    if (st != GG_OK && err)
        *err = r->err;
    return st;
}

enum gg_status rs_data_fold(struct rs_data *d, const char *peak, size_t peak_len,
                            const char *history, size_t history_len, const struct rs_fold_opts *o,
                            struct gg_err *err)
{
    const char *text[2] = {peak, history};
    size_t len[2] = {peak_len, history_len};
    for (int q = 0; q < 2; q++) {
        struct rs_reader *r = rs_reader_new(d, q ? RS_QUERY_HISTORY : RS_QUERY_PEAK, o);
        if (!r)
            return gg_fail(err, GG_ERR_NOMEM, "out of memory");
        enum gg_status st = rs_reader_feed(r, text[q] ? text[q] : "", len[q], err);
        if (st == GG_OK)
            st = rs_reader_end(r, err);
        rs_reader_free(r);
        if (st != GG_OK)
            return st;
    }
    rs_data_finish(d);
    return GG_OK;
}

/* ---- the saved form --------------------------------------------------------- */

char *rs_file_head(const struct rs_settings *s, int64_t time_s)
{
    char window[32], qpeak[RS_QUERY_MAX], qhistory[RS_QUERY_MAX];
    rs_format_duration(s->window_s, window, sizeof(window));
    if (!rs_query(s, RS_QUERY_PEAK, qpeak, sizeof(qpeak)) ||
        !rs_query(s, RS_QUERY_HISTORY, qhistory, sizeof(qhistory)))
        return NULL;
    json_t *labels = json_pack("{s:s,s:s}", "namespace", s->ns_label, "pod", s->pod_label);
    json_t *queries = json_pack("{s:s,s:s}", "peak", qpeak, "history", qhistory);
    json_t *win = json_string(window);
    char *l = labels ? json_dumps(labels, JSON_SORT_KEYS) : NULL;
    char *q = queries ? json_dumps(queries, JSON_SORT_KEYS) : NULL;
    char *w = win ? json_dumps(win, JSON_ENCODE_ANY) : NULL;
    char *out = NULL;
    if (l && q && w) {
        size_t n = strlen(l) + strlen(q) + strlen(w) + 128;
        if ((out = malloc(n)))
            snprintf(out, n,
                     "{\"version\": %d,\n\"window\": %s,\n\"time\": %lld,\n\"labels\": %s,\n"
                     "\"queries\": %s,\n\"peak\": ",
                     RS_FILE_VERSION, w, (long long)time_s, l, q);
    }
    free(l);
    free(q);
    free(w);
    json_decref(labels);
    json_decref(queries);
    json_decref(win);
    return out;
}

/* One pass over the file f with r. */
static enum gg_status file_pass(FILE *f, struct rs_reader *r, char *chunk, size_t size,
                                struct gg_err *err)
{
    rewind(f);
    size_t n;
    while ((n = fread(chunk, 1, size, f)) > 0)
        if (rs_reader_feed(r, chunk, n, err) != GG_OK)
            return r->failed;
    if (ferror(f))
        return gg_fail(err, GG_ERR_IO, "cannot read: %s", strerror(errno));
    return rs_reader_end(r, err);
}

enum gg_status rs_file_load(const char *path, struct rs_data *d, struct gg_err *err)
{
    struct stat sb;
    FILE *f = fopen(path, "rb");
    if (!f)
        return gg_fail(err, GG_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    enum gg_status st = GG_OK;
    char *chunk = NULL;
    struct rs_reader *meta = NULL, *r = NULL;
    struct gg_err inner = {{0}};
    if (fstat(fileno(f), &sb) != 0 || !S_ISREG(sb.st_mode)) {
        st = gg_fail(err, GG_ERR_IO, "%s: not a regular file", path);
        goto out;
    }
    if ((size_t)sb.st_size > RS_MAX_FILE) {
        st = gg_fail(err, GG_ERR_TOOBIG, "%s: larger than %zu bytes", path, RS_MAX_FILE);
        goto out;
    }
    size_t size = 64 << 10;
    if (!(chunk = malloc(size)) || !(meta = reader_new(NULL, RS_QUERY_PEAK, NULL, PASS_META))) {
        st = gg_fail(err, GG_ERR_NOMEM, "out of memory");
        goto out;
    }
    /* First what says how the answers were taken, wherever it sits; then each answer. */
    if ((st = file_pass(f, meta, chunk, size, &inner)) != GG_OK) {
        st = gg_fail(err, st, "%s: %s", path, inner.msg);
        goto out;
    }
    if (!meta->has_version || meta->version != RS_FILE_VERSION || !meta->file_ns[0] ||
        !meta->file_pod[0] || !rs_parse_duration(meta->window, &d->window_s) || !meta->has_time) {
        st = gg_fail(err, GG_ERR_INVALID,
                     "%s: not a usage file (version 1, window, time, labels.namespace, "
                     "labels.pod, peak, history; written by gpuguard usage)",
                     path);
        goto out;
    }
    d->time_s = meta->time_s;
    struct rs_fold_opts o = {meta->file_ns, meta->file_pod, NULL, 0};
    for (int q = 0; q < 2 && st == GG_OK; q++) {
        r = reader_new(d, q ? RS_QUERY_HISTORY : RS_QUERY_PEAK, &o, q ? PASS_HISTORY : PASS_PEAK);
        if (!r)
            st = gg_fail(err, GG_ERR_NOMEM, "out of memory");
        else if ((st = file_pass(f, r, chunk, size, &inner)) != GG_OK)
            st = gg_fail(err, st, "%s: %s", path, inner.msg);
        rs_reader_free(r);
    }
    if (st == GG_OK)
        rs_data_finish(d);
out:
    rs_reader_free(meta);
    free(chunk);
    fclose(f);
    if (st != GG_OK)
        rs_data_clear(d); /* what was folded before the error */
    return st;
}
