#!/usr/bin/env bash
# Runs Tessera for development: for now the standalone Triton-compatible
# server on the example models (HTTP :8000, gRPC :8001, metrics :8002).
# Extra arguments go to `tessera serve`.
set -euo pipefail
# shellcheck source=scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$TESSERA_ROOT"
[[ -f tests/python/gen_models.py ]] || die "tests/python/gen_models.py not found (it writes the example models)"

if [[ -z "${ORT_DYLIB_PATH:-}" ]]; then
  ORT_DYLIB_PATH="$("$TESSERA_ROOT/scripts/setup-ort.sh" | tail -n1)" || die "scripts/setup-ort.sh failed"
fi
export ORT_DYLIB_PATH
VENV="$("$TESSERA_ROOT/scripts/setup-python.sh" | tail -n1)" || die "scripts/setup-python.sh failed"

log "building tessera (release)"
cargo build --release --bin tessera

# The example repository: add_sub, mlp and the identity_* models (gen_models.py
# also writes deliberately broken models for the tests; they stay out of here).
mapfile -t models < <("$VENV/bin/python" tests/python/gen_models.py .tessera/models --list \
  | grep -E '^(add_sub|mlp|identity_[A-Z0-9]+)$')
((${#models[@]})) || die "gen_models.py --list named none of add_sub, mlp, identity_*"
log "generating ${#models[@]} example models in .tessera/models"
"$VENV/bin/python" tests/python/gen_models.py .tessera/models --only "${models[@]}" >&2

log "starting: tessera serve --model-repository .tessera/models $*"
exec "$CARGO_TARGET_DIR/release/tessera" serve --model-repository .tessera/models "$@"
