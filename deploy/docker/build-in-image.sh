#!/usr/bin/env bash
# The one build both images run (Dockerfile, Dockerfile.cuda) and CI runs too
# (tests/deploy: image_layout_test), so what the chart starts is what CI built and checked.
#
#   deploy/docker/build-in-image.sh [--prefix DIR] [--skip-setup] [--skip-build]
#
#   1. tools/setup                         (unless --skip-setup: the dependencies)
#   2. tools/build <the service targets>   (unless --skip-build) into $BUILD_DIR (default build/)
#   3. stage the image layout under --prefix (default /opt/kvmesh):
#        bin/kvmesh bin/kvmesh-scheduler bin/kvmesh-router
#        bin/kvmesh-prefill-worker bin/kvmesh-decode-worker bin/kvmesh-kv-store
#        models/tiny-llama/                the embedded tiny model (the CPU profile serves it)
#        share/runtime-packages.txt        the Debian packages owning every shared library the
#                                          binaries load: the runtime stage installs exactly these
#        lib/                              the CUDA toolkit's libraries they load (cudart, cuBLAS,
#                                          NCCL: no Debian package), empty in a CPU build
# Environment: BUILD_DIR, KVMESH_CUDA (AUTO|ON|OFF), CMAKE_BUILD_TYPE (tools/build's).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
prefix=/opt/kvmesh
setup=1 build=1
while (($#)); do
  case "$1" in
    --prefix) prefix=$2; shift 2 ;;
    --prefix=*) prefix=${1#--prefix=}; shift ;;
    --skip-setup) setup=0; shift ;;
    --skip-build) build=0; shift ;;
    -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
    *) echo "build-in-image.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
build_dir=${BUILD_DIR:-$root/build}
BINARIES=(
  services/kvmesh/kvmesh
  services/scheduler/kvmesh-scheduler
  services/router/kvmesh-router
  services/prefill_worker/kvmesh-prefill-worker
  services/decode_worker/kvmesh-decode-worker
  services/kv_store/kvmesh-kv-store
)

if ((setup)); then "$root/tools/setup"; fi
if ((build)); then
  BUILD_DIR=$build_dir CMAKE_BUILD_TYPE=${CMAKE_BUILD_TYPE:-Release} "$root/tools/build" \
    kvmesh kvmesh-scheduler kvmesh-router kvmesh-prefill-worker kvmesh-decode-worker kvmesh-kv-store tiny_model
fi

rm -rf "$prefix/lib"
mkdir -p "$prefix/bin" "$prefix/models" "$prefix/share" "$prefix/lib"
for b in "${BINARIES[@]}"; do
  [ -x "$build_dir/$b" ] || { echo "build-in-image.sh: $build_dir/$b is not built" >&2; exit 1; }
  install -m 0755 "$build_dir/$b" "$prefix/bin/$(basename "$b")"
done
model=$build_dir/models/tiny-llama
[ -f "$model/config.json" ] || { echo "build-in-image.sh: $model is not built (tools/build tiny_model)" >&2; exit 1; }
rm -rf "$prefix/models/tiny-llama"
cp -r "$model" "$prefix/models/tiny-llama"

# The runtime stage's package list: every shared library the binaries load, by its owning
# Debian package; the CUDA toolkit's libraries are copied instead, and libcuda comes from
# the host's driver (the NVIDIA container runtime mounts it).
libs=$(for b in "$prefix"/bin/*; do ldd "$b"; done | awk '$2 == "=>" && $3 ~ /^\// {print $3}' | sort -u)
missing=$(for b in "$prefix"/bin/*; do ldd "$b"; done | awk '/not found/ {print $1}' | sort -u | grep -v '^libcuda\.so' || true)
if [ -n "$missing" ]; then echo "build-in-image.sh: unresolved libraries: $missing" >&2; exit 1; fi
packages=()
for lib in $libs; do
  real=$(readlink -f "$lib")
  case "$real" in
    */libcuda.so*|*/libnvidia*) continue ;;
    /usr/local/cuda*|*/libnccl*|*/libcudart*|*/libcublas*) cp -L "$lib" "$prefix/lib/$(basename "$lib")"; continue ;;
  esac
  owner=$(dpkg -S "$lib" 2>/dev/null || dpkg -S "$real" 2>/dev/null || dpkg -S "${lib#/usr}" 2>/dev/null || true)
  owner=${owner%%:*}
  [ -n "$owner" ] || { echo "build-in-image.sh: no Debian package owns $lib" >&2; exit 1; }
  packages+=("$owner")
done
printf '%s\n' "${packages[@]}" | sort -u > "$prefix/share/runtime-packages.txt"
echo "build-in-image.sh: staged $(ls "$prefix/bin" | wc -l) binaries, the tiny model and" \
  "$(wc -l < "$prefix/share/runtime-packages.txt") runtime packages under $prefix"
