#!/usr/bin/env bash
# Makes a runnable Triton 2.51 (from the PyPI wheel nvidia-pytriton==0.7.0) to
# benchmark against, and writes a launcher at
#   $TESSERA_CACHE/triton/pytriton-0.7.0/bin/tritonserver
# Usage: scripts/setup-triton.sh [--check]
#
# What it builds (all under $TESSERA_CACHE/triton/pytriton-0.7.0/):
#   venv/       Python 3.11 venv: nvidia-pytriton (no deps: only its server
#               files are used), numpy, onnxruntime (pinned below). The Python
#               backend stub imports numpy/onnxruntime from here.
#   backends/python/       the wheel's Python backend (libtriton_python.so,
#                          triton_python_backend_utils.py, the 3.11 stub)
#   backends/onnxruntime/  model.py: a Python-based backend named
#                          "onnxruntime" that runs <version>/model.onnx with
#                          onnxruntime, so repositories whose configs say
#                          backend: "onnxruntime" load unchanged. The wheel
#                          has no real ONNX Runtime backend.
#   bin/tritonserver       launcher: sets LD_LIBRARY_PATH (the venv Python's
#                          LIBDIR first, then the wheel's nvidia_pytriton.libs)
#                          and PATH (venv bin first), adds
#                          --backend-directory backends/, execs the server
#                          with the given arguments. Stop it with SIGTERM.
#
# Intra-op threads of the onnxruntime model: the model config parameter
# `intra_op_thread_count`, else $TESSERA_ORT_INTRA_OP_THREADS, else 1.
# Models with max_batch_size > 0 run each batch the dynamic batcher forms as
# one onnxruntime call (inputs concatenated along dim 0, outputs split back).
#
# --check: starts the server on a generated add_sub repository and runs one
# HTTP inference with curl (needs scripts/setup-python.sh's venv).
#
# Idempotent and quiet when cached; prints the launcher path as the last line.
set -euo pipefail
# shellcheck source=scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

check=0
for arg in "$@"; do
  case "$arg" in
    --check) check=1 ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2; exit 0 ;;
    *) die "unknown argument: $arg (try --help)" ;;
  esac
done

pytriton_version=0.7.0
# The venv's packages, pinned. nvidia-pytriton is installed without its
# dependencies (its Python API is not used; numpy<2 is its own bound).
requirements=(
  "numpy==1.26.4"
  "onnxruntime==$TESSERA_ORT_VERSION"
  "flatbuffers==25.12.19"
  "packaging==26.4"
  "protobuf==6.33.6"
)

base="$TESSERA_CACHE/triton/pytriton-$pytriton_version"
venv="$base/venv"
backends="$base/backends"
launcher="$base/bin/tritonserver"
stamp="$venv/.tessera-complete"
stamp_text="nvidia-pytriton==$pytriton_version ${requirements[*]}"

# The ONNX Runtime Python-based backend (our own code, not from the wheel).
model_py() {
  cat <<'PY'
# Python-based Triton backend "onnxruntime" (written by tessera's scripts/setup-triton.sh).
import json, os
import numpy as np
import onnxruntime as ort
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        cfg = json.loads(args["model_config"])
        param = cfg.get("parameters", {}).get("intra_op_thread_count", {}).get("string_value")
        threads = int(param or os.environ.get("TESSERA_ORT_INTRA_OP_THREADS") or 1)
        opts = ort.SessionOptions()
        opts.intra_op_num_threads, opts.inter_op_num_threads = threads, 1
        path = os.path.join(args["model_repository"], args["model_version"],
                            cfg.get("default_model_filename") or "model.onnx")
        self.sess = ort.InferenceSession(path, sess_options=opts, providers=["CPUExecutionProvider"])
        # A sequence model's graph also takes the control and state inputs the sequence
        # batcher fills, and gives the state outputs it keeps.
        seq = cfg.get("sequence_batching") or {}
        controls = [c["name"] for c in seq.get("control_input", [])]
        states = seq.get("state", [])
        self.inputs = [i["name"] for i in cfg["input"]] + controls + [s["input_name"] for s in states]
        self.outputs = [o["name"] for o in cfg["output"]] + [s["output_name"] for s in states]
        self.batching = int(cfg.get("max_batch_size", 0)) > 0

    def execute(self, requests):
        feeds = [{n: pb_utils.get_input_tensor_by_name(r, n).as_numpy() for n in self.inputs} for r in requests]
        same = all(f[n].shape[1:] == feeds[0][n].shape[1:] for f in feeds for n in self.inputs)
        if self.batching and len(feeds) > 1 and same:
            outs = self.sess.run(self.outputs, {n: np.concatenate([f[n] for f in feeds]) for n in self.inputs})
            cuts = np.cumsum([f[self.inputs[0]].shape[0] for f in feeds])[:-1]
            results = list(zip(*(np.split(o, cuts) for o in outs)))
        else:
            results = [self.sess.run(self.outputs, f) for f in feeds]
        return [pb_utils.InferenceResponse([pb_utils.Tensor(n, np.ascontiguousarray(v)) for n, v in zip(self.outputs, res)])
                for res in results]
PY
}

launcher_text() {
  local site libdir
  site="$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  libdir="$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_config_var("LIBDIR"))')"
  cat <<EOF
#!/bin/sh
# Triton 2.51 from nvidia-pytriton==$pytriton_version (written by tessera's scripts/setup-triton.sh).
# The Python backend stub must load the venv Python's libpython (LIBDIR first)
# and import numpy/onnxruntime from the venv (its bin first on PATH).
LD_LIBRARY_PATH="$libdir:$site/nvidia_pytriton.libs\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
PATH="$venv/bin:\$PATH"
export LD_LIBRARY_PATH PATH
exec "$site/pytriton/tritonserver/bin/tritonserver" --backend-directory "$backends" "\$@"
EOF
}

# Starts the launcher on a fresh add_sub repository and checks one inference.
run_check() {
  local py tmp port pid out rc=0
  py="$("$TESSERA_ROOT/scripts/setup-python.sh")"/bin/python
  tmp="$(mktemp -d)"
  pid=""
  # shellcheck disable=SC2064
  trap "[[ -n \"\$pid\" ]] && kill -TERM \"\$pid\" 2>/dev/null; wait 2>/dev/null; rm -rf '$tmp'" RETURN
  "$py" "$TESSERA_ROOT/tests/python/gen_models.py" "$tmp/repo" --only add_sub >/dev/null
  read -r port gport mport < <("$py" -c '
import socket
ss = [socket.socket() for _ in range(3)]
for s in ss: s.bind(("127.0.0.1", 0))
print(*[s.getsockname()[1] for s in ss])')
  log "check: starting Triton on add_sub (http port $port)"
  "$launcher" --model-repository "$tmp/repo" --http-address 127.0.0.1 --http-port "$port" \
    --grpc-address 127.0.0.1 --grpc-port "$gport" --metrics-address 127.0.0.1 --metrics-port "$mport" \
    >"$tmp/triton.log" 2>&1 &
  pid=$!
  for _ in $(seq 1 120); do
    if curl -fsS "http://127.0.0.1:$port/v2/health/ready" >/dev/null 2>&1; then break; fi
    if ! kill -0 "$pid" 2>/dev/null; then break; fi
    sleep 0.5
  done
  local in0 in1
  in0="[$(seq -s, 0 15)]"
  in1="[$(seq -s, 0 15 | sed 's/[0-9]\+/1/g')]"
  out="$(curl -fsS -X POST "http://127.0.0.1:$port/v2/models/add_sub/infer" -H 'Content-Type: application/json' \
    -d "{\"inputs\":[{\"name\":\"INPUT0\",\"datatype\":\"FP32\",\"shape\":[1,16],\"data\":$in0},{\"name\":\"INPUT1\",\"datatype\":\"FP32\",\"shape\":[1,16],\"data\":$in1}]}" 2>&1)" || rc=$?
  # OUTPUT0 = INPUT0 + 1 = 1, 2, 3, ...; OUTPUT1 = INPUT0 - 1 = -1, 0, 1, ...
  if ((rc != 0)) || [[ "$out" != *'"data":[1.0,2.0,3.0,'* || "$out" != *'"data":[-1.0,0.0,1.0,'* ]]; then
    warn "Triton log:"; tail -n 40 "$tmp/triton.log" >&2
    die "check failed: add_sub inference answered: ${out:0:400}"
  fi
  log "check: add_sub inference ok: ${out:0:200}"
}

take_lock triton

if [[ -f "$stamp" && "$(cat "$stamp")" == "$stamp_text" && -x "$launcher" \
      && "$(cat "$launcher")" == "$(launcher_text)" \
      && -f "$backends/onnxruntime/model.py" && "$(cat "$backends/onnxruntime/model.py")" == "$(model_py)" ]]; then
  ((check)) && run_check
  printf '%s\n' "$launcher"
  exit 0
fi

start=$(now_s)
py="$(tessera_python)"
pyver="$("$py" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
[[ "$pyver" == 3.11 ]] || die "Python 3.11 needed (the wheel's stub for it is used); found $pyver at $py"
"$py" -c 'import sysconfig, sys; sys.exit(0 if sysconfig.get_config_var("Py_ENABLE_SHARED") else 1)' \
  || die "$py was built without a shared libpython; the Python backend stub needs libpython3.11.so.1.0"

# --- 1. the venv -------------------------------------------------------------
if [[ ! -f "$stamp" || "$(cat "$stamp")" != "$stamp_text" || ! -x "$venv/bin/python" ]]; then
  log "creating Triton venv $venv (nvidia-pytriton==$pytriton_version, ~55 MB, first time ~30-60s)"
  rm -rf "$venv"
  mkdir -p "$base"
  "$py" -m venv "$venv"
  # One --no-deps install of the complete pinned set: pip does not try to
  # resolve nvidia-pytriton's own (unused) dependencies.
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --only-binary=:all: \
    --no-deps "nvidia-pytriton==$pytriton_version" "${requirements[@]}" >&2 \
    || { rm -rf "$venv"; die "pip install nvidia-pytriton==$pytriton_version ${requirements[*]} failed"; }
  "$venv/bin/python" -c 'import numpy, onnxruntime' \
    || { rm -rf "$venv"; die "venv $venv failed its import check"; }
  printf '%s' "$stamp_text" >"$stamp"
fi

site="$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
server_dir="$site/pytriton/tritonserver"
[[ -x "$server_dir/bin/tritonserver" ]] || die "tritonserver binary missing from the wheel ($server_dir/bin)"

# --- 2. the backend directory ------------------------------------------------
rm -rf "$backends.tmp"
mkdir -p "$backends.tmp/python" "$backends.tmp/onnxruntime"
cp "$server_dir/backends/python/libtriton_python.so" \
   "$server_dir/backends/python/triton_python_backend_utils.py" "$backends.tmp/python/"
cp "$server_dir/python_backend_stubs/$pyver/triton_python_backend_stub" "$backends.tmp/python/"
chmod 0755 "$backends.tmp/python/triton_python_backend_stub"
model_py >"$backends.tmp/onnxruntime/model.py"
rm -rf "$backends"
mv "$backends.tmp" "$backends"

# --- 3. the launcher ---------------------------------------------------------
mkdir -p "$(dirname "$launcher")"
launcher_text >"$launcher.tmp"
chmod 0755 "$launcher.tmp"
mv -f "$launcher.tmp" "$launcher"

# Every library of the server and the stub must resolve.
for bin in "$server_dir/bin/tritonserver" "$backends/python/triton_python_backend_stub" \
           "$backends/python/libtriton_python.so"; do
  missing="$(LD_LIBRARY_PATH="$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_config_var("LIBDIR"))'):$site/nvidia_pytriton.libs" \
    ldd "$bin" 2>&1 | grep 'not found' || true)"
  [[ -z "$missing" ]] || die "unresolved libraries for $bin: $(tr -s ' \t\n' ' ' <<<"$missing")"
done
"$launcher" --version >/dev/null 2>&1 || true
log "Triton (nvidia-pytriton $pytriton_version) ready in $(( $(now_s) - start ))s"
((check)) && run_check
printf '%s\n' "$launcher"
