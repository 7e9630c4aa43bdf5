"""Webhooks end to end: a real control plane and worker, and a Python receiver on loopback that
checks every delivery's signature the way the README tells tenants to. Loopback is a private
target, so the platform admin allows private targets for the tenant first, and a registration
before that is refused."""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Dict, List

import pytest

from conftest import ApiError, free_port, marker_model, wait_until

TOLERANCE_S = 300


def verify(secret: str, headers: Dict[str, str], body: bytes) -> bool:
    """The receiver's check: a fresh timestamp and a v1 signature of "<timestamp>.<body>"."""
    timestamp = headers["tessera-timestamp"]
    if abs(time.time() - int(timestamp)) > TOLERANCE_S:
        return False
    expected = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()
    given = [p.strip()[3:] for p in headers["tessera-signature"].split(",") if p.strip().startswith("v1=")]
    return any(hmac.compare_digest(expected, g) for g in given)


class Receiver:
    """An HTTP server on 127.0.0.1 recording each POST; `fail_first[path]` requests to a path
    are answered 500 before it answers 200."""

    def __init__(self):
        self.received: List[dict] = []
        self.fail_first: Dict[str, int] = {}
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - the http.server interface
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                with receiver.lock:
                    left = receiver.fail_first.get(self.path, 0)
                    receiver.fail_first[self.path] = max(left - 1, 0)
                    receiver.received.append({
                        "path": self.path,
                        "headers": {k.lower(): v for k, v in self.headers.items()},
                        "body": body,
                        "json": json.loads(body),
                        "answered": 500 if left else 200,
                    })
                self.send_response(500 if left else 200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def on(self, path: str, event_type: str = None) -> List[dict]:
        with self.lock:
            return [r for r in self.received
                    if r["path"] == path and (event_type is None or r["json"]["type"] == event_type)]

    def close(self):
        self.server.shutdown()


@pytest.fixture
def receiver():
    r = Receiver()
    yield r
    r.close()


def test_webhooks_are_signed_retried_replayed_and_refused_on_loopback_without_the_allowance(
        make_cluster, receiver, monkeypatch):
    # Fast retries and polling so the 500-then-200 receiver is retried within a second.
    monkeypatch.setenv("TESSERA_WEBHOOK_RETRY_BASE_MS", "300")
    monkeypatch.setenv("TESSERA_WEBHOOK_POLL_MS", "100")
    cluster = make_cluster(1)
    keys = cluster.create_tenant("acme")
    admin = keys["tenant-admin"]
    hooks = "/v1/tenants/acme/webhooks"

    # Without the allowance: plain http is refused, and so is https to loopback.
    for url, words in [(f"{receiver.url}/main", "https"), ("https://127.0.0.1:9/main", "loopback"),
                       ("https://169.254.169.254/latest", "link-local"), ("https://[::1]/x", "loopback")]:
        with pytest.raises(ApiError) as refused:
            cluster.api("POST", hooks, admin, {"url": url, "events": ["alias.moved"]}, expect=201)
        assert refused.value.status == 422 and words in refused.value.body, refused.value.body
    # Only a platform admin may allow private targets; a tenant admin may not.
    with pytest.raises(ApiError) as forbidden:
        cluster.api("PUT", "/v1/tenants/acme/webhook-settings", admin, {"allow_private_targets": True})
    assert forbidden.value.status == 403
    cluster.api("PUT", "/v1/tenants/acme/webhook-settings", cluster.admin_key, {"allow_private_targets": True})
    assert cluster.api("GET", "/v1/tenants/acme/webhook-settings", admin) == {"allow_private_targets": True}
    audit = cluster.api("GET", "/v1/audit?action=webhook_settings.update", admin)
    assert len(audit["events"]) == 1

    events = ["deployment.created", "deployment.ready", "version.uploaded", "alias.moved"]
    main = cluster.api("POST", hooks, admin, {"url": f"{receiver.url}/main", "events": events}, expect=201)
    secret = main["secret"]
    assert secret.startswith("whsec_") and main["webhook"]["events"] == events
    assert "secret" not in cluster.api("GET", f"{hooks}/{main['webhook']['id']}", admin)
    receiver.fail_first["/flaky"] = 1
    flaky = cluster.api("POST", hooks, admin, {"url": f"{receiver.url}/flaky", "events": ["alias.moved"]},
                        expect=201)
    # Inference keys cannot read hooks.
    with pytest.raises(ApiError) as no_read:
        cluster.api("GET", hooks, keys["inference"])
    assert no_read.value.status == 403

    assert cluster.push_version("acme", admin, "marker", marker_model(1.0)) == 1
    cluster.api("PUT", "/v1/tenants/acme/models/marker/aliases/production", admin, {"version": 1})
    cluster.api("POST", "/v1/tenants/acme/deployments", admin,
                {"name": "marker", "model": "marker", "alias": "production", "replicas": 1}, expect=201)
    cluster.wait_ready("acme", admin, "marker")

    wait_until(lambda: all(receiver.on("/main", t) for t in events), 30, "every subscribed event delivered")
    got = receiver.on("/main")
    for r in got:
        assert verify(secret, r["headers"], r["body"]), f"bad signature on {r['json']['type']}"
        assert not verify("whsec_wrong", r["headers"], r["body"])
        assert r["headers"]["tessera-event"] == r["json"]["type"]
        assert r["headers"]["content-type"] == "application/json"
    types = [r["json"]["type"] for r in got]
    assert types.index("deployment.created") < types.index("deployment.ready"), types
    uploaded = receiver.on("/main", "version.uploaded")[0]["json"]["data"]
    assert (uploaded["model"], uploaded["version"]) == ("marker", 1)
    moved = receiver.on("/main", "alias.moved")[0]["json"]["data"]
    assert (moved["alias"], moved["version"], moved["previous_version"]) == ("production", 1, None)
    ready = receiver.on("/main", "deployment.ready")[0]["json"]["data"]
    assert (ready["deployment"], ready["model"]) == ("marker", "marker")

    # The flaky receiver answered 500, then 200 to the retry of the same delivery.
    flaky_id = flaky["webhook"]["id"]

    def flaky_delivered():
        ds = cluster.api("GET", f"{hooks}/{flaky_id}/deliveries?status=delivered", admin)["deliveries"]
        return ds[0] if ds else None

    d = wait_until(flaky_delivered, 30, "the flaky hook's delivery retried and delivered")
    assert (d["attempts"], d["last_http_status"], d["event_type"]) == (2, 200, "alias.moved")
    tries = receiver.on("/flaky")
    assert [r["answered"] for r in tries] == [500, 200]
    assert {r["headers"]["tessera-delivery"] for r in tries} == {d["id"]}

    # A replay sends the same event (same id and body) as a new delivery.
    main_id = main["webhook"]["id"]
    listed = cluster.api("GET", f"{hooks}/{main_id}/deliveries?limit=200", admin)["deliveries"]
    original = next(x for x in listed if x["event_type"] == "alias.moved")
    assert original["status"] == "delivered" and original["attempts"] == 1
    replay = cluster.api("POST", f"{hooks}/{main_id}/deliveries/{original['id']}/replay", admin, expect=202)
    assert replay["replay_of"] == original["id"] and replay["event_id"] == original["event_id"]
    wait_until(lambda: len(receiver.on("/main", "alias.moved")) == 2, 30, "the replay delivered")
    first, second = receiver.on("/main", "alias.moved")
    assert first["body"] == second["body"]
    assert second["headers"]["tessera-delivery"] == replay["id"] != first["headers"]["tessera-delivery"]
    assert verify(secret, second["headers"], second["body"])

    # A test event, then a rotated secret signs what follows.
    cluster.api("POST", f"{hooks}/{main_id}/ping", admin, expect=202)
    wait_until(lambda: receiver.on("/main", "ping"), 30, "the ping delivered")
    rotated = cluster.api("POST", f"{hooks}/{main_id}/rotate-secret", admin)["secret"]
    assert rotated != secret
    cluster.api("POST", f"{hooks}/{main_id}/ping", admin, expect=202)
    wait_until(lambda: len(receiver.on("/main", "ping")) == 2, 30, "the second ping delivered")
    last = receiver.on("/main", "ping")[1]
    assert verify(rotated, last["headers"], last["body"]) and not verify(secret, last["headers"], last["body"])

    # Another tenant sees none of it.
    other = cluster.create_tenant("other")["tenant-admin"]
    with pytest.raises(ApiError) as hidden:
        cluster.api("GET", f"/v1/tenants/other/webhooks/{main_id}", other)
    assert hidden.value.status == 404
    with pytest.raises(ApiError) as hidden:
        cluster.api("GET", f"{hooks}/{main_id}", other)
    assert hidden.value.status == 404
    # Nothing is lost across a control-plane kill: a delivery that could not reach its receiver
    # stays queued in the database and goes out from the restarted control plane.
    dead = f"http://127.0.0.1:{free_port()}/durable"
    durable = cluster.api("POST", hooks, admin, {"url": dead, "events": ["alias.moved"]}, expect=201)["webhook"]
    cluster.api("PUT", "/v1/tenants/acme/models/marker/aliases/staging", admin, {"version": 1})

    def failed_once():
        ds = cluster.api("GET", f"{hooks}/{durable['id']}/deliveries", admin)["deliveries"]
        return ds[0] if ds and ds[0]["attempts"] >= 1 else None

    queued = wait_until(failed_once, 30, "a delivery to a dead receiver failed")
    assert queued["status"] == "pending" and "connect" in queued["last_error"], queued
    cluster.cp.kill()
    cluster.start_control_plane()
    cluster.api("PATCH", f"{hooks}/{durable['id']}", admin, {"url": f"{receiver.url}/durable"})
    wait_until(lambda: receiver.on("/durable", "alias.moved"), 60, "the queued delivery sent after the restart")
    got = receiver.on("/durable", "alias.moved")[0]
    assert got["headers"]["tessera-delivery"] == queued["id"] and got["json"]["data"]["alias"] == "staging"

    # Without the allowance again, the hook's next delivery is refused at send time.
    cluster.api("PUT", "/v1/tenants/acme/webhook-settings", cluster.admin_key, {"allow_private_targets": False})
    cluster.api("POST", f"{hooks}/{main_id}/ping", admin, expect=202)

    def refused_ping():
        ds = cluster.api("GET", f"{hooks}/{main_id}/deliveries?status=pending", admin)["deliveries"]
        return ds[0] if ds and ds[0]["attempts"] >= 1 else None

    pending = wait_until(refused_ping, 30, "a ping refused at send time")
    assert "loopback" in (pending["last_error"] or "") or "https" in (pending["last_error"] or ""), pending
    assert len(receiver.on("/main", "ping")) == 2

    # A quota refusal is announced once per quota and window, however often it is retried.
    capped = cluster.create_tenant("capped", versions=1)["tenant-admin"]
    cluster.api("PUT", "/v1/tenants/capped/webhook-settings", cluster.admin_key, {"allow_private_targets": True})
    quota_hook = cluster.api("POST", "/v1/tenants/capped/webhooks", capped,
                             {"url": f"{receiver.url}/quota", "events": ["quota.exceeded"]}, expect=201)
    assert cluster.push_version("capped", capped, "marker", marker_model(1.0)) == 1
    for _ in range(2):
        with pytest.raises(ApiError) as over:
            cluster.push_version("capped", capped, "marker", marker_model(2.0))
        assert "quota_exceeded.versions" in over.value.body, over.value.body
    wait_until(lambda: receiver.on("/quota", "quota.exceeded"), 30, "quota.exceeded delivered")
    cluster.api("POST", f"/v1/tenants/capped/webhooks/{quota_hook['webhook']['id']}/ping", capped, expect=202)
    wait_until(lambda: receiver.on("/quota", "ping"), 30, "the ping after the refusals delivered")
    exceeded = receiver.on("/quota", "quota.exceeded")
    assert len(exceeded) == 1, [r["json"] for r in exceeded]
    assert exceeded[0]["json"]["data"] == {"quota": "versions", "limit": 1, "requested": 2}
    assert verify(quota_hook["secret"], exceeded[0]["headers"], exceeded[0]["body"])
