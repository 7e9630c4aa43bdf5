"""Fixtures for the deployment end-to-end tests: a real control plane on a fresh Postgres
database and several real ``tessera worker`` processes on loopback, driven through the REST
API and ``tritonclient``.

Environment:
    TESSERA_BIN     the built ``tessera`` binary (required; tests skip loudly without it)
    DATABASE_URL    an admin URL of a Postgres server (default postgres://postgres@127.0.0.1:5432/postgres);
                    each cluster creates and drops its own database there
    ORT_DYLIB_PATH  passed through (ONNX Runtime shared library)
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import socket
import string
import subprocess
import threading
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Callable, Dict, List, Optional
from urllib.parse import urlparse, urlunparse

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

LISTEN_RE = re.compile(r'listening.*protocol="?(\w+)"?.*addr=([0-9.]+:\d+)')
ANSI_RE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
STARTUP_TIMEOUT_S = 60.0

# Fast timings so failover and rollouts finish in seconds.
CONTROL_PLANE_TIMINGS = [
    "--heartbeat-interval-ms", "300",
    "--worker-lost-after-ms", "2000",
    "--drain-ms", "1000",
    "--scheduler-interval-ms", "200",
]


def tessera_bin() -> Optional[str]:
    path = os.environ.get("TESSERA_BIN", "")
    return path if path and os.access(path, os.X_OK) else None


def pytest_collection_modifyitems(config, items):
    if tessera_bin():
        return
    skip = pytest.mark.skip(reason="TESSERA_BIN is not set to the built tessera binary: deployment tests NOT RUN")
    for item in items:
        item.add_marker(skip)


def new_key() -> str:
    """A key in Tessera's format: tsk_<12 lower-case alphanumerics>_<43 alphanumerics>."""
    ident = "".join(secrets.choice(string.ascii_lowercase + string.digits) for _ in range(12))
    secret = "".join(secrets.choice(string.ascii_letters + string.digits) for _ in range(43))
    return f"tsk_{ident}_{secret}"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(pred: Callable[[], object], timeout_s: float, what: str, interval_s: float = 0.1):
    deadline = time.monotonic() + timeout_s
    last_error = None
    while time.monotonic() < deadline:
        try:
            value = pred()
            if value:
                return value
        except Exception as e:  # noqa: BLE001 - retried until the deadline
            last_error = e
        time.sleep(interval_s)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what} (last error: {last_error!r})")


# --------------------------------------------------------------------------
# Models: tiny ONNX graphs made here (no downloads)
# --------------------------------------------------------------------------


def marker_model(marker: float) -> bytes:
    """OUTPUT0 = INPUT0 + marker, FP32 [-1, 4]: tells versions apart by their outputs."""
    x = helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, ["batch", 4])
    y = helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, ["batch", 4])
    c = helper.make_tensor("marker", TensorProto.FLOAT, [1], [marker])
    graph = helper.make_graph([helper.make_node("Add", ["INPUT0", "marker"], ["OUTPUT0"])], "marker", [x], [y], [c])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model.SerializeToString()


# --------------------------------------------------------------------------
# Processes
# --------------------------------------------------------------------------


class Proc:
    """A tessera process whose stderr/stdout is drained into a log file and scanned."""

    def __init__(self, name: str, cmd: List[str], log: Path):
        self.name, self.cmd, self.log_path = name, cmd, log
        self.lines: List[str] = []
        self.addrs: Dict[str, str] = {}
        self.cond = threading.Condition()
        env = {**os.environ, "RUST_LOG": os.environ.get("RUST_LOG", "info"), "NO_COLOR": "1"}
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self):
        with open(self.log_path, "a") as out:
            for raw in self.proc.stdout:
                line = ANSI_RE.sub("", raw.rstrip())
                out.write(line + "\n")
                out.flush()
                with self.cond:
                    self.lines.append(line)
                    m = LISTEN_RE.search(line)
                    if m and m.group(1) not in self.addrs:
                        self.addrs[m.group(1)] = m.group(2)
                    self.cond.notify_all()

    def wait_for(self, pred: Callable[[], bool], what: str, timeout_s: float = STARTUP_TIMEOUT_S):
        deadline = time.monotonic() + timeout_s
        with self.cond:
            while not pred():
                left = deadline - time.monotonic()
                if left <= 0 or self.proc.poll() is not None:
                    tail = "\n".join(self.lines[-40:])
                    raise AssertionError(f"{self.name}: {what} did not happen (exit {self.proc.poll()}):\n{tail}")
                self.cond.wait(min(left, 0.2))

    def saw(self, pattern: str) -> bool:
        return any(re.search(pattern, line) for line in self.lines)

    def terminate(self, timeout_s: float = 15.0):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def kill(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()


class ApiError(Exception):
    def __init__(self, status: int, body: str):
        super().__init__(f"HTTP {status}: {body}")
        self.status, self.body = status, body


class Cluster:
    """Control plane + workers + a fresh database; REST helpers for the tests."""

    def __init__(self, workdir: Path, workers: int, worker_args: List[str], db_admin: Optional[str] = None,
                 cp_args: Optional[List[str]] = None):
        self.workdir = workdir
        self.admin_key = new_key()
        self.worker_token = secrets.token_urlsafe(24)
        # Gateways hold their own token, as the chart deploys them (not the workers').
        self.gateway_token = secrets.token_urlsafe(24)
        self.cp_port = free_port()
        self.url = f"http://127.0.0.1:{self.cp_port}"
        self.db_admin = db_admin or os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres")
        self.db_name = f"deploy_e2e_{uuid.uuid4().hex[:12]}"
        self._psql(f"CREATE DATABASE {self.db_name}")
        parsed = urlparse(self.db_admin)
        self.db_url = urlunparse(parsed._replace(path=f"/{self.db_name}"))
        self.worker_args = worker_args
        self.cp: Optional[Proc] = None
        self.workers: List[Optional[Proc]] = []
        self.gateways: List[Proc] = []
        self.cp_extra: List[str] = list(cp_args or [])
        self.start_control_plane()
        for _ in range(workers):
            self.start_worker()

    # -- processes ---------------------------------------------------------

    def _psql(self, sql: str):
        psql = shutil.which("psql") or "/usr/lib/postgresql/15/bin/psql"
        subprocess.run([psql, self.db_admin, "-v", "ON_ERROR_STOP=1", "-q", "-c", sql], check=True,
                       capture_output=True, text=True)

    def start_control_plane(self):
        cmd = [
            tessera_bin(), "control-plane",
            "--listen", f"127.0.0.1:{self.cp_port}",
            "--database-url", self.db_url,
            "--object-store", str(self.workdir / "artifacts"),
            "--bootstrap-admin-key", self.admin_key,
            f"--worker-token={self.worker_token}",
            f"--gateway-token={self.gateway_token}",
            *CONTROL_PLANE_TIMINGS,
            *getattr(self, "cp_extra", []),
        ]
        self.cp = Proc("control-plane", cmd, self.workdir / "control-plane.log")
        # With --agent-listen, workers and gateways need the agent port too (logged just after).
        wants = ["http", "agent"] if any(a.startswith("--agent-listen") for a in self.cp_extra) else ["http"]
        self.cp.wait_for(lambda: all(p in self.cp.addrs for p in wants), "control plane listening")

    @property
    def agent_url(self) -> str:
        """Where workers and gateways reach the agent service: its own listener when the
        control plane has one (`--agent-listen`), else the API's."""
        agent = self.cp.addrs.get("agent") if self.cp else None
        return f"http://{agent}" if agent else self.url

    def stop_control_plane(self):
        if self.cp:
            self.cp.terminate()

    def start_worker(self, index: Optional[int] = None, wait_registered: bool = True) -> int:
        if index is None:
            index = len(self.workers)
            self.workers.append(None)
        cmd = [
            tessera_bin(), "worker",
            "--control-plane", self.agent_url,
            f"--worker-token={self.worker_token}",
            "--data-dir", str(self.workdir / f"worker{index}"),
            "--http-address", "127.0.0.1", "--grpc-address", "127.0.0.1", "--metrics-address", "127.0.0.1",
            "--http-port", "0", "--grpc-port", "0", "--metrics-port", "0",
            "--advertise-host", "127.0.0.1",
            "--cpu-slices", "2",
            *self.worker_args,
        ]
        w = Proc(f"worker{index}", cmd, self.workdir / f"worker{index}.log")
        if wait_registered:
            w.wait_for(lambda: w.saw("registered with the control plane"), "worker registration")
        else:
            w.wait_for(lambda: "http" in w.addrs and "grpc" in w.addrs, "worker listening")
        self.workers[index] = w
        return index

    def start_gateway(self, *extra: str, wait_ready: bool = True) -> "Proc":
        """Starts a gateway on loopback ports (with the gateway token unless `extra` gives a
        token); returns it once it has a route table, or once it listens without `wait_ready`."""
        index = len(self.gateways)
        token = [] if any(a.startswith(("--worker-token", "--gateway-token")) for a in extra) else [
            f"--gateway-token={self.gateway_token}"]
        cmd = [
            tessera_bin(), "gateway",
            "--control-plane", self.agent_url,
            *token,
            "--gateway-id", f"gw{index}",
            "--address", "127.0.0.1",
            "--http-port", "0", "--grpc-port", "0", "--metrics-port", "0",
            *extra,
        ]
        g = Proc(f"gateway{index}", cmd, self.workdir / f"gateway{index}.log")
        g.wait_for(lambda: all(p in g.addrs for p in ("http", "grpc", "metrics")), "gateway listening")
        self.gateways.append(g)
        if not wait_ready:
            return g

        def ready():
            try:
                with urllib.request.urlopen(f"http://{g.addrs['http']}/v2/health/ready", timeout=2) as r:
                    return r.status == 200
            except (urllib.error.URLError, OSError):
                return False

        wait_until(ready, 30, "gateway ready (route table received)")
        return g

    def worker_by_http(self, endpoint: str) -> int:
        for i, w in enumerate(self.workers):
            if w and w.proc.poll() is None and endpoint.endswith(w.addrs.get("http", "-")):
                return i
        raise AssertionError(f"no running worker serves {endpoint}")

    def close(self):
        for g in self.gateways:
            g.terminate()
        for w in self.workers:
            if w:
                w.terminate()
        self.stop_control_plane()
        try:
            self._psql(f"DROP DATABASE IF EXISTS {self.db_name} WITH (FORCE)")
        except subprocess.CalledProcessError:
            pass

    # -- REST ----------------------------------------------------------------

    def api(self, method: str, path: str, key: str, body=None, data: Optional[bytes] = None,
            headers: Optional[dict] = None, expect: int = 200):
        hdrs = {"Authorization": f"Bearer {key}", **(headers or {})}
        payload = data
        if body is not None:
            payload = json.dumps(body).encode()
            hdrs["Content-Type"] = "application/json"
        req = urllib.request.Request(self.url + path, data=payload, method=method, headers=hdrs)
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                status, text = resp.status, resp.read().decode()
        except urllib.error.HTTPError as e:
            status, text = e.code, e.read().decode()
        if status != expect:
            raise ApiError(status, text)
        return json.loads(text) if text else None

    def create_tenant(self, name: str, **quotas) -> Dict[str, str]:
        """Creates a tenant with a tenant-admin and an inference key; returns the keys."""
        self.api("POST", "/v1/tenants", self.admin_key, {"name": name}, expect=201)
        if quotas:
            limits = self.api("GET", f"/v1/tenants/{name}/quotas", self.admin_key)["limits"]
            self.api("PUT", f"/v1/tenants/{name}/quotas", self.admin_key, {**limits, **quotas})
        keys = {}
        for role in ("tenant-admin", "inference"):
            created = self.api("POST", f"/v1/tenants/{name}/api-keys", self.admin_key,
                               {"name": f"{role} key", "role": role}, expect=201)
            keys[role] = created["key"]
        return keys

    def push_version(self, tenant: str, key: str, model: str, onnx_bytes: bytes) -> int:
        try:
            self.api("POST", f"/v1/tenants/{tenant}/models", key, {"name": model}, expect=201)
        except ApiError as e:
            if e.status != 409:
                raise
        v = self.api("POST", f"/v1/tenants/{tenant}/models/{model}/versions?format=onnx", key,
                     data=onnx_bytes, headers={"Content-Type": "application/octet-stream"}, expect=201)
        return v["version"]

    def deployment(self, tenant: str, key: str, name: str) -> dict:
        return self.api("GET", f"/v1/tenants/{tenant}/deployments/{name}", key)

    def wait_ready(self, tenant: str, key: str, name: str, timeout_s: float = 60.0,
                   pred: Optional[Callable[[dict], bool]] = None) -> dict:
        def check():
            d = self.deployment(tenant, key, name)
            ready = [r for r in d["replica_status"] if r["state"] == "ready" and r["serving"]]
            ok = d["state"] == "ready" and len(ready) == d["replicas"]
            return d if ok and (pred is None or pred(d)) else None

        return wait_until(check, timeout_s, f"deployment {tenant}/{name} ready")

    def token(self, key: str) -> str:
        return self.api("POST", "/v1/auth/token", key)["access_token"]


@pytest.fixture
def make_cluster(tmp_path):
    made: List[Cluster] = []

    def make(workers: int = 3, worker_args: Optional[List[str]] = None, db_admin: Optional[str] = None,
             cp_args: Optional[List[str]] = None) -> Cluster:
        c = Cluster(tmp_path, workers, worker_args or [], db_admin, cp_args)
        made.append(c)
        return c

    yield make
    for c in made:
        c.close()


def infer_http(endpoint: str, key: str, model: str, x: np.ndarray, version: str = ""):
    """One tritonclient HTTP (binary tensors) infer of the marker model; returns OUTPUT0."""
    import tritonclient.http as httpclient

    client = httpclient.InferenceServerClient(urlparse(endpoint).netloc)
    try:
        inp = httpclient.InferInput("INPUT0", list(x.shape), "FP32")
        inp.set_data_from_numpy(x, binary_data=True)
        res = client.infer(model, [inp], model_version=version, headers={"Authorization": f"Bearer {key}"})
        return res.as_numpy("OUTPUT0")
    finally:
        client.close()


def infer_grpc(endpoint: str, key: str, model: str, x: np.ndarray):
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(endpoint)
    try:
        inp = grpcclient.InferInput("INPUT0", list(x.shape), "FP32")
        inp.set_data_from_numpy(x)
        res = client.infer(model, [inp], headers={"authorization": f"Bearer {key}"})
        return res.as_numpy("OUTPUT0")
    finally:
        client.close()
