/*
 * cfgkeys.h - every key of the configuration is known or refused.
 *
 * A key nothing reads is a setting that silently does nothing (`quota:` for
 * `quotas:` would turn quotas off), so an unknown top-level section, and an
 * unknown key of a known section, refuses the configuration with its path
 * and the nearest known key:
 *
 *   quota: unknown key; did you mean quotas? (known: classes, ...)
 *
 * The keys gpuguard reads are in one table, cfgschema.c; a policy of one's
 * own names the sections it reads in its table's config field, and refuses
 * what it does not know inside them with lua/schema.lua, through
 * gpuguard.unknown_key, whose message this module writes too.
 */
#ifndef GG_CFGKEYS_H
#define GG_CFGKEYS_H

#include "util/gpuguard.h"

#include <jansson.h>
#include <stddef.h>

/* The known name nearest to key (a typo, another spelling, a plural), or NULL when none is. */
const char *cfgkeys_nearest(const char *key, const char *const *known, size_t n);

/*
 * "<path><key>: unknown key; did you mean <nearest>? (known: <known, sorted>)"
 * into out (cut to size); path ends with its dot ("pools[2].") or is "".
 */
void cfgkeys_unknown(char *out, size_t size, const char *path, const char *key,
                     const char *const *known, size_t n);

/*
 * "<path>: unknown <what> \"<name>\"; did you mean <nearest>? (known: <known, sorted>)": a
 * value that must be one of known, such as a policy's name in policies.disabled.
 */
void cfgkeys_unknown_name(char *out, size_t size, const char *path, const char *what,
                          const char *name, const char *const *known, size_t n);

#endif
