"""Raw binary requests (``Inference-Header-Content-Length: 0``), as Triton documents them:
the whole body is the model's single input, its shape deduced from the model configuration,
and the outputs come back in the binary tensor format. Errors and wording are Triton 2.51's.
"""

import json
import struct
import threading

import numpy as np
import pytest

import tessera_helpers as th

pytestmark = pytest.mark.timeout(90)

RAW = {"Inference-Header-Content-Length": "0"}


def _split(resp):
    """(JSON header, binary tail) of a binary-extension response."""
    n = int(resp.header("inference-header-content-length"))
    return json.loads(resp.body[:n]), resp.body[n:]


def test_raw_binary_fp32_deduces_the_variable_dimension(raw_http):
    # Triton's docs: `curl --data-binary @input.bin -H "Inference-Header-Content-Length: 0"`.
    x = np.arange(6, dtype=np.float32)
    r = raw_http.post(th.infer_path("identity_FP32"), x.tobytes(), headers=RAW)
    assert r.status == 200, r.describe()
    head, tail = _split(r)
    (out,) = head["outputs"]
    # max_batch_size 8 and dims [-1]: a batch of one, the variable dimension from the length.
    assert out["shape"] == [1, 6] and out["datatype"] == "FP32", head
    assert out["parameters"]["binary_data_size"] == 24
    assert np.array_equal(np.frombuffer(tail, dtype=np.float32), x)


@pytest.mark.parametrize("dtype", ["INT32", "UINT8", "BOOL", "FP16", "INT64"])
def test_raw_binary_other_datatypes_round_trip(raw_http, dtype):
    npdt = {"INT32": np.int32, "UINT8": np.uint8, "BOOL": np.bool_, "FP16": np.float16, "INT64": np.int64}[dtype]
    x = (np.arange(10) % 2).astype(npdt)
    r = raw_http.post(th.infer_path(f"identity_{dtype}"), x.tobytes(), headers=RAW)
    assert r.status == 200, r.describe()
    head, tail = _split(r)
    assert head["outputs"][0]["shape"] == [1, 10]
    assert np.array_equal(np.frombuffer(tail, dtype=npdt), x)


def test_raw_binary_bytes_input_is_one_element(raw_http):
    body = b"hello\x00world"
    r = raw_http.post(th.infer_path("raw_bytes"), body, headers=RAW)
    assert r.status == 200, r.describe()
    head, tail = _split(r)
    assert head["outputs"][0]["shape"] == [1, 1] and head["outputs"][0]["datatype"] == "BYTES"
    assert tail == struct.pack("<I", len(body)) + body


def test_raw_binary_refusals_are_tritons(raw_http):
    r = raw_http.post(th.infer_path("add_sub"), np.zeros(32, np.float32).tobytes(), headers=RAW)
    th.assert_error(
        r, 400, "Raw request must only have 1 input (found 1) to be deduced but got 2 inputs in 'add_sub' model configuration"
    )
    r = raw_http.post(th.infer_path("identity_BYTES"), b"abc", headers=RAW)
    th.assert_error(r, 400, "For BYTE datatype raw input 'INPUT0', the model must have input shape [1]")
    r = raw_http.post(th.infer_path("variable_2d"), np.zeros(12, np.float32).tobytes(), headers=RAW)
    th.assert_error(
        r,
        400,
        "The shape of the raw input 'INPUT0' can not be deduced because there are more than one variable-sized dimension",
    )
    r = raw_http.post(th.infer_path("identity_INT32"), b"\x01\x00\x00", headers=RAW)
    th.assert_error(r, 400, "input byte size mismatch for input 'INPUT0' for model 'identity_INT32'. Expected 0, got 3")


def test_raw_binary_meets_the_queue_policy_like_any_request(launch_server):
    """A full queue answers a raw request 503, as it answers a JSON one (not 501)."""
    srv = launch_server("raw-queue", models=("identity_FP32",), load_models=())
    raw = th.RawHttp(srv.http_url)
    config = {
        "name": "identity_FP32",
        "backend": "onnxruntime",
        "max_batch_size": 8,
        "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [-1]}],
        "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [-1]}],
        "dynamic_batching": {"max_queue_delay_microseconds": 400000, "default_queue_policy": {"max_queue_size": 2}},
    }
    r = raw.post_json("/v2/repository/models/identity_FP32/load", {"parameters": {"config": json.dumps(config)}})
    assert r.status == 200, r.describe()
    results = []

    def call():
        r = th.RawHttp(srv.http_url).post(th.infer_path("identity_FP32"), np.ones(4, np.float32).tobytes(), headers=RAW)
        results.append(r)

    threads = [threading.Thread(target=call) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    statuses = sorted(r.status for r in results)
    assert set(statuses) <= {200, 503}, [r.describe() for r in results]
    rejected = [r for r in results if r.status == 503]
    assert len(rejected) >= 3, statuses
    for r in rejected:
        th.assert_error(r, 503, "Exceeds maximum queue size")
