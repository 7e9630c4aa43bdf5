#!/usr/bin/env bash
# The console's tests: Vitest unit tests (formatting, data shaping), then browser tests —
# playwright-core driving Debian's chromium (installed here with apt-get when missing; needs
# root) against a real `tessera dev` that each run starts on free ports in a temporary data
# directory. Screenshots land in web/test-results/.
#
# Builds the console first (scripts/setup-web.sh). The tessera binary comes from $TESSERA_BIN,
# default $CARGO_TARGET_DIR/debug/tessera, built here when missing. Set TESSERA_WEB_UNIT_ONLY=1
# to run the unit tests alone. Extra arguments go to vitest (e.g. -t 'invoice').
set -euo pipefail
# shellcheck source=scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

"$TESSERA_ROOT/scripts/setup-web.sh" >/dev/null || die "scripts/setup-web.sh failed"
cd "$TESSERA_ROOT/web"
export npm_config_cache="$TESSERA_CACHE/npm"

log "console unit tests (vitest)"
npx vitest run --config vitest.config.ts

if [[ "${TESSERA_WEB_UNIT_ONLY:-}" == 1 ]]; then
  exit 0
fi

if ! command -v chromium >/dev/null 2>&1; then
  [[ "$(id -u)" == 0 ]] || die "chromium is missing and installing it needs root: apt-get install -y chromium"
  log "installing Debian's chromium"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >&2
  apt-get install -y -qq --no-install-recommends chromium fonts-dejavu-core >&2
fi
export CHROMIUM="${CHROMIUM:-$(command -v chromium)}"

export TESSERA_BIN="${TESSERA_BIN:-$CARGO_TARGET_DIR/debug/tessera}"
if [[ ! -x "$TESSERA_BIN" ]]; then
  log "building tessera (debug)"
  (cd "$TESSERA_ROOT" && cargo build --bin tessera)
fi
if [[ -z "${ORT_DYLIB_PATH:-}" ]]; then
  ORT_DYLIB_PATH="$("$TESSERA_ROOT/scripts/setup-ort.sh" | tail -n1)" || die "scripts/setup-ort.sh failed"
fi
export ORT_DYLIB_PATH

rm -rf test-results
log "console browser tests (playwright-core + chromium, tessera dev from $TESSERA_BIN)"
npx vitest run --config vitest.browser.config.ts "$@"
log "screenshots: $TESSERA_ROOT/web/test-results/"
