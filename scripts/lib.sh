# shellcheck shell=bash disable=SC2034  # its variables are used by the scripts that source it
# Shared helpers for Tessera's scripts. Source it; do not run it.
#   source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
#
# Everything downloaded or built lives under $TESSERA_CACHE (default
# ~/.cache/tessera) so a fresh clone (CI) reuses earlier work.

if [[ -n "${TESSERA_LIB_SOURCED:-}" ]]; then
  return 0
fi
TESSERA_LIB_SOURCED=1

# Repository root: the parent of the scripts/ folder holding this file.
TESSERA_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export TESSERA_ROOT

export TESSERA_CACHE="${TESSERA_CACHE:-$HOME/.cache/tessera}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$TESSERA_CACHE/target}"

# Pinned versions (keep in step with Cargo.toml's `ort` api-N feature).
TESSERA_ORT_VERSION=1.31.1
TESSERA_ORT_LIB="$TESSERA_CACHE/onnxruntime/$TESSERA_ORT_VERSION/libonnxruntime.so.$TESSERA_ORT_VERSION"
# The GPU build (onnxruntime-gpu wheel): the library and its CUDA/TensorRT providers, side by side.
TESSERA_ORT_GPU_LIB="$TESSERA_CACHE/onnxruntime-gpu/$TESSERA_ORT_VERSION/libonnxruntime.so.$TESSERA_ORT_VERSION"
TESSERA_PERF_ANALYZER_VERSION=2.60.0
TESSERA_PERF_ANALYZER_WRAPPER="$TESSERA_CACHE/perf_analyzer/bin/perf_analyzer"

# Progress messages go to stderr, so stdout stays machine-readable.
log() {
  printf '[setup] %s\n' "$*" >&2
}

warn() {
  printf '[setup] WARNING: %s\n' "$*" >&2
}

die() {
  printf '[setup] ERROR: %s\n' "$*" >&2
  exit 1
}

# Python used to create venvs and run pip download (the system's, not a venv's).
tessera_python() {
  if [[ -n "${TESSERA_PYTHON:-}" ]]; then
    printf '%s\n' "$TESSERA_PYTHON"
  elif command -v python3.11 >/dev/null 2>&1; then
    command -v python3.11
  elif command -v python3 >/dev/null 2>&1; then
    command -v python3
  else
    die "python3 not found"
  fi
}

# Seconds since the epoch, for coarse timings.
now_s() {
  date +%s
}

# Serialise concurrent runs of one setup step: `take_lock NAME` holds
# $TESSERA_CACHE/.lock-NAME until the calling script exits.
take_lock() {
  mkdir -p "$TESSERA_CACHE"
  if command -v flock >/dev/null 2>&1; then
    exec 9>"$TESSERA_CACHE/.lock-$1"
    flock 9
  fi
}

# Extract members of a zip file (a wheel) into DIR, keeping the executable
# bit. Uses python's zipfile, so `unzip` need not be installed.
#   unzip_to ZIP DIR [MEMBER...]
unzip_to() {
  "$(tessera_python)" - "$@" <<'PY'
import os, sys, zipfile
zpath, out, *members = sys.argv[1:]
with zipfile.ZipFile(zpath) as z:
    infos = [z.getinfo(m) for m in members] if members else z.infolist()
    for info in infos:
        path = z.extract(info, out)
        mode = (info.external_attr >> 16) & 0o777
        if mode:
            os.chmod(path, mode)
PY
}
