"""Health, server metadata and model metadata/readiness over HTTP and gRPC."""

import pytest
from tritonclient.utils import InferenceServerException

import tessera_helpers as th

pytestmark = pytest.mark.timeout(60)

REQUIRED_EXTENSIONS = ("binary_tensor_data", "model_repository", "statistics", "model_configuration")


# --------------------------------------------------------------------------
# health
# --------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/v2/health/live", "/v2/health/ready"])
def test_http_health_200_with_empty_body(raw_http, path):
    r = raw_http.get(path)
    assert r.status == 200, r.describe()
    assert r.body == b"", f"health bodies must be empty (Triton encodes the answer in the status): {r.describe()}"


def test_http_health_via_tritonclient(http_client):
    assert http_client.is_server_live() is True
    # --strict-readiness false: broken models in the repository do not make the server unready.
    assert http_client.is_server_ready() is True


def test_grpc_health(grpc_client):
    assert grpc_client.is_server_live() is True
    assert grpc_client.is_server_ready() is True


def test_grpc_health_raw_messages(grpc_url):
    s = th.grpc_stub(grpc_url)
    try:
        assert s.stub.ServerLive(s.pb.ServerLiveRequest()).live is True
        assert s.stub.ServerReady(s.pb.ServerReadyRequest()).ready is True
    finally:
        s.close()


# --------------------------------------------------------------------------
# server metadata
# --------------------------------------------------------------------------


def test_http_server_metadata(raw_http, http_client):
    r = raw_http.get("/v2")
    assert r.status == 200, r.describe()
    assert "application/json" in r.header("content-type", ""), r.headers
    md = r.json()
    assert isinstance(md["name"], str) and md["name"], md
    assert isinstance(md["version"], str) and md["version"], md
    assert isinstance(md["extensions"], list), md
    for ext in REQUIRED_EXTENSIONS:
        assert ext in md["extensions"], f"extension {ext!r} missing from {md['extensions']}"
    assert http_client.get_server_metadata() == md


def test_grpc_server_metadata(grpc_client, http_client):
    md = grpc_client.get_server_metadata()
    assert md.name and md.version
    for ext in REQUIRED_EXTENSIONS:
        assert ext in md.extensions, f"extension {ext!r} missing from {list(md.extensions)}"
    as_json = grpc_client.get_server_metadata(as_json=True)
    h = http_client.get_server_metadata()
    assert as_json["name"] == h["name"] and as_json["version"] == h["version"]
    assert sorted(as_json["extensions"]) == sorted(h["extensions"])


# --------------------------------------------------------------------------
# model metadata
# --------------------------------------------------------------------------

ADD_SUB_IO = {
    "inputs": [("INPUT0", "FP32", [-1, 16]), ("INPUT1", "FP32", [-1, 16])],
    "outputs": [("OUTPUT0", "FP32", [-1, 16]), ("OUTPUT1", "FP32", [-1, 16])],
}


def _io(tensors):
    return [(t["name"], t["datatype"], [int(d) for d in t["shape"]]) for t in tensors]


@pytest.mark.parametrize("version", ["", "1"])
def test_http_model_metadata(http_client, raw_http, version):
    md = http_client.get_model_metadata("add_sub", model_version=version)
    assert md["name"] == "add_sub"
    assert "1" in md["versions"], md
    assert isinstance(md.get("platform"), str) and md["platform"], md
    assert _io(md["inputs"]) == ADD_SUB_IO["inputs"]
    assert _io(md["outputs"]) == ADD_SUB_IO["outputs"]
    path = "/v2/models/add_sub" + (f"/versions/{version}" if version else "")
    r = raw_http.get(path)
    assert r.status == 200 and r.json() == md, r.describe()


@pytest.mark.parametrize("version", ["", "1"])
def test_grpc_model_metadata(grpc_client, version):
    md = grpc_client.get_model_metadata("add_sub", model_version=version)
    assert md.name == "add_sub"
    assert "1" in md.versions
    assert md.platform
    assert [(t.name, t.datatype, list(t.shape)) for t in md.inputs] == ADD_SUB_IO["inputs"]
    assert [(t.name, t.datatype, list(t.shape)) for t in md.outputs] == ADD_SUB_IO["outputs"]


def test_model_metadata_identity_and_mlp(http_client, grpc_client):
    md = http_client.get_model_metadata("identity_BYTES")
    assert _io(md["inputs"]) == [("INPUT0", "BYTES", [-1, -1])]
    md = http_client.get_model_metadata("identity_BF16")
    assert _io(md["outputs"]) == [("OUTPUT0", "BF16", [-1, -1])]
    g = grpc_client.get_model_metadata("mlp")
    assert [(t.name, t.datatype, list(t.shape)) for t in g.inputs] == [("INPUT0", "FP32", [-1, 256])]
    assert [(t.name, t.datatype, list(t.shape)) for t in g.outputs] == [("OUTPUT0", "FP32", [-1, 10])]


def test_model_metadata_versions(http_client, grpc_client):
    assert sorted(http_client.get_model_metadata("multi_version")["versions"]) == ["1", "2", "3"]
    assert http_client.get_model_metadata("multi_latest")["versions"] == ["3"]
    assert sorted(grpc_client.get_model_metadata("multi_version").versions) == ["1", "2", "3"]
    assert list(grpc_client.get_model_metadata("multi_latest").versions) == ["3"]


def test_model_metadata_unknown_model(http_client, grpc_client, raw_http):
    r = raw_http.get("/v2/models/no_such_model")
    th.assert_error(r, 404, "no_such_model")
    with pytest.raises(InferenceServerException) as ei:
        grpc_client.get_model_metadata("no_such_model")
    assert th.grpc_status(ei.value) == "StatusCode.NOT_FOUND", ei.value
    assert "no_such_model" in ei.value.message()


def test_model_metadata_unknown_version(raw_http, grpc_client):
    r = raw_http.get("/v2/models/multi_latest/versions/1")
    th.assert_error(r, 404, "multi_latest")
    r = raw_http.get("/v2/models/add_sub/versions/7")
    th.assert_error(r, 404, "add_sub")
    with pytest.raises(InferenceServerException) as ei:
        grpc_client.get_model_metadata("add_sub", model_version="7")
    assert th.grpc_status(ei.value) == "StatusCode.NOT_FOUND", ei.value


# --------------------------------------------------------------------------
# model readiness
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "model,version,ready",
    [
        ("add_sub", "", True),
        ("add_sub", "1", True),
        ("add_sub", "2", False),
        ("add_sub_auto", "", True),
        ("mlp", "", True),
        ("multi_version", "1", True),
        ("multi_version", "2", True),
        ("multi_version", "3", True),
        ("multi_latest", "", True),
        ("multi_latest", "3", True),
        ("multi_latest", "1", False),
        ("custom_filename", "", True),
        ("no_such_model", "", False),
        ("bad_onnx", "", False),
        ("bad_config", "", False),
        ("wrong_io", "", False),
    ],
)
def test_model_ready(http_client, grpc_client, raw_http, model, version, ready):
    assert http_client.is_model_ready(model, version) is ready
    assert grpc_client.is_model_ready(model, version) is ready
    path = f"/v2/models/{model}" + (f"/versions/{version}" if version else "") + "/ready"
    r = raw_http.get(path)
    if ready:
        assert r.status == 200 and r.body == b"", r.describe()
    else:
        # Triton answers 400 for "not ready"; a server may say 404 for a model
        # or version it does not know. Either way a 4xx with a JSON error body.
        assert 400 <= r.status < 500, r.describe()
        th.error_message(r)


def test_metrics_listener_answers(metrics_url):
    r = th.RawHttp(metrics_url).get("/metrics")
    assert r.status == 200, r.describe()
    assert "text/plain" in r.header("content-type", ""), r.headers
