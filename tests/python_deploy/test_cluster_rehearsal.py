"""The Helm chart's topology rehearsed on one machine (scripts/cluster.sh): two control-plane
replicas on one Postgres database and an S3-compatible store (moto), a Service stand-in in
front of them, three workers with simulated GPU / MIG inventories (fake NVML), and the gateway
when the binary has one. Under load, the scheduling leader and a worker are SIGKILLed at the
same moment: serving must go on (clients move to the replicas that are left, as `tessera infer`
users and the gateway do), the other control-plane replica must take the lead, and the lost
worker's replica must be placed again by it.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from conftest import marker_model, wait_until

ROOT = Path(__file__).resolve().parents[2]
CLUSTER = ROOT / "scripts" / "cluster.sh"
LEADER = "this control plane schedules (leader)"
LOAD_THREADS = 4


def call(method: str, url: str, key: str, body=None, data: bytes | None = None, ctype="application/json",
         timeout: float = 10):
    headers = {"Authorization": f"Bearer {key}"}
    if body is not None:
        data = json.dumps(body).encode()
    if data is not None:
        headers["Content-Type"] = ctype
    req = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def api(state, method, path, key, body=None, data=None, expect=200):
    status, text = call(method, state["api"] + path, key, body, data, ctype="application/octet-stream" if data else
                        "application/json")
    assert status == expect, f"{method} {path}: HTTP {status} {text[:300]!r}"
    return json.loads(text) if text else None


@pytest.fixture
def cluster(tmp_path):
    run = subprocess.run([str(CLUSTER), "start", str(tmp_path)], capture_output=True, text=True, timeout=240)
    try:
        if run.returncode != 0:
            logs = "\n".join(f"--- {p.name}\n" + "\n".join(p.read_text(errors="replace").splitlines()[-15:])
                             for p in sorted((tmp_path / "logs").glob("*.log")))
            pytest.fail(f"scripts/cluster.sh start failed ({run.returncode}):\n{run.stderr}\n{logs}")
        print(run.stderr.strip())
        yield json.loads((tmp_path / "cluster.json").read_text())
    finally:
        subprocess.run([str(CLUSTER), "stop", str(tmp_path)], capture_output=True, text=True, timeout=60)


class Load:
    """Closed-loop clients of one model. Each request goes to the gateway, or else to a ready
    replica's worker (endpoints refreshed from the deployment through the API); a failed attempt
    is retried once on another endpoint, as a client of a replicated deployment does."""

    def __init__(self, state, tenant: str, admin_key: str, infer_key: str, model: str):
        self.state, self.tenant, self.admin, self.key, self.model = state, tenant, admin_key, infer_key, model
        gateway = state.get("gateway")
        self.endpoints = [gateway["http"]] if gateway else []
        self.via_gateway = bool(gateway)
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.ok: list[float] = []
        self.retried = 0
        self.failed: list[tuple[float, str]] = []
        self.body = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 4],
                                            "data": [1.0, 2.0, 3.0, 4.0]}]}).encode()

    def refresh(self):
        while not self.stop.is_set():
            try:
                d = api(self.state, "GET", f"/v1/tenants/{self.tenant}/deployments/{self.model}", self.admin)
                ready = [r["http_endpoint"] for r in d["replica_status"] if r["state"] == "ready" and r["serving"]]
                if ready:
                    with self.lock:
                        self.endpoints = ready
            except (AssertionError, OSError, ValueError):
                pass  # the API may blink while a control plane dies: keep the last endpoints
            self.stop.wait(0.3)

    def attempt(self, endpoint: str) -> str | None:
        try:
            status, text = call("POST", f"{endpoint}/v2/models/{self.model}/infer", self.key, data=self.body, timeout=5)
        except OSError as e:
            return f"{endpoint}: {e}"
        if status != 200:
            return f"{endpoint}: HTTP {status} {text[:100]!r}"
        out = json.loads(text)["outputs"][0]["data"]
        return None if out == [2.0, 3.0, 4.0, 5.0] else f"{endpoint}: wrong answer {out}"

    def client(self, index: int):
        n = index
        while not self.stop.is_set():
            with self.lock:
                endpoints = list(self.endpoints)
            if not endpoints:  # the first refresh has not come back yet
                time.sleep(0.05)
                continue
            n += 1
            first = endpoints[n % len(endpoints)]
            error = self.attempt(first)
            if error and len(endpoints) > 1:
                self.retried += 1
                error = self.attempt(endpoints[(n + 1) % len(endpoints)])
            elif error:
                self.retried += 1
                time.sleep(0.2)
                error = self.attempt(first)
            with self.lock:
                if error:
                    self.failed.append((time.monotonic(), error))
                else:
                    self.ok.append(time.monotonic())

    def start(self):
        self.threads = [threading.Thread(target=self.refresh, daemon=True)]
        self.threads += [threading.Thread(target=self.client, args=(i,), daemon=True) for i in range(LOAD_THREADS)]
        for t in self.threads:
            t.start()

    def finish(self):
        self.stop.set()
        for t in self.threads:
            t.join(15)

    def longest_gap(self, since: float) -> float:
        times = [t for t in self.ok if t >= since]
        return max((b - a for a, b in zip(times, times[1:])), default=float("inf"))


def leader_log(cp) -> bool:
    return LEADER in Path(cp["log"]).read_text(errors="replace")


def test_leader_and_worker_killed_under_load(cluster):
    state = cluster
    admin = state["admin_key"]

    # What the chart's pools offer: a whole GPU, a MIG layout, a mixed MIG layout, CPU slices.
    workers = {w["id"]: w for w in api(state, "GET", "/v1/workers", admin)["workers"]}
    profiles = {wid: sorted(s["profile"] for s in w["slices"]) for wid, w in workers.items()}
    assert profiles["worker-0"] == ["cpu", "cpu", "gpu"], profiles
    assert profiles["worker-1"] == ["cpu", "cpu"] + ["mig-1g.18gb"] * 7, profiles
    assert profiles["worker-2"] == ["cpu", "cpu", "mig-1g.18gb", "mig-1g.18gb", "mig-2g.35gb", "mig-3g.71gb"], profiles

    # A tenant, a model (stored in the S3 stand-in) and a deployment with a replica per worker.
    api(state, "POST", "/v1/tenants", admin, {"name": "acme"}, expect=201)
    keys = {role: api(state, "POST", "/v1/tenants/acme/api-keys", admin, {"name": role, "role": role}, expect=201)["key"]
            for role in ("tenant-admin", "inference")}
    owner = keys["tenant-admin"]
    api(state, "POST", "/v1/tenants/acme/models", owner, {"name": "adder"}, expect=201)
    api(state, "POST", "/v1/tenants/acme/models/adder/versions?format=onnx", owner, data=marker_model(1.0), expect=201)
    s3 = state["s3"]
    listing = urllib.request.urlopen(f"{s3['endpoint']}/{s3['bucket']}?list-type=2&prefix={s3['prefix']}tenants/",
                                     timeout=10).read()
    assert b"/model.onnx</Key>" in listing, f"the artifact is not under the store's prefix: {listing[:500]!r}"
    api(state, "POST", "/v1/tenants/acme/deployments", owner, {"name": "adder", "model": "adder", "replicas": 3},
        expect=201)

    def ready(pred=lambda d: True):
        d = api(state, "GET", "/v1/tenants/acme/deployments/adder", owner)
        serving = [r for r in d["replica_status"] if r["state"] == "ready" and r["serving"]]
        return d if d["state"] == "ready" and len(serving) == d["replicas"] and pred(d) else None

    d = wait_until(ready, 60, "3 replicas ready")
    assert {r["worker_id"] for r in d["replica_status"]} == {"worker-0", "worker-1", "worker-2"}, d["replica_status"]

    cps = state["control_planes"]
    assert leader_log(cps[0]) and not leader_log(cps[1]), "control-plane-0 leads at first, control-plane-1 waits"

    load = Load(state, "acme", owner, keys["inference"], "adder")
    if load.via_gateway:
        gateway = load.endpoints[0]
        wait_until(lambda: load.attempt(gateway) is None, 30, "the gateway routes to the deployment")
    load.start()
    try:
        wait_until(lambda: len(load.ok) > 50, 20, "load running")
        time.sleep(2)
        before = len(load.ok)
        # The leader and a worker holding a replica die at the same moment.
        victim = next(w for w in state["workers"] if w["id"] == "worker-1")
        killed_at = time.monotonic()
        os.kill(cps[0]["pid"], signal.SIGKILL)
        os.kill(victim["pid"], signal.SIGKILL)

        wait_until(lambda: leader_log(cps[1]), 20, "control-plane-1 takes the lead")
        took_lead = time.monotonic() - killed_at
        moved = wait_until(lambda: ready(lambda d: all(r["worker_id"] != "worker-1" for r in d["replica_status"])),
                           60, "the lost worker's replica placed again")
        replaced = time.monotonic() - killed_at
        time.sleep(3)  # serving on the new placement
    finally:
        load.finish()

    after = len(load.ok) - before
    print(f"\nrehearsal ({'gateway' if load.via_gateway else 'clients to the workers'}): "
          f"{len(load.ok)} requests answered ({after} after the kills), {load.retried} retried on another replica, "
          f"{len(load.failed)} failed after retrying; control-plane-1 led {took_lead:.2f} s after the kill, "
          f"the replica ran elsewhere after {replaced:.2f} s; longest pause in answers after the kill "
          f"{load.longest_gap(killed_at):.2f} s")
    assert not load.failed, f"requests failed even on another replica: {load.failed[:5]}"
    assert after > 100, "serving did not go on after the kills"
    assert load.longest_gap(killed_at) < 3.0, "answers stopped for more than 3 s"
    assert sorted(r["worker_id"] for r in moved["replica_status"]) != [], moved
    events = api(state, "GET", "/v1/tenants/acme/deployments/adder/events", owner)["events"]
    assert any("lost" in (e["kind"] or "") or "lost" in (e.get("message") or "") for e in events), events
    # The new leader's scheduler is what moved it: only the leader ticks.
    metrics = urllib.request.urlopen(f"{cps[1]['url']}/metrics", timeout=10).read().decode()
    ticks = sum(float(v) for v in re.findall(r'^tessera_scheduler_ticks_total\{[^}]*\} (\S+)$', metrics, re.M))
    assert ticks > 0, "control-plane-1 never ticked"
