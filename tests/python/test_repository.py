"""Model repository extension: index, load/unload, control modes, isolation."""

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

import gen_models
import tessera_helpers as th

pytestmark = pytest.mark.timeout(60)

BROKEN = gen_models.BROKEN_MODELS
# load_unload is excluded: test_load_unload_* change its state.
STABLE_GOOD = [m for m in gen_models.GOOD_MODELS if m != "load_unload"]
UNLOAD_TIMEOUT_S = 15


def _by_name(index):
    out = {}
    for entry in index:
        out.setdefault(entry["name"], []).append(entry)
    return out


# --------------------------------------------------------------------------
# index
# --------------------------------------------------------------------------


def test_http_index_shape_and_states(raw_http, http_client):
    r = raw_http.post("/v2/repository/index", b"")
    assert r.status == 200, r.describe()
    index = r.json()
    assert isinstance(index, list), f"index must be a JSON array: {index!r}"
    for e in index:
        assert isinstance(e, dict) and isinstance(e.get("name"), str), e
        assert set(e) <= {"name", "version", "state", "reason"}, f"unexpected keys in {e}"
        for k in ("version", "state", "reason"):
            assert k not in e or isinstance(e[k], str), e
    assert http_client.get_model_repository_index() == index
    names = _by_name(index)
    for m in STABLE_GOOD:
        assert m in names, f"{m} missing from index {sorted(names)}"
        ready = [e for e in names[m] if e.get("state") == "READY"]
        assert ready, f"{m} not READY: {names[m]}"
        for e in ready:
            assert e.get("version"), e
            assert e.get("reason", "") == "", f"READY model with a reason: {e}"
    for m in BROKEN:
        assert m in names, f"broken model {m} missing from index {sorted(names)}"
        for e in names[m]:
            assert e.get("state") == "UNAVAILABLE", e
            assert e.get("reason", "").strip(), f"UNAVAILABLE without a reason: {e}"


def test_http_index_versions(http_client):
    names = _by_name(http_client.get_model_repository_index())
    ready_versions = lambda m: sorted(e["version"] for e in names[m] if e.get("state") == "READY")  # noqa: E731
    assert ready_versions("multi_version") == ["1", "2", "3"]
    assert ready_versions("multi_latest") == ["3"]
    assert ready_versions("add_sub") == ["1"]


def test_http_index_reasons_mention_the_problem(http_client):
    names = _by_name(http_client.get_model_repository_index())
    wrong_io_reason = " ".join(e.get("reason", "") for e in names["wrong_io"]).lower()
    assert gen_models.WRONG_IO_INPUT.lower() in wrong_io_reason, wrong_io_reason


def test_http_index_ready_filter(raw_http):
    r = raw_http.post_json("/v2/repository/index", {"ready": True})
    assert r.status == 200, r.describe()
    index = r.json()
    assert all(e.get("state") == "READY" for e in index), index
    names = {e["name"] for e in index}
    assert not names & set(BROKEN), names
    assert {"add_sub", "mlp"} <= names


def test_grpc_index(grpc_client, http_client):
    g = grpc_client.get_model_repository_index()
    entries = [(m.name, m.version, m.state) for m in g.models]
    names = {}
    for name, version, state in entries:
        names.setdefault(name, []).append((version, state))
    for m in STABLE_GOOD:
        assert any(s == "READY" for _, s in names.get(m, [])), (m, names.get(m))
    for m in BROKEN:
        assert names.get(m) and all(s == "UNAVAILABLE" for _, s in names[m]), (m, names.get(m))
    for m in g.models:
        if m.name in BROKEN:
            assert m.reason.strip(), m
    h = {(e["name"], e.get("version", ""), e.get("state", "")) for e in http_client.get_model_repository_index()}
    assert set(entries) == h


def test_server_still_ready_with_broken_models(http_client, grpc_client):
    # --strict-readiness false: broken models do not make the server unready.
    assert http_client.is_server_ready() and grpc_client.is_server_ready()


# --------------------------------------------------------------------------
# load / unload (explicit mode)
# --------------------------------------------------------------------------


def _infer_load_unload(client, module):
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    res = client.infer("load_unload", th.http_inputs(module, {"INPUT0": x}))
    np.testing.assert_array_equal(res.as_numpy("OUTPUT0"), x + gen_models.LOAD_UNLOAD_ADD)


def _index_state(http_client, name):
    states = [e.get("state") for e in http_client.get_model_repository_index() if e["name"] == name]
    return states


def test_load_unload_http(http_client, raw_http):
    assert http_client.is_model_ready("load_unload")
    _infer_load_unload(http_client, httpclient)

    r = raw_http.post("/v2/repository/models/load_unload/unload", b"")
    assert r.status == 200, r.describe()
    th.wait_until(lambda: not http_client.is_model_ready("load_unload"), UNLOAD_TIMEOUT_S, what="unload")
    assert not http_client.is_model_ready("load_unload", "1")
    with pytest.raises(InferenceServerException) as ei:
        _infer_load_unload(http_client, httpclient)
    assert ei.value.status() in ("404", "503"), ei.value
    assert "load_unload" in ei.value.message()
    assert "READY" not in _index_state(http_client, "load_unload")

    r = raw_http.post("/v2/repository/models/load_unload/load", b"")
    assert r.status == 200, r.describe()
    assert r.body in (b"", b"{}"), r.describe()
    assert http_client.is_model_ready("load_unload")
    _infer_load_unload(http_client, httpclient)
    assert "READY" in _index_state(http_client, "load_unload")


def test_load_unload_grpc(grpc_client, http_client):
    grpc_client.unload_model("load_unload")
    th.wait_until(lambda: not grpc_client.is_model_ready("load_unload"), UNLOAD_TIMEOUT_S, what="unload")
    with pytest.raises(InferenceServerException) as ei:
        _infer_load_unload(grpc_client, grpcclient)
    assert th.grpc_status(ei.value) in ("StatusCode.NOT_FOUND", "StatusCode.UNAVAILABLE"), ei.value
    grpc_client.load_model("load_unload")
    assert grpc_client.is_model_ready("load_unload")
    _infer_load_unload(grpc_client, grpcclient)
    _infer_load_unload(http_client, httpclient)


def test_reload_of_loaded_model(http_client):
    http_client.load_model("load_unload")
    assert http_client.is_model_ready("load_unload")
    _infer_load_unload(http_client, httpclient)


def test_unload_load_via_tritonclient_http(http_client):
    http_client.unload_model("load_unload")
    th.wait_until(lambda: not http_client.is_model_ready("load_unload"), UNLOAD_TIMEOUT_S, what="unload")
    http_client.load_model("load_unload")
    assert http_client.is_model_ready("load_unload")
    _infer_load_unload(http_client, httpclient)


def test_load_unknown_model_fails(http_client, grpc_client):
    with pytest.raises(InferenceServerException) as ei:
        http_client.load_model("no_such_model_on_disk")
    assert ei.value.status() in ("400", "404"), ei.value
    assert "no_such_model_on_disk" in ei.value.message()
    with pytest.raises(InferenceServerException) as ei:
        grpc_client.load_model("no_such_model_on_disk")
    assert th.grpc_status(ei.value) in ("StatusCode.INVALID_ARGUMENT", "StatusCode.NOT_FOUND"), ei.value


@pytest.mark.parametrize("model", BROKEN)
def test_load_broken_model_fails_and_others_keep_serving(http_client, model):
    with pytest.raises(InferenceServerException) as ei:
        http_client.load_model(model)
    assert ei.value.status() is not None and ei.value.status().startswith(("4", "5")), ei.value
    assert ei.value.status() != "200"
    assert model in ei.value.message(), ei.value.message()
    assert not http_client.is_model_ready(model)
    entries = [e for e in http_client.get_model_repository_index() if e["name"] == model]
    assert entries and all(e.get("state") == "UNAVAILABLE" and e.get("reason") for e in entries), entries
    a, b = th.add_sub_inputs(seed=1)
    res = http_client.infer("add_sub", th.add_sub_infer_inputs(httpclient, a, b))
    np.testing.assert_array_equal(res.as_numpy("OUTPUT0"), a + b)


def test_malformed_load_body(raw_http):
    th.assert_error(raw_http.post("/v2/repository/models/load_unload/load", b"{not json"), 400)


# --------------------------------------------------------------------------
# --model-control-mode none: load/unload refused
# --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def none_mode_server(launch_server):
    srv = launch_server("control-none", control_mode="none", models=["add_sub", "multi_latest"])
    yield srv
    srv.stop()


def test_none_mode_serves_everything(none_mode_server):
    c = httpclient.InferenceServerClient(none_mode_server.http_url)
    try:
        assert c.is_model_ready("add_sub") and c.is_model_ready("multi_latest")
        names = {e["name"] for e in c.get_model_repository_index() if e.get("state") == "READY"}
        assert names == {"add_sub", "multi_latest"}
    finally:
        c.close()


def test_none_mode_refuses_load_and_unload_http(none_mode_server):
    raw = th.RawHttp(none_mode_server.http_url)
    for action in ("unload", "load"):
        r = raw.post(f"/v2/repository/models/add_sub/{action}", b"")
        # Triton 2.51 answers 503 with these words in every mode but explicit.
        th.assert_error(r, 503, "explicit model load / unload is not allowed if polling is enabled")
    c = httpclient.InferenceServerClient(none_mode_server.http_url)
    try:
        assert c.is_model_ready("add_sub")
        a, b = th.add_sub_inputs(seed=2)
        np.testing.assert_array_equal(c.infer("add_sub", th.add_sub_infer_inputs(httpclient, a, b)).as_numpy("OUTPUT1"), a - b)
    finally:
        c.close()


def test_none_mode_refuses_load_and_unload_grpc(none_mode_server):
    c = grpcclient.InferenceServerClient(none_mode_server.grpc_url)
    try:
        for op in (c.unload_model, c.load_model):
            with pytest.raises(InferenceServerException) as ei:
                op("add_sub")
            assert th.grpc_status(ei.value) == "StatusCode.UNAVAILABLE", ei.value
            assert "explicit model load / unload is not allowed if polling is enabled" in ei.value.message(), ei.value
        assert c.is_model_ready("add_sub")
    finally:
        c.close()
