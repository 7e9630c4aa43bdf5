#!/usr/bin/env bash
# Tessera's whole test suite: the one command README and .ci/run use.
#
#   1. set-up: ONNX Runtime library, Python venv, perf_analyzer (optional)
#   2. Rust: cargo fmt --check, clippy -D warnings, unused dependencies (cargo machete),
#      licences, bans and sources of dependencies (cargo deny), build, cargo test, fuzz replay
#   3. Infra: the Helm chart, Dockerfile, KServe runtime, dashboard and alerts, checked offline
#   4. Python: generate test models, pytest tests/python against the binary
#
# Arguments are passed to pytest (e.g. ./scripts/test.sh -k health -x).
#
# Exits non-zero if any stage fails. Lint and test stages all run even when an
# earlier one failed (so one run shows every problem); a failed set-up or
# build stops the run. Stage messages go to stderr prefixed [test].
set -euo pipefail
# shellcheck source=scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

FAILED=()
CLEANUPS=()

say() {
  printf '[test] %s\n' "$*" >&2
}

cleanup() {
  local i
  for ((i = ${#CLEANUPS[@]} - 1; i >= 0; i--)); do
    eval "${CLEANUPS[i]}" || true
  done
}
trap cleanup EXIT

# run_stage NAME CMD...: runs CMD, timing it; records NAME as failed on error.
run_stage() {
  local name="$1" start rc=0
  shift
  say "== $name: $*"
  start=$(now_s)
  "$@" || rc=$?
  if ((rc == 0)); then
    say "== $name: ok ($(( $(now_s) - start ))s)"
  else
    say "== $name: FAILED (exit $rc, $(( $(now_s) - start ))s)"
    FAILED+=("$name")
  fi
  return "$rc"
}

# run_machete: dependencies no code uses, in every manifest of the tree (cargo machete reads
# the sources; it builds nothing). scripts/setup-rust-tools.sh installs it the first time.
run_machete() {
  local bin
  bin="$("$TESSERA_ROOT/scripts/setup-rust-tools.sh" cargo-machete | tail -n1)" || return 1
  "$bin/cargo-machete" "$TESSERA_ROOT"
}

# run_deny: the dependency graph's licences, duplicate versions (warnings) and sources
# (crates.io only), as deny.toml says. Advisories are left out: their database is a git
# repository on GitHub, which this script cannot count on reaching (see deny.toml).
run_deny() {
  local bin
  bin="$("$TESSERA_ROOT/scripts/setup-rust-tools.sh" cargo-deny | tail -n1)" || return 1
  "$bin/cargo-deny" --manifest-path "$TESSERA_ROOT/Cargo.toml" check licenses bans sources
}

# ---------------------------------------------------------------------------
# ensure_postgres: a throwaway PostgreSQL 15 cluster for tests that need one.
# Called by pick_postgres when nothing answers on 127.0.0.1:5432; it exports
# DATABASE_URL (an existing DATABASE_URL is kept as is) and stops the cluster
# when this script exits.
# ---------------------------------------------------------------------------
ensure_postgres() {
  if [[ -n "${DATABASE_URL:-}" ]]; then
    say "using DATABASE_URL from the environment"
    return 0
  fi
  local pgbin=/usr/lib/postgresql/15/bin dir port
  [[ -x "$pgbin/initdb" ]] || die "PostgreSQL 15 not found in $pgbin (apt-get install postgresql-15)"
  id postgres >/dev/null 2>&1 || die "no 'postgres' user to run initdb as"
  dir="$(mktemp -d /tmp/tessera-pg.XXXXXX)"
  chown postgres: "$dir"
  port="$("$(tessera_python)" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
  say "starting throwaway PostgreSQL on 127.0.0.1:$port (data in $dir)"
  runuser -u postgres -- "$pgbin/initdb" -D "$dir/data" --auth=trust -U postgres \
    -E UTF8 --no-sync >"$dir/initdb.log" 2>&1 \
    || { cat "$dir/initdb.log" >&2; die "initdb failed"; }
  runuser -u postgres -- "$pgbin/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 30 \
    -o "-c fsync=off -c listen_addresses=127.0.0.1 -p $port -k $dir" start >/dev/null \
    || { cat "$dir/server.log" >&2; die "pg_ctl start failed"; }
  CLEANUPS+=("runuser -u postgres -- '$pgbin/pg_ctl' -D '$dir/data' -m immediate stop >/dev/null 2>&1; rm -rf '$dir'")
  export DATABASE_URL="postgres://postgres@127.0.0.1:$port/postgres"
}

# pick_postgres: the control-plane tests need an admin URL in DATABASE_URL (each
# test creates and drops its own database there). Use the one given, else a
# server already on 127.0.0.1:5432, else a throwaway cluster.
pick_postgres() {
  if [[ -n "${DATABASE_URL:-}" ]]; then
    say "using DATABASE_URL from the environment"
  elif (exec 3<>/dev/tcp/127.0.0.1/5432) 2>/dev/null; then
    export DATABASE_URL="postgres://postgres@127.0.0.1:5432/postgres"
    say "using the PostgreSQL on 127.0.0.1:5432"
  else
    ensure_postgres
  fi
}

has_python_tests() {
  [[ -n "$(find "$TESSERA_ROOT/tests/python" \( -name 'test_*.py' -o -name '*_test.py' \) \
    -not -path '*/.models/*' -print -quit 2>/dev/null)" ]]
}

run_pytest() {
  local rc=0
  env TESSERA_BIN="$TESSERA_BIN" ORT_DYLIB_PATH="$ORT_DYLIB_PATH" \
    "$VENV/bin/python" -m pytest tests/python -q -p no:cacheprovider "$@" || rc=$?
  if ((rc == 5)); then
    if has_python_tests; then
      say "pytest collected no tests, but tests/python has test files"
      return 5
    fi
    say "tests/python has no test files yet (pytest exit 5 accepted)"
    return 0
  fi
  return "$rc"
}

main() {
  cd "$TESSERA_ROOT"
  local start
  start=$(now_s)
  say "repo $TESSERA_ROOT, cache $TESSERA_CACHE, target $CARGO_TARGET_DIR"

  # The control plane's registry and end-to-end tests run on Postgres.
  pick_postgres

  # --- set-up ---------------------------------------------------------------
  # ORT_DYLIB_PATH from the environment overrides the pinned library.
  if [[ -z "${ORT_DYLIB_PATH:-}" ]]; then
    ORT_DYLIB_PATH="$("$TESSERA_ROOT/scripts/setup-ort.sh" | tail -n1)" \
      || die "scripts/setup-ort.sh failed"
  fi
  [[ -f "$ORT_DYLIB_PATH" ]] || die "ONNX Runtime library not found at $ORT_DYLIB_PATH"
  export ORT_DYLIB_PATH
  VENV="$("$TESSERA_ROOT/scripts/setup-python.sh" | tail -n1)" \
    || die "scripts/setup-python.sh failed"
  [[ -x "$VENV/bin/python" ]] || die "venv not usable at $VENV"
  export VENV

  local pa=""
  if [[ -n "${PERF_ANALYZER:-}" && -x "${PERF_ANALYZER}" ]]; then
    say "PERF_ANALYZER=$PERF_ANALYZER (from the environment)"
  elif pa="$("$TESSERA_ROOT/scripts/setup-perf-analyzer.sh" | tail -n1)" && [[ -x "$pa" ]]; then
    export PERF_ANALYZER="$pa"
    say "PERF_ANALYZER=$PERF_ANALYZER"
  else
    unset PERF_ANALYZER
    say "!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!"
    say "!!! WARNING: scripts/setup-perf-analyzer.sh FAILED; PERF_ANALYZER is unset."
    say "!!! Tests that need perf_analyzer will be skipped. See the errors above."
    say "!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!"
  fi

  # --- Rust -------------------------------------------------------------------
  run_stage "cargo fmt" cargo fmt --all --check || true
  run_stage "cargo clippy" cargo clippy --workspace --all-targets -- -D warnings || true
  run_stage "cargo machete" run_machete || true
  run_stage "cargo deny" run_deny || true
  if ! run_stage "cargo build" cargo build --workspace --bins; then
    say "build failed; skipping tests. FAILED stages: ${FAILED[*]}"
    exit 1
  fi
  export TESSERA_BIN="$CARGO_TARGET_DIR/debug/tessera"
  [[ -x "$TESSERA_BIN" ]] || die "built binary missing: $TESSERA_BIN"
  run_stage "cargo test" cargo test --workspace || true
  # The same serve tests with the models in a runner process (the worker's process model): the
  # answers, errors, statistics and metrics must not change. The nice-value test looks at the
  # server's own threads, which hold no instances then.
  run_stage "cargo test (serve --runner)" env TESSERA_RUNNER=true cargo test --test e2e serve:: -- \
    --skip instance_and_intra_op_threads_take_the_configured_nice_value || true

  # The fuzz targets' seeds and regression inputs on stable (cargo test ran them too; this stage
  # names them). Fuzzing itself is scripts/fuzz.sh: its build takes too long for CI (README).
  run_stage "fuzz replay" "$TESSERA_ROOT/scripts/fuzz.sh" --replay || true

  # --- Infra: the Helm chart, images, KServe runtime, dashboard and alerts, offline --------
  # Renders and validates the chart, scans it, and checks the dashboard's and the alerts'
  # metric names against a live control plane, worker and serve (scripts/validate-infra.sh).
  run_stage "infra" env TESSERA_BIN="$TESSERA_BIN" ORT_DYLIB_PATH="$ORT_DYLIB_PATH" \
    "$TESSERA_ROOT/scripts/validate-infra.sh" || true

  # --- Python -----------------------------------------------------------------
  if [[ -f tests/python/gen_models.py ]]; then
    run_stage "gen models" "$VENV/bin/python" tests/python/gen_models.py tests/python/.models --verify || true
    export TESSERA_TEST_MODELS="$TESSERA_ROOT/tests/python/.models"
  fi
  run_stage "pytest" run_pytest "$@" || true

  # The control plane's Python venv (generated client, schemathesis, moto): its moto_server
  # is also the object store of the cluster rehearsal in the deployments suite.
  local cp_venv="" moto=""
  if cp_venv="$("$TESSERA_ROOT/scripts/setup-python-cp.sh" | tail -n1)" && [[ -x "$cp_venv/bin/python" ]]; then
    moto="$cp_venv/bin/moto_server"
  else
    say "scripts/setup-python-cp.sh failed"
    FAILED+=("setup python_cp")
    cp_venv=""
  fi

  # --- Deployments: control plane + worker processes on Postgres, tritonclient -------
  # (test_cluster_rehearsal.py runs scripts/cluster.sh: two control planes, S3, three workers)
  run_stage "pytest deployments" env TESSERA_BIN="$TESSERA_BIN" ORT_DYLIB_PATH="$ORT_DYLIB_PATH" \
    MOTO_SERVER="$moto" "$VENV/bin/python" -m pytest tests/python_deploy -q -p no:cacheprovider || true

  # --- Web console: vitest, then Playwright (chromium) against a real tessera dev -----
  run_stage "web console" env TESSERA_BIN="$TESSERA_BIN" ORT_DYLIB_PATH="$ORT_DYLIB_PATH" \
    "$TESSERA_ROOT/scripts/test-web.sh" || true

  # --- Control plane, Python side: generated client, schemathesis, S3 (moto) ----
  if [[ -n "$cp_venv" ]]; then
    run_stage "pytest control plane" env TESSERA_BIN="$TESSERA_BIN" \
      "$cp_venv/bin/python" -m pytest tests/python_cp -q -p no:cacheprovider || true
  fi

  # --- summary ----------------------------------------------------------------
  if ((${#FAILED[@]})); then
    say "FAILED stages: ${FAILED[*]} ($(( $(now_s) - start ))s)"
    exit 1
  fi
  say "all stages passed ($(( $(now_s) - start ))s)"
}

if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
  main "$@"
fi
