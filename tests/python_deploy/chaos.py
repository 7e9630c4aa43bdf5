"""Shared pieces of the chaos tests (test_chaos.py) and the soak (soak.py): closed-loop
tritonclient load that records every request, stored usage, process memory, and a throwaway
PostgreSQL cluster that a test may stop and start."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from conftest import free_port

PGBIN = Path("/usr/lib/postgresql/15/bin")


@dataclass
class Sent:
    """One request as its client saw it."""

    start: float
    end: float
    worker: str  # the worker's HTTP endpoint it went to (names the worker for both protocols)
    model: str
    bad: bool  # sent with a wrong shape on purpose: a billed failure (400 / INVALID_ARGUMENT)
    rows: int
    ok: bool
    error: str = ""

    @property
    def expected(self) -> bool:
        """Answered as intended: a success, or the deliberate 400 of a bad request."""
        if not self.bad:
            return self.ok
        return not self.ok and ("400" in self.error or "INVALID_ARGUMENT" in self.error)


class Client:
    """One closed-loop client thread: one protocol and model, a list of replicas in preference
    order as (http endpoint, grpc endpoint). A request that fails other than as intended moves the
    client to the next replica (retrying elsewhere is the client's job; the failure is recorded).
    Every `bad_every`-th request has a wrong shape (a billed failure)."""

    def __init__(self, protocol: str, model: str, key: str, replicas: List[Tuple[str, str]], bad_every: int = 0,
                 name: str = ""):
        self.protocol, self.model, self.key, self.replicas = protocol, model, key, replicas
        self.bad_every, self.name = bad_every, name or f"{protocol}/{model}"
        self.sent: List[Sent] = []
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.at = 0
        self.thread = threading.Thread(target=self.run, daemon=True)

    def start(self) -> "Client":
        self.thread.start()
        return self

    def finish(self):
        self.stop.set()
        self.thread.join(60)
        assert not self.thread.is_alive(), f"client {self.name} did not stop"

    def _connect(self):
        http, grpc = self.replicas[self.at]
        if self.protocol == "http":
            return httpclient.InferenceServerClient(http.split("://", 1)[1], network_timeout=30)
        return grpcclient.InferenceServerClient(grpc.split("://", 1)[-1])

    def _call(self, client, x: np.ndarray):
        if self.protocol == "http":
            inp = httpclient.InferInput("INPUT0", list(x.shape), "FP32")
            inp.set_data_from_numpy(x, binary_data=True)
            return client.infer(self.model, [inp], headers={"Authorization": f"Bearer {self.key}"})
        inp = grpcclient.InferInput("INPUT0", list(x.shape), "FP32")
        inp.set_data_from_numpy(x)
        return client.infer(self.model, [inp], headers={"authorization": f"Bearer {self.key}"}, client_timeout=30)

    def run(self):
        client = self._connect()
        i = 0
        try:
            while not self.stop.is_set():
                i += 1
                bad = bool(self.bad_every) and i % self.bad_every == 0
                rows = 1 + i % 3
                x = np.ones((rows, 3 if bad else 4), dtype=np.float32)
                worker = self.replicas[self.at][0]
                t0 = time.monotonic()
                try:
                    self._call(client, x)
                    ok, err = True, ""
                except Exception as e:  # noqa: BLE001 - every failure is recorded and judged
                    ok, err = False, f"{type(e).__name__}: {e}"
                s = Sent(t0, time.monotonic(), worker, self.model, bad, rows, ok, err)
                with self.lock:
                    self.sent.append(s)
                if not s.expected and self.at + 1 < len(self.replicas):
                    # The client's retry: the next replica, on a fresh connection.
                    self.at += 1
                    try:
                        client.close()
                    except Exception:  # noqa: BLE001 - the old connection may be dead
                        pass
                    client = self._connect()
        finally:
            try:
                client.close()
            except Exception:  # noqa: BLE001
                pass

    def snapshot(self) -> List[Sent]:
        with self.lock:
            return list(self.sent)


def all_sent(clients: List[Client]) -> List[Sent]:
    return [s for c in clients for s in c.snapshot()]


class Seen:
    """What clients saw, per model: successes (and their rows), deliberate failures, others."""

    def __init__(self, sent: List[Sent]):
        self.ok, self.rows, self.bad, self.unexpected = Counter(), Counter(), Counter(), Counter()
        for s in sent:
            if s.ok and not s.bad:
                self.ok[s.model] += 1
                self.rows[s.model] += s.rows
            elif s.expected:
                self.bad[s.model] += 1
            else:
                self.unexpected[s.model] += 1

    def total(self) -> int:
        return sum(self.ok.values()) + sum(self.bad.values()) + sum(self.unexpected.values())


def stored_usage(cluster, tenant: str, key: str) -> Dict[str, dict]:
    rows = cluster.api("GET", f"/v1/tenants/{tenant}/usage?group_by=model", key)["usage"]
    return {r["model"]: r for r in rows}


def metric(worker, name: str) -> Optional[float]:
    """A worker's unlabelled metric, or None."""
    text = urllib.request.urlopen(f"http://{worker.addrs['metrics']}/metrics", timeout=10).read().decode()
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return None


def descendants(pid: int) -> List[int]:
    """`pid` and every process below it (the worker and its runners)."""
    children: Dict[int, List[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out


def rss_bytes(pid: int) -> int:
    """Resident memory of one process (VmRSS), 0 if it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


class ThrowawayPostgres:
    """A PostgreSQL 15 cluster of its own (as scripts/test.sh's ensure_postgres makes one), so a
    test can stop it without touching anyone else's database. Runs as the `postgres` user when
    this process is root."""

    def __init__(self):
        if not (PGBIN / "initdb").exists():
            raise RuntimeError(f"PostgreSQL 15 not found in {PGBIN}")
        self.as_user: List[str] = []
        self.dir = Path(tempfile.mkdtemp(prefix="tessera-chaos-pg."))
        if os.geteuid() == 0:
            self.as_user = ["runuser", "-u", "postgres", "--"]
            shutil.chown(self.dir, "postgres", "postgres")
        self.port = free_port()
        self.url = f"postgres://postgres@127.0.0.1:{self.port}/postgres"
        self._run(PGBIN / "initdb", "-D", self.dir / "data", "--auth=trust", "-U", "postgres", "-E", "UTF8",
                  "--no-sync")
        self.start()

    def _run(self, *args, check: bool = True):
        return subprocess.run([*self.as_user, *map(str, args)], check=check, capture_output=True, text=True,
                              timeout=120)

    def start(self):
        opts = f"-c fsync=off -c listen_addresses=127.0.0.1 -p {self.port} -k {self.dir}"
        self._run(PGBIN / "pg_ctl", "-D", self.dir / "data", "-l", self.dir / "server.log", "-w", "-t", "30",
                  "-o", opts, "start")

    def stop(self, mode: str = "fast"):
        self._run(PGBIN / "pg_ctl", "-D", self.dir / "data", "-m", mode, "-w", "-t", "30", "stop")

    def destroy(self):
        self._run(PGBIN / "pg_ctl", "-D", self.dir / "data", "-m", "immediate", "stop", check=False)
        shutil.rmtree(self.dir, ignore_errors=True)
