"""``tessera webhooks`` end to end: the built binary against a real ``tessera dev``, with a Python
receiver on loopback that checks every delivery's signature as the README tells tenants to.
Loopback is a private target: the registration is refused until the platform admin allows
private targets for the tenant (the CLI has no verb for that platform-admin switch; the test
uses the API). Each verb is checked for what it prints, in tables and with ``--output json``,
and failures for being one line that says what to do next."""

from __future__ import annotations

import json
import os
import re
import subprocess
import urllib.request
from pathlib import Path
from typing import Optional

import pytest

from conftest import tessera_bin, wait_until
from test_tenant_flow import Dev
from test_webhooks import Receiver, verify


@pytest.fixture
def dev(tmp_path, monkeypatch):
    # The dispatcher looks for due deliveries often, so pings arrive within a moment.
    monkeypatch.setenv("TESSERA_WEBHOOK_POLL_MS", "100")
    d = Dev(tmp_path)
    yield d
    d.stop()


@pytest.fixture
def receiver():
    r = Receiver()
    yield r
    r.close()


class Cli:
    """Runs the binary with the dev's URL and a key; no config file, no terminal."""

    def __init__(self, dev: Dev, tmp_path: Path):
        self.url = dev.field("REST API").removesuffix("/v1")
        self.admin = dev.field("tenant-admin key")
        self.inference = dev.field("inference key")
        self.env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("TESSERA_")},
            "TESSERA_CONFIG": str(tmp_path / "cli" / "config.json"),
            "TESSERA_URL": self.url,
            "TESSERA_API_KEY": self.admin,
            "TESSERA_TENANT": "demo",
            "NO_COLOR": "1",
        }

    def run(self, *args: str, key: Optional[str] = None) -> subprocess.CompletedProcess:
        env = {**self.env, "TESSERA_API_KEY": key or self.admin}
        return subprocess.run([tessera_bin(), *args], env=env, capture_output=True, text=True, timeout=60,
                              stdin=subprocess.DEVNULL)

    def ok(self, *args: str) -> str:
        done = self.run(*args)
        assert done.returncode == 0, f"tessera {' '.join(args)}: exit {done.returncode}\n{done.stderr}"
        return done.stdout

    def json(self, *args: str):
        return json.loads(self.ok("-o", "json", *args))

    def fails(self, *args: str, key: Optional[str] = None) -> str:
        done = self.run(*args, key=key)
        assert done.returncode != 0, f"tessera {' '.join(args)} succeeded:\n{done.stdout}"
        line = done.stderr.strip()
        assert len(line.splitlines()) == 1 and line.startswith("error: "), line
        return line


def allow_private_targets(dev: Dev, tmp_path: Path, url: str):
    """The platform admin's allowance, through the API (its key is in the dev's secrets)."""
    secrets = json.loads((tmp_path / "dev" / "secrets.json").read_text())
    req = urllib.request.Request(f"{url}/v1/tenants/demo/webhook-settings", method="PUT",
                                 data=json.dumps({"allow_private_targets": True}).encode(),
                                 headers={"Authorization": f"Bearer {secrets['platform_admin_key']}",
                                          "Content-Type": "application/json"})
    with urllib.request.urlopen(req) as r:
        assert json.loads(r.read()) == {"allow_private_targets": True}


def test_webhooks_verbs_register_ping_replay_rotate_and_delete(dev, receiver, tmp_path):
    cli = Cli(dev, tmp_path)
    assert cli.ok("webhooks", "list").strip() == (
        "no webhooks in tenant demo (register one with `tessera webhooks create --hook-url URL --event TYPE`)")
    target = f"{receiver.url}/cli"
    create = ["webhooks", "create", "--hook-url", target, "--event", "alias.moved,version.uploaded",
              "--description", "from the CLI"]

    # Loopback over plain http: refused until a platform admin allows private targets.
    refused = cli.fails(*create)
    assert "HTTP 422" in refused and "https" in refused, refused
    # Event types are checked before any call.
    bad = cli.run("webhooks", "create", "--hook-url", target, "--event", "model.exploded")
    assert bad.returncode != 0 and "deployment.ready" in bad.stderr, bad.stderr
    allow_private_targets(dev, tmp_path, cli.url)

    # The secret alone on stdout, once; the hook on stderr.
    created = cli.run(*create)
    assert created.returncode == 0, created.stderr
    secret = created.stdout.strip()
    assert secret.startswith("whsec_") and len(created.stdout.splitlines()) == 1, created.stdout
    assert "shown once" in created.stderr and target in created.stderr, created.stderr
    hooks = cli.json("webhooks", "list")
    assert len(hooks) == 1 and "secret" not in hooks[0], hooks
    hook = hooks[0]
    assert (hook["url"], hook["events"], hook["enabled"]) == (target, ["alias.moved", "version.uploaded"], True)
    hook_id = hook["id"]
    listed = cli.ok("webhooks", "list").splitlines()
    assert listed[0].split() == ["ID", "URL", "EVENTS", "STATE", "CREATED", "DESCRIPTION"], listed
    assert hook_id in listed[1] and "alias.moved, version.uploaded" in listed[1] and "enabled" in listed[1]

    # A prefix of the id names the hook.
    got = cli.ok("webhooks", "get", hook_id[:13])
    assert re.search(rf"^id:\s+{hook_id}$", got, re.M) and re.search(rf"^url:\s+{target}$", got, re.M), got

    # A ping reaches the receiver, signed with the secret printed at creation.
    pinged = cli.ok("webhooks", "ping", hook_id)
    assert pinged.startswith("queued ping delivery "), pinged
    ping_id = pinged.split()[3]
    first = wait_until(lambda: receiver.on("/cli", "ping"), 20, "the ping delivered")[0]
    assert verify(secret, first["headers"], first["body"])
    assert first["headers"]["tessera-delivery"] == ping_id

    delivered = wait_until(
        lambda: (lambda d: d if d[0]["status"] == "delivered" else None)(cli.json("webhooks", "deliveries", hook_id)),
        20, "the ping recorded as delivered")
    assert [d["id"] for d in delivered] == [ping_id]
    table = cli.ok("webhooks", "deliveries", hook_id, "--status", "delivered").splitlines()
    assert table[0].split()[:4] == ["ID", "EVENT", "STATUS", "ATTEMPTS"] and ping_id in table[1], table
    assert cli.ok("webhooks", "deliveries", hook_id, "--status", "failed").strip() == (
        f"no failed deliveries to webhook {hook_id}")
    one = cli.ok("webhooks", "deliveries", hook_id, ping_id)
    assert "status:" in one and "delivered" in one and '"type":"ping"' in one.replace(" ", ""), one

    # A replay is a new delivery of the same event.
    replayed = cli.ok("webhooks", "replay", hook_id, ping_id)
    assert replayed.startswith("queued delivery ") and f"(a replay of {ping_id})" in replayed, replayed
    pings = wait_until(lambda: (lambda p: p if len(p) == 2 else None)(receiver.on("/cli", "ping")), 20,
                       "the replay delivered")
    assert pings[1]["json"]["id"] == pings[0]["json"]["id"]

    # A new secret: printed once, and the next delivery is signed with it.
    assert "pass --yes" in cli.fails("webhooks", "rotate-secret", hook_id)
    rotated = cli.run("webhooks", "rotate-secret", hook_id, "--yes")
    assert rotated.returncode == 0, rotated.stderr
    new_secret = rotated.stdout.strip()
    assert new_secret.startswith("whsec_") and new_secret != secret
    cli.ok("webhooks", "ping", hook_id)
    third = wait_until(lambda: (lambda p: p if len(p) == 3 else None)(receiver.on("/cli", "ping")), 20,
                       "a ping after rotation")[2]
    assert verify(new_secret, third["headers"], third["body"]) and not verify(secret, third["headers"], third["body"])

    # Update: only what is given changes.
    updated = cli.ok("webhooks", "update", hook_id, "--disable", "--event", "deployment.ready")
    assert "state:" in updated and "disabled" in updated, updated
    after = cli.json("webhooks", "get", hook_id)
    assert (after["enabled"], after["events"], after["url"]) == (False, ["deployment.ready"], target)
    assert "nothing to change" in cli.fails("webhooks", "update", hook_id)

    # Roles: an inference key may not read hooks; the error says what to do.
    forbidden = cli.fails("webhooks", "list", key=cli.inference)
    assert "HTTP 403" in forbidden and "tessera whoami" in forbidden, forbidden

    # Delete asks first (no terminal here: refused without --yes), then the hook is gone.
    assert "pass --yes" in cli.fails("webhooks", "delete", hook_id)
    assert cli.ok("webhooks", "delete", hook_id, "--yes").strip() == f"deleted webhook {hook_id} ({target})"
    missing = cli.fails("webhooks", "get", hook_id)
    assert "HTTP 404" in missing and "tessera webhooks list" in missing, missing
    assert "no webhook" in cli.fails("webhooks", "ping", "ffff")
    assert cli.json("webhooks", "list") == []
