"""The README's tenant flow ("A tenant's day"), run exactly as the README writes it.

The test reads the three blocks that follow the ``<!-- tenant-flow -->``,
``<!-- tenant-flow-request -->`` and ``<!-- tenant-flow-python -->`` markers in README.md, starts a
real ``tessera dev`` (control plane, worker, gateway) on free ports, writes ``request.json``,
``infer.py`` and two model versions into a scratch directory, and runs every command line of the
flow there with ``bash``, ``tessera`` being the built binary and ``python3`` the project's venv.
Tessera is driven by the CLI only; inference also goes through ``tritonclient`` over HTTP and gRPC.
After each line, a check made for that line looks at what it printed. The README's lines and the
test's, in order, must be the same: the README and the test cannot drift apart.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable, List, Optional, Tuple

import pytest

from conftest import ANSI_RE, free_port, marker_model, tessera_bin

REPO = Path(__file__).resolve().parents[2]
READY_LINE = "tessera dev is ready (Ctrl-C stops it)"


def readme_block(marker: str) -> str:
    """The fenced block right after ``<!-- marker -->`` in README.md."""
    text = (REPO / "README.md").read_text()
    m = re.search(rf"<!-- {re.escape(marker)} -->\n```\w*\n(.*?)\n```", text, re.S)
    assert m, f"README.md has no block after <!-- {marker} -->"
    return m.group(1)


def flow_commands() -> List[str]:
    """The flow's command lines, without their trailing comments."""
    lines = []
    for line in readme_block("tenant-flow").splitlines():
        command = re.sub(r"\s+#.*$", "", line).strip()
        if command:
            lines.append(command)
    return lines


class Dev:
    """A running ``tessera dev`` and the banner it printed."""

    def __init__(self, workdir: Path):
        self.gateway_http, self.gateway_grpc = free_port(), free_port()
        cmd = [
            tessera_bin(), "dev", "--data-dir", str(workdir / "dev"),
            "--listen", "127.0.0.1:0", "--http-port", "0", "--grpc-port", "0", "--metrics-port", "0",
            # Fixed gateway ports, so deployments show the gateway as their endpoint.
            "--gateway-http-port", str(self.gateway_http), "--gateway-grpc-port", str(self.gateway_grpc),
            "--gateway-metrics-port", "0",
        ]
        env = {**os.environ, "NO_COLOR": "1"}
        self.log = open(workdir / "dev.log", "w")
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=self.log, text=True, env=env, cwd=workdir)
        self.banner: List[str] = []
        ready = threading.Event()

        def pump():
            for raw in self.proc.stdout:
                line = ANSI_RE.sub("", raw.rstrip("\n"))
                if line == READY_LINE:
                    ready.set()
                elif not ready.is_set():
                    self.banner.append(line)

        threading.Thread(target=pump, daemon=True).start()
        if not ready.wait(240):
            self.stop()
            log = (workdir / "dev.log").read_text()[-4000:]
            raise AssertionError(f"tessera dev printed no ready line; banner: {self.banner}\nlog:\n{log}")

    def field(self, label: str) -> str:
        for line in self.banner:
            if line.strip().startswith(label):
                return line.strip()[len(label):].split()[0]
        raise AssertionError(f"no {label!r} in the banner:\n" + "\n".join(self.banner))

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


@pytest.fixture
def dev(tmp_path):
    d = Dev(tmp_path)
    yield d
    d.stop()


# --------------------------------------------------------------------------
# What each line of the flow must print
# --------------------------------------------------------------------------


def answer_of(out: str) -> tuple:
    """(version, OUTPUT0 values) from the compact ``tessera infer`` output."""
    version = re.search(r"^model marker version (\d+)$", out, re.M)
    row = re.search(r"^OUTPUT0\s+FP32\s+1x4\s+\[([^\]]*)\]$", out, re.M)
    assert version and row, out
    return int(version.group(1)), [float(v) for v in row.group(1).split(", ")]


def infer_gives(version: int) -> Callable[[str], None]:
    def check(out: str):
        assert answer_of(out) == (version, [float(v + version) for v in range(4)]), out

    return check


def tritonclient_gives(version: int) -> Callable[[str], None]:
    def check(out: str):
        expected = [[float(v + version) for v in range(4)]]
        assert f"http {version} {expected}" in out, out
        assert f"grpc {version} {expected}" in out, out

    return check


def all_of(*needles: str) -> Callable[[str], None]:
    def check(out: str):
        for needle in needles:
            assert needle in out, f"{needle!r} not in:\n{out}"

    return check


def checks(dev: Dev) -> List[Tuple[str, Callable[[str], None]]]:
    """Each README line, in order, with what it must print."""
    gateway = f"http://127.0.0.1:{dev.gateway_http}/v2/models/marker"

    def events(out: str):
        header, *rows = out.splitlines()
        assert header.split() == ["AT", "KIND", "WORKER", "MESSAGE"], out
        assert rows, f"no events:\n{out}"

    infer = "tessera infer --model marker --input @request.json"
    return [
        ('tessera login --url "$TESSERA_URL" --key "$TENANT_ADMIN_KEY"', all_of("tenant demo, role tenant-admin")),
        ("tessera whoami", all_of("tenant:", "demo", "role:", "tenant-admin", "key:")),
        ("tessera models push model-v1.onnx --model marker --alias production",
         all_of("pushed marker version 1", "alias production of marker: created at version 1")),
        ("tessera deploy --model marker --alias production --replicas 2 --wait",
         all_of("created marker: ready, model marker version 1 (alias production)", "2/2 cpu replicas ready")),
        ("tessera deployments get marker", all_of(f"endpoint: {gateway}", "traffic: version 1 100% (2/2 ready)")),
        (infer, infer_gives(1)),
        ("python3 infer.py", tritonclient_gives(1)),
        ("tessera models push model-v2.onnx --model marker --alias production --wait",
         all_of("pushed marker version 2", "alias production of marker: version 1 -> 2",
                "rolled out: marker: ready, model marker version 2 (alias production)")),
        (infer, infer_gives(2)),
        ("tessera aliases rollback marker production --wait",
         all_of("rolled back alias production of marker: version 2 -> 1",
                "rolled out: marker: ready, model marker version 1 (alias production)")),
        (infer, infer_gives(1)),
        ("tessera deployments scale marker --replicas 3 --wait",
         all_of("scaled: marker: ready", "3/3 cpu replicas ready")),
        ("tessera deployments events marker", events),
        ("tessera deployments delete marker --yes", all_of("deleted deployment marker")),
    ]


def test_the_readme_tenant_flow_runs_as_written(dev, tmp_path):
    work = tmp_path / "tenant"
    work.mkdir()
    (work / "model-v1.onnx").write_bytes(marker_model(1.0))
    (work / "model-v2.onnx").write_bytes(marker_model(2.0))
    (work / "request.json").write_text(readme_block("tenant-flow-request") + "\n")
    (work / "infer.py").write_text(readme_block("tenant-flow-python") + "\n")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "tessera").symlink_to(tessera_bin())
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("TESSERA_")},
        # `python3` is this venv's (it has tritonclient and numpy).
        "PATH": f"{bin_dir}:{Path(sys.executable).parent}:{os.environ['PATH']}",
        "TESSERA_CONFIG": str(tmp_path / "cli" / "config.json"),
        "TESSERA_URL": dev.field("REST API").removesuffix("/v1"),
        "TENANT_ADMIN_KEY": dev.field("tenant-admin key"),
        "INFERENCE_KEY": dev.field("inference key"),
        "GATEWAY_HTTP": f"127.0.0.1:{dev.gateway_http}",
        "GATEWAY_GRPC": f"127.0.0.1:{dev.gateway_grpc}",
        "NO_COLOR": "1",
    }

    commands = flow_commands()
    expected = checks(dev)
    assert commands == [line for line, _ in expected], (
        "README's tenant flow and this test differ:\n  README: " + "\n          ".join(commands)
        + "\n  test:   " + "\n          ".join(line for line, _ in expected))

    seen_versions = []
    for command, check in expected:
        # Inference right after a rollout may meet a gateway a moment behind the control plane's
        # route table: the same line is retried for a few seconds before its check must hold.
        deadline = time.monotonic() + (10 if "infer" in command else 0)
        while True:
            run = subprocess.run(["bash", "-c", command], cwd=work, env=env, capture_output=True, text=True,
                                 timeout=360)
            out = run.stdout
            try:
                assert run.returncode == 0, f"exit {run.returncode}\nstdout:\n{out}\nstderr:\n{run.stderr}"
                check(out)
                break
            except AssertionError as e:
                if time.monotonic() > deadline:
                    raise AssertionError(f"README line failed: {command}\n{e}") from None
                time.sleep(0.5)
        if command.startswith("tessera infer"):
            seen_versions.append(answer_of(out)[0])
    assert seen_versions == [1, 2, 1], "the rollout and the rollback each changed what answers"

    # The flow left the tenant as it found it, but for the model: only the demo deployment.
    listed = subprocess.run(["tessera", "-o", "json", "deployments", "list"], env=env, capture_output=True,
                            text=True, check=True)
    assert [d["name"] for d in json.loads(listed.stdout)] == ["simple"], listed.stdout
    aliases = subprocess.run(["tessera", "aliases", "list", "marker", "--output", "json"], env=env,
                             capture_output=True, text=True, check=True)
    production = json.loads(aliases.stdout)["aliases"][0]
    assert (production["version"], production["previous_version"]) == (1, 2), production


def test_cli_errors_are_one_line_saying_what_to_do_next(dev, tmp_path):
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("TESSERA_")},
        "TESSERA_CONFIG": str(tmp_path / "config.json"),
        "NO_COLOR": "1",
    }
    url = dev.field("REST API").removesuffix("/v1")

    def tessera(*args: str, key: Optional[str] = None) -> subprocess.CompletedProcess:
        base = [tessera_bin(), *args, "--url", url, "--key", key or dev.field("tenant-admin key"), "--tenant", "demo"]
        return subprocess.run(base, env=env, capture_output=True, text=True, timeout=120)

    # The README's old first step: a deploy that follows an alias no push created.
    (tmp_path / "m.onnx").write_bytes(marker_model(1.0))
    pushed = tessera("models", "push", str(tmp_path / "m.onnx"), "--model", "lonely")
    assert pushed.returncode == 0, pushed.stderr
    refused = tessera("deploy", "--model", "lonely", "--alias", "production")
    assert refused.returncode != 0
    line = refused.stderr.strip()
    assert len(line.splitlines()) == 1, line
    assert "HTTP 404" in line and "tessera aliases set lonely production --version N" in line, line

    missing = tessera("aliases", "rollback", "lonely", "production")
    assert missing.returncode != 0 and "alias not found" in missing.stderr, missing.stderr

    gone = tessera("deployments", "get", "nope")
    assert "tessera deployments list" in gone.stderr and len(gone.stderr.strip().splitlines()) == 1, gone.stderr

    # An inference key may ask who it is, not list keys; the refusal says how to find out why.
    me = tessera("whoami", "-o", "json", key=dev.field("inference key"))
    assert me.returncode == 0, me.stderr
    assert (json.loads(me.stdout)["role"], json.loads(me.stdout)["tenant"]) == ("inference", "demo")
    denied = tessera("keys", "list", key=dev.field("inference key"))
    assert "HTTP 403" in denied.stderr and "tessera whoami" in denied.stderr, denied.stderr

    # Keys: the secret once on stdout, usable at once; revoked by name, it stops working.
    created = tessera("keys", "create", "--name", "ci viewer", "--role", "viewer")
    assert created.returncode == 0, created.stderr
    secret = created.stdout.strip()
    assert secret.startswith("tsk_") and "shown once" in created.stderr, (created.stdout, created.stderr)
    assert tessera("models", "list", key=secret).returncode == 0
    listed = tessera("keys", "list")
    assert "ci viewer" in listed.stdout and "viewer" in listed.stdout, listed.stdout
    unconfirmed = tessera("keys", "revoke", "ci viewer")
    assert unconfirmed.returncode != 0 and "--yes" in unconfirmed.stderr, unconfirmed.stderr
    revoked = tessera("keys", "revoke", "ci viewer", "--yes")
    assert revoked.returncode == 0, revoked.stderr
    assert "HTTP 401" in tessera("models", "list", key=secret).stderr

    # A refused first push leaves no empty model behind.
    (tmp_path / "junk.onnx").write_bytes(b"not a model")
    junk = tessera("models", "push", str(tmp_path / "junk.onnx"), "--model", "junk")
    assert junk.returncode != 0 and len(junk.stderr.strip().splitlines()) == 1, junk.stderr

    # Reads for scripts: models (every page), versions, usage and the invoice as JSON.
    models = json.loads(tessera("models", "list", "-o", "json").stdout)
    assert {m["name"] for m in models} == {"simple", "lonely"}, models
    versions = json.loads(tessera("versions", "list", "lonely", "-o", "json").stdout)
    assert [v["version"] for v in versions] == [1], versions
    assert "sha256:" in tessera("versions", "get", "lonely", "1").stdout
    usage = tessera("usage", "--group-by", "model", "-o", "json")
    assert usage.returncode == 0 and "usage" in json.loads(usage.stdout), usage.stderr
    invoice = tessera("invoice")
    assert invoice.returncode == 0 and "total:" in invoice.stdout, invoice.stdout + invoice.stderr
    deleted = tessera("models", "delete", "lonely", "--yes")
    assert deleted.returncode == 0, deleted.stderr
