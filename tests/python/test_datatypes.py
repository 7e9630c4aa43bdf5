"""Every Triton datatype round-trips through the identity_<DTYPE> models.

HTTP JSON, HTTP binary, gRPC raw (tritonclient) and gRPC typed contents.
FP16 and BF16 only travel as binary (JSON for them is an error, see
test_errors.py); BF16 uses ``ml_dtypes.bfloat16`` as tritonclient 2.73 does.
"""

import ml_dtypes
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

import gen_models
import tessera_helpers as th

pytestmark = pytest.mark.timeout(60)

ALL = list(gen_models.DTYPES)
BINARY_ONLY = {"FP16", "BF16"}
JSON_OK = [d for d in ALL if d not in BINARY_ONLY]
TYPED_OK = [d for d in ALL if d not in BINARY_ONLY]

NP = {
    "BOOL": np.bool_,
    "UINT8": np.uint8,
    "UINT16": np.uint16,
    "UINT32": np.uint32,
    "UINT64": np.uint64,
    "INT8": np.int8,
    "INT16": np.int16,
    "INT32": np.int32,
    "INT64": np.int64,
    "FP16": np.float16,
    "BF16": ml_dtypes.bfloat16,
    "FP32": np.float32,
    "FP64": np.float64,
}

UTF8_STRINGS = ["", "plain", "héllo wörld", "漢字テスト", "emoji 🙂🚀", "", "tab\tnew\nline", '"quoted" \\ back']
RAW_BYTES = [b"", b"\x00", b"\xff\xfe\xfd", b"a\x00b", bytes(range(256)), b"", "日本".encode("utf-8")]


def _as_bytes_list(arr):
    return [v if isinstance(v, bytes) else str(v).encode("utf-8") for v in np.asarray(arr, dtype=object).flat]


def _assert_same(dtype, got, want, json_floats=False):
    assert got is not None, "output missing"
    assert tuple(got.shape) == tuple(want.shape), (got.shape, want.shape)
    if json_floats and dtype in ("FP32", "FP64"):
        # Decimal text -> binary float parsing is allowed to be off by an ulp
        # (serde_json and rapidjson both are, by default, for some inputs).
        assert np.asarray(got).dtype == np.dtype(NP[dtype])
        np.testing.assert_array_max_ulp(got, want, maxulp=2)
        return
    if dtype == "BYTES":
        assert _as_bytes_list(got) == _as_bytes_list(want)
    elif dtype == "BF16":
        np.testing.assert_array_equal(np.asarray(got).view(np.uint16), np.asarray(want).view(np.uint16))
    else:
        assert np.asarray(got).dtype == np.dtype(NP[dtype]), np.asarray(got).dtype
        np.testing.assert_array_equal(got, want)


def _http_roundtrip(client, dtype, x, in_binary, out_binary):
    inp = httpclient.InferInput("INPUT0", list(x.shape), dtype)
    inp.set_data_from_numpy(x, binary_data=in_binary)
    res = client.infer(
        f"identity_{dtype}", [inp], outputs=[httpclient.InferRequestedOutput("OUTPUT0", binary_data=out_binary)]
    )
    out = res.get_response()["outputs"][0]
    assert out["name"] == "OUTPUT0" and out["datatype"] == dtype and out["shape"] == list(x.shape), out
    return res.as_numpy("OUTPUT0")


@pytest.mark.parametrize("dtype", JSON_OK)
def test_http_json_roundtrip(http_client, dtype):
    x = gen_models.sample_for(dtype)
    _assert_same(dtype, _http_roundtrip(http_client, dtype, x, False, False), x, json_floats=True)


@pytest.mark.parametrize("dtype", ALL)
def test_http_binary_roundtrip(http_client, dtype):
    x = gen_models.sample_for(dtype)
    _assert_same(dtype, _http_roundtrip(http_client, dtype, x, True, True), x)


@pytest.mark.parametrize("dtype", ["INT64", "UINT64", "FP64", "BOOL", "BYTES"])
def test_http_json_in_binary_out(http_client, dtype):
    x = gen_models.sample_for(dtype, shape=(3, 4))
    _assert_same(dtype, _http_roundtrip(http_client, dtype, x, False, True), x, json_floats=True)


@pytest.mark.parametrize("dtype", ALL)
def test_grpc_roundtrip(grpc_client, dtype):
    x = gen_models.sample_for(dtype, shape=(3, 7))
    inp = grpcclient.InferInput("INPUT0", list(x.shape), dtype)
    inp.set_data_from_numpy(x)
    res = grpc_client.infer(f"identity_{dtype}", [inp])
    out = res.get_response().outputs[0]
    assert out.datatype == dtype and list(out.shape) == [3, 7]
    _assert_same(dtype, res.as_numpy("OUTPUT0"), x)


def _typed_values(dtype, x):
    if dtype == "BYTES":
        return _as_bytes_list(x)
    if dtype == "BOOL":
        return [bool(v) for v in x.flat]
    if dtype in ("FP32", "FP64"):
        return [float(v) for v in x.flat]
    return [int(v) for v in x.flat]


@pytest.mark.parametrize("dtype", TYPED_OK)
def test_grpc_typed_contents_roundtrip(grpc_url, dtype):
    x = gen_models.sample_for(dtype)
    s = th.grpc_stub(grpc_url)
    try:
        req = s.pb.ModelInferRequest(model_name=f"identity_{dtype}")
        req.inputs.append(th.typed_input(s.pb, "INPUT0", dtype, x.shape, _typed_values(dtype, x)))
        resp = s.stub.ModelInfer(req, timeout=30)
    finally:
        s.close()
    got = th.raw_output(resp, "OUTPUT0", dtype, None if dtype == "BYTES" else np.dtype(NP[dtype]).newbyteorder("<"))
    if dtype != "BYTES":
        got = got.astype(NP[dtype])
    _assert_same(dtype, got, x)


def test_bf16_special_values_binary(http_client, grpc_client):
    bits = np.array([0x0000, 0x8000, 0x7F80, 0xFF80, 0x7F7F, 0x0001, 0x3F80, 0xC000], dtype=np.uint16)
    x = bits.view(ml_dtypes.bfloat16).reshape(2, 4)  # +0, -0, +inf, -inf, max, denorm, 1, -2
    _assert_same("BF16", _http_roundtrip(http_client, "BF16", x, True, True), x)
    inp = grpcclient.InferInput("INPUT0", [2, 4], "BF16")
    inp.set_data_from_numpy(x)
    _assert_same("BF16", grpc_client.infer("identity_BF16", [inp]).as_numpy("OUTPUT0"), x)


def test_fp16_special_values_binary(http_client):
    x = np.array([0.0, -0.0, np.inf, -np.inf, 65504.0, 6.0e-8, 1.0, -2.5], dtype=np.float16).reshape(2, 4)
    got = _http_roundtrip(http_client, "FP16", x, True, True)
    np.testing.assert_array_equal(got.view(np.uint16), x.view(np.uint16))


# --------------------------------------------------------------------------
# BYTES specifics
# --------------------------------------------------------------------------


@pytest.mark.parametrize("in_binary,out_binary", [(False, False), (True, True), (False, True), (True, False)])
def test_bytes_utf8_and_empty_strings_http(http_client, in_binary, out_binary):
    x = np.array([s.encode("utf-8") for s in UTF8_STRINGS], dtype=object).reshape(2, 4)
    _assert_same("BYTES", _http_roundtrip(http_client, "BYTES", x, in_binary, out_binary), x)


def test_bytes_all_empty(http_client, grpc_client):
    x = np.array([b""] * 6, dtype=object).reshape(2, 3)
    _assert_same("BYTES", _http_roundtrip(http_client, "BYTES", x, False, False), x)
    _assert_same("BYTES", _http_roundtrip(http_client, "BYTES", x, True, True), x)
    inp = grpcclient.InferInput("INPUT0", [2, 3], "BYTES")
    inp.set_data_from_numpy(x)
    _assert_same("BYTES", grpc_client.infer("identity_BYTES", [inp]).as_numpy("OUTPUT0"), x)


def test_bytes_arbitrary_binary_values(http_client, grpc_client):
    """Non-UTF-8 bytes survive when they travel as binary (HTTP tail, gRPC raw)."""
    x = np.array(RAW_BYTES + [b"z"], dtype=object).reshape(2, 4)
    _assert_same("BYTES", _http_roundtrip(http_client, "BYTES", x, True, True), x)
    inp = grpcclient.InferInput("INPUT0", [2, 4], "BYTES")
    inp.set_data_from_numpy(x)
    _assert_same("BYTES", grpc_client.infer("identity_BYTES", [inp]).as_numpy("OUTPUT0"), x)


def test_bytes_large_element(http_client):
    big = ("ü" * 50_000).encode("utf-8")
    x = np.array([big, b"", b"tail"], dtype=object).reshape(1, 3)
    _assert_same("BYTES", _http_roundtrip(http_client, "BYTES", x, True, True), x)


def test_bytes_raw_http_wire_format(raw_http):
    """Check the 4-byte little-endian length framing on the wire both ways."""
    values = [b"", "é漢".encode("utf-8"), b"\x00\x01"]
    tail = th.serialize_bytes(values)
    header = {
        "inputs": [{"name": "INPUT0", "shape": [1, 3], "datatype": "BYTES", "parameters": {"binary_data_size": len(tail)}}],
        "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}],
    }
    r = raw_http.post_binary(th.infer_path("identity_BYTES"), header, tail)
    assert r.status == 200, r.describe()
    head, raw = th.split_binary_response(r)
    assert head["outputs"][0]["datatype"] == "BYTES" and head["outputs"][0]["shape"] == [1, 3]
    assert raw["OUTPUT0"] == tail
    assert th.deserialize_bytes(raw["OUTPUT0"]) == values


def test_bytes_json_output_is_strings(raw_http):
    req = {"inputs": [{"name": "INPUT0", "shape": [1, 3], "datatype": "BYTES", "data": ["", "ä", "x y"]}]}
    r = raw_http.post_json(th.infer_path("identity_BYTES"), req)
    assert r.status == 200, r.describe()
    out = r.json()["outputs"][0]
    assert out["datatype"] == "BYTES" and out["data"] == ["", "ä", "x y"]


def test_bool_json_literals(raw_http):
    req = {"inputs": [{"name": "INPUT0", "shape": [1, 4], "datatype": "BOOL", "data": [True, False, False, True]}]}
    r = raw_http.post_json(th.infer_path("identity_BOOL"), req)
    assert r.status == 200, r.describe()
    assert r.json()["outputs"][0]["data"] == [True, False, False, True]


def test_uint64_and_int64_extremes_json(raw_http):
    big = [0, 2**64 - 1, 2**63, 1]
    r = raw_http.post_json(
        th.infer_path("identity_UINT64"),
        {"inputs": [{"name": "INPUT0", "shape": [1, 4], "datatype": "UINT64", "data": big}]},
    )
    assert r.status == 200, r.describe()
    assert [int(v) for v in r.json()["outputs"][0]["data"]] == big
    small = [-(2**63), 2**63 - 1, -1, 0]
    r = raw_http.post_json(
        th.infer_path("identity_INT64"),
        {"inputs": [{"name": "INPUT0", "shape": [1, 4], "datatype": "INT64", "data": small}]},
    )
    assert r.status == 200, r.describe()
    assert [int(v) for v in r.json()["outputs"][0]["data"]] == small


@pytest.mark.parametrize("dtype", ["INT8", "UINT8", "INT16", "UINT16", "INT32", "UINT32", "BOOL", "FP64"])
def test_binary_element_sizes_on_wire(raw_http, dtype):
    """binary_data_size in the response is elements x element size."""
    x = gen_models.sample_for(dtype, shape=(2, 3))
    raw = x.astype(np.dtype(NP[dtype]).newbyteorder("<")).tobytes()
    header = {
        "inputs": [{"name": "INPUT0", "shape": [2, 3], "datatype": dtype, "parameters": {"binary_data_size": len(raw)}}],
        "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}],
    }
    r = raw_http.post_binary(th.infer_path(f"identity_{dtype}"), header, raw)
    assert r.status == 200, r.describe()
    head, outs = th.split_binary_response(r)
    assert head["outputs"][0]["parameters"]["binary_data_size"] == 6 * np.dtype(NP[dtype]).itemsize
    assert outs["OUTPUT0"] == raw
