#!/usr/bin/env python3
"""What `tessera gateway` adds: perf_analyzer against a worker directly and through a gateway.

Run through `scripts/bench.sh --gateway` (it sets up perf_analyzer and ONNX Runtime and builds
the release binary first); run directly only with every path given:

    .venv/bin/python bench/gateway.py --tessera BIN --perf-analyzer PA [--rounds 3] ...

What it does, in order:
  1. writes bench/compare.py's model repository (add_sub, mlp: one KIND_CPU instance,
     `intra_op_thread_count` --threads, dynamic batching on mlp) and its input data, so the
     numbers compare with the main benchmark's;
  2. starts a control plane on SQLite in a temporary folder, one worker (--cpu-slices) and one
     gateway, each a real process on loopback ports in its own process group;
  3. creates a tenant whose rate limit (--requests-per-second) never throttles and an inference
     key, pushes add_sub and mlp as Triton model-directory archives (`?format=tar`, their
     config.pbtxt included), deploys each with one replica and waits until it is ready and the
     gateway routes it; checks add_sub's and mlp's answers over HTTP and gRPC on the worker
     and through the gateway;
  4. starts `tessera bench relay` in front of the worker's HTTP and gRPC ports: a plain TCP
     relay on the gateway's runtime settings (one thread, the same busy-polling) with no HTTP,
     authentication or routing, so what it adds is what one proxy hop costs on this machine;
  5. for add_sub concurrency 1 and mlp concurrency 16, over HTTP and gRPC, --rounds times,
     runs perf_analyzer (with the key in an `authorization` header) against the worker's
     endpoint, the relay and the gateway back to back, the order rotating between rounds.
     Shared machines drift within minutes, so "added p50" is the median over rounds of
     gateway p50 - direct p50 in the same round and "throughput" the median of
     gateway / direct - 1 (the relay's columns likewise);
  6. prints one table (aligned text, then the same as markdown) on stdout with the goal of
     issue 20 item 7: at most 30 µs added at p50 (concurrency 1 scenarios, where p50 is the
     per-request cost) and at most 15 % throughput lost at concurrency 16.

"gw CPU" is the gateway process's CPU time (user + system) per request it forwarded during the
gateway runs: on a machine whose cores the client, the worker and the gateway share, it is
what the gateway takes from the other two.

With --callgrind N it times nothing: the worker, the gateway and the relays run under valgrind's
callgrind (busy polling off, since spinning would count as work; a worker's runner processes run
natively), and for each protocol it counts their instructions per add_sub request over N
sequential tritonclient requests, three counts each from a zeroed counter, and prints that table
instead. Instructions do not move with the machine's speed: they show what the gateway's own
code costs per request, beside a bare hop's, and what the worker's process spends on a request
sent to it directly and on one the gateway forwards.

Progress goes to stderr. Stops every process it started on exit, SIGTERM, SIGHUP or Ctrl-C.
Exits 0 when the table was printed (goals met or not), 1 if a step or perf_analyzer failed, 2
if a process did not start.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import re
import secrets
import shlex
import shutil
import signal
import socket
import statistics
import string
import subprocess
import sys
import tarfile
import tempfile
import time
import traceback
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Tuple

sys.path.insert(0, str(Path(__file__).resolve().parent))
import compare  # noqa: E402  (the main benchmark's models, input data and perf_analyzer flags)
from compare import BenchError, Scenario, ServerStartError, log_tail, progress  # noqa: E402

TENANT = "bench"
MODELS = ("add_sub", "mlp")
SCENARIOS = [Scenario("add_sub c1", "add_sub", 1, 1, ()), Scenario("mlp c16", "mlp", 1, 16, ())]
PROTOCOLS = ("http", "grpc")
PATHS = ("direct", "relay", "gateway")
# The goal (issue 20 item 7).
GOAL_ADDED_P50_US = 30.0
GOAL_LOSS_PCT = 15.0
GOAL_LOSS_CONCURRENCY = 16

LISTEN_RE = re.compile(r'listening.*protocol="?(\w+)"?.*addr=([0-9.]+:\d+)')
ANSI_RE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
# Fast control-plane timings (as tests/python_deploy/conftest.py uses) so deployments converge
# in about a second; they change nothing on the inference path.
CONTROL_PLANE_TIMINGS = ["--heartbeat-interval-ms", "300", "--worker-lost-after-ms", "5000",
                         "--scheduler-interval-ms", "200"]


def new_key() -> str:
    """A key in Tessera's format: tsk_<12 lower-case alphanumerics>_<43 alphanumerics>."""
    ident = "".join(secrets.choice(string.ascii_lowercase + string.digits) for _ in range(12))
    secret = "".join(secrets.choice(string.ascii_letters + string.digits) for _ in range(43))
    return f"tsk_{ident}_{secret}"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def host_port(endpoint: str) -> str:
    """`http://127.0.0.1:8000` or `127.0.0.1:8000` -> `127.0.0.1:8000` (perf_analyzer's -u)."""
    return re.sub(r"^[a-z]+://", "", endpoint).rstrip("/")


def wait_until(pred, timeout_s: float, what: str, interval_s: float = 0.2):
    deadline = time.monotonic() + timeout_s
    last: Optional[BaseException] = None
    while time.monotonic() < deadline:
        try:
            got = pred()
            if got:
                return got
        except Exception as e:  # noqa: BLE001 - retried until the deadline
            last = e
        time.sleep(interval_s)
    raise BenchError(f"timed out after {timeout_s:.0f}s waiting for {what}" + (f" (last error: {last})" if last else ""))


# ---------------------------------------------------------------------------
# processes
# ---------------------------------------------------------------------------


class Proc:
    """One tessera process in its own process group (a worker's runners included), its output in
    a log file that is scanned for the `listening` lines; stop() is idempotent."""

    def __init__(self, name: str, cmd: List[str], log: Path, secrets_: tuple = ()):
        self.name, self.cmd, self.log = name, cmd, log
        self.secrets = secrets_  # left out of what is printed
        self.proc: Optional[subprocess.Popen] = None
        self.addrs: Dict[str, str] = {}

    def start(self) -> "Proc":
        progress(f"starting {self.name}: {self.shown()}")
        env = {**os.environ, "RUST_LOG": os.environ.get("RUST_LOG", "info"), "NO_COLOR": "1"}
        with open(self.log, "wb") as logf:
            self.proc = subprocess.Popen(self.cmd, stdout=logf, stderr=subprocess.STDOUT, env=env,
                                         start_new_session=True)
        return self

    def shown(self) -> str:
        text = shlex.join(self.cmd)
        for secret in self.secrets:
            text = text.replace(secret, "<redacted>")
        return text

    def text(self) -> str:
        try:
            return ANSI_RE.sub("", self.log.read_text(errors="replace"))
        except OSError:
            return ""

    def fail(self, why: str) -> ServerStartError:
        return ServerStartError(f"{self.name} did not start: {why}\n  command: {self.shown()}\n"
                                f"  last lines of {self.log}:\n{log_tail(self.log)}")

    def wait_log(self, pred, what: str, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            text = self.text()
            for m in LISTEN_RE.finditer(text):
                self.addrs.setdefault(m.group(1), m.group(2))
            if pred(text):
                return
            if self.proc and self.proc.poll() is not None:
                raise self.fail(f"exited with status {self.proc.returncode} before {what}")
            time.sleep(0.1)
        raise self.fail(f"no {what} after {timeout_s:.0f}s")

    def wait_listening(self, protocols, timeout_s: float = 60.0) -> None:
        self.wait_log(lambda _t: all(p in self.addrs for p in protocols),
                      "'listening' line for " + ", ".join(protocols), timeout_s)

    def exited(self) -> Optional[int]:
        return self.proc.poll() if self.proc else None

    def cpu_seconds(self) -> float:
        """User + system CPU of the process itself (not its children)."""
        if not self.proc:
            return 0.0
        try:
            stat = Path(f"/proc/{self.proc.pid}/stat").read_text()
        except OSError:
            return 0.0
        fields = stat[stat.rfind(")") + 2:].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self, timeout_s: float = 15.0) -> None:
        if not self.proc or self.proc.returncode is not None:
            return
        for sig, wait_s in ((signal.SIGTERM, timeout_s), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(wait_s)
                break
            except subprocess.TimeoutExpired:
                continue
        # Whatever the leader left in its group (runners) goes too.
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


class Cluster:
    """Control plane on SQLite + one worker + one gateway, and the REST calls the benchmark makes."""

    def __init__(self, args, tmp: Path):
        self.args, self.tmp = args, tmp
        self.admin_key = new_key()
        self.worker_token = secrets.token_urlsafe(24)
        self.url = ""
        self.procs: List[Proc] = []
        self.worker: Optional[Proc] = None
        self.gateway: Optional[Proc] = None
        self.relays: Dict[str, Proc] = {}

    def _start(self, proc: Proc) -> Proc:
        proc.secrets = (self.admin_key, self.worker_token)
        self.procs.append(proc)
        return proc.start()

    def start(self) -> None:
        bin_ = self.args.tessera
        port = free_port()
        cp = self._start(Proc("control-plane", [
            bin_, "control-plane", "--listen", f"127.0.0.1:{port}",
            "--database-url", f"sqlite://{self.tmp / 'registry.db'}?mode=rwc",
            "--object-store", str(self.tmp / "artifacts"),
            "--bootstrap-admin-key", self.admin_key, f"--worker-token={self.worker_token}",
            *CONTROL_PLANE_TIMINGS,
        ], self.tmp / "control-plane.log"))
        cp.wait_listening(["http"])
        self.url = f"http://{cp.addrs['http']}"
        self.worker = self._start(Proc("worker", [
            *self.counted("worker"), bin_, "worker", "--control-plane", self.url, f"--worker-token={self.worker_token}",
            "--data-dir", str(self.tmp / "worker"),
            "--http-address", "127.0.0.1", "--grpc-address", "127.0.0.1", "--metrics-address", "127.0.0.1",
            "--http-port", "0", "--grpc-port", "0", "--metrics-port", "0", "--advertise-host", "127.0.0.1",
            "--cpu-slices", str(self.args.cpu_slices), "--isolation", self.args.isolation, *self.idle(),
        ], self.tmp / "worker.log"))
        self.worker.wait_log(lambda t: "registered with the control plane" in t, "registration",
                             self.start_timeout())
        self.worker.wait_listening(["metrics"], self.start_timeout())
        self.gateway = self._start(Proc("gateway", [
            *self.counted("gateway"), bin_, "gateway", "--control-plane", self.url,
            f"--worker-token={self.worker_token}", "--gateway-id", "bench", "--address", "127.0.0.1",
            "--http-port", "0", "--grpc-port", "0", "--metrics-port", "0",
            *([f"--threads={self.args.gateway_threads}"] if self.args.gateway_threads else []),
            *self.args.gateway_arg, *self.idle(),
        ], self.tmp / "gateway.log"))
        self.gateway.wait_listening(["http", "grpc", "metrics"], self.start_timeout())

    def counted(self, name: str) -> List[str]:
        """valgrind's callgrind and no busy polling (it would count as work), under --callgrind."""
        if not self.args.callgrind:
            return []
        return ["valgrind", "--tool=callgrind", f"--callgrind-out-file={self.tmp / f'callgrind-{name}.out'}",
                "--dump-line=no"]

    def idle(self) -> List[str]:
        return ["--busy-poll-us=0"] if self.args.callgrind else []

    def start_timeout(self) -> float:
        return 600.0 if self.args.callgrind else 60.0

    def relay(self, to: str) -> str:
        """The address of a `tessera bench relay` to `to` (host:port), started on first use."""
        if to not in self.relays:
            proc = self._start(Proc(f"relay to {to}", [
                *self.counted(f"relay-{len(self.relays)}"), self.args.tessera, "bench", "relay",
                "--listen", "127.0.0.1:0", "--to", to, *self.idle(),
            ], self.tmp / f"relay-{len(self.relays)}.log"))
            proc.wait_listening(["tcp"], self.start_timeout())
            self.relays[to] = proc
        return self.relays[to].addrs["tcp"]

    def stop(self) -> None:
        for p in reversed(self.procs):
            p.stop()

    def check_alive(self, during: str) -> None:
        for p in self.procs:
            if p.exited() is not None:
                raise BenchError(f"{p.name} exited (status {p.exited()}) during {during}\n{log_tail(p.log)}")

    def api(self, method: str, path: str, key: str, body=None, data: Optional[bytes] = None,
            content_type: str = "application/json", expect: int = 200):
        headers = {"Authorization": f"Bearer {key}"}
        if body is not None:
            data = json.dumps(body).encode()
        if data is not None:
            headers["Content-Type"] = content_type
        req = urllib.request.Request(self.url + path, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=60) as resp:
                status, text = resp.status, resp.read().decode()
        except urllib.error.HTTPError as e:
            status, text = e.code, e.read().decode(errors="replace")
        if status != expect:
            raise BenchError(f"{method} {path}: HTTP {status} (expected {expect}): {text[:500]}")
        return json.loads(text) if text else None

    def create_tenant(self) -> Dict[str, str]:
        """The tenant, its rate limit raised past anything the benchmark sends, and its keys."""
        self.api("POST", "/v1/tenants", self.admin_key, {"name": TENANT}, expect=201)
        limits = self.api("GET", f"/v1/tenants/{TENANT}/quotas", self.admin_key)["limits"]
        limits.update(requests_per_second=self.args.requests_per_second, concurrent_requests=0)
        self.api("PUT", f"/v1/tenants/{TENANT}/quotas", self.admin_key, limits)
        keys = {}
        for role in ("tenant-admin", "inference"):
            made = self.api("POST", f"/v1/tenants/{TENANT}/api-keys", self.admin_key,
                            {"name": f"bench {role}", "role": role}, expect=201)
            keys[role] = made["key"]
        return keys

    def push_and_deploy(self, key: str, repo: Path, model: str) -> None:
        """Pushes repo/<model> (config.pbtxt and 1/model.onnx) as a tar archive; deploys it."""
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            tar.add(repo / model, arcname=model)
        self.api("POST", f"/v1/tenants/{TENANT}/models", key, {"name": model}, expect=201)
        v = self.api("POST", f"/v1/tenants/{TENANT}/models/{model}/versions?format=tar", key,
                     data=buf.getvalue(), content_type="application/octet-stream", expect=201)
        self.api("POST", f"/v1/tenants/{TENANT}/deployments", key,
                 {"name": model, "model": model, "version": v["version"], "replicas": 1,
                  "instance_count": self.args.instances}, expect=201)

    def wait_deployed(self, key: str, model: str, timeout_s: float = 90.0) -> Dict[str, str]:
        """The ready replica's worker endpoints: {"http": host:port, "grpc": host:port}."""
        def ready():
            self.check_alive(f"deployment of {model}")
            d = self.api("GET", f"/v1/tenants/{TENANT}/deployments/{model}", key)
            up = [r for r in d["replica_status"] if r.get("state") == "ready" and r.get("serving")]
            if d["state"] == "ready" and len(up) == 1:
                return {"http": host_port(up[0]["http_endpoint"]), "grpc": host_port(up[0]["grpc_endpoint"])}
            return None

        return wait_until(ready, timeout_s, f"deployment {TENANT}/{model} ready")

    def worker_counts(self, model: str) -> Optional[Tuple[float, float]]:
        """`model`'s inferences and executions on the worker, from its Triton counters (None when
        unreadable)."""
        try:
            with urllib.request.urlopen(f"http://{self.worker.addrs['metrics']}/metrics", timeout=5) as r:
                text = r.read().decode()
        except (OSError, KeyError):
            return None
        totals = {"nv_inference_count": 0.0, "nv_inference_exec_count": 0.0}
        for line in text.splitlines():
            name, _, rest = line.partition("{")
            if name in totals and f'model="{model}"' in rest:
                totals[name] += float(line.rsplit(" ", 1)[1])
        return totals["nv_inference_count"], totals["nv_inference_exec_count"]

    def gateway_requests(self) -> Optional[float]:
        """tessera_gateway_requests_total over every label (None when unreadable)."""
        try:
            with urllib.request.urlopen(f"http://{self.gateway.addrs['metrics']}/metrics", timeout=5) as r:
                text = r.read().decode()
        except OSError:
            return None
        total = 0.0
        for line in text.splitlines():
            if line.startswith("tessera_gateway_requests_total"):
                total += float(line.rsplit(" ", 1)[1])
        return total


def check_answers(endpoints: Dict[str, Dict[str, str]], key: str, repo: Path, timeout_s: float = 30.0) -> None:
    """add_sub and mlp answer onnxruntime's values over HTTP and gRPC at every endpoint (the
    gateway's retried until its route table has both models)."""
    import numpy as np
    import onnxruntime as ort
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    mlp = ort.InferenceSession(str(repo / "mlp" / "1" / "model.onnx"), opts, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(7)
    a, b = rng.standard_normal((3, 16)).astype(np.float32), rng.standard_normal((3, 16)).astype(np.float32)
    x = rng.standard_normal((5, 256)).astype(np.float32)
    want_mlp = mlp.run(["OUTPUT0"], {"INPUT0": x})[0]
    auth = {"authorization": f"Bearer {key}"}

    for path, eps in endpoints.items():
        for proto, mod in (("http", httpclient), ("grpc", grpcclient)):
            def check():
                client = mod.InferenceServerClient(eps[proto])
                try:
                    def infer(model, named, outputs):
                        inputs = []
                        for name, arr in named:
                            t = mod.InferInput(name, list(arr.shape), "FP32")
                            t.set_data_from_numpy(arr)
                            inputs.append(t)
                        res = client.infer(model, inputs, outputs=[mod.InferRequestedOutput(o) for o in outputs],
                                           headers=dict(auth))  # the HTTP client adds to the dict
                        return [res.as_numpy(o) for o in outputs]

                    got0, got1 = infer("add_sub", [("INPUT0", a), ("INPUT1", b)], ["OUTPUT0", "OUTPUT1"])
                    (got,) = infer("mlp", [("INPUT0", x)], ["OUTPUT0"])
                finally:
                    client.close()
                if not (np.allclose(got0, a + b, atol=1e-6) and np.allclose(got1, a - b, atol=1e-6)):
                    raise BenchError(f"{path} {proto}: add_sub answered wrong values")
                if got is None or got.shape != want_mlp.shape or not np.allclose(got, want_mlp, rtol=1e-4, atol=1e-4):
                    raise BenchError(f"{path} {proto}: mlp answered wrong values")
                return True

            wait_until(check, timeout_s, f"{path} {proto} answering add_sub and mlp with onnxruntime's values")
    progress("add_sub and mlp answer onnxruntime's values over HTTP and gRPC, direct and through the gateway")


# ---------------------------------------------------------------------------
# perf_analyzer
# ---------------------------------------------------------------------------


@dataclass
class Run:
    scenario: str
    protocol: str
    path: str  # "direct" or "gateway"
    round: int
    infer_per_sec: float
    p50_us: Optional[float]
    p99_us: Optional[float]
    gw_cpu_us: Optional[float] = None  # gateway CPU per forwarded request (gateway runs)
    batch: Optional[float] = None  # the worker's inferences per model execution during the run
    note: str = ""
    command: str = ""


def measure(args, cluster: Cluster, url: str, key: str, proto: str, sc: Scenario, path: str, rnd: int,
            tmp: Path, label: str) -> Run:
    """One perf_analyzer run; one that never stabilises is measured again without the check."""
    csv_path = tmp / "pa.csv"
    note = ""
    n0, cpu0 = cluster.gateway_requests(), cluster.gateway.cpu_seconds()
    counts0 = cluster.worker_counts(sc.model)
    for attempt, (stability, trials) in enumerate(((args.stability, args.max_trials), (1000, 4))):
        csv_path.unlink(missing_ok=True)
        cmd = compare.pa_command(args, url, proto, sc, csv_path, stability, trials)
        cmd += ["-H", f"authorization: Bearer {key}"]
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=args.pa_timeout)
        except subprocess.TimeoutExpired as e:
            raise BenchError(f"{label}: perf_analyzer ran past {args.pa_timeout}s\n  command: {redact(cmd, key)}") from e
        out = p.stdout + p.stderr
        if p.returncode != 0 and compare.UNSTABLE in out and attempt == 0 and "error" not in out.lower():
            progress(f"    not stable within {stability}% in {trials} windows; measuring again without the stability check")
            note = "(unstable)"
            continue
        break
    if p.returncode != 0 or not csv_path.exists():
        tail = "\n".join("    " + line for line in out.strip().splitlines()[-25:])
        raise BenchError(f"{label}: perf_analyzer failed (exit {p.returncode})\n  command: {redact(cmd, key)}\n"
                         f"  output:\n{tail}")
    rows = list(csv.DictReader(io.StringIO(csv_path.read_text())))
    if not rows:
        raise BenchError(f"{label}: perf_analyzer wrote no CSV rows\n  command: {redact(cmd, key)}")

    def num(k):
        v = rows[0].get(k)
        return float(v) if v not in (None, "") else None

    counts1 = cluster.worker_counts(sc.model)
    batch = None
    if counts0 and counts1 and counts1[1] > counts0[1]:
        batch = (counts1[0] - counts0[0]) / (counts1[1] - counts0[1])
    gw_cpu = None
    if path == "gateway":
        n1, cpu1 = cluster.gateway_requests(), cluster.gateway.cpu_seconds()
        if n0 is not None and n1 is not None and n1 > n0:
            gw_cpu = (cpu1 - cpu0) * 1e6 / (n1 - n0)
    return Run(sc.name, proto, path, rnd, num("Inferences/Second") or 0.0, num("p50 latency"), num("p99 latency"),
               gw_cpu, batch, note, redact(cmd, key))


def callgrind_dumps(proc: Proc) -> set:
    """The callgrind files `proc` has written so far (named as Cluster.counted says)."""
    out = Path(next(a for a in proc.cmd if a.startswith("--callgrind-out-file=")).split("=", 1)[1])
    return set(out.parent.glob(out.name + "*"))


def instructions_per_request(procs: List[Proc], url: str, proto: str, key: str, n: int) -> List[float]:
    """Callgrind's instructions of each of `procs` (every thread) per add_sub request over `n`
    sequential tritonclient requests sent to `url`, counted from a zeroed counter to the last
    answer."""
    import numpy as np
    mod = __import__("tritonclient.http" if proto == "http" else "tritonclient.grpc", fromlist=["_"])
    client = mod.InferenceServerClient(url, network_timeout=600.0) if proto == "http" else mod.InferenceServerClient(url)
    inputs = []
    for name in ("INPUT0", "INPUT1"):
        t = mod.InferInput(name, [1, 16], "FP32")
        t.set_data_from_numpy(np.ones((1, 16), dtype=np.float32))
        inputs.append(t)
    headers = {"authorization": f"Bearer {key}"}

    def control(proc: Proc, *flags: str) -> None:
        done = subprocess.run(["callgrind_control", *flags, str(proc.proc.pid)], capture_output=True, text=True,
                              timeout=300)
        if done.returncode != 0:
            raise BenchError(f"callgrind_control {' '.join(flags)} failed: {done.stdout}{done.stderr}")

    try:
        for _ in range(50):  # warm: connections, the key cache, the route
            client.infer("add_sub", inputs, headers=dict(headers))
        before = [callgrind_dumps(p) for p in procs]
        for p in procs:
            control(p, "--zero")
        for _ in range(n):
            client.infer("add_sub", inputs, headers=dict(headers))
        for p in procs:
            control(p, "--dump=requests")
    finally:
        client.close()
    counts = []
    for p, old in zip(procs, before):
        new = sorted(callgrind_dumps(p) - old)
        if not new:
            raise BenchError(f"callgrind wrote no dump for {p.name}")
        total = 0
        for path in new:
            for line in path.read_text(errors="replace").splitlines():
                if line.startswith(("totals:", "summary:")):
                    total += int(line.split()[1])
                    break
        counts.append(total / n)
    return counts


def callgrind_table(args, cluster: "Cluster", key: str, direct: Dict[str, str], gw: Dict[str, str],
                    protocols: List[str]) -> List[List[str]]:
    """Per protocol: gateway and relay instructions per request, and the worker's sent directly
    and through the gateway, three counts each, alternating."""
    rows = []
    for proto in protocols:
        relay = cluster.relay(direct[proto])
        counts: Dict[str, List[float]] = {"gateway": [], "relay": [], "worker direct": [], "worker gateway": []}
        for path in ("direct", "gateway", "relay") * 3:
            if path == "direct":
                (w,) = instructions_per_request([cluster.worker], direct[proto], proto, key, args.callgrind)
                counts["worker direct"].append(w)
                progress(f"callgrind worker {proto} (direct): {w:,.0f} instructions per request")
                continue
            proc = cluster.gateway if path == "gateway" else cluster.relays[direct[proto]]
            url = gw[proto] if path == "gateway" else relay
            procs = [proc, cluster.worker] if path == "gateway" else [proc]
            ir, *worker = instructions_per_request(procs, url, proto, key, args.callgrind)
            counts[path].append(ir)
            progress(f"callgrind {path} {proto}: {ir:,.0f} instructions per request over {args.callgrind}")
            if worker:
                counts["worker gateway"].append(worker[0])
                progress(f"callgrind worker {proto} (through the gateway): {worker[0]:,.0f} instructions per request")
        g, r = median(counts["gateway"]), median(counts["relay"])
        three = {k: " / ".join(f"{v:,.0f}" for v in vs) for k, vs in counts.items()}
        rows.append(["add_sub c1", proto, three["gateway"], three["relay"], f"{g - r:+,.0f}",
                     three["worker direct"], three["worker gateway"]])
    return rows


CALLGRIND_COLUMNS = ["Scenario", "Proto", "gateway instructions/request (3 counts)",
                     "relay instructions/request (3 counts)", "gateway − relay (medians)",
                     "worker, direct (3 counts)", "worker, through the gateway (3 counts)"]


def render_callgrind(args, rows: List[List[str]]) -> str:
    """The --callgrind table: a header, aligned text, then markdown."""
    header = (f"Tessera gateway instructions per request, {time.strftime('%Y-%m-%d %H:%M:%S %Z')}, commit "
              f"{compare.git_describe()}\nset-up: control plane on SQLite; one worker (--isolation {args.isolation}; "
              "its runners native), the gateway and `tessera bench relay` under valgrind's callgrind with "
              "--busy-poll-us=0; "
              f"{args.callgrind} sequential tritonclient add_sub requests per count, every thread of the process "
              "counted from a zeroed counter")
    cells = [CALLGRIND_COLUMNS] + rows
    widths = [max(len(r[i]) for r in cells) for i in range(len(CALLGRIND_COLUMNS))]
    text = "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in cells)
    markdown = "\n".join(["| " + " | ".join(CALLGRIND_COLUMNS) + " |", "|" + "|".join(":---" for _ in CALLGRIND_COLUMNS) + "|"]
                         + ["| " + " | ".join(r) + " |" for r in rows])
    return f"{header}\n\n{text}\n\n{markdown}"


def redact(cmd: List[str], key: str) -> str:
    return shlex.join(cmd).replace(key, "$KEY")


# ---------------------------------------------------------------------------
# the table
# ---------------------------------------------------------------------------

COLUMNS = ["Scenario", "Proto", "direct infer/s", "direct p50 µs", "gateway infer/s", "gateway p50 µs",
           "added p50 µs", "throughput", "relay added p50 µs", "relay throughput", "gw CPU µs",
           "batch d/g/r", "goal"]
RIGHT = set(COLUMNS) - {"Scenario", "Proto", "goal"}


def median(values) -> Optional[float]:
    got = [v for v in values if v is not None]
    return statistics.median(got) if got else None


def fmt(v, digits=0, sign=False) -> str:
    if v is None:
        return "—"
    return f"{v:+,.{digits}f}" if sign else f"{v:,.{digits}f}"


@dataclass
class Summary:
    scenario: Scenario
    protocol: str
    direct: List[Run] = field(default_factory=list)
    gateway: List[Run] = field(default_factory=list)
    relay: List[Run] = field(default_factory=list)

    def paired(self, path: str = "gateway"):
        by_round = {r.round: r for r in self.direct}
        return [(by_round[g.round], g) for g in getattr(self, path) if g.round in by_round]

    def added_p50(self, path: str = "gateway") -> Optional[float]:
        return median(g.p50_us - d.p50_us for d, g in self.paired(path)
                      if g.p50_us is not None and d.p50_us is not None)

    def change_pct(self, path: str = "gateway") -> Optional[float]:
        return median((g.infer_per_sec / d.infer_per_sec - 1) * 100 for d, g in self.paired(path) if d.infer_per_sec)

    def goal(self) -> str:
        checks = []
        if self.scenario.concurrency == 1:
            added = self.added_p50()
            if added is not None:
                ok = added <= GOAL_ADDED_P50_US
                checks.append(f"{'ok' if ok else 'MISSED'}: p50 {added:+,.0f} µs (≤ {GOAL_ADDED_P50_US:.0f})")
        if self.scenario.concurrency >= GOAL_LOSS_CONCURRENCY:
            change = self.change_pct()
            if change is not None:
                ok = -change <= GOAL_LOSS_PCT
                checks.append(f"{'ok' if ok else 'MISSED'}: throughput {change:+.1f} % (loss ≤ {GOAL_LOSS_PCT:.0f} %)")
        return "; ".join(checks) or "—"

    def cells(self) -> List[str]:
        notes = " ".join(sorted({r.note for r in self.direct + self.gateway + self.relay if r.note}))
        return [self.scenario.name + (" " + notes if notes else ""), self.protocol,
                fmt(median(r.infer_per_sec for r in self.direct)), fmt(median(r.p50_us for r in self.direct)),
                fmt(median(r.infer_per_sec for r in self.gateway)), fmt(median(r.p50_us for r in self.gateway)),
                fmt(self.added_p50(), sign=True), fmt(self.change_pct(), 1, sign=True) + " %",
                fmt(self.added_p50("relay"), sign=True),
                fmt(self.change_pct("relay"), 1, sign=True) + " %" if self.relay else "—",
                fmt(median(r.gw_cpu_us for r in self.gateway)),
                "/".join(fmt(median(r.batch for r in runs), 1) for runs in (self.direct, self.gateway, self.relay)),
                self.goal()]


def render_text(cells: List[List[str]]) -> str:
    widths = [max([len(COLUMNS[i])] + [len(c[i]) for c in cells]) for i in range(len(COLUMNS))]

    def line(vals):
        return "  ".join(v.rjust(w) if COLUMNS[i] in RIGHT else v.ljust(w)
                         for i, (v, w) in enumerate(zip(vals, widths))).rstrip()

    return "\n".join([line(COLUMNS), "  ".join("-" * w for w in widths)] + [line(c) for c in cells])


def render_markdown(cells: List[List[str]]) -> str:
    head = "| " + " | ".join(COLUMNS) + " |"
    align = "|" + "|".join("---:" if c in RIGHT else ":---" for c in COLUMNS) + "|"
    return "\n".join([head, align] + ["| " + " | ".join(c) + " |" for c in cells])


# ---------------------------------------------------------------------------
# main
# ---------------------------------------------------------------------------


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tessera", required=True, help="tessera release binary")
    ap.add_argument("--perf-analyzer", required=True, help="perf_analyzer (wrapper) path")
    ap.add_argument("--rounds", type=int, default=3,
                    help="measurements per scenario x protocol x path, direct and gateway alternating; "
                         "the table shows medians (default 3)")
    ap.add_argument("--protocols", default="http,grpc", help="comma-separated subset of http,grpc")
    ap.add_argument("--scenarios", help="comma-separated subset of 'add_sub c1,mlp c16' (default: both)")
    ap.add_argument("--cpu-slices", type=int, default=2, help="the worker's --cpu-slices (default 2: one per model)")
    ap.add_argument("--gateway-arg", action="append", default=[], metavar="ARG",
                    help="an extra flag for the gateway, e.g. --gateway-arg=--busy-poll-us=0 (repeatable)")
    ap.add_argument("--gateway-threads", type=int, default=0, help="the gateway's --threads (default: its own default)")
    ap.add_argument("--no-relay", action="store_true",
                    help="leave out the plain TCP relay (`tessera bench relay`), e.g. for a binary without it")
    ap.add_argument("--isolation", choices=("runner", "in-process"), default="runner",
                    help="the worker's --isolation (default runner, the worker's own default)")
    ap.add_argument("--requests-per-second", type=int, default=1_000_000,
                    help="the tenant's rate limit: high enough never to throttle (default 1000000)")
    ap.add_argument("--threads", type=int, default=1, help="intra_op_thread_count of every model instance (default 1)")
    ap.add_argument("--instances", type=int, default=1, help="model instances per replica (default 1)")
    ap.add_argument("--max-queue-delay-us", type=int, default=0, help="mlp dynamic_batching max_queue_delay_microseconds (default 0)")
    ap.add_argument("--no-dynamic-batching", action="store_true", help="leave dynamic_batching out of mlp's config")
    ap.add_argument("--pa-mode", choices=("time", "count"), default="time",
                    help="perf_analyzer windows: time_windows of --window-ms (default) or count_windows of --window-requests")
    ap.add_argument("--window-ms", type=int, default=1000, help="--measurement-interval in time mode (default 1000)")
    ap.add_argument("--window-requests", type=int, default=2000, help="--measurement-request-count in count mode")
    ap.add_argument("--stability", type=int, default=20, help="--stability-percentage (default 20)")
    ap.add_argument("--max-trials", type=int, default=6,
                    help="--max-trials (default 6); a run that never stabilises is measured again without the check, marked (unstable)")
    ap.add_argument("--pa-timeout", type=int, default=120, help="seconds before one perf_analyzer run is abandoned")
    ap.add_argument("--workdir", help="keep the repository, database and logs here (default: a temporary folder)")
    ap.add_argument("--json", help="also write every run (with its command) to this JSON file")
    ap.add_argument("--callgrind", type=int, default=0, metavar="N",
                    help="instead of timing, count the gateway's and the relay's instructions per add_sub request "
                         "under valgrind's callgrind over N sequential requests (three counts each)")
    return ap.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.rounds < 1:
        print("gateway.py: --rounds must be at least 1", file=sys.stderr)
        return 1
    protocols = [p for p in args.protocols.split(",") if p]
    if not protocols or any(p not in PROTOCOLS for p in protocols):
        print(f"gateway.py: --protocols must be a subset of {','.join(PROTOCOLS)}", file=sys.stderr)
        return 1
    scenarios = SCENARIOS
    if args.scenarios:
        wanted = [w.strip() for w in args.scenarios.split(",") if w.strip()]
        unknown = [w for w in wanted if w not in {s.name for s in SCENARIOS}]
        if unknown:
            print(f"gateway.py: no scenario {', '.join(unknown)}; there are: "
                  f"{', '.join(s.name for s in SCENARIOS)}", file=sys.stderr)
            return 1
        scenarios = [s for s in SCENARIOS if s.name in wanted]

    def on_term(signum, _frame):
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGHUP, on_term)

    keep = bool(args.workdir)
    if args.workdir:
        tmp = Path(args.workdir).resolve()
        if tmp.exists() and any(tmp.iterdir()):
            print(f"gateway.py: --workdir {tmp} must be empty or absent (it gets a fresh registry)", file=sys.stderr)
            return 1
        tmp.mkdir(parents=True, exist_ok=True)
    else:
        tmp = Path(tempfile.mkdtemp(prefix="tessera-gwbench-"))
    cluster = Cluster(args, tmp)
    runs: List[Run] = []
    load_before = os.getloadavg()
    paths = [p for p in PATHS if not (args.no_relay and p == "relay")]
    total = len(scenarios) * len(protocols) * args.rounds * len(paths)
    step = 0
    rc = 0
    callgrind_rows: Optional[List[List[str]]] = None
    try:
        progress(f"gateway overhead: {total} measurements; worker --cpu-slices {args.cpu_slices} "
                 f"--isolation {args.isolation}; work dir {tmp}")
        repo = tmp / "repo"
        compare.write_repository(repo, args)
        compare.write_input_data(tmp / "input-data")
        cluster.start()
        keys = cluster.create_tenant()
        for model in MODELS:
            cluster.push_and_deploy(keys["tenant-admin"], repo, model)
        direct = {}
        for model in MODELS:
            direct[model] = cluster.wait_deployed(keys["tenant-admin"], model)
            progress(f"{model} ready on the worker: http {direct[model]['http']}, grpc {direct[model]['grpc']}")
        if len({json.dumps(d, sort_keys=True) for d in direct.values()}) != 1:
            progress("note: the models' replicas report different worker endpoints: " + json.dumps(direct))
        gw = {"http": cluster.gateway.addrs["http"], "grpc": cluster.gateway.addrs["grpc"]}
        progress(f"gateway: http {gw['http']}, grpc {gw['grpc']}, metrics {cluster.gateway.addrs['metrics']}")
        check_answers({"direct": direct["add_sub"], "gateway": gw}, keys["inference"], repo,
                      cluster.start_timeout())
        if args.callgrind:
            callgrind_rows = callgrind_table(args, cluster, keys["inference"], direct["add_sub"], gw, protocols)
            scenarios = []  # nothing timed
        if direct["mlp"] != direct["add_sub"]:
            check_answers({"direct": direct["mlp"]}, keys["inference"], repo)

        for sc in scenarios:
            for proto in protocols:
                for rnd in range(args.rounds):
                    # Each path goes first, middle and last in turn.
                    order = paths[rnd % len(paths):] + paths[:rnd % len(paths)]
                    for path in order:
                        step += 1
                        url = {"direct": direct[sc.model][proto], "gateway": gw[proto]}.get(path) \
                            or cluster.relay(direct[sc.model][proto])
                        label = f"{path} {proto} {sc.name}"
                        progress(f"({step}/{total}) {label} ({url}), round {rnd + 1}/{args.rounds}")
                        run = measure(args, cluster, url, keys["inference"], proto, sc, path, rnd, tmp, label)
                        cluster.check_alive(label)
                        runs.append(run)
                        cpu = f", gateway CPU {fmt(run.gw_cpu_us)} µs/request" if run.gw_cpu_us else ""
                        batch = f", {fmt(run.batch, 1)} inferences per execution" if run.batch else ""
                        progress(f"    {run.infer_per_sec:,.0f} infer/s, p50 {fmt(run.p50_us)} µs, "
                                 f"p99 {fmt(run.p99_us)} µs{cpu}{batch}")
    except ServerStartError as e:
        progress("ERROR: " + str(e))
        rc = 2
    except BenchError as e:
        progress("FAILED: " + str(e))
        rc = 1
    except KeyboardInterrupt:
        progress("interrupted")
        rc = 130
    except Exception:  # noqa: BLE001 - reported, then the processes are stopped
        progress("FAILED:\n" + traceback.format_exc())
        rc = 1
    finally:
        cluster.stop()

    if rc:
        if keep or rc != 130:
            # A failed run's logs are the only way to see why: kept.
            progress(f"logs kept in {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
        return rc

    if callgrind_rows is not None:
        print(render_callgrind(args, callgrind_rows))
        if not keep:
            shutil.rmtree(tmp, ignore_errors=True)
        return rc

    summaries = []
    for sc in scenarios:
        for proto in protocols:
            s = Summary(sc, proto)
            for r in runs:
                if r.scenario == sc.name and r.protocol == proto:
                    getattr(s, r.path).append(r)
            summaries.append(s)
    cells = [s.cells() for s in summaries]
    load_after = os.getloadavg()
    header = [
        f"Tessera gateway overhead, {time.strftime('%Y-%m-%d %H:%M:%S %Z')}, commit {compare.git_describe()}",
        f"machine: {os.cpu_count()} CPUs; load average before {load_before[0]:.2f}, after {load_after[0]:.2f} "
        "(perf_analyzer, the worker and the gateway share the machine)",
        f"set-up: control plane on SQLite, one worker (--cpu-slices {args.cpu_slices}, --isolation {args.isolation}, "
        "default flags otherwise), one gateway (default flags); one tenant (rate limit "
        f"{args.requests_per_second:,}/s, never reached), add_sub and mlp as in bench/compare.py "
        f"({args.threads} intra-op thread(s), {args.instances} instance(s), mlp "
        + ("without dynamic batching" if args.no_dynamic_batching else
           f"dynamic_batching max_queue_delay_microseconds {args.max_queue_delay_us}")
        + "), one replica each",
        "perf_analyzer: "
        + (f"time_windows {args.window_ms} ms" if args.pa_mode == "time" else f"count_windows {args.window_requests} requests")
        + f", stable within {args.stability}% over 3 windows, HTTP binary tensors / gRPC, sync, API key in an "
        "authorization header; direct = the worker's endpoint from the deployment's replica_status",
        f"every number is the median of {args.rounds} round(s), direct, relay and gateway back to back in each "
        "(rotating order); added p50 = median of gateway p50 - direct p50 in the same round; throughput = "
        "median of gateway / direct - 1 in the same round; relay = the same for `tessera bench relay`, a plain TCP "
        "relay on the gateway's runtime settings (what one proxy hop costs here); gw CPU = gateway process CPU per "
        "forwarded request; batch d/g/r = the worker's inferences per model execution (its dynamic batches) "
        "direct / through the gateway / through the relay",
        f"goal (issue 20 item 7): ≤ {GOAL_ADDED_P50_US:.0f} µs added at p50 (concurrency 1 rows) and "
        f"≤ {GOAL_LOSS_PCT:.0f} % throughput loss at concurrency {GOAL_LOSS_CONCURRENCY}",
    ]
    print("\n".join(header) + "\n\n" + render_text(cells))
    print()
    print("\n".join(f"> {h}" for h in header) + "\n\n" + render_markdown(cells))
    sys.stdout.flush()
    if args.json:
        Path(args.json).write_text(json.dumps([r.__dict__ for r in runs], indent=2))
    if not keep:
        shutil.rmtree(tmp, ignore_errors=True)
    return rc


if __name__ == "__main__":
    sys.exit(main())
