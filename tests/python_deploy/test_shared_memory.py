"""System shared memory on a worker started with ``--allow-client-shm``: each tenant registers
and uses regions in a name space of its own, over HTTP and gRPC with tritonclient; another
tenant can neither see, use nor unregister them, and no tenant may name a key outside its
``/<tenant-name>:`` prefix."""

from __future__ import annotations

import os
import uuid
from urllib.parse import urlparse

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

from conftest import marker_model

X = np.arange(8, dtype=np.float32).reshape(2, 4)
BYTES = X.nbytes


def key_for(tenant: str) -> str:
    return f"/{tenant}:e2e-{os.getpid()}-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def objects():
    made = []

    def make(tenant: str, byte_size: int = 2 * BYTES):
        handle = shm.create_shared_memory_region(f"{tenant}-{len(made)}", key_for(tenant), byte_size)
        made.append(handle)
        return handle

    yield make
    for handle in made:
        shm.destroy_shared_memory_region(handle)


def infer_in_shm(client, module, region: str, headers: dict):
    """The marker model with INPUT0 at offset 0 and OUTPUT0 at offset BYTES of `region`."""
    inp = module.InferInput("INPUT0", list(X.shape), "FP32")
    inp.set_shared_memory(region, BYTES)
    out = module.InferRequestedOutput("OUTPUT0")
    out.set_shared_memory(region, BYTES, offset=BYTES)
    return client.infer("adder", [inp], outputs=[out], headers=headers)


def error_of(fn, *args, **kw) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as ei:
        fn(*args, **kw)
    return ei.value


def test_regions_belong_to_the_tenant_that_registered_them(make_cluster, objects):
    cluster = make_cluster(1, worker_args=["--allow-client-shm", "--client-shm-max-regions", "2"])
    tenants = {name: cluster.create_tenant(name) for name in ("acme", "globex")}
    for name, marker in (("acme", 1.0), ("globex", 50.0)):
        admin = tenants[name]["tenant-admin"]
        cluster.push_version(name, admin, "adder", marker_model(marker))
        cluster.api("POST", f"/v1/tenants/{name}/deployments", admin, {"name": "adder", "model": "adder"}, expect=201)
    endpoint = cluster.wait_ready("acme", tenants["acme"]["tenant-admin"], "adder")["replica_status"][0]
    cluster.wait_ready("globex", tenants["globex"]["tenant-admin"], "adder")
    auth = {name: {"Authorization": f"Bearer {keys['inference']}"} for name, keys in tenants.items()}
    grpc_auth = {name: {"authorization": f"Bearer {cluster.token(keys['inference'])}"} for name, keys in tenants.items()}

    http = httpclient.InferenceServerClient(urlparse(endpoint["http_endpoint"]).netloc)
    grpc = grpcclient.InferenceServerClient(endpoint["grpc_endpoint"])
    try:
        assert "system_shared_memory" in http.get_server_metadata(headers=auth["acme"])["extensions"]
        acme_obj, globex_obj = objects("acme"), objects("globex")
        shm.set_shared_memory_region(acme_obj, [X])
        shm.set_shared_memory_region(globex_obj, [X])

        # Each tenant registers under its own prefix; both may call their region "io".
        http.register_system_shared_memory("io", acme_obj._shm_key, 2 * BYTES, headers=auth["acme"])
        grpc.register_system_shared_memory("io", globex_obj._shm_key, 2 * BYTES, headers=grpc_auth["globex"])
        infer_in_shm(http, httpclient, "io", auth["acme"])
        np.testing.assert_allclose(shm.get_contents_as_numpy(acme_obj, np.float32, X.shape, offset=BYTES), X + 1.0)
        infer_in_shm(grpc, grpcclient, "io", grpc_auth["globex"])
        np.testing.assert_allclose(shm.get_contents_as_numpy(globex_obj, np.float32, X.shape, offset=BYTES), X + 50.0)

        # A key outside the caller's prefix is refused: another tenant's, or one with no prefix.
        for key in (globex_obj._shm_key, "/dev-shm-of-the-host"):
            e = error_of(http.register_system_shared_memory, "x", key, BYTES, headers=auth["acme"])
            assert "must start with '/acme:'" in e.message(), e

        # globex sees only its own region, and acme's is unknown to it.
        assert [s["name"] for s in http.get_system_shared_memory_status(headers=auth["globex"])] == ["io"]
        assert http.get_system_shared_memory_status("io", headers=auth["acme"])[0]["key"] == acme_obj._shm_key
        grpc.unregister_system_shared_memory(headers=grpc_auth["globex"])
        e = error_of(http.get_system_shared_memory_status, "io", headers=auth["globex"])
        assert "Unable to find system shared memory region: 'io'" in e.message(), e
        e = error_of(infer_in_shm, http, httpclient, "io", auth["globex"])
        assert "Unable to find shared memory region: 'io'" in e.message(), e
        # globex's unregister-all left acme's region alone.
        infer_in_shm(http, httpclient, "io", auth["acme"])

        # The per-tenant cap on regions (--client-shm-max-regions 2).
        http.register_system_shared_memory("io2", acme_obj._shm_key, BYTES, headers=auth["acme"])
        e = error_of(http.register_system_shared_memory, "io3", acme_obj._shm_key, BYTES, headers=auth["acme"])
        assert "--client-shm-max-regions" in e.message(), e
        e = error_of(grpc.register_system_shared_memory, "io3", acme_obj._shm_key, BYTES, headers=grpc_auth["acme"])
        assert "RESOURCE_EXHAUSTED" in str(e.status()), e
    finally:
        http.close()
        grpc.close()
