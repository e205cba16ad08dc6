/*
 * ownerfold.c - pod names and controller owners folded into workload
 * names (see ownerfold.h for the rules).
 */
#include "kube/ownerfold.h"

#include <string.h>

/* k8s.io/apimachinery/pkg/util/rand: what generateName and pod-template-hash draw from. */
static const char SAFE[] = "bcdfghjklmnpqrstvwxz2456789";

/* The length of name's last '-'-separated segment; 0 when it has no '-' before it. */
static size_t last_segment(const char *name, size_t len)
{
    for (size_t i = len; i > 0; i--)
        if (name[i - 1] == '-')
            return i - 1 > 0 ? len - i : 0;
    return 0;
}

static bool all_of(const char *s, size_t n, const char *set)
{
    for (size_t i = 0; i < n; i++)
        if (!strchr(set, s[i]))
            return false;
    return n > 0;
}

static bool digits(const char *s, size_t n)
{
    return all_of(s, n, "0123456789");
}

/*
 * A pod-template-hash: a decimal FNV-32a, safe-encoded, so up to 10
 * characters; fewer than 6 is one hash in 10,000 and would take short words
 * of a name for hashes.
 */
static bool is_template_hash(const char *s, size_t n)
{
    return n >= 6 && n <= 10 && all_of(s, n, SAFE);
}

/* A CronJob's scheduled time in minutes since the epoch (8 digits until the year 2160). */
static bool is_cron_minute(const char *s, size_t n)
{
    return n >= 8 && n <= 12 && digits(s, n);
}

static bool copy(const char *s, size_t n, char *out, size_t size)
{
    if (n >= size)
        return false;
    memcpy(out, s, n);
    out[n] = '\0';
    return true;
}

/* The length of name without its last segment when is_suffix says it is a controller's. */
static size_t strip(const char *name, size_t len, bool (*is_suffix)(const char *, size_t))
{
    size_t seg = last_segment(name, len);
    if (seg && is_suffix(name + len - seg, seg))
        return len - seg - 1;
    return len;
}

bool of_from_owner(const char *owner_kind, const char *owner_name, char *out, size_t size)
{
    size_t len = strlen(owner_name);
    if (strcmp(owner_kind, "ReplicaSet") == 0)
        len = strip(owner_name, len, is_template_hash);
    else if (strcmp(owner_kind, "Job") == 0)
        len = strip(owner_name, len, is_cron_minute);
    return copy(owner_name, len, out, size);
}

static bool is_random_suffix(const char *s, size_t n)
{
    return n == 5 && all_of(s, n, SAFE);
}

/* The owner's name in a pod name "<owner>-<xxxxx>" cut to len: a CronJob's Job or a ReplicaSet. */
static size_t owner_of(const char *pod, size_t len)
{
    size_t owner = strip(pod, len, is_cron_minute);
    return owner != len ? owner : strip(pod, len, is_template_hash);
}

bool of_from_pod_name(const char *pod, char *out, size_t size)
{
    size_t len = strlen(pod);
    if (len && pod[len - 1] == '-') /* a generateName: "<owner>-" */
        return copy(pod, owner_of(pod, len - 1), out, size);
    size_t base = strip(pod, len, is_random_suffix);
    if (base != len)
        return copy(pod, owner_of(pod, base), out, size);
    return copy(pod, strip(pod, len, digits), out, size);
}
