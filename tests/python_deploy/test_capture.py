"""Request/response capture end to end: a deployment with capture on has its requests (sent
with tritonclient over HTTP and gRPC) written as JSON Lines to the tenant's object storage,
listed and downloaded through the API; another tenant gets 404; sample rate 0 captures
nothing; the retention setting is the tenant's own and audited."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request

import numpy as np
import pytest

from conftest import ApiError, infer_grpc, infer_http, marker_model, wait_until

SHIP = ["--usage-ship-interval-ms", "300"]


def download(cluster, path: str, key: str):
    """GET a capture file: (status, content type, body text)."""
    req = urllib.request.Request(cluster.url + path, headers={"Authorization": f"Bearer {key}"})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, resp.headers.get("Content-Type"), resp.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("Content-Type"), e.read().decode()


def captured_records(cluster, tenant: str, key: str, deployment: str):
    base = f"/v1/tenants/{tenant}/deployments/{deployment}/captures"
    records, cursor = [], None
    while True:
        page = cluster.api("GET", base + (f"?limit=2&cursor={cursor}" if cursor else "?limit=2"), key)
        for f in page["files"]:
            assert f["size_bytes"] > 0 and f["last_modified"]
            status, ctype, text = download(cluster, f"{base}/{f['name']}", key)
            assert status == 200, text
            assert ctype == "application/x-ndjson"
            records += [json.loads(line) for line in text.splitlines() if line]
        cursor = page.get("next_cursor")
        if not cursor:
            return records


def test_capture_writes_sampled_requests_to_the_tenants_storage(make_cluster):
    cluster = make_cluster(1, worker_args=SHIP)
    acme = cluster.create_tenant("acme")
    globex = cluster.create_tenant("globex")
    admin = acme["tenant-admin"]
    cluster.push_version("acme", admin, "scorer", marker_model(3.0))
    cluster.push_version("acme", admin, "quiet", marker_model(5.0))
    capture = {"enabled": True, "sample_rate": 1.0, "inputs": True, "outputs": True, "metadata": True,
               "max_record_bytes": 65536}
    created = cluster.api("POST", "/v1/tenants/acme/deployments", admin,
                          {"name": "scorer", "model": "scorer", "replicas": 1, "capture": capture}, expect=201)
    assert created["capture"] == capture
    cluster.api("POST", "/v1/tenants/acme/deployments", admin,
                {"name": "quiet", "model": "quiet", "replicas": 1,
                 "capture": {**capture, "sample_rate": 0.0}}, expect=201)
    scorer = cluster.wait_ready("acme", admin, "scorer")
    quiet = cluster.wait_ready("acme", admin, "quiet")
    http = scorer["replica_status"][0]["http_endpoint"]
    grpc = scorer["replica_status"][0]["grpc_endpoint"]

    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    for _ in range(3):
        np.testing.assert_allclose(infer_http(http, acme["inference"], "scorer", x), x + 3.0)
    np.testing.assert_allclose(infer_grpc(grpc, acme["inference"], "scorer", x), x + 3.0)
    quiet_http = quiet["replica_status"][0]["http_endpoint"]
    for _ in range(3):
        infer_http(quiet_http, acme["inference"], "quiet", x)

    records = wait_until(
        lambda: (lambda r: r if len(r) >= 4 else None)(captured_records(cluster, "acme", admin, "scorer")),
        30, "four captured records")
    assert len(records) == 4, records
    for r in records:
        assert r["model"] == "scorer" and r["version"] == 1 and r["status"] == "ok", r
        assert r["deployment_id"] == scorer["id"]
        assert r["truncated"] is False
        assert r["duration_us"] >= 0 and r["received_at_ms"] > 1_700_000_000_000
        assert r["request_id"], "every record is named (a UUID when the client sent no id)"
        inp = r["request"]["inputs"][0]
        assert (inp["name"], inp["datatype"], inp["shape"]) == ("INPUT0", "FP32", [2, 4])
        assert inp["data"] == x.flatten().tolist()
        out = r["response"]["outputs"][0]
        assert out["name"] == "OUTPUT0" and out["data"] == (x + 3.0).flatten().tolist()
        assert r["request"]["parameters"] is not None

    # Sample rate 0: capture on, nothing captured.
    time.sleep(1.0)
    assert cluster.api("GET", "/v1/tenants/acme/deployments/quiet/captures", admin)["files"] == []

    # Another tenant sees none of it: the deployment and its files are 404.
    other = globex["tenant-admin"]
    for path in ("/v1/tenants/acme/deployments/scorer/captures",
                 f"/v1/tenants/acme/deployments/scorer/captures/{time.strftime('%Y-%m-%d', time.gmtime())}/x.jsonl"):
        status, _, _ = download(cluster, path, other)
        assert status == 404, path
    with pytest.raises(ApiError) as e:
        cluster.api("GET", "/v1/tenants/globex/deployments/scorer/captures", other)
    assert e.value.status == 404
    # An inference-only key may not read captures.
    with pytest.raises(ApiError) as e:
        cluster.api("GET", "/v1/tenants/acme/deployments/scorer/captures", acme["inference"])
    assert e.value.status in (403, 404)
    # A file name that tries to leave its folder is not found.
    status, _, _ = download(cluster, "/v1/tenants/acme/deployments/scorer/captures/2026-12-02/..%2F..%2Fx.jsonl",
                            admin)
    assert status == 404

    # PATCH turns capture off without a rollout; later requests are not captured.
    patched = cluster.api("PATCH", "/v1/tenants/acme/deployments/scorer", admin, {"capture": {"enabled": False}})
    assert patched["capture"]["enabled"] is False
    assert [r["id"] for r in patched["replica_status"]] == [r["id"] for r in scorer["replica_status"]]
    time.sleep(1.5)  # the worker takes the new assignment set
    for _ in range(3):
        infer_http(http, acme["inference"], "scorer", x)
    time.sleep(1.5)
    assert len(captured_records(cluster, "acme", admin, "scorer")) == 4

    # Bad settings are refused with the field named.
    with pytest.raises(ApiError) as e:
        cluster.api("PATCH", "/v1/tenants/acme/deployments/scorer", admin,
                    {"capture": {"enabled": True, "sample_rate": 2}})
    assert e.value.status == 422 and "capture.sample_rate" in str(e.value)

    # Retention: the default, then the tenant's own (audited); out of range refused.
    got = cluster.api("GET", "/v1/tenants/acme/capture-retention", admin)
    assert got == {"days": None, "default_days": 30, "effective_days": 30}
    got = cluster.api("PUT", "/v1/tenants/acme/capture-retention", admin, {"days": 7})
    assert got["effective_days"] == 7
    with pytest.raises(ApiError) as e:
        cluster.api("PUT", "/v1/tenants/acme/capture-retention", admin, {"days": 0})
    assert e.value.status == 422
    audit = cluster.api("GET", "/v1/audit?tenant=acme&action=capture_retention.update", admin)
    assert len(audit["events"]) == 1
