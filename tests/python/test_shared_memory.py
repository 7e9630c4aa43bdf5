"""System shared memory (Triton's extension) with the real tritonclient: regions made with
``tritonclient.utils.shared_memory``, registered over HTTP and gRPC, add_sub run with inputs
and outputs in them, status, unregister, and Triton's errors for bad keys, offsets and sizes.
The same flow runs against a server whose models run in a runner process (``--runner``)."""

from __future__ import annotations

import os
import uuid

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

import tessera_helpers as th

pytestmark = pytest.mark.timeout(60)

BATCH = 2
TENSOR_BYTES = BATCH * 16 * 4  # add_sub: [BATCH, 16] FP32


def _key() -> str:
    return f"/tessera-e2e-{os.getpid()}-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def regions():
    """Makes shared memory objects as a client does; destroys them after the test."""
    made = []

    def make(name: str, byte_size: int):
        handle = shm.create_shared_memory_region(name, _key(), byte_size)
        made.append(handle)
        return handle

    yield make
    for handle in made:
        shm.destroy_shared_memory_region(handle)


@pytest.fixture
def clean(http_client):
    """Every test starts and ends with no region registered on the shared server."""
    http_client.unregister_system_shared_memory()
    yield
    http_client.unregister_system_shared_memory()


def _io(module, region_in: str, region_out: str):
    """add_sub with both inputs in `region_in` (at 0 and TENSOR_BYTES) and both outputs in
    `region_out` (likewise)."""
    inputs = [module.InferInput(n, [BATCH, 16], "FP32") for n in ("INPUT0", "INPUT1")]
    for i, inp in enumerate(inputs):
        inp.set_shared_memory(region_in, TENSOR_BYTES, offset=i * TENSOR_BYTES)
    outputs = [module.InferRequestedOutput(n) for n in ("OUTPUT0", "OUTPUT1")]
    for i, out in enumerate(outputs):
        out.set_shared_memory(region_out, TENSOR_BYTES, offset=i * TENSOR_BYTES)
    return inputs, outputs


def _fill(handle, seed: int):
    a, b = th.add_sub_inputs(batch=BATCH, seed=seed)
    shm.set_shared_memory_region(handle, [a, b])
    return a, b


def _read_outputs(handle):
    sums = shm.get_contents_as_numpy(handle, np.float32, [BATCH, 16])
    diffs = shm.get_contents_as_numpy(handle, np.float32, [BATCH, 16], offset=TENSOR_BYTES)
    return sums, diffs


def _run_add_sub(client, module, regions, seed: int):
    ip = regions("ip", 2 * TENSOR_BYTES)
    op = regions("op", 2 * TENSOR_BYTES)
    a, b = _fill(ip, seed)
    client.register_system_shared_memory("ip", ip._shm_key, 2 * TENSOR_BYTES)
    client.register_system_shared_memory("op", op._shm_key, 2 * TENSOR_BYTES)
    inputs, outputs = _io(module, "ip", "op")
    result = client.infer("add_sub", inputs, outputs=outputs)
    sums, diffs = _read_outputs(op)
    np.testing.assert_allclose(sums, a + b, rtol=1e-6)
    np.testing.assert_allclose(diffs, a - b, rtol=1e-6)
    return result


def test_server_metadata_lists_the_extension(http_client, grpc_client):
    assert "system_shared_memory" in http_client.get_server_metadata()["extensions"]
    assert "system_shared_memory" in grpc_client.get_server_metadata().extensions


def test_add_sub_through_shared_memory_over_http(http_client, regions, clean):
    result = _run_add_sub(http_client, httpclient, regions, seed=1)
    out = result.get_output("OUTPUT0")
    assert out["shape"] == [BATCH, 16] and out["datatype"] == "FP32"
    assert "data" not in out, out
    assert out["parameters"]["shared_memory_region"] == "op", out
    assert out["parameters"]["shared_memory_byte_size"] == TENSOR_BYTES, out
    assert result.get_output("OUTPUT1")["parameters"]["shared_memory_offset"] == TENSOR_BYTES


def test_add_sub_through_shared_memory_over_grpc(grpc_client, regions, clean):
    result = _run_add_sub(grpc_client, grpcclient, regions, seed=2)
    resp = result.get_response()
    assert [o.name for o in resp.outputs] == ["OUTPUT0", "OUTPUT1"]
    # As Triton: one raw entry per output, empty for an output in shared memory.
    assert list(resp.raw_output_contents) == [b"", b""]
    assert list(resp.outputs[0].shape) == [BATCH, 16]
    assert resp.outputs[1].parameters["shared_memory_region"].string_param == "op"


def test_mixing_shared_memory_and_ordinary_tensors(http_client, grpc_client, regions, clean):
    region = regions("mix", TENSOR_BYTES)
    a, b = th.add_sub_inputs(batch=BATCH, seed=3)
    shm.set_shared_memory_region(region, [a])
    http_client.register_system_shared_memory("mix", region._shm_key, TENSOR_BYTES)
    for module, client in ((httpclient, http_client), (grpcclient, grpc_client)):
        in0 = module.InferInput("INPUT0", [BATCH, 16], "FP32")
        in0.set_shared_memory("mix", TENSOR_BYTES)
        (in1,) = th.http_inputs(module, {"INPUT1": b})
        outputs = [module.InferRequestedOutput("OUTPUT0"), module.InferRequestedOutput("OUTPUT1")]
        result = client.infer("add_sub", [in0, in1], outputs=outputs)
        np.testing.assert_allclose(result.as_numpy("OUTPUT0"), a + b, rtol=1e-6)
        np.testing.assert_allclose(result.as_numpy("OUTPUT1"), a - b, rtol=1e-6)


def test_status_and_unregister_over_both_protocols(http_client, grpc_client, regions, clean):
    r = regions("s", 256)
    http_client.register_system_shared_memory("s1", r._shm_key, 128)
    grpc_client.register_system_shared_memory("s2", r._shm_key, 64, offset=128)
    status = http_client.get_system_shared_memory_status()
    assert sorted(status, key=lambda s: s["name"]) == [
        {"name": "s1", "key": r._shm_key, "offset": 0, "byte_size": 128},
        {"name": "s2", "key": r._shm_key, "offset": 128, "byte_size": 64},
    ]
    one = grpc_client.get_system_shared_memory_status("s2")
    assert list(one.regions) == ["s2"] and one.regions["s2"].offset == 128 and one.regions["s2"].byte_size == 64
    assert http_client.get_system_shared_memory_status("s1") == [
        {"name": "s1", "key": r._shm_key, "offset": 0, "byte_size": 128}
    ]
    grpc_client.unregister_system_shared_memory("s1")
    assert [s["name"] for s in http_client.get_system_shared_memory_status()] == ["s2"]
    http_client.unregister_system_shared_memory("never-registered")  # not an error, as in Triton
    grpc_client.unregister_system_shared_memory()
    assert http_client.get_system_shared_memory_status() == []
    assert len(grpc_client.get_system_shared_memory_status().regions) == 0


def _http_error(fn, *args, **kw) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as ei:
        fn(*args, **kw)
    return ei.value


def test_registration_errors(http_client, grpc_client, raw_http, regions, clean):
    r = regions("e", 128)
    http_client.register_system_shared_memory("taken", r._shm_key, 128)

    e = _http_error(http_client.register_system_shared_memory, "taken", r._shm_key, 8)
    assert "shared memory region 'taken' already in manager" in e.message(), e
    e = _http_error(grpc_client.register_system_shared_memory, "taken", r._shm_key, 8)
    assert th.grpc_status(e) == "StatusCode.ALREADY_EXISTS", e

    e = _http_error(http_client.register_system_shared_memory, "x", "/tessera-e2e-no-such-key", 8)
    assert "Unable to open shared memory region: '/tessera-e2e-no-such-key'" in e.message(), e
    e = _http_error(grpc_client.register_system_shared_memory, "x", "/tessera-e2e-no-such-key", 8)
    assert th.grpc_status(e) == "StatusCode.INTERNAL", e

    for offset, size in ((0, 129), (120, 16), (128, 1)):
        e = _http_error(http_client.register_system_shared_memory, "x", r._shm_key, size, offset=offset)
        assert "failed to register shared memory region 'x': invalid args" in e.message(), (offset, size, e)
        e = _http_error(grpc_client.register_system_shared_memory, "x", r._shm_key, size, offset=offset)
        assert th.grpc_status(e) == "StatusCode.INVALID_ARGUMENT", e

    e = _http_error(http_client.get_system_shared_memory_status, "nope")
    assert "Unable to find system shared memory region: 'nope'" in e.message(), e
    e = _http_error(grpc_client.get_system_shared_memory_status, "nope")
    assert th.grpc_status(e) == "StatusCode.NOT_FOUND", e

    th.assert_error(raw_http.post("/v2/systemsharedmemory/region/x/register", b"{}"), 400, "has no 'key' field")
    th.assert_error(
        raw_http.post_json("/v2/systemsharedmemory/region/x/register", {"key": r._shm_key}),
        400,
        "has no 'byte_size' field",
    )
    th.assert_error(raw_http.post("/v2/systemsharedmemory/region/x/status"), 405)
    th.assert_error(raw_http.get("/v2/systemsharedmemory/region/x/register"), 405)
    th.assert_error(raw_http.get("/v2/systemsharedmemory/region/nope/status"), 404, "Unable to find")
    assert raw_http.post("/v2/systemsharedmemory/region/taken/register", b"").status == 400


def _infer_error(client, module, inputs, outputs=None) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as ei:
        client.infer("add_sub", inputs, outputs=outputs)
    return ei.value


@pytest.mark.parametrize("module_name", ["http", "grpc"])
def test_inference_errors(module_name, http_client, grpc_client, regions, clean):
    module, client = (httpclient, http_client) if module_name == "http" else (grpcclient, grpc_client)
    r = regions("ie", 2 * TENSOR_BYTES)
    _fill(r, 4)
    client.register_system_shared_memory("ie", r._shm_key, 2 * TENSOR_BYTES)

    # An unknown region, for an input and for an output.
    inputs, outputs = _io(module, "nope", "ie")
    e = _infer_error(client, module, inputs, outputs)
    assert "Unable to find shared memory region: 'nope'" in e.message(), e
    inputs, outputs = _io(module, "ie", "nope")
    e = _infer_error(client, module, inputs, outputs)
    assert "Unable to find shared memory region: 'nope'" in e.message(), e
    if module_name == "grpc":
        assert th.grpc_status(e) == "StatusCode.NOT_FOUND", e

    # Reading past the region's end from an input's offset + byte size, or starting past it.
    inputs, _ = _io(module, "ie", "ie")
    inputs[1].set_shared_memory("ie", TENSOR_BYTES, offset=TENSOR_BYTES + 4)
    e = _infer_error(client, module, inputs)
    assert "Invalid offset + byte size for shared memory region: 'ie'" in e.message(), e
    inputs[1].set_shared_memory("ie", 4, offset=2 * TENSOR_BYTES)
    e = _infer_error(client, module, inputs)
    assert "Invalid offset for shared memory region: 'ie'" in e.message(), e

    # An input whose byte size disagrees with its shape and datatype.
    inputs, _ = _io(module, "ie", "ie")
    inputs[0].set_shared_memory("ie", TENSOR_BYTES - 4)
    e = _infer_error(client, module, inputs)
    assert "unexpected total byte size" in e.message() and "'INPUT0'" in e.message(), e

    # An output region too small for the output.
    inputs, outputs = _io(module, "ie", "ie")
    outputs[0].set_shared_memory("ie", TENSOR_BYTES - 4)
    e = _infer_error(client, module, inputs, outputs)
    assert (
        f"shared memory size specified with the request for output 'OUTPUT0' ({TENSOR_BYTES - 4} bytes) "
        f"should be at least {TENSOR_BYTES} bytes to hold the results" in e.message()
    ), e
    if module_name == "grpc":
        assert th.grpc_status(e) == "StatusCode.INTERNAL", e


def test_input_mixing_data_and_shared_memory_is_refused(raw_http, grpc_url, regions, clean, http_client):
    r = regions("mx", TENSOR_BYTES)
    http_client.register_system_shared_memory("mx", r._shm_key, TENSOR_BYTES)
    a, b = th.add_sub_inputs(batch=BATCH, seed=5)
    req = th.add_sub_json_request(a, b)
    req["inputs"][0]["parameters"] = {"shared_memory_region": "mx", "shared_memory_byte_size": TENSOR_BYTES}
    th.assert_error(
        raw_http.post_json(th.infer_path("add_sub"), req),
        400,
        "Input must set only one of the following fields",
        "But set 'data' 'shared_memory_region'",
    )
    req = th.add_sub_json_request(a, b, outputs=[{"name": "OUTPUT0", "parameters": {
        "shared_memory_region": "mx", "shared_memory_byte_size": TENSOR_BYTES, "binary_data": True}}])
    th.assert_error(
        raw_http.post_json(th.infer_path("add_sub"), req),
        400,
        "Output can't set both 'shared_memory_region' and 'binary_data'",
    )

    stub = th.grpc_stub(grpc_url)
    try:
        pb = stub.pb
        request = pb.ModelInferRequest(model_name="add_sub")
        t = th.typed_input(pb, "INPUT0", "FP32", [BATCH, 16], a.flatten().tolist())
        t.parameters["shared_memory_region"].string_param = "mx"
        t.parameters["shared_memory_byte_size"].int64_param = TENSOR_BYTES
        request.inputs.append(t)
        request.inputs.append(th.typed_input(pb, "INPUT1", "FP32", [BATCH, 16], b.flatten().tolist()))
        with pytest.raises(grpc.RpcError) as ei:
            stub.stub.ModelInfer(request)
        assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "unexpected 'content' provided when using shared memory for input tensor 'INPUT0'" in ei.value.details()
    finally:
        stub.close()


def test_unregistering_a_region_in_use_is_safe(http_client, regions, clean):
    # Unregister between requests, register another object under the same name, and infer
    # again: each request reads the object its region named when it resolved it.
    first = regions("u1", 2 * TENSOR_BYTES)
    second = regions("u2", 2 * TENSOR_BYTES)
    out = regions("uo", 2 * TENSOR_BYTES)
    http_client.register_system_shared_memory("uo", out._shm_key, 2 * TENSOR_BYTES)
    for handle, seed in ((first, 6), (second, 7)):
        a, b = _fill(handle, seed)
        http_client.unregister_system_shared_memory("u")
        http_client.register_system_shared_memory("u", handle._shm_key, 2 * TENSOR_BYTES)
        inputs, outputs = _io(httpclient, "u", "uo")
        http_client.infer("add_sub", inputs, outputs=outputs)
        np.testing.assert_allclose(_read_outputs(out)[0], a + b, rtol=1e-6)


def test_disabled_shared_memory_answers_as_triton(launch_server, regions):
    srv = launch_server("no-shm", extra_args=["--allow-client-shm=false"])
    client = httpclient.InferenceServerClient(srv.http_url)
    try:
        assert "system_shared_memory" not in client.get_server_metadata()["extensions"]
        r = regions("d", 64)
        e = _http_error(client.register_system_shared_memory, "d", r._shm_key, 64)
        assert "Client shared memory is disabled" in e.message(), e
        assert client.get_system_shared_memory_status() == []
    finally:
        client.close()


@pytest.mark.timeout(120)
def test_shared_memory_with_models_in_a_runner(launch_server, regions):
    srv = launch_server("shm-runner", extra_args=["--runner"])
    http_client = httpclient.InferenceServerClient(srv.http_url)
    grpc_client = grpcclient.InferenceServerClient(srv.grpc_url)
    try:
        _run_add_sub(http_client, httpclient, regions, seed=8)
        http_client.unregister_system_shared_memory()
        _run_add_sub(grpc_client, grpcclient, regions, seed=9)
    finally:
        http_client.close()
        grpc_client.close()
