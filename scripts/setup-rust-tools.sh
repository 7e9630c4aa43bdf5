#!/usr/bin/env bash
# Installs the cargo subcommands the test script's dependency checks run, from the crates
# registry, at pinned versions, under
#   $TESSERA_CACHE/cargo-tools/<tool>-<version>/bin
# (built once, in a target directory of its own that is removed afterwards). Idempotent;
# prints the bin directory as the last line on stdout. Usage: setup-rust-tools.sh [TOOL...]
# (default: cargo-machete). Tools: cargo-machete, cargo-deny.
set -euo pipefail
# shellcheck source=scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

# Pinned: a new release may find new things and fail the build by surprise.
declare -A VERSIONS=([cargo-machete]=0.9.1 [cargo-deny]=0.20.2)

bin_dir="$TESSERA_CACHE/cargo-tools/bin"
mkdir -p "$bin_dir"
take_lock cargo-tools
for tool in "${@:-cargo-machete}"; do
  version="${VERSIONS[$tool]:-}"
  [[ -n "$version" ]] || die "no pinned version for $tool"
  root="$TESSERA_CACHE/cargo-tools/$tool-$version"
  if [[ ! -x "$root/bin/$tool" ]]; then
    start=$(now_s)
    log "installing $tool $version (first time: a few minutes)"
    build="$(mktemp -d "$TESSERA_CACHE/cargo-tools/build.XXXXXX")"
    if ! CARGO_TARGET_DIR="$build" cargo install --locked --quiet --root "$root" "$tool" --version "$version" >&2; then
      rm -rf "$build" "$root"
      die "cargo install $tool $version failed"
    fi
    rm -rf "$build"
    log "$tool $version installed in $(( $(now_s) - start ))s"
  fi
  ln -sf "$root/bin/$tool" "$bin_dir/$tool"
done
printf '%s\n' "$bin_dir"
