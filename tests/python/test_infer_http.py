"""Inference over HTTP: JSON and binary tensors, outputs, ids, batching, versions."""

import json

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

import gen_models
import tessera_helpers as th

pytestmark = pytest.mark.timeout(60)


def _outputs(names_binary):
    return [httpclient.InferRequestedOutput(n, binary_data=b) for n, b in names_binary]


def _check_add_sub(result, a, b):
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)


def _out_by_name(response):
    return {o["name"]: o for o in response["outputs"]}


# --------------------------------------------------------------------------
# tritonclient
# --------------------------------------------------------------------------


@pytest.mark.parametrize("in_binary", [False, True], ids=["json-in", "binary-in"])
@pytest.mark.parametrize("out_binary", [False, True], ids=["json-out", "binary-out"])
def test_add_sub_json_and_binary(http_client, in_binary, out_binary):
    a, b = th.add_sub_inputs(batch=1, seed=1)
    res = http_client.infer(
        "add_sub",
        th.add_sub_infer_inputs(httpclient, a, b, binary=in_binary),
        outputs=_outputs([("OUTPUT0", out_binary), ("OUTPUT1", out_binary)]),
    )
    _check_add_sub(res, a, b)
    resp = res.get_response()
    assert resp["model_name"] == "add_sub"
    assert resp["model_version"] == "1"
    outs = _out_by_name(resp)
    assert set(outs) == {"OUTPUT0", "OUTPUT1"}
    for name, o in outs.items():
        assert o["datatype"] == "FP32" and o["shape"] == [1, 16], o
        if out_binary:
            assert "data" not in o and o["parameters"]["binary_data_size"] == 64, o
        else:
            assert len(o["data"]) == 16 and "binary_data_size" not in (o.get("parameters") or {}), o


def test_binary_flags_per_input_and_per_output(http_client):
    a, b = th.add_sub_inputs(batch=2, seed=2)
    res = http_client.infer(
        "add_sub",
        th.add_sub_infer_inputs(httpclient, a, b, binary={"INPUT0": True, "INPUT1": False}),
        outputs=_outputs([("OUTPUT0", True), ("OUTPUT1", False)]),
    )
    _check_add_sub(res, a, b)
    outs = _out_by_name(res.get_response())
    assert outs["OUTPUT0"]["parameters"]["binary_data_size"] == 2 * 16 * 4 and "data" not in outs["OUTPUT0"]
    assert len(outs["OUTPUT1"]["data"]) == 32


@pytest.mark.parametrize("wanted", ["OUTPUT0", "OUTPUT1"])
def test_requested_output_subset(http_client, wanted):
    a, b = th.add_sub_inputs(batch=1, seed=3)
    res = http_client.infer(
        "add_sub", th.add_sub_infer_inputs(httpclient, a, b), outputs=[httpclient.InferRequestedOutput(wanted)]
    )
    names = [o["name"] for o in res.get_response()["outputs"]]
    assert names == [wanted]
    expected = a + b if wanted == "OUTPUT0" else a - b
    np.testing.assert_array_equal(res.as_numpy(wanted), expected)
    other = "OUTPUT1" if wanted == "OUTPUT0" else "OUTPUT0"
    assert res.as_numpy(other) is None


def test_request_id_is_echoed(http_client):
    a, b = th.add_sub_inputs(seed=4)
    res = http_client.infer("add_sub", th.add_sub_infer_inputs(httpclient, a, b), request_id="req-éx-42")
    assert res.get_response()["id"] == "req-éx-42"
    _check_add_sub(res, a, b)


@pytest.mark.parametrize("batch", [1, 3, 8])
def test_batches(http_client, batch):
    a, b = th.add_sub_inputs(batch=batch, seed=10 + batch)
    res = http_client.infer("add_sub", th.add_sub_infer_inputs(httpclient, a, b))
    _check_add_sub(res, a, b)
    assert res.as_numpy("OUTPUT0").shape == (batch, 16)


def test_explicit_version(http_client):
    a, b = th.add_sub_inputs(seed=5)
    res = http_client.infer("add_sub", th.add_sub_infer_inputs(httpclient, a, b), model_version="1")
    _check_add_sub(res, a, b)
    assert res.get_response()["model_version"] == "1"


def test_auto_completed_model_infers(http_client):
    a, b = th.add_sub_inputs(batch=2, seed=6)
    res = http_client.infer("add_sub_auto", th.add_sub_infer_inputs(httpclient, a, b, binary=False))
    _check_add_sub(res, a, b)


@pytest.mark.parametrize("batch", [1, 4, 32])
def test_mlp_matches_onnxruntime(http_client, model_repo, batch):
    x = np.random.default_rng(100 + batch).standard_normal((batch, 256)).astype(np.float32)
    res = http_client.infer("mlp", th.http_inputs(httpclient, {"INPUT0": x}))
    y = res.as_numpy("OUTPUT0")
    assert y.shape == (batch, 10) and y.dtype == np.float32
    ref = gen_models._session(model_repo / "mlp" / "1" / "model.onnx").run(None, {"INPUT0": x})[0]
    np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-5)


def test_mlp_json_output(http_client, model_repo):
    x = np.random.default_rng(7).standard_normal((2, 256)).astype(np.float32)
    res = http_client.infer(
        "mlp",
        th.http_inputs(httpclient, {"INPUT0": x}, binary=False),
        outputs=[httpclient.InferRequestedOutput("OUTPUT0", binary_data=False)],
    )
    ref = gen_models._session(model_repo / "mlp" / "1" / "model.onnx").run(None, {"INPUT0": x})[0]
    np.testing.assert_allclose(res.as_numpy("OUTPUT0"), ref, rtol=1e-4, atol=1e-5)


def test_custom_filename(http_client):
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    res = http_client.infer("custom_filename", th.http_inputs(httpclient, {"INPUT0": x}))
    np.testing.assert_array_equal(res.as_numpy("OUTPUT0"), x * gen_models.CUSTOM_SCALE)


@pytest.mark.parametrize("version", ["1", "2", "3"])
def test_multi_version_each_version(http_client, version):
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    res = http_client.infer("multi_version", th.http_inputs(httpclient, {"INPUT0": x}), model_version=version)
    np.testing.assert_array_equal(res.as_numpy("OUTPUT0"), x + int(version))
    assert res.get_response()["model_version"] == version


def test_multi_version_default_is_highest(http_client):
    x = np.zeros((1, 4), dtype=np.float32)
    res = http_client.infer("multi_version", th.http_inputs(httpclient, {"INPUT0": x}))
    np.testing.assert_array_equal(res.as_numpy("OUTPUT0"), x + 3)
    assert res.get_response()["model_version"] == "3"


def test_multi_latest_serves_only_latest(http_client):
    x = np.ones((1, 4), dtype=np.float32)
    res = http_client.infer("multi_latest", th.http_inputs(httpclient, {"INPUT0": x}))
    np.testing.assert_array_equal(res.as_numpy("OUTPUT0"), x + 3)
    res = http_client.infer("multi_latest", th.http_inputs(httpclient, {"INPUT0": x}), model_version="3")
    np.testing.assert_array_equal(res.as_numpy("OUTPUT0"), x + 3)
    for v in ("1", "2"):
        with pytest.raises(InferenceServerException) as ei:
            http_client.infer("multi_latest", th.http_inputs(httpclient, {"INPUT0": x}), model_version=v)
        assert ei.value.status() == "404", ei.value


def test_async_infer_greenlets(http_client):
    """The sync client's async_infer (gevent) with several requests in flight."""
    reqs = []
    for i in range(8):
        a, b = th.add_sub_inputs(batch=1 + i % 3, seed=200 + i)
        reqs.append((a, b, http_client.async_infer("add_sub", th.add_sub_infer_inputs(httpclient, a, b), request_id=str(i))))
    for i, (a, b, fut) in enumerate(reqs):
        res = fut.get_result(timeout=30)
        _check_add_sub(res, a, b)
        assert res.get_response()["id"] == str(i)


# --------------------------------------------------------------------------
# raw HTTP: wire details tritonclient hides
# --------------------------------------------------------------------------


def test_raw_json_request_and_response(raw_http):
    a, b = th.add_sub_inputs(batch=2, seed=20)
    r = raw_http.post_json(th.infer_path("add_sub"), th.add_sub_json_request(a, b, id="abc"))
    assert r.status == 200, r.describe()
    assert "application/json" in r.header("content-type", ""), r.headers
    assert r.header("inference-header-content-length") is None
    body = r.json()
    assert body["model_name"] == "add_sub" and body["model_version"] == "1" and body["id"] == "abc"
    outs = _out_by_name(body)
    np.testing.assert_allclose(np.array(outs["OUTPUT0"]["data"], np.float32).reshape(2, 16), a + b)
    np.testing.assert_allclose(np.array(outs["OUTPUT1"]["data"], np.float32).reshape(2, 16), a - b)
    assert outs["OUTPUT0"]["shape"] == [2, 16] and outs["OUTPUT0"]["datatype"] == "FP32"


def test_raw_nested_json_data(raw_http):
    a, b = th.add_sub_inputs(batch=2, seed=21)
    req = {
        "inputs": [
            {"name": "INPUT0", "shape": [2, 16], "datatype": "FP32", "data": a.tolist()},
            {"name": "INPUT1", "shape": [2, 16], "datatype": "FP32", "data": b.tolist()},
        ]
    }
    r = raw_http.post_json(th.infer_path("add_sub"), req)
    assert r.status == 200, r.describe()
    out = _out_by_name(r.json())["OUTPUT0"]
    np.testing.assert_allclose(np.array(out["data"], np.float32).reshape(2, 16), a + b)


def test_raw_binary_request_and_response(raw_http):
    a, b = th.add_sub_inputs(batch=3, seed=22)
    header, tail = th.add_sub_binary_request(
        a, b, outputs=[{"name": "OUTPUT0", "parameters": {"binary_data": True}}, {"name": "OUTPUT1"}]
    )
    r = raw_http.post_binary(th.infer_path("add_sub"), header, tail)
    assert r.status == 200, r.describe()
    hlen = r.header("inference-header-content-length")
    assert hlen is not None, f"binary response without Inference-Header-Content-Length: {r.headers}"
    assert int(r.header("content-length", len(r.body))) == len(r.body)
    head, raw = th.split_binary_response(r)
    outs = _out_by_name(head)
    assert set(raw) == {"OUTPUT0"}, "only OUTPUT0 asked for binary"
    np.testing.assert_array_equal(np.frombuffer(raw["OUTPUT0"], "<f4").reshape(3, 16), a + b)
    np.testing.assert_allclose(np.array(outs["OUTPUT1"]["data"], np.float32).reshape(3, 16), a - b)


def test_raw_binary_data_output_request_parameter(raw_http):
    a, b = th.add_sub_inputs(batch=1, seed=23)
    req = th.add_sub_json_request(a, b, parameters={"binary_data_output": True})
    r = raw_http.post_json(th.infer_path("add_sub"), req)
    assert r.status == 200, r.describe()
    head, raw = th.split_binary_response(r)
    assert set(raw) == {"OUTPUT0", "OUTPUT1"}, head
    np.testing.assert_array_equal(np.frombuffer(raw["OUTPUT0"], "<f4").reshape(1, 16), a + b)
    np.testing.assert_array_equal(np.frombuffer(raw["OUTPUT1"], "<f4").reshape(1, 16), a - b)


def test_raw_binary_tail_order_follows_inputs_order(raw_http):
    """Binary inputs are read from the tail in the order of the JSON inputs."""
    a, b = th.add_sub_inputs(batch=1, seed=24)
    ra, rb = a.tobytes(), b.tobytes()
    header = {
        "inputs": [
            {"name": "INPUT1", "shape": [1, 16], "datatype": "FP32", "parameters": {"binary_data_size": len(rb)}},
            {"name": "INPUT0", "shape": [1, 16], "datatype": "FP32", "parameters": {"binary_data_size": len(ra)}},
        ],
        "outputs": [{"name": "OUTPUT1", "parameters": {"binary_data": True}}],
    }
    r = raw_http.post_binary(th.infer_path("add_sub"), header, rb + ra)
    assert r.status == 200, r.describe()
    _, raw = th.split_binary_response(r)
    np.testing.assert_array_equal(np.frombuffer(raw["OUTPUT1"], "<f4").reshape(1, 16), a - b)


def test_raw_version_path(raw_http):
    x = np.arange(4, dtype=np.float32).reshape(1, 4)
    req = {"inputs": [{"name": "INPUT0", "shape": [1, 4], "datatype": "FP32", "data": x.flatten().tolist()}]}
    r = raw_http.post_json(th.infer_path("multi_version", "2"), req)
    assert r.status == 200, r.describe()
    body = r.json()
    assert body["model_version"] == "2"
    assert body["outputs"][0]["data"] == (x + 2).flatten().tolist()


def test_raw_json_number_coercion(raw_http):
    """JSON integers are coerced to the declared FP32 type."""
    req = {
        "inputs": [
            {"name": "INPUT0", "shape": [1, 16], "datatype": "FP32", "data": list(range(16))},
            {"name": "INPUT1", "shape": [1, 16], "datatype": "FP32", "data": [1] * 16},
        ]
    }
    r = raw_http.post_json(th.infer_path("add_sub"), req)
    assert r.status == 200, r.describe()
    out = _out_by_name(r.json())["OUTPUT0"]
    assert [float(v) for v in out["data"]] == [float(i + 1) for i in range(16)]


def test_raw_request_without_id_has_no_or_empty_id(raw_http):
    a, b = th.add_sub_inputs(seed=25)
    r = raw_http.post_json(th.infer_path("add_sub"), th.add_sub_json_request(a, b))
    assert r.status == 200, r.describe()
    assert r.json().get("id", "") == ""


def test_raw_mlp_binary_roundtrip(raw_http, model_repo):
    x = np.random.default_rng(26).standard_normal((8, 256)).astype(np.float32)
    header = {
        "inputs": [{"name": "INPUT0", "shape": [8, 256], "datatype": "FP32", "parameters": {"binary_data_size": x.nbytes}}],
        "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}],
    }
    r = raw_http.post_binary(th.infer_path("mlp"), header, x.tobytes())
    assert r.status == 200, r.describe()
    _, raw = th.split_binary_response(r)
    y = np.frombuffer(raw["OUTPUT0"], "<f4").reshape(8, 10)
    ref = gen_models._session(model_repo / "mlp" / "1" / "model.onnx").run(None, {"INPUT0": x})[0]
    np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-5)
    assert json.loads(r.body[: int(r.header("inference-header-content-length"))])["outputs"][0]["shape"] == [8, 10]
