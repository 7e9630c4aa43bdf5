"""Triton's logging extension (`v2/logging`, gRPC `LogSettings`): read and change the server's
log settings at run time with tritonclient, as against Triton 2.51; the switches change what the
log shows. Tessera answers bad values with 400 / INVALID_ARGUMENT naming the setting (Triton
answers some with 500 or 503)."""

import re
import time

import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

import tessera_helpers as th

pytestmark = pytest.mark.timeout(90)

DEFAULTS = {"log_file": "", "log_info": True, "log_warning": True, "log_error": True,
            "log_verbose_level": 0, "log_format": "default"}


@pytest.fixture(scope="module")
def log_server(launch_server):
    # Its own server: these tests change process-wide settings.
    srv = launch_server("logging", models=("add_sub",))
    yield srv
    srv.stop()


def _grpc_settings(client) -> dict:
    raw = client.get_log_settings(as_json=True)["settings"]
    return {k: next(iter(v.values())) for k, v in raw.items()}


def _reload(srv):
    raw = th.RawHttp(srv.http_url)
    r = raw.post_json("/v2/repository/models/add_sub/load", {})
    assert r.status == 200, r.describe()


def _lines_after(srv, marker: str):
    text = srv.log_text()
    return text[text.rindex(marker):].splitlines()[1:]


def test_settings_read_and_change_over_http_and_grpc(log_server):
    http = httpclient.InferenceServerClient(log_server.http_url)
    grpc = grpcclient.InferenceServerClient(log_server.grpc_url)
    assert "logging" in http.get_server_metadata()["extensions"]
    assert http.get_log_settings() == DEFAULTS
    grpc_now = _grpc_settings(grpc)
    assert {**grpc_now, "log_verbose_level": int(grpc_now["log_verbose_level"])} == DEFAULTS
    changed = http.update_log_settings({"log_verbose_level": 1, "log_format": "ISO8601"})
    assert changed == {**DEFAULTS, "log_verbose_level": 1, "log_format": "ISO8601"}
    after = grpc.update_log_settings({"log_verbose_level": 0, "log_format": "default"}, as_json=True)["settings"]
    assert after["log_format"] == {"string_param": "default"}
    assert http.get_log_settings() == DEFAULTS


def test_switches_change_what_the_log_shows(log_server):
    http = httpclient.InferenceServerClient(log_server.http_url)
    try:
        # INFO off: a reload's "model version loaded" line is no longer written.
        http.update_log_settings({"log_info": False})
        marker = "log settings changed"
        _reload(log_server)
        time.sleep(0.3)
        lines = _lines_after(log_server, marker)
        assert not any("model version loaded" in l for l in lines), lines
        # On again, with Triton's ISO 8601 timestamps (seconds, no fraction).
        http.update_log_settings({"log_info": True, "log_format": "ISO8601"})
        _reload(log_server)
        deadline = time.monotonic() + 10
        while True:
            loaded = [l for l in _lines_after(log_server, marker) if "model version loaded" in l]
            if loaded or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert loaded, log_server.log_tail()
        assert re.match(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ ", loaded[-1]), loaded[-1]
    finally:
        http.update_log_settings({"log_info": True, "log_format": "default"})


def test_bad_settings_are_refused_with_the_setting_named(log_server):
    raw = th.RawHttp(log_server.http_url)
    cases = [
        ({"log_file": "/tmp/tessera.log"}, 501, "log file location can not be updated through network protocol"),
        ({"log_info": "yes"}, 400, "log setting 'log_info' must be a boolean, got \"yes\""),
        ({"log_verbose_level": -1}, 400, "log setting 'log_verbose_level' must be an unsigned 32-bit integer, got -1"),
        ({"log_verbose_level": 4294967296}, 400, "unsigned 32-bit integer"),
        ({"log_format": "json"}, 400, "log setting 'log_format' must be \"default\" or \"ISO8601\", got \"json\""),
        ({"bogus": True}, 400, "unknown log setting 'bogus'"),
        ([1], 400, "the request body must be a JSON object"),
    ]
    for body, status, message in cases:
        r = raw.post_json("/v2/logging", body)
        assert r.status == status, (body, r.describe())
        assert message in r.json()["error"], (body, r.describe())
    # Nothing applied from a refused request.
    r = raw.post_json("/v2/logging", {"log_info": False, "log_format": "json"})
    assert r.status == 400
    assert httpclient.InferenceServerClient(log_server.http_url).get_log_settings() == DEFAULTS
    grpc = grpcclient.InferenceServerClient(log_server.grpc_url)
    for settings, code in [({"log_file": "x"}, "StatusCode.UNIMPLEMENTED"),
                           ({"log_format": "json"}, "StatusCode.INVALID_ARGUMENT")]:
        with pytest.raises(InferenceServerException) as e:
            grpc.update_log_settings(settings)
        assert e.value.status() == code, e.value
