/*
 * config.h - the gpuguard configuration file: YAML read into JSON (handed
 * to policies as a read-only Lua table), the engine's limits and the
 * enforcement overrides.
 *
 * Keys the engine reads (everything else belongs to the policies):
 *
 *   engine:
 *     memory: 32Mi           # Lua memory per VM (one VM per worker thread)
 *     instructions: 10000000 # Lua instructions per request
 *     timeout: 2s            # Lua wall clock per request (also cut by ?timeout=)
 *   enforcement:
 *     mode: warn             # every policy (enforce | warn | audit)
 *     failure: allow         # every policy, on a policy error (deny | allow)
 *     namespaces:            # every policy in these namespaces
 *       sandbox: audit
 *     policies:
 *       gpu-quota:
 *         mode: warn
 *         failure: allow
 *         namespaces:
 *           team-b: audit
 *
 * The most specific setting wins: policy in namespace, namespace, policy,
 * global, then the policy file's own `mode` / `failure`.
 *
 *   workloads:
 *     mode: validate         # workloads are only checked, never patched (default mutate)
 */
#ifndef GG_CONFIG_H
#define GG_CONFIG_H

#include "util/gpuguard.h"

#include <jansson.h>
#include <stdint.h>

#define CFG_MAX_FILE (4 * 1024 * 1024)

struct cfg_limits {
    size_t memory;
    int64_t instructions;
    int64_t timeout_us;
};

/* Read the file (NULL path: an empty configuration) into a JSON object, refusing a key the
 * schema does not have inside a known section (cfgschema_check; the top-level names are
 * checked with the policies). */
enum gg_status cfg_load(const char *path, json_t **root, struct gg_err *err);

/* engine: section with defaults; err names the key path. */
enum gg_status cfg_limits(const json_t *root, struct cfg_limits *out, struct gg_err *err);

/* Check the enforcement: section's shape and values. */
enum gg_status cfg_check_enforcement(const json_t *root, struct gg_err *err);

/*
 * The mode and failure for a policy in a namespace: *mode and *failure come
 * in as the policy file's own and are overridden by the configuration.
 * Values are indexes into {"enforce","warn","audit"} and {"deny","allow"}.
 */
void cfg_enforcement_for(const json_t *root, const char *policy, const char *ns, int *mode,
                         int *failure);

/* The audit: section (engine/audit.h), with its defaults. */
#define CFG_AUDIT_MIN_INTERVAL_MS 10000
/* A list page's continue token lives some 5 minutes (etcd's compaction): at 10 evaluations a
 * second, the pods of a page and their workloads are judged well within it. */
#define CFG_AUDIT_MIN_RATE 10
#define CFG_AUDIT_MAX_RATE 100000
struct cfg_audit {
    bool enabled;
    int64_t interval_ms;
    const char *report_api; /* borrowed from the configuration, or the default */
    int64_t rate;           /* evaluations per second at most */
};
/* audit: with defaults; err names the key when a value is wrong. */
enum gg_status cfg_audit(const json_t *root, struct cfg_audit *out, struct gg_err *err);

enum cfg_workloads_mode { CFG_WORKLOADS_MUTATE, CFG_WORKLOADS_VALIDATE };

/* workloads.mode (mutate when absent); err names the key when it is wrong. */
enum gg_status cfg_workloads_mode(const json_t *root, enum cfg_workloads_mode *out,
                                  struct gg_err *err);

/* How a policy's denial is delivered, and what a policy's failure means. */
enum policy_mode { POLICY_ENFORCE, POLICY_WARN, POLICY_AUDIT };
enum policy_failure { POLICY_FAIL_DENY, POLICY_FAIL_ALLOW };

/* "enforce" | "warn" | "audit" -> enum policy_mode, "deny" | "allow" -> enum
 * policy_failure; -1 if unknown. */
int cfg_mode_parse(const char *s);
int cfg_failure_parse(const char *s);

/* The configuration's name of a mode ("enforce", "warn", "audit"). */
const char *cfg_mode_name(enum policy_mode mode);

#endif
