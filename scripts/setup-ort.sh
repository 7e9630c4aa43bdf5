#!/usr/bin/env bash
# Puts ONNX Runtime's shared library (from the pinned PyPI wheel) at
#   $TESSERA_CACHE/onnxruntime/1.31.1/libonnxruntime.so.1.31.1
# where the tessera binary looks for it (ORT_DYLIB_PATH overrides).
# Idempotent; prints the library path as the last line on stdout.
set -euo pipefail
# shellcheck source=scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

lib="$TESSERA_ORT_LIB"
take_lock ort
if [[ -s "$lib" ]]; then
  printf '%s\n' "$lib"
  exit 0
fi

start=$(now_s)
log "fetching onnxruntime==$TESSERA_ORT_VERSION wheel from PyPI"
dest_dir="$(dirname "$lib")"
mkdir -p "$dest_dir"
tmp="$(mktemp -d "$dest_dir/.tmp.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT

py="$(tessera_python)"
"$py" -m pip download --quiet --no-deps --only-binary=:all: \
  --python-version 3.11 --implementation cp --abi cp311 \
  --platform manylinux_2_28_x86_64 \
  -d "$tmp/wheel" "onnxruntime==$TESSERA_ORT_VERSION" >&2

shopt -s nullglob
wheels=("$tmp/wheel/onnxruntime-$TESSERA_ORT_VERSION-"*.whl)
shopt -u nullglob
[[ ${#wheels[@]} -eq 1 ]] || die "expected one onnxruntime wheel in $tmp/wheel, found ${#wheels[@]}"

member="onnxruntime/capi/libonnxruntime.so.$TESSERA_ORT_VERSION"
log "extracting $member"
unzip_to "${wheels[0]}" "$tmp/x" "$member"
[[ -s "$tmp/x/$member" ]] || die "$member missing from ${wheels[0]}"
chmod 0755 "$tmp/x/$member"
mv -f "$tmp/x/$member" "$lib"
log "onnxruntime $TESSERA_ORT_VERSION ready in $(( $(now_s) - start ))s"
printf '%s\n' "$lib"
