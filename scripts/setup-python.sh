#!/usr/bin/env bash
# Builds the test-suite venv from tests/python/requirements.txt at
#   $TESSERA_CACHE/venv-<hash>
# (hash of the requirements file and the Python version) and links ./.venv to
# it. Idempotent; prints the venv path as the last line on stdout.
set -euo pipefail
# shellcheck source=scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

req="$TESSERA_ROOT/tests/python/requirements.txt"
[[ -f "$req" ]] || die "missing $req"

py="$(tessera_python)"
pyver="$("$py" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
hash="$( { cat "$req"; printf 'python=%s\n' "$pyver"; } | sha256sum | cut -c1-16)"
venv="$TESSERA_CACHE/venv-$hash"
stamp="$venv/.tessera-complete"
take_lock python

link_venv() {
  local link="$TESSERA_ROOT/.venv"
  if [[ -L "$link" || ! -e "$link" ]]; then
    if [[ "$(readlink "$link" 2>/dev/null || true)" != "$venv" ]]; then
      ln -sfn "$venv" "$link"
    fi
  else
    warn "$link exists and is not a symlink; leaving it alone (venv is $venv)"
  fi
}

if [[ -f "$stamp" && -x "$venv/bin/python" ]] && "$venv/bin/python" -c '' 2>/dev/null; then
  link_venv
  printf '%s\n' "$venv"
  exit 0
fi

start=$(now_s)
if [[ -e "$venv" ]]; then
  log "removing incomplete venv $venv"
  rm -rf "$venv"
fi
mkdir -p "$TESSERA_CACHE"
log "creating venv $venv (python $pyver)"
"$py" -m venv "$venv"
log "installing $(grep -cE '^[A-Za-z]' "$req") pinned packages (first time: ~20-60s)"
if ! "$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
    --only-binary=:all: -r "$req" >&2; then
  rm -rf "$venv"
  die "pip install -r $req failed"
fi
"$venv/bin/python" -c 'import tritonclient.grpc, tritonclient.http, numpy, onnx, onnxruntime, pytest' \
  || { rm -rf "$venv"; die "venv $venv failed its import check"; }
touch "$stamp"
link_venv
log "venv ready in $(( $(now_s) - start ))s"
printf '%s\n' "$venv"
