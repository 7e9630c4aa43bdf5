"""Rollouts without failed requests: steady traffic while an alias moves to a new version and
back; every request succeeds and the answers switch from one version's outputs to the other's."""

from __future__ import annotations

import threading
import time

import numpy as np
import tritonclient.http as httpclient

from conftest import marker_model, wait_until

X = np.zeros((1, 4), dtype=np.float32)


class Load:
    """Back-to-back tritonclient HTTP requests on one connection, recording each answer."""

    def __init__(self, endpoint: str, key: str, model: str):
        self.client = httpclient.InferenceServerClient(endpoint.split("://", 1)[1])
        self.key, self.model = key, model
        self.markers: list = []
        self.failures: list = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self):
        inp = httpclient.InferInput("INPUT0", [1, 4], "FP32")
        inp.set_data_from_numpy(X, binary_data=True)
        while not self.stop.is_set():
            try:
                res = self.client.infer(self.model, [inp], headers={"Authorization": f"Bearer {self.key}"})
                self.markers.append(float(res.as_numpy("OUTPUT0")[0][0]))
            except Exception as e:  # noqa: BLE001 - every failure is recorded and asserted on
                self.failures.append(repr(e))

    def finish(self):
        self.stop.set()
        self.thread.join(30)
        self.client.close()


def test_alias_rollout_and_rollback_fail_no_request(make_cluster):
    cluster = make_cluster(2)
    keys = cluster.create_tenant("acme")
    admin = keys["tenant-admin"]
    assert cluster.push_version("acme", admin, "marker", marker_model(1.0)) == 1
    assert cluster.push_version("acme", admin, "marker", marker_model(2.0)) == 2
    cluster.api("PUT", "/v1/tenants/acme/models/marker/aliases/production", admin, {"version": 1})
    cluster.api("POST", "/v1/tenants/acme/deployments", admin,
                {"name": "marker", "model": "marker", "alias": "production", "replicas": 1}, expect=201)
    d = cluster.wait_ready("acme", admin, "marker")
    assert d["alias"] == "production" and d["serving_version"] == 1
    endpoint = d["replica_status"][0]["http_endpoint"]

    load = Load(endpoint, keys["inference"], "marker")
    try:
        wait_until(lambda: len(load.markers) > 50, 30, "traffic before the rollout")
        started = time.monotonic()
        cluster.api("PUT", "/v1/tenants/acme/models/marker/aliases/production", admin, {"version": 2})
        rolled = cluster.wait_ready(
            "acme", admin, "marker", timeout_s=60,
            pred=lambda d: d["serving_version"] == 2 and all(r["version"] == 2 for r in d["replica_status"]),
        )
        print(f"\nrollout 1 -> 2 finished in {time.monotonic() - started:.2f} s")
        assert rolled["replica_status"][0]["http_endpoint"] == endpoint, "the new replica replaced the old in place"
        count = len(load.markers)
        wait_until(lambda: len(load.markers) > count + 50, 30, "traffic after the rollout")

        # Rollback: move the alias back.
        cluster.api("PUT", "/v1/tenants/acme/models/marker/aliases/production", admin, {"version": 1})
        cluster.wait_ready(
            "acme", admin, "marker", timeout_s=60,
            pred=lambda d: d["serving_version"] == 1 and all(r["version"] == 1 for r in d["replica_status"]),
        )
        count = len(load.markers)
        wait_until(lambda: len(load.markers) > count + 50, 30, "traffic after the rollback")
    finally:
        load.finish()

    assert load.failures == [], load.failures[:5]
    seen = load.markers
    # Answers switch 1 -> 2 -> 1, each switch once (no flapping between versions).
    runs = [seen[0]] + [b for a, b in zip(seen, seen[1:]) if a != b]
    assert runs == [1.0, 2.0, 1.0], runs
    print(f"{len(seen)} requests during rollout and rollback, 0 failed")

    events = cluster.api("GET", "/v1/tenants/acme/deployments/marker/events", admin)["events"]
    kinds = [e["kind"] for e in events]
    assert any("rollout" in k for k in kinds), kinds
