/*
 * cli_dra.c - ResourceClaims and ResourceClaimTemplates of input manifests
 * into the inventory (see cli_dra.h).
 */
#include "cli/cli_dra.h"

#include "kube/inventory.h"

#include <stdlib.h>
#include <string.h>

/* The object at an entry's pointer: the document itself, or one of a List's items. */
static const json_t *entry_object(const json_t *doc, const char *ptr)
{
    if (!*ptr)
        return doc;
    if (strncmp(ptr, "/items/", 7) != 0)
        return NULL;
    char *end;
    unsigned long i = strtoul(ptr + 7, &end, 10);
    return *end ? NULL : json_array_get(json_object_get(doc, "items"), i);
}

void cli_keep_dra(struct inventory *inv, const struct mf_set *set, const json_t *docs,
                  const char *namespace)
{
    for (size_t i = 0; i < set->count; i++) {
        const struct mf_entry *e = &set->entries[i];
        if (e->type != MF_SKIPPED || strncmp(e->api_version, "resource.k8s.io/", 16) != 0 ||
            (strcmp(e->kind, "ResourceClaim") != 0 && strcmp(e->kind, "ResourceClaimTemplate")))
            continue;
        const json_t *obj = entry_object(json_array_get(docs, e->doc), e->object_ptr);
        if (!json_is_object(obj))
            continue;
        json_t *copy = json_deep_copy(obj);
        json_t *meta = json_object_get(copy, "metadata");
        if (json_is_object(meta) && !json_is_string(json_object_get(meta, "namespace")))
            json_object_set_new(meta, "namespace", json_string(namespace ? namespace : "default"));
        inv_upsert(inv, copy);
        json_decref(copy);
    }
}
