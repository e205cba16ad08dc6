/*
 * verdictmemo.h - the validate reports of policies that declare
 * `remember = { ... }`, by the request they judged.
 *
 * Most pods are copies: the pods of one ReplicaSet or Job reach admission
 * as the same object (the API server names a generated pod after the
 * webhooks have seen it), and a policy whose verdict is a function of the
 * request and the configuration alone need not judge a copy again.  The
 * engine (policy.c) keys the reports by everything a policy can read of the
 * request but its uid, compared in full (never by hash alone), one entry a
 * request with a slot for each call (policy and phase) of the set, and keeps
 * a call's report (and the object a mutate call left) only when it read
 * nothing of the cluster (lb_call_was_pure) but perhaps DRA objects, then
 * for as long as their version stays.  One memo per Lua VM: a new policy set or a broken VM
 * starts a new one.  Bounded in entries and bytes: full, it starts again
 * empty.  Not locked: one thread uses it.
 */
#ifndef GG_VERDICTMEMO_H
#define GG_VERDICTMEMO_H

#include "codec/admission.h"
#include "engine/luabridge.h"
#include "util/buf.h"

#include <stddef.h>
#include <stdint.h>

#define VM_MEMO_MAX_ENTRIES 4096
#define VM_MEMO_MAX_BYTES (8u << 20)
#define VERDICT_KEY_MAX (256u << 10) /* a request with a larger key is judged each time */

struct verdict_memo;
struct verdict_entry;
struct verdict_object;

/* A memo for a set of n policies; NULL when out of memory. */
struct verdict_memo *verdict_memo_new(size_t n);
void verdict_memo_free(struct verdict_memo *m);
size_t verdict_memo_entries(const struct verdict_memo *m);

/*
 * The entry of the request keyed key[0..len), made empty when there is none
 * (which may start the memo again empty: an entry is good until the next
 * call); NULL when out of memory.
 */
struct verdict_entry *verdict_memo_entry(struct verdict_memo *m, const char *key, size_t len);

/*
 * What policy i's call in phase kept in e, if it holds for dra_version (the
 * inventory's version of the DRA objects now): its report copied into *out
 * (to be cleared with lb_report_clear), and for a mutate call the object it
 * left (*object, held: verdict_object_release it when the request is
 * done); false when there is none (or no memory to copy it).
 */
bool verdict_entry_get(const struct verdict_entry *e, enum lb_phase phase, size_t i,
                       uint64_t dra_version, struct lb_report *out, struct verdict_object **object);

/* Keep a copy of r as policy i's report in phase in e, and for a mutate call what it left
 * (edits: the patch from the review's object to the call's); a call that read DRA objects
 * (read_dra) holds only for dra_version.  Out of memory forgets it. */
void verdict_entry_put(struct verdict_memo *m, struct verdict_entry *e, enum lb_phase phase,
                       size_t i, const struct lb_report *r, const json_t *edits, bool read_dra,
                       uint64_t dra_version);

/* doc (empty on entry) made what a mutate call left, from original (the review's object, which
 * must outlive doc, as o's hold must): jp_patched_nodes. */
struct jf_doc;
enum gg_status verdict_object_apply(const struct verdict_object *o, const struct jf_node *original,
                                    struct jf_doc *doc, struct gg_err *err);
void verdict_object_release(struct verdict_object *o);

/*
 * The key of a request as its policies see it, into b (emptied first):
 * everything req gives a policy but its uid: operation, namespace, name,
 * kind, group, sub-resource, dryRun, whether it is the audit's, the
 * template's path, userInfo, the old object, the options and the object
 * (each as jf_key encodes it).  False when it is larger than b allows or
 * out of memory.
 */
bool verdict_key(struct buf *b, const struct adm_request *req);

/*
 * The key of the request as a call sees it, from verdict_key's (the first
 * len bytes of b): patch's JSON text after it, the patch from the review's
 * object to the one the call gets (NULL: the object as it came).  False as
 * verdict_key.
 */
bool verdict_key_patch(struct buf *b, size_t len, const json_t *patch);

#endif
