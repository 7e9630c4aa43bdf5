#!/usr/bin/env bash
# Builds the control plane's test venv from tests/python_cp/requirements.txt at
#   $TESSERA_CACHE/venv-cp-<hash>
# (hash of the requirements file and the Python version). Idempotent; prints the
# venv path as the last line on stdout.
set -euo pipefail
# shellcheck source=scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

req="$TESSERA_ROOT/tests/python_cp/requirements.txt"
[[ -f "$req" ]] || die "missing $req"

py="$(tessera_python)"
pyver="$("$py" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
hash="$( { cat "$req"; printf 'python=%s\n' "$pyver"; } | sha256sum | cut -c1-16)"
venv="$TESSERA_CACHE/venv-cp-$hash"
stamp="$venv/.tessera-complete"
take_lock python-cp

if [[ -f "$stamp" && -x "$venv/bin/python" ]] && "$venv/bin/python" -c '' 2>/dev/null; then
  printf '%s\n' "$venv"
  exit 0
fi

start=$(now_s)
[[ -e "$venv" ]] && { log "removing incomplete venv $venv"; rm -rf "$venv"; }
mkdir -p "$TESSERA_CACHE"
log "creating venv $venv (python $pyver)"
"$py" -m venv "$venv"
log "installing $(grep -cE '^[A-Za-z]' "$req") pinned packages (first time: ~30-90s)"
if ! "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r "$req" >&2; then
  rm -rf "$venv"
  die "pip install -r $req failed"
fi
"$venv/bin/python" -c 'import openapi_python_client, schemathesis, moto, httpx, pytest' \
  || { rm -rf "$venv"; die "venv $venv failed its import check"; }
[[ -x "$venv/bin/schemathesis" && -x "$venv/bin/moto_server" ]] || { rm -rf "$venv"; die "venv $venv lacks its tools"; }
touch "$stamp"
log "venv ready in $(( $(now_s) - start ))s"
printf '%s\n' "$venv"
