#!/bin/sh
# pod.sh ROOTFS ROOT MOUNTS UID GID -- COMMAND [ARG...]
#
# Run COMMAND from a container image's root filesystem the way the kubelet's
# runtime runs a container with readOnlyRootFilesystem, runAsUser/runAsGroup
# (fsGroup as the supplementary group) and allowPrivilegeEscalation: false.
# Meant to run under `unshare --mount --propagation private --pid --fork`:
# every mount made here lives in that namespace and goes with it, and
# COMMAND is the namespace's PID 1, as in a pod.
#
#   ROOTFS  the image's root filesystem (`buildah mount`), left unchanged but
#           for the mount points the volumes need, which the runtime creates too
#   ROOT    an empty directory: ROOTFS is bound there read-only
#   MOUNTS  a file of lines "HOSTPATH CONTAINERPATH": volumes, bound read-only
#
# The network is the caller's (loopback).  /dev holds the devices a
# container runtime provides, /proc is the new PID namespace's.
set -eu
rootfs=$1 root=$2 mounts=$3 uid=$4 gid=$5
shift 5
[ "$1" = -- ] && shift

mount --bind "$rootfs" "$root"
while read -r src dst; do
    if [ -d "$src" ]; then mkdir -p "$rootfs$dst"; else [ -e "$rootfs$dst" ] || touch "$rootfs$dst"; fi
    mount -o bind,ro "$src" "$root$dst"
done <"$mounts"
mount -t proc -o nosuid,nodev,noexec proc "$root/proc"
mount -t tmpfs -o nosuid,mode=0755 dev "$root/dev"
for dev in null zero full random urandom tty; do
    touch "$root/dev/$dev"
    mount --bind "/dev/$dev" "$root/dev/$dev"
done
mount -o remount,bind,ro "$root"

exec setpriv --no-new-privs chroot --userspec="$uid:$gid" --groups="$gid" "$root" "$@"
