/*
 * verdictmemo.c - validate reports by the request they judged: an entry a
 * request in a util/keymemo.h table, a slot a policy.
 */
#include "engine/verdictmemo.h"
#include "codec/jsonpatch.h"
#include "util/arena.h"
#include "util/jsonwrite.h"
#include "util/keymemo.h"

#include <stdlib.h>
#include <string.h>

struct verdict_memo {
    struct key_memo *table; /* of struct verdict_entry */
    size_t n;               /* policies */
};

/* What a mutate call left, as the patch from the review's object, shared by its slot and the
 * requests replaying it (malloc'ed, not the arena's). */
struct verdict_object {
    int refs;
    json_t *patch;
    json_t *paths; /* each op's path parsed */
};

struct slot {
    bool kept;
    bool read_dra; /* it holds for dra_version only */
    uint64_t dra_version;
    struct lb_report report;
    struct verdict_object *object; /* mutate: what the call left */
};

struct verdict_entry {
    size_t n; /* slots: a policy's validate, then its mutate */
    struct slot slots[];
};

void verdict_object_release(struct verdict_object *o)
{
    if (!o || --o->refs > 0)
        return;
    bool in_request = arena_pause();
    json_decref(o->patch);
    json_decref(o->paths);
    arena_resume(in_request);
    free(o);
}

enum gg_status verdict_object_apply(const struct verdict_object *o, const struct jf_node *original,
                                    struct jf_doc *doc, struct gg_err *err)
{
    return jp_patched_nodes(original, o->patch, o->paths, doc, err);
}

static void release(void *value)
{
    struct verdict_entry *e = value;
    for (size_t i = 0; i < e->n; i++) {
        lb_report_clear(&e->slots[i].report);
        verdict_object_release(e->slots[i].object);
    }
}

struct verdict_memo *verdict_memo_new(size_t n)
{
    struct verdict_memo *m = malloc(sizeof(*m));
    size_t size = sizeof(struct verdict_entry) + 2 * n * sizeof(struct slot);
    if (m && !(m->table = km_new(VM_MEMO_MAX_ENTRIES, VM_MEMO_MAX_BYTES, size, release))) {
        free(m);
        return NULL;
    }
    if (m)
        m->n = n;
    return m;
}

void verdict_memo_free(struct verdict_memo *m)
{
    if (m)
        km_free(m->table);
    free(m);
}

size_t verdict_memo_entries(const struct verdict_memo *m)
{
    return km_entries(m->table);
}

struct verdict_entry *verdict_memo_entry(struct verdict_memo *m, const char *key, size_t len)
{
    struct verdict_entry *e = km_get(m->table, key, len);
    if (!e && (e = km_put(m->table, key, len, 0)))
        e->n = 2 * m->n;
    return e;
}

/* A copy of r into *out; false (out cleared) when out of memory. */
static bool copy_report(const struct lb_report *r, struct lb_report *out)
{
    *out = (struct lb_report){.denials = json_deep_copy(r->denials),
                              .warnings = json_deep_copy(r->warnings),
                              .audit = json_deep_copy(r->audit),
                              .denials_left_out = r->denials_left_out,
                              .warnings_left_out = r->warnings_left_out,
                              .audit_left_out = r->audit_left_out};
    if ((r->denials && !out->denials) || (r->warnings && !out->warnings) ||
        (r->audit && !out->audit)) {
        lb_report_clear(out);
        return false;
    }
    return true;
}

/* Roughly the bytes a report holds: its texts and some per value. */
static size_t report_bytes(const struct lb_report *r)
{
    size_t n = 0, i;
    const char *key;
    json_t *v;
    json_array_foreach(r->denials, i, v) n += json_string_length(v) + 64;
    json_array_foreach(r->warnings, i, v) n += json_string_length(v) + 64;
    json_object_foreach(r->audit, key, v) n += strlen(key) + json_string_length(v) + 128;
    return n;
}

static size_t slot_of(const struct verdict_entry *e, enum lb_phase phase, size_t i)
{
    size_t at = (phase == LB_MUTATE ? e->n / 2 : 0) + i;
    return i < e->n / 2 ? at : e->n;
}

bool verdict_entry_get(const struct verdict_entry *e, enum lb_phase phase, size_t i,
                       uint64_t dra_version, struct lb_report *out, struct verdict_object **object)
{
    size_t at = slot_of(e, phase, i);
    if (at >= e->n || !e->slots[at].kept ||
        (e->slots[at].read_dra && e->slots[at].dra_version != dra_version) ||
        !copy_report(&e->slots[at].report, out))
        return false;
    if ((*object = e->slots[at].object))
        (*object)->refs++;
    return true;
}

/* A copy of patch and its paths parsed, outside the request's arena; NULL when out of
 * memory. */
static struct verdict_object *keep_object(const json_t *patch)
{
    struct verdict_object *o = calloc(1, sizeof(*o));
    if (!o)
        return NULL;
    o->refs = 1;
    o->patch = json_deep_copy(patch);
    o->paths = json_array();
    size_t i;
    const json_t *op;
    struct gg_err err;
    json_array_foreach(o->patch, i, op)
    {
        json_t *tokens = NULL;
        const char *path = json_string_value(json_object_get(op, "path"));
        if (!o->paths || !path || jp_pointer_parse(path, &tokens, &err) != GG_OK ||
            json_array_append_new(o->paths, tokens) != 0) {
            json_decref(o->paths);
            o->paths = NULL;
        }
    }
    if (!o->patch || !o->paths) {
        verdict_object_release(o);
        return NULL;
    }
    return o;
}

void verdict_entry_put(struct verdict_memo *m, struct verdict_entry *e, enum lb_phase phase,
                       size_t i, const struct lb_report *r, const json_t *edits, bool read_dra,
                       uint64_t dra_version)
{
    size_t at = slot_of(e, phase, i);
    if (at >= e->n)
        return;
    struct slot *s = &e->slots[at];
    if (s->kept) { /* under an older version of the DRA objects: this one replaces it */
        lb_report_clear(&s->report);
        verdict_object_release(s->object);
        s->object = NULL;
        s->kept = false;
    }
    s->read_dra = read_dra;
    s->dra_version = dra_version;
    bool in_request = arena_pause(); /* the copies outlive the review (arena.h) */
    s->kept = copy_report(r, &s->report);
    if (s->kept && edits && !(s->object = keep_object(edits))) {
        lb_report_clear(&s->report);
        s->kept = false;
    }
    arena_resume(in_request);
    if (s->kept)
        km_account(m->table, report_bytes(r) + (edits ? 8 * json_dumpb(edits, NULL, 0, 0) : 0));
}

/* A string (NULL: none), its length first. */
static bool put_string(struct buf *b, const char *s)
{
    uint32_t n = s ? (uint32_t)strlen(s) : 0;
    char head[5] = {s != NULL};
    memcpy(head + 1, &n, 4);
    return buf_append(b, head, 5) == GG_OK && buf_append(b, s ? s : "", n) == GG_OK;
}

/* A value of the review (NULL: none). */
static bool put_node(struct buf *b, const struct jf_node *n)
{
    return buf_append(b, n ? "\1" : "\0", 1) == GG_OK && (!n || jf_key(b, n));
}

bool verdict_key(struct buf *b, const struct adm_request *req)
{
    buf_reset(b);
    return put_string(b, adm_operation_name(req->operation)) && put_string(b, req->namespace) &&
           put_string(b, req->name) && put_string(b, req->kind) && put_string(b, req->group) &&
           put_string(b, req->sub_resource) && put_string(b, req->dry_run ? "dry" : NULL) &&
           put_string(b, req->background ? "background" : NULL) &&
           put_string(b, req->template_path) && put_node(b, req->user_info) &&
           put_node(b, req->old_object) && put_node(b, req->options) && put_node(b, req->object);
}

bool verdict_key_patch(struct buf *b, size_t len, const json_t *patch)
{
    b->len = len; /* the patch, last, is JSON text */
    return buf_append(b, patch ? "\1" : "\0", 1) == GG_OK &&
           (!patch || jw_value(b, patch) == GG_OK);
}
