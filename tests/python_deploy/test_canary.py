"""Canaries on real workers: the canary's replica loads on a worker beside the stable one and
answers for its version, and promotion rolls the stable replicas out to it with steady traffic
failing no request, the deployment ending on the canary's version."""

from __future__ import annotations

import numpy as np

from conftest import infer_http, marker_model, wait_until
from test_rollout import Load

X = np.zeros((1, 4), dtype=np.float32)


def split(d: dict) -> list:
    return [(t["version"], t["weight"], t["ready_replicas"]) for t in d["traffic"]]


def test_canary_serves_its_version_and_promotion_fails_no_request(make_cluster):
    cluster = make_cluster(2)
    keys = cluster.create_tenant("acme")
    admin = keys["tenant-admin"]
    assert cluster.push_version("acme", admin, "marker", marker_model(1.0)) == 1
    assert cluster.push_version("acme", admin, "marker", marker_model(2.0)) == 2
    cluster.api("POST", "/v1/tenants/acme/deployments", admin,
                {"name": "marker", "model": "marker", "version": 1, "replicas": 1}, expect=201)
    d = cluster.wait_ready("acme", admin, "marker")
    stable = d["replica_status"][0]
    canary_path = "/v1/tenants/acme/deployments/marker/canary"

    cluster.api("PUT", canary_path, admin, {"version": 2, "weight": 20})

    def canary_ready():
        d = cluster.deployment("acme", admin, "marker")
        return d if split(d) == [(1, 80, 1), (2, 20, 1)] else None

    d = wait_until(canary_ready, 60, "the canary's replica ready")
    canary = [r for r in d["replica_status"] if r["canary"]]
    assert len(canary) == 1 and canary[0]["version"] == 2 and canary[0]["serving"], d
    assert canary[0]["worker_id"] != stable["worker_id"], "spread away from the stable replica"
    assert d["state"] == "ready" and d["serving_version"] == 1
    out = infer_http(canary[0]["http_endpoint"], keys["inference"], "marker", X, version="2")
    assert float(out[0][0]) == 2.0
    out = infer_http(stable["http_endpoint"], keys["inference"], "marker", X)
    assert float(out[0][0]) == 1.0, "the stable replica's worker still answers with version 1"

    load = Load(stable["http_endpoint"], keys["inference"], "marker")
    try:
        wait_until(lambda: len(load.markers) > 50, 30, "traffic before the promotion")
        promoted = cluster.api("POST", f"{canary_path}/promote", admin, {})
        assert promoted["version"] == 2 and promoted["canary"] is None
        d = cluster.wait_ready("acme", admin, "marker", pred=lambda d: (
            d["serving_version"] == 2 and split(d) == [(2, 100, 1)]
            and not any(r["canary"] for r in d["replica_status"])))
        wait_until(lambda: load.markers and load.markers[-1] == 2.0, 30, "answers from version 2")
        n = len(load.markers)
        wait_until(lambda: len(load.markers) > n + 50, 30, "traffic after the promotion")
    finally:
        load.finish()
    assert not load.failures, load.failures[:5]
    assert load.markers[0] == 1.0 and load.markers[-1] == 2.0
    assert set(load.markers) == {1.0, 2.0}
    events = cluster.api("GET", "/v1/tenants/acme/deployments/marker/events", admin)["events"]
    kinds = {e["kind"] for e in events}
    assert {"canary_set", "canary_serving", "canary_promoted", "canary_cleared"} <= kinds, kinds
