#!/usr/bin/env bash
# Fuzzes Tessera's parsers: the cargo-fuzz targets in fuzz/ (libFuzzer, nightly Rust).
#
#   scripts/fuzz.sh [SECONDS_PER_TARGET]   build, then run every target that long (default 60)
#   scripts/fuzz.sh --replay               replay fuzz/seeds and fuzz/regressions through the
#                                          same target code on stable Rust (what CI runs)
#   FUZZ_TARGETS="onnx tokens" scripts/fuzz.sh 30    only these targets
#   FUZZ_SANITIZER=address scripts/fuzz.sh           build with AddressSanitizer (default: none:
#                                                    the parsers are safe Rust, where a bad index
#                                                    panics anyway, and ASan halves the speed)
#   FUZZ_PROFILE=dev scripts/fuzz.sh 20              unoptimized build: about twice as fast to
#                                                    build, several times slower to fuzz
#
# Installs what it needs under $TESSERA_CACHE: a nightly toolchain (rustup) and cargo-fuzz
# (cargo install --root $TESSERA_CACHE/cargo-fuzz). Builds in $TESSERA_CACHE/fuzz-target (the
# sanitizer coverage flags rebuild every dependency, so it is kept apart from the main target
# directory). Each target's corpus grows in $TESSERA_CACHE/fuzz-corpus/<target>, starting from
# fuzz/seeds/<target> and fuzz/regressions/<target>. An input that crashes a target is copied to
# fuzz/regressions/<target>/, where `cargo test` replays it from then on.
#
# Prints a table: target, executions, seconds, coverage (edges), features, corpus, crashes.
# Exits 1 when a target crashed (or did not build), 0 otherwise.
set -euo pipefail
# shellcheck source=scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

CARGO_FUZZ_VERSION=0.13.2
FUZZ_ROOT="$TESSERA_CACHE/cargo-fuzz"
FUZZ_TARGET_DIR="${FUZZ_TARGET_DIR:-$TESSERA_CACHE/fuzz-target}"
CORPUS_ROOT="$TESSERA_CACHE/fuzz-corpus"

say() {
  printf '[fuzz] %s\n' "$*" >&2
}

# The targets to run: $FUZZ_TARGETS, else every [[bin]] in fuzz/Cargo.toml.
targets() {
  if [[ -n "${FUZZ_TARGETS:-}" ]]; then
    printf '%s\n' $FUZZ_TARGETS
  else
    sed -n 's/^name = "\([a-z_]*\)"$/\1/p' "$TESSERA_ROOT/fuzz/Cargo.toml" | grep -v '^tessera-fuzz$'
  fi
}

ensure_tools() {
  if ! rustup run nightly rustc --version >/dev/null 2>&1; then
    say "installing the nightly toolchain (rustup)"
    rustup toolchain install nightly --profile minimal >&2
  fi
  if [[ ! -x "$FUZZ_ROOT/bin/cargo-fuzz" ]]; then
    take_lock cargo-fuzz
    if [[ ! -x "$FUZZ_ROOT/bin/cargo-fuzz" ]]; then
      say "installing cargo-fuzz $CARGO_FUZZ_VERSION into $FUZZ_ROOT"
      cargo install cargo-fuzz --version "$CARGO_FUZZ_VERSION" --locked --root "$FUZZ_ROOT" >&2
    fi
  fi
  export PATH="$FUZZ_ROOT/bin:$PATH"
}

# cargo fuzz with the shared flags: optimized (unless FUZZ_PROFILE=dev) with debug assertions,
# so integer overflow panics.
cargo_fuzz() {
  local cmd="$1" profile=--release
  shift
  [[ "${FUZZ_PROFILE:-release}" == dev ]] && profile=--dev
  CARGO_TARGET_DIR="$FUZZ_TARGET_DIR" cargo +nightly fuzz "$cmd" "$profile" --debug-assertions \
    --sanitizer "${FUZZ_SANITIZER:-none}" "$@"
}

# run_target NAME SECONDS: fuzzes NAME; prints its table row; returns 1 on a crash.
run_target() {
  local name="$1" seconds="$2" corpus="$CORPUS_ROOT/$1" artifacts log rc=0 dirs=()
  artifacts="$(mktemp -d "${TMPDIR:-/tmp}/tessera-fuzz-$name.XXXXXX")"
  log="$artifacts/log"
  mkdir -p "$corpus"
  for d in "fuzz/seeds/$name" "fuzz/regressions/$name"; do
    [[ -d "$d" ]] && dirs+=("$d")
  done
  cargo_fuzz run "$name" "$corpus" "${dirs[@]}" -- -max_total_time="$seconds" -timeout=10 \
    -rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix="$artifacts/" </dev/null >"$log" 2>&1 || rc=$?
  local crashes=0 f
  for f in "$artifacts"/crash-* "$artifacts"/timeout-* "$artifacts"/oom-* "$artifacts"/slow-unit-*; do
    [[ -f "$f" ]] || continue
    mkdir -p "fuzz/regressions/$name"
    cp "$f" "fuzz/regressions/$name/"
    say "$name: $(basename "$f") saved to fuzz/regressions/$name/"
    crashes=$((crashes + 1))
  done
  if ((rc != 0 && crashes == 0)); then
    say "$name: cargo fuzz failed (exit $rc) without a crash input; the end of its log:"
    tail -n 30 "$log" >&2
    crashes="failed"
  elif ((crashes > 0)); then
    grep -m1 -A12 -E "panicked at|ERROR: libFuzzer|Sanitizer" "$log" >&2 || tail -n 30 "$log" >&2
  fi
  local execs status cov ft corp
  execs="$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n1)"
  status="$(grep -E '^#[0-9]+.*cov: ' "$log" | tail -n1 || true)"
  cov="$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<<"$status")"
  ft="$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<<"$status")"
  corp="$(find "$corpus" -type f | wc -l)"
  printf '%-20s %12s %8s %8s %9s %8s %8s\n' "$name" "${execs:--}" "$seconds" "${cov:--}" "${ft:--}" "$corp" "$crashes"
  rm -rf "$artifacts"
  [[ "$crashes" == 0 ]]
}

main() {
  cd "$TESSERA_ROOT"
  if [[ "${1:-}" == "--replay" ]]; then
    say "replaying fuzz/seeds and fuzz/regressions on stable (cargo test --test e2e fuzz::)"
    exec cargo test --test e2e fuzz::
  fi
  local seconds="${1:-60}" failed=0 name start
  [[ "$seconds" =~ ^[0-9]+$ ]] || die "usage: scripts/fuzz.sh [SECONDS_PER_TARGET | --replay]"
  ensure_tools
  start=$(now_s)
  say "building the fuzz targets in $FUZZ_TARGET_DIR (${FUZZ_PROFILE:-release}, sanitizer ${FUZZ_SANITIZER:-none})"
  cargo_fuzz build >&2 || die "the fuzz targets did not build"
  say "built in $(( $(now_s) - start ))s; fuzzing each target for ${seconds}s"
  printf '%-20s %12s %8s %8s %9s %8s %8s\n' target executions seconds coverage features corpus crashes
  while read -r name; do
    run_target "$name" "$seconds" || failed=1
  done < <(targets)
  if ((failed)); then
    say "a target crashed or failed: inputs saved under fuzz/regressions/; fix, then cargo test replays them"
    exit 1
  fi
}

main "$@"
