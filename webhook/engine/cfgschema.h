/*
 * cfgschema.h - the configuration's schema: every key of gpuguard.yaml, its
 * type, default and meaning, in one table.
 *
 * Three things are read from it and nothing else says them again:
 *
 *   - the check that refuses a key nothing reads (cfgschema_check), at
 *     start, at reload and in every command, naming its path and the
 *     nearest known key (cfgkeys.h writes the message);
 *   - the JSON Schema editors validate against (cfgschema_json_schema,
 *     deploy/gpuguard.schema.json, `gpuguard config schema`);
 *   - the effective configuration `gpuguard config check` prints, with the
 *     defaults of the keys left out (cfgschema_effective).
 *
 * What a value must be (a DNS label, a known GPU model, a duration) is
 * checked by whoever reads it: the engine (config.c) or the policy and
 * library module that owns the section, which say it with the key's path.
 */
#ifndef GG_CFGSCHEMA_H
#define GG_CFGSCHEMA_H

#include "util/gpuguard.h"

#include <jansson.h>

enum cfg_shape {
    CS_VALUE,  /* a scalar, or a list of scalars */
    CS_OBJECT, /* a mapping of the keys in sub, and no others */
    CS_MAP,    /* a mapping of any names to values like sub[0] */
    CS_LIST,   /* a list of items like sub[0] */
};

struct cfg_key {
    const char *name;
    enum cfg_shape shape;
    const char *types;         /* CS_VALUE: JSON Schema types, space-separated ("string number") */
    const char *values;        /* CS_VALUE: the values it may take, '|'-separated, or NULL */
    const char *def;           /* the default as JSON text, or NULL: absent means off or unset */
    const char *doc;           /* one line: what it does */
    const struct cfg_key *sub; /* CS_OBJECT: keys ended by {0}; CS_MAP, CS_LIST: the element */
};

/* The top-level sections, ended by {0}. */
extern const struct cfg_key cfg_schema[];

/*
 * Refuse a key of root the schema does not have: a key inside a known
 * section, or a top-level section that is neither in cfg_schema nor declared
 * (an array of section names, the policies' config fields; their insides are
 * their own policy's).  With declared NULL (the policies not loaded yet) the
 * top-level names are not checked.  Paths count list items from 1 (pools[2]).  err
 * says which, as cfgkeys_unknown does.  A value of the wrong shape passes:
 * its reader says what it must be.
 */
enum gg_status cfgschema_check(const json_t *root, const json_t *declared, struct gg_err *err);

/* The JSON Schema (draft 2020-12) of the configuration; NULL when out of memory. */
json_t *cfgschema_json_schema(void);

/*
 * A copy of root with the defaults of the keys left out, inside the sections
 * and items root has (a section left out stays out: off); NULL when out of
 * memory.
 */
json_t *cfgschema_effective(const json_t *root);

#endif
