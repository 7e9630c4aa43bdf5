"""Trace settings on a multi-tenant worker: the whole worker's, so only a platform admin reads or
changes them (tenants get 403 / PERMISSION_DENIED), and a platform admin names a tenant's model by
the worker's key for it, ``<tenant id>/<model>``; the tenant's requests to that model are then
traced into the worker's trace file with the model's plain name."""

from __future__ import annotations

import json
from pathlib import Path
from urllib.parse import urlparse

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conftest import infer_http, marker_model, wait_until


def cluster_get(host_port: str, path: str, key: str) -> dict:
    import urllib.request

    req = urllib.request.Request(f"http://{host_port}{path}", headers={"Authorization": f"Bearer {key}"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read())


def test_trace_settings_are_a_platform_admins_on_a_worker(make_cluster, tmp_path):
    trace_file = tmp_path / "worker-trace.json"
    cluster = make_cluster(1, worker_args=["--trace-config", f"triton,file={trace_file}"])
    keys = cluster.create_tenant("acme")
    admin = keys["tenant-admin"]
    cluster.push_version("acme", admin, "adder", marker_model(1.0))
    cluster.api("POST", "/v1/tenants/acme/deployments", admin, {"name": "adder", "model": "adder"}, expect=201)
    endpoint = cluster.wait_ready("acme", admin, "adder")["replica_status"][0]
    http_url = urlparse(endpoint["http_endpoint"]).netloc
    http = httpclient.InferenceServerClient(http_url)
    grpc = grpcclient.InferenceServerClient(endpoint["grpc_endpoint"])
    tenant = {"Authorization": f"Bearer {keys['inference']}"}
    tenant_admin = {"Authorization": f"Bearer {admin}"}
    platform = {"Authorization": f"Bearer {cluster.admin_key}"}
    try:
        for headers in (tenant, tenant_admin):
            with pytest.raises(InferenceServerException) as e:
                http.get_trace_settings(headers=headers)
            assert e.value.status() == "403"
            with pytest.raises(InferenceServerException) as e:
                http.update_trace_settings(model_name="adder", settings={"trace_rate": "1"}, headers=headers)
            assert e.value.status() == "403"
        grpc_tenant = {"authorization": f"Bearer {cluster.token(keys['inference'])}"}
        with pytest.raises(InferenceServerException) as e:
            grpc.update_trace_settings(settings={"trace_level": ["TIMESTAMPS"]}, headers=grpc_tenant)
        assert e.value.status() == "StatusCode.PERMISSION_DENIED"

        assert http.get_trace_settings(headers=platform)["trace_file"] == str(trace_file)
        tenant_id = cluster.api("GET", "/v1/tenants/acme", cluster.admin_key)["id"]
        model_key = f"{tenant_id}/adder"
        changed = http.update_trace_settings(model_name=model_key, headers=platform,
                                             settings={"trace_level": ["TIMESTAMPS"], "trace_rate": "1"})
        assert changed["trace_level"] == ["TIMESTAMPS"]
        assert http.get_trace_settings(headers=platform)["trace_level"] == ["OFF"]
        grpc_admin = {"authorization": f"Bearer {cluster.token(cluster.admin_key)}"}
        got = grpc.get_trace_settings(model_name=model_key, headers=grpc_admin, as_json=True)
        assert got["settings"]["trace_rate"]["value"] == ["1"]
        # The key may also travel escaped in the path.
        escaped = cluster_get(http_url, f"/v2/models/{tenant_id}%2Fadder/trace/setting", cluster.admin_key)
        assert escaped["trace_level"] == ["TIMESTAMPS"]

        infer_http(endpoint["http_endpoint"], keys["inference"], "adder", np.ones((1, 4), dtype=np.float32))

        def traced():
            if not Path(trace_file).exists():
                return None
            infos = [o for o in json.loads(Path(trace_file).read_text()) if "model_name" in o]
            return infos or None

        infos = wait_until(traced, 15, "the tenant's request in the worker's trace file")
        assert [(o["model_name"], o["model_version"]) for o in infos] == [("adder", 1)]
        # The model runs in the tenant's runner process; its queue and compute steps came back.
        steps = [t["name"] for o in json.loads(Path(trace_file).read_text()) for t in o.get("timestamps", [])]
        for step in ("QUEUE_START", "COMPUTE_START", "COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START", "COMPUTE_END"):
            assert step in steps, steps
    finally:
        http.close()
        grpc.close()
