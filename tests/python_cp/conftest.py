"""Fixtures for the control plane's Python tests: the real `tessera control-plane` on port 0
over an SQLite registry in a temp dir, with a known platform-admin key.

TESSERA_BIN names the binary (scripts/test.sh sets it); default: the cargo debug build.
"""

import os
import re
import secrets
import string
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
OPENAPI = ROOT / "openapi" / "openapi.json"


def tessera_bin() -> str:
    if os.environ.get("TESSERA_BIN"):
        return os.environ["TESSERA_BIN"]
    target = os.environ.get("CARGO_TARGET_DIR", str(Path.home() / ".cache" / "tessera" / "target"))
    return str(Path(target) / "debug" / "tessera")


def new_key() -> str:
    """A key in Tessera's format: tsk_<12 lower-case alphanumerics>_<43 alphanumerics>."""
    ident = "".join(secrets.choice(string.ascii_lowercase + string.digits) for _ in range(12))
    secret = "".join(secrets.choice(string.ascii_letters + string.digits) for _ in range(43))
    return f"tsk_{ident}_{secret}"


class ControlPlane:
    def __init__(self, workdir: Path, args=(), env=None):
        self.admin_key = new_key()
        cmd = [
            tessera_bin(), "control-plane",
            "--listen", "127.0.0.1:0",
            "--database-url", f"sqlite://{workdir / 'registry.db'}",
            "--bootstrap-admin-key", self.admin_key,
        ]
        if not any(a == "--object-store" for a in args):
            cmd += ["--object-store", str(workdir / "artifacts")]
        cmd += list(args)
        self.lines = []
        self.proc = subprocess.Popen(
            cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
            env={**os.environ, "RUST_LOG": "info", **(env or {})},
        )
        found = threading.Event()
        self.url = None

        def pump():
            for line in self.proc.stderr:
                self.lines.append(line.rstrip())
                m = re.search(r'listening protocol="http" addr=(\S+)', line)
                if m and not found.is_set():
                    self.url = f"http://{m.group(1)}"
                    found.set()

        threading.Thread(target=pump, daemon=True).start()
        if not found.wait(60):
            self.stop()
            raise RuntimeError("control plane did not start:\n" + "\n".join(self.lines))

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()


@pytest.fixture
def start_control_plane(tmp_path):
    started = []

    def start(args=(), env=None):
        cp = ControlPlane(tmp_path, args, env)
        started.append(cp)
        return cp

    yield start
    for cp in started:
        cp.stop()


@pytest.fixture
def control_plane(start_control_plane):
    return start_control_plane()


def _varint(v: int) -> bytes:
    out = bytearray()
    while v >= 0x80:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)
    return bytes(out)


def _field(number: int, body: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(body)) + body


def onnx_model(padding: int = 0) -> bytes:
    """A small well-formed ONNX model (one FP32 Identity node), padded by a doc_string.

    The control plane walks uploads as ONNX protobuf and refuses anything else."""
    node = _field(1, b"x") + _field(2, b"y") + _field(4, b"Identity")
    # Inputs and outputs typed as FP32 tensors: the control plane refuses untyped ones.
    fp32 = b"\x12\x04\x0a\x02\x08\x01"  # type { tensor_type { elem_type: FLOAT } }
    graph = _field(1, node) + _field(2, b"g") + _field(11, b"\x0a\x01x" + fp32) + _field(12, b"\x0a\x01y" + fp32)
    doc = _field(6, b"z" * padding) if padding else b""
    return b"\x08\x08" + _field(8, b"\x10\x0d") + doc + _field(7, graph)


def wait_for_port(host: str, port: int, timeout: float = 15.0):
    import socket

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex((host, port)) == 0:
                return
        time.sleep(0.1)
    raise RuntimeError(f"nothing listening on {host}:{port}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def s3():
    """An S3-compatible server (moto, from this venv) on loopback with the bucket `artifacts`."""
    import httpx

    port = free_port()
    server = Path(sys.executable).with_name("moto_server")
    proc = subprocess.Popen([str(server), "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for_port("127.0.0.1", port)
        endpoint = f"http://127.0.0.1:{port}"
        httpx.put(f"{endpoint}/artifacts").raise_for_status()
        yield endpoint
    finally:
        proc.terminate()
        proc.wait(10)
