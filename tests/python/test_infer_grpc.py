"""Inference over gRPC: tritonclient, raw and typed contents, streaming."""

import queue

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

import gen_models
import tessera_helpers as th

pytestmark = pytest.mark.timeout(60)


def _check_add_sub(result, a, b):
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)


@pytest.fixture
def stub(grpc_url):
    s = th.grpc_stub(grpc_url)
    yield s
    s.close()


# --------------------------------------------------------------------------
# tritonclient (raw contents on the wire)
# --------------------------------------------------------------------------


@pytest.mark.parametrize("batch", [1, 5, 8])
def test_add_sub(grpc_client, batch):
    a, b = th.add_sub_inputs(batch=batch, seed=30 + batch)
    res = grpc_client.infer("add_sub", th.add_sub_infer_inputs(grpcclient, a, b))
    _check_add_sub(res, a, b)
    resp = res.get_response()
    assert resp.model_name == "add_sub" and resp.model_version == "1"
    assert sorted(o.name for o in resp.outputs) == ["OUTPUT0", "OUTPUT1"]
    for o in resp.outputs:
        assert o.datatype == "FP32" and list(o.shape) == [batch, 16]
    # Triton always answers with raw_output_contents, one entry per output.
    assert len(resp.raw_output_contents) == len(resp.outputs)


@pytest.mark.parametrize("wanted", ["OUTPUT0", "OUTPUT1"])
def test_requested_output_subset(grpc_client, wanted):
    a, b = th.add_sub_inputs(seed=40)
    res = grpc_client.infer(
        "add_sub", th.add_sub_infer_inputs(grpcclient, a, b), outputs=[grpcclient.InferRequestedOutput(wanted)]
    )
    resp = res.get_response()
    assert [o.name for o in resp.outputs] == [wanted]
    np.testing.assert_array_equal(res.as_numpy(wanted), a + b if wanted == "OUTPUT0" else a - b)


def test_request_id_is_echoed(grpc_client):
    a, b = th.add_sub_inputs(seed=41)
    res = grpc_client.infer("add_sub", th.add_sub_infer_inputs(grpcclient, a, b), request_id="grpc-req-7")
    assert res.get_response().id == "grpc-req-7"


def test_explicit_version_and_multi_version(grpc_client):
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    for v in ("1", "2", "3"):
        res = grpc_client.infer("multi_version", th.http_inputs(grpcclient, {"INPUT0": x}), model_version=v)
        np.testing.assert_array_equal(res.as_numpy("OUTPUT0"), x + int(v))
        assert res.get_response().model_version == v
    res = grpc_client.infer("multi_latest", th.http_inputs(grpcclient, {"INPUT0": x}))
    np.testing.assert_array_equal(res.as_numpy("OUTPUT0"), x + 3)
    with pytest.raises(InferenceServerException) as ei:
        grpc_client.infer("multi_latest", th.http_inputs(grpcclient, {"INPUT0": x}), model_version="1")
    assert th.grpc_status(ei.value) == "StatusCode.NOT_FOUND", ei.value


def test_mlp_matches_onnxruntime(grpc_client, model_repo):
    x = np.random.default_rng(42).standard_normal((16, 256)).astype(np.float32)
    res = grpc_client.infer("mlp", th.http_inputs(grpcclient, {"INPUT0": x}))
    ref = gen_models._session(model_repo / "mlp" / "1" / "model.onnx").run(None, {"INPUT0": x})[0]
    np.testing.assert_allclose(res.as_numpy("OUTPUT0"), ref, rtol=1e-4, atol=1e-5)


def test_custom_filename_and_auto(grpc_client):
    x = np.arange(4, dtype=np.float32).reshape(1, 4)
    res = grpc_client.infer("custom_filename", th.http_inputs(grpcclient, {"INPUT0": x}))
    np.testing.assert_array_equal(res.as_numpy("OUTPUT0"), x * gen_models.CUSTOM_SCALE)
    a, b = th.add_sub_inputs(seed=43)
    _check_add_sub(grpc_client.infer("add_sub_auto", th.add_sub_infer_inputs(grpcclient, a, b)), a, b)


def test_async_infer_callbacks(grpc_client):
    done = queue.Queue()
    sent = {}
    for i in range(8):
        a, b = th.add_sub_inputs(batch=1 + i % 4, seed=300 + i)
        sent[str(i)] = (a, b)
        grpc_client.async_infer(
            "add_sub",
            th.add_sub_infer_inputs(grpcclient, a, b),
            callback=lambda result, error: done.put((result, error)),
            request_id=str(i),
        )
    for _ in range(8):
        result, error = done.get(timeout=30)
        assert error is None, error
        a, b = sent[result.get_response().id]
        _check_add_sub(result, a, b)


# --------------------------------------------------------------------------
# raw protobuf requests through the generated stub
# --------------------------------------------------------------------------


def test_typed_fp32_contents(stub):
    a, b = th.add_sub_inputs(batch=2, seed=50)
    req = stub.pb.ModelInferRequest(model_name="add_sub", id="typed")
    req.inputs.append(th.typed_input(stub.pb, "INPUT0", "FP32", [2, 16], a.flatten().tolist()))
    req.inputs.append(th.typed_input(stub.pb, "INPUT1", "FP32", [2, 16], b.flatten().tolist()))
    resp = stub.stub.ModelInfer(req, timeout=30)
    assert resp.id == "typed" and resp.model_name == "add_sub"
    assert len(resp.raw_output_contents) == len(resp.outputs) == 2
    np.testing.assert_array_equal(th.raw_output(resp, "OUTPUT0", "FP32", "<f4"), a + b)
    np.testing.assert_array_equal(th.raw_output(resp, "OUTPUT1", "FP32", "<f4"), a - b)


def test_raw_input_contents(stub):
    a, b = th.add_sub_inputs(batch=3, seed=51)
    req = stub.pb.ModelInferRequest(model_name="add_sub", model_version="1")
    for name, arr in (("INPUT0", a), ("INPUT1", b)):
        req.inputs.append(stub.pb.ModelInferRequest.InferInputTensor(name=name, datatype="FP32", shape=[3, 16]))
        req.raw_input_contents.append(arr.astype("<f4").tobytes())
    req.outputs.append(stub.pb.ModelInferRequest.InferRequestedOutputTensor(name="OUTPUT1"))
    resp = stub.stub.ModelInfer(req, timeout=30)
    assert [o.name for o in resp.outputs] == ["OUTPUT1"]
    np.testing.assert_array_equal(th.raw_output(resp, "OUTPUT1", "FP32", "<f4"), a - b)


def test_typed_contents_mlp(stub, model_repo):
    x = np.random.default_rng(52).standard_normal((2, 256)).astype(np.float32)
    req = stub.pb.ModelInferRequest(model_name="mlp")
    req.inputs.append(th.typed_input(stub.pb, "INPUT0", "FP32", [2, 256], x.flatten().tolist()))
    resp = stub.stub.ModelInfer(req, timeout=30)
    ref = gen_models._session(model_repo / "mlp" / "1" / "model.onnx").run(None, {"INPUT0": x})[0]
    np.testing.assert_allclose(th.raw_output(resp, "OUTPUT0", "FP32", "<f4"), ref, rtol=1e-4, atol=1e-5)


# --------------------------------------------------------------------------
# streaming
# --------------------------------------------------------------------------


def _collect(q, n, timeout=30):
    out = []
    for _ in range(n):
        out.append(q.get(timeout=timeout))
    return out


def test_stream_several_requests_in_order(fresh_grpc_client):
    q = queue.Queue()
    fresh_grpc_client.start_stream(callback=lambda result, error: q.put((result, error)))
    sent = []
    for i in range(10):
        a, b = th.add_sub_inputs(batch=1 + i % 3, seed=400 + i)
        sent.append((a, b))
        fresh_grpc_client.async_stream_infer("add_sub", th.add_sub_infer_inputs(grpcclient, a, b), request_id=f"s{i}")
    got = _collect(q, len(sent))
    fresh_grpc_client.stop_stream()
    ids = []
    for result, error in got:
        assert error is None, error
        ids.append(result.get_response().id)
    assert ids == [f"s{i}" for i in range(10)], f"stream answers out of order: {ids}"
    for (a, b), (result, _) in zip(sent, got):
        _check_add_sub(result, a, b)


def test_stream_mixed_models(fresh_grpc_client):
    q = queue.Queue()
    fresh_grpc_client.start_stream(callback=lambda result, error: q.put((result, error)))
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    for v in ("1", "2", "3"):
        fresh_grpc_client.async_stream_infer(
            "multi_version", th.http_inputs(grpcclient, {"INPUT0": x}), model_version=v, request_id=v
        )
    got = _collect(q, 3)
    fresh_grpc_client.stop_stream()
    for result, error in got:
        assert error is None, error
        v = result.get_response().id
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), x + int(v))


def test_stream_error_in_band_keeps_stream_open(fresh_grpc_client):
    q = queue.Queue()
    fresh_grpc_client.start_stream(callback=lambda result, error: q.put((result, error)))
    a, b = th.add_sub_inputs(seed=60)
    fresh_grpc_client.async_stream_infer("no_such_model", th.add_sub_infer_inputs(grpcclient, a, b), request_id="bad")
    result, error = q.get(timeout=30)
    assert error is not None and result is None
    assert "no_such_model" in str(error)
    fresh_grpc_client.async_stream_infer("add_sub", th.add_sub_infer_inputs(grpcclient, a, b), request_id="good")
    result, error = q.get(timeout=30)
    fresh_grpc_client.stop_stream()
    assert error is None, error
    assert result.get_response().id == "good"
    _check_add_sub(result, a, b)


def test_stream_raw_stub(stub):
    """ModelStreamInfer through the raw stub: one response per request, in order."""
    reqs = []
    for i in range(4):
        x = np.full((1, 4), float(i), dtype=np.float32)
        r = stub.pb.ModelInferRequest(model_name="multi_version", model_version="2", id=f"r{i}")
        r.inputs.append(stub.pb.ModelInferRequest.InferInputTensor(name="INPUT0", datatype="FP32", shape=[1, 4]))
        r.raw_input_contents.append(x.tobytes())
        reqs.append(r)
    responses = list(stub.stub.ModelStreamInfer(iter(reqs), timeout=30))
    assert len(responses) == 4
    for i, sr in enumerate(responses):
        assert sr.error_message == "", sr.error_message
        assert sr.infer_response.id == f"r{i}"
        np.testing.assert_array_equal(
            th.raw_output(sr.infer_response, "OUTPUT0", "FP32", "<f4"), np.full((1, 4), i + 2.0, np.float32)
        )
