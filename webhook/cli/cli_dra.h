/*
 * cli_dra.h - the DRA objects of the CLI's input manifests, kept for the
 * charge model: `gpuguard check` and `gpuguard test` read a
 * ResourceClaimTemplate applied in the same files as the pods that name it,
 * as the server reads it from the API server.
 */
#ifndef GG_CLI_DRA_H
#define GG_CLI_DRA_H

#include "codec/manifest.h"

#include <jansson.h>

struct inventory;

/*
 * Keep every resource.k8s.io ResourceClaim and ResourceClaimTemplate among
 * the set's documents (docs: the stream's) in inv; one without a namespace
 * gets namespace ("default" when NULL), as the pods do.  A ComputeDomain
 * (resource.nvidia.com) provides the ResourceClaimTemplate its controller
 * makes, spec.channel.resourceClaimTemplate.name: one IMEX channel of class
 * compute-domain-default-channel.nvidia.com, which is no GPU.
 */
void cli_keep_dra(struct inventory *inv, const struct mf_set *set, const json_t *docs,
                  const char *namespace);

#endif
