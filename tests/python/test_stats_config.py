"""Model configuration (incl. auto-complete) and statistics over HTTP and gRPC."""

import time

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from google.protobuf import json_format
from tritonclient.utils import InferenceServerException

import gen_models
import tessera_helpers as th

pytestmark = pytest.mark.timeout(60)


# --------------------------------------------------------------------------
# model configuration
# --------------------------------------------------------------------------


def _expected(model_repo, name):
    return gen_models.parse_config(model_repo / name / "config.pbtxt")


def _tensors_json(tensors):
    return [(t["name"], t["data_type"], [int(d) for d in t["dims"]]) for t in tensors]


def _tensors_pb(tensors):
    from tritonclient.grpc import model_config_pb2

    return [(t.name, model_config_pb2.DataType.Name(t.data_type), list(t.dims)) for t in tensors]


def _assert_config_json_matches(cfg, exp):
    assert cfg["name"] == exp.name
    assert cfg.get("backend") == "onnxruntime" or cfg.get("platform") in ("onnxruntime_onnx",), cfg
    assert int(cfg["max_batch_size"]) == exp.max_batch_size
    assert _tensors_json(cfg["input"]) == _tensors_pb(exp.input)
    assert _tensors_json(cfg["output"]) == _tensors_pb(exp.output)


@pytest.mark.parametrize("name", ["add_sub", "mlp", "identity_BF16", "identity_BYTES", "custom_filename", "multi_version"])
def test_http_config_matches_pbtxt(http_client, raw_http, model_repo, name):
    exp = _expected(model_repo, name)
    cfg = http_client.get_model_config(name)
    _assert_config_json_matches(cfg, exp)
    r = raw_http.get(f"/v2/models/{name}/config")
    assert r.status == 200 and "application/json" in r.header("content-type", ""), r.describe()
    assert r.json() == cfg


def test_http_config_details(http_client):
    assert http_client.get_model_config("custom_filename")["default_model_filename"] == gen_models.CUSTOM_FILENAME
    assert "all" in http_client.get_model_config("multi_version")["version_policy"]
    latest = http_client.get_model_config("multi_latest").get("version_policy", {"latest": {"num_versions": 1}})
    assert "all" not in latest and int(latest.get("latest", {}).get("num_versions", 1)) == 1, latest
    assert http_client.get_model_config("add_sub", model_version="1")["name"] == "add_sub"


@pytest.mark.parametrize("name", ["add_sub", "mlp", "identity_FP16", "multi_version"])
def test_grpc_config_matches_pbtxt(grpc_client, http_client, model_repo, name):
    exp = _expected(model_repo, name)
    cfg = grpc_client.get_model_config(name).config
    assert cfg.name == exp.name and cfg.max_batch_size == exp.max_batch_size
    assert cfg.backend == "onnxruntime" or cfg.platform == "onnxruntime_onnx"
    assert _tensors_pb(cfg.input) == _tensors_pb(exp.input)
    assert _tensors_pb(cfg.output) == _tensors_pb(exp.output)
    # The HTTP JSON is the same ModelConfig (parse it with the real proto).
    from tritonclient.grpc import model_config_pb2

    h = json_format.ParseDict(http_client.get_model_config(name), model_config_pb2.ModelConfig(), ignore_unknown_fields=True)
    assert _tensors_pb(h.input) == _tensors_pb(cfg.input) and h.max_batch_size == cfg.max_batch_size


def test_auto_completed_config(http_client, grpc_client):
    cfg = http_client.get_model_config("add_sub_auto")
    assert cfg["name"] == "add_sub_auto"
    assert int(cfg["max_batch_size"]) > 0, "dynamic first dim => batching model"
    assert sorted(_tensors_json(cfg["input"])) == [("INPUT0", "TYPE_FP32", [16]), ("INPUT1", "TYPE_FP32", [16])]
    assert sorted(_tensors_json(cfg["output"])) == [("OUTPUT0", "TYPE_FP32", [16]), ("OUTPUT1", "TYPE_FP32", [16])]
    g = grpc_client.get_model_config("add_sub_auto").config
    assert g.max_batch_size == int(cfg["max_batch_size"])
    assert sorted(_tensors_pb(g.input)) == sorted(_tensors_json(cfg["input"]))
    md = http_client.get_model_metadata("add_sub_auto")
    assert sorted((t["name"], t["datatype"], t["shape"]) for t in md["inputs"]) == [
        ("INPUT0", "FP32", [-1, 16]),
        ("INPUT1", "FP32", [-1, 16]),
    ]


def test_config_unknown_model(raw_http, grpc_client):
    th.assert_error(raw_http.get("/v2/models/no_such_model_cfg/config"), 404, "no_such_model_cfg")
    with pytest.raises(InferenceServerException) as ei:
        grpc_client.get_model_config("no_such_model_cfg")
    assert th.grpc_status(ei.value) == "StatusCode.NOT_FOUND", ei.value


# --------------------------------------------------------------------------
# statistics
# --------------------------------------------------------------------------


def _stats(http_client, name, version=""):
    s = http_client.get_inference_statistics(name, version)["model_stats"]
    assert len(s) >= 1, s
    return s


def _one(http_client, name, version):
    (entry,) = [e for e in _stats(http_client, name, version) if e["version"] == version]
    return entry


def _counts(entry):
    inf = entry["inference_stats"]
    return {
        "success": int(inf["success"]["count"]),
        "queue": int(inf["queue"]["count"]),
        "compute_infer": int(inf["compute_infer"]["count"]),
        "inference_count": int(entry.get("inference_count", 0)),
        "execution_count": int(entry.get("execution_count", 0)),
    }


def _delta(before, after):
    return {k: after[k] - before[k] for k in before}


def test_http_stats_count_exactly(http_client):
    before = _counts(_one(http_client, "add_sub", "1"))
    batches = [1, 1, 1, 1, 1, 3, 8]
    for i, n in enumerate(batches):
        a, b = th.add_sub_inputs(batch=n, seed=500 + i)
        http_client.infer("add_sub", th.add_sub_infer_inputs(httpclient, a, b))
    entry = _one(http_client, "add_sub", "1")
    d = _delta(before, _counts(entry))
    assert d["success"] == len(batches), d
    assert d["queue"] == len(batches) and d["compute_infer"] == len(batches), d
    assert d["inference_count"] == sum(batches), d
    assert 1 <= d["execution_count"] <= len(batches), d
    inf = entry["inference_stats"]
    for k in ("success", "queue", "compute_input", "compute_infer", "compute_output"):
        assert int(inf[k]["ns"]) >= 0, inf[k]
    assert int(inf["success"]["ns"]) > 0 and int(inf["compute_infer"]["ns"]) > 0
    now_ms = time.time() * 1000
    assert abs(int(entry["last_inference"]) - now_ms) < 600_000, entry["last_inference"]


def test_grpc_stats_count_exactly(grpc_client):
    def counts():
        (e,) = [e for e in grpc_client.get_inference_statistics("mlp").model_stats if e.version == "1"]
        return e

    before = counts()
    for i in range(4):
        x = np.random.default_rng(i).standard_normal((2, 256)).astype(np.float32)
        grpc_client.infer("mlp", th.http_inputs(grpcclient, {"INPUT0": x}))
    after = counts()
    assert after.inference_stats.success.count - before.inference_stats.success.count == 4
    assert after.inference_count - before.inference_count == 8
    assert after.inference_stats.compute_infer.count - before.inference_stats.compute_infer.count == 4
    assert after.name == "mlp"


def test_failed_requests_do_not_count_as_success(http_client, raw_http):
    before = _counts(_one(http_client, "add_sub", "1"))
    for _ in range(3):
        req = {"inputs": [{"name": "INPUT0", "shape": [1, 16], "datatype": "FP32", "data": [0.0] * 16}]}
        assert raw_http.post_json(th.infer_path("add_sub"), req).status == 400
    d = _delta(before, _counts(_one(http_client, "add_sub", "1")))
    assert d["success"] == 0 and d["inference_count"] == 0, d


def test_stats_per_version(http_client):
    before = {v: _counts(_one(http_client, "multi_version", v)) for v in ("1", "2", "3")}
    x = np.zeros((1, 4), np.float32)
    for _ in range(3):
        http_client.infer("multi_version", th.http_inputs(httpclient, {"INPUT0": x}), model_version="2")
    after = {v: _counts(_one(http_client, "multi_version", v)) for v in ("1", "2", "3")}
    assert _delta(before["2"], after["2"])["success"] == 3
    assert _delta(before["1"], after["1"])["success"] == 0
    assert _delta(before["3"], after["3"])["success"] == 0
    all_versions = {e["version"] for e in _stats(http_client, "multi_version")}
    assert all_versions == {"1", "2", "3"}, all_versions


def test_stats_all_models(http_client, raw_http, grpc_client):
    r = raw_http.get("/v2/models/stats")
    assert r.status == 200, r.describe()
    stats = r.json()["model_stats"]
    names = {(e["name"], e["version"]) for e in stats}
    for want in [("add_sub", "1"), ("mlp", "1"), ("multi_version", "1"), ("multi_version", "3"), ("identity_BYTES", "1")]:
        assert want in names, f"{want} missing from /v2/models/stats"
    for e in stats:
        assert {"name", "version", "inference_stats"} <= set(e), e
    g = grpc_client.get_inference_statistics()
    assert {(e.name, e.version) for e in g.model_stats} >= {("add_sub", "1"), ("mlp", "1")}


def test_stats_unknown_model(raw_http, grpc_client):
    # Triton answers 400 "requested model ... is not available"; 404 is fine too.
    th.assert_error(raw_http.get("/v2/models/no_such_model_st/stats"), (400, 404), "no_such_model_st")
    with pytest.raises(InferenceServerException) as ei:
        grpc_client.get_inference_statistics("no_such_model_st")
    assert th.grpc_status(ei.value) in ("StatusCode.NOT_FOUND", "StatusCode.INVALID_ARGUMENT"), ei.value


def test_metrics_count_inferences(http_client, metrics_url):
    a, b = th.add_sub_inputs(seed=9)
    http_client.infer("add_sub", th.add_sub_infer_inputs(httpclient, a, b))
    r = th.RawHttp(metrics_url).get("/metrics")
    assert r.status == 200, r.describe()
    text = r.body.decode()
    lines = [ln for ln in text.splitlines() if ln.startswith("nv_inference_request_success") and 'model="add_sub"' in ln]
    assert lines, "no nv_inference_request_success sample for add_sub in /metrics"
    assert any(float(ln.rsplit(" ", 1)[1]) >= 1 for ln in lines), lines
