#!/usr/bin/env bash
# Build the gpuguard container image from deploy/Dockerfile with buildah
# (`make image`), without Docker and without a registry when none is reachable.
#
#   deploy/image.sh IMAGE
#
# The Dockerfile's base images (FROM) come from local storage when present,
# else from their registry, else - for debian:bookworm and
# debian:bookworm-slim - are made here from Debian's archive with mmdebstrap,
# the way the official images are (debuerreotype: a minbase root filesystem;
# the slim one without documentation, manual pages and locales).  The script
# says which it did for each base.  Run as root.
#
# IMAGE_PULL_TIMEOUT (seconds, default 120) bounds each pull.
set -euo pipefail

image=${1:?usage: deploy/image.sh IMAGE}
cd "$(dirname "$0")/.."
dockerfile=deploy/Dockerfile
pull_timeout=${IMAGE_PULL_TIMEOUT:-120}

need() {
    command -v "$1" >/dev/null || { echo "image: $1 is not installed: run make deps-image" >&2; exit 1; }
}
[ "$(id -u)" = 0 ] || { echo "image: run as root (buildah and mmdebstrap need it here)" >&2; exit 1; }
need buildah
work=$(mktemp -d)
ctr=
trap 'rm -rf "$work"; [ -z "$ctr" ] || buildah rm "$ctr" >/dev/null' EXIT

# What debuerreotype-slimify leaves out of bookworm-slim, for every later install too.
slim_dpkgopts=(
    'path-exclude=/usr/share/doc/*' 'path-include=/usr/share/doc/*/copyright'
    'path-exclude=/usr/share/groff/*' 'path-exclude=/usr/share/info/*'
    'path-exclude=/usr/share/linda/*' 'path-exclude=/usr/share/lintian/overrides/*'
    'path-exclude=/usr/share/locale/*' 'path-include=/usr/share/locale/locale.alias'
    'path-exclude=/usr/share/man/*'
)

# make_base REF SUITE [slim]: REF made with mmdebstrap from SUITE, committed
# to local storage; its history names the command, which later runs report.
make_base() {
    local ref=$1 suite=$2 slim=${3:-} clean opts
    need mmdebstrap
    # The configuration debuerreotype writes into the official images: apt
    # keeps no package cache or translations, dpkg does not fsync.  With it
    # mmdebstrap's own clean-up no longer finds apt's caches: a hook removes them.
    clean='"rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"'
    printf '%s\n' "DPkg::Post-Invoke { $clean; };" "APT::Update::Post-Invoke { $clean; };" \
        'Dir::Cache::pkgcache "";' 'Dir::Cache::srcpkgcache "";' >"$work/docker-clean"
    echo 'Acquire::Languages "none";' >"$work/docker-no-languages"
    echo force-unsafe-io >"$work/docker-apt-speedup"
    opts=(--variant=minbase --mode=root --format=tar \
        --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr \
        --customize-hook="upload $work/docker-clean /etc/apt/apt.conf.d/docker-clean" \
        --customize-hook="upload $work/docker-no-languages /etc/apt/apt.conf.d/docker-no-languages" \
        --customize-hook="upload $work/docker-apt-speedup /etc/dpkg/dpkg.cfg.d/docker-apt-speedup" \
        --customize-hook='rm -f "$1"/var/cache/apt/*.bin')
    if [ -n "$slim" ]; then
        opts+=("${slim_dpkgopts[@]/#/--dpkgopt=}")
    fi
    echo "image: making $ref with mmdebstrap --variant=minbase${slim:+ (slim)} $suite"
    # An image has no device nodes: the runtime provides /dev.
    mmdebstrap --quiet "${opts[@]}" "$suite" - | mmtarfilter --path-exclude='/dev/*' >"$work/rootfs.tar"
    ctr=$(buildah from scratch)
    buildah add --quiet "$ctr" "$work/rootfs.tar" / >/dev/null
    buildah config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
        --cmd bash --created-by "mmdebstrap --variant=minbase${slim:+ (slim)} $suite" "$ctr"
    buildah commit --quiet --rm "$ctr" "$ref" >/dev/null
    ctr=
}

# The base images: every FROM that is not an earlier stage's name.
bases=$(awk 'toupper($1) == "FROM" { if (!($2 in stage)) print $2; if (NF >= 4) stage[$4] = 1 }' \
    "$dockerfile")
for base in $bases; do
    case $base in
        */*) ref=$base ;;
        *) ref=docker.io/library/$base ;;
    esac
    if buildah inspect --type image "$ref" >/dev/null 2>&1; then
        origin=$(buildah inspect --type image --format '{{range .History}}{{.CreatedBy}}{{end}}' \
            "$ref" | grep -o 'mmdebstrap.*' || true)
        echo "image: base $base: in local storage${origin:+ (made by $origin)}"
        continue
    fi
    if err=$(timeout "$pull_timeout" buildah pull --quiet "$ref" 2>&1 >/dev/null); then
        echo "image: base $base: pulled $ref"
        continue
    elif [ $? = 124 ]; then
        err="no answer in $pull_timeout s"
    fi
    echo "image: base $base: pull failed ($(printf '%s\n' "$err" | tail -n 1))"
    case $base in
        debian:bookworm) make_base "$ref" bookworm ;;
        debian:bookworm-slim) make_base "$ref" bookworm slim ;;
        *) echo "image: cannot make $base locally: make it pullable" >&2; exit 1 ;;
    esac
    echo "image: base $base: made with mmdebstrap from Debian's archive"
done

# chroot isolation: no container runtime or user namespaces needed.  Layers
# are cached, so a rebuild only redoes the steps after a changed input.
buildah bud --isolation chroot --pull=never --layers \
    --ignorefile deploy/Dockerfile.dockerignore -f "$dockerfile" -t "$image" .
echo "image: built $image ($(buildah images --noheading --format '{{.ID}}, {{.Size}}' "$image" | tr -s ' '))"
