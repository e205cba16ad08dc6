/*
 * chargememo.h - the charges of charge specs already seen.
 *
 * Most pods of a cluster are copies: the pods of one ReplicaSet, Job or
 * StatefulSet differ in their names, not in what their charge reads.  The
 * charger hands the charge model a pod's charge spec (kube/infscan.h:
 * exactly what the model reads of a pod, as JSON text) rather than the pod,
 * so a charge is a function of that text and of the model alone, and the
 * charger remembers it under the text.  Keys are compared in full, never
 * by hash alone, so a crafted pod cannot take a cheaper pod's charge.
 *
 * A pod naming DRA claims also reads what they resolve to: the charger
 * keeps its charge with the version of the inventory's DRA objects (0 for
 * other pods), only when no DRA object moved during the evaluation and none
 * was asked of the API server, and gives it only for that version; a charge
 * under a newer version replaces it, so a busy cluster's DRA pods keep one
 * entry each.  A ResourceClaim is charged afresh each time.  The charger
 * clears the memo whenever the model changes (a reload).  Bounded in
 * entries and bytes: full, it starts again empty.  Not locked: its owner
 * serialises the calls.
 */
#ifndef GG_CHARGEMEMO_H
#define GG_CHARGEMEMO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define CM_MAX_ENTRIES 65536
#define CM_MAX_BYTES (16u << 20)

struct charge_memo;

struct charge_memo *cm_new(void);
void cm_free(struct charge_memo *m);
void cm_clear(struct charge_memo *m);
size_t cm_entries(const struct charge_memo *m);

/* The charge remembered under key[0..len) for version: true and *charge, or false. */
bool cm_get(const struct charge_memo *m, const char *key, size_t len, uint64_t version,
            int64_t *charge);

/* Remember charge under key[0..len) for version, in place of what it held for another
 * version; out of memory forgets it. */
void cm_put(struct charge_memo *m, const char *key, size_t len, uint64_t version, int64_t charge);

#endif
