/*
 * infscan.c - the informer's JSON scanner: reads JSON text, checking every
 * byte it skips, and builds only what is asked (a pod trimmed to what
 * accounting needs).
 */
#include "kube/infscan.h"

#include "util/jsonfast.h"
#include "kube/inventory.h"

#include <string.h>

/* ---- the scanner ---------------------------------------------------------- */

static bool bad(struct inf_scan *s, const char *why)
{
    if (!s->why)
        s->why = why;
    return false;
}

void inf_scan_ws(struct inf_scan *s)
{
    while (s->p < s->end && (*s->p == ' ' || *s->p == '\n' || *s->p == '\r' || *s->p == '\t'))
        s->p++;
}

static bool is_hex(char ch)
{
    return (ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'f') || (ch >= 'A' && ch <= 'F');
}

/* The bytes that end a plain run in a string: quote, backslash, control characters. */
static const unsigned char string_stop[256] = {
    1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,         1,
    1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, ['"'] = 1, ['\\'] = 1,
};

/* At a '"': past the closing quote; *escaped tells whether a backslash was seen. */
static bool skip_string(struct inf_scan *s, bool *escaped)
{
    const char *p = s->p + 1, *end = s->end;
    bool esc = false;
    for (;;) {
        while (p < end && !string_stop[(unsigned char)*p])
            p++;
        if (p >= end)
            return bad(s, "unterminated string");
        if (*p == '"')
            break;
        if (*p != '\\')
            return bad(s, "control character in a string");
        esc = true;
        if (++p >= end)
            return bad(s, "unterminated string");
        if (*p == 'u') {
            if (end - p < 5 || !is_hex(p[1]) || !is_hex(p[2]) || !is_hex(p[3]) || !is_hex(p[4]))
                return bad(s, "bad \\u escape");
            p += 5;
        } else if (strchr("\"\\/bfnrt", *p) && *p) {
            p++;
        } else {
            return bad(s, "bad escape");
        }
    }
    s->p = p + 1;
    if (escaped)
        *escaped = esc;
    return true;
}

static bool skip_digits(struct inf_scan *s)
{
    const char *start = s->p;
    while (s->p < s->end && *s->p >= '0' && *s->p <= '9')
        s->p++;
    return s->p > start || bad(s, "bad number");
}

static bool skip_number(struct inf_scan *s)
{
    if (s->p < s->end && *s->p == '-')
        s->p++;
    if (s->p < s->end && *s->p == '0')
        s->p++;
    else if (!skip_digits(s))
        return false;
    if (s->p < s->end && *s->p == '.') {
        s->p++;
        if (!skip_digits(s))
            return false;
    }
    if (s->p < s->end && (*s->p == 'e' || *s->p == 'E')) {
        s->p++;
        if (s->p < s->end && (*s->p == '+' || *s->p == '-'))
            s->p++;
        if (!skip_digits(s))
            return false;
    }
    return true;
}

static bool skip_word(struct inf_scan *s, const char *word)
{
    size_t n = strlen(word);
    if ((size_t)(s->end - s->p) < n || memcmp(s->p, word, n) != 0)
        return bad(s, "not JSON");
    s->p += n;
    return true;
}

/*
 * In a container whose opening bracket was consumed: 1 at its next element
 * (past the comma), 0 after close, -1 on malformed input.
 */
static int next_in(struct inf_scan *s, bool *first, char close, const char *expected)
{
    inf_scan_ws(s);
    if (s->p >= s->end)
        return bad(s, "unexpected end"), -1;
    if (*s->p == close) {
        s->p++;
        s->depth--;
        return 0;
    }
    if (!*first) {
        if (*s->p != ',')
            return bad(s, expected), -1;
        s->p++;
        inf_scan_ws(s);
    }
    *first = false;
    return 1;
}

/* Like inf_scan_member for an array: 1 at an element, 0 after the ']'. */
static int arr_next(struct inf_scan *s, bool *first)
{
    return next_in(s, first, ']', "expected , or ]");
}

bool inf_scan_enter(struct inf_scan *s)
{
    if (++s->depth > INF_SCAN_MAX_DEPTH)
        return bad(s, "nested too deeply");
    s->p++;
    return true;
}

bool inf_scan_skip(struct inf_scan *s)
{
    inf_scan_ws(s);
    if (s->p >= s->end)
        return bad(s, "unexpected end");
    bool first = true;
    int r;
    switch (*s->p) {
    case '"':
        return skip_string(s, NULL);
    case '{':
        if (!inf_scan_enter(s))
            return false;
        while ((r = inf_scan_member(s, &first, NULL)) == 1)
            if (!inf_scan_skip(s))
                return false;
        return r == 0;
    case '[':
        if (!inf_scan_enter(s))
            return false;
        while ((r = arr_next(s, &first)) == 1)
            if (!inf_scan_skip(s))
                return false;
        return r == 0;
    case 't':
        return skip_word(s, "true");
    case 'f':
        return skip_word(s, "false");
    case 'n':
        return skip_word(s, "null");
    default:
        return skip_number(s);
    }
}

json_t *inf_scan_string(struct inf_scan *s)
{
    const char *start = s->p;
    bool escaped;
    if (!skip_string(s, &escaped))
        return NULL;
    json_t *v = escaped ? jf_loadb(start, (size_t)(s->p - start), 1, NULL)
                        : json_stringn(start + 1, (size_t)(s->p - start) - 2);
    if (!v)
        bad(s, "invalid string");
    return v;
}

int inf_scan_member(struct inf_scan *s, bool *first, char *key)
{
    int r = next_in(s, first, '}', "expected , or }");
    if (r != 1)
        return r;
    if (s->p >= s->end || *s->p != '"')
        return bad(s, "expected a key"), -1;
    if (key) {
        const char *start = s->p;
        bool escaped;
        if (!skip_string(s, &escaped))
            return -1;
        size_t n = (size_t)(s->p - start) - 2;
        key[0] = '\0';
        if (!escaped && n < INF_SCAN_KEY_MAX) {
            memcpy(key, start + 1, n);
            key[n] = '\0';
        } else if (escaped) {
            json_t *k = jf_loadb(start, (size_t)(s->p - start), 1, NULL);
            const char *text = json_string_value(k);
            if (text && strlen(text) < INF_SCAN_KEY_MAX)
                strcpy(key, text);
            json_decref(k);
        }
    } else if (!skip_string(s, NULL)) {
        return -1;
    }
    inf_scan_ws(s);
    if (s->p >= s->end || *s->p != ':')
        return bad(s, "expected :"), -1;
    s->p++;
    inf_scan_ws(s);
    return 1;
}

/* 1: an object was opened, 0: null was read, -1: anything else. */
static int open_object(struct inf_scan *s, char open)
{
    inf_scan_ws(s);
    if (s->p < s->end && *s->p == open)
        return inf_scan_enter(s) ? 1 : -1;
    if (s->p < s->end && *s->p == 'n')
        return skip_word(s, "null") ? 0 : -1;
    return bad(s, open == '{' ? "expected an object" : "expected an array"), -1;
}

/* Set obj[key] to the string at s->p (null is skipped). */
static bool take_string(struct inf_scan *s, json_t *obj, const char *key)
{
    if (s->p < s->end && *s->p == 'n')
        return skip_word(s, "null");
    if (s->p >= s->end || *s->p != '"')
        return bad(s, "expected a string");
    json_t *v = inf_scan_string(s);
    return v && json_object_set_new(obj, key, v) == 0;
}

static bool wanted(const char *const *want, const char *key)
{
    for (; *want; want++)
        if (strcmp(*want, key) == 0)
            return true;
    return false;
}

/* A map of strings of which only the keys in want (NULL-terminated) are kept, as parent[name]. */
static bool take_selected(struct inf_scan *s, json_t *parent, const char *name,
                          const char *const *want)
{
    int r = open_object(s, '{');
    if (r <= 0)
        return r == 0;
    json_t *kept = NULL;
    bool first = true;
    char key[INF_SCAN_KEY_MAX];
    while ((r = inf_scan_member(s, &first, key)) == 1) {
        if (!wanted(want, key)) {
            if (!inf_scan_skip(s))
                return false;
            continue;
        }
        if (!kept)
            json_object_set_new(parent, name, kept = json_object());
        if (!take_string(s, kept, key))
            return false;
    }
    return r == 0;
}

/* ---- a pod trimmed to what accounting needs --------------------------------- */

/* ownerReferences: only the controller's kind and name, as [{kind, name, controller: true}]. */
static bool read_controller(struct inf_scan *s, json_t *meta)
{
    int r = open_object(s, '[');
    if (r <= 0)
        return r == 0;
    bool first = true;
    while ((r = arr_next(s, &first)) == 1) {
        int o = open_object(s, '{');
        if (o < 0)
            return false;
        json_t *ref = json_object();
        bool controller = false, rfirst = true, ok = true;
        char key[INF_SCAN_KEY_MAX];
        while (ok && o == 1 && (o = inf_scan_member(s, &rfirst, key)) == 1) {
            if (!strcmp(key, "kind") || !strcmp(key, "name"))
                ok = take_string(s, ref, key);
            else if (!strcmp(key, "controller") && s->p < s->end && *s->p == 't')
                ok = controller = skip_word(s, "true");
            else
                ok = inf_scan_skip(s);
        }
        if (ok && o == 0 && controller && !json_object_get(meta, "ownerReferences")) {
            json_object_set_new(ref, "controller", json_true());
            json_object_set_new(meta, "ownerReferences", json_pack("[o]", ref));
        } else {
            json_decref(ref);
        }
        if (!ok || o < 0)
            return false;
    }
    return r == 0;
}

/* What the charge model (intent.lua) reads of a pod's metadata, and its pool (GPUQuota limits). */
static const char *const kept_labels[] = {GG_KEY_WORKLOAD_CLASS, NULL};
static const char *const kept_annotations[] = {
    GG_KEY_CHARGE, GG_KEY_POOL, "gpu-fraction", "gpu-memory", "gpu-fraction-num-devices", NULL};

/* A value kept whole, parsed from its text (spec.resourceClaims, spec.nodeSelector,
 * status.resourceClaimStatuses). */
static bool take_raw(struct inf_scan *s, json_t *obj, const char *key)
{
    const char *start = s->p;
    if (!inf_scan_skip(s))
        return false;
    json_t *v = jf_loadb(start, (size_t)(s->p - start), 8, NULL);
    return v && json_object_set_new(obj, key, v) == 0;
}

/* Reads the member key into obj (s->p at its value); ctx as given to each_member. */
typedef bool (*member_fn)(struct inf_scan *s, json_t *obj, const char *key, void *ctx);

/* The members of an object as open_object left it (r), each read by member into obj. */
static bool each_member(struct inf_scan *s, int r, json_t *obj, member_fn member, void *ctx)
{
    bool first = true;
    char key[INF_SCAN_KEY_MAX];
    while (r == 1 && (r = inf_scan_member(s, &first, key)) == 1)
        if (!member(s, obj, key, ctx))
            return false;
    return r == 0;
}

/* The object value at s->p as parent[name], with what each member adds to it (null: none). */
static bool read_members(struct inf_scan *s, json_t *parent, const char *name, member_fn member,
                         void *ctx)
{
    json_t *obj = NULL;
    int r = open_object(s, '{');
    if (r == 1) {
        obj = json_object();
        json_object_set_new(parent, name, obj);
    }
    return each_member(s, r, obj, member, ctx);
}

/* ctx: where metadata.resourceVersion goes (INF_RV_MAX bytes), or NULL. */
static bool metadata_member(struct inf_scan *s, json_t *meta, const char *key, void *ctx)
{
    char *rv = ctx;
    if (!strcmp(key, "namespace") || !strcmp(key, "name") || !strcmp(key, "generateName") ||
        !strcmp(key, "uid"))
        return take_string(s, meta, key);
    if (!strcmp(key, "resourceVersion")) {
        json_t *tmp = json_object();
        bool ok = take_string(s, tmp, key);
        const char *v = json_string_value(json_object_get(tmp, key));
        if (ok && v && strlen(v) >= INF_RV_MAX)
            ok = bad(s, "resourceVersion too long");
        else if (ok && v && rv)
            strcpy(rv, v);
        json_decref(tmp);
        return ok;
    }
    if (!strcmp(key, "labels"))
        return take_selected(s, meta, "labels", kept_labels);
    if (!strcmp(key, "annotations"))
        return take_selected(s, meta, "annotations", kept_annotations);
    if (!strcmp(key, "ownerReferences"))
        return read_controller(s, meta);
    return inf_scan_skip(s);
}

/* Of limits or requests, only the extended resources (vendor.domain/name). */
static bool quantity_member(struct inf_scan *s, json_t *kept, const char *key, void *ctx)
{
    (void)ctx;
    if (!strchr(key, '/'))
        return inf_scan_skip(s);
    if (*s->p == '"')
        return take_string(s, kept, key);
    const char *start = s->p;
    if (!inf_scan_skip(s))
        return false;
    json_t *v = jf_loadb(start, (size_t)(s->p - start), 1, NULL);
    if (json_is_number(v))
        json_object_set_new(kept, key, v);
    else
        json_decref(v);
    return true;
}

static bool resources_member(struct inf_scan *s, json_t *res, const char *key, void *ctx)
{
    if (!strcmp(key, "limits") || !strcmp(key, "requests"))
        return read_members(s, res, key, quantity_member, ctx);
    return inf_scan_skip(s);
}

static bool container_member(struct inf_scan *s, json_t *c, const char *key, void *ctx)
{
    if (!strcmp(key, "name") || !strcmp(key, "restartPolicy"))
        return take_string(s, c, key);
    if (!strcmp(key, "resources"))
        return read_members(s, c, key, resources_member, ctx);
    return inf_scan_skip(s);
}

/* spec.containers or spec.initContainers; a null element is kept as {}. */
static bool read_containers(struct inf_scan *s, json_t *spec, const char *name)
{
    int r = open_object(s, '[');
    if (r <= 0)
        return r == 0;
    json_t *list = json_array();
    json_object_set_new(spec, name, list);
    bool first = true;
    while ((r = arr_next(s, &first)) == 1) {
        json_t *c = json_object();
        json_array_append_new(list, c);
        if (!each_member(s, open_object(s, '{'), c, container_member, NULL))
            return false;
    }
    return r == 0;
}

static bool spec_member(struct inf_scan *s, json_t *spec, const char *key, void *ctx)
{
    (void)ctx;
    if (!strcmp(key, "nodeName"))
        return take_string(s, spec, key);
    if (!strcmp(key, "nodeSelector") || !strcmp(key, "resourceClaims"))
        return take_raw(s, spec, key);
    if (!strcmp(key, "containers") || !strcmp(key, "initContainers"))
        return read_containers(s, spec, key);
    return inf_scan_skip(s);
}

/* status.phase, and status.resourceClaimStatuses: the claims made for the pod, which it is
 * charged from (not from a template looked up again by name). */
static bool status_member(struct inf_scan *s, json_t *status, const char *key, void *ctx)
{
    (void)ctx;
    if (!strcmp(key, "phase"))
        return take_string(s, status, key);
    if (!strcmp(key, "resourceClaimStatuses"))
        return take_raw(s, status, key);
    return inf_scan_skip(s);
}

/* ctx: as for metadata_member. */
static bool pod_member(struct inf_scan *s, json_t *pod, const char *key, void *ctx)
{
    if (!strcmp(key, "metadata"))
        return read_members(s, pod, key, metadata_member, ctx);
    if (!strcmp(key, "spec"))
        return read_members(s, pod, key, spec_member, NULL);
    if (!strcmp(key, "status"))
        return read_members(s, pod, key, status_member, NULL);
    return inf_scan_skip(s);
}

json_t *inf_scan_pod(struct inf_scan *s, char *rv)
{
    inf_scan_ws(s);
    if (s->p >= s->end || *s->p != '{') {
        bad(s, "a pod must be a JSON object");
        return NULL;
    }
    json_t *pod = json_object();
    if (pod && inf_scan_enter(s) && each_member(s, 1, pod, pod_member, rv))
        return pod;
    json_decref(pod);
    return NULL;
}

/* ---- whole texts ------------------------------------------------------------ */

json_t *inf_read_pod(const char *text, size_t len, char *rv, struct gg_err *err)
{
    struct inf_scan s = {.p = text, .end = text + len};
    if (rv)
        rv[0] = '\0';
    json_t *pod = inf_scan_pod(&s, rv);
    if (pod) {
        inf_scan_ws(&s);
        if (s.p == s.end)
            return pod;
        bad(&s, "data after the pod");
        json_decref(pod);
    }
    gg_fail(err, GG_ERR_PARSE, "byte %zu: %s", (size_t)(s.p - text),
            s.why ? s.why : "out of memory");
    return NULL;
}

json_t *inf_read_object(const char *text, size_t len, char *rv, struct gg_err *err)
{
    struct jf_error jerr;
    json_t *obj = jf_loadb(text, len, 0, &jerr);
    if (rv)
        rv[0] = '\0';
    if (!obj) {
        gg_fail(err, GG_ERR_PARSE, "%s", jerr.text);
        return NULL;
    }
    const char *v =
        json_string_value(json_object_get(json_object_get(obj, "metadata"), "resourceVersion"));
    if (!json_is_object(obj) || (v && strlen(v) >= INF_RV_MAX)) {
        gg_fail(err, GG_ERR_PARSE, "%s",
                json_is_object(obj) ? "resourceVersion too long" : "not a JSON object");
        json_decref(obj);
        return NULL;
    }
    if (rv && v)
        strcpy(rv, v);
    return obj;
}
