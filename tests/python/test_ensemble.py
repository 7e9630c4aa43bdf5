"""Ensembles (Triton's ``platform: "ensemble"``), as Triton's documented example runs them: an
ensemble of a preprocess model and add_sub, wired by ``ensemble_scheduling { step [...] }`` with
``input_map``/``output_map``, called with tritonclient over HTTP and gRPC. The ensemble's version
directory is empty (it has no model file); its steps count in their own statistics; a request's
failure never touches another request's tensors; explicit loads pull the steps in and unloading a
step takes its ensembles down, as in Triton 2.51."""

import concurrent.futures

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

import gen_models
import tessera_helpers as th

pytestmark = pytest.mark.timeout(120)

ENSEMBLE = "ensemble_add_sub"
MODELS = ("add_sub", "preprocess", ENSEMBLE)


def _client(protocol, srv):
    if protocol == "http":
        return httpclient.InferenceServerClient(srv.http_url), httpclient
    return grpcclient.InferenceServerClient(srv.grpc_url), grpcclient


def _infer(client, module, a, b, outputs=None):
    inputs = th.add_sub_infer_inputs(module, a, b)
    requested = [module.InferRequestedOutput(o) for o in outputs] if outputs else None
    return client.infer(ENSEMBLE, inputs, outputs=requested)


def _expect(a, b):
    scaled = a * gen_models.PREPROCESS_SCALE
    return scaled + b, scaled - b


def _stats(client, model):
    stats = client.get_inference_statistics(model)
    if isinstance(stats, dict):
        s = stats["model_stats"][0]
        return s["inference_count"], s["inference_stats"]["success"]["count"]
    s = stats.model_stats[0]
    return s.inference_count, s.inference_stats.success.count


@pytest.fixture(scope="module")
def ens_server(launch_server):
    srv = launch_server("ensemble", models=MODELS)
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def runner_server(launch_server):
    srv = launch_server("ensemble-runner", models=MODELS, extra_args=("--runner",))
    yield srv
    srv.stop()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_the_documented_example_runs_both_steps(ens_server, protocol):
    client, module = _client(protocol, ens_server)
    a, b = th.add_sub_inputs(batch=3, seed=4)
    result = _infer(client, module, a, b)
    want0, want1 = _expect(a, b)
    np.testing.assert_allclose(result.as_numpy("OUTPUT0"), want0, rtol=1e-6)
    np.testing.assert_allclose(result.as_numpy("OUTPUT1"), want1, rtol=1e-6)
    response = result.get_response()
    name, version = (response["model_name"], response["model_version"]) if protocol == "http" else (
        response.model_name, response.model_version)
    assert (name, version) == (ENSEMBLE, "1")
    only = _infer(client, module, a, b, outputs=["OUTPUT1"])
    np.testing.assert_allclose(only.as_numpy("OUTPUT1"), want1, rtol=1e-6)
    assert only.as_numpy("OUTPUT0") is None


def test_the_ensemble_is_served_like_a_model_with_platform_ensemble(ens_server):
    client, _ = _client("http", ens_server)
    meta = client.get_model_metadata(ENSEMBLE)
    assert meta["platform"] == "ensemble"
    assert [i["name"] for i in meta["inputs"]] == ["INPUT0", "INPUT1"]
    assert meta["inputs"][0]["shape"] == [-1, 16]
    config = client.get_model_config(ENSEMBLE)
    steps = config["ensemble_scheduling"]["step"]
    assert [s["model_name"] for s in steps] == ["preprocess", "add_sub"]
    assert steps[1]["input_map"] == {"INPUT0": "preprocessed", "INPUT1": "INPUT1"}
    index = {(m["name"], m.get("state")) for m in client.get_model_repository_index()}
    assert {(m, "READY") for m in MODELS} <= index


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_each_composing_model_counts_the_ensemble_requests(ens_server, protocol):
    client, module = _client(protocol, ens_server)
    before = {m: _stats(client, m) for m in MODELS}
    a, b = th.add_sub_inputs(batch=2, seed=9)
    for _ in range(3):
        _infer(client, module, a, b)
    after = {m: _stats(client, m) for m in MODELS}
    for model in MODELS:
        rows = after[model][0] - before[model][0]
        successes = after[model][1] - before[model][1]
        assert (rows, successes) == (6, 3), f"{model}: {rows} rows, {successes} successes"


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_bad_requests_are_refused_like_any_model(ens_server, protocol):
    client, module = _client(protocol, ens_server)
    a, _ = th.add_sub_inputs(batch=1)
    only_one = th.http_inputs(module, {"INPUT0": a})
    with pytest.raises(InferenceServerException) as e:
        client.infer(ENSEMBLE, only_one)
    assert "missing required input(s) ['INPUT1']" in e.value.message()
    assert e.value.status() in ("400", "StatusCode.INVALID_ARGUMENT")
    short = th.http_inputs(module, {"INPUT0": a, "INPUT1": np.ones((1, 15), np.float32)})
    with pytest.raises(InferenceServerException) as e:
        client.infer(ENSEMBLE, short)
    assert "unexpected shape for input 'INPUT1' for model 'ensemble_add_sub'" in e.value.message()


def test_failing_requests_never_leak_into_concurrent_ones(ens_server):
    """Good and bad requests interleaved on many threads: every good one gets exactly its own
    answer, every bad one its own error."""

    def one(i):
        client = httpclient.InferenceServerClient(ens_server.http_url)
        a, b = th.add_sub_inputs(batch=1 + i % 3, seed=100 + i)
        if i % 4 == 3:
            bad = th.http_inputs(httpclient, {"INPUT0": a, "INPUT1": b[:, :15].copy()})
            try:
                client.infer(ENSEMBLE, bad)
            except InferenceServerException as e:
                return "refused" if "INPUT1" in e.message() else e.message()
            return "a bad request succeeded"
        result = _infer(client, httpclient, a, b)
        want0, want1 = _expect(a, b)
        same = np.allclose(result.as_numpy("OUTPUT0"), want0) and np.allclose(result.as_numpy("OUTPUT1"), want1)
        return "ok" if same else f"request {i} got another answer"

    with concurrent.futures.ThreadPoolExecutor(max_workers=8) as pool:
        outcomes = list(pool.map(one, range(32)))
    assert outcomes.count("ok") == 24 and outcomes.count("refused") == 8, outcomes


def test_explicit_load_pulls_in_the_steps_and_unloading_a_step_unloads_the_ensemble(launch_server):
    srv = launch_server("ensemble-explicit", models=MODELS, load_models=())
    try:
        client = httpclient.InferenceServerClient(srv.http_url)
        client.load_model(ENSEMBLE)
        assert all(client.is_model_ready(m) for m in MODELS)
        a, b = th.add_sub_inputs(batch=1, seed=2)
        np.testing.assert_allclose(_infer(client, httpclient, a, b).as_numpy("OUTPUT0"), _expect(a, b)[0], rtol=1e-6)
        client.unload_model("preprocess")
        th.wait_until(lambda: not client.is_model_ready(ENSEMBLE), what="the ensemble unloads with its step")
        rows = {m["name"]: m for m in client.get_model_repository_index()}
        assert rows[ENSEMBLE]["state"] == "UNAVAILABLE" and rows["add_sub"]["state"] == "READY"
    finally:
        srv.stop()


def test_an_ensemble_naming_a_model_that_is_not_there_fails_to_load_with_the_reason(launch_server):
    srv = launch_server("ensemble-missing", models=MODELS, load_models=())
    try:
        raw = th.RawHttp(srv.http_url)
        config = gen_models.ENSEMBLE_CONFIG.replace('model_name: "preprocess"', 'model_name: "no_such_model"')
        config_json = {"parameters": {"config": _pbtxt_to_json(config)}}
        r = raw.post_json(f"/v2/repository/models/{ENSEMBLE}/load", config_json)
        th.assert_error(r, (400,), "ensemble ensemble_add_sub contains models that are not available or ambiguous",
                        "no_such_model")
        with pytest.raises(InferenceServerException) as e:
            grpcclient.InferenceServerClient(srv.grpc_url).load_model(ENSEMBLE, config=_pbtxt_to_json(config))
        assert "no_such_model" in e.value.message()
        assert e.value.status() == "StatusCode.INVALID_ARGUMENT"
    finally:
        srv.stop()


def _pbtxt_to_json(text):
    from google.protobuf import json_format, text_format
    from tritonclient.grpc import model_config_pb2

    config = model_config_pb2.ModelConfig()
    text_format.Parse(text, config)
    return json_format.MessageToJson(config, preserving_proto_field_name=True)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_steps_hosted_in_a_runner_process_run_the_same(runner_server, protocol):
    client, module = _client(protocol, runner_server)
    a, b = th.add_sub_inputs(batch=4, seed=11)
    result = _infer(client, module, a, b)
    want0, want1 = _expect(a, b)
    np.testing.assert_allclose(result.as_numpy("OUTPUT0"), want0, rtol=1e-6)
    np.testing.assert_allclose(result.as_numpy("OUTPUT1"), want1, rtol=1e-6)
    th.wait_until(lambda: _stats(client, "preprocess")[0] >= 4, what="the runner's statistics reach the front")
