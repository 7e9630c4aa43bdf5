"""Revocation reaches running credentials: revoking an API key or disabling a user stops the access
tokens already issued for it, and the API key itself where workers and gateways cached it, within
2 s on the control plane, a worker and a gateway. Real processes on loopback: two control-plane
replicas on one database (the worker and the gateway follow the first; revocations are made on
either), a worker, a gateway; HTTP and gRPC inference."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request

import numpy as np
import pytest
from tritonclient.utils import InferenceServerException

from conftest import CONTROL_PLANE_TIMINGS, Proc, free_port, infer_grpc, marker_model, tessera_bin, wait_until

X = np.zeros((1, 4), dtype=np.float32)
INFER_BODY = json.dumps({"inputs": [{"name": "INPUT0", "shape": [1, 4], "datatype": "FP32",
                                     "data": [0.0, 0.0, 0.0, 0.0]}]}).encode()
# The bound the README states for a connected worker or gateway.
BOUND_S = 2.0


def call(url: str, credential: str, body: bytes | None = None) -> tuple[int, str]:
    req = urllib.request.Request(url, data=body, method="POST" if body is not None else "GET",
                                 headers={"Authorization": f"Bearer {credential}", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def infer(base: str, credential: str) -> tuple[int, str]:
    return call(f"{base}/v2/models/marker/infer", credential, INFER_BODY)


def whoami(cp_url: str, credential: str) -> tuple[int, str]:
    return call(f"{cp_url}/v1/whoami", credential)


def refused_within(what: str, attempt, since: float, message: str | None = None) -> float:
    """Polls `attempt` until it answers 401 (with `message` in the body, if given); returns the
    seconds since `since`, failing if that took longer than the bound."""
    def refused():
        code, body = attempt()
        return code == 401 and (message is None or message in body)

    wait_until(refused, BOUND_S + 3, f"{what} refused", interval_s=0.02)
    took = time.monotonic() - since
    assert took <= BOUND_S, f"{what} refused only after {took:.2f}s (bound {BOUND_S}s)"
    return took


def start_replica(cluster) -> tuple[Proc, str]:
    """A second control-plane replica on the cluster's database."""
    port = free_port()
    cmd = [
        tessera_bin(), "control-plane",
        "--listen", f"127.0.0.1:{port}",
        "--database-url", cluster.db_url,
        "--object-store", str(cluster.workdir / "artifacts"),
        "--bootstrap-admin-key", cluster.admin_key,
        f"--worker-token={cluster.worker_token}",
        f"--gateway-token={cluster.gateway_token}",
        *CONTROL_PLANE_TIMINGS,
    ]
    replica = Proc("control-plane-2", cmd, cluster.workdir / "control-plane-2.log")
    replica.wait_for(lambda: "http" in replica.addrs, "second control plane listening")
    return replica, f"http://127.0.0.1:{port}"


def metric(url: str, line_prefix: str) -> float:
    with urllib.request.urlopen(url, timeout=5) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(line_prefix + " "):
                return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no {line_prefix} at {url}")


@pytest.fixture
def deployed(make_cluster):
    """One worker serving acme's marker model, a gateway routing to it, a second control-plane
    replica; yields (cluster, tenant-admin key, worker URL, gateway URL, gateway gRPC, replica URL)."""
    cluster = make_cluster(1)
    keys = cluster.create_tenant("acme")
    admin = keys["tenant-admin"]
    cluster.push_version("acme", admin, "marker", marker_model(5.0))
    cluster.api("POST", "/v1/tenants/acme/deployments", admin,
                {"name": "marker", "model": "marker", "version": 1, "replicas": 1}, expect=201)
    cluster.wait_ready("acme", admin, "marker")
    gw = cluster.start_gateway()
    worker = f"http://{cluster.workers[0].addrs['http']}"
    gateway = f"http://{gw.addrs['http']}"
    wait_until(lambda: infer(gateway, keys["inference"])[0] == 200, 20, "the gateway routes to the model")
    replica, replica_url = start_replica(cluster)
    try:
        yield cluster, admin, worker, gateway, gw.addrs["grpc"], replica_url
    finally:
        replica.terminate()


def new_key(cluster, admin: str, user_id: str | None = None) -> tuple[str, str]:
    body = {"name": "app", "role": "inference"}
    if user_id:
        body["user_id"] = user_id
    created = cluster.api("POST", "/v1/tenants/acme/api-keys", admin, body, expect=201)
    return created["api_key"]["id"], created["key"]


def works_everywhere(cluster, worker: str, gateway: str, *credentials: str):
    for credential in credentials:
        assert whoami(cluster.url, credential)[0] == 200
        for base in (worker, gateway):
            code, body = infer(base, credential)
            assert code == 200 and json.loads(body)["outputs"][0]["data"][0] == 5.0, (base, code, body)


def test_a_revoked_key_stops_its_tokens_and_cached_key_on_control_plane_worker_and_gateway(deployed):
    cluster, admin, worker, gateway, gateway_grpc, replica = deployed
    key_id, key = new_key(cluster, admin)
    token = cluster.token(key)
    _, bystander = new_key(cluster, admin)
    bystander_token = cluster.token(bystander)
    # Both keys are now cached on the worker and the gateway.
    works_everywhere(cluster, worker, gateway, key, token, bystander, bystander_token)

    cluster.api("DELETE", f"/v1/tenants/acme/api-keys/{key_id}", admin)
    revoked_at = time.monotonic()
    # The replica that revoked refuses the token at once, saying why.
    code, body = whoami(cluster.url, token)
    assert code == 401 and "revoked" in body, body
    took = {
        "worker token": refused_within("the token on the worker", lambda: infer(worker, token), revoked_at, "revoked"),
        "gateway token": refused_within("the token on the gateway", lambda: infer(gateway, token), revoked_at,
                                        "revoked"),
        "worker key": refused_within("the cached key on the worker", lambda: infer(worker, key), revoked_at),
        "gateway key": refused_within("the cached key on the gateway", lambda: infer(gateway, key), revoked_at),
        "other replica": refused_within("the token on the other replica", lambda: whoami(replica, token),
                                        revoked_at, "revoked"),
    }
    print("refused after (s):", {k: round(v, 3) for k, v in took.items()})
    with pytest.raises(InferenceServerException) as e:
        infer_grpc(gateway_grpc, token, "marker", X)
    assert "UNAUTHENTICATED" in str(e.value.status()) and "revoked" in str(e.value.message())
    # Other credentials are untouched.
    works_everywhere(cluster, worker, gateway, bystander, bystander_token)
    # Workers and gateways expose the list they hold.
    for proc in (cluster.workers[0], cluster.gateways[0]):
        url = f"http://{proc.addrs['metrics']}/metrics"
        assert metric(url, 'tessera_revocation_list_entries{kind="key"}') == 1
        assert metric(url, "tessera_revocation_list_stale_seconds") == 0


def test_a_user_disabled_on_another_replica_loses_their_tokens_and_keys_everywhere(deployed):
    cluster, admin, worker, gateway, _, replica = deployed
    user = cluster.api("POST", "/v1/tenants/acme/users", admin,
                       {"email": "ada@example.com", "name": "Ada", "role": "deployer"}, expect=201)
    _, key = new_key(cluster, admin, user["id"])
    token = cluster.token(key)
    works_everywhere(cluster, worker, gateway, key, token)

    # Disabled through the replica the worker and the gateway are not connected to: the first
    # replica learns of it by polling the registry, then pushes the list.
    req = urllib.request.Request(f"{replica}/v1/tenants/acme/users/{user['id']}", method="DELETE",
                                 headers={"Authorization": f"Bearer {admin}"})
    with urllib.request.urlopen(req, timeout=10) as r:
        disabled = json.loads(r.read().decode())
    assert disabled["keys_revoked"] == 1
    at = time.monotonic()
    code, body = whoami(replica, token)
    assert code == 401 and "revoked" in body, body
    took = {
        "first replica": refused_within("the token on the first replica", lambda: whoami(cluster.url, token), at,
                                        "revoked"),
        "worker token": refused_within("the token on the worker", lambda: infer(worker, token), at, "revoked"),
        "gateway token": refused_within("the token on the gateway", lambda: infer(gateway, token), at, "revoked"),
        "worker key": refused_within("the cached key on the worker", lambda: infer(worker, key), at),
        "gateway key": refused_within("the cached key on the gateway", lambda: infer(gateway, key), at),
    }
    print("refused after (s):", {k: round(v, 3) for k, v in took.items()})


def test_a_worker_keeps_enforcing_the_list_while_the_control_plane_is_down(deployed):
    cluster, admin, worker, _, _, _ = deployed
    key_id, key = new_key(cluster, admin)
    token = cluster.token(key)
    _, other = new_key(cluster, admin)
    other_token = cluster.token(other)
    assert infer(worker, token)[0] == 200 and infer(worker, other_token)[0] == 200
    cluster.api("DELETE", f"/v1/tenants/acme/api-keys/{key_id}", admin)
    refused_within("the token on the worker", lambda: infer(worker, token), time.monotonic(), "revoked")

    cluster.stop_control_plane()
    metrics = f"http://{cluster.workers[0].addrs['metrics']}/metrics"
    wait_until(lambda: metric(metrics, "tessera_revocation_list_stale_seconds") > 0, 20, "the list marked stale")
    # Static stability: the worker serves what it holds, and still refuses the revoked token.
    code, body = infer(worker, token)
    assert code == 401 and "revoked" in body, body
    assert infer(worker, other_token)[0] == 200
