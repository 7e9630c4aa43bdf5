"""CUDA shared memory (Triton's extension) with the real tritonclient, on a machine without
CUDA: registration checks its arguments, then fails cleanly over HTTP and gRPC because the
driver is missing; status and unregister answer as Triton's do, in one name space with system
regions. A fake 64-byte handle stands in for ``cudaIpcGetMemHandle``'s (tritonclient's
``cuda_shared_memory`` helpers need a GPU). ``scripts/gpu_smoke_cuda_shm.py`` runs the real
round trip on a GPU machine."""

from __future__ import annotations

import base64
import ctypes
import os
import uuid

import grpc
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

import tessera_helpers as th


def _has_libcuda() -> bool:
    try:
        ctypes.CDLL("libcuda.so.1")
        return True
    except OSError:
        return False


pytestmark = [
    pytest.mark.timeout(60),
    pytest.mark.skipif(_has_libcuda(), reason="the CUDA driver is here: these check the server without it"),
]

# A cudaIpcMemHandle_t as tritonclient passes it: base64 text of its 64 bytes.
FAKE_HANDLE = base64.b64encode(bytes(range(64))).decode()
NO_CUDA = (
    "failed to register CUDA shared memory region: 'c', GPUs not supported: "
    "CUDA is not available on this server (libcuda.so.1 not found)"
)


@pytest.fixture
def clean(http_client):
    """Every test starts and ends with no region of either kind registered."""
    http_client.unregister_system_shared_memory()
    http_client.unregister_cuda_shared_memory()
    yield
    http_client.unregister_system_shared_memory()
    http_client.unregister_cuda_shared_memory()


@pytest.fixture
def system_region():
    handle = shm.create_shared_memory_region("sys", f"/tessera-e2e-{os.getpid()}-{uuid.uuid4().hex[:8]}", 64)
    yield handle
    shm.destroy_shared_memory_region(handle)


def _error(fn, *args, **kw) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as ei:
        fn(*args, **kw)
    return ei.value


def test_the_extension_is_not_advertised_without_cuda(http_client, grpc_client):
    extensions = http_client.get_server_metadata()["extensions"]
    assert "system_shared_memory" in extensions and "cuda_shared_memory" not in extensions
    assert "cuda_shared_memory" not in grpc_client.get_server_metadata().extensions


def test_registration_without_cuda_fails_cleanly_over_both_protocols(http_client, grpc_client, clean):
    e = _error(http_client.register_cuda_shared_memory, "c", FAKE_HANDLE, 0, 1024)
    assert NO_CUDA in e.message(), e
    assert e.status() == "400", e
    e = _error(grpc_client.register_cuda_shared_memory, "c", FAKE_HANDLE, 0, 1024)
    assert NO_CUDA in e.message(), e
    assert th.grpc_status(e) == "StatusCode.INVALID_ARGUMENT", e
    assert http_client.get_cuda_shared_memory_status() == []
    assert http_client.is_server_live(), "the server is still up"


def test_arguments_are_checked_before_cuda(http_client, grpc_client, raw_http, grpc_url, system_region, clean):
    route = "/v2/cudasharedmemory/region/c/register"
    short = base64.b64encode(bytes(63)).decode()
    cases = [
        ({"device_id": 0, "byte_size": 8}, "has no 'raw_handle' field"),
        ({"raw_handle": {"b64": short}, "device_id": 0, "byte_size": 8}, "valid base64 encoded cudaIpcMemHandle_t"),
        ({"raw_handle": {"b64": "%%%"}, "device_id": 0, "byte_size": 8}, "valid base64 encoded cudaIpcMemHandle_t"),
        ({"raw_handle": {"b64": FAKE_HANDLE}, "device_id": 0}, "has no 'byte_size' field"),
        ({"raw_handle": {"b64": FAKE_HANDLE}, "byte_size": 8}, "has no 'device_id' field"),
        ({"raw_handle": {"b64": FAKE_HANDLE}, "device_id": 0, "byte_size": 0}, "'c': invalid args"),
    ]
    for body, words in cases:
        th.assert_error(raw_http.post_json(route, body), 400, words)

    # gRPC carries the raw bytes: a handle of the wrong length is refused before CUDA.
    stub = th.grpc_stub(grpc_url)
    try:
        request = stub.pb.CudaSharedMemoryRegisterRequest(name="c", raw_handle=bytes(63), device_id=0, byte_size=8)
        with pytest.raises(grpc.RpcError) as ei:
            stub.stub.CudaSharedMemoryRegister(request)
        assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "'raw_handle' must be a 64-byte cudaIpcMemHandle_t, got 63 bytes" in ei.value.details()
        request = stub.pb.CudaSharedMemoryRegisterRequest(name="c", raw_handle=bytes(64), device_id=-1, byte_size=8)
        with pytest.raises(grpc.RpcError) as ei:
            stub.stub.CudaSharedMemoryRegister(request)
        assert "invalid device id -1" in ei.value.details()
    finally:
        stub.close()

    # One name space with system regions: a taken name is refused before CUDA is looked for.
    http_client.register_system_shared_memory("sys", system_region._shm_key, 64)
    e = _error(http_client.register_cuda_shared_memory, "sys", FAKE_HANDLE, 0, 8)
    assert "shared memory region 'sys' already in manager" in e.message(), e
    e = _error(grpc_client.register_cuda_shared_memory, "sys", FAKE_HANDLE, 0, 8)
    assert th.grpc_status(e) == "StatusCode.ALREADY_EXISTS", e


def test_status_and_unregister_answer_as_triton(http_client, grpc_client, raw_http, system_region, clean):
    assert http_client.get_cuda_shared_memory_status() == []
    assert len(grpc_client.get_cuda_shared_memory_status().regions) == 0
    e = _error(http_client.get_cuda_shared_memory_status, "nope")
    assert "Unable to find cuda shared memory region: 'nope'" in e.message(), e
    e = _error(grpc_client.get_cuda_shared_memory_status, "nope")
    assert th.grpc_status(e) == "StatusCode.NOT_FOUND", e
    th.assert_error(raw_http.get("/v2/cudasharedmemory/region/nope/status"), 404, "Unable to find")
    th.assert_error(raw_http.post("/v2/cudasharedmemory/status"), 405)
    th.assert_error(raw_http.get("/v2/cudasharedmemory/region/c/register"), 405)

    # A system region is not a CUDA one: status says which it is, and unregistering CUDA
    # regions (by its name or all of them) leaves it alone.
    http_client.register_system_shared_memory("sys", system_region._shm_key, 64)
    e = _error(http_client.get_cuda_shared_memory_status, "sys")
    assert "The region named 'sys' is registered as system shared memory, not CUDA shared memory" in e.message(), e
    http_client.unregister_cuda_shared_memory("sys")
    grpc_client.unregister_cuda_shared_memory()
    http_client.unregister_cuda_shared_memory("never-registered")  # not an error, as in Triton
    assert [s["name"] for s in http_client.get_system_shared_memory_status()] == ["sys"]
    assert http_client.get_cuda_shared_memory_status() == []


def test_an_input_naming_an_unknown_region_fails_as_for_system_regions(http_client, clean):
    inp = httpclient.InferInput("INPUT0", [1, 16], "FP32")
    inp.set_shared_memory("gpu-region", 64)
    (other,) = th.http_inputs(httpclient, {"INPUT1": th.add_sub_inputs(batch=1)[1]})
    e = _error(http_client.infer, "add_sub", [inp, other])
    assert "Unable to find shared memory region: 'gpu-region'" in e.message(), e


@pytest.mark.timeout(120)
def test_disabled_and_runner_servers_refuse_cleanly_too(launch_server):
    off = launch_server("no-shm-cuda", extra_args=["--allow-client-shm=false"])
    with_runner = launch_server("cuda-runner", extra_args=["--runner"])
    clients = [httpclient.InferenceServerClient(s.http_url) for s in (off, with_runner)]
    grpc_runner = grpcclient.InferenceServerClient(with_runner.grpc_url)
    try:
        e = _error(clients[0].register_cuda_shared_memory, "c", FAKE_HANDLE, 0, 64)
        assert "Client shared memory is disabled" in e.message(), e
        assert clients[0].get_cuda_shared_memory_status() == []
        # Models in a runner: the front checks for the driver before taking the region.
        e = _error(clients[1].register_cuda_shared_memory, "c", FAKE_HANDLE, 3, 64)
        assert NO_CUDA in e.message(), e
        e = _error(grpc_runner.register_cuda_shared_memory, "c", FAKE_HANDLE, 3, 64)
        assert NO_CUDA in e.message(), e
        assert clients[1].is_model_ready("add_sub")
    finally:
        for c in clients:
            c.close()
        grpc_runner.close()
