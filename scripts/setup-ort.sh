#!/usr/bin/env bash
# Puts ONNX Runtime's shared library (from the pinned PyPI wheel) at
#   $TESSERA_CACHE/onnxruntime/1.31.1/libonnxruntime.so.1.31.1
# where the tessera binary looks for it (ORT_DYLIB_PATH overrides).
#
# With --gpu it installs the GPU build instead, from the onnxruntime-gpu wheel of the same
# version (about 256 MB to download), into
#   $TESSERA_CACHE/onnxruntime-gpu/1.31.1/
# with the CUDA and TensorRT execution providers beside the library (ONNX Runtime loads them
# from its own directory); point ORT_DYLIB_PATH at the path it prints. The providers need the
# CUDA 13 and cuDNN 9 libraries (give workers their directories with --cuda-library-dir), and
# TensorRT's needs libnvinfer.so.10. --gpu refuses to download on a machine without an NVIDIA
# GPU unless --force is given. TESSERA_ORT_GPU=1 in the environment picks --gpu by itself, only where a
# GPU is present (so scripts can opt in on GPU machines and stay on CPU elsewhere).
#
# Idempotent; prints the library path as the last line on stdout.
set -euo pipefail
# shellcheck source=scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

usage() {
  printf 'usage: %s [--gpu [--force]]\n' "$0" >&2
  exit 2
}

has_gpu() {
  [[ -e /dev/nvidiactl ]] || command -v nvidia-smi >/dev/null 2>&1
}

gpu=0
force=0
for arg in "$@"; do
  case "$arg" in
    --gpu) gpu=1 ;;
    --force) force=1 ;;
    *) usage ;;
  esac
done
if [[ $gpu -eq 0 && "${TESSERA_ORT_GPU:-0}" == 1 ]] && has_gpu; then
  log "TESSERA_ORT_GPU=1 and a GPU is present: installing the GPU build"
  gpu=1
fi
if [[ $gpu -eq 1 ]]; then
  package="onnxruntime-gpu"
  wheel_prefix="onnxruntime_gpu"
  lib="$TESSERA_ORT_GPU_LIB"
  # The library first: the providers load from its directory when a session asks for them.
  members=(
    "onnxruntime/capi/libonnxruntime.so.$TESSERA_ORT_VERSION"
    "onnxruntime/capi/libonnxruntime_providers_shared.so"
    "onnxruntime/capi/libonnxruntime_providers_cuda.so"
    "onnxruntime/capi/libonnxruntime_providers_tensorrt.so"
  )
else
  package="onnxruntime"
  wheel_prefix="onnxruntime"
  lib="$TESSERA_ORT_LIB"
  members=("onnxruntime/capi/libonnxruntime.so.$TESSERA_ORT_VERSION")
fi
dest_dir="$(dirname "$lib")"

take_lock "$([[ $gpu -eq 1 ]] && echo ort-gpu || echo ort)"
# The library is moved in last, so its presence means every provider is there too.
if [[ -s "$lib" ]]; then
  printf '%s\n' "$lib"
  exit 0
fi
if [[ $gpu -eq 1 && $force -eq 0 ]] && ! has_gpu; then
  die "--gpu: no NVIDIA GPU here (no /dev/nvidiactl, no nvidia-smi); the GPU build is a 256 MB download. Add --force to install it anyway"
fi

start=$(now_s)
log "fetching $package==$TESSERA_ORT_VERSION wheel from PyPI"
mkdir -p "$dest_dir"
tmp="$(mktemp -d "$dest_dir/.tmp.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT

py="$(tessera_python)"
"$py" -m pip download --quiet --no-deps --only-binary=:all: \
  --python-version 3.11 --implementation cp --abi cp311 \
  --platform manylinux_2_28_x86_64 \
  -d "$tmp/wheel" "$package==$TESSERA_ORT_VERSION" >&2

shopt -s nullglob
wheels=("$tmp/wheel/$wheel_prefix-$TESSERA_ORT_VERSION-"*.whl)
shopt -u nullglob
[[ ${#wheels[@]} -eq 1 ]] || die "expected one $package wheel in $tmp/wheel, found ${#wheels[@]}"

log "extracting ${members[*]}"
unzip_to "${wheels[0]}" "$tmp/x" "${members[@]}"
for member in "${members[@]}"; do
  [[ -s "$tmp/x/$member" ]] || die "$member missing from ${wheels[0]}"
  chmod 0755 "$tmp/x/$member"
done
# Providers first, the library last (see above).
for member in "${members[@]:1}"; do
  mv -f "$tmp/x/$member" "$dest_dir/"
done
mv -f "$tmp/x/${members[0]}" "$lib"
log "$package $TESSERA_ORT_VERSION ready in $(( $(now_s) - start ))s"
if [[ $gpu -eq 1 ]]; then
  log "set ORT_DYLIB_PATH=$lib; the CUDA provider needs CUDA 13 and cuDNN 9 libraries on LD_LIBRARY_PATH (workers: --cuda-library-dir)"
fi
printf '%s\n' "$lib"
