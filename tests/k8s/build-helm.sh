#!/usr/bin/env bash
# Builds helm from the Go module pinned in tests/k8s/helm, into a cache keyed by that module's
# go.mod and go.sum and by this script, then links it into $1 (build/k8s/bin).
#
# A script and cache of its own, beside build.sh's: a change here must not change the key of
# the Kubernetes binaries, which take about 9 minutes to build again.  The cache lives outside
# build/ so that `make clean` leaves it alone.  Nothing is fetched but Go modules, through the
# Go module proxy.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
out=${1:?usage: build-helm.sh OUT_DIR}
cache_root=${GPUGUARD_K8S_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpuguard/k8s}
key=$(cat "$here/helm/go.mod" "$here/helm/go.sum" "$0" | sha256sum | cut -c1-16)
cache=$cache_root/helm-$key

mkdir -p "$cache_root"
exec 9>"$cache_root/.helm.lock"
flock 9  # another build of the same cache waits, then finds it done

if [ ! -f "$cache/complete" ]; then
    export PATH=$PATH:/usr/local/go/bin GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-mod=readonly
    helm=$(awk '$1 == "helm.sh/helm/v3" { print $2 }' "$here/helm/go.mod")
    client_go=$(awk '$1 == "k8s.io/client-go" { print $2 }' "$here/helm/go.mod")  # v0.37.0
    minor=$(echo "$client_go" | cut -d. -f2)
    # What helm's Makefile stamps for a tagged release (the git commit is not known here), so
    # that `helm version` tells the release, and the Kubernetes version that lint and template
    # assume is that of its client libraries rather than v1.20.
    v=helm.sh/helm/v3
    stamp="-X $v/internal/version.version=$helm
           -X $v/internal/version.metadata=
           -X $v/internal/version.gitTreeState=clean
           -X $v/pkg/lint/rules.k8sVersionMajor=1
           -X $v/pkg/lint/rules.k8sVersionMinor=$minor
           -X $v/pkg/chartutil.k8sVersionMajor=1
           -X $v/pkg/chartutil.k8sVersionMinor=$minor"
    rm -rf "$cache.tmp"
    mkdir -p "$cache.tmp"
    echo "building helm $helm into $cache"
    started=$(date +%s)
    (cd "$here/helm" &&
     go build -trimpath -ldflags "-s -w $stamp" -o "$cache.tmp/helm" helm.sh/helm/v3/cmd/helm)
    echo "helm $helm built in $(( $(date +%s) - started )) s" > "$cache.tmp/complete"
    rm -rf "$cache"
    mv "$cache.tmp" "$cache"
fi

mkdir -p "$out"
ln -sfn "$cache/helm" "$out/helm"
cat "$cache/complete"
