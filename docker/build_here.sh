#!/usr/bin/env bash
# Builds the training image without a Docker daemon and without pulling images: Debian's
# debootstrap makes the base root file system, buildah imports it under the name the Dockerfile's
# default BASE_IMAGE names (docker.io/library/debian:bookworm) and builds the Dockerfile
# (chroot isolation, vfs storage, the host's network). apt inside uses this machine's Debian
# sources, pip its pip configuration (indexes, local wheel folders, CA bundle).
#
#   sudo docker/build_here.sh [--cpu] [--tag NAME]
#
#   --cpu       the CPU-torch variant (torch==2.13.0+cpu, no nvcc; tag clustered-asr:cpu): small,
#               for CI-sized builds and machines without GPUs. Default: the CUDA image (tag
#               clustered-asr), torch's CUDA wheels from PyPI and attention_ext compiled by nvcc
#               for TORCH_CUDA_ARCH_LIST (several GB of downloads; long on few cores).
#   --tag NAME  the image's name
#
# Environment: BUILD_HERE_STORE (default /var/lib/clustered-asr-build) holds the storage, the
# base root file system and the pip cache; DEBIAN_MIRROR overrides the mirror read from
# /etc/apt/sources*; TORCH_CPU_INDEX_URL the index of the CPU torch (default PyTorch's; empty:
# pip's configured indexes and find-links). Needs root, debootstrap and buildah
# (apt-get install debootstrap buildah). Run images with podman, same storage:
#   podman --storage-driver vfs --root "$BUILD_HERE_STORE/storage" run ... clustered-asr ...
# (docker/check_image.sh runs the image's checks that way).
set -euo pipefail
cd "$(dirname "$0")/.."
source docker/here_storage.sh

variant=cuda
tag=""
while [ $# -gt 0 ]; do
  case "$1" in
    --cpu) variant=cpu ;;
    --tag) tag=${2:?"--tag needs a name"}; shift ;;
    *) echo "build_here.sh: unknown argument '$1' (--cpu, --tag NAME)" >&2; exit 2 ;;
  esac
  shift
done
[ -n "$tag" ] || { [ "$variant" = cpu ] && tag=clustered-asr:cpu || tag=clustered-asr; }
base=docker.io/library/debian:bookworm
[ "$(id -u)" = 0 ] || { echo "build_here.sh: run as root (debootstrap and buildah's chroot isolation need it)" >&2; exit 1; }
for tool in debootstrap buildah; do
  command -v "$tool" >/dev/null || { echo "build_here.sh: $tool is missing: apt-get install $tool" >&2; exit 1; }
done

now() { date +%s.%N; }
started=$(now)
step_started=$started
seconds_since() { awk -v start="$1" -v end="$(now)" 'BEGIN { printf "%.1f s", end - start }'; }
step_done() { echo "build_here.sh: $* ($(seconds_since "$step_started"))"; step_started=$(now); }
mkdir -p "$STORE"

# ---- 1. the base: Debian bookworm (minbase) from this machine's mirror, with its apt sources
if buildah $STORAGE_FLAGS inspect --type image "$base" >/dev/null 2>&1; then
  step_done "[1/3] base $base: already in $STORE/storage"
else
  host_sources=$(ls /etc/apt/sources.list.d/*.sources /etc/apt/sources.list 2>/dev/null \
                 | xargs grep -l -E 'debian\.org/debian/?( |$)' 2>/dev/null || true)
  mirror=${DEBIAN_MIRROR:-$(grep -h -o -E 'https?://[^ ]+/debian/?( |$)' $host_sources /dev/null | head -n 1 | tr -d ' ')}
  mirror=${mirror:-http://deb.debian.org/debian}
  rootfs="$STORE/rootfs"
  rm -rf "$rootfs"
  nice -n 19 ionice -c3 debootstrap --variant=minbase bookworm "$rootfs" "$mirror" > "$STORE/debootstrap.log" 2>&1 \
    || { tail -n 20 "$STORE/debootstrap.log" >&2; echo "build_here.sh: debootstrap failed; log: $STORE/debootstrap.log" >&2; exit 1; }
  # The host's Debian sources (updates and security too) replace debootstrap's one line.
  if [ -n "$host_sources" ]; then
    rm -f "$rootfs/etc/apt/sources.list"
    for file in $host_sources; do cp "$file" "$rootfs/etc/apt/sources.list.d/"; done
  fi
  rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/*.bin "$rootfs"/var/cache/apt/archives/*.deb
  container=$(buildah $STORAGE_FLAGS from scratch)
  tar -C "$rootfs" --numeric-owner -c . | tar -C "$(buildah $STORAGE_FLAGS mount "$container")" --numeric-owner -x
  buildah $STORAGE_FLAGS config --cmd bash "$container"
  buildah $STORAGE_FLAGS commit -q --rm "$container" "$base" >/dev/null
  rm -rf "$rootfs"
  step_done "[1/3] base $base: debootstrapped from $mirror and imported"
fi

# ---- 2. pip's configuration for the build: the host's indexes and find-links; local folders are
# mounted read-only at the same paths; the host's CA bundle at /etc/pip-host-ca.crt.
volumes=()
pip_conf="$STORE/pip-$variant.conf"   # one per variant: two builds may run at once
{
  echo "[global]"
  ca=${PIP_CERT:-${REQUESTS_CA_BUNDLE:-${SSL_CERT_FILE:-/etc/ssl/certs/ca-certificates.crt}}}
  if [ -f "$ca" ]; then echo "cert = /etc/pip-host-ca.crt"; volumes+=(-v "$ca:/etc/pip-host-ca.crt:ro"); fi
  for key in index-url extra-index-url find-links timeout default-timeout; do
    # A find-links folder may hold this machine's CPU torch (torch-2.13.0+cpu): pip takes it for
    # torch==2.13.0 (a local version matches), and the CUDA build would stop on a CPU torch.
    if [ "$variant" = cuda ] && [ "$key" = find-links ]; then continue; fi
    value=$(python3 -m pip config list 2>/dev/null | sed -n -E "s/^[^=]*\.$key='(.*)'$/\1/p" \
            | tr ' ' '\n' | sort -u | tr '\n' ' ')
    [ -n "${value// /}" ] || continue
    echo "$key = $value"
    for location in $value; do
      folder=${location#file://}
      # a local "simple" index links its files relative to its parent (../../files/...)
      [ "${folder%/simple}" != "$folder" ] && folder=${folder%/simple}
      if [ -d "$folder" ]; then volumes+=(-v "$folder:$folder:ro"); fi
    done
  done
} > "$pip_conf"
volumes+=(-v "$pip_conf:/etc/pip.conf:ro")

build_args=()
if [ "$variant" = cpu ]; then
  build_args=(--build-arg TORCH_SPEC=torch==2.13.0+cpu
              --build-arg "TORCH_INDEX_URL=${TORCH_CPU_INDEX_URL-https://download.pytorch.org/whl/cpu}"
              --build-arg CUDA_COMPILER=)
fi
step_done "[2/3] pip configuration for the build: $(grep -c = "$pip_conf") settings, ${#volumes[@]} mounts"

# ---- 3. the image
log="$STORE/build-$variant.log"
if ! nice -n 19 ionice -c3 buildah $STORAGE_FLAGS bud --isolation chroot --network host --pull=never \
       --layers=false "${volumes[@]}" ${build_args[@]+"${build_args[@]}"} -t "$tag" -f Dockerfile . > "$log" 2>&1; then
  tail -n 40 "$log" >&2
  echo "build_here.sh: the build failed; its whole output is in $log" >&2
  exit 1
fi
buildah $STORAGE_FLAGS rmi --prune >/dev/null 2>&1 || true   # the build stage's image
size=$(buildah $STORAGE_FLAGS images --format '{{.Size}}' "$tag" | head -n 1)
step_done "[3/3] image $tag built ($size; output in $log)"
echo "build_here.sh: done in $(seconds_since "$started")"
