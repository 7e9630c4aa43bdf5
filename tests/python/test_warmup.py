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
    # The log line may reach the file just after the load's answer.
    th.wait_until(lambda: "model version warmed up" in warm_server.log_text(), what="the warmup's log line")
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


def _int32(how):
    return {"data_type": "TYPE_INT32", "dims": [1], **how}


def _sequence_config(warmup):
    control = lambda name, kind: {"name": name, "control": [{"kind": kind, "int32_false_true": [0, 1]}]}
    return {
        "name": "simple_sequence",
        "backend": "onnxruntime",
        "max_batch_size": 8,
        "input": [{"name": "INPUT", "data_type": "TYPE_INT32", "dims": [1]}],
        "output": [{"name": "OUTPUT", "data_type": "TYPE_INT32", "dims": [1]}],
        "sequence_batching": {
            "control_input": [control("START", "CONTROL_SEQUENCE_START"), control("READY", "CONTROL_SEQUENCE_READY")],
            "state": [{"input_name": "ACC_IN", "output_name": "ACC_OUT", "data_type": "TYPE_INT32", "dims": [1]}],
        },
        "instance_group": [{"count": 1, "kind": "KIND_CPU"}],
        "model_warmup": warmup,
    }


@pytest.fixture(scope="module")
def sequence_server(launch_server):
    srv = launch_server("warmup-sequence", models=("simple_sequence",), load_models=())
    yield srv
    srv.stop()


def _load_sequence(srv, warmup):
    body = {"parameters": {"config": json.dumps(_sequence_config(warmup))}}
    return th.RawHttp(srv.http_url).post_json("/v2/repository/models/simple_sequence/load", body)


def test_a_sequence_models_samples_give_its_controls_and_leave_no_state(sequence_server):
    """As in Triton, a stateful model's samples go to the model itself with its control inputs
    (its implicit state starts from zeros); sequences served afterwards start from nothing."""
    warmup = [{"name": "sequence sample", "batch_size": 1, "count": 2,
               "inputs": {"INPUT": _int32({"random_data": True}), "START": _int32({"zero_data": True}),
                          "READY": _int32({"zero_data": True})}}]
    r = _load_sequence(sequence_server, warmup)
    assert r.status == 200, r.describe()
    def warmed():
        return [l for l in sequence_server.log_text().splitlines()
                if "model version warmed up" in l and "simple_sequence" in l]

    th.wait_until(warmed, what="the warmup's log line")
    assert re.search(r"samples=1\b", warmed()[0]), warmed()
    c = httpclient.InferenceServerClient(sequence_server.http_url)
    try:
        totals = []
        for i, value in enumerate([4, 5]):
            x = httpclient.InferInput("INPUT", [1, 1], "INT32")
            x.set_data_from_numpy(np.array([[value]], dtype=np.int32))
            res = c.infer("simple_sequence", [x], sequence_id=11, sequence_start=i == 0, sequence_end=i == 1)
            totals.append(int(res.as_numpy("OUTPUT")[0][0]))
        assert totals == [4, 9], totals
    finally:
        c.close()
    # A sample without a control input cannot run the model, and says which input it lacks.
    short = [{"name": "no start", "batch_size": 1,
              "inputs": {"INPUT": _int32({"zero_data": True}), "READY": _int32({"zero_data": True})}}]
    th.assert_error(_load_sequence(sequence_server, short), 400, "model_warmup 'no start': no data for input 'START'")
