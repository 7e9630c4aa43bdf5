#!/usr/bin/env bash
# Soak test: steady tritonclient load (HTTP and gRPC) against one worker for MINUTES (default
# 30), sampling the resident memory of the worker and its runner processes every 5 s; prints a
# table and fails when memory grows after warm-up by more than max(10 %, 32 MiB) (see
# tests/python_deploy/soak.py for the exact rule), or when a request fails.
#
#   scripts/soak.sh [MINUTES]
#
# Uses TESSERA_BIN (else the debug build in $CARGO_TARGET_DIR), DATABASE_URL (else a server on
# 127.0.0.1:5432, else a throwaway PostgreSQL cluster), ORT_DYLIB_PATH (else the pinned
# library) and the test venv (scripts/setup-python.sh). CI does not run it: too long. A 60 s
# version of the same check runs in tests/python_deploy/test_chaos.py.
set -euo pipefail
# shellcheck source=scripts/test.sh
source "$(dirname "${BASH_SOURCE[0]}")/test.sh"

minutes="${1:-30}"
[[ "$minutes" =~ ^[0-9]+$ && "$minutes" -ge 1 ]] || die "usage: scripts/soak.sh [MINUTES] (a whole number >= 1)"

cd "$TESSERA_ROOT"
TESSERA_BIN="${TESSERA_BIN:-$CARGO_TARGET_DIR/debug/tessera}"
[[ -x "$TESSERA_BIN" ]] || die "no tessera binary at $TESSERA_BIN (cargo build, or set TESSERA_BIN)"
if [[ -z "${ORT_DYLIB_PATH:-}" ]]; then
  ORT_DYLIB_PATH="$("$TESSERA_ROOT/scripts/setup-ort.sh" | tail -n1)" || die "scripts/setup-ort.sh failed"
fi
if [[ -z "${VENV:-}" ]]; then
  VENV="$("$TESSERA_ROOT/scripts/setup-python.sh" | tail -n1)" || die "scripts/setup-python.sh failed"
fi
pick_postgres
export TESSERA_BIN ORT_DYLIB_PATH
say "soak: $minutes min against $TESSERA_BIN"
"$VENV/bin/python" tests/python_deploy/soak.py --seconds "$((minutes * 60))"
