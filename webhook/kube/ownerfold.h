/*
 * ownerfold.h - which workload a pod belongs to, from its controller owner
 * or, when that is unknown, from the names controllers give their pods.
 *
 * The workload is named by the object people edit: a Deployment (its
 * ReplicaSets are "<deployment>-<pod-template-hash>"), a CronJob (its Jobs
 * are "<cronjob>-<scheduled minute>"), a StatefulSet, a DaemonSet, a Job, an
 * operator's object.  From a pod name alone:
 *
 *   <name>-<hash>-<xxxxx>   a Deployment's pod          -> <name>
 *   <name>-<minute>-<xxxxx> a CronJob's Job's pod       -> <name>
 *   <name>-<xxxxx>          a Job's, DaemonSet's or ReplicaSet's pod -> <name>
 *   <name>-<ordinal>        a StatefulSet's pod         -> <name>
 *   anything else           a pod of its own            -> the pod's name
 *
 * where <xxxxx> is the 5 random characters of generateName and <hash> a
 * pod-template-hash, both from Kubernetes' "safe" alphabet (no vowels, no
 * 0, 1, 3), <minute> at least 8 digits and <ordinal> digits.  Pure: no
 * allocation, no I/O.
 */
#ifndef GG_OWNERFOLD_H
#define GG_OWNERFOLD_H

#include <stdbool.h>
#include <stddef.h>

/*
 * The workload of a pod with a controller owner of kind owner_kind named
 * owner_name; of the object itself at workload admission (pass its own
 * kind and name).  false when it does not fit in out (size bytes).
 */
bool of_from_owner(const char *owner_kind, const char *owner_name, char *out, size_t size);

/*
 * The workload of a pod from its name (or generateName, with its trailing
 * '-'), by the naming rules above.  false when it does not fit.
 */
bool of_from_pod_name(const char *pod, char *out, size_t size);

#endif
