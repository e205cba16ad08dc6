#!/usr/bin/env bash
# Builds the Kubernetes binaries the end-to-end tests run (kube-apiserver, kube-controller-manager,
# kube-scheduler, kubectl, etcd, kwok) from the Go modules pinned in tests/k8s, into a cache keyed
# by those modules' go.mod and go.sum and by this script, then links them into $1 (build/k8s/bin)
# with kwok-stages.yaml: kwok's own stages (from its module) that keep nodes Ready, heartbeat
# their Leases and move bound pods to Running.
#
# A cold build takes about 9 minutes on two cores; the cache lives outside build/ so that
# `make clean` leaves it alone and a machine pays it once.  Nothing is fetched but Go modules,
# through the Go module proxy.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
out=${1:?usage: build.sh OUT_DIR}
cache_root=${GPUGUARD_K8S_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpuguard/k8s}
key=$(cat "$here/go.mod" "$here/go.sum" "$here/kwok/go.mod" "$here/kwok/go.sum" "$0" |
      sha256sum | cut -c1-16)
cache=$cache_root/$key
tools="kube-apiserver kube-controller-manager kube-scheduler kubectl etcd kwok kwok-stages.yaml"

mkdir -p "$cache_root"
exec 9>"$cache_root/.lock"
flock 9  # another build of the same cache waits, then finds it done

if [ ! -f "$cache/complete" ]; then
    export PATH=$PATH:/usr/local/go/bin GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-mod=readonly
    k8s=$(awk '$1 == "k8s.io/kubernetes" { print $2 }' "$here/go.mod")
    minor=$(echo "$k8s" | cut -d. -f2)
    # What hack/lib/golang.sh stamps, so that /version tells the release and not v0.0.0-master.
    stamp="-X k8s.io/component-base/version.gitVersion=$k8s
           -X k8s.io/component-base/version.gitMajor=1
           -X k8s.io/component-base/version.gitMinor=$minor
           -X k8s.io/component-base/version.gitTreeState=clean
           -X k8s.io/client-go/pkg/version.gitVersion=$k8s
           -X k8s.io/client-go/pkg/version.gitMajor=1
           -X k8s.io/client-go/pkg/version.gitMinor=$minor"
    rm -rf "$cache.tmp"
    mkdir -p "$cache.tmp"
    echo "building Kubernetes $k8s into $cache (a cold build takes about 9 minutes on 2 cores)"
    started=$(date +%s)
    (cd "$here" &&
     go build -trimpath -tags selinux,notest -ldflags "-s -w $stamp" -o "$cache.tmp/" \
        k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
        k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubectl &&
     go build -trimpath -ldflags "-s -w" -o "$cache.tmp/etcd" go.etcd.io/etcd/server/v3)
    (cd "$here/kwok" && go build -trimpath -ldflags "-s -w" -o "$cache.tmp/kwok" sigs.k8s.io/kwok/cmd/kwok)
    stages=$(cd "$here/kwok" && go list -m -f '{{.Dir}}' sigs.k8s.io/kwok)/kustomize/stage
    for s in node/fast node/heartbeat-with-lease pod/fast; do
        for f in $(sed -n 's/^- //p' "$stages/$s/kustomization.yaml"); do
            echo "---"
            cat "$stages/$s/$f"
        done
    done > "$cache.tmp/kwok-stages.yaml"
    echo "$k8s built in $(( $(date +%s) - started )) s" > "$cache.tmp/complete"
    rm -rf "$cache"
    mv "$cache.tmp" "$cache"
fi

mkdir -p "$out"
for t in $tools; do
    ln -sfn "$cache/$t" "$out/$t"
done
cat "$cache/complete"
