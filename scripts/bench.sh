#!/usr/bin/env bash
# Tessera's benchmark: raw ONNX Runtime in-process, `tessera serve` and (full
# suite) a real Triton 2.51, driven by perf_analyzer over HTTP and gRPC on the
# same generated model repository, one server at a time. Prints one table on
# stdout (aligned text, then the same as markdown); progress on stderr.
#
#   scripts/bench.sh [--suite quick|full|large|sequence|features] [--no-triton] [--no-build] [compare.py options]
#   scripts/bench.sh --gateway [--no-build] [gateway.py options]
#   scripts/bench.sh --capture [--no-build] [capture.py options]
#
#   --suite quick   raw mlp batch 1; tessera only: mlp concurrency 1 and 4
#                   over HTTP and gRPC (about 30 s after set-up and build)
#   --suite full    (default) raw mlp b1/b8 and add_sub b1; tessera and
#                   Triton: add_sub c1, mlp c1/c4/c16, mlp -b 8 c8, 1 MiB c1,
#                   sequence c1/c8, ensemble c1 and cache hit c1, over HTTP
#                   and gRPC, each three times with the servers alternating
#                   (about 12 minutes)
#   --suite sequence  only the sequence batcher: simple_sequence (Triton's
#                   accumulator example, implicit state) at concurrency 1 and
#                   8 (8 live sequences of 20 requests), tessera and Triton
#   --suite features  raw add_sub b1; tessera and Triton: ensemble c1/c4 and
#                   cache hit c1/c4 only (about 3 minutes with --rounds 1)
#   --no-triton     full suite without Triton
#   --no-build      use the existing release binary (no cargo build)
#   --threads N     intra-op threads for raw ORT and every model instance (1)
#   --runner        also measure `tessera serve --runner` (models in a runner
#                   process behind the socket a worker uses) beside in-process
#   --gateway       instead of the above, only what `tessera gateway` adds:
#                   bench/gateway.py starts a control plane (SQLite), one
#                   worker and one gateway, deploys add_sub and mlp, and runs
#                   add_sub c1 and mlp c16 over HTTP and gRPC against the
#                   worker directly, through a plain TCP relay (`tessera bench
#                   relay`: what one proxy hop costs here) and through the
#                   gateway, rotating, three rounds (--rounds N); prints
#                   direct vs gateway infer/s and p50, the p50 added, the
#                   throughput change, the relay's, and the goal (<= 30 us
#                   added at p50, <= 15 % throughput lost at concurrency 16)
#                   (about 5 minutes); with --callgrind N, the gateway's, the
#                   relay's and the worker's (direct and through the gateway)
#                   instructions per add_sub request counted under valgrind's
#                   callgrind instead of timed (under 2 minutes for 300)
#   --capture       instead of the above, only what request/response capture
#                   costs: bench/capture.py starts a control plane (SQLite) and
#                   one worker, deploys add_sub, and runs add_sub c1 over HTTP
#                   and gRPC with the deployment's capture off and on (sample
#                   rate 1.0, inputs, outputs, metadata), alternating, three
#                   rounds (--rounds N); prints off vs on infer/s and p50, the
#                   overhead and the goal (<= 5 %) (about 2 minutes);
#                   with --callgrind N, instructions per request counted under
#                   valgrind's callgrind instead of timed (about 5 minutes for 500)
#   anything else goes to bench/compare.py, or with --gateway to
#   bench/gateway.py, with --capture to bench/capture.py (see
#   `scripts/bench.sh [--gateway|--capture] --help`).
#
# Set-up it runs (each idempotent, quiet when cached): setup-ort.sh,
# setup-python.sh, setup-perf-analyzer.sh, setup-triton.sh (full suite with
# Triton, never with --gateway), then `cargo build --release --bin tessera`.
# Exit status: 0 ok; 1 a set-up step, a response check or perf_analyzer
# failed; 2 a server did not start (the table is printed without its rows).
set -euo pipefail
# shellcheck source=scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

say() {
  printf '[bench] %s\n' "$*" >&2
}

suite=full
triton=1
build=1
gateway=0
capture=0
pass=()
while (($#)); do
  case "$1" in
    --suite) [[ $# -ge 2 ]] || die "--suite needs quick, full or sequence"; suite="$2"; pass+=("$1" "$2"); shift 2; continue ;;
    --suite=*) suite="${1#--suite=}"; pass+=("$1") ;;
    --no-triton) triton=0; pass+=("$1") ;;
    --no-build) build=0 ;;
    --gateway) gateway=1 ;;
    --capture) capture=1 ;;
    -h | --help)
      sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2
      script=compare.py
      for a in "$@"; do
        [[ "$a" != --gateway ]] || gateway=1
        [[ "$a" != --capture ]] || capture=1
      done
      if ((gateway)); then script=gateway.py; fi
      if ((capture)); then script=capture.py; fi
      exec "$TESSERA_ROOT/.venv/bin/python" "$TESSERA_ROOT/bench/$script" --help
      ;;
    *) pass+=("$1") ;;
  esac
  shift
done
[[ "$suite" == quick || "$suite" == full || "$suite" == large || "$suite" == sequence || "$suite" == features ]] ||
  die "--suite must be quick, full, large, sequence or features, not '$suite'"
[[ "$suite" != quick ]] || triton=0
((gateway + capture < 2)) || die "--gateway and --capture are separate benchmarks: give one"
if ((gateway || capture)); then
  # The suite and Triton flags belong to compare.py; gateway.py has neither.
  for a in ${pass[@]+"${pass[@]}"}; do
    case "$a" in
      --suite | --suite=* | --no-triton | --runner) die "$a does not go with --gateway or --capture (see their --help)" ;;
    esac
  done
  triton=0
fi

ort_lib="$("$TESSERA_ROOT/scripts/setup-ort.sh" | tail -n1)"
venv="$("$TESSERA_ROOT/scripts/setup-python.sh" | tail -n1)"
pa="$("$TESSERA_ROOT/scripts/setup-perf-analyzer.sh" | tail -n1)"
triton_args=()
if ((triton)); then
  triton_args=(--triton "$("$TESSERA_ROOT/scripts/setup-triton.sh" | tail -n1)")
fi

tessera="$CARGO_TARGET_DIR/release/tessera"
if ((build)); then
  start=$(now_s)
  if ! (cd "$TESSERA_ROOT" && cargo build --release --quiet --bin tessera); then
    die "cargo build --release --bin tessera failed (if someone is mid-edit, retry, or pass --no-build to use $tessera)"
  fi
  (($(now_s) - start < 3)) || say "release build done in $(( $(now_s) - start ))s"
fi
[[ -x "$tessera" ]] || die "no release binary at $tessera (run without --no-build)"

export ORT_DYLIB_PATH="${ORT_DYLIB_PATH:-$ort_lib}"

# compare.py (gateway.py) stops the servers (processes) it started when it exits or gets SIGTERM; this
# trap passes a signal sent to this script (Ctrl-C included) on to it as
# SIGTERM (a background job of a script ignores SIGINT), waits for it, then
# ends this script with the same signal.
child=""
# shellcheck disable=SC2317  # invoked by the traps below
forward() {
  local sig="$1"
  if [[ -n "$child" ]] && kill -0 "$child" 2>/dev/null; then
    kill -TERM "$child" 2>/dev/null || true
    wait "$child" 2>/dev/null || true
  fi
  trap - "$sig"
  kill -s "$sig" $$
}
trap 'forward TERM' TERM
trap 'forward INT' INT
trap 'forward HUP' HUP

if ((capture)); then
  "$venv/bin/python" "$TESSERA_ROOT/bench/capture.py" --tessera "$tessera" --perf-analyzer "$pa" \
    ${pass[@]+"${pass[@]}"} &
elif ((gateway)); then
  "$venv/bin/python" "$TESSERA_ROOT/bench/gateway.py" --tessera "$tessera" --perf-analyzer "$pa" \
    ${pass[@]+"${pass[@]}"} &
else
  "$venv/bin/python" "$TESSERA_ROOT/bench/compare.py" --tessera "$tessera" --perf-analyzer "$pa" \
    ${triton_args[@]+"${triton_args[@]}"} ${pass[@]+"${pass[@]}"} &
fi
child=$!
rc=0
wait "$child" || rc=$?
child=""
exit "$rc"
