"""Triton's response cache: a model with ``response_cache { enable: true }`` answers the exact
same request again from the cache, without running the model. Hits and misses show in the
statistics extension (``cache_hit``/``cache_miss``) and in ``/metrics``
(``nv_cache_num_hits_per_model`` ...) as Triton 2.51 counts them: a hit is a success but no
inference or execution. Isolation between tenants is tested on a multi-tenant manager in Rust
(``engine::ensemble::tests``), where tenants exist."""

import urllib.request

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

import tessera_helpers as th

pytestmark = pytest.mark.timeout(90)

CACHED = "add_sub_cached"


def _client(protocol, srv):
    if protocol == "http":
        return httpclient.InferenceServerClient(srv.http_url), httpclient
    return grpcclient.InferenceServerClient(srv.grpc_url), grpcclient


def _stats(client, model):
    """(inference_count, execution_count, successes, cache hits, cache misses)."""
    stats = client.get_inference_statistics(model)
    if isinstance(stats, dict):
        s = stats["model_stats"][0]
        i = s["inference_stats"]
        return (s["inference_count"], s["execution_count"], i["success"]["count"], i["cache_hit"]["count"],
                i["cache_miss"]["count"])
    s = stats.model_stats[0]
    i = s.inference_stats
    return s.inference_count, s.execution_count, i.success.count, i.cache_hit.count, i.cache_miss.count


def _infer(client, module, model, a, b):
    return client.infer(model, th.add_sub_infer_inputs(module, a, b))


def _delta(after, before):
    return tuple(x - y for x, y in zip(after, before))


@pytest.fixture(scope="module")
def cache_server(launch_server):
    srv = launch_server("cache", models=("add_sub", CACHED))
    yield srv
    srv.stop()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_the_same_request_is_a_hit_and_a_different_one_a_miss(cache_server, protocol):
    client, module = _client(protocol, cache_server)
    a, b = th.add_sub_inputs(batch=2, seed={"http": 1, "grpc": 2}[protocol])
    before = _stats(client, CACHED)
    first = _infer(client, module, CACHED, a, b)
    second = _infer(client, module, CACHED, a, b)
    for result in (first, second):
        np.testing.assert_allclose(result.as_numpy("OUTPUT0"), a + b, rtol=1e-6)
        np.testing.assert_allclose(result.as_numpy("OUTPUT1"), a - b, rtol=1e-6)
    # inference, execution, success, hit, miss: the hit ran nothing.
    assert _delta(_stats(client, CACHED), before) == (2, 1, 2, 1, 1)
    other = a.copy()
    other[0, 0] += 1.0
    third = _infer(client, module, CACHED, other, b)
    np.testing.assert_allclose(third.as_numpy("OUTPUT0"), other + b, rtol=1e-6)
    assert _delta(_stats(client, CACHED), before) == (4, 2, 3, 1, 2), "one changed element is a miss"


def test_asking_for_other_outputs_is_another_answer(cache_server):
    client, module = _client("http", cache_server)
    a, b = th.add_sub_inputs(batch=1, seed=77)
    _infer(client, module, CACHED, a, b)
    before = _stats(client, CACHED)
    only = client.infer(CACHED, th.add_sub_infer_inputs(module, a, b), outputs=[module.InferRequestedOutput("OUTPUT1")])
    np.testing.assert_allclose(only.as_numpy("OUTPUT1"), a - b, rtol=1e-6)
    assert only.as_numpy("OUTPUT0") is None
    assert _delta(_stats(client, CACHED), before)[3:] == (0, 1)


def test_hits_and_misses_are_in_the_metrics_with_tritons_names(cache_server):
    client, module = _client("http", cache_server)
    a, b = th.add_sub_inputs(batch=1, seed=5)
    for _ in range(3):
        _infer(client, module, CACHED, a, b)
    _, _, _, hits, misses = _stats(client, CACHED)
    text = urllib.request.urlopen(f"http://{cache_server.metrics_url}/metrics").read().decode()
    labels = f'{{model="{CACHED}",version="1"}}'
    assert f"nv_cache_num_hits_per_model{labels} {hits}" in text
    assert f"nv_cache_num_misses_per_model{labels} {misses}" in text
    assert "# TYPE nv_cache_hit_duration_per_model counter" in text
    assert f"nv_cache_miss_duration_per_model{labels}" in text


def test_a_model_without_response_cache_always_runs(cache_server):
    client, module = _client("grpc", cache_server)
    a, b = th.add_sub_inputs(batch=1, seed=6)
    before = _stats(client, "add_sub")
    for _ in range(2):
        _infer(client, module, "add_sub", a, b)
    assert _delta(_stats(client, "add_sub"), before) == (2, 2, 2, 0, 0)


def test_a_server_with_no_cache_bytes_runs_every_request(launch_server):
    srv = launch_server("cache-off", models=(CACHED,), extra_args=("--response-cache-mib", "0"))
    try:
        client, module = _client("http", srv)
        a, b = th.add_sub_inputs(batch=1, seed=8)
        for _ in range(2):
            _infer(client, module, CACHED, a, b)
        assert _stats(client, CACHED) == (2, 2, 2, 0, 0)
    finally:
        srv.stop()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_model_in_a_runner_process_is_cached_in_front_of_it(launch_server, protocol):
    srv = launch_server(f"cache-runner-{protocol}", models=(CACHED,), extra_args=("--runner",))
    try:
        client, module = _client(protocol, srv)
        a, b = th.add_sub_inputs(batch=3, seed=12)
        for _ in range(3):
            result = _infer(client, module, CACHED, a, b)
            np.testing.assert_allclose(result.as_numpy("OUTPUT0"), a + b, rtol=1e-6)
        th.wait_until(lambda: _stats(client, CACHED)[0] == 3, what="the runner's statistics reach the front")
        assert _stats(client, CACHED) == (3, 1, 3, 2, 1)
    finally:
        srv.stop()
