#!/usr/bin/env bash
# Builds the web console: `npm ci` in web/ (packages from the npm registry, versions from
# web/package-lock.json; npm's cache under $TESSERA_CACHE/npm), then `npm run build`, which
# regenerates the API types from openapi/openapi.json and type-checks against them, so a
# changed API fails here. Prints the built directory (web/dist) as the last line on stdout;
# `tessera control-plane --console-dir` and `tessera dev` serve it.
# Skips `npm ci` when node_modules matches the lockfile (TESSERA_WEB_CI=1 forces it).
set -euo pipefail
# shellcheck source=scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

web="$TESSERA_ROOT/web"
command -v npm >/dev/null 2>&1 || die "npm not found: install Node.js 20.19 or newer (e.g. apt-get install nodejs npm)"
export npm_config_cache="$TESSERA_CACHE/npm"
export npm_config_update_notifier=false npm_config_fund=false npm_config_audit=false

take_lock web
cd "$web"
stamp="node_modules/.tessera-lock.sha256"
want="$(sha256sum package-lock.json | cut -d' ' -f1)"
if [[ "${TESSERA_WEB_CI:-}" == 1 || ! -f "$stamp" || "$(cat "$stamp")" != "$want" ]]; then
  log "installing the console's npm packages (npm ci)"
  npm ci --no-audit --no-fund >&2
  printf '%s\n' "$want" >"$stamp"
fi
log "building the console (npm run build)"
npm run build >&2
[[ -s dist/index.html ]] || die "the build left no web/dist/index.html"
printf '%s\n' "$web/dist"
