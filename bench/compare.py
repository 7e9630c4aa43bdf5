#!/usr/bin/env python3
"""Tessera vs Triton vs raw ONNX Runtime, in one run on this machine.

Run through scripts/bench.sh (it builds the release binary and sets up
perf_analyzer, ONNX Runtime and Triton first); run directly only with every
path given:

    .venv/bin/python bench/compare.py --tessera BIN --perf-analyzer PA \
        [--triton LAUNCHER] [--suite quick|full|large|features] [--no-triton] ...

What it does, in order:
  1. writes a model repository (tests/python/gen_models.py: add_sub, mlp) and
     gives every model the same settings for both servers: one KIND_CPU
     instance (--instances), `intra_op_thread_count` (--threads), and
     dynamic batching on mlp (--max-queue-delay-us; --no-dynamic-batching);
  2. raw ONNX Runtime in-process (`tessera bench ort`, same thread count);
  3. starts `tessera serve` and Triton side by side (an idle server costs
     nothing measurable) and checks add_sub and mlp answers over HTTP and gRPC
     against onnxruntime on each;
  4. for every scenario x protocol, --rounds times, runs perf_analyzer against
     each server back to back (the order alternates between rounds), each run
     followed at once by raw ONNX Runtime at the batch size that server just
     formed. Shared cloud machines drift by tens of percent within minutes, so
     every ratio compares measurements taken seconds apart: "x Triton" is the
     median over rounds of tessera / Triton in the same round, "x raw ORT" the
     median of server / the raw run right after it;
  5. prints one table (aligned text, then the same as markdown) on stdout, each
     number the median over rounds.

perf_analyzer measures in windows (time windows of --window-ms by default,
or count windows) until 3 in a row agree within --stability percent; a run
that does not settle in --max-trials windows is measured once more without
the check and marked "(unstable)". (perf_analyzer's --request-count mode is
not used: its throughput is quantised to whole seconds.) Server-side columns come from perf_analyzer's "Server:"
section, which it derives from the statistics extension (deltas over the run):
queue, compute (input + infer + output) and overhead (request time minus
queue and compute). "batch" is inferences / executions: the batch size the
server actually ran. "srv CPU" and "client CPU" are the CPU time (user +
system, from /proc and getrusage) the server's processes and perf_analyzer
spent per inference over the whole run: on two shared cores their sum bounds
the throughput either server can reach.

Progress goes to stderr. Exits 1 if a response check or perf_analyzer fails
(servers are stopped first), 2 if a server failed to start (the table is
still printed without its rows).
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import re
import resource
import shlex
import signal
import socket
import subprocess
import statistics
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional

ROOT = Path(__file__).resolve().parent.parent
GEN_MODELS = ROOT / "tests" / "python" / "gen_models.py"
MAX_BATCH = {"add_sub": 8, "mlp": 32, "large": 8, "ensemble_add_sub": 8, "add_sub_cached": 8}
# Elements of the `large` model's one FP32 tensor: 1 MiB in and 1 MiB out (an Identity), where
# moving bytes is the whole cost; it shows what a runner's shared memory saves.
LARGE = 1 << 18
# FP32 inputs per batch-1 sample, as tests/python/gen_models.py writes the models.
INPUTS = {"add_sub": {"INPUT0": 16, "INPUT1": 16}, "mlp": {"INPUT0": 256}, "large": {"INPUT0": LARGE},
          "ensemble_add_sub": {"INPUT0": 16, "INPUT1": 16}, "add_sub_cached": {"INPUT0": 16, "INPUT1": 16}}
# INT32 inputs per sample: simple_sequence, Triton's accumulator example (a stateful model that
# perf_analyzer drives as sequences: one live sequence per concurrent request slot, START on the
# first request and END on the last of each, --sequence-length requests long).
INT_INPUTS = {"simple_sequence": {"INPUT": 1}}
SEQUENCE_LENGTH = 20
# The response cache needs Triton's local cache library: --cache-config local,size=CACHE_BYTES.
CACHE_BYTES = 64 << 20

T0 = time.monotonic()


def progress(msg: str) -> None:
    print(f"[bench {time.monotonic() - T0:6.1f}s] {msg}", file=sys.stderr, flush=True)


class BenchError(Exception):
    """A failure that stops the run (after the servers are stopped)."""


class ServerStartError(Exception):
    """A server that did not come up; its rows are left out."""


# ---------------------------------------------------------------------------
# scenarios and results
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Scenario:
    name: str
    model: str
    batch: int
    concurrency: int
    suites: tuple


SCENARIOS = [
    Scenario("add_sub c1", "add_sub", 1, 1, ("full",)),
    Scenario("mlp c1", "mlp", 1, 1, ("quick", "full")),
    Scenario("mlp c4", "mlp", 1, 4, ("quick", "full")),
    Scenario("mlp c16", "mlp", 1, 16, ("full",)),
    Scenario("mlp b8 c8", "mlp", 8, 8, ("full",)),
    # One at a time: perf_analyzer 2.60 over HTTP at concurrency 4 with 1 MiB tensors grew past
    # 23 GiB here and was killed by the kernel.
    Scenario("1 MiB c1", "large", 1, 1, ("full", "large")),
    # The sequence batcher (direct strategy, implicit state): requests of one sequence run one
    # after another, those of different sequences batch together.
    Scenario("sequence c1", "simple_sequence", 1, 1, ("full", "sequence")),
    Scenario("sequence c8", "simple_sequence", 1, 8, ("full", "sequence")),
    # Triton's ensemble example (preprocess then add_sub: two model runs per request).
    Scenario("ensemble c1", "ensemble_add_sub", 1, 1, ("full", "features")),
    Scenario("ensemble c4", "ensemble_add_sub", 1, 4, ("features",)),
    # add_sub with response_cache on; perf_analyzer repeats one input, so all but the first hit.
    Scenario("cache hit c1", "add_sub_cached", 1, 1, ("full", "features")),
    Scenario("cache hit c4", "add_sub_cached", 1, 4, ("features",)),
]
# Raw ONNX Runtime in-process: (model, batch) per suite.
RAW = {"quick": [("mlp", 1)], "full": [("mlp", 1), ("mlp", 8), ("add_sub", 1)], "large": [], "sequence": [],
       "features": [("add_sub", 1)]}
PROTOCOLS = ("http", "grpc")


@dataclass
class Row:
    scenario: str
    server: str  # "raw ORT", "tessera", "tessera-runner", "triton"
    protocol: str  # "in-process", "http", "grpc"
    model: str
    batch: int  # per request (raw: per call)
    concurrency: int = 0
    infer_per_sec: float = 0.0
    p50_us: Optional[float] = None
    p99_us: Optional[float] = None
    queue_us: Optional[float] = None
    compute_us: Optional[float] = None
    compute_infer_us: Optional[float] = None
    overhead_us: Optional[float] = None
    server_request_us: Optional[float] = None
    inference_count: Optional[int] = None
    execution_count: Optional[int] = None
    server_cpu_us: Optional[float] = None  # per inference, the server's processes
    client_cpu_us: Optional[float] = None  # per inference, perf_analyzer
    rounds: int = 1
    vs_triton: Optional[float] = None  # median over rounds of the paired ratio (tessera rows)
    vs_raw: Optional[float] = None  # median over rounds of server / adjacent raw ORT
    raw_batch: Optional[int] = None  # the batch size of that raw reference
    note: str = ""
    command: str = ""
    extra: Dict[str, object] = field(default_factory=dict)

    @property
    def formed_batch(self) -> Optional[float]:
        if self.inference_count and self.execution_count:
            return self.inference_count / self.execution_count
        return None


# ---------------------------------------------------------------------------
# model repository
# ---------------------------------------------------------------------------


def write_repository(repo: Path, args) -> None:
    subprocess.run(
        [sys.executable, str(GEN_MODELS), str(repo), "--only", "mlp", "add_sub", "identity_FP32", "simple_sequence",
         "preprocess", "ensemble_add_sub", "add_sub_cached"],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    # `large`: the FP32 identity with its one dimension fixed at LARGE elements.
    (repo / "identity_FP32").rename(repo / "large")
    (repo / "large" / "config.pbtxt").write_text(
        'name: "large"\nbackend: "onnxruntime"\nmax_batch_size: 8\n'
        f'input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ {LARGE} ] }} ]\n'
        f'output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ {LARGE} ] }} ]\n')
    for model in ("add_sub", "mlp", "large", "preprocess", "add_sub_cached"):
        cfg = repo / model / "config.pbtxt"
        extra = [
            f"instance_group [ {{ count: {args.instances}, kind: KIND_CPU }} ]",
            f'parameters {{ key: "intra_op_thread_count" value {{ string_value: "{args.threads}" }} }}',
        ]
        if model == "mlp" and not args.no_dynamic_batching:
            delay = f" max_queue_delay_microseconds: {args.max_queue_delay_us} " if args.max_queue_delay_us else " "
            extra.append(f"dynamic_batching {{{delay}}}")
        text = cfg.read_text()
        cfg.write_text(text.rstrip("\n") + "\n" + "\n".join(extra) + "\n")
    # simple_sequence names its one instance itself; only the threads are the run's.
    cfg = repo / "simple_sequence" / "config.pbtxt"
    cfg.write_text(cfg.read_text() + f'parameters {{ key: "intra_op_thread_count" value {{ string_value: "{args.threads}" }} }}\n')


def write_input_data(root: Path) -> None:
    """perf_analyzer's input data: one raw FP32 file per input, uniform in [-1, 1) like the raw
    ONNX Runtime runs' inputs. perf_analyzer's default "random" data is random bit patterns
    (values up to 3e38, most MLP outputs NaN), which slows the engine's arithmetic by about a
    tenth and would make the servers run different numbers than the raw baseline."""
    import numpy as np

    rng = np.random.default_rng(2024)
    for model, inputs in INPUTS.items():
        folder = root / model
        folder.mkdir(parents=True, exist_ok=True)
        for name, count in inputs.items():
            (folder / name).write_bytes(rng.uniform(-1.0, 1.0, count).astype("<f4").tobytes())
    for model, inputs in INT_INPUTS.items():
        folder = root / model
        folder.mkdir(parents=True, exist_ok=True)
        for name, count in inputs.items():
            (folder / name).write_bytes(rng.integers(-100, 100, count).astype("<i4").tobytes())


# ---------------------------------------------------------------------------
# servers
# ---------------------------------------------------------------------------


def free_ports(n: int) -> List[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def cpu_seconds_of(chosen) -> float:
    """User + system CPU so far of the live processes `chosen(pid, ppid, pgrp)` picks, from /proc."""
    total = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # exited meanwhile
        # After the command name: state, ppid, pgrp, ...; utime and stime are fields 14 and 15.
        if chosen(int(entry), int(fields[1]), int(fields[2])):
            total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as r:
            return r.status == 200
    except Exception:
        return False


def log_tail(path: Path, n: int = 40) -> str:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    return "\n".join("    " + line for line in lines[-n:])


class Server:
    """One server process in its own process group; stop() is idempotent."""

    def __init__(self, name: str, cmd: List[str], log: Path, env=None):
        self.name, self.cmd, self.log = name, cmd, log
        self.env = env
        self.proc: Optional[subprocess.Popen] = None
        self.http = self.grpc = ""

    def start(self) -> None:
        progress(f"starting {self.name}: {shlex.join(self.cmd)}")
        self._logf = open(self.log, "wb")
        self.proc = subprocess.Popen(
            self.cmd, stdout=self._logf, stderr=subprocess.STDOUT, env=self.env, start_new_session=True
        )

    def exited(self) -> Optional[int]:
        return self.proc.poll() if self.proc else None

    def fail(self, why: str) -> "ServerStartError":
        return ServerStartError(f"{self.name} did not start: {why}\n  command: {shlex.join(self.cmd)}\n"
                                f"  last lines of {self.log}:\n{log_tail(self.log)}")

    def wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            rc = self.exited()
            if rc is not None:
                raise self.fail(f"exited with status {rc}")
            if self.http and http_ok(f"http://{self.http}/v2/health/ready"):
                return
            time.sleep(0.2)
        raise self.fail(f"not ready after {timeout:.0f}s")

    def cpu_seconds(self) -> float:
        """User + system CPU of every live process in the server's process group (Triton's
        Python backend stubs included)."""
        if not self.proc:
            return 0.0
        return cpu_seconds_of(lambda _pid, _ppid, pgrp: pgrp == self.proc.pid)

    def inferences(self, model: str) -> Optional[int]:
        """The model's inference count from the statistics extension (None if unreadable)."""
        try:
            with urllib.request.urlopen(f"http://{self.http}/v2/models/{model}/stats", timeout=5) as r:
                stats = json.load(r)
            # A cache hit is a success but no inference: count requests too (batch 1 scenarios).
            return sum(max(int(v.get("inference_count", 0)),
                           int(v.get("inference_stats", {}).get("success", {}).get("count", 0)))
                       for v in stats.get("model_stats", []))
        except Exception:
            return None

    def stop(self) -> None:
        if not self.proc or self.proc.poll() is not None:
            return
        progress(f"stopping {self.name} (pid {self.proc.pid})")
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            progress(f"{self.name} ignored SIGTERM for 20s; killing its process group")
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait(timeout=10)
        self._logf.close()


class TesseraServer(Server):
    LISTEN = re.compile(r'listening protocol="?(\w+)"? addr=([\d.]+:\d+)')

    def __init__(self, binary: str, repo: Path, log: Path, runner: bool = False):
        cmd = [binary, "serve", "--model-repository", str(repo),
               "--http-address", "127.0.0.1", "--grpc-address", "127.0.0.1", "--metrics-address", "127.0.0.1",
               "--http-port", "0", "--grpc-port", "0", "--metrics-port", "0"]
        # --runner: the models run in a runner process, as a worker runs each tenant's.
        super().__init__("tessera-runner" if runner else "tessera", cmd + (["--runner"] if runner else []), log)

    def wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not (self.http and self.grpc):
            rc = self.exited()
            if rc is not None:
                raise self.fail(f"exited with status {rc}")
            addrs = dict(self.LISTEN.findall(self.log.read_text(errors="replace")))
            self.http, self.grpc = addrs.get("http", ""), addrs.get("grpc", "")
            time.sleep(0.1)
        if not (self.http and self.grpc):
            raise self.fail(f"no 'listening' lines for http and grpc after {timeout:.0f}s")
        super().wait_ready(max(1.0, deadline - time.monotonic()))


class TritonServer(Server):
    def __init__(self, launcher: str, repo: Path, log: Path):
        hp, gp, mp = free_ports(3)
        cmd = [launcher, "--model-repository", str(repo),
               "--http-address", "127.0.0.1", "--http-port", str(hp),
               "--grpc-address", "127.0.0.1", "--grpc-port", str(gp),
               "--metrics-address", "127.0.0.1", "--metrics-port", str(mp),
               "--exit-timeout-secs", "5", "--log-verbose", "0"]
        # The wheel's local response cache library sits beside its server binary.
        caches = sorted(Path(launcher).resolve().parent.parent.glob(
            "venv/lib/python3*/site-packages/pytriton/tritonserver/caches"))
        if caches:
            cmd += ["--cache-config", f"local,size={CACHE_BYTES}", "--cache-directory", str(caches[0])]
        super().__init__("triton", cmd, log)
        self.http, self.grpc = f"127.0.0.1:{hp}", f"127.0.0.1:{gp}"


# ---------------------------------------------------------------------------
# response checks (before measuring): both protocols, both models
# ---------------------------------------------------------------------------


def check_responses(server: Server, repo: Path) -> None:
    import numpy as np
    import onnxruntime as ort
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    mlp = ort.InferenceSession(str(repo / "mlp" / "1" / "model.onnx"), opts, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(7)
    a = rng.standard_normal((3, 16)).astype(np.float32)
    b = rng.standard_normal((3, 16)).astype(np.float32)
    x = rng.standard_normal((5, 256)).astype(np.float32)
    want_mlp = mlp.run(["OUTPUT0"], {"INPUT0": x})[0]

    for proto, mod, url in (("http", httpclient, server.http), ("grpc", grpcclient, server.grpc)):
        client = mod.InferenceServerClient(url)
        try:
            def infer(model, named, outputs):
                inputs = []
                for name, arr in named:
                    t = mod.InferInput(name, list(arr.shape), "FP32")
                    t.set_data_from_numpy(arr)
                    inputs.append(t)
                res = client.infer(model, inputs, outputs=[mod.InferRequestedOutput(o) for o in outputs])
                return [res.as_numpy(o) for o in outputs]

            got0, got1 = infer("add_sub", [("INPUT0", a), ("INPUT1", b)], ["OUTPUT0", "OUTPUT1"])
            if not (np.allclose(got0, a + b, atol=1e-6) and np.allclose(got1, a - b, atol=1e-6)):
                raise BenchError(f"{server.name} {proto}: add_sub answered wrong values")
            got0, got1 = infer("ensemble_add_sub", [("INPUT0", a), ("INPUT1", b)], ["OUTPUT0", "OUTPUT1"])
            if not (np.allclose(got0, 2 * a + b, atol=1e-5) and np.allclose(got1, 2 * a - b, atol=1e-5)):
                raise BenchError(f"{server.name} {proto}: ensemble_add_sub answered wrong values")
            for _ in range(2):
                got0, _ = infer("add_sub_cached", [("INPUT0", a), ("INPUT1", b)], ["OUTPUT0", "OUTPUT1"])
                if not np.allclose(got0, a + b, atol=1e-6):
                    raise BenchError(f"{server.name} {proto}: add_sub_cached answered wrong values")
            (got,) = infer("mlp", [("INPUT0", x)], ["OUTPUT0"])
            if got is None or got.shape != want_mlp.shape or not np.allclose(got, want_mlp, rtol=1e-4, atol=1e-4):
                raise BenchError(f"{server.name} {proto}: mlp answered {None if got is None else got.shape}, "
                                 f"not onnxruntime's {want_mlp.shape} values")
        except BenchError:
            raise
        except Exception as e:  # a client error is a failed check too
            raise BenchError(f"{server.name} {proto}: response check failed: {e}") from e
        finally:
            client.close()
    progress(f"{server.name}: add_sub and mlp answers match onnxruntime over HTTP and gRPC")


# ---------------------------------------------------------------------------
# perf_analyzer
# ---------------------------------------------------------------------------

SERVER_PARTS = {
    "overhead": re.compile(r"overhead (\d+(?:\.\d+)?) usec"),
    "queue": re.compile(r"queue (\d+(?:\.\d+)?) usec"),
    "compute_input": re.compile(r"compute input (\d+(?:\.\d+)?) usec"),
    "compute_infer": re.compile(r"compute infer (\d+(?:\.\d+)?) usec"),
    "compute_output": re.compile(r"compute output (\d+(?:\.\d+)?) usec"),
}


def parse_server_section(out: str) -> Dict[str, float]:
    """Numbers from perf_analyzer's printed 'Server:' section."""
    idx = out.rfind("Server:")
    if idx < 0:
        return {}
    sec = out[idx:]
    got: Dict[str, float] = {}
    m = re.search(r"Inference count: (\d+)", sec)
    if m:
        got["inference_count"] = int(m.group(1))
    m = re.search(r"Execution count: (\d+)", sec)
    if m:
        got["execution_count"] = int(m.group(1))
    m = re.search(r"Avg request latency: (\d+(?:\.\d+)?) usec \(([^)]*)\)", sec)
    if m:
        got["request_us"] = float(m.group(1))
        for key, rx in SERVER_PARTS.items():
            mm = rx.search(m.group(2))
            if mm:
                got[key] = float(mm.group(1))
    return got


UNSTABLE = "Failed to obtain stable measurement"


def pa_command(args, url: str, proto: str, sc: Scenario, csv_path: Path, stability: int, trials: int) -> List[str]:
    cmd = [args.perf_analyzer, "-m", sc.model, "-u", url, "-i", proto, "-b", str(sc.batch),
           "--concurrency-range", str(sc.concurrency), "-f", str(csv_path),
           "--input-data", str(csv_path.parent / "input-data" / sc.model),
           "--warmup-request-count", str(max(100, 20 * sc.concurrency)),
           "--stability-percentage", str(stability), "--max-trials", str(trials)]
    if sc.model in INT_INPUTS:
        cmd += ["--sequence-length", str(SEQUENCE_LENGTH)]
    if args.pa_mode == "time":
        cmd += ["--measurement-mode", "time_windows", "--measurement-interval", str(args.window_ms)]
    else:
        cmd += ["--measurement-mode", "count_windows", "--measurement-request-count", str(args.window_requests)]
    return cmd


def measure(args, server: Server, proto: str, sc: Scenario, tmp: Path, label: str) -> Row:
    """One perf_analyzer run; a run that never stabilises is retried once with the check relaxed."""
    url = server.http if proto == "http" else server.grpc
    csv_path = tmp / "pa.csv"
    note = ""
    n0, cpu0, ru0 = server.inferences(sc.model), server.cpu_seconds(), resource.getrusage(resource.RUSAGE_CHILDREN)
    for attempt, (stability, trials) in enumerate(((args.stability, args.max_trials), (1000, 4))):
        if csv_path.exists():
            csv_path.unlink()
        cmd = pa_command(args, url, proto, sc, csv_path, stability, trials)
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=args.pa_timeout)
        except subprocess.TimeoutExpired as e:
            raise BenchError(f"{label}: perf_analyzer ran past {args.pa_timeout}s\n  command: {shlex.join(cmd)}") from e
        out = p.stdout + p.stderr
        if p.returncode != 0 and UNSTABLE in out and attempt == 0 and "error" not in out.lower():
            progress(f"    not stable within {stability}% in {trials} windows; measuring again without the stability check")
            note = "(unstable)"
            continue
        break
    if p.returncode != 0 or not csv_path.exists():
        tail = "\n".join("    " + line for line in out.strip().splitlines()[-25:])
        raise BenchError(f"{label}: perf_analyzer failed (exit {p.returncode}); a request failed or the "
                         f"server answered wrongly\n  command: {shlex.join(cmd)}\n  output:\n{tail}")
    ru1, cpu1, n1 = resource.getrusage(resource.RUSAGE_CHILDREN), server.cpu_seconds(), server.inferences(sc.model)
    done = (n1 - n0) if n0 is not None and n1 is not None else 0
    client_cpu = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)
    rows = list(csv.DictReader(io.StringIO(csv_path.read_text())))
    if not rows:
        raise BenchError(f"{label}: perf_analyzer wrote no CSV rows\n  command: {shlex.join(cmd)}")
    r = rows[0]

    def num(key):
        v = r.get(key)
        return float(v) if v not in (None, "") else None

    srv = parse_server_section(out)
    ci = [num("Server Compute Input"), num("Server Compute Infer"), num("Server Compute Output")]
    return Row(
        scenario=sc.name, server=server.name, protocol=proto, model=sc.model, batch=sc.batch,
        concurrency=sc.concurrency, infer_per_sec=num("Inferences/Second") or 0.0,
        p50_us=num("p50 latency"), p99_us=num("p99 latency"),
        queue_us=srv.get("queue", num("Server Queue")),
        compute_us=sum(c for c in ci if c is not None) if any(c is not None for c in ci) else None,
        compute_infer_us=srv.get("compute_infer", num("Server Compute Infer")),
        overhead_us=srv.get("overhead"), server_request_us=srv.get("request_us"),
        inference_count=srv.get("inference_count"), execution_count=srv.get("execution_count"),
        server_cpu_us=(cpu1 - cpu0) * 1e6 / done if done > 0 else None,
        client_cpu_us=client_cpu * 1e6 / done if done > 0 else None,
        note=note, command=shlex.join(cmd),
    )


# ---------------------------------------------------------------------------
# raw ONNX Runtime
# ---------------------------------------------------------------------------


def raw_ort(args, repo: Path, model: str, batch: int, note: str = "") -> Row:
    cmd = [args.tessera, "bench", "ort", "--model", str(repo / model / "1" / "model.onnx"),
           "--batch", str(batch), "--threads", str(args.threads), "--seconds", str(args.raw_seconds)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=args.raw_seconds + 60)
    line = next((ln for ln in reversed(p.stdout.splitlines()) if ln.strip().startswith("{")), None)
    if p.returncode != 0 or line is None:
        raise BenchError(f"raw ORT {model} b{batch}: `tessera bench ort` failed (exit {p.returncode})\n"
                         f"  command: {shlex.join(cmd)}\n  output: {(p.stdout + p.stderr).strip()[-2000:]}")
    d = json.loads(line)
    return Row(scenario=f"{model} b{batch}", server="raw ORT", protocol="in-process", model=model, batch=batch,
               infer_per_sec=float(d["inferences_per_sec"]), p50_us=d.get("p50_us"), p99_us=d.get("p99_us"),
               note=note, command=shlex.join(cmd), extra={"threads": args.threads})


# ---------------------------------------------------------------------------
# the table
# ---------------------------------------------------------------------------

COLUMNS = ["Scenario", "Server", "Proto", "infer/s", "p50 µs", "p99 µs", "queue µs", "compute µs",
           "overhead µs", "batch", "srv CPU µs", "client CPU µs", "× Triton", "× raw ORT"]
RIGHT = set(COLUMNS) - {"Scenario", "Server", "Proto"}


def fmt_num(v, digits=0) -> str:
    if v is None:
        return "—"
    return f"{v:,.{digits}f}"


def raw_key(model: str, batch: float) -> tuple:
    # The ensemble and the cached model have no ONNX file of their own to run raw: add_sub's is
    # the nearest (the ensemble runs it after preprocess; a cache hit runs nothing).
    model = {"ensemble_add_sub": "add_sub", "add_sub_cached": "add_sub"}.get(model, model)
    return (model, max(1, min(MAX_BATCH.get(model, 1), int(round(batch)))))


def median(values) -> Optional[float]:
    got = [v for v in values if v is not None]
    return statistics.median(got) if got else None


def summarize(runs: List[Row]) -> Row:
    """One row per scenario x protocol x server: every number the median over its rounds."""
    first = runs[0]
    inf, ex = median(r.inference_count for r in runs), median(r.execution_count for r in runs)
    batches = [r.raw_batch for r in runs if r.raw_batch]
    return Row(
        scenario=first.scenario, server=first.server, protocol=first.protocol, model=first.model, batch=first.batch,
        concurrency=first.concurrency, infer_per_sec=median(r.infer_per_sec for r in runs) or 0.0,
        p50_us=median(r.p50_us for r in runs), p99_us=median(r.p99_us for r in runs),
        queue_us=median(r.queue_us for r in runs), compute_us=median(r.compute_us for r in runs),
        compute_infer_us=median(r.compute_infer_us for r in runs), overhead_us=median(r.overhead_us for r in runs),
        server_request_us=median(r.server_request_us for r in runs),
        inference_count=int(inf) if inf else None, execution_count=int(ex) if ex else None,
        server_cpu_us=median(r.server_cpu_us for r in runs), client_cpu_us=median(r.client_cpu_us for r in runs),
        rounds=len(runs), vs_triton=median(r.vs_triton for r in runs), vs_raw=median(r.vs_raw for r in runs),
        raw_batch=statistics.mode(batches) if batches else None,
        note=" ".join(sorted({r.note for r in runs if r.note})), command=first.command,
    )


def columns_for(rows: List[Row]) -> List[str]:
    """The table's columns; "× Triton" only when Triton rows exist."""
    if any(r.server == "triton" for r in rows):
        return COLUMNS
    return [c for c in COLUMNS if c != "× Triton"]


def table_rows(rows: List[Row]) -> List[List[str]]:
    out = []
    for r in rows:
        if r.server == "raw ORT":
            out.append([f"{r.model} b{r.batch}" + (f" ({r.note})" if r.note else ""), f"raw ORT ({r.extra.get('threads')} thr)",
                        "in-proc", fmt_num(r.infer_per_sec), fmt_num(r.p50_us), fmt_num(r.p99_us),
                        "—", "—", "—", str(r.batch), "—", "—", "", ""])
            continue
        vs_triton = f"{r.vs_triton:.2f}×" if r.vs_triton else ""
        vs_raw = f"{r.vs_raw:.2f}× (b{r.raw_batch})" if r.vs_raw and r.raw_batch else ""
        out.append([r.scenario + (" " + r.note if r.note else ""), r.server, r.protocol, fmt_num(r.infer_per_sec),
                    fmt_num(r.p50_us), fmt_num(r.p99_us), fmt_num(r.queue_us), fmt_num(r.compute_us),
                    fmt_num(r.overhead_us), fmt_num(r.formed_batch, 1) if r.formed_batch else str(r.batch),
                    fmt_num(r.server_cpu_us), fmt_num(r.client_cpu_us), vs_triton, vs_raw])
    return out


def select(cols: List[str], cells: List[List[str]]) -> List[List[str]]:
    idx = [COLUMNS.index(c) for c in cols]
    return [[c[i] for i in idx] for c in cells]


def render_text(cols: List[str], cells: List[List[str]]) -> str:
    cells = select(cols, cells)
    widths = [max(len(cols[i]), *(len(c[i]) for c in cells)) if cells else len(cols[i]) for i in range(len(cols))]

    def line(vals):
        return "  ".join(v.rjust(w) if cols[i] in RIGHT else v.ljust(w)
                         for i, (v, w) in enumerate(zip(vals, widths))).rstrip()

    sep = "  ".join("-" * w for w in widths)
    return "\n".join([line(cols), sep] + [line(c) for c in cells])


def render_markdown(cols: List[str], cells: List[List[str]]) -> str:
    cells = select(cols, cells)
    head = "| " + " | ".join(cols) + " |"
    align = "|" + "|".join("---:" if c in RIGHT else ":---" for c in cols) + "|"
    return "\n".join([head, align] + ["| " + " | ".join(c) + " |" for c in cells])


def git_describe() -> str:
    try:
        rev = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                             capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True).stdout.strip()
        return rev + ("+dirty" if dirty else "")
    except Exception:
        return "unknown"


# ---------------------------------------------------------------------------
# main
# ---------------------------------------------------------------------------


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--suite", choices=("quick", "full", "large", "sequence", "features"), default="full",
                    help="quick: raw mlp b1 + tessera mlp c1/c4 over HTTP and gRPC; large: 1 MiB tensors "
                         "through an identity; full: everything (default)")
    ap.add_argument("--no-triton", action="store_true", help="leave Triton out of the full suite")
    ap.add_argument("--runner", action="store_true",
                    help="also measure tessera serve --runner: the models in a runner process, behind the socket a worker uses")
    ap.add_argument("--tessera", required=True, help="tessera release binary")
    ap.add_argument("--perf-analyzer", required=True, help="perf_analyzer (wrapper) path")
    ap.add_argument("--triton", help="Triton launcher from scripts/setup-triton.sh (full suite)")
    ap.add_argument("--threads", type=int, default=1,
                    help="intra-op threads: raw ORT and every server model instance (default 1: the client needs the other core)")
    ap.add_argument("--instances", type=int, default=1, help="KIND_CPU instances per model (default 1)")
    ap.add_argument("--max-queue-delay-us", type=int, default=0, help="mlp dynamic_batching max_queue_delay_microseconds (default 0)")
    ap.add_argument("--no-dynamic-batching", action="store_true", help="leave dynamic_batching out of mlp's config")
    ap.add_argument("--protocols", default="http,grpc", help="comma-separated subset of http,grpc")
    ap.add_argument("--scenarios", help="comma-separated scenario names of the suite to run (e.g. 'add_sub c1,mlp b8 c8'); default: all")
    ap.add_argument("--raw-seconds", type=float, default=2.0, help="seconds per raw ONNX Runtime measurement (default 2)")
    ap.add_argument("--rounds", type=int, default=3,
                    help="measurements per scenario x protocol x server, servers alternating; the table shows medians (default 3)")
    ap.add_argument("--pa-mode", choices=("time", "count"), default="time",
                    help="perf_analyzer windows: time_windows of --window-ms (default) or count_windows of --window-requests")
    ap.add_argument("--window-ms", type=int, default=1000, help="--measurement-interval in time mode (default 1000)")
    ap.add_argument("--window-requests", type=int, default=2000, help="--measurement-request-count in count mode")
    ap.add_argument("--stability", type=int, default=20, help="--stability-percentage (default 20)")
    ap.add_argument("--max-trials", type=int, default=6,
                    help="--max-trials (default 6); a run that never stabilises is measured again without the check, marked (unstable)")
    ap.add_argument("--pa-timeout", type=int, default=120, help="seconds before one perf_analyzer run is abandoned")
    ap.add_argument("--workdir", help="keep the repository and logs here (default: a temporary folder)")
    ap.add_argument("--json", help="also write every row (with its command) to this JSON file")
    return ap.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    use_triton = args.suite in ("full", "large", "sequence", "features") and not args.no_triton
    if use_triton and not args.triton:
        print("compare.py: --triton LAUNCHER is needed for the full suite (or pass --no-triton)", file=sys.stderr)
        return 1
    if args.rounds < 1:
        print("compare.py: --rounds must be at least 1", file=sys.stderr)
        return 1
    protocols = [p for p in args.protocols.split(",") if p]
    if not protocols or any(p not in PROTOCOLS for p in protocols):
        print(f"compare.py: --protocols must be a subset of {','.join(PROTOCOLS)}", file=sys.stderr)
        return 1
    scenarios = [s for s in SCENARIOS if args.suite in s.suites]
    if args.scenarios:
        wanted = [w.strip() for w in args.scenarios.split(",") if w.strip()]
        unknown = [w for w in wanted if w not in {s.name for s in scenarios}]
        if unknown:
            print(f"compare.py: no scenario {', '.join(unknown)} in suite {args.suite}; it has: "
                  f"{', '.join(s.name for s in scenarios)}", file=sys.stderr)
            return 1
        scenarios = [s for s in scenarios if s.name in wanted]
    servers = ["tessera"] + (["tessera-runner"] if args.runner else []) + (["triton"] if use_triton else [])

    # SIGTERM (the wrapper's trap, or anyone) unwinds through the finally below.
    def on_term(signum, _frame):
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGHUP, on_term)

    tmp_ctx = None
    if args.workdir:
        tmp = Path(args.workdir)
        tmp.mkdir(parents=True, exist_ok=True)
    else:
        tmp_ctx = tempfile.TemporaryDirectory(prefix="tessera-bench-")
        tmp = Path(tmp_ctx.name)
    repo = tmp / "repo"
    rows: List[Row] = []
    runs: List[Row] = []  # every round's measurement; rows gets their medians
    failures: List[str] = []
    load_before = os.getloadavg()
    running: List[Server] = []
    total = len(RAW[args.suite]) + len(servers) * len(scenarios) * len(protocols) * args.rounds
    step = 0
    rc = 0
    try:
        progress(f"suite {args.suite}: {total} measurements; servers: {', '.join(servers)}; "
                 f"threads {args.threads}, instances {args.instances}; work dir {tmp}")
        if repo.exists():
            import shutil
            shutil.rmtree(repo)
        write_repository(repo, args)
        write_input_data(tmp / "input-data")

        for model, batch in RAW[args.suite]:
            step += 1
            progress(f"({step}/{total}) raw ONNX Runtime {model} batch {batch}, {args.threads} thread(s)")
            row = raw_ort(args, repo, model, batch)
            rows.append(row)
            progress(f"    {row.infer_per_sec:,.0f} infer/s, p50 {row.p50_us:,.0f} µs")

        started: List[Server] = []
        for name in servers:
            server: Server
            if name.startswith("tessera"):
                server = TesseraServer(args.tessera, repo, tmp / f"{name}.log", runner=name == "tessera-runner")
            else:
                server = TritonServer(args.triton, repo, tmp / "triton.log")
            running.append(server)
            try:
                server.start()
                server.wait_ready(120 if name == "triton" else 60)
            except ServerStartError as e:
                server.stop()
                msg = str(e)
                progress("ERROR: " + msg)
                tail = [ln.strip() for ln in log_tail(server.log, 200).splitlines() if ln.strip()]
                errs = [ln for ln in tail if re.match(r"^E\d{4}|error", ln, re.I)]
                failures.append(msg.splitlines()[0] + (f"; log: {(errs or tail)[-1][:300]}" if tail else ""))
                rc = max(rc, 2)
                continue
            progress(f"{name} ready: http {server.http}, grpc {server.grpc}")
            check_responses(server, repo)
            started.append(server)

        for sc in scenarios:
            for proto in protocols:
                for rnd in range(args.rounds):
                    order = started if rnd % 2 == 0 else list(reversed(started))
                    paired: Dict[str, Row] = {}
                    for server in order:
                        step += 1
                        label = f"{server.name} {proto} {sc.name}"
                        progress(f"({step}/{total}) {label} (batch {sc.batch}, concurrency {sc.concurrency}), "
                                 f"round {rnd + 1}/{args.rounds}")
                        row = measure(args, server, proto, sc, tmp, label)
                        if server.exited() is not None:
                            raise BenchError(f"{server.name} exited during {label}\n{log_tail(server.log)}")
                        # The engine alone at the batch size the server just ran, seconds later
                        # (not for `large`: an Identity's cost is the bytes the server moves, and
                        # `tessera bench ort` cannot size its free dimension).
                        raw_note = ""
                        if sc.model != "large":
                            model, batch = raw_key(sc.model, row.formed_batch or sc.batch)
                            raw = raw_ort(args, repo, model, batch, note="adjacent")
                            row.raw_batch = batch
                            row.vs_raw = row.infer_per_sec / raw.infer_per_sec if raw.infer_per_sec else None
                            row.extra["raw_adjacent"] = raw.__dict__
                            raw_note = f"; raw ORT b{batch} {raw.infer_per_sec:,.0f} infer/s"
                        paired[server.name] = row
                        runs.append(row)
                        fb = f", batch formed {row.formed_batch:.1f}" if row.formed_batch else ""
                        progress(f"    {row.infer_per_sec:,.0f} infer/s, p50 {fmt_num(row.p50_us)} µs, "
                                 f"p99 {fmt_num(row.p99_us)} µs, overhead {fmt_num(row.overhead_us)} µs{fb}{raw_note}")
                    t, tr = paired.get("tessera"), paired.get("triton")
                    if t and tr and tr.infer_per_sec:
                        t.vs_triton = t.infer_per_sec / tr.infer_per_sec
        groups: Dict[tuple, List[Row]] = {}
        for r in runs:
            groups.setdefault((r.scenario, r.protocol, r.server), []).append(r)
        rows.extend(summarize(g) for g in groups.values())
    except BenchError as e:
        progress("FAILED: " + str(e))
        rc = 1
    except KeyboardInterrupt:
        progress("interrupted")
        rc = 130
    finally:
        for server in running:
            server.stop()

    if rc == 1 or rc == 130:
        if tmp_ctx is None:
            progress(f"logs kept in {tmp}")
        return rc

    # Order: raw rows first (by model, batch), then scenario x protocol with tessera before triton.
    order = {s.name: i for i, s in enumerate(SCENARIOS)}
    raw_rows = sorted((r for r in rows if r.server == "raw ORT"), key=lambda r: (r.model != "mlp", r.model, r.batch))
    srv_rows = sorted((r for r in rows if r.server != "raw ORT"),
                      key=lambda r: (order[r.scenario], PROTOCOLS.index(r.protocol), servers.index(r.server)))
    rows = raw_rows + srv_rows
    cells = table_rows(rows)
    load_after = os.getloadavg()

    header = [
        f"Tessera benchmark, suite {args.suite}, {time.strftime('%Y-%m-%d %H:%M:%S %Z')}, commit {git_describe()}",
        f"machine: {os.cpu_count()} CPUs; load average before {load_before[0]:.2f}, after {load_after[0]:.2f} "
        f"(client and server share the machine)",
        f"settings: servers on their default flags (tessera's --busy-poll-us 200 included); "
        f"{args.threads} intra-op thread(s), {args.instances} KIND_CPU instance(s) per model; mlp "
        + ("without dynamic batching" if args.no_dynamic_batching else
           f"dynamic_batching (max_queue_delay_microseconds {args.max_queue_delay_us})")
        + "; perf_analyzer "
        + (f"time_windows {args.window_ms} ms" if args.pa_mode == "time" else f"count_windows {args.window_requests} requests")
        + f", stable within {args.stability}% over 3 windows, HTTP binary tensors / gRPC, sync, "
        "FP32 inputs uniform in [-1, 1) (perf_analyzer --input-data; the raw runs use the same distribution)",
        f"every server number is the median of {args.rounds} round(s); servers run back to back in each round "
        "(alternating order), each run followed by raw ONNX Runtime at the batch size it formed",
        "columns: queue/compute/overhead = server-side average per request from the statistics extension "
        "(perf_analyzer's Server section); batch = inferences per execution; srv/client CPU = CPU time per "
        "inference of the server's processes and of perf_analyzer; × Triton = median of tessera / Triton in "
        "the same round; × raw ORT = median of throughput / the raw in-process ONNX Runtime run right after "
        "it at the batch size the server executed (bN)",
    ]
    for f in failures:
        header.append(f"NOTE: {f}")
    cols = columns_for(rows)
    text = "\n".join(header) + "\n\n" + render_text(cols, cells)
    md = "\n".join(f"> {h}" for h in header) + "\n\n" + render_markdown(cols, cells)
    print(text)
    print()
    print(md)
    sys.stdout.flush()
    if args.json:
        every = rows + [r for r in runs if r not in rows]
        Path(args.json).write_text(json.dumps([r.__dict__ | {"formed_batch": r.formed_batch} for r in every], indent=2))
    if tmp_ctx is not None:
        tmp_ctx.cleanup()
    return rc


if __name__ == "__main__":
    sys.exit(main())
