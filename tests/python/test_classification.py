"""Triton's classification extension, used as Triton's image_client example uses it:
``InferRequestedOutput(name, class_count=K)`` turns an output into the top K
``value:index[:label]`` strings per batch row, labels from the output's ``label_filename``."""

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

import tessera_helpers as th

pytestmark = pytest.mark.timeout(60)

SCORES = np.array([[0.1, 0.7, 0.2, 0.0], [0.5, 0.1, 0.3, 0.9]], dtype=np.float32)


def _classify(client, module, model, x, k, datatype="FP32"):
    inp = module.InferInput("INPUT0", list(x.shape), datatype)
    inp.set_data_from_numpy(x)
    out = module.InferRequestedOutput("OUTPUT0", class_count=k)
    return client.infer(model, [inp], outputs=[out]).as_numpy("OUTPUT0")


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_top_k_with_labels_per_batch_row(http_client, grpc_client, protocol):
    client, module = (http_client, httpclient) if protocol == "http" else (grpc_client, grpcclient)
    classes = _classify(client, module, "classifier", SCORES, 2)
    assert classes.shape == (2, 2)
    # Floats as Triton prints them (six decimals), then the index, then the label.
    assert classes.tolist() == [
        [b"0.700000:1:dog", b"0.200000:2:bird"],
        [b"0.900000:3:fish", b"0.500000:0:cat"],
    ]
    # Parsed as image_client.py parses it.
    value, index, label = classes[1][0].decode().split(":")
    assert (float(value), int(index), label) == (pytest.approx(0.9), 3, "fish")


def test_integers_print_as_integers_and_no_label_file_means_no_label(http_client):
    x = np.array([[3, 9, 1]], dtype=np.int32)
    classes = _classify(http_client, httpclient, "identity_INT32", x, 3, "INT32")
    assert classes.tolist() == [[b"9:1", b"3:0", b"1:2"]]


def test_a_count_above_the_classes_is_capped(http_client):
    classes = _classify(http_client, httpclient, "classifier", SCORES[:1], 10)
    assert classes.shape == (1, 4)


def test_json_output_of_classes(raw_http):
    req = {
        "inputs": [{"name": "INPUT0", "shape": [1, 4], "datatype": "FP32", "data": SCORES[0].tolist()}],
        "outputs": [{"name": "OUTPUT0", "parameters": {"classification": 1}}],
    }
    r = raw_http.post_json(th.infer_path("classifier"), req)
    assert r.status == 200, r.describe()
    (out,) = r.json()["outputs"]
    assert out == {"name": "OUTPUT0", "datatype": "BYTES", "shape": [1, 1], "data": ["0.700000:1:dog"]}


def test_types_without_an_order_are_refused_as_triton_refuses_them(http_client):
    x = np.array([[True, False]])
    with pytest.raises(InferenceServerException) as ei:
        _classify(http_client, httpclient, "identity_BOOL", x, 1, "BOOL")
    assert "class result not available for output due to unsupported type 'BOOL'" in str(ei.value)


def test_a_negative_count_is_refused(raw_http):
    req = {
        "inputs": [{"name": "INPUT0", "shape": [1, 4], "datatype": "FP32", "data": SCORES[0].tolist()}],
        "outputs": [{"name": "OUTPUT0", "parameters": {"classification": -1}}],
    }
    th.assert_error(raw_http.post_json(th.infer_path("classifier"), req), 400, "'classification'", "non-negative integer")
