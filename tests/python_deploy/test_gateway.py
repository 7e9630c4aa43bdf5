"""The gateway: one endpoint for every tenant in front of the workers. Real processes on loopback:
a control plane, workers, a gateway; tritonclient over HTTP and gRPC through it."""

from __future__ import annotations

import base64
import hashlib
import hmac
import io
import json
import queue
import subprocess
import sys
import tarfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conftest import infer_grpc, infer_http, marker_model, tessera_bin, wait_until

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "python"))
import gen_models  # noqa: E402  (tests/python's model generator: the simple_sequence accumulator)

X = np.zeros((1, 4), dtype=np.float32)


def deploy_marker(cluster, tenant: str, replicas: int, marker: float = 1.0, **quotas):
    keys = cluster.create_tenant(tenant, **quotas)
    admin = keys["tenant-admin"]
    cluster.push_version(tenant, admin, "marker", marker_model(marker))
    cluster.api("POST", f"/v1/tenants/{tenant}/deployments", admin,
                {"name": "marker", "model": "marker", "version": 1, "replicas": replicas}, expect=201)
    cluster.wait_ready(tenant, admin, "marker")
    return keys


def metric_sum(url: str, family: str, **labels) -> float:
    with urllib.request.urlopen(url, timeout=5) as r:
        text = r.read().decode()
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(family + "{") and not line.startswith(family + " "):
            continue
        if all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def tenant_id(cluster, name: str) -> str:
    """The tenant's id: the `tenant` label of worker and gateway metrics."""
    return cluster.api("GET", f"/v1/tenants/{name}", cluster.admin_key)["id"]


def gateway_routes(gateway, tenant: str, model: str, replicas: int):
    """Waits until the gateway's table holds `replicas` ready replicas (its table lags the API by up to ~1 s)."""
    def seen():
        try:
            text = urllib.request.urlopen(f"http://{gateway.addrs['metrics']}/metrics", timeout=2).read().decode()
        except OSError:
            return False
        return "tessera_gateway_upstreams" in text and f'state="healthy"}} {replicas}' in text
    wait_until(seen, 20, f"gateway sees {replicas} upstreams")


def test_gateway_serves_http_and_grpc_spreads_load_and_keeps_tenants_apart(make_cluster):
    cluster = make_cluster(2)
    keys = deploy_marker(cluster, "acme", replicas=2, marker=7.0)
    other = cluster.create_tenant("globex")
    gw = cluster.start_gateway()
    gateway_routes(gw, "acme", "marker", 2)
    http_ep, grpc_ep = f"http://{gw.addrs['http']}", gw.addrs["grpc"]

    # Both protocols, an API key and an access token.
    assert infer_http(http_ep, keys["inference"], "marker", X)[0][0] == 7.0
    assert infer_grpc(grpc_ep, keys["inference"], "marker", X)[0][0] == 7.0
    token = cluster.token(keys["inference"])
    assert infer_http(http_ep, token, "marker", X)[0][0] == 7.0
    assert infer_http(http_ep, keys["inference"], "marker", X, version="1")[0][0] == 7.0

    # Load spreads over both replicas' workers.
    client = httpclient.InferenceServerClient(gw.addrs["http"], concurrency=4)
    inp = httpclient.InferInput("INPUT0", [1, 4], "FP32")
    inp.set_data_from_numpy(X, binary_data=True)
    auth = {"Authorization": f"Bearer {keys['inference']}"}
    handles = [client.async_infer("marker", [inp], headers=auth) for _ in range(200)]
    for h in handles:
        assert h.get_result().as_numpy("OUTPUT0")[0][0] == 7.0
    client.close()
    for w in cluster.workers:
        served = metric_sum(f"http://{w.addrs['metrics']}/metrics", "nv_inference_request_success")
        assert served >= 40, f"{w.name} served only {served} of 200+ requests"

    # Model metadata and readiness pass through; the index is the tenant's own.
    gc = grpcclient.InferenceServerClient(grpc_ep)
    meta = gc.get_model_metadata("marker", headers={"authorization": f"Bearer {keys['inference']}"})
    assert meta.name == "marker" and meta.inputs[0].name == "INPUT0"
    assert gc.is_server_live() and gc.is_server_ready()
    index = gc.get_model_repository_index(headers={"authorization": f"Bearer {keys['inference']}"})
    assert [m.name for m in index.models] == ["marker"]
    # Another tenant's key does not reach acme's model: it is as unknown as a missing one.
    with pytest.raises(InferenceServerException) as e:
        infer_grpc(grpc_ep, other["inference"], "marker", X)
    assert "StatusCode.NOT_FOUND" in str(e.value.status())
    index = gc.get_model_repository_index(headers={"authorization": f"Bearer {other['inference']}"})
    assert list(index.models) == []
    gc.close()

    # Bad credentials, unknown models and versions, shared memory: clear refusals.
    def status(path: str, key: str, body: bytes = b"{}", method: str = "POST") -> tuple:
        req = urllib.request.Request(http_ep + path, data=body if method == "POST" else None, method=method,
                                     headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as err:
            return err.code, err.read().decode()

    assert status("/v2/models/marker/infer", "tsk_not_a_key")[0] == 401
    code, body = status("/v2/models/nope/infer", keys["inference"])
    assert code == 404 and "nope" in body
    code, body = status("/v2/models/marker/versions/9/infer", keys["inference"])
    assert code == 404 and "version 9" in body
    code, body = status("/v2/systemsharedmemory/region/r/register", keys["inference"])
    assert code == 501 and "shared memory" in body
    # Trace and log settings are each worker's: the gateway says so (HTTP and gRPC).
    for path in ("/v2/trace/setting", "/v2/models/marker/trace/setting", "/v2/logging"):
        code, body = status(path, keys["inference"])
        assert code == 501 and "belong to each worker" in body, (path, code, body)
    gc = grpcclient.InferenceServerClient(grpc_ep)
    with pytest.raises(InferenceServerException) as e:
        gc.get_trace_settings(headers={"authorization": f"Bearer {keys['inference']}"})
    assert "UNIMPLEMENTED" in str(e.value.status()) and "belong to each worker" in str(e.value), e.value
    gc.close()
    code, body = status("/v2/models/marker/versions/x/infer", keys["inference"])
    assert code == 400 and "'x'" in body

    # A control plane told where the gateways are shows each deployment's endpoint there.
    cluster.stop_control_plane()
    cluster.cp_extra = [f"--gateway-url=http://{gw.addrs['http']}", f"--gateway-grpc-address={grpc_ep}"]
    cluster.start_control_plane()
    endpoint = cluster.deployment("acme", keys["tenant-admin"], "marker")["endpoint"]
    assert endpoint == {"http": f"http://{gw.addrs['http']}/v2/models/marker", "grpc": grpc_ep, "model": "marker"}
    base = endpoint["http"].rsplit("/v2/models/", 1)[0]
    assert infer_http(base, keys["inference"], "marker", X)[0][0] == 7.0

    # The gateway's metrics count requests per tenant, model and routed version.
    ok = metric_sum(f"http://{gw.addrs['metrics']}/metrics", "tessera_gateway_requests_total",
                    tenant=tenant_id(cluster, "acme"), model="marker", version="1", code="200")
    assert ok >= 200


def signed_identity(token: str, role: str, tenant_id: str, tenant_name: str) -> str:
    """A forwarded identity as a gateway holding `token` signs it (`data-plane/src/auth/forwarded.rs`)."""
    key = hmac.new(token.encode(), b"tessera forwarded identity v1", hashlib.sha256).digest()
    b64 = lambda b: base64.urlsafe_b64encode(b).rstrip(b"=").decode()  # noqa: E731
    body = f"v1.{int(time.time()) + 30}.{role}.{tenant_id}.{b64(tenant_name.encode())}"
    return f"{body}.{b64(hmac.new(key, body.encode(), hashlib.sha256).digest())}"


def identity_status(worker: str, identity: str) -> int:
    req = urllib.request.Request(worker + "/v2/models/marker", headers={"tessera-identity": identity})
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def test_workers_trust_only_identities_signed_with_the_gateways_key(make_cluster):
    cluster = make_cluster(1)
    keys = deploy_marker(cluster, "acme", replicas=1)
    d = cluster.deployment("acme", keys["tenant-admin"], "marker")
    worker = d["replica_status"][0]["http_endpoint"]
    tenant_id = cluster.api("GET", "/v1/tenants/acme", cluster.admin_key)["id"]
    forged = f"v1.{int(time.time()) + 30}.platform-admin.{tenant_id}.YWNtZQ.AAAA"
    assert identity_status(worker, forged) == 401
    # The control plane has a gateway token: the worker checks with the key it was sent, and no
    # longer with the one of its own token (which gateways do not hold).
    assert identity_status(worker, signed_identity(cluster.gateway_token, "inference", tenant_id, "acme")) == 200
    assert identity_status(worker, signed_identity(cluster.worker_token, "inference", tenant_id, "acme")) == 401
    # The tenant's own key still reaches the worker directly.
    assert infer_http(worker, keys["inference"], "marker", X)[0][0] == 1.0


def test_a_gateway_holding_the_worker_token_is_refused_where_gateways_have_their_own(make_cluster):
    cluster = make_cluster(1)
    gw = cluster.start_gateway(f"--worker-token={cluster.worker_token}", wait_ready=False)
    wait_until(lambda: gw.saw("cannot open the route stream"), 10, "the route stream refused")
    assert gw.saw("--gateway-token"), "the refusal names the gateway token"
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(f"http://{gw.addrs['http']}/v2/health/ready", timeout=2)
    assert e.value.code == 503, "no route table: not ready"


class Load:
    """`threads` clients sending back to back through one endpoint, counting answers and failures."""

    def __init__(self, endpoint: str, key: str, threads: int = 4, model: str = "marker"):
        self.ok = 0
        self.failures: list = []
        self.throttled = 0
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self.run, args=(endpoint, key, model), daemon=True)
                        for _ in range(threads)]
        for t in self.threads:
            t.start()

    def run(self, endpoint: str, key: str, model: str):
        client = httpclient.InferenceServerClient(endpoint, network_timeout=30)
        inp = httpclient.InferInput("INPUT0", [1, 4], "FP32")
        inp.set_data_from_numpy(X, binary_data=True)
        while not self.stop.is_set():
            try:
                client.infer(model, [inp], headers={"Authorization": f"Bearer {key}"})
                with self.lock:
                    self.ok += 1
            except InferenceServerException as e:
                with self.lock:
                    if "429" in str(e.status()):
                        self.throttled += 1
                    else:
                        self.failures.append((time.monotonic(), str(e)))
        client.close()

    def finish(self):
        self.stop.set()
        for t in self.threads:
            t.join(30)


def test_killing_a_worker_under_load_fails_at_most_its_requests_in_flight(make_cluster):
    cluster = make_cluster(2)
    keys = deploy_marker(cluster, "acme", replicas=2)
    gw = cluster.start_gateway()
    gateway_routes(gw, "acme", "marker", 2)
    threads = 4
    load = Load(gw.addrs["http"], keys["inference"], threads=threads)
    try:
        wait_until(lambda: load.ok > 200, 30, "traffic before the kill")
        victim = cluster.workers[1]
        victim.kill()
        killed_at = time.monotonic()
        before = load.ok
        wait_until(lambda: load.ok > before + 300, 60, "traffic after the kill")
        time.sleep(1.0)
    finally:
        load.finish()
    # Only requests that were on the killed worker may fail: at most one per client thread.
    assert len(load.failures) <= threads, load.failures
    late = [f for f in load.failures if f[0] > killed_at + 1.0]
    assert not late, f"failures after the first second: {late}"


def stream_once(endpoint: str, key: str):
    """One ModelStreamInfer stream carrying one request; returns its answer's OUTPUT0."""
    answers: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(endpoint)
    try:
        client.start_stream(callback=lambda result, error: answers.put((result, error)),
                            headers={"authorization": f"Bearer {key}"})
        inp = grpcclient.InferInput("INPUT0", [1, 4], "FP32")
        inp.set_data_from_numpy(X)
        client.async_stream_infer("marker", [inp])
        result, error = answers.get(timeout=15)
        assert error is None, error
        return result.as_numpy("OUTPUT0")
    finally:
        client.stop_stream()
        client.close()


def test_a_stream_toward_an_unreachable_worker_is_opened_on_another_replica(make_cluster):
    cluster = make_cluster(2)
    keys = deploy_marker(cluster, "acme", replicas=2)
    gw = cluster.start_gateway()
    gateway_routes(gw, "acme", "marker", 2)
    cluster.workers[1].kill()
    # Until the control plane notices (seconds), the table still lists the dead worker: each
    # stream picks it half the time, and must then be opened on the other replica instead.
    retries = f"http://{gw.addrs['metrics']}/metrics"
    for _ in range(12):
        assert (stream_once(gw.addrs["grpc"], keys["inference"]) == X + 1.0).all()
    assert metric_sum(retries, "tessera_gateway_retries_total", reason="unreachable") >= 1
    assert metric_sum(retries, "tessera_gateway_ejections_total") >= 1


def test_rate_limit_answers_429_with_retry_after_at_the_configured_rate(make_cluster):
    cluster = make_cluster(1)
    keys = deploy_marker(cluster, "acme", replicas=1, requests_per_second=40)
    gw = cluster.start_gateway()
    gateway_routes(gw, "acme", "marker", 1)
    # Let the bucket settle, then measure over 5 s.
    load = Load(gw.addrs["http"], keys["inference"], threads=4)
    time.sleep(1.0)
    start_ok, start = load.ok, time.monotonic()
    time.sleep(5.0)
    rate = (load.ok - start_ok) / (time.monotonic() - start)
    load.finish()
    assert not load.failures, load.failures[:3]
    assert load.throttled > 0
    assert 36 <= rate <= 44, f"admitted {rate:.1f}/s against a limit of 40/s"

    req = urllib.request.Request(f"http://{gw.addrs['http']}/v2/models/marker/infer", data=b"{}", method="POST",
                                 headers={"Authorization": f"Bearer {keys['inference']}"})
    codes = []
    for _ in range(100):
        try:
            urllib.request.urlopen(req, timeout=5).read()
            codes.append(200)
        except urllib.error.HTTPError as e:
            codes.append(e.code)
            if e.code == 429:
                assert int(e.headers["Retry-After"]) >= 1
                assert "requests-per-second" in e.read().decode()
    assert 429 in codes
    throttled = metric_sum(f"http://{gw.addrs['metrics']}/metrics", "tessera_gateway_throttled_total",
                           tenant=tenant_id(cluster, "acme"), reason="rate")
    assert throttled > 0

    # gRPC says RESOURCE_EXHAUSTED.
    grpc_codes = set()
    for _ in range(100):
        try:
            infer_grpc(gw.addrs["grpc"], keys["inference"], "marker", X)
        except InferenceServerException as e:
            grpc_codes.add(str(e.status()))
    assert "StatusCode.RESOURCE_EXHAUSTED" in grpc_codes

    # Every refusal reaches the tenant's usage as throttled, under the model, beside what was served.
    refused = metric_sum(f"http://{gw.addrs['metrics']}/metrics", "tessera_gateway_throttled_total",
                         tenant=tenant_id(cluster, "acme"))
    assert refused > 0

    def usage():
        return cluster.api("GET", "/v1/tenants/acme/usage?group_by=model,profile", keys["tenant-admin"])["usage"]

    def shipped():
        return sum(e["throttled"] for e in usage()) == refused
    wait_until(shipped, 20, f"{refused:.0f} throttled requests in the usage API")
    rows = {(e["model"], e["slice_profile"]): e for e in usage()}
    assert rows[("marker", "gateway")]["throttled"] == refused
    assert rows[("marker", "gateway")]["requests"] == 0
    served = [e for (model, profile), e in rows.items() if model == "marker" and profile != "gateway"]
    assert served and all(e["throttled"] == 0 for e in served) and sum(e["requests"] for e in served) > 0


def test_a_key_with_its_own_limit_is_held_to_it_while_the_tenants_other_keys_are_not(make_cluster):
    cluster = make_cluster(1)
    # The tenant's own limit far above what two threads reach even on a fast machine (they passed
    # 1000/s once), so every refusal here is the key's.
    keys = deploy_marker(cluster, "acme", replicas=1, requests_per_second=100_000)
    admin = keys["tenant-admin"]
    created = cluster.api("POST", "/v1/tenants/acme/api-keys", admin,
                          {"name": "batch job", "role": "inference", "limits": {"requests_per_second": 20}},
                          expect=201)
    limited = created["key"]
    gw = cluster.start_gateway()
    gateway_routes(gw, "acme", "marker", 1)
    capped, free = Load(gw.addrs["http"], limited, threads=2), Load(gw.addrs["http"], keys["inference"], threads=2)
    time.sleep(1.0)
    starts, start = (capped.ok, free.ok), time.monotonic()
    time.sleep(5.0)
    elapsed = time.monotonic() - start
    rates = ((capped.ok - starts[0]) / elapsed, (free.ok - starts[1]) / elapsed)
    capped.finish()
    free.finish()
    assert not capped.failures and not free.failures, (capped.failures[:3], free.failures[:3])
    assert capped.throttled > 0 and free.throttled == 0
    assert 18 <= rates[0] <= 22, f"the limited key got {rates[0]:.1f}/s against its own 20/s"
    assert rates[1] > 30, f"the tenant's other key is held only to the tenant's 100,000/s, got {rates[1]:.1f}/s"
    refused = metric_sum(f"http://{gw.addrs['metrics']}/metrics", "tessera_gateway_throttled_total",
                         tenant=tenant_id(cluster, "acme"), reason="key_rate")
    assert refused == capped.throttled

    req = urllib.request.Request(f"http://{gw.addrs['http']}/v2/models/marker/infer", data=b"{}", method="POST",
                                 headers={"Authorization": f"Bearer {limited}"})
    messages = []
    for _ in range(60):
        try:
            urllib.request.urlopen(req, timeout=5).read()
        except urllib.error.HTTPError as e:
            if e.code == 429:
                messages.append(e.read().decode())
    assert messages and f"API key {created['api_key']['id']}" in messages[0], messages[:1]

    # The CLI lifts the key's limit; the gateways follow within about a second.
    cli = subprocess.run([tessera_bin(), "keys", "limit", "batch job", "--requests-per-second", "0",
                          "--url", cluster.url, "--key", admin, "--tenant", "acme"],
                         capture_output=True, text=True, timeout=60)
    assert cli.returncode == 0, cli.stderr
    assert cli.stdout.strip().endswith(": -"), cli.stdout
    listed = subprocess.run([tessera_bin(), "-o", "json", "keys", "list", "--url", cluster.url, "--key", admin,
                             "--tenant", "acme"], capture_output=True, text=True, timeout=60)
    by_name = {k["name"]: k for k in json.loads(listed.stdout)}
    assert by_name["batch job"]["limits"] == {"requests_per_second": 0, "concurrent_requests": 0}
    time.sleep(2.0)
    burst = Load(gw.addrs["http"], limited, threads=2)
    time.sleep(2.0)
    burst.finish()
    assert burst.throttled == 0 and burst.ok > 40, (burst.ok, burst.throttled)


def test_a_rollout_through_the_gateway_fails_no_request(make_cluster):
    cluster = make_cluster(2)
    keys = cluster.create_tenant("acme")
    admin = keys["tenant-admin"]
    cluster.push_version("acme", admin, "marker", marker_model(1.0))
    cluster.push_version("acme", admin, "marker", marker_model(2.0))
    cluster.api("PUT", "/v1/tenants/acme/models/marker/aliases/production", admin, {"version": 1})
    cluster.api("POST", "/v1/tenants/acme/deployments", admin,
                {"name": "marker", "model": "marker", "alias": "production", "replicas": 1}, expect=201)
    cluster.wait_ready("acme", admin, "marker")
    gw = cluster.start_gateway()
    gateway_routes(gw, "acme", "marker", 1)
    load = Load(gw.addrs["http"], keys["inference"], threads=4)
    try:
        wait_until(lambda: load.ok > 100, 30, "traffic before the rollout")
        cluster.api("PUT", "/v1/tenants/acme/models/marker/aliases/production", admin, {"version": 2})
        cluster.wait_ready("acme", admin, "marker", pred=lambda d: d["serving_version"] == 2)
        wait_until(lambda: infer_http(f"http://{gw.addrs['http']}", keys["inference"], "marker", X)[0][0] == 2.0,
                   20, "the gateway routes to version 2")
        before = load.ok
        wait_until(lambda: load.ok > before + 100, 30, "traffic after the rollout")
        time.sleep(2.0)  # past the drain of the old replica
    finally:
        load.finish()
    assert not load.failures, load.failures[:5]


def test_a_90_10_canary_split_holds_within_5_percent_over_2000_requests(make_cluster):
    cluster = make_cluster(2)
    # 2,000 sequential requests pass the default 1,000/s on a fast machine; this test is the split's.
    keys = cluster.create_tenant("acme", requests_per_second=100_000)
    admin = keys["tenant-admin"]
    cluster.push_version("acme", admin, "marker", marker_model(1.0))
    cluster.push_version("acme", admin, "marker", marker_model(2.0))
    cluster.api("POST", "/v1/tenants/acme/deployments", admin,
                {"name": "marker", "model": "marker", "version": 1, "replicas": 1}, expect=201)
    cluster.wait_ready("acme", admin, "marker")
    cluster.api("PUT", "/v1/tenants/acme/deployments/marker/canary", admin, {"version": 2, "weight": 10, "replicas": 1})

    def canary_serving():
        d = cluster.deployment("acme", admin, "marker")
        return any(t["version"] == 2 and t["weight"] == 10 and t["ready_replicas"] >= 1 for t in d["traffic"])

    wait_until(canary_serving, 60, "the canary serving with weight 10")
    gw = cluster.start_gateway()
    gateway_routes(gw, "acme", "marker", 2)
    client = httpclient.InferenceServerClient(gw.addrs["http"])
    inp = httpclient.InferInput("INPUT0", [1, 4], "FP32")
    inp.set_data_from_numpy(X, binary_data=True)
    auth = {"Authorization": f"Bearer {keys['inference']}"}
    markers = [float(client.infer("marker", [inp], headers=auth).as_numpy("OUTPUT0")[0][0]) for _ in range(2000)]
    client.close()
    canary = markers.count(2.0) / len(markers)
    assert markers.count(1.0) + markers.count(2.0) == 2000
    assert 0.05 <= canary <= 0.15, f"{canary:.1%} of 2000 requests reached the canary (weight 10%)"
    # The gateway's metrics show each version beside the other.
    m = f"http://{gw.addrs['metrics']}/metrics"
    acme = tenant_id(cluster, "acme")
    v1 = metric_sum(m, "tessera_gateway_requests_total", tenant=acme, model="marker", version="1", code="200")
    v2 = metric_sum(m, "tessera_gateway_requests_total", tenant=acme, model="marker", version="2", code="200")
    assert v1 + v2 >= 2000 and v2 > 0


def model_dir_tar(root: Path, name: str) -> bytes:
    """A Triton model directory under `root` as the archive `?format=tar` takes."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        tar.add(root / name, arcname=name)
    return buf.getvalue()


def test_every_step_of_a_sequence_reaches_the_replica_holding_its_state(make_cluster, tmp_path):
    cluster = make_cluster(2)
    keys = cluster.create_tenant("acme")
    admin, inference = keys["tenant-admin"], keys["inference"]
    gen_models.write_simple_sequence(tmp_path)
    cluster.api("POST", "/v1/tenants/acme/models", admin, {"name": "simple_sequence"}, expect=201)
    cluster.api("POST", "/v1/tenants/acme/models/simple_sequence/versions?format=tar", admin,
                data=model_dir_tar(tmp_path, "simple_sequence"),
                headers={"Content-Type": "application/octet-stream"}, expect=201)
    cluster.api("POST", "/v1/tenants/acme/deployments", admin,
                {"name": "simple_sequence", "model": "simple_sequence", "version": 1, "replicas": 2}, expect=201)
    cluster.wait_ready("acme", admin, "simple_sequence")
    gw = cluster.start_gateway()
    gateway_routes(gw, "acme", "simple_sequence", 2)

    # Eight sequences per protocol, numeric and string ids, stepped in turn: a step that reached
    # the other replica would find no sequence there (no START) and fail. (Eight: a replica has
    # max_batch_size x instances = 8 sequence slots; a ninth would wait for one to free.)
    auth = {"Authorization": f"Bearer {inference}"}
    http = httpclient.InferenceServerClient(gw.addrs["http"])
    grpc = grpcclient.InferenceServerClient(gw.addrs["grpc"])
    steps = [3, 1, 4, 1, 5, 9]
    for client, module, headers, ids in (
        (http, httpclient, auth, [1000 + i for i in range(4)] + [f"h-{i}" for i in range(4)]),
        (grpc, grpcclient, {k.lower(): v for k, v in auth.items()}, [2000 + i for i in range(4)] + [f"g-{i}" for i in range(4)]),
    ):
        sums = {seq: [] for seq in ids}
        for i, v in enumerate(steps):
            for n, seq in enumerate(ids):
                x = module.InferInput("INPUT", [1, 1], "INT32")
                x.set_data_from_numpy(np.array([[v * (n + 1)]], dtype=np.int32))
                r = client.infer("simple_sequence", [x], headers=headers, sequence_id=seq,
                                 sequence_start=(i == 0), sequence_end=(i == len(steps) - 1))
                sums[seq].append(int(r.as_numpy("OUTPUT")[0][0]))
        for n, seq in enumerate(ids):
            assert sums[seq] == list(np.cumsum(steps) * (n + 1)), f"sequence {seq!r} over {module.__name__}"
    http.close()
    grpc.close()
    # Rendezvous hashing spread the 16 sequences over both replicas (all on one: 2 in 2^16).
    for w in cluster.workers:
        served = metric_sum(f"http://{w.addrs['metrics']}/metrics", "nv_inference_request_success")
        assert served >= len(steps), f"{w.name} served {served} of {16 * len(steps)} sequence steps"
