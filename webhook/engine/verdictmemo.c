/*
 * verdictmemo.c - validate reports by the request they judged: an entry a
 * request in a util/keymemo.h table, a slot a policy.
 */
#include "engine/verdictmemo.h"
#include "util/arena.h"
#include "util/jsonwrite.h"
#include "util/keymemo.h"

#include <stdlib.h>
#include <string.h>

struct verdict_memo {
    struct key_memo *table; /* of struct verdict_entry */
    size_t n;               /* policies */
};

struct slot {
    bool kept;
    struct lb_report report;
};

struct verdict_entry {
    size_t n;
    struct slot slots[];
};

static void release(void *value)
{
    struct verdict_entry *e = value;
    for (size_t i = 0; i < e->n; i++)
        lb_report_clear(&e->slots[i].report);
}

struct verdict_memo *verdict_memo_new(size_t n)
{
    struct verdict_memo *m = malloc(sizeof(*m));
    size_t size = sizeof(struct verdict_entry) + n * sizeof(struct slot);
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
        e->n = m->n;
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

bool verdict_entry_get(const struct verdict_entry *e, size_t i, struct lb_report *out)
{
    return i < e->n && e->slots[i].kept && copy_report(&e->slots[i].report, out);
}

void verdict_entry_put(struct verdict_memo *m, struct verdict_entry *e, size_t i,
                       const struct lb_report *r)
{
    if (i >= e->n || e->slots[i].kept)
        return;
    bool in_request = arena_pause(); /* the copy outlives the review (arena.h) */
    e->slots[i].kept = copy_report(r, &e->slots[i].report);
    arena_resume(in_request);
    if (e->slots[i].kept)
        km_account(m->table, report_bytes(r));
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

bool verdict_key(struct buf *b, const struct adm_request *req, const json_t *patch)
{
    buf_reset(b);
    /* Each part delimits itself; the patch, last, is JSON text. */
    return put_string(b, adm_operation_name(req->operation)) && put_string(b, req->namespace) &&
           put_string(b, req->name) && put_string(b, req->kind) && put_string(b, req->group) &&
           put_string(b, req->sub_resource) && put_string(b, req->dry_run ? "dry" : NULL) &&
           put_string(b, req->background ? "background" : NULL) &&
           put_string(b, req->template_path) && put_node(b, req->user_info) &&
           put_node(b, req->old_object) && put_node(b, req->options) && put_node(b, req->object) &&
           (!patch || jw_value(b, patch) == GG_OK);
}
