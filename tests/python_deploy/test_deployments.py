"""Deploy onto three worker processes and call the model with tenant credentials through
tritonclient; tenants, roles and failover."""

from __future__ import annotations

import os
import shlex
import subprocess
import time

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conftest import ApiError, infer_grpc, infer_http, marker_model, wait_until

X = np.arange(8, dtype=np.float32).reshape(2, 4)


def deploy(cluster, tenant, key, name="adder", model="adder", **fields):
    body = {"name": name, "model": model, **fields}
    return cluster.api("POST", f"/v1/tenants/{tenant}/deployments", key, body, expect=201)


@pytest.fixture
def two_tenants(make_cluster):
    cluster = make_cluster(3)
    acme = cluster.create_tenant("acme")
    globex = cluster.create_tenant("globex")
    cluster.push_version("acme", acme["tenant-admin"], "adder", marker_model(1.0))
    # Same model name in another tenant, different outputs: names resolve per tenant.
    cluster.push_version("globex", globex["tenant-admin"], "adder", marker_model(50.0))
    return cluster, acme, globex


def test_deploy_and_infer_with_tenant_credentials(two_tenants):
    cluster, acme, globex = two_tenants
    created = deploy(cluster, "acme", acme["tenant-admin"], replicas=2)
    assert created["model"] == "adder" and created["replicas"] == 2 and created["profile"] == "cpu"
    d = cluster.wait_ready("acme", acme["tenant-admin"], "adder")
    workers = {r["worker_id"] for r in d["replica_status"]}
    assert len(workers) == 2, f"replicas should spread over two workers: {d['replica_status']}"
    assert d["serving_version"] == 1

    for r in d["replica_status"]:
        # API key over HTTP, access token (JWT) over gRPC.
        np.testing.assert_allclose(infer_http(r["http_endpoint"], acme["inference"], "adder", X), X + 1.0)
        token = cluster.token(acme["inference"])
        np.testing.assert_allclose(infer_grpc(r["grpc_endpoint"], token, "adder", X), X + 1.0)

    # The other tenant deploys the same model name; each tenant reaches its own.
    deploy(cluster, "globex", globex["tenant-admin"])
    g = cluster.wait_ready("globex", globex["tenant-admin"], "adder")
    g_endpoint = g["replica_status"][0]["http_endpoint"]
    np.testing.assert_allclose(infer_http(g_endpoint, globex["inference"], "adder", X), X + 50.0)
    # A slice serves one tenant: globex never shares acme's slices.
    acme_slices = {(r["worker_id"], r["slice_id"]) for r in d["replica_status"]}
    assert (g["replica_status"][0]["worker_id"], g["replica_status"][0]["slice_id"]) not in acme_slices

    events = cluster.api("GET", "/v1/tenants/acme/deployments/adder/events", acme["tenant-admin"])["events"]
    assert any(e["kind"] == "placed" for e in events), events


def test_cross_tenant_and_missing_credentials(two_tenants):
    cluster, acme, globex = two_tenants
    deploy(cluster, "acme", acme["tenant-admin"], replicas=1)
    r = cluster.wait_ready("acme", acme["tenant-admin"], "adder")["replica_status"][0]
    host = r["http_endpoint"].split("://", 1)[1]

    # globex's key on acme's worker: globex has no deployed 'adder' there -> 404, not acme's model.
    with pytest.raises(InferenceServerException) as e:
        infer_http(r["http_endpoint"], globex["inference"], "adder", X)
    assert "404" in str(e.value.status()) or "unknown model" in str(e.value).lower(), str(e.value)
    with pytest.raises(InferenceServerException) as e:
        infer_grpc(r["grpc_endpoint"], globex["inference"], "adder", X)
    assert e.value.status() == "StatusCode.NOT_FOUND", e.value.status()

    # No credential, a malformed one, a revoked-looking random key: 401 / UNAUTHENTICATED.
    client = httpclient.InferenceServerClient(host)
    assert client.is_server_live()  # health stays open
    for headers in ({}, {"Authorization": "Bearer nonsense"}, {"Authorization": "Basic abc"}):
        with pytest.raises(InferenceServerException) as e:
            client.get_model_metadata("adder", headers=headers)
        assert str(e.value.status()) == "401", (headers, e.value)
    gclient = grpcclient.InferenceServerClient(r["grpc_endpoint"])
    with pytest.raises(InferenceServerException) as e:
        gclient.get_model_metadata("adder")
    assert e.value.status() == "StatusCode.UNAUTHENTICATED"

    # The inference key reads metadata but may not control the repository.
    meta = client.get_model_metadata("adder", headers={"Authorization": f"Bearer {acme['inference']}"})
    assert meta["name"] == "adder" and meta["versions"] == ["1"]
    with pytest.raises(InferenceServerException) as e:
        client.get_model_repository_index(headers={"Authorization": f"Bearer {acme['inference']}"})
    assert str(e.value.status()) == "403"


def test_roles_on_the_deployments_api(two_tenants):
    cluster, acme, globex = two_tenants
    with pytest.raises(ApiError) as e:
        deploy(cluster, "acme", acme["inference"])
    assert e.value.status == 403, e.value
    with pytest.raises(ApiError) as e:
        deploy(cluster, "acme", globex["tenant-admin"])
    assert e.value.status == 404, e.value
    with pytest.raises(ApiError) as e:
        deploy(cluster, "acme", acme["tenant-admin"], model="missing")
    assert e.value.status == 404, e.value
    with pytest.raises(ApiError) as e:
        deploy(cluster, "acme", acme["tenant-admin"], replicas=-1)
    assert e.value.status in (400, 422), e.value
    deploy(cluster, "acme", acme["tenant-admin"])
    with pytest.raises(ApiError) as e:
        deploy(cluster, "acme", acme["tenant-admin"], name="second")
    assert e.value.status == 409, e.value
    listed = cluster.api("GET", "/v1/tenants/acme/deployments", acme["tenant-admin"])["deployments"]
    assert [d["name"] for d in listed] == ["adder"]
    assert cluster.api("GET", "/v1/tenants/globex/deployments", globex["tenant-admin"])["deployments"] == []


def test_replica_quota(make_cluster):
    cluster = make_cluster(1)
    keys = cluster.create_tenant("small", replicas=2)
    cluster.push_version("small", keys["tenant-admin"], "adder", marker_model(1.0))
    with pytest.raises(ApiError) as e:
        deploy(cluster, "small", keys["tenant-admin"], replicas=3)
    assert e.value.status in (403, 409, 429) and "replicas" in e.value.body, e.value


def test_killed_worker_replicas_move_and_workers_survive_the_control_plane(make_cluster):
    cluster = make_cluster(3, worker_args=["--key-cache-secs", "1"])
    acme = cluster.create_tenant("acme")
    cluster.push_version("acme", acme["tenant-admin"], "adder", marker_model(1.0))
    deploy(cluster, "acme", acme["tenant-admin"], replicas=1)
    d = cluster.wait_ready("acme", acme["tenant-admin"], "adder")
    victim = d["replica_status"][0]
    cluster.workers[cluster.worker_by_http(victim["http_endpoint"])].kill()
    killed_at = time.monotonic()

    moved = cluster.wait_ready(
        "acme", acme["tenant-admin"], "adder", timeout_s=60,
        pred=lambda d: all(r["worker_id"] != victim["worker_id"] for r in d["replica_status"]),
    )
    elapsed = time.monotonic() - killed_at
    print(f"\nfailover: replica ready on another worker {elapsed:.2f} s after SIGKILL")
    r = moved["replica_status"][0]
    np.testing.assert_allclose(infer_http(r["http_endpoint"], acme["inference"], "adder", X), X + 1.0)
    events = cluster.api("GET", "/v1/tenants/acme/deployments/adder/events", acme["tenant-admin"])["events"]
    assert any("lost" in e["kind"] or "lost" in (e["message"] or "") for e in events), events

    # Control plane down: the worker keeps serving with the credentials it has seen, past the
    # key cache's freshness (1 s) because the control plane cannot be asked.
    token = cluster.token(acme["inference"])
    np.testing.assert_allclose(infer_grpc(r["grpc_endpoint"], token, "adder", X), X + 1.0)
    cluster.stop_control_plane()
    time.sleep(2.5)
    for _ in range(5):
        np.testing.assert_allclose(infer_http(r["http_endpoint"], acme["inference"], "adder", X), X + 1.0)
        np.testing.assert_allclose(infer_grpc(r["grpc_endpoint"], token, "adder", X), X + 1.0)

    # A worker restarted during the outage serves its saved assignments from its artifact
    # cache, and verifies access tokens with the token keys it saved.
    index = cluster.worker_by_http(r["http_endpoint"])
    cluster.workers[index].terminate()
    cluster.start_worker(index, wait_registered=False)
    restarted = cluster.workers[index]
    restarted.wait_for(lambda: restarted.saw("model version ready"), "saved assignments loaded")
    endpoint = f"http://{restarted.addrs['http']}"
    np.testing.assert_allclose(infer_http(endpoint, token, "adder", X), X + 1.0)

    # Back up: the workers reconnect and the deployment is still ready where it was.
    cluster.start_control_plane()
    again = cluster.wait_ready("acme", acme["tenant-admin"], "adder", timeout_s=30,
                               pred=lambda d: d["replica_status"][0]["http_endpoint"] == endpoint)
    assert again["replica_status"][0]["worker_id"] == r["worker_id"]


def test_workers_keep_serving_while_postgres_is_down(make_cluster):
    cluster = make_cluster(2)
    acme = cluster.create_tenant("acme")
    cluster.push_version("acme", acme["tenant-admin"], "adder", marker_model(1.0))
    deploy(cluster, "acme", acme["tenant-admin"], replicas=1)
    r = cluster.wait_ready("acme", acme["tenant-admin"], "adder")["replica_status"][0]
    token = cluster.token(acme["inference"])
    np.testing.assert_allclose(infer_http(r["http_endpoint"], acme["inference"], "adder", X), X + 1.0)

    # The registry's database refuses connections and drops the open ones: the control plane
    # is up but cannot read or write anything.
    cluster._psql(f"ALTER DATABASE {cluster.db_name} ALLOW_CONNECTIONS false")
    cluster._psql(f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{cluster.db_name}'")
    try:
        with pytest.raises(ApiError) as e:
            cluster.api("GET", "/v1/tenants/acme/deployments/adder", acme["tenant-admin"])
        assert e.value.status == 503, e.value
        time.sleep(3)  # longer than the worker-lost timeout: nobody may be declared lost for it
        for _ in range(5):
            np.testing.assert_allclose(infer_http(r["http_endpoint"], acme["inference"], "adder", X), X + 1.0)
            np.testing.assert_allclose(infer_grpc(r["grpc_endpoint"], token, "adder", X), X + 1.0)
    finally:
        cluster._psql(f"ALTER DATABASE {cluster.db_name} ALLOW_CONNECTIONS true")

    # Back: the replica stays where it was (the outage did not make its worker "lost").
    again = cluster.wait_ready("acme", acme["tenant-admin"], "adder", timeout_s=30)
    assert again["replica_status"][0]["worker_id"] == r["worker_id"]
    events = cluster.api("GET", "/v1/tenants/acme/deployments/adder/events", acme["tenant-admin"])["events"]
    assert not any(e["kind"] == "worker_lost" for e in events), events


@pytest.mark.skipif(not os.environ.get("PERF_ANALYZER"), reason="PERF_ANALYZER is not set: perf_analyzer was NOT run")
def test_perf_analyzer_runs_against_a_deployment_with_an_inference_key(make_cluster, tmp_path):
    """perf_analyzer reads the model's config and statistics with the key it infers with."""
    cluster = make_cluster(1)
    acme = cluster.create_tenant("acme")
    cluster.push_version("acme", acme["tenant-admin"], "adder", marker_model(1.0))
    deploy(cluster, "acme", acme["tenant-admin"])
    r = cluster.wait_ready("acme", acme["tenant-admin"], "adder")["replica_status"][0]
    for protocol, url in (("http", r["http_endpoint"].split("://", 1)[1]), ("grpc", r["grpc_endpoint"])):
        cmd = shlex.split(os.environ["PERF_ANALYZER"]) + [
            "-m", "adder", "-u", url, "-i", protocol,
            # gRPC metadata keys are lower case; HTTP takes either.
            "-H", f"authorization: Bearer {acme['inference']}",
            "--concurrency-range", "1:1", "--measurement-mode", "count_windows",
            # What is checked is access, not a stable number: a loaded CI machine may swing
            # more than 2x between windows, so any spread passes (as bench/compare.py retries).
            "--measurement-request-count", "100", "--stability-percentage", "1000", "--max-trials", "4",
        ]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        out = p.stdout + p.stderr
        assert p.returncode == 0, f"perf_analyzer ({protocol}) exited {p.returncode}:\n{out[-3000:]}"
        # The server-side breakdown comes from the statistics an inference key may now read.
        assert "Server:" in out and "compute infer" in out.lower(), out[-3000:]
