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
 * cfg_sections is the one table of the top-level sections gpuguard's engine,
 * library and shipped policies read; a policy of one's own names the
 * sections it reads in its table's config field.  Inside a section, its
 * checker refuses what it does not know (lua/schema.lua for the library's,
 * through gpuguard.unknown_key, whose message this module writes).
 */
#ifndef GG_CFGKEYS_H
#define GG_CFGKEYS_H

#include "util/gpuguard.h"

#include <jansson.h>
#include <stddef.h>

/* The top-level sections gpuguard knows, sorted. */
#define CFG_N_SECTIONS 15
extern const char *const cfg_sections[CFG_N_SECTIONS];

/* The known name nearest to key (a typo, another spelling, a plural), or NULL when none is. */
const char *cfgkeys_nearest(const char *key, const char *const *known, size_t n);

/*
 * "<path><key>: unknown key; did you mean <nearest>? (known: <known, sorted>)"
 * into out (cut to size); path ends with its dot ("pools[2].") or is "".
 */
void cfgkeys_unknown(char *out, size_t size, const char *path, const char *key,
                     const char *const *known, size_t n);

/*
 * Refuse a top-level section of root that neither cfg_sections nor declared
 * (an array of section names, the policies' config fields) holds; err says
 * which, as cfgkeys_unknown does.
 */
enum gg_status cfg_check_sections(const json_t *root, const json_t *declared, struct gg_err *err);

#endif
