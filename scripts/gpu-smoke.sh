#!/usr/bin/env bash
# GPU smoke test for a lent GPU machine (an H200 here), in two halves:
#
#   scripts/gpu-smoke.sh pack        here, with network: builds a stripped release binary,
#                                    fetches the onnxruntime-gpu wheel's libraries, generates
#                                    the test models, and cuts everything into parts of at most
#                                    PART_MIB (56) MiB under .gpu-smoke/ (git-ignored), because
#                                    the GPU machine takes at most 64 MiB per call. It prints the
#                                    calls to make, one per part.
#   scripts/gpu-smoke.sh run         on the GPU machine (no network, no Rust), once every part
#                                    is there: joins and unpacks them, finds the CUDA libraries
#                                    (the torch wheels' nvidia/* directories, else the system's)
#                                    and prints, section by section:
#                                      1. the NVML inventory as `tessera gpus` reads it;
#                                      2. the CUDA provider against the CPU provider on the same
#                                         inputs (largest difference over the output's scale);
#                                      3. throughput of `tessera serve` on the GPU against raw
#                                         ONNX Runtime CUDA in-process, same model and batch, with
#                                         1 and 2 instances ($INSTANCES);
#                                      4. a runner killed with SIGKILL, restarted by its server,
#                                         and its GPU memory freed (nvidia-smi's compute apps);
#                                      5. a CUDA shared memory round trip (gpu_smoke_cuda_shm.py:
#                                         input and output in cudaMalloc'd memory, registered by
#                                         IPC handle), models in-process and in a runner;
#                                      6. a control plane and a worker that finds the GPU through
#                                         NVML: a KIND_GPU version refused on the cpu profile,
#                                         ready on the gpu profile in a runner holding GPU memory,
#                                         answering the CPU provider's values, GPU metrics
#                                         (gpu_smoke_worker.py).
#
# It never changes MIG mode, clocks or any other GPU setting: it only reads them.
# Every section prints `ok` or `FAILED: why`; the exit status is the number of failed sections.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SMOKE="$ROOT/.gpu-smoke"
# The GPU machine takes 64 MiB per call: the working tree (~4 MiB) and the carried part together.
PART_MIB="${PART_MIB:-56}"
MODEL=mlp
BATCH="${BATCH:-32}"
SECONDS_EACH="${SECONDS_EACH:-10}"
# Instance counts section 3 serves the model with, and its rounds of raw and served runs.
INSTANCES="${INSTANCES:-1 2}"
ROUNDS="${ROUNDS:-3}"
# Extra model parameters for the served GPU model, as key=value words (CUDA provider options
# Triton reads from `parameters`, such as do_copy_in_default_stream=0).
CUDA_OPTIONS="${CUDA_OPTIONS:-}"
# Extra flags of the server section 3 measures (such as --busy-poll-us=0).
SERVE_ARGS="${SERVE_ARGS:-}"
# Sections to run, as numbers (default: all).
ONLY="${ONLY:-}"

say() { printf '[gpu-smoke] %s\n' "$*" >&2; }
die() { say "ERROR: $*"; exit 100; }

pack() {
  # shellcheck source=scripts/lib.sh
  source "$ROOT/scripts/lib.sh"
  rm -rf "$SMOKE" && mkdir -p "$SMOKE/stage/bin" "$SMOKE/stage/models"
  say "building the release binary"
  cargo build --release --bin tessera >&2 || die "cargo build failed"
  strip -o "$SMOKE/stage/bin/tessera" "$CARGO_TARGET_DIR/release/tessera" || die "strip failed"
  say "generating the $MODEL model"
  "$ROOT/.venv/bin/python" "$ROOT/tests/python/gen_models.py" "$SMOKE/stage/models" --only "$MODEL" >&2 \
    || die "gen_models failed (run ./scripts/setup-python.sh first)"
  say "fetching onnxruntime-gpu==$TESSERA_ORT_VERSION libraries"
  local ort_dir
  # --force: this machine has no GPU; the libraries are for the GPU machine.
  ort_dir="$(dirname "$("$ROOT/scripts/setup-ort.sh" --gpu --force | tail -1)")" || die "setup-ort.sh --gpu failed"
  mkdir -p "$SMOKE/stage/ort"
  cp -L "$ort_dir"/libonnxruntime*.so* "$SMOKE/stage/ort/" || die "no GPU libraries in $ort_dir"
  cp "$ROOT/scripts/gpu-smoke.sh" "$ROOT/scripts/gpu_smoke_cuda_shm.py" "$ROOT/scripts/gpu_smoke_worker.py" "$SMOKE/stage/"
  say "compressing (xz; a few minutes)"
  tar -C "$SMOKE/stage" -cf - . | xz -T0 -6 >"$SMOKE/all.tar.xz" || die "tar/xz failed"
  split -b "${PART_MIB}M" -d -a 1 "$SMOKE/all.tar.xz" "$SMOKE/part-"
  rm -rf "$SMOKE/stage" "$SMOKE/all.tar.xz"
  (cd "$SMOKE" && sha256sum part-* >SHA256SUMS)
  local parts=("$SMOKE"/part-*)
  say "${#parts[@]} parts of at most $PART_MIB MiB in $SMOKE; on the GPU machine run, back to back:"
  local i=0 p
  for p in "${parts[@]}"; do
    i=$((i + 1))
    if ((i < ${#parts[@]})); then
      say "  call $i: carry [.gpu-smoke/$(basename "$p")], command: ls -l .gpu-smoke"
    else
      say "  call $i: carry [.gpu-smoke/$(basename "$p"), .gpu-smoke/SHA256SUMS], command: scripts/gpu-smoke.sh run"
    fi
  done
}

# section NAME: starts a section; result ok|FAILED is printed by pass/fail.
FAILS=0
section() { printf '\n== %s\n' "$*"; }
pass() { printf -- '-- ok%s\n' "${1:+: $1}"; }
fail() { printf -- '-- FAILED: %s\n' "$*"; FAILS=$((FAILS + 1)); }

# CUDA's user-space libraries: the torch wheels' nvidia/*/lib directories, then the system's.
cuda_library_dirs() {
  local py dirs=()
  for py in python3 python; do
    command -v "$py" >/dev/null 2>&1 || continue
    mapfile -t dirs < <("$py" - <<'EOF' 2>/dev/null
import glob, os, site
roots = site.getsitepackages() + [site.getusersitepackages()]
for root in roots:
    for d in sorted(glob.glob(os.path.join(root, "nvidia", "*", "lib"))):
        print(d)
EOF
)
    break
  done
  for d in /usr/local/cuda/lib64 /usr/lib/x86_64-linux-gnu; do
    [[ -d $d ]] && dirs+=("$d")
  done
  local IFS=:
  printf '%s\n' "${dirs[*]}"
}

run() {
  local work="$SMOKE/unpacked"
  if [[ ! -x "$work/bin/tessera" ]]; then
    [[ -f "$SMOKE/SHA256SUMS" ]] || die "no $SMOKE/SHA256SUMS: carry the parts first (scripts/gpu-smoke.sh pack)"
    (cd "$SMOKE" && sha256sum -c --quiet SHA256SUMS) || die "a part is missing or damaged"
    mkdir -p "$work"
    cat "$SMOKE"/part-* | xz -d | tar -C "$work" -xf - || die "unpacking failed"
  fi
  local bin="$work/bin/tessera" repo="$work/models" out="${OUT:-$SMOKE/out}"
  mkdir -p "$out"
  export ORT_DYLIB_PATH
  ORT_DYLIB_PATH="$(ls "$work"/ort/libonnxruntime.so.* | head -1)"
  local cuda_dirs
  cuda_dirs="$(cuda_library_dirs)"
  export LD_LIBRARY_PATH="$work/ort:$cuda_dirs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export TESSERA_CUDA_LIBRARY_DIRS="$work/ort:$cuda_dirs"

  section "machine"
  nvidia-smi --query-gpu=index,uuid,name,memory.total,mig.mode.current,driver_version --format=csv || true
  nvidia-smi -L || true
  echo "CUDA library directories: ${cuda_dirs:-none found}"
  # What the CUDA provider still lacks, if anything: the first thing to read when section 2 fails.
  ldd "$work/ort/libonnxruntime_providers_cuda.so" | grep -E 'not found|cublas|cudnn|cudart|cufft|curand' || true

  if wanted 1; then
    section "1. NVML inventory (tessera gpus)"
    if "$bin" gpus; then pass; else fail "tessera gpus"; fi
  fi

  if wanted 2; then
    section "2. CUDA provider vs CPU provider ($MODEL, batch $BATCH)"
    # TF32 matrix products (ORT's CUDA default) keep about 3 decimal digits.
    local parity
    if parity="$("$bin" bench ort --model "$repo/$MODEL/1/model.onnx" --batch "$BATCH" --gpu 0 --compare-cpu \
      --seconds 2)"; then
      echo "$parity"
      if python3 -c 'import json,sys; e=json.loads(sys.argv[1])["max_error_vs_cpu"]; print(f"largest difference / largest |output|: {e:.2e} (at most 1e-2)"); sys.exit(0 if e <= 1e-2 else 1)' "$parity"; then
        pass
      else
        fail "the CUDA provider's outputs differ from the CPU provider's"
      fi
    else
      fail "bench ort --compare-cpu"
    fi
  fi

  if wanted 3; then
    section "3. tessera serve on the GPU vs raw ONNX Runtime CUDA ($MODEL, batch $BATCH)"
    # Raw: one session, one thread, runs back to back. Served: the same intra-op threads, each
    # instance count of $INSTANCES on the GPU, gRPC clients at concurrency 4. Raw and served take
    # turns, $ROUNDS rounds; each served run is compared with its round's raw run (the GPU's
    # speed drifts by more than the difference measured).
    local raw served count r share best=0
    declare -A shares=()
    for ((r = 1; r <= ROUNDS; r++)); do
      raw="$("$bin" bench ort --model "$repo/$MODEL/1/model.onnx" --batch "$BATCH" --gpu 0 --seconds "$SECONDS_EACH")"
      echo "round $r, raw ORT CUDA: $raw"
      for count in $INSTANCES; do
        gpu_repo "$repo" "$work/gpu-repo-$count" "$count"
        start_serve "$bin" "$work/gpu-repo-$count" "$out/serve-$count.log" "$SERVE_ARGS" || continue
        served="$("$bin" bench grpc -u "127.0.0.1:$GRPC_PORT" -m "$MODEL" -b "$BATCH" --concurrency 4 \
          --duration "$SECONDS_EACH" --json 2>>"$out/bench.log" | tail -1)"
        stop_serve
        echo "round $r, tessera serve with $count instance(s): $served"
        share="$(share "$raw" "$served")" && shares[$count]+=" $share"
        echo "round $r, $count instance(s): ${share:-?} of raw"
      done
    done
    for count in $INSTANCES; do
      if python3 -c 'import statistics,sys; s=[float(v) for v in sys.argv[2:]] or sys.exit(f"{sys.argv[1]} instance(s): no result"); m=statistics.median(s); print(f"{sys.argv[1]} instance(s): median {m:.1%} of raw over {len(s)} round(s) (goal >= 95%)"); sys.exit(0 if m >= 0.95 else 1)' "$count" ${shares[$count]:-}; then
        ((best == 0)) && best=$count
      fi
    done
    if ((best > 0)); then pass "at least 95 % with $best instance(s)"; else fail "below 95 % of raw ONNX Runtime CUDA"; fi
  fi

  if wanted 4; then
    section "4. runner killed, restarted, GPU memory freed"
    gpu_repo "$repo" "$work/gpu-repo" 1
    if start_serve "$bin" "$work/gpu-repo" "$out/serve-runner.log" "--runner"; then
      kill_runner "$bin"
      stop_serve
    fi
  fi

  if wanted 5; then
    section "5. CUDA shared memory round trip ($MODEL, in-process and in a runner)"
    gpu_repo "$repo" "$work/gpu-repo" 1
    local where ok=0
    for where in "" "--runner"; do
      start_serve "$bin" "$work/gpu-repo" "$out/serve-cuda-shm${where:+-runner}.log" "$where" || continue
      if python3 "$(dirname "${BASH_SOURCE[0]}")/gpu_smoke_cuda_shm.py" "http://127.0.0.1:$HTTP_PORT" "$MODEL"; then
        ok=$((ok + 1))
      fi
      stop_serve
    done
    if ((ok == 2)); then pass "in-process and in a runner"; else fail "CUDA shared memory ($ok of 2 passed)"; fi
  fi

  if wanted 6; then
    section "6. a KIND_GPU model deployed on a worker that finds the GPU through NVML"
    rm -rf "$work/worker-smoke"
    if python3 "$(dirname "${BASH_SOURCE[0]}")/gpu_smoke_worker.py" "$bin" "$repo/$MODEL" "$work/worker-smoke"; then
      pass
    else
      fail "the GPU worker's deployment (worker log: worker.log)"
    fi
    cp "$work/worker-smoke/worker.log" "$out/worker.log" 2>/dev/null
  fi

  printf '\n== %d section(s) failed\n' "$FAILS"
  return "$FAILS"
}

# gpu_repo SRC DST COUNT: SRC's $MODEL with COUNT KIND_GPU instances of one intra-op thread,
# batches up to BATCH, and the parameters of CUDA_OPTIONS.
gpu_repo() {
  rm -rf "$2" && mkdir -p "$2" && cp -r "$1/$MODEL" "$2/"
  local config="$2/$MODEL/config.pbtxt" option
  # Room for the measured batch when it is above the generated model's 32.
  ((BATCH > 32)) && sed -i "s/^max_batch_size: .*/max_batch_size: $BATCH/" "$config"
  printf '\ninstance_group [ { kind: KIND_GPU, count: %d, gpus: [ 0 ] } ]\n' "$3" >>"$config"
  printf 'parameters { key: "intra_op_thread_count" value: { string_value: "1" } }\n' >>"$config"
  for option in $CUDA_OPTIONS; do
    printf 'parameters { key: "%s" value: { string_value: "%s" } }\n' "${option%%=*}" "${option#*=}" >>"$config"
  done
}

SERVE_PID=""
GRPC_PORT=""
HTTP_PORT=""
start_serve() {
  local bin="$1" repo="$2" log="$3" extra="$4"
  HTTP_PORT=18000 GRPC_PORT=18001
  # shellcheck disable=SC2086  # extra is a flag list
  "$bin" serve --model-repository "$repo" --http-port "$HTTP_PORT" --grpc-port "$GRPC_PORT" \
    --metrics-port 18002 $extra >"$log" 2>&1 &
  SERVE_PID=$!
  local i
  for i in $(seq 1 120); do
    if curl -sf "http://127.0.0.1:$HTTP_PORT/v2/models/$MODEL/ready" >/dev/null; then return 0; fi
    kill -0 "$SERVE_PID" 2>/dev/null || break
    # A failed load stays failed: waiting on would spend device time for nothing.
    grep -q "model failed to load" "$log" && break
    sleep 0.5
  done
  tail -20 "$log"
  stop_serve
  fail "tessera serve did not get $MODEL ready"
  return 1
}

stop_serve() {
  [[ -n $SERVE_PID ]] && kill "$SERVE_PID" 2>/dev/null && wait "$SERVE_PID" 2>/dev/null
  SERVE_PID=""
}

# share RAW_JSON SERVED_JSON: prints served throughput over raw; fails when either is unreadable.
share() {
  python3 -c '
import json, sys
try:
    raw, served = (json.loads(a)["inferences_per_sec"] for a in sys.argv[1:3])
    print(f"{served / raw:.4f}")
except (ValueError, KeyError, TypeError, ZeroDivisionError) as e:
    sys.exit(f"unreadable result: {e}")
' "$1" "$2"
}

# wanted N: whether section N runs (all of them unless ONLY lists some).
wanted() {
  [[ -z $ONLY || " $ONLY " == *" $1 "* ]]
}

# GPU memory (MiB) nvidia-smi shows for PID, empty when it shows none.
gpu_memory_of() {
  nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits 2>/dev/null \
    | awk -F', *' -v p="$1" '$1 == p { print $2 }'
}

kill_runner() {
  local bin="$1" old new mem i
  old="$(pgrep -f "$bin runner" | head -1)"
  [[ -n $old ]] || { fail "no runner process"; return; }
  mem="$(gpu_memory_of "$old")"
  echo "runner pid $old holds ${mem:-?} MiB of GPU memory"
  kill -9 "$old"
  for i in $(seq 1 60); do
    new="$(pgrep -f "$bin runner" | head -1)"
    [[ -n $new && $new != "$old" ]] && break
    sleep 0.5
  done
  [[ -n $new && $new != "$old" ]] || { fail "the runner was not restarted"; return; }
  for i in $(seq 1 60); do
    curl -sf "http://127.0.0.1:$HTTP_PORT/v2/models/$MODEL/ready" >/dev/null && break
    sleep 0.5
  done
  echo "restarted as pid $new, holding $(gpu_memory_of "$new") MiB"
  if [[ -n "$(gpu_memory_of "$old")" ]]; then
    fail "the killed runner's GPU memory is still held"
  elif curl -sf "http://127.0.0.1:$HTTP_PORT/v2/models/$MODEL/ready" >/dev/null; then
    pass "old pid holds no GPU memory; $MODEL ready again"
  else
    fail "$MODEL not ready after the restart"
  fi
}

case "${1:-}" in
  pack) pack ;;
  run) run ;;
  *) echo "usage: scripts/gpu-smoke.sh pack|run" >&2; exit 2 ;;
esac
