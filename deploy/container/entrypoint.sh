#!/bin/sh
# The ckptfs container's entrypoint (deploy/container/Containerfile, deploy/kubernetes/
# daemonset.yaml): one daemon, in the foreground, mounting CKPTFS_MOUNT with the config at
# CKPTFS_CONFIG. exec: the daemon is the container's main process, so the SIGTERM that
# Kubernetes sends at pod deletion reaches it directly; it commits open files, unmounts and
# exits 0 (docs/kubernetes.md). Extra arguments are passed to `ckptfs mount`.
set -eu
mountpoint="${CKPTFS_MOUNT:-/ckpt}"
config="${CKPTFS_CONFIG:-/etc/ckptfs/config.toml}"
ckptfs="${CKPTFS_BIN:-ckptfs}"
if [ ! -r "$config" ]; then
    echo "ckptfs-entrypoint: no config at $config (mount the ConfigMap there, or set CKPTFS_CONFIG)" >&2
    exit 2
fi
# A mount left by a daemon that was killed is cleaned up by the daemon itself at start.
mkdir -p "$mountpoint"
exec "$ckptfs" mount "$mountpoint" --config "$config" --foreground "$@"
