"""TLS: ``tessera serve --tls-cert --tls-key`` with a certificate made at test time
(``tessera tls-cert``), reached by tritonclient over HTTPS and gRPC with SSL, trusting the
test CA; clients that do not trust it are refused."""

import ssl
import subprocess
import urllib.error
import urllib.request

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

import tessera_helpers as th
from conftest import TesseraServer, _start_or_fail, server_command

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def tls_files(tessera_bin, work_dir):
    d = work_dir / "tls"
    subprocess.run([tessera_bin, "tls-cert", "--dir", str(d)], check=True, capture_output=True)
    return {"ca": str(d / "ca.pem"), "cert": str(d / "cert.pem"), "key": str(d / "key.pem")}


@pytest.fixture(scope="module")
def tls_server(tessera_bin, model_repo, work_dir, tls_files):
    extra = ["--tls-cert", tls_files["cert"], "--tls-key", tls_files["key"]]
    cmd = server_command(tessera_bin, model_repo, load_models=("add_sub",), extra_args=extra)
    context = ssl.create_default_context(cafile=tls_files["ca"])
    srv = TesseraServer(cmd, work_dir / "server-tls.log", name="tls", ssl_context=context)
    _start_or_fail(srv)
    yield srv
    srv.stop()


def _check_add_sub(result, a, b):
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)


def test_http_with_ssl_infers(tls_server, tls_files):
    client = httpclient.InferenceServerClient(tls_server.http_url, ssl=True, ssl_options={"ca_certs": tls_files["ca"]})
    try:
        assert client.is_server_live()
        a, b = th.add_sub_inputs(batch=2, seed=7)
        _check_add_sub(client.infer("add_sub", th.add_sub_infer_inputs(httpclient, a, b)), a, b)
    finally:
        client.close()


def test_grpc_with_ssl_infers(tls_server, tls_files):
    client = grpcclient.InferenceServerClient(tls_server.grpc_url, ssl=True, root_certificates=tls_files["ca"])
    try:
        assert client.is_server_live()
        a, b = th.add_sub_inputs(batch=3, seed=8)
        _check_add_sub(client.infer("add_sub", th.add_sub_infer_inputs(grpcclient, a, b)), a, b)
    finally:
        client.close()


def test_metrics_are_served_over_https(tls_server, tls_files):
    context = ssl.create_default_context(cafile=tls_files["ca"])
    with urllib.request.urlopen(f"https://{tls_server.metrics_url}/metrics", context=context, timeout=10) as resp:
        assert resp.status == 200
        assert b"nv_inference" in resp.read()


def test_clients_that_do_not_trust_the_ca_are_refused(tls_server, tls_files):
    untrusting = ssl.create_default_context()  # the system's roots only
    with pytest.raises(urllib.error.URLError, match="CERTIFICATE_VERIFY_FAILED"):
        urllib.request.urlopen(f"https://{tls_server.http_url}/v2/health/live", context=untrusting, timeout=10)
    # Plain HTTP to the TLS port gets no HTTP answer.
    with pytest.raises(Exception):
        urllib.request.urlopen(f"http://{tls_server.http_url}/v2/health/live", timeout=10)
