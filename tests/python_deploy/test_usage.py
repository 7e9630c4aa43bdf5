"""Usage metering loses nothing: what the control plane stores equals exactly what clients saw
succeed and fail, per tenant and model, across a worker SIGKILL and a control-plane restart."""

from __future__ import annotations

import time
from collections import Counter

import numpy as np
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conftest import marker_model, wait_until

SHIP = ["--usage-ship-interval-ms", "300"]


class Client:
    """Sends requests to workers and tallies what it saw, per (tenant, model)."""

    def __init__(self):
        self.ok = Counter()
        self.failed = Counter()
        self.rows = Counter()

    def send(self, endpoint: str, tenant: str, key: str, model: str, count: int, fail_every: int = 5):
        client = httpclient.InferenceServerClient(endpoint.split("://", 1)[1])
        headers = {"Authorization": f"Bearer {key}"}
        try:
            for i in range(count):
                bad = i % fail_every == fail_every - 1
                rows = 1 + i % 3
                x = np.ones((rows, 3 if bad else 4), dtype=np.float32)  # wrong shape: a 400 from the model
                inp = httpclient.InferInput("INPUT0", list(x.shape), "FP32")
                inp.set_data_from_numpy(x, binary_data=True)
                try:
                    client.infer(model, [inp], headers=headers)
                    self.ok[(tenant, model)] += 1
                    self.rows[(tenant, model)] += rows
                except InferenceServerException as e:
                    assert bad, f"unexpected failure: {e}"
                    self.failed[(tenant, model)] += 1
        finally:
            client.close()


def stored_usage(cluster, tenant, key):
    rows = cluster.api("GET", f"/v1/tenants/{tenant}/usage?group_by=model", key)["usage"]
    return {r["model"]: r for r in rows}


def test_usage_matches_what_clients_saw_across_a_worker_kill_and_a_control_plane_restart(make_cluster):
    cluster = make_cluster(2, worker_args=SHIP)
    tenants = {t: cluster.create_tenant(t) for t in ("acme", "globex")}
    for t, keys in tenants.items():
        for model, marker in (("alpha", 1.0), ("beta", 2.0)):
            cluster.push_version(t, keys["tenant-admin"], model, marker_model(marker))
            cluster.api("POST", f"/v1/tenants/{t}/deployments", keys["tenant-admin"],
                        {"name": model, "model": model, "replicas": 1}, expect=201)
    endpoints = {}
    for t, keys in tenants.items():
        for model in ("alpha", "beta"):
            d = cluster.wait_ready(t, keys["tenant-admin"], model)
            endpoints[(t, model)] = d["replica_status"][0]["http_endpoint"]

    client = Client()
    for (t, model), endpoint in endpoints.items():
        client.send(endpoint, t, tenants[t]["inference"], model, 60)

    # SIGKILL a worker that served traffic: its spool survives on disk.
    victim_endpoint = endpoints[("acme", "alpha")]
    victim = cluster.worker_by_http(victim_endpoint)
    cluster.workers[victim].kill()
    # Meanwhile the control plane restarts while the other worker keeps serving and metering.
    cluster.stop_control_plane()
    for (t, model), endpoint in endpoints.items():
        if endpoint != victim_endpoint:
            client.send(endpoint, t, tenants[t]["inference"], model, 40)
    cluster.start_control_plane()
    # The killed worker comes back on the same data directory and ships what it had not.
    cluster.start_worker(victim)

    # More traffic wherever the deployments are now.
    for t, keys in tenants.items():
        for model in ("alpha", "beta"):
            d = cluster.wait_ready(t, keys["tenant-admin"], model, timeout_s=60)
            client.send(d["replica_status"][0]["http_endpoint"], t, keys["inference"], model, 30)

    def matches():
        for t, keys in tenants.items():
            usage = stored_usage(cluster, t, keys["tenant-admin"])
            for model in ("alpha", "beta"):
                u = usage.get(model)
                want = (client.ok[(t, model)], client.failed[(t, model)], client.rows[(t, model)])
                if u is None or (u["requests"], u["failures"], u["inferences"]) != want:
                    return False
        return True

    try:
        wait_until(matches, 60, "stored usage to equal what the clients saw")
    finally:
        for t, keys in tenants.items():
            print(t, stored_usage(cluster, t, keys["tenant-admin"]))
        print("client ok", dict(client.ok), "failed", dict(client.failed))
    # Stays equal: nothing is stored twice later.
    time.sleep(1.5)
    assert matches()

    # Each tenant sees only its own usage; another tenant's route is 404.
    acme_admin = tenants["acme"]["tenant-admin"]
    for path in ("/v1/tenants/globex/usage", "/v1/tenants/globex/invoices"):
        status = None
        try:
            cluster.api("GET", path, acme_admin)
        except Exception as e:  # noqa: BLE001 - ApiError carries the status
            status = getattr(e, "status", None)
        assert status == 404, (path, status)


def test_worker_metrics_carry_tenant_labels(make_cluster):
    cluster = make_cluster(1, worker_args=SHIP)
    keys = cluster.create_tenant("acme")
    cluster.push_version("acme", keys["tenant-admin"], "alpha", marker_model(1.0))
    cluster.api("POST", "/v1/tenants/acme/deployments", keys["tenant-admin"],
                {"name": "alpha", "model": "alpha"}, expect=201)
    d = cluster.wait_ready("acme", keys["tenant-admin"], "alpha")
    Client().send(d["replica_status"][0]["http_endpoint"], "acme", keys["inference"], "alpha", 10)
    tenant_id = cluster.api("GET", "/v1/tenants/acme", keys["tenant-admin"])["id"]
    import urllib.request

    metrics_addr = cluster.workers[0].addrs["metrics"]
    text = urllib.request.urlopen(f"http://{metrics_addr}/metrics", timeout=10).read().decode()
    lines = [ln for ln in text.splitlines() if ln.startswith("nv_inference_")]
    assert lines, text[:2000]
    for ln in lines:
        if "model=" in ln:
            assert f'tenant="{tenant_id}"' in ln, ln
    assert any(ln.startswith("nv_inference_request_success{") and 'model="alpha"' in ln for ln in lines)
    assert "_bucket{" in text
