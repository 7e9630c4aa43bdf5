#!/usr/bin/env python3
"""A KIND_GPU model deployed on a real GPU worker (scripts/gpu-smoke.sh, section 6).

    gpu_smoke_worker.py TESSERA MODEL_DIR WORK_DIR [--worker-arg ARG ...]

Python 3's standard library only (numpy and onnxruntime, where importable, check the answer's
values). It starts a control plane (SQLite) and a worker that finds its GPU through NVML, makes a
tenant, pushes MODEL_DIR (config.pbtxt and 1/model.onnx of the mlp model, INPUT0 [batch, 256]
FP32 -> OUTPUT0 [batch, 10]) with a KIND_GPU instance group, and checks, printing each step:

  1. the worker registered a `gpu` (or MIG) slice from NVML;
  2. deploying the KIND_GPU version on the `cpu` profile is refused, naming both;
  3. on the `gpu` profile it becomes ready, in a runner process that holds GPU memory
     (nvidia-smi's compute apps);
  4. an inference through the worker answers the CPU provider's values (within TF32's precision);
  5. the worker's /metrics carries the GPU families (nv_gpu_utilization, nv_gpu_memory_*).

Exits 0 when every check passed; the processes' logs stay in WORK_DIR.
"""

import argparse
import io
import json
import re
import secrets
import string
import subprocess
import sys
import tarfile
import time
import urllib.error
import urllib.request
from pathlib import Path

TENANT = "gpu-smoke"
CP_PORT, HTTP_PORT, GRPC_PORT, METRICS_PORT = 18100, 18110, 18111, 18112
TIMINGS = ["--heartbeat-interval-ms", "300", "--worker-lost-after-ms", "5000", "--scheduler-interval-ms", "200"]
GPU_GROUP = "\ninstance_group [ { kind: KIND_GPU, count: 1 } ]\n"


class Failed(Exception):
    """A check that did not hold."""


def key() -> str:
    """A key in Tessera's format: tsk_<12 lower-case alphanumerics>_<43 alphanumerics>."""
    ident = "".join(secrets.choice(string.ascii_lowercase + string.digits) for _ in range(12))
    return f"tsk_{ident}_" + "".join(secrets.choice(string.ascii_letters + string.digits) for _ in range(43))


def call(method, url, token=None, body=None, data=None, content_type="application/json"):
    """(status, parsed JSON or text) of one HTTP call."""
    if body is not None:
        data = json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method)
    if data is not None:
        req.add_header("Content-Type", content_type)
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            status, text = r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        status, text = e.code, e.read().decode(errors="replace")
    except OSError as e:  # not listening (yet), reset
        return 0, str(e)
    try:
        return status, json.loads(text) if text else None
    except ValueError:
        return status, text


def expect(status_and_body, want, what):
    status, body = status_and_body
    if status != want:
        raise Failed(f"{what}: HTTP {status} (expected {want}): {str(body)[:600]}")
    return body


def wait_for(pred, timeout_s, what, procs):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for name, p, log in procs:
            if p.poll() is not None:
                raise Failed(f"{name} exited ({p.returncode}) while waiting for {what}:\n{tail(log)}")
        got = pred()
        if got:
            return got
        time.sleep(0.25)
    raise Failed(f"no {what} within {timeout_s:.0f} s")


def tail(log: Path, n: int = 25) -> str:
    try:
        return "\n".join("    " + line for line in log.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return "    (no log)"


def gpu_apps() -> dict:
    """{pid: MiB} of the processes nvidia-smi shows on a GPU."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return {}
    apps = {}
    for line in out.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 2 and parts[0].isdigit():
            apps[int(parts[0])] = parts[1]
    return apps


def children(pid: int) -> set:
    """Every descendant process of pid (from /proc)."""
    parent = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
            parent[int(stat.parent.name)] = int(text[text.rfind(")") + 2:].split()[1])
        except (OSError, ValueError, IndexError):
            continue
    found, frontier = set(), {pid}
    while frontier:
        frontier = {p for p, pp in parent.items() if pp in frontier} - found
        found |= frontier
    return found


def archive(model_dir: Path) -> bytes:
    """The model directory as a tar archive, its config given a KIND_GPU instance group."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        config = (model_dir / "config.pbtxt").read_text() + GPU_GROUP
        info = tarfile.TarInfo("mlp/config.pbtxt")
        info.size = len(config.encode())
        tar.addfile(info, io.BytesIO(config.encode()))
        tar.add(model_dir / "1" / "model.onnx", arcname="mlp/1/model.onnx")
    return buf.getvalue()


def expected_outputs(model_dir: Path, x):
    """The CPU provider's OUTPUT0 for x through Python's onnxruntime, or None without it."""
    try:
        import onnxruntime as ort  # noqa: PLC0415 - optional on the GPU machine
    except ImportError:
        return None
    sess = ort.InferenceSession(str(model_dir / "1" / "model.onnx"), providers=["CPUExecutionProvider"])
    return sess.run(["OUTPUT0"], {"INPUT0": x})[0]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("tessera")
    ap.add_argument("model_dir", type=Path)
    ap.add_argument("work_dir", type=Path)
    ap.add_argument("--worker-arg", action="append", default=[])
    ap.add_argument("--ready-timeout", type=float, default=120.0)
    args = ap.parse_args()
    work = args.work_dir.resolve()
    work.mkdir(parents=True, exist_ok=True)
    admin, worker_token = key(), secrets.token_urlsafe(24)
    cp_url = f"http://127.0.0.1:{CP_PORT}"
    procs = []

    def start(name, cmd):
        log = work / f"{name}.log"
        with open(log, "wb") as f:
            p = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT)
        procs.append((name, p, log))
        return p, log

    failures = 0

    def check(n, what, fn):
        nonlocal failures
        try:
            detail = fn()
            print(f"  {n}. ok: {what}" + (f" ({detail})" if detail else ""), flush=True)
            return True
        except Failed as e:
            failures += 1
            print(f"  {n}. FAILED: {what}: {e}", flush=True)
            return False

    try:
        start("control-plane", [args.tessera, "control-plane", "--listen", f"127.0.0.1:{CP_PORT}",
                                "--database-url", f"sqlite://{work / 'registry.db'}?mode=rwc",
                                "--object-store", str(work / "artifacts"), "--bootstrap-admin-key", admin,
                                f"--worker-token={worker_token}", *TIMINGS])
        wait_for(lambda: call("GET", f"{cp_url}/v1/tenants", admin)[0] == 200, 60, "control plane", procs)
        worker, worker_log = start("worker", [
            args.tessera, "worker", "--control-plane", cp_url, f"--worker-token={worker_token}",
            "--data-dir", str(work / "worker"), "--http-address", "127.0.0.1", "--grpc-address", "127.0.0.1",
            "--metrics-address", "127.0.0.1", "--http-port", str(HTTP_PORT), "--grpc-port", str(GRPC_PORT),
            "--metrics-port", str(METRICS_PORT), "--advertise-host", "127.0.0.1", "--cpu-slices", "1",
            *args.worker_arg])
        wait_for(lambda: "registered with the control plane" in worker_log.read_text(errors="replace"), 90,
                 "worker registration", procs)

        def gpu_slice():
            workers = expect(call("GET", f"{cp_url}/v1/workers", admin), 200, "GET /v1/workers")
            items = workers.get("workers", [])
            slices = [s for w in items for s in w.get("slices", []) if s.get("profile", "cpu") != "cpu"]
            if not slices:
                raise Failed(f"the worker registered no GPU slice: {json.dumps(items)[:600]}")
            return ", ".join(f"{s.get('profile')} {s.get('id', '')}" for s in slices)

        check(1, "the worker offers a GPU slice from NVML", gpu_slice)

        expect(call("POST", f"{cp_url}/v1/tenants", admin, {"name": TENANT}), 201, "create the tenant")
        tenant_key = expect(call("POST", f"{cp_url}/v1/tenants/{TENANT}/api-keys", admin,
                                 {"name": "gpu smoke", "role": "tenant-admin"}), 201, "create a key")["key"]
        base = f"{cp_url}/v1/tenants/{TENANT}"
        expect(call("POST", f"{base}/models", tenant_key, {"name": "mlp"}), 201, "create the model")
        version = expect(call("POST", f"{base}/models/mlp/versions?format=tar", tenant_key,
                              data=archive(args.model_dir), content_type="application/octet-stream"),
                         201, "push the KIND_GPU version")["version"]

        def refused_on_cpu():
            status, body = call("POST", f"{base}/deployments", tenant_key,
                                {"name": "mlp-cpu", "model": "mlp", "version": version, "replicas": 1,
                                 "profile": "cpu"})
            text = json.dumps(body)
            if status // 100 != 4 or "KIND_GPU" not in text or "cpu" not in text:
                raise Failed(f"HTTP {status}: {text[:600]}")
            return f"HTTP {status}: {body.get('error', body) if isinstance(body, dict) else body}"[:300]

        check(2, "the KIND_GPU version is refused on the cpu profile, with a reason naming both", refused_on_cpu)

        expect(call("POST", f"{base}/deployments", tenant_key,
                    {"name": "mlp", "model": "mlp", "version": version, "replicas": 1, "profile": "gpu"}),
               201, "deploy on the gpu profile")

        def ready():
            d = expect(call("GET", f"{base}/deployments/mlp", tenant_key), 200, "GET the deployment")
            up = [r for r in d.get("replica_status", []) if r.get("state") == "ready" and r.get("serving")]
            failed = [r for r in d.get("replica_status", []) if r.get("state") == "failed"]
            if failed:
                raise Failed(f"a replica failed: {json.dumps(failed)[:800]}")
            return up[0] if d.get("state") == "ready" and up else None

        def on_the_gpu():
            started = time.monotonic()
            replica = wait_for(ready, args.ready_timeout, "a ready replica on the gpu profile", procs)
            runners = children(worker.pid)
            apps = gpu_apps()
            holding = {pid: mib for pid, mib in apps.items() if pid in runners}
            if not holding:
                raise Failed(f"no runner of the worker holds GPU memory (runners {sorted(runners)}, "
                             f"nvidia-smi compute apps {apps})")
            return (f"ready in {time.monotonic() - started:.1f} s on slice {replica.get('slice_id', '?')}; "
                    f"runner(s) holding GPU memory (MiB): {holding}")

        if not check(3, "the deployment is ready on the gpu profile, in a runner on the GPU", on_the_gpu):
            print(tail(worker_log, 40))
            return 1

        def answers():
            inference_key = expect(call("POST", f"{base}/api-keys", tenant_key,
                                        {"name": "gpu smoke inference", "role": "inference"}), 201,
                                   "create an inference key")["key"]
            values = [((i * 7919) % 1000) / 1000.0 - 0.5 for i in range(4 * 256)]
            body = {"inputs": [{"name": "INPUT0", "shape": [4, 256], "datatype": "FP32", "data": values}]}
            got = expect(call("POST", f"http://127.0.0.1:{HTTP_PORT}/v2/models/mlp/infer", inference_key, body),
                         200, "inference")
            out = got["outputs"][0]
            if out["shape"] != [4, 10]:
                raise Failed(f"OUTPUT0 shape {out['shape']}, expected [4, 10]")
            try:
                import numpy as np  # noqa: PLC0415 - optional
            except ImportError:
                return "values not compared: no numpy"
            want = expected_outputs(args.model_dir, np.array(values, dtype=np.float32).reshape(4, 256))
            if want is None:
                return "values not compared: no onnxruntime in Python"
            diff = float(np.max(np.abs(np.array(out["data"], dtype=np.float64).reshape(4, 10) - want)))
            scale = float(np.max(np.abs(want))) or 1.0
            if diff / scale > 1e-2:
                raise Failed(f"largest difference {diff:.3e} against the CPU's outputs of scale {scale:.3e}")
            return f"largest difference / largest |output| against the CPU provider: {diff / scale:.2e}"

        check(4, "an inference through the worker answers the CPU provider's values", answers)

        def gpu_metrics():
            status, text = call("GET", f"http://127.0.0.1:{METRICS_PORT}/metrics")
            if status != 200 or not isinstance(text, str):
                raise Failed(f"/metrics: HTTP {status}")
            families = sorted({m.group(1) for m in re.finditer(r"^(nv_gpu_\w+|nv_energy_\w+)\{", text, re.M)})
            if not {"nv_gpu_utilization", "nv_gpu_memory_used_bytes", "nv_gpu_memory_total_bytes"} <= set(families):
                raise Failed(f"GPU families found: {families}")
            lines = [line for line in text.splitlines() if line.startswith(("nv_gpu_memory_used_bytes", "nv_gpu_power"))]
            return ", ".join(families) + "; " + "; ".join(lines[:3])

        check(5, "the worker's /metrics has the GPU families", gpu_metrics)
    except Failed as e:
        failures += 1
        print(f"  FAILED: {e}", flush=True)
        for name, _, log in procs:
            print(f"  last lines of {name}:\n{tail(log)}")
    finally:
        for _, p, _ in reversed(procs):
            p.terminate()
        for _, p, _ in reversed(procs):
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
