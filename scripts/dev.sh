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

# Four steps; each says what it does on a first run, when it takes longest, and shows progress.
step() {
  log "step $1/4: $2"
}

step 1 "ONNX Runtime library (first run: the onnxruntime wheel from PyPI, ~20 s)"
if [[ -z "${ORT_DYLIB_PATH:-}" ]]; then
  ORT_DYLIB_PATH="$("$TESSERA_ROOT/scripts/setup-ort.sh" | tail -n1)" || die "scripts/setup-ort.sh failed"
fi
export ORT_DYLIB_PATH
# The venv (linked at ./.venv) runs the printed tritonclient example.
step 2 "Python venv for the printed tritonclient example (first run: ~40 pinned packages, 20-60 s)"
"$TESSERA_ROOT/scripts/setup-python.sh" >/dev/null || die "scripts/setup-python.sh failed"

# The web console (web/dist), served by the control plane at /.
step 3 "web console (first run: npm ci and a Vite build, ~1 min)"
"$TESSERA_ROOT/scripts/setup-web.sh" >/dev/null \
  || log "scripts/setup-web.sh failed: tessera dev runs without the web console"

binary="$CARGO_TARGET_DIR/release/tessera"
if [[ -x "$binary" ]]; then
  step 4 "building tessera (release; only what changed since the last build)"
else
  step 4 "building tessera (release) for the first time: about 470 crates, 15-20 min on 2 cores; cargo lists each as it compiles"
fi
start=$(now_s)
# Cargo draws its progress bar only on a terminal; elsewhere it prints one line per crate.
cargo build --release --bin tessera
log "build done in $(( $(now_s) - start ))s"

log "starting: tessera dev $*"
exec "$binary" dev "$@"
