/*
 * infscan.c - the informer's JSON scanner: reads JSON text, checking every
 * byte it skips, and builds only what is asked (a pod trimmed to what
 * accounting needs).
 */
#include "kube/infscan.h"

#include "util/jsonfast.h"
#include "util/jsonscan.h"
#include "util/jsonwrite.h"
#include "kube/informer.h"
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

/* The four hex digits after a \u at p[0] ('u'), -1 when they are not there. */
static long hex4_at(const char *p, const char *end)
{
    if (end - p < 5 || !is_hex(p[1]) || !is_hex(p[2]) || !is_hex(p[3]) || !is_hex(p[4]))
        return -1;
    char digits[5] = {p[1], p[2], p[3], p[4], '\0'};
    return strtol(digits, NULL, 16);
}

/*
 * The \u escapes of a JSON text (p[0..n), strings and all) that the JSON parser refuses
 * (util/jsonfast.c: \u0000, a lone surrogate) become \ufffd, in place, the length kept.  The
 * API server writes a NUL in an annotation's value as \u0000; what gpuguard keeps of a pod must
 * load all the same, and a value so replaced is one the charge model refuses (counted as whole
 * GPUs), never one it reads as less.
 */
static void loadable(char *p, size_t n)
{
    const char *end = p + n;
    while ((p = memchr(p, '\\', (size_t)(end - p)))) {
        long cp = p[1] == 'u' ? hex4_at(p + 1, end) : -1;
        if (cp < 0) {
            p += 2; /* another escape (the text is JSON: there is a character after it) */
            continue;
        }
        long lo = cp >= 0xd800 && cp < 0xdc00 && end - p >= 12 && p[6] == '\\' && p[7] == 'u'
                      ? hex4_at(p + 7, end)
                      : -1;
        if (lo >= 0xdc00 && lo <= 0xdfff) {
            p += 12;
            continue;
        }
        if (cp == 0 || (cp >= 0xd800 && cp <= 0xdfff))
            memcpy(p + 2, "fffd", 4);
        p += 6;
    }
}

/* At a '"': past the closing quote; *escaped tells whether a backslash was seen. */
static inline __attribute__((always_inline)) bool skip_string(struct inf_scan *s, bool *escaped)
{
    const char *p = s->p + 1, *end = s->end;
    bool esc = false;
    for (;;) {
        p = jf_scan_plain_inline(p, end); /* stops at bytes above 0x7f too: passed over here */
        if (p >= end)
            return bad(s, "unterminated string");
        if (*p == '"')
            break;
        if ((unsigned char)*p >= 0x80) {
            p++;
            continue;
        }
        if (*p != '\\')
            return bad(s, "control character in a string");
        esc = true;
        if (++p >= end)
            return bad(s, "unterminated string");
        if (*p == 'u') {
            if (hex4_at(p, end) < 0)
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

/* Past one value that is no container, checked. */
static bool skip_scalar(struct inf_scan *s)
{
    switch (*s->p) {
    case '"':
        return skip_string(s, NULL);
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

/* In an object, at a member's key: past the key and its colon, at the value. */
static bool skip_key(struct inf_scan *s)
{
    if (s->p >= s->end || *s->p != '"')
        return bad(s, "expected a key");
    if (!skip_string(s, NULL))
        return false;
    inf_scan_ws(s);
    if (s->p >= s->end || *s->p != ':')
        return bad(s, "expected :");
    s->p++;
    inf_scan_ws(s);
    return true;
}

/*
 * One loop over the value's tokens, the containers open kept as bits (1: an
 * object): most of a pod's text is skipped, and a call per token would cost
 * more than the token.
 */
bool inf_scan_skip(struct inf_scan *s)
{
    uint64_t objects[INF_SCAN_MAX_DEPTH / 64 + 1] = {0};
    int open = 0;
    inf_scan_ws(s);
    for (;;) {
        if (s->p >= s->end)
            return bad(s, "unexpected end");
        char ch = *s->p;
        if (ch == '{' || ch == '[') {
            if (!inf_scan_enter(s))
                return false;
            uint64_t bit = 1ull << (open % 64);
            objects[open / 64] = ch == '{' ? objects[open / 64] | bit : objects[open / 64] & ~bit;
            open++;
            inf_scan_ws(s);
            if (s->p < s->end && *s->p == (ch == '{' ? '}' : ']')) {
                s->p++;
                s->depth--;
                open--;
            } else if (ch == '[' || skip_key(s)) {
                continue; /* at the first element's value */
            } else {
                return false;
            }
        } else if (!skip_scalar(s)) {
            return false;
        }
        /* After a value: close what ends here, then on to the next element's value. */
        for (;;) {
            if (!open)
                return true;
            bool object = objects[(open - 1) / 64] >> ((open - 1) % 64) & 1;
            inf_scan_ws(s);
            if (s->p >= s->end)
                return bad(s, "unexpected end");
            if (*s->p == (object ? '}' : ']')) {
                s->p++;
                s->depth--;
                open--;
                continue;
            }
            if (*s->p != ',')
                return bad(s, object ? "expected , or }" : "expected , or ]");
            s->p++;
            inf_scan_ws(s);
            if (object && !skip_key(s))
                return false;
            break;
        }
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

/* The byte at s->p, or NUL at the end of the text. */
static char peek(const struct inf_scan *s)
{
    return s->p < s->end ? *s->p : '\0';
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

/* ---- a pod: who it is, and its charge spec ----------------------------------- */

/* The pod's own strings: their offsets in the pod's text until the scan ends. */
enum field {
    F_UID,
    F_NS,
    F_NAME,
    F_GENERATE_NAME,
    F_CLASS,
    F_POOL,
    F_PHASE,
    F_NODE,
    F_OWNER_KIND,
    F_OWNER_NAME,
    F_RV, /* for the caller's rv */
    F_COUNT
};

#define ABSENT SIZE_MAX

/* The charge spec's objects, written apart (the pod's text may hold them in any order) and
 * joined in this order. */
static const char *const section_names[INF_POD_SECTIONS] = {"metadata", "spec", "status"};

struct pod_scan {
    struct inf_scan *s;
    struct inf_pod *pod;
    size_t at[F_COUNT];
    bool present[INF_POD_SECTIONS]; /* the pod has it (an object) */
    bool first[INF_POD_SECTIONS];   /* no member written to it yet */
};

void inf_pod_init(struct inf_pod *p)
{
    memset(p, 0, sizeof(*p));
    buf_init(&p->text, INF_MAX_LINE);
    for (size_t i = 0; i < INF_POD_SECTIONS; i++)
        buf_init(&p->sections[i], INF_MAX_LINE);
}

void inf_pod_free(struct inf_pod *p)
{
    buf_clear(&p->text);
    for (size_t i = 0; i < INF_POD_SECTIONS; i++)
        buf_clear(&p->sections[i]);
}

static bool out(struct pod_scan *ps, struct buf *b, const void *data, size_t n)
{
    return buf_append(b, data, n) == GG_OK || bad(ps->s, "the pod is too large");
}

/* The key of a member of the object being written into b (first: none written yet); a key of
 * the pod's text is checked to be UTF-8 here, where it is kept. */
static bool out_key(struct pod_scan *ps, struct buf *b, bool *first, const char *key)
{
    if (!jf_utf8_valid(key, strlen(key)))
        return bad(ps->s, "invalid string");
    if (!*first && !out(ps, b, ",", 1))
        return false;
    *first = false;
    return (jw_string(b, key, strlen(key)) == GG_OK && out(ps, b, ":", 1)) ||
           bad(ps->s, "the pod is too large");
}

/* The value at s->p into b as it stands in the text, its strings checked to be UTF-8. */
static bool out_value(struct pod_scan *ps, struct buf *b)
{
    const char *start = ps->s->p;
    if (!inf_scan_skip(ps->s))
        return false;
    size_t n = (size_t)(ps->s->p - start);
    if (!jf_utf8_valid(start, n))
        return bad(ps->s, "invalid string");
    if (!out(ps, b, start, n))
        return false;
    loadable(b->data + b->len - n, n);
    return true;
}

/* A member kept as it stands, whatever its type (the model judges a value a file's YAML left
 * unquoted); a null one is left out unless keep_null. */
static bool out_member(struct pod_scan *ps, struct buf *b, bool *first, const char *key,
                       bool keep_null)
{
    if (!keep_null && peek(ps->s) == 'n')
        return skip_word(ps->s, "null");
    return out_key(ps, b, first, key) && out_value(ps, b);
}

/* A string of the pod's own, decoded into the pod's text; anything else (null, a number a
 * file's YAML left unquoted) leaves it absent. */
static bool take(struct pod_scan *ps, enum field f)
{
    struct inf_scan *s = ps->s;
    if (peek(s) != '"')
        return inf_scan_skip(s);
    const char *start = s->p;
    bool escaped;
    if (!skip_string(s, &escaped))
        return false;
    struct buf *text = &ps->pod->text;
    size_t n = (size_t)(s->p - start), at = text->len;
    if (!jf_utf8_valid(start, n))
        return bad(s, "invalid string");
    if (!escaped) {
        ps->at[f] = at;
        return out(ps, text, start + 1, n - 2) && out(ps, text, "", 1);
    }
    if (!out(ps, text, start, n)) /* a copy to decode, made loadable */
        return false;
    loadable(text->data + at, n);
    json_t *v = jf_loadb(text->data + at, n, 1, NULL);
    text->len = at;
    ps->at[f] = at;
    bool ok = json_is_string(v) ? out(ps, text, json_string_value(v), json_string_length(v) + 1)
                                : bad(s, "invalid string");
    json_decref(v);
    return ok;
}

/* A member of an object being read: into b (first as for out_key), or the pod's own. */
typedef bool (*member_fn)(struct pod_scan *ps, struct buf *b, bool *first, const char *key);

/* The members of the object at s->p, each read by member (null: none); *is_object when given. */
static bool each_member(struct pod_scan *ps, struct buf *b, bool *first, member_fn member,
                        bool *is_object)
{
    int r = open_object(ps->s, '{');
    if (is_object)
        *is_object = *is_object || r == 1;
    bool at_first = true;
    char key[INF_SCAN_KEY_MAX];
    while (r == 1 && (r = inf_scan_member(ps->s, &at_first, key)) == 1)
        if (!member(ps, b, first, key))
            return false;
    return r == 0;
}

/* The object at s->p as the member key of b, its members written by member (null: left
 * out); with drop_empty, left out also when member writes none. */
static bool out_object(struct pod_scan *ps, struct buf *b, bool *first, const char *key,
                       member_fn member, bool drop_empty)
{
    if (peek(ps->s) == 'n')
        return skip_word(ps->s, "null");
    size_t mark = b->len;
    bool was_first = *first, inner = true;
    if (!out_key(ps, b, first, key) || !out(ps, b, "{", 1) ||
        !each_member(ps, b, &inner, member, NULL))
        return false;
    if (drop_empty && inner) {
        b->len = mark;
        *first = was_first;
        return true;
    }
    return out(ps, b, "}", 1);
}

/* Of limits or requests, only the extended resources the charge counts, as strings or
 * numbers. */
bool inf_charged_resource(const char *key)
{
    return strchr(key, '/') != NULL;
}

bool inf_charge_annotation(const char *key)
{
    static const char *const charged[] = {GG_CHARGE_ANNOTATIONS};
    for (size_t i = 0; i < sizeof(charged) / sizeof(*charged); i++)
        if (strcmp(key, charged[i]) == 0)
            return true;
    return false;
}

static bool quantity_member(struct pod_scan *ps, struct buf *b, bool *first, const char *key)
{
    char ch = peek(ps->s);
    if (inf_charged_resource(key) && (ch == '"' || ch == '-' || (ch >= '0' && ch <= '9')))
        return out_member(ps, b, first, key, false);
    return inf_scan_skip(ps->s);
}

static bool resources_member(struct pod_scan *ps, struct buf *b, bool *first, const char *key)
{
    if (!strcmp(key, "limits") || !strcmp(key, "requests"))
        return out_object(ps, b, first, key, quantity_member, false);
    return inf_scan_skip(ps->s);
}

static bool container_member(struct pod_scan *ps, struct buf *b, bool *first, const char *key)
{
    if (!strcmp(key, "name") || !strcmp(key, "restartPolicy"))
        return out_member(ps, b, first, key, false);
    if (!strcmp(key, "resources"))
        return out_object(ps, b, first, key, resources_member, false);
    return inf_scan_skip(ps->s);
}

/* spec.containers or spec.initContainers (null: left out); a null element is written {}. */
static bool out_containers(struct pod_scan *ps, struct buf *b, bool *first, const char *key)
{
    int r = open_object(ps->s, '[');
    if (r <= 0)
        return r == 0;
    if (!out_key(ps, b, first, key) || !out(ps, b, "[", 1))
        return false;
    bool at_first = true, none_yet = true;
    while ((r = arr_next(ps->s, &at_first)) == 1) {
        bool inner = true, comma = !none_yet;
        none_yet = false;
        if ((comma && !out(ps, b, ",", 1)) || !out(ps, b, "{", 1) ||
            !each_member(ps, b, &inner, container_member, NULL) || !out(ps, b, "}", 1))
            return false;
    }
    return r == 0 && out(ps, b, "]", 1);
}

/* labels: the workload class alone, the pod's own. */
static bool label_member(struct pod_scan *ps, struct buf *b, bool *first, const char *key)
{
    (void)b, (void)first;
    return strcmp(key, GG_KEY_WORKLOAD_CLASS) == 0 ? take(ps, F_CLASS) : inf_scan_skip(ps->s);
}

/* annotations: the pool is the pod's own; the charge reads GG_CHARGE_ANNOTATIONS. */
static bool annotation_member(struct pod_scan *ps, struct buf *b, bool *first, const char *key)
{
    if (strcmp(key, GG_KEY_POOL) == 0)
        return take(ps, F_POOL);
    if (inf_charge_annotation(key))
        return out_member(ps, b, first, key, false);
    return inf_scan_skip(ps->s);
}

/* ownerReferences: the first controller's kind and name (neither empty). */
static bool read_controller(struct pod_scan *ps)
{
    struct inf_scan *s = ps->s;
    int r = open_object(s, '[');
    if (r <= 0)
        return r == 0;
    bool first = true;
    while ((r = arr_next(s, &first)) == 1) {
        int o = open_object(s, '{');
        if (o < 0)
            return false;
        size_t at[2] = {ABSENT, ABSENT}, mark = ps->pod->text.len;
        bool controller = false, rfirst = true, ok = true;
        char key[INF_SCAN_KEY_MAX];
        while (ok && o == 1 && (o = inf_scan_member(s, &rfirst, key)) == 1) {
            bool kind = !strcmp(key, "kind");
            if (kind || !strcmp(key, "name")) {
                size_t saved = ps->at[F_OWNER_KIND];
                ps->at[F_OWNER_KIND] = ABSENT;
                ok = take(ps, F_OWNER_KIND);
                at[!kind] = ps->at[F_OWNER_KIND];
                ps->at[F_OWNER_KIND] = saved;
            } else if (!strcmp(key, "controller") && s->p < s->end && *s->p == 't') {
                ok = controller = skip_word(s, "true");
            } else {
                ok = inf_scan_skip(s);
            }
        }
        if (!ok || o < 0)
            return false;
        const char *text = ps->pod->text.data;
        if (controller && at[0] != ABSENT && at[1] != ABSENT && text[at[0]] && text[at[1]] &&
            ps->at[F_OWNER_KIND] == ABSENT) {
            ps->at[F_OWNER_KIND] = at[0];
            ps->at[F_OWNER_NAME] = at[1];
        } else {
            ps->pod->text.len = mark; /* not the controller: its strings go */
        }
    }
    return r == 0;
}

static bool metadata_member(struct pod_scan *ps, struct buf *b, bool *first, const char *key)
{
    static const struct {
        const char *key;
        enum field f;
    } own[] = {{"uid", F_UID}, {"name", F_NAME}, {"generateName", F_GENERATE_NAME}};
    if (!strcmp(key, "namespace")) { /* the pod's own, and read by the charge */
        size_t before = ps->at[F_NS];
        if (!take(ps, F_NS))
            return false;
        if (ps->at[F_NS] == before)
            return true; /* not a string: absent */
        const char *ns = ps->pod->text.data + ps->at[F_NS];
        return out_key(ps, b, first, key) &&
               (jw_string(b, ns, strlen(ns)) == GG_OK || bad(ps->s, "the pod is too large"));
    }
    for (size_t i = 0; i < sizeof(own) / sizeof(*own); i++)
        if (!strcmp(key, own[i].key))
            return take(ps, own[i].f);
    if (!strcmp(key, "resourceVersion"))
        return take(ps, F_RV) &&
               (ps->at[F_RV] == ABSENT || strlen(ps->pod->text.data + ps->at[F_RV]) < INF_RV_MAX ||
                bad(ps->s, "resourceVersion too long"));
    if (!strcmp(key, "labels"))
        return each_member(ps, b, first, label_member, NULL);
    if (!strcmp(key, "annotations"))
        return out_object(ps, b, first, key, annotation_member, true);
    if (!strcmp(key, "ownerReferences"))
        return read_controller(ps);
    return inf_scan_skip(ps->s);
}

/* Is the value at start (a whole JSON value) an array with something in it? */
static bool names_some(const char *start, const char *end)
{
    if (*start != '[')
        return false;
    while (++start < end && (*start == ' ' || *start == '\n' || *start == '\r' || *start == '\t'))
        ;
    return start < end && *start != ']';
}

static bool spec_member(struct pod_scan *ps, struct buf *b, bool *first, const char *key)
{
    if (!strcmp(key, "nodeName"))
        return take(ps, F_NODE);
    if (!strcmp(key, "nodeSelector"))
        return out_member(ps, b, first, key, true);
    if (!strcmp(key, "resourceClaims")) {
        const char *start = ps->s->p;
        if (!out_member(ps, b, first, key, true))
            return false;
        ps->pod->claims = names_some(start, ps->s->p); /* the last one counts, as it loads */
        return true;
    }
    if (!strcmp(key, "containers") || !strcmp(key, "initContainers"))
        return out_containers(ps, b, first, key);
    return inf_scan_skip(ps->s);
}

/* status.phase, and status.resourceClaimStatuses: the claims made for the pod, which it is
 * charged from (not from a template looked up again by name). */
static bool status_member(struct pod_scan *ps, struct buf *b, bool *first, const char *key)
{
    if (!strcmp(key, "phase"))
        return take(ps, F_PHASE);
    if (!strcmp(key, "resourceClaimStatuses"))
        return out_member(ps, b, first, key, true);
    return inf_scan_skip(ps->s);
}

static bool pod_member(struct pod_scan *ps, const char *key)
{
    static const member_fn members[INF_POD_SECTIONS] = {metadata_member, spec_member,
                                                        status_member};
    for (size_t i = 0; i < INF_POD_SECTIONS; i++)
        if (!strcmp(key, section_names[i]))
            return each_member(ps, &ps->pod->sections[i], &ps->first[i], members[i],
                               &ps->present[i]);
    return inf_scan_skip(ps->s);
}

/* The charge spec after the pod's strings, then the pointers to them all. */
static bool finish(struct pod_scan *ps)
{
    struct inf_pod *p = ps->pod;
    size_t spec = p->text.len;
    bool first = true;
    if (!out(ps, &p->text, "{", 1))
        return false;
    for (size_t i = 0; i < INF_POD_SECTIONS; i++)
        if (ps->present[i] &&
            (!out_key(ps, &p->text, &first, section_names[i]) || !out(ps, &p->text, "{", 1) ||
             !out(ps, &p->text, p->sections[i].data ? p->sections[i].data : "",
                  p->sections[i].len) ||
             !out(ps, &p->text, "}", 1)))
            return false;
    if (!out(ps, &p->text, "}", 1))
        return false;
    const char *at[F_COUNT];
    for (size_t f = 0; f < F_COUNT; f++)
        at[f] = ps->at[f] == ABSENT ? "" : p->text.data + ps->at[f];
    p->uid = at[F_UID];
    p->ns = at[F_NS];
    p->name = at[F_NAME];
    p->generate_name = at[F_GENERATE_NAME];
    p->cls = at[F_CLASS];
    p->pool = at[F_POOL];
    p->phase = at[F_PHASE];
    p->node = at[F_NODE];
    p->owner_kind = at[F_OWNER_KIND];
    p->owner_name = at[F_OWNER_NAME];
    p->rv = at[F_RV];
    p->spec = p->text.data + spec;
    p->spec_len = p->text.len - spec;
    return true;
}

bool inf_scan_pod(struct inf_scan *s, struct inf_pod *p)
{
    struct pod_scan ps = {.s = s, .pod = p};
    for (size_t f = 0; f < F_COUNT; f++)
        ps.at[f] = ABSENT;
    buf_reset(&p->text);
    for (size_t i = 0; i < INF_POD_SECTIONS; i++) {
        buf_reset(&p->sections[i]);
        ps.first[i] = true;
    }
    p->claims = false;
    inf_scan_ws(s);
    if (s->p >= s->end || *s->p != '{')
        return bad(s, "a pod must be a JSON object");
    if (!inf_scan_enter(s))
        return false;
    bool first = true;
    int r;
    char key[INF_SCAN_KEY_MAX];
    while ((r = inf_scan_member(s, &first, key)) == 1)
        if (!pod_member(&ps, key))
            return false;
    return r == 0 && finish(&ps);
}

/* Set obj[key] to s unless it is "". */
static int set_string(json_t *obj, const char *key, const char *s)
{
    return *s ? json_object_set_new(obj, key, json_string(s)) : 0;
}

/* obj[key], an object made when missing; NULL when out of memory. */
static json_t *object_at(json_t *obj, const char *key)
{
    json_t *o = json_object_get(obj, key);
    if (!o && json_object_set_new(obj, key, o = json_object()) != 0)
        return NULL;
    return o;
}

json_t *inf_pod_json(const struct inf_pod *p)
{
    json_t *pod = jf_loadb(p->spec, p->spec_len, 0, NULL);
    if (!pod)
        return NULL;
    json_t *meta = *p->uid || *p->name || *p->generate_name || *p->cls || *p->pool || *p->owner_kind
                       ? object_at(pod, "metadata")
                       : json_object_get(pod, "metadata");
    json_t *spec = *p->node ? object_at(pod, "spec") : NULL;
    json_t *status = *p->phase ? object_at(pod, "status") : NULL;
    json_t *labels = *p->cls ? object_at(meta, "labels") : NULL;
    json_t *notes = *p->pool ? object_at(meta, "annotations") : NULL;
    bool ok = (!*p->owner_kind ||
               json_object_set_new(meta, "ownerReferences",
                                   json_pack("[{s:s,s:s,s:b}]", "kind", p->owner_kind, "name",
                                             p->owner_name, "controller", 1)) == 0) &&
              (!*p->cls || labels) && (!*p->pool || notes) && (!*p->node || spec) &&
              (!*p->phase || status) && !set_string(meta, "uid", p->uid) &&
              !set_string(meta, "name", p->name) &&
              !set_string(meta, "generateName", p->generate_name) &&
              !set_string(labels, GG_KEY_WORKLOAD_CLASS, p->cls) &&
              !set_string(notes, GG_KEY_POOL, p->pool) && !set_string(spec, "nodeName", p->node) &&
              !set_string(status, "phase", p->phase);
    if (!ok) {
        json_decref(pod);
        return NULL;
    }
    return pod;
}

/* ---- whole texts ------------------------------------------------------------ */

json_t *inf_read_pod(const char *text, size_t len, char *rv, struct gg_err *err)
{
    struct inf_pod p;
    inf_pod_init(&p);
    if (rv)
        rv[0] = '\0';
    json_t *pod = NULL;
    if (inf_pod_of_text(text, len, &p, err) && !(pod = inf_pod_json(&p)))
        gg_fail(err, GG_ERR_PARSE,
                "the pod's charge spec does not load (a number out of range, or out of memory)");
    if (pod && rv)
        strcpy(rv, p.rv);
    inf_pod_free(&p);
    return pod;
}

bool inf_pod_of_text(const char *text, size_t len, struct inf_pod *p, struct gg_err *err)
{
    struct inf_scan s = {.p = text, .end = text + len};
    if (inf_scan_pod(&s, p)) {
        inf_scan_ws(&s);
        if (s.p == s.end)
            return true;
        bad(&s, "data after the pod");
    }
    gg_fail(err, GG_ERR_PARSE, "byte %zu: %s", (size_t)(s.p - text),
            s.why ? s.why : "out of memory");
    return false;
}

/* The pod of obj (a jansson value) or node (a document's), written out and read. */
static bool pod_written(const json_t *obj, const struct jf_node *node, struct inf_pod *p,
                        struct gg_err *err)
{
    struct buf text;
    buf_init(&text, INF_MAX_LINE);
    bool ok = (obj ? jw_value(&text, obj) : jw_node(&text, node)) == GG_OK
                  ? inf_pod_of_text(text.data, text.len, p, err)
                  : gg_fail(err, GG_ERR_TOOBIG, "the pod is too large") == GG_OK;
    buf_clear(&text);
    return ok;
}

bool inf_pod_of_json(const json_t *obj, struct inf_pod *p, struct gg_err *err)
{
    return pod_written(obj, NULL, p, err);
}

bool inf_pod_of_nodes(const struct jf_node *node, struct inf_pod *p, struct gg_err *err)
{
    return pod_written(NULL, node, p, err);
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
