"""The control plane's agent service on a listener of its own (`--agent-listen`), as the Helm
chart runs it so that a network policy can open that port to workers and gateways only: workers
and a gateway connect there and serve, the API's port no longer answers the agent service, and
the agent port answers nothing but it."""

from __future__ import annotations

import urllib.error
import urllib.request

import grpc
import numpy as np

from conftest import infer_grpc, infer_http, marker_model, wait_until

X = np.zeros((1, 4), dtype=np.float32)
AGENT_METHOD = "/tessera.agent.v1.WorkerAgent/GetTokenKeys"


def grpc_status(addr: str, token: str) -> tuple[grpc.StatusCode, str]:
    """The status of one agent call at `addr` (an empty message is a valid GetTokenKeysRequest)."""
    with grpc.insecure_channel(addr) as channel:
        call = channel.unary_unary(AGENT_METHOD, request_serializer=lambda b: b, response_deserializer=lambda b: b)
        try:
            call(b"", metadata=[("authorization", f"Bearer {token}")], timeout=10)
            return grpc.StatusCode.OK, ""
        except grpc.RpcError as e:
            return e.code(), e.details() or ""


def http_status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def test_workers_and_gateways_reach_the_agent_service_on_its_own_port(make_cluster):
    cluster = make_cluster(1, cp_args=["--agent-listen", "127.0.0.1:0"])
    api_addr, agent_addr = cluster.cp.addrs["http"], cluster.cp.addrs["agent"]
    assert api_addr != agent_addr
    assert cluster.agent_url == f"http://{agent_addr}"

    # The worker registered through the agent port (make_cluster waits for it); it serves.
    keys = cluster.create_tenant("acme")
    admin = keys["tenant-admin"]
    cluster.push_version("acme", admin, "marker", marker_model(3.0))
    cluster.api("POST", "/v1/tenants/acme/deployments", admin,
                {"name": "marker", "model": "marker", "replicas": 1}, expect=201)
    d = cluster.wait_ready("acme", admin, "marker")
    assert infer_http(d["replica_status"][0]["http_endpoint"], keys["inference"], "marker", X)[0][0] == 3.0

    # So does a gateway, whose route table and key checks come over the agent port.
    gw = cluster.start_gateway()

    def routed():
        try:
            return infer_grpc(gw.addrs["grpc"], keys["inference"], "marker", X)[0][0] == 3.0
        except Exception:  # noqa: BLE001 - the table may not hold the replica yet
            return False

    wait_until(routed, 20, "the gateway serves the deployment")

    # The agent service answers on its port only; the API answers on its port only.
    assert grpc_status(agent_addr, cluster.worker_token)[0] == grpc.StatusCode.OK
    assert grpc_status(agent_addr, "wrong-token")[0] == grpc.StatusCode.UNAUTHENTICATED
    # A worker pointed at the API port is told where the agent service is.
    code, details = grpc_status(api_addr, cluster.worker_token)
    assert code == grpc.StatusCode.UNIMPLEMENTED and "--agent-listen" in details, (code, details)
    assert http_status(f"http://{api_addr}/healthz") == 200
    assert http_status(f"http://{agent_addr}/healthz") == 404
    assert http_status(f"http://{agent_addr}/v1/tenants") == 404
