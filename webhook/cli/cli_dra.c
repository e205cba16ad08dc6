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

/* Whether an entry is a DRA claim or template (resource.k8s.io), or a ComputeDomain. */
static bool dra_kind(const struct mf_entry *e, bool *domain)
{
    *domain = strncmp(e->api_version, "resource.nvidia.com/", 20) == 0 &&
              strcmp(e->kind, "ComputeDomain") == 0;
    return *domain || (strncmp(e->api_version, "resource.k8s.io/", 16) == 0 &&
                       (strcmp(e->kind, "ResourceClaim") == 0 ||
                        strcmp(e->kind, "ResourceClaimTemplate") == 0));
}

/* The ResourceClaimTemplate the ComputeDomain controller makes for domain; NULL: it names none. */
static json_t *channel_template(const json_t *domain)
{
    const json_t *name =
        json_object_get(json_object_get(json_object_get(json_object_get(domain, "spec"), "channel"),
                                        "resourceClaimTemplate"),
                        "name");
    if (!json_is_string(name))
        return NULL;
    return json_pack("{s:s,s:s,s:{s:O,s:O?},s:{s:{s:{s:[{s:s,s:{s:s}}]}}}}", "apiVersion",
                     "resource.k8s.io/v1", "kind", "ResourceClaimTemplate", "metadata", "name",
                     name, "namespace",
                     json_object_get(json_object_get(domain, "metadata"), "namespace"), "spec",
                     "spec", "devices", "requests", "name", "channel", "exactly", "deviceClassName",
                     "compute-domain-default-channel.nvidia.com");
}

void cli_keep_dra(struct inventory *inv, const struct mf_set *set, const json_t *docs,
                  const char *namespace)
{
    for (size_t i = 0; i < set->count; i++) {
        const struct mf_entry *e = &set->entries[i];
        bool domain;
        if (e->type != MF_SKIPPED || !dra_kind(e, &domain))
            continue;
        const json_t *obj = entry_object(json_array_get(docs, e->doc), e->object_ptr);
        if (!json_is_object(obj))
            continue;
        json_t *copy = domain ? channel_template(obj) : json_deep_copy(obj);
        json_t *meta = json_object_get(copy, "metadata");
        if (json_is_object(meta) && !json_is_string(json_object_get(meta, "namespace")))
            json_object_set_new(meta, "namespace", json_string(namespace ? namespace : "default"));
        if (copy)
            inv_upsert(inv, copy);
        json_decref(copy);
    }
}
