"""Model warmup (Triton's ``model_warmup``): samples of zeros, random data or files from the
model's ``warmup/`` directory run on every instance before the version reports ready; a sample
that cannot run fails the load with its name."""

import json
import re

import numpy as np
import pytest
import tritonclient.http as httpclient

import tessera_helpers as th

pytestmark = pytest.mark.timeout(90)


def _config(warmup, instances=1):
    return {
        "name": "add_sub",
        "backend": "onnxruntime",
        "max_batch_size": 8,
        "input": [{"name": n, "data_type": "TYPE_FP32", "dims": [16]} for n in ("INPUT0", "INPUT1")],
        "output": [{"name": n, "data_type": "TYPE_FP32", "dims": [16]} for n in ("OUTPUT0", "OUTPUT1")],
        "instance_group": [{"count": instances, "kind": "KIND_CPU"}],
        "model_warmup": warmup,
    }


def _fp32(how):
    return {"data_type": "TYPE_FP32", "dims": [16], **how}


def _load(srv, warmup, instances=1):
    raw = th.RawHttp(srv.http_url)
    body = {"parameters": {"config": json.dumps(_config(warmup, instances))}}
    return raw.post_json("/v2/repository/models/add_sub/load", body)


@pytest.fixture(scope="module")
def warm_server(launch_server):
    srv = launch_server("warmup", models=("add_sub",), load_models=())
    yield srv
    srv.stop()


def test_zero_random_and_file_samples_run_before_ready(warm_server):
    # launch_server copies the model into the server's own repository, next to its log.
    model_dir = warm_server.log_path.parent / "models" / "add_sub"
    (model_dir / "warmup").mkdir(exist_ok=True)
    (model_dir / "warmup" / "in0.bin").write_bytes(np.arange(16, dtype=np.float32).tobytes())
    warmup = [
        {"name": "zeros", "batch_size": 2, "count": 3,
         "inputs": {"INPUT0": _fp32({"zero_data": True}), "INPUT1": _fp32({"random_data": True})}},
        {"name": "from a file", "batch_size": 1,
         "inputs": {"INPUT0": _fp32({"input_data_file": "in0.bin"}), "INPUT1": _fp32({"zero_data": True})}},
    ]
    r = _load(warm_server, warmup, instances=2)
    assert r.status == 200, r.describe()
    log = warm_server.log_text()
    line = next(l for l in log.splitlines() if "model version warmed up" in l and "add_sub" in l)
    assert re.search(r"samples=2\b", line) and re.search(r"instances=2\b", line), line
    c = httpclient.InferenceServerClient(warm_server.http_url)
    try:
        assert c.is_model_ready("add_sub")
        # Warmup is not traffic: the statistics start at zero, as in Triton.
        stats = c.get_inference_statistics("add_sub")["model_stats"][0]
        assert int(stats["inference_count"]) == 0, stats
        a, b = th.add_sub_inputs(seed=5)
        res = c.infer("add_sub", th.add_sub_infer_inputs(httpclient, a, b))
        np.testing.assert_array_equal(res.as_numpy("OUTPUT0"), a + b)
    finally:
        c.close()


@pytest.mark.parametrize(
    "warmup,words",
    [
        ([{"name": "short", "batch_size": 1, "inputs": {"INPUT0": _fp32({"zero_data": True})}}],
         "model_warmup 'short': no data for input 'INPUT1'"),
        ([{"name": "escape", "batch_size": 1,
           "inputs": {"INPUT0": _fp32({"input_data_file": "../config.pbtxt"}), "INPUT1": _fp32({"zero_data": True})}}],
         "must be a relative path inside the model's warmup/ directory"),
        ([{"name": "big batch", "batch_size": 9,
           "inputs": {"INPUT0": _fp32({"zero_data": True}), "INPUT1": _fp32({"zero_data": True})}}],
         "batch_size must be between 1 and max_batch_size 8"),
        ([{"name": "wrong dims", "batch_size": 1,
           "inputs": {"INPUT0": {"data_type": "TYPE_FP32", "dims": [15], "zero_data": True},
                      "INPUT1": {"data_type": "TYPE_FP32", "dims": [15], "zero_data": True}}}],
         "model_warmup 'wrong dims' failed"),
        ([{"name": "no file", "batch_size": 1,
           "inputs": {"INPUT0": _fp32({"input_data_file": "missing.bin"}), "INPUT1": _fp32({"zero_data": True})}}],
         "cannot read"),
    ],
)
def test_a_sample_that_cannot_run_fails_the_load(warm_server, warmup, words):
    r = _load(warm_server, warmup)
    th.assert_error(r, 400, words)
