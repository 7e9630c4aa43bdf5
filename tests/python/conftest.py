"""Fixtures that run the real ``tessera serve`` binary for the end-to-end tests.

Contract with the server (see ``server_command``)::

    $TESSERA_BIN serve --model-repository DIR \\
        --http-address 127.0.0.1 --grpc-address 127.0.0.1 --metrics-address 127.0.0.1 \\
        --http-port 0 --grpc-port 0 --metrics-port 0 \\
        --model-control-mode explicit --load-model '*' \\
        --strict-readiness false --log-format text

The server reports each bound listener with one log line on stderr matching
``LISTEN_RE`` (protocol http, grpc or metrics, and the address it got). The
fixture waits up to ``STARTUP_TIMEOUT_S`` for all three and for
``GET /v2/health/live`` to answer 200, then (same deadline, not fatal) for
``/v2/health/ready``, since the startup loads may finish after the listeners
are up. stdout and stderr are drained by
threads into ``server.log`` for the whole run (both are scanned, in case the
listener lines land on stdout). Teardown sends SIGTERM, then SIGKILL after
``SHUTDOWN_GRACE_S``.

Environment:
    TESSERA_BIN    path to the built ``tessera`` binary (required; without it
                   every test is skipped, loudly)
    ORT_DYLIB_PATH passed through to the server (ONNX Runtime shared library)
    TESSERA_TEST_KEEP  if set, the generated repository and logs are kept and
                   their paths printed
"""

from __future__ import annotations

import http.client
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import gen_models  # noqa: E402

LISTEN_RE = re.compile(r'listening.*protocol="?(\w+)"?.*addr=([0-9.]+):(\d+)')
ANSI_RE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
PROTOCOLS = ("http", "grpc", "metrics")
STARTUP_TIMEOUT_S = 60.0
SHUTDOWN_GRACE_S = 10.0
LOG_TAIL_LINES = 80


def _tessera_bin() -> Optional[str]:
    path = os.environ.get("TESSERA_BIN", "")
    if path and Path(path).is_file() and os.access(path, os.X_OK):
        return str(Path(path).resolve())
    return None


def _skip_reason() -> str:
    path = os.environ.get("TESSERA_BIN")
    if not path:
        return "TESSERA_BIN is not set: build the server and export TESSERA_BIN=/path/to/tessera to run these end-to-end tests"
    return f"TESSERA_BIN={path!r} is not an executable file: build the server first"


# --------------------------------------------------------------------------
# pytest hooks: skip everything loudly when there is no binary
# --------------------------------------------------------------------------


def pytest_report_header(config):
    b = _tessera_bin()
    lines = [f"tessera binary: {b}" if b else f"!!! ALL TESSERA END-TO-END TESTS WILL BE SKIPPED: {_skip_reason()} !!!"]
    lines.append(f"ORT_DYLIB_PATH: {os.environ.get('ORT_DYLIB_PATH', '(unset)')}")
    return lines


def pytest_collection_modifyitems(config, items):
    if _tessera_bin():
        return
    marker = pytest.mark.skip(reason=_skip_reason())
    for item in items:
        item.add_marker(marker)


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if not _tessera_bin():
        terminalreporter.write_sep("!", "tessera end-to-end tests were SKIPPED", red=True, bold=True)
        terminalreporter.write_line(_skip_reason(), red=True)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Attach the server's log tail to every failing test report."""
    outcome = yield
    rep = outcome.get_result()
    if rep.failed and call.when in ("setup", "call"):
        for srv in list(_LIVE_SERVERS):
            rep.sections.append((f"tessera server log tail ({srv.name})", srv.log_tail(40)))


# --------------------------------------------------------------------------
# the server process
# --------------------------------------------------------------------------

_LIVE_SERVERS: List["TesseraServer"] = []


class ServerStartError(RuntimeError):
    pass


def server_command(
    binary: str,
    repo: Path,
    *,
    control_mode: str = "explicit",
    load_models: Sequence[str] = ("*",),
    extra_args: Sequence[str] = (),
) -> List[str]:
    cmd = [
        binary,
        "serve",
        "--model-repository", str(repo),
        "--http-address", "127.0.0.1",
        "--grpc-address", "127.0.0.1",
        "--metrics-address", "127.0.0.1",
        "--http-port", "0",
        "--grpc-port", "0",
        "--metrics-port", "0",
        "--model-control-mode", control_mode,
    ]
    if control_mode == "explicit":
        for m in load_models:
            cmd += ["--load-model", m]
    cmd += ["--strict-readiness", "false", "--log-format", "text"]
    cmd += list(extra_args)
    return cmd


class TesseraServer:
    """A running ``tessera serve`` process and the addresses it reported."""

    def __init__(self, cmd: List[str], log_path: Path, name: str = "main", ssl_context=None):
        self.cmd = cmd
        # Health is probed over HTTPS with this context when the server speaks TLS.
        self.ssl_context = ssl_context
        self.name = name
        self.log_path = log_path
        self.addrs: Dict[str, str] = {}
        self.proc: Optional[subprocess.Popen] = None
        self._tail: deque = deque(maxlen=2000)
        self._lock = threading.Lock()
        self._seen = threading.Condition(self._lock)
        self._threads: List[threading.Thread] = []
        self._log_file = None

    # -- addresses ---------------------------------------------------------
    @property
    def http_url(self) -> str:
        return self.addrs["http"]

    @property
    def grpc_url(self) -> str:
        return self.addrs["grpc"]

    @property
    def metrics_url(self) -> str:
        return self.addrs["metrics"]

    # -- lifecycle ---------------------------------------------------------
    def start(self, timeout_s: float = STARTUP_TIMEOUT_S) -> "TesseraServer":
        env = dict(os.environ)
        env.setdefault("NO_COLOR", "1")  # keep the listener lines free of ANSI colour codes
        env.setdefault("RUST_BACKTRACE", "1")
        self._log_file = open(self.log_path, "w", encoding="utf-8", errors="replace")
        self._log_file.write("$ " + shlex.join(self.cmd) + "\n")
        self._log_file.flush()
        self.proc = subprocess.Popen(
            self.cmd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            cwd=str(self.log_path.parent),
        )
        _LIVE_SERVERS.append(self)
        for stream, tag in ((self.proc.stderr, "stderr"), (self.proc.stdout, "stdout")):
            t = threading.Thread(target=self._drain, args=(stream, tag), name=f"tessera-{self.name}-{tag}", daemon=True)
            t.start()
            self._threads.append(t)
        deadline = time.monotonic() + timeout_s
        try:
            self._wait_listeners(timeout_s)
            self._wait_health("live", deadline, required=True)
            # Listeners come up before the startup loads finish; ready (with
            # --strict-readiness false) says the initial loads are done. Not
            # fatal here: the readiness tests report it if it never comes.
            self._wait_health("ready", deadline, required=False)
        except BaseException:
            self.stop()
            raise
        return self

    def _drain(self, stream, tag: str) -> None:
        for raw in iter(stream.readline, b""):
            line = ANSI_RE.sub("", raw.decode("utf-8", errors="replace")).rstrip("\n")
            with self._lock:
                self._tail.append(line)
                if self._log_file and not self._log_file.closed:
                    self._log_file.write(line + "\n")
                    self._log_file.flush()
                m = LISTEN_RE.search(line)
                if m and m.group(1) in PROTOCOLS and m.group(1) not in self.addrs:
                    self.addrs[m.group(1)] = f"{m.group(2)}:{m.group(3)}"
                self._seen.notify_all()
        with self._lock:
            self._seen.notify_all()

    def _wait_listeners(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        with self._lock:
            while not all(p in self.addrs for p in PROTOCOLS):
                if self.proc.poll() is not None:
                    break
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._seen.wait(min(left, 0.5))
            missing = [p for p in PROTOCOLS if p not in self.addrs]
        if missing:
            if self.proc.poll() is not None:
                self._fail(f"exited before reporting listener(s) {missing} (regex {LISTEN_RE.pattern!r})")
            self._fail(f"did not report listener(s) {missing} within {timeout_s:.0f}s (regex {LISTEN_RE.pattern!r})")

    def _wait_health(self, what: str, deadline: float, required: bool) -> None:
        host, port = self.http_url.rsplit(":", 1)
        last = None
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self._fail(f"exited before /v2/health/{what} answered 200")
            try:
                if self.ssl_context is None:
                    conn = http.client.HTTPConnection(host, int(port), timeout=2)
                else:
                    conn = http.client.HTTPSConnection(host, int(port), timeout=2, context=self.ssl_context)
                conn.request("GET", f"/v2/health/{what}")
                status = conn.getresponse().status
                conn.close()
                if status == 200:
                    return
                last = f"HTTP {status}"
            except OSError as e:
                last = repr(e)
            time.sleep(0.05)
        why = f"GET /v2/health/{what} did not answer 200 in time (last: {last})"
        if required:
            self._fail(why)
        with self._lock:
            self._tail.append(f"[conftest] warning: {why}")

    def _fail(self, why: str):
        rc = self.proc.poll() if self.proc else None
        state = f"exit code {rc}" if rc is not None else "still running"
        raise ServerStartError(
            f"tessera server '{self.name}' {why} [{state}]\ncommand: {shlex.join(self.cmd)}\nlog: {self.log_path}\n"
            f"--- last log lines ---\n{self.log_tail()}"
        )

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def check_alive(self) -> None:
        if not self.alive():
            pytest.fail(
                f"tessera server '{self.name}' died (exit code {self.proc.returncode}); log {self.log_path}\n"
                f"--- last log lines ---\n{self.log_tail()}",
                pytrace=False,
            )

    def log_tail(self, n: int = LOG_TAIL_LINES) -> str:
        with self._lock:
            return "\n".join(list(self._tail)[-n:])

    def log_text(self) -> str:
        with self._lock:
            return "\n".join(self._tail)

    def stop(self) -> Optional[int]:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            try:
                self.proc.send_signal(signal.SIGTERM)
                self.proc.wait(timeout=SHUTDOWN_GRACE_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=SHUTDOWN_GRACE_S)
        for t in self._threads:
            t.join(timeout=2)
        with self._lock:
            if self._log_file and not self._log_file.closed:
                self._log_file.close()
        if self in _LIVE_SERVERS:
            _LIVE_SERVERS.remove(self)
        return self.proc.returncode

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def _start_or_fail(srv: TesseraServer) -> None:
    error = None
    try:
        srv.start()
    except ServerStartError as e:
        error = str(e)
    if error:  # outside the except block: no chained traceback noise
        pytest.fail(error, pytrace=False)


# --------------------------------------------------------------------------
# fixtures
# --------------------------------------------------------------------------


@pytest.fixture(scope="session")
def tessera_bin() -> str:
    b = _tessera_bin()
    if not b:
        pytest.skip(_skip_reason())
    return b


@pytest.fixture(scope="session")
def work_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("tessera-e2e")
    yield d
    if os.environ.get("TESSERA_TEST_KEEP"):
        print(f"\n[tessera e2e] kept work dir {d}")


@pytest.fixture(scope="session")
def model_repo(work_dir) -> Path:
    """The full generated model repository (all models of gen_models.py)."""
    repo = work_dir / "models"
    gen_models.generate(repo)
    return repo


@pytest.fixture(scope="session")
def server(tessera_bin, model_repo, work_dir) -> TesseraServer:
    cmd = server_command(tessera_bin, model_repo)
    srv = TesseraServer(cmd, work_dir / "server.log", name="main")
    _start_or_fail(srv)
    yield srv
    rc = srv.stop()
    # A crash at shutdown is a bug too, but it must not hide the test results.
    if rc not in (0, -signal.SIGTERM, None):
        print(f"\n[tessera e2e] server exited with code {rc} on SIGTERM; log {srv.log_path}")


@pytest.fixture(autouse=True)
def _server_alive_guard(request):
    """Fail a test that leaves the main server dead (crash on a bad request)."""
    yield
    if "server" in request.fixturenames:
        request.getfixturevalue("server").check_alive()


@pytest.fixture(scope="session")
def http_url(server) -> str:
    return server.http_url


@pytest.fixture(scope="session")
def grpc_url(server) -> str:
    return server.grpc_url


@pytest.fixture(scope="session")
def metrics_url(server) -> str:
    return server.metrics_url


@pytest.fixture(scope="session")
def http_client(server):
    import tritonclient.http as httpclient

    c = httpclient.InferenceServerClient(server.http_url, connection_timeout=30, network_timeout=30)
    yield c
    c.close()


@pytest.fixture(scope="session")
def grpc_client(server):
    import tritonclient.grpc as grpcclient

    c = grpcclient.InferenceServerClient(server.grpc_url)
    yield c
    c.close()


@pytest.fixture
def fresh_grpc_client(server):
    """A function-scoped gRPC client (tritonclient allows one stream per client)."""
    import tritonclient.grpc as grpcclient

    c = grpcclient.InferenceServerClient(server.grpc_url)
    yield c
    c.stop_stream(cancel_requests=True)
    c.close()


@pytest.fixture(scope="session")
def raw_http(server):
    import tessera_helpers

    return tessera_helpers.RawHttp(server.http_url)


@pytest.fixture(scope="session")
def aio_http_client_factory(server):
    """Returns ``make()`` -> tritonclient.http.aio client; call it inside the
    running event loop and ``await client.close()`` (or ``async with``)."""
    import tritonclient.http.aio as aiohttpclient

    return lambda: aiohttpclient.InferenceServerClient(server.http_url)


@pytest.fixture(scope="session")
def aio_grpc_client_factory(server):
    """Returns ``make()`` -> tritonclient.grpc.aio client (create inside the loop)."""
    import tritonclient.grpc.aio as aiogrpcclient

    return lambda: aiogrpcclient.InferenceServerClient(server.grpc_url)


@pytest.fixture(scope="session")
def launch_server(tessera_bin, model_repo, work_dir):
    """Factory for extra servers with different flags.

    ``launch_server(name, extra_args=(), control_mode="explicit",
    load_models=("*",), models=None)`` starts a server over a copy of the
    repository holding only ``models`` (default: add_sub) and returns a
    started ``TesseraServer``; call ``.stop()`` when done (everything still
    running is stopped at session end)."""
    started: List[TesseraServer] = []

    def launch(
        name: str,
        extra_args: Sequence[str] = (),
        control_mode: str = "explicit",
        load_models: Sequence[str] = ("*",),
        models: Optional[Sequence[str]] = ("add_sub",),
    ) -> TesseraServer:
        d = work_dir / f"server-{name}"
        if d.exists():
            shutil.rmtree(d)
        d.mkdir()
        repo = d / "models"
        if models is None:
            repo = model_repo
        else:
            repo.mkdir()
            for m in models:
                shutil.copytree(model_repo / m, repo / m)
        cmd = server_command(tessera_bin, repo, control_mode=control_mode, load_models=load_models, extra_args=extra_args)
        srv = TesseraServer(cmd, d / "server.log", name=name)
        started.append(srv)
        _start_or_fail(srv)
        return srv

    yield launch
    for srv in started:
        srv.stop()
