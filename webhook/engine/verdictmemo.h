/*
 * verdictmemo.h - the validate reports of policies that declare
 * `remember = true`, by the request they judged.
 *
 * Most pods are copies: the pods of one ReplicaSet or Job reach admission
 * as the same object (the API server names a generated pod after the
 * webhooks have seen it), and a policy whose verdict is a function of the
 * request and the configuration alone need not judge a copy again.  The
 * engine (policy.c) keys the reports by everything a policy can read of the
 * request but its uid, compared in full (never by hash alone), one entry a
 * request with a slot for each policy of the set, and keeps a policy's
 * report only when its call read nothing of the cluster
 * (lb_call_was_pure).  One memo per Lua VM: a new policy set or a broken VM
 * starts a new one.  Bounded in entries and bytes: full, it starts again
 * empty.  Not locked: one thread uses it.
 */
#ifndef GG_VERDICTMEMO_H
#define GG_VERDICTMEMO_H

#include "codec/admission.h"
#include "engine/luabridge.h"
#include "util/buf.h"

#include <stddef.h>

#define VM_MEMO_MAX_ENTRIES 4096
#define VM_MEMO_MAX_BYTES (8u << 20)
#define VERDICT_KEY_MAX (256u << 10) /* a request with a larger key is judged each time */

struct verdict_memo;
struct verdict_entry;

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

/* Policy i's report kept in e, copied into *out (to be cleared with lb_report_clear); false
 * when there is none (or no memory to copy it). */
bool verdict_entry_get(const struct verdict_entry *e, size_t i, struct lb_report *out);

/* Keep a copy of r as policy i's report in e; out of memory forgets it. */
void verdict_entry_put(struct verdict_memo *m, struct verdict_entry *e, size_t i,
                       const struct lb_report *r);

/*
 * The key of a request as validate's policies see it, into b (emptied
 * first): everything req gives a policy but its uid: operation, namespace,
 * name, kind, group, sub-resource, dryRun, whether it is the audit's, the
 * template's path, userInfo, the old object, the options and the object
 * (each as jf_key encodes it), and patch's JSON text (the mutate phase's
 * patch when validate sees the object it made; NULL: the object as it
 * came).  False when it is larger than b allows or out of memory.
 */
bool verdict_key(struct buf *b, const struct adm_request *req, const json_t *patch);

#endif
