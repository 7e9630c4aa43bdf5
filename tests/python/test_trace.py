"""Triton's trace extension (`v2/trace/setting`, `v2/models/{m}/trace/setting`, gRPC
`TraceSetting`) with tritonclient's `get_trace_settings` / `update_trace_settings`, checked
against what Triton 2.51 answers; the JSON trace file Triton writes (`--trace-config
triton,file=...`), sampling (`trace_rate`, `trace_count`), file rotation (`log_frequency`), and
OpenTelemetry spans sent to an OTLP/HTTP receiver started here.

Tessera refuses some values Triton accepts or answers with a 500 (unknown keys and levels,
non-string values, TENSORS); those cases are marked below."""

import http.server
import json
import threading
from pathlib import Path

import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

import tessera_helpers as th

pytestmark = pytest.mark.timeout(120)

HTTP_ORDER = ["HTTP_RECV_START", "HTTP_RECV_END", "REQUEST_START", "QUEUE_START", "COMPUTE_START",
              "COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START", "COMPUTE_END", "REQUEST_END",
              "INFER_RESPONSE_COMPLETE", "HTTP_SEND_START", "HTTP_SEND_END"]
GRPC_ORDER = ["GRPC_WAITREAD_START", "GRPC_WAITREAD_END", "REQUEST_START", "QUEUE_START", "COMPUTE_START",
              "COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START", "COMPUTE_END", "REQUEST_END",
              "INFER_RESPONSE_COMPLETE", "GRPC_SEND_START", "GRPC_SEND_END"]


def _trace_server(launch_server, tmp_path: Path, name: str, *config: str):
    """A server tracing to a file; `config` holds more `--trace-config` values, or flags."""
    trace_file = tmp_path / "trace.json"
    args = ["--trace-config", f"triton,file={trace_file}"]
    for c in config:
        args += [c] if c.startswith("--") else ["--trace-config", c]
    return launch_server(name, extra_args=args), trace_file


@pytest.fixture
def traced(launch_server, tmp_path):
    srv, trace_file = _trace_server(launch_server, tmp_path, "trace")
    yield srv, trace_file
    srv.stop()


def _infer(module, url: str, request_id: str, headers=None):
    client = module.InferenceServerClient(url)
    a, b = th.add_sub_inputs()
    kw = {"headers": headers} if headers else {}
    client.infer("add_sub", th.add_sub_infer_inputs(module, a, b), request_id=request_id, **kw)


def _grpc_settings(raw: dict) -> dict:
    """gRPC answers value lists; shaped as HTTP answers them (lists only for trace_level)."""
    return {k: (v["value"] if k == "trace_level" else v["value"][0]) for k, v in raw["settings"].items()}


def _traces(path: Path) -> dict:
    """The trace file's objects grouped by trace id: the info object and the timestamps."""
    by_id = {}
    for obj in json.loads(path.read_text()):
        t = by_id.setdefault(obj["id"], {"info": None, "events": []})
        if "timestamps" in obj:
            t["events"] += [(ts["name"], ts["ns"]) for ts in obj["timestamps"]]
        else:
            t["info"] = obj
    return by_id


def _traced_request_ids(path: Path) -> list:
    if not path.exists():
        return []
    return [t["info"]["request_id"] for t in _traces(path).values() if t["info"]]


def test_settings_read_and_change_globally_and_per_model(traced):
    srv, trace_file = traced
    http = httpclient.InferenceServerClient(srv.http_url)
    grpc = grpcclient.InferenceServerClient(srv.grpc_url)
    assert "trace" in http.get_server_metadata()["extensions"]
    defaults = {"trace_level": ["OFF"], "trace_rate": "1000", "trace_count": "-1", "log_frequency": "0",
                "trace_file": str(trace_file), "trace_mode": "triton"}
    assert http.get_trace_settings() == defaults
    assert _grpc_settings(grpc.get_trace_settings(as_json=True)) == defaults
    assert http.get_trace_settings(model_name="add_sub") == defaults

    changed = http.update_trace_settings(settings={"trace_rate": "5", "log_frequency": "2"})
    assert changed == {**defaults, "trace_rate": "5", "log_frequency": "2"}
    # A model's own key overrides the global one; its other keys follow the global settings.
    model = grpc.update_trace_settings(model_name="add_sub", settings={"trace_rate": "7"}, as_json=True)
    assert _grpc_settings(model)["trace_rate"] == "7"
    http.update_trace_settings(settings={"trace_count": "20"})
    assert http.get_trace_settings(model_name="add_sub") == {
        **defaults, "trace_rate": "7", "trace_count": "20", "log_frequency": "2"}
    assert http.get_trace_settings()["trace_rate"] == "5"
    # null (an empty list over gRPC) clears: the model falls back to the global value, a global
    # key to its value at start.
    cleared = http.update_trace_settings(model_name="add_sub", settings={"trace_rate": None})
    assert cleared["trace_rate"] == "5"
    after = grpc.update_trace_settings(settings={"trace_rate": [], "log_frequency": None, "trace_count": None},
                                       as_json=True)
    assert _grpc_settings(after) == defaults
    assert http.get_trace_settings(model_name="add_sub") == defaults


def test_bad_settings_are_refused_as_triton_refuses_them(traced):
    srv, _ = traced
    raw = th.RawHttp(srv.http_url)
    cases = [
        # Triton's status codes and words.
        ({"trace_file": "/tmp/elsewhere.json"}, 501, "trace file location can not be updated through network protocol"),
        ({"trace_file": None}, 501, "trace file location can not be updated through network protocol"),
        ({"trace_rate": "abc"}, 400, "Unable to parse 'trace_rate', got: abc"),
        ({"trace_rate": "99999999999"}, 400,
         "Unable to parse 'trace_rate', value is out of range [ 0, 4294967295 ], got: 99999999999"),
        ({"trace_count": "-2"}, 400, "Unable to parse 'trace_count'. Expecting value >= -1, got:-2"),
        ({"trace_count": "abc"}, 400, "Unable to parse 'trace_count', got: abc"),
        ({"log_frequency": "x"}, 400, "Unable to parse 'log_frequency', got: x"),
        ({"trace_level": ["OFF", "TIMESTAMPS"]}, 400, "Expect only one trace level 'OFF' is specified"),
        ({"trace_level": ["TIMESTAMPS"], "trace_rate": "0"}, 400,
         "Attempting to set invalid trace setting :sample rate must be non-zero"),
        # Tessera's own: Triton ignores these keys and levels, or answers 500 for the types.
        ({"bogus": "1"}, 400, "unknown trace setting 'bogus'"),
        ({"trace_level": ["BAD"]}, 400, "unknown trace level 'BAD'"),
        ({"trace_level": ["TENSORS"]}, 501, "trace level 'TENSORS' is not supported"),
        ({"trace_rate": 5}, 400, "trace setting 'trace_rate' must be a string, got 5"),
        ({"trace_level": "TIMESTAMPS"}, 400, "trace setting 'trace_level' must be an array of strings"),
    ]
    for body, status, message in cases:
        r = raw.post_json("/v2/trace/setting", body)
        assert r.status == status, (body, r.describe())
        assert message in r.json()["error"], (body, r.describe())
    # Nothing of a refused request applies.
    r = raw.post_json("/v2/trace/setting", {"trace_rate": "3", "trace_count": "-5"})
    assert r.status == 400
    assert httpclient.InferenceServerClient(srv.http_url).get_trace_settings()["trace_rate"] == "1000"
    # An unknown model, read or changed: Triton's 400.
    for r in [raw.get("/v2/models/nope/trace/setting"), raw.post_json("/v2/models/nope/trace/setting", {})]:
        th.assert_error(r, 400, "Request for unknown model : nope")
    # No version-level settings in Triton's routes.
    assert raw.get("/v2/models/add_sub/versions/1/trace/setting").status == 404
    grpc = grpcclient.InferenceServerClient(srv.grpc_url)
    for kw, code in [({"settings": {"trace_file": "x"}}, "StatusCode.UNIMPLEMENTED"),
                     ({"settings": {"trace_rate": ["1", "2"]}}, "StatusCode.INVALID_ARGUMENT"),
                     ({"settings": {"trace_count": "-5"}}, "StatusCode.INVALID_ARGUMENT"),
                     ({"model_name": "nope", "settings": {"trace_rate": "2"}}, "StatusCode.INVALID_ARGUMENT")]:
        with pytest.raises(InferenceServerException) as e:
            grpc.update_trace_settings(**kw)
        assert e.value.status() == code, (kw, e.value)
    with pytest.raises(InferenceServerException) as e:
        grpc.get_trace_settings(model_name="nope")
    assert e.value.message() == "Request for unknown model : nope"


@pytest.mark.parametrize("where", ["front", "runner"])
def test_timestamps_go_to_the_trace_file_in_tritons_format(launch_server, tmp_path, where):
    """The same steps whether the model runs in the serving process or in a runner process
    (`--runner`, as on workers), whose queue and compute steps come back with its answer."""
    extra = ("--runner",) if where == "runner" else ()
    srv, trace_file = _trace_server(launch_server, tmp_path, f"trace-{where}", *extra)
    http = httpclient.InferenceServerClient(srv.http_url)
    http.update_trace_settings(settings={"trace_level": ["TIMESTAMPS"], "trace_rate": "1"})
    _infer(httpclient, srv.http_url, "via-http")
    _infer(grpcclient, srv.grpc_url, "via-grpc")
    th.wait_until(lambda: set(_traced_request_ids(trace_file)) >= {"via-http", "via-grpc"},
                  what="both requests in the trace file")
    traces = {t["info"]["request_id"]: t for t in _traces(trace_file).values()}
    for request_id, order in [("via-http", HTTP_ORDER), ("via-grpc", GRPC_ORDER)]:
        t = traces[request_id]
        assert t["info"] == {"id": t["info"]["id"], "model_name": "add_sub", "model_version": 1,
                             "request_id": request_id}
        names = [name for name, _ in t["events"]]
        assert sorted(names, key=order.index) == order, names
        stamps = dict(t["events"])
        times = [stamps[name] for name in order]
        assert times == sorted(times), list(zip(order, times))
        assert all(isinstance(ns, int) and ns > 0 for ns in times)
    # Off again: no more traces.
    http.update_trace_settings(settings={"trace_level": ["OFF"]})
    _infer(httpclient, srv.http_url, "untraced")
    assert "untraced" not in _traced_request_ids(trace_file)
    srv.stop()


def test_a_sequence_models_requests_show_their_queue_and_compute_steps(launch_server, tmp_path):
    """The sequence batcher stamps the same steps as the dynamic batcher."""
    import numpy as np

    trace_file = tmp_path / "trace.json"
    srv = launch_server("trace-sequence", models=["simple_sequence"],
                        extra_args=["--trace-config", f"triton,file={trace_file}",
                                    "--trace-config", "level=TIMESTAMPS", "--trace-config", "rate=1"])
    client = httpclient.InferenceServerClient(srv.http_url)
    x = httpclient.InferInput("INPUT", [1, 1], "INT32")
    x.set_data_from_numpy(np.array([[3]], dtype=np.int32))
    client.infer("simple_sequence", [x], sequence_id=7, sequence_start=True, sequence_end=True, request_id="seq")
    th.wait_until(lambda: "seq" in _traced_request_ids(trace_file), what="the sequence request in the trace file")
    t = next(t for t in _traces(trace_file).values() if t["info"]["request_id"] == "seq")
    names = [name for name, _ in t["events"]]
    assert sorted(names, key=HTTP_ORDER.index) == HTTP_ORDER, names
    srv.stop()


@pytest.mark.parametrize("where", ["front", "runner"])
def test_an_ensembles_composing_models_are_traced_as_its_children(launch_server, tmp_path, where):
    """As Triton: each step's request has its own trace naming the ensemble's as `parent_id`,
    with the step model's queue and compute steps (from its runner too)."""
    trace_file = tmp_path / "trace.json"
    extra = ["--trace-config", f"triton,file={trace_file}", "--trace-config", "level=TIMESTAMPS",
             "--trace-config", "rate=1"] + (["--runner"] if where == "runner" else [])
    srv = launch_server(f"trace-ensemble-{where}", models=["add_sub", "preprocess", "ensemble_add_sub"],
                        extra_args=extra)
    client = httpclient.InferenceServerClient(srv.http_url)
    a, b = th.add_sub_inputs()
    client.infer("ensemble_add_sub", th.add_sub_infer_inputs(httpclient, a, b), request_id="ens")

    def complete():
        infos = [t["info"] for t in _traces(trace_file).values() if t["info"]] if trace_file.exists() else []
        return infos if len(infos) == 3 else None

    th.wait_until(complete, what="the ensemble's and its two steps' traces")
    infos = complete()
    traces = _traces(trace_file)
    ensemble = next(i for i in infos if i["model_name"] == "ensemble_add_sub")
    assert ensemble["request_id"] == "ens" and "parent_id" not in ensemble
    children = sorted((i for i in infos if i is not ensemble), key=lambda i: i["model_name"])
    assert [(c["model_name"], c["parent_id"]) for c in children] == [
        ("add_sub", ensemble["id"]), ("preprocess", ensemble["id"])]
    ensemble_steps = dict(traces[ensemble["id"]]["events"])
    for c in children:
        steps = dict(traces[c["id"]]["events"])
        assert {"REQUEST_START", "QUEUE_START", "COMPUTE_START", "COMPUTE_END", "REQUEST_END"} <= set(steps), steps
        assert ensemble_steps["REQUEST_START"] <= steps["REQUEST_START"] <= steps["REQUEST_END"]
        assert steps["REQUEST_END"] <= ensemble_steps["REQUEST_END"]
    srv.stop()


def test_trace_rate_and_count_choose_the_traced_requests(traced):
    srv, trace_file = traced
    http = httpclient.InferenceServerClient(srv.http_url)
    http.update_trace_settings(settings={"trace_level": ["TIMESTAMPS"], "trace_rate": "3", "trace_count": "2"})
    counts = []
    for i in range(10):
        _infer(httpclient, srv.http_url, f"r{i}")
        counts.append(http.get_trace_settings()["trace_count"])
    # As in Triton: the 3rd and the 6th request, and the count shows what is left.
    assert counts == ["2", "2", "1", "1", "1", "0", "0", "0", "0", "0"]
    th.wait_until(lambda: len(_traced_request_ids(trace_file)) >= 2, what="two traces")
    assert sorted(_traced_request_ids(trace_file)) == ["r2", "r5"]
    # A model's own rate samples its requests by themselves.
    http.update_trace_settings(model_name="add_sub", settings={"trace_rate": "1", "trace_count": "1"})
    _infer(httpclient, srv.http_url, "own")
    th.wait_until(lambda: "own" in _traced_request_ids(trace_file), what="the model's own trace")


def test_log_frequency_rotates_trace_files(traced):
    srv, trace_file = traced
    http = httpclient.InferenceServerClient(srv.http_url)
    http.update_trace_settings(settings={"trace_level": ["TIMESTAMPS"], "trace_rate": "1", "log_frequency": "2"})
    for i in range(5):
        _infer(httpclient, srv.http_url, f"f{i}")
    first, second = Path(f"{trace_file}.0"), Path(f"{trace_file}.1")
    th.wait_until(lambda: second.exists(), what="two rotated files")
    ids = [_traced_request_ids(first), _traced_request_ids(second)]
    assert ids == [["f0", "f1"], ["f2", "f3"]], ids
    assert not Path(f"{trace_file}.2").exists(), "the fifth trace waits for its pair"
    assert not trace_file.exists(), "rotated traces never go to the file itself"


def test_levels_other_than_off_need_a_trace_file(launch_server):
    srv = launch_server("trace-nofile")
    try:
        http = httpclient.InferenceServerClient(srv.http_url)
        assert http.get_trace_settings()["trace_file"] == ""
        with pytest.raises(InferenceServerException) as e:
            http.update_trace_settings(settings={"trace_level": ["TIMESTAMPS"]})
        assert e.value.status() == "400"
        assert e.value.message() == "Attempting to set invalid trace setting :trace file name is not given"
    finally:
        srv.stop()


class _OtlpReceiver(http.server.ThreadingHTTPServer):
    """A minimal OTLP/HTTP traces endpoint: keeps each POST /v1/traces body (JSON decoded
    when it is JSON, else the raw protobuf bytes)."""

    def __init__(self):
        self.bodies = []
        self.lock = threading.Lock()
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                ok = self.path == "/v1/traces"
                if ok:
                    is_json = self.headers.get("content-type", "").startswith("application/json")
                    with receiver.lock:
                        receiver.bodies.append(json.loads(body) if is_json else body)
                self.send_response(200 if ok else 404)
                self.send_header("content-type", "application/json")
                self.end_headers()
                self.wfile.write(b"{}")

            def log_message(self, *args):
                pass

        super().__init__(("127.0.0.1", 0), Handler)

    def spans(self) -> list:
        with self.lock:
            return [span for body in self.bodies if isinstance(body, dict)
                    for rs in body["resourceSpans"] for ss in rs["scopeSpans"] for span in ss["spans"]]


def test_opentelemetry_spans_reach_the_collector_with_the_callers_trace(launch_server):
    receiver = _OtlpReceiver()
    threading.Thread(target=receiver.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{receiver.server_address[1]}/v1/traces"
    args = []
    for c in ["mode=opentelemetry", f"opentelemetry,url={url}", "opentelemetry,bsp_schedule_delay=100",
              "opentelemetry,resource=service.name=trace-test", "level=TIMESTAMPS", "rate=1"]:
        args += ["--trace-config", c]
    srv = launch_server("trace-otel", extra_args=args)
    try:
        http = httpclient.InferenceServerClient(srv.http_url)
        settings = http.get_trace_settings()
        assert settings["trace_mode"] == "opentelemetry"
        assert settings["url"] == url
        assert "trace_file" not in settings and "log_frequency" not in settings
        parent_trace, parent_span = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"
        _infer(httpclient, srv.http_url, "otel-http", headers={"traceparent": f"00-{parent_trace}-{parent_span}-01"})
        _infer(grpcclient, srv.grpc_url, "otel-grpc")
        th.wait_until(lambda: len(receiver.spans()) >= 6, what="six spans at the receiver")
        spans = receiver.spans()
        with receiver.lock:
            resource = receiver.bodies[0]["resourceSpans"][0]["resource"]["attributes"]
        assert {"key": "service.name", "value": {"stringValue": "trace-test"}} in resource
        models = [s for s in spans if s["name"] == "add_sub"]
        by_request = {next(a["value"]["stringValue"] for a in s["attributes"] if a["key"] == "triton.request_id"): s
                      for s in models}
        assert set(by_request) == {"otel-http", "otel-grpc"}
        for request_id, recv in [("otel-http", "HTTP_RECV_START"), ("otel-grpc", "GRPC_WAITREAD_START")]:
            model = by_request[request_id]
            same = [s for s in spans if s["traceId"] == model["traceId"]]
            assert sorted(s["name"] for s in same) == ["InferRequest", "add_sub", "compute"]
            root = next(s for s in same if s["name"] == "InferRequest")
            compute = next(s for s in same if s["name"] == "compute")
            assert model["parentSpanId"] == root["spanId"]
            assert compute["parentSpanId"] == model["spanId"]
            assert recv in [e["name"] for e in root["events"]]
            assert [e["name"] for e in model["events"]] == ["REQUEST_START", "QUEUE_START", "REQUEST_END"]
            assert int(root["startTimeUnixNano"]) <= int(model["startTimeUnixNano"]) <= int(compute["startTimeUnixNano"])
            assert int(compute["endTimeUnixNano"]) <= int(model["endTimeUnixNano"]) <= int(root["endTimeUnixNano"])
        # The HTTP request joined the caller's trace, under the caller's span.
        http_root = next(s for s in spans if s["name"] == "InferRequest" and s["traceId"] == parent_trace)
        assert http_root["parentSpanId"] == parent_span
        assert by_request["otel-grpc"]["traceId"] != parent_trace
    finally:
        srv.stop()
        receiver.shutdown()
