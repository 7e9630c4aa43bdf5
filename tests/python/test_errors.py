"""Error cases: HTTP status + JSON error body + message, and gRPC status codes.

Message checks use robust lower-case substrings only (tensor/model names,
'shape', 'datatype'/'data-type', 'expect'); the exact wording is the
server's. Every test also relies on the autouse guard in conftest.py that
fails the test if the server died.
"""

import json
import struct

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

import tessera_helpers as th

pytestmark = pytest.mark.timeout(60)

ADD_SUB = th.infer_path("add_sub")
DTYPE_WORDS = ("datatype", "data-type", "data type", "dtype", "expect")


def _ok_inputs(batch=1):
    a, b = th.add_sub_inputs(batch=batch, seed=99)
    return a, b


# --------------------------------------------------------------------------
# model / version lookup
# --------------------------------------------------------------------------


def test_unknown_model_http(raw_http, http_client):
    a, b = _ok_inputs()
    r = raw_http.post_json(th.infer_path("no_such_model_x"), th.add_sub_json_request(a, b))
    th.assert_error(r, 404, "no_such_model_x")
    with pytest.raises(InferenceServerException) as ei:
        http_client.infer("no_such_model_x", th.add_sub_infer_inputs(httpclient, a, b))
    assert ei.value.status() == "404" and "no_such_model_x" in ei.value.message()


def test_unknown_model_grpc(grpc_client):
    a, b = _ok_inputs()
    with pytest.raises(InferenceServerException) as ei:
        grpc_client.infer("no_such_model_x", th.add_sub_infer_inputs(grpcclient, a, b))
    assert th.grpc_status(ei.value) == "StatusCode.NOT_FOUND", ei.value
    assert "no_such_model_x" in ei.value.message()


def test_unknown_version(raw_http, grpc_client):
    a, b = _ok_inputs()
    r = raw_http.post_json(th.infer_path("add_sub", "7"), th.add_sub_json_request(a, b))
    th.assert_error(r, 404, "add_sub")
    with pytest.raises(InferenceServerException) as ei:
        grpc_client.infer("add_sub", th.add_sub_infer_inputs(grpcclient, a, b), model_version="7")
    assert th.grpc_status(ei.value) == "StatusCode.NOT_FOUND", ei.value


@pytest.mark.parametrize("model", ["bad_onnx", "wrong_io", "bad_config"])
def test_broken_model_infer_fails_cleanly(raw_http, grpc_client, model):
    x = np.zeros((1, 4), np.float32)
    req = {"inputs": [{"name": "INPUT0", "shape": [1, 4], "datatype": "FP32", "data": x.flatten().tolist()}]}
    r = raw_http.post_json(th.infer_path(model), req)
    th.assert_error(r, (404, 503), model)
    with pytest.raises(InferenceServerException) as ei:
        grpc_client.infer(model, th.http_inputs(grpcclient, {"INPUT0": x}))
    assert th.grpc_status(ei.value) in ("StatusCode.NOT_FOUND", "StatusCode.UNAVAILABLE"), ei.value


# --------------------------------------------------------------------------
# shape / datatype / names (HTTP)
# --------------------------------------------------------------------------


def test_wrong_shape_http(raw_http):
    req = {
        "inputs": [
            {"name": "INPUT0", "shape": [1, 15], "datatype": "FP32", "data": [0.0] * 15},
            {"name": "INPUT1", "shape": [1, 16], "datatype": "FP32", "data": [0.0] * 16},
        ]
    }
    th.assert_error(raw_http.post_json(ADD_SUB, req), 400, "shape", "input0")


def test_wrong_rank_http(raw_http):
    req = {
        "inputs": [
            {"name": "INPUT0", "shape": [16], "datatype": "FP32", "data": [0.0] * 16},
            {"name": "INPUT1", "shape": [16], "datatype": "FP32", "data": [0.0] * 16},
        ]
    }
    # [16] reads as batch 16 of a [16]-shaped tensor missing a dim: either word fits.
    th.assert_error(raw_http.post_json(ADD_SUB, req), 400, any_of=("shape", "batch"))


def test_batch_above_max_batch_size(raw_http, grpc_client):
    a, b = _ok_inputs(batch=9)  # add_sub has max_batch_size 8
    th.assert_error(raw_http.post_json(ADD_SUB, th.add_sub_json_request(a, b)), 400, any_of=("batch", "shape"))
    with pytest.raises(InferenceServerException) as ei:
        grpc_client.infer("add_sub", th.add_sub_infer_inputs(grpcclient, a, b))
    assert th.grpc_status(ei.value) == "StatusCode.INVALID_ARGUMENT", ei.value


def test_wrong_datatype_http(raw_http):
    req = {
        "inputs": [
            {"name": "INPUT0", "shape": [1, 16], "datatype": "INT32", "data": [1] * 16},
            {"name": "INPUT1", "shape": [1, 16], "datatype": "FP32", "data": [1.0] * 16},
        ]
    }
    th.assert_error(raw_http.post_json(ADD_SUB, req), 400, "fp32", any_of=DTYPE_WORDS)


def test_unknown_datatype_name_http(raw_http):
    req = {
        "inputs": [
            {"name": "INPUT0", "shape": [1, 16], "datatype": "FLOAT128", "data": [1.0] * 16},
            {"name": "INPUT1", "shape": [1, 16], "datatype": "FP32", "data": [1.0] * 16},
        ]
    }
    th.assert_error(raw_http.post_json(ADD_SUB, req), 400)


def test_missing_input_http(raw_http):
    req = {"inputs": [{"name": "INPUT0", "shape": [1, 16], "datatype": "FP32", "data": [1.0] * 16}]}
    th.assert_error(raw_http.post_json(ADD_SUB, req), 400, "input1")


def test_unknown_input_http(raw_http):
    a, b = _ok_inputs()
    req = th.add_sub_json_request(a, b)
    req["inputs"].append({"name": "INPUT_BOGUS", "shape": [1, 16], "datatype": "FP32", "data": [1.0] * 16})
    th.assert_error(raw_http.post_json(ADD_SUB, req), 400, "input_bogus")


def test_unknown_requested_output_http(raw_http):
    a, b = _ok_inputs()
    req = th.add_sub_json_request(a, b, outputs=[{"name": "OUTPUT0"}, {"name": "OUTPUT_BOGUS"}])
    th.assert_error(raw_http.post_json(ADD_SUB, req), 400, "output_bogus")


def test_duplicate_input_http(raw_http):
    a, b = _ok_inputs()
    req = th.add_sub_json_request(a, b)
    req["inputs"].append(dict(req["inputs"][0]))
    th.assert_error(raw_http.post_json(ADD_SUB, req), 400, "input0")


# --------------------------------------------------------------------------
# malformed bodies (HTTP)
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "body",
    [
        b'{"inputs": [',
        b"not json at all",
        b"",
        b'{"inputs": "INPUT0"}',
        b'{"inputs": [{"name": "INPUT0"}]}',
        b'{"inputs": [{"name": 5, "shape": [1,16], "datatype": "FP32", "data": []}]}',
        b"[1, 2, 3]",
        b'{"inputs": [{"name": "INPUT0", "shape": "1,16", "datatype": "FP32", "data": [1]}]}',
    ],
    ids=["truncated", "garbage", "empty", "inputs-not-array", "input-no-fields", "name-not-string", "array-root", "shape-string"],
)
def test_malformed_json(raw_http, body):
    th.assert_error(raw_http.post(ADD_SUB, body), 400)


def test_json_nesting_too_deep(raw_http):
    deep = "[" * 2000 + "]" * 2000
    body = '{"inputs": [{"name": "INPUT0", "shape": [1, 16], "datatype": "FP32", "data": ' + deep + "}]}"
    th.assert_error(raw_http.post(ADD_SUB, body), 400)


@pytest.mark.parametrize("count", [15, 17, 0])
def test_json_element_count_mismatch(raw_http, count):
    req = {
        "inputs": [
            {"name": "INPUT0", "shape": [1, 16], "datatype": "FP32", "data": [1.0] * count},
            {"name": "INPUT1", "shape": [1, 16], "datatype": "FP32", "data": [1.0] * 16},
        ]
    }
    th.assert_error(raw_http.post_json(ADD_SUB, req), 400)


def test_json_wrong_element_type(raw_http):
    req = {
        "inputs": [
            {"name": "INPUT0", "shape": [1, 16], "datatype": "FP32", "data": ["x"] * 16},
            {"name": "INPUT1", "shape": [1, 16], "datatype": "FP32", "data": [1.0] * 16},
        ]
    }
    th.assert_error(raw_http.post_json(ADD_SUB, req), 400)


def test_input_without_data_or_binary(raw_http):
    req = {
        "inputs": [
            {"name": "INPUT0", "shape": [1, 16], "datatype": "FP32"},
            {"name": "INPUT1", "shape": [1, 16], "datatype": "FP32", "data": [1.0] * 16},
        ]
    }
    th.assert_error(raw_http.post_json(ADD_SUB, req), 400)


# --------------------------------------------------------------------------
# binary tensor extension
# --------------------------------------------------------------------------


def test_binary_tail_too_short(raw_http):
    a, b = _ok_inputs()
    header, tail = th.add_sub_binary_request(a, b)
    th.assert_error(raw_http.post_binary(ADD_SUB, header, tail[:-28]), 400)


def test_binary_tail_too_long(raw_http):
    a, b = _ok_inputs()
    header, tail = th.add_sub_binary_request(a, b)
    th.assert_error(raw_http.post_binary(ADD_SUB, header, tail + b"\x00" * 12), 400)


def test_binary_data_size_not_matching_shape(raw_http):
    a, b = _ok_inputs()
    header, tail = th.add_sub_binary_request(a, b)
    header["inputs"][0]["parameters"]["binary_data_size"] = 60
    th.assert_error(raw_http.post_binary(ADD_SUB, header, tail[:60] + tail[64:]), 400)


def test_binary_data_size_negative(raw_http):
    a, b = _ok_inputs()
    header, tail = th.add_sub_binary_request(a, b)
    header["inputs"][0]["parameters"]["binary_data_size"] = -64
    th.assert_error(raw_http.post_binary(ADD_SUB, header, tail), 400)


def test_binary_and_json_data_together(raw_http):
    a, b = _ok_inputs()
    header, tail = th.add_sub_binary_request(a, b)
    header["inputs"][0]["data"] = a.flatten().tolist()
    th.assert_error(raw_http.post_binary(ADD_SUB, header, tail), 400)


def test_header_length_larger_than_body(raw_http):
    a, b = _ok_inputs()
    header, tail = th.add_sub_binary_request(a, b)
    head = json.dumps(header).encode()
    r = raw_http.post_binary(ADD_SUB, header, tail, header_len=len(head) + len(tail) + 100)
    th.assert_error(r, 400)


def test_header_length_cuts_json(raw_http):
    a, b = _ok_inputs()
    header, tail = th.add_sub_binary_request(a, b)
    r = raw_http.post_binary(ADD_SUB, header, tail, header_len=10)
    th.assert_error(r, 400)


@pytest.mark.parametrize("value", ["abc", "-5"])
def test_header_length_not_a_number(raw_http, value):
    a, b = _ok_inputs()
    header, tail = th.add_sub_binary_request(a, b)
    body = json.dumps(header).encode() + tail
    r = raw_http.post(ADD_SUB, body, headers={"Inference-Header-Content-Length": value})
    th.assert_error(r, 400)


# --------------------------------------------------------------------------
# shapes that must not be trusted
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "shape",
    [[-1, 16], [1, -16], [4294967296, 4294967296], [1, 4611686018427387904], [1, 9223372036854775807], [2, 2**62]],
    ids=["neg-batch", "neg-dim", "pow32xpow32", "pow62", "i64max", "2xpow62"],
)
@pytest.mark.parametrize("model", ["add_sub", "identity_FP32"])
def test_hostile_shapes_http(raw_http, shape, model):
    name_data = [("INPUT0", [0.0] * 16)] + ([("INPUT1", [0.0] * 16)] if model == "add_sub" else [])
    req = {"inputs": [{"name": n, "shape": shape, "datatype": "FP32", "data": d} for n, d in name_data]}
    th.assert_error(raw_http.post_json(th.infer_path(model), req), 400)
    # and the same shape announced with a binary tail
    hdr = {
        "inputs": [
            {"name": n, "shape": shape, "datatype": "FP32", "parameters": {"binary_data_size": 64}} for n, _ in name_data
        ]
    }
    th.assert_error(raw_http.post_binary(th.infer_path(model), hdr, b"\x00" * 64 * len(name_data)), 400)


def test_hostile_shapes_grpc(grpc_url):
    s = th.grpc_stub(grpc_url)
    try:
        for shape in ([-1, 4], [4294967296, 4294967296], [1, 2**62], [1, 2**63 - 1]):
            req = s.pb.ModelInferRequest(model_name="identity_FP32")
            req.inputs.append(s.pb.ModelInferRequest.InferInputTensor(name="INPUT0", datatype="FP32", shape=shape))
            req.raw_input_contents.append(b"\x00" * 16)
            with pytest.raises(grpc.RpcError) as ei:
                s.stub.ModelInfer(req, timeout=30)
            assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT, (shape, ei.value)
    finally:
        s.close()


# --------------------------------------------------------------------------
# BYTES framing
# --------------------------------------------------------------------------


def _bytes_request(raw_http, tail, shape=(1, 1), size=None):
    header = {
        "inputs": [
            {
                "name": "INPUT0",
                "shape": list(shape),
                "datatype": "BYTES",
                "parameters": {"binary_data_size": len(tail) if size is None else size},
            }
        ]
    }
    return raw_http.post_binary(th.infer_path("identity_BYTES"), header, tail)


def test_bytes_length_prefix_past_buffer(raw_http):
    th.assert_error(_bytes_request(raw_http, struct.pack("<I", 100) + b"abc"), 400)


def test_bytes_truncated_length_prefix(raw_http):
    th.assert_error(_bytes_request(raw_http, th.serialize_bytes([b"ok"]) + b"\x01\x00", shape=(1, 2)), 400)


def test_bytes_fewer_elements_than_shape(raw_http):
    th.assert_error(_bytes_request(raw_http, th.serialize_bytes([b"a", b"b"]), shape=(1, 3)), 400)


def test_bytes_more_elements_than_shape(raw_http):
    th.assert_error(_bytes_request(raw_http, th.serialize_bytes([b"a", b"b", b"c"]), shape=(1, 2)), 400)


def test_bytes_huge_length_prefix(raw_http):
    th.assert_error(_bytes_request(raw_http, struct.pack("<I", 0xFFFFFFFF) + b"x" * 8), 400)


def test_bytes_grpc_raw_length_prefix_past_buffer(grpc_url):
    s = th.grpc_stub(grpc_url)
    try:
        req = s.pb.ModelInferRequest(model_name="identity_BYTES")
        req.inputs.append(s.pb.ModelInferRequest.InferInputTensor(name="INPUT0", datatype="BYTES", shape=[1, 1]))
        req.raw_input_contents.append(struct.pack("<I", 100) + b"abc")
        with pytest.raises(grpc.RpcError) as ei:
            s.stub.ModelInfer(req, timeout=30)
        assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT, ei.value
    finally:
        s.close()


# --------------------------------------------------------------------------
# FP16 / BF16 as JSON
# --------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["FP16", "BF16"])
def test_half_types_as_json_rejected(raw_http, dtype):
    req = {"inputs": [{"name": "INPUT0", "shape": [1, 2], "datatype": dtype, "data": [1.0, 2.0]}]}
    th.assert_error(
        raw_http.post_json(th.infer_path(f"identity_{dtype}"), req),
        400,
        f"receiving {dtype} data via JSON is not supported. Please use the binary data format for input INPUT0",
    )


@pytest.mark.parametrize("dtype", ["FP16", "BF16"])
@pytest.mark.parametrize(
    "outputs,parameters",
    [
        ([{"name": "OUTPUT0", "parameters": {"binary_data": False}}], None),  # asked for as JSON
        (None, None),  # JSON by default
        ([{"name": "OUTPUT0"}], {"binary_data_output": False}),
    ],
)
def test_half_types_json_output_refused_as_triton_does(raw_http, dtype, outputs, parameters):
    """An FP16/BF16 output that would go into the JSON is refused before the model runs."""
    header = {"inputs": [{"name": "INPUT0", "shape": [1, 2], "datatype": dtype, "parameters": {"binary_data_size": 4}}]}
    if outputs is not None:
        header["outputs"] = outputs
    if parameters is not None:
        header["parameters"] = parameters
    r = raw_http.post_binary(th.infer_path(f"identity_{dtype}"), header, b"\x00\x3c\x00\x40")
    th.assert_error(r, 400, f"sending {dtype} data via JSON is not supported. Please use the binary data format for output")


@pytest.mark.parametrize("dtype", ["FP16", "BF16"])
def test_half_types_binary_output_works(raw_http, http_client, dtype):
    header = {
        "inputs": [{"name": "INPUT0", "shape": [1, 2], "datatype": dtype, "parameters": {"binary_data_size": 4}}],
        "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}],
    }
    r = raw_http.post_binary(th.infer_path(f"identity_{dtype}"), header, b"\x00\x3c\x00\x40")
    head, raw = th.split_binary_response(r)
    assert raw.get("OUTPUT0") == b"\x00\x3c\x00\x40", head
    if dtype == "FP16":  # tritonclient asks for binary outputs itself
        x = np.array([[1.0, 2.0]], dtype=np.float16)
        inp = httpclient.InferInput("INPUT0", [1, 2], "FP16")
        inp.set_data_from_numpy(x, binary_data=True)
        np.testing.assert_array_equal(http_client.infer(f"identity_{dtype}", [inp]).as_numpy("OUTPUT0"), x)


@pytest.mark.parametrize(
    "dtype,data,words",
    [
        ("BOOL", [1, 0], "non-boolean as boolean"),
        ("INT32", [1.0, 2], "non-signed-integer as signed-integer"),
        ("UINT8", [-1, 2], "non-unsigned-integer as unsigned-integer"),
    ],
)
def test_json_values_of_the_wrong_kind_refused_as_triton_does(raw_http, dtype, data, words):
    req = {"inputs": [{"name": "INPUT0", "shape": [1, 2], "datatype": dtype, "data": data}]}
    th.assert_error(raw_http.post_json(th.infer_path(f"identity_{dtype}"), req), 400, f"attempt to access JSON {words}", "INPUT0")


# --------------------------------------------------------------------------
# gRPC equivalents
# --------------------------------------------------------------------------


def _grpc_infer_error(grpc_client, inputs, outputs=None, model="add_sub"):
    with pytest.raises(InferenceServerException) as ei:
        grpc_client.infer(model, inputs, outputs=outputs)
    return ei.value


def test_grpc_wrong_shape(grpc_client):
    inp0 = grpcclient.InferInput("INPUT0", [1, 15], "FP32").set_data_from_numpy(np.zeros((1, 15), np.float32))
    inp1 = grpcclient.InferInput("INPUT1", [1, 16], "FP32").set_data_from_numpy(np.zeros((1, 16), np.float32))
    e = _grpc_infer_error(grpc_client, [inp0, inp1])
    assert th.grpc_status(e) == "StatusCode.INVALID_ARGUMENT", e
    assert "shape" in e.message().lower() and "input0" in e.message().lower(), e.message()


def test_grpc_wrong_datatype(grpc_client):
    inp0 = grpcclient.InferInput("INPUT0", [1, 16], "INT32").set_data_from_numpy(np.zeros((1, 16), np.int32))
    inp1 = grpcclient.InferInput("INPUT1", [1, 16], "FP32").set_data_from_numpy(np.zeros((1, 16), np.float32))
    e = _grpc_infer_error(grpc_client, [inp0, inp1])
    assert th.grpc_status(e) == "StatusCode.INVALID_ARGUMENT", e
    low = e.message().lower()
    assert "fp32" in low and any(w in low for w in DTYPE_WORDS), e.message()


def test_grpc_missing_input(grpc_client):
    inp0 = grpcclient.InferInput("INPUT0", [1, 16], "FP32").set_data_from_numpy(np.zeros((1, 16), np.float32))
    e = _grpc_infer_error(grpc_client, [inp0])
    assert th.grpc_status(e) == "StatusCode.INVALID_ARGUMENT", e
    assert "input1" in e.message().lower(), e.message()


def test_grpc_unknown_input(grpc_client):
    a, b = _ok_inputs()
    extra = grpcclient.InferInput("INPUT_BOGUS", [1, 16], "FP32").set_data_from_numpy(a)
    e = _grpc_infer_error(grpc_client, th.add_sub_infer_inputs(grpcclient, a, b) + [extra])
    assert th.grpc_status(e) == "StatusCode.INVALID_ARGUMENT", e
    assert "input_bogus" in e.message().lower(), e.message()


def test_grpc_unknown_output(grpc_client):
    a, b = _ok_inputs()
    e = _grpc_infer_error(
        grpc_client, th.add_sub_infer_inputs(grpcclient, a, b), outputs=[grpcclient.InferRequestedOutput("OUTPUT_BOGUS")]
    )
    assert th.grpc_status(e) == "StatusCode.INVALID_ARGUMENT", e
    assert "output_bogus" in e.message().lower(), e.message()


def _raw_request(s, contents):
    req = s.pb.ModelInferRequest(model_name="add_sub")
    for name in ("INPUT0", "INPUT1"):
        req.inputs.append(s.pb.ModelInferRequest.InferInputTensor(name=name, datatype="FP32", shape=[1, 16]))
    for c in contents:
        req.raw_input_contents.append(c)
    return req


@pytest.mark.parametrize(
    "contents",
    [[b"\x00" * 64], [b"\x00" * 64, b"\x00" * 60], [b"\x00" * 64, b"\x00" * 68]],
    ids=["one-buffer-for-two-inputs", "short", "long"],
)
def test_grpc_raw_contents_mismatch(grpc_url, contents):
    s = th.grpc_stub(grpc_url)
    try:
        with pytest.raises(grpc.RpcError) as ei:
            s.stub.ModelInfer(_raw_request(s, contents), timeout=30)
        assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT, ei.value
    finally:
        s.close()


def test_grpc_mixed_raw_and_typed_contents(grpc_url):
    s = th.grpc_stub(grpc_url)
    try:
        req = _raw_request(s, [b"\x00" * 64, b"\x00" * 64])
        req.inputs[0].contents.fp32_contents.extend([0.0] * 16)
        with pytest.raises(grpc.RpcError) as ei:
            s.stub.ModelInfer(req, timeout=30)
        assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT, ei.value
        # Triton's words, naming the input.
        assert ei.value.details() == (
            "contents field must not be specified when using raw_input_contents for 'INPUT0' for model 'add_sub'"
        ), ei.value
    finally:
        s.close()


def test_grpc_typed_contents_wrong_field_or_count(grpc_url):
    s = th.grpc_stub(grpc_url)
    try:
        for build in (
            lambda t: t.contents.int_contents.extend([1] * 16),  # wrong field for FP32
            lambda t: t.contents.fp32_contents.extend([1.0] * 15),  # wrong count
        ):
            req = s.pb.ModelInferRequest(model_name="add_sub")
            for name in ("INPUT0", "INPUT1"):
                t = s.pb.ModelInferRequest.InferInputTensor(name=name, datatype="FP32", shape=[1, 16])
                t.contents.fp32_contents.extend([1.0] * 16)
                req.inputs.append(t)
            req.inputs[0].ClearField("contents")
            build(req.inputs[0])
            with pytest.raises(grpc.RpcError) as ei:
                s.stub.ModelInfer(req, timeout=30)
            assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT, ei.value
    finally:
        s.close()


def test_grpc_fp16_typed_contents_rejected(grpc_url):
    s = th.grpc_stub(grpc_url)
    try:
        req = s.pb.ModelInferRequest(model_name="identity_FP16")
        t = s.pb.ModelInferRequest.InferInputTensor(name="INPUT0", datatype="FP16", shape=[1, 2])
        t.contents.fp32_contents.extend([1.0, 2.0])
        req.inputs.append(t)
        with pytest.raises(grpc.RpcError) as ei:
            s.stub.ModelInfer(req, timeout=30)
        assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT, ei.value
    finally:
        s.close()


# --------------------------------------------------------------------------
# routes and methods
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "method,path",
    [
        ("GET", "/v2/models/add_sub/infer"),
        ("PUT", "/v2/models/add_sub/infer"),
        ("POST", "/v2/health/live"),
        ("DELETE", "/v2/health/ready"),
        ("POST", "/v2/models/add_sub/ready"),
        ("GET", "/v2/repository/index"),
        ("GET", "/v2/repository/models/add_sub/load"),
    ],
)
def test_wrong_method_405(raw_http, method, path):
    body = b"{}" if method in ("POST", "PUT") else None
    th.assert_error(raw_http.request(method, path, body=body), 405)


@pytest.mark.parametrize("path", ["/v2/no/such/route", "/v3", "/v2/models/add_sub/versions/1/nope"])
def test_unknown_route_404(raw_http, path):
    th.assert_error(raw_http.get(path), 404)


def test_errors_are_json_with_content_type(raw_http):
    r = raw_http.post(ADD_SUB, b"{")
    assert r.status == 400
    assert "application/json" in r.header("content-type", ""), r.headers
    th.error_message(r)


def test_server_survives_error_barrage(raw_http, http_client):
    bodies = [b"{", b'{"inputs": [{"name": "INPUT0", "shape": [1, 9223372036854775807], "datatype": "FP32"}]}', b"\xff" * 100]
    for body in bodies * 5:
        assert 400 <= raw_http.post(ADD_SUB, body).status < 500
    a, b = _ok_inputs()
    res = http_client.infer("add_sub", th.add_sub_infer_inputs(httpclient, a, b))
    np.testing.assert_array_equal(res.as_numpy("OUTPUT0"), a + b)


# --------------------------------------------------------------------------
# --http-max-input-size (a second server started with a 1 KiB limit)
# --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def small_limit_server(launch_server):
    srv = launch_server("max-input-1k", extra_args=["--http-max-input-size", "1024"], models=["add_sub"])
    yield srv
    srv.stop()


def test_body_above_max_input_size_413(small_limit_server):
    raw = th.RawHttp(small_limit_server.http_url)
    a, b = th.add_sub_inputs(batch=8, seed=5)
    body = json.dumps(th.add_sub_json_request(a, b)).encode()
    assert len(body) > 1024
    th.assert_error(raw.post(ADD_SUB, body), 413)
    header, tail = th.add_sub_binary_request(a, b)
    th.assert_error(raw.post_binary(ADD_SUB, header, tail), 413)


def test_body_below_max_input_size_ok(small_limit_server):
    raw = th.RawHttp(small_limit_server.http_url)
    a, b = th.add_sub_inputs(batch=1, seed=6)
    header, tail = th.add_sub_binary_request(a, b)
    assert len(json.dumps(header)) + len(tail) < 1024
    r = raw.post_binary(ADD_SUB, header, tail, header_len=None)
    assert r.status == 200, r.describe()
    assert small_limit_server.alive()
