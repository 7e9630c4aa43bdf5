#!/usr/bin/env bash
# Builds the venv of the offline infra checks (scripts/validate-infra.sh) from
# infra/ci/requirements.txt at
#   $TESSERA_CACHE/venv-infra-<hash>
# (hash of the requirements file and the Python version). Kept apart from the test venv:
# checkov alone pulls in about 90 packages. Idempotent; prints the venv path as the last line
# on stdout.
set -euo pipefail
# shellcheck source=scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

req="$TESSERA_ROOT/infra/ci/requirements.txt"
[[ -f "$req" ]] || die "missing $req"

py="$(tessera_python)"
pyver="$("$py" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
hash="$( { cat "$req"; printf 'python=%s\n' "$pyver"; } | sha256sum | cut -c1-16)"
venv="$TESSERA_CACHE/venv-infra-$hash"
stamp="$venv/.tessera-complete"
take_lock python-infra

if [[ -f "$stamp" && -x "$venv/bin/python" ]] && "$venv/bin/python" -c '' 2>/dev/null; then
  printf '%s\n' "$venv"
  exit 0
fi

start=$(now_s)
[[ -e "$venv" ]] && { log "removing incomplete venv $venv"; rm -rf "$venv"; }
mkdir -p "$TESSERA_CACHE"
log "creating venv $venv (python $pyver)"
"$py" -m venv "$venv"
log "installing $(grep -cE '^[A-Za-z]' "$req") pinned packages (first time: ~50-90s)"
if ! "$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
    --only-binary=:all: -r "$req" >&2; then
  rm -rf "$venv"
  die "pip install -r $req failed"
fi
"$venv/bin/python" -c 'import helm_python, kubernetes_validate, yamllint, jsonschema, yaml' \
  || { rm -rf "$venv"; die "venv $venv failed its import check"; }
for tool in checkov hadolint yamllint kubernetes-validate; do
  [[ -x "$venv/bin/$tool" ]] || { rm -rf "$venv"; die "venv $venv lacks $tool"; }
done
touch "$stamp"
log "venv ready in $(( $(now_s) - start ))s"
printf '%s\n' "$venv"
