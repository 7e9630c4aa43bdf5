#!/usr/bin/env bash
# Runs Tessera on this machine: `tessera dev`, i.e. the control plane (SQLite registry, local
# object store), one worker and a demo tenant with the demo model `simple` deployed, all in
# one process. It prints the demo keys and curl, tritonclient and CLI examples that run as
# printed from the repository root. State lives in ./.tessera; a restart keeps it.
# Extra arguments go to `tessera dev` (e.g. --listen 127.0.0.1:9090 --http-port 0).
set -euo pipefail
# shellcheck source=scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$TESSERA_ROOT"

if [[ -z "${ORT_DYLIB_PATH:-}" ]]; then
  ORT_DYLIB_PATH="$("$TESSERA_ROOT/scripts/setup-ort.sh" | tail -n1)" || die "scripts/setup-ort.sh failed"
fi
export ORT_DYLIB_PATH
# The venv (linked at ./.venv) runs the printed tritonclient example.
"$TESSERA_ROOT/scripts/setup-python.sh" >/dev/null || die "scripts/setup-python.sh failed"

# The web console (web/dist), served by the control plane at /.
"$TESSERA_ROOT/scripts/setup-web.sh" >/dev/null \
  || log "scripts/setup-web.sh failed: tessera dev runs without the web console"

log "building tessera (release)"
cargo build --release --bin tessera

log "starting: tessera dev $*"
exec "$CARGO_TARGET_DIR/release/tessera" dev "$@"
