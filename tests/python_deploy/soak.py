"""Soak: steady tritonclient load (HTTP and gRPC) against one worker while the resident memory of
the worker and its runner processes is sampled; fails when memory keeps growing after warm-up.

    python tests/python_deploy/soak.py --seconds 1800     (scripts/soak.sh [MINUTES] runs this)

The bound: after warm-up (the first fifth of the run, at least 20 s), the total resident memory
(worker + runners, VmRSS) at the end, the median of the last three samples, may exceed the
baseline, the median of the first three samples after warm-up, by at most
max(10 % of the baseline, 32 MiB). Every request must succeed. Needs TESSERA_BIN, a Postgres
admin URL in DATABASE_URL (default postgres://postgres@127.0.0.1:5432/postgres) and
ORT_DYLIB_PATH, as the deployment tests do.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Dict, List

sys.path.insert(0, str(Path(__file__).resolve().parent))

from chaos import Client, all_sent, descendants, rss_bytes  # noqa: E402
from conftest import Cluster, marker_model, tessera_bin, wait_until  # noqa: E402

MIB = 1024 * 1024
GROWTH_FRACTION = 0.10
GROWTH_FLOOR = 32 * MIB


def soak(seconds: float, workdir: Path, interval_s: float = 5.0, say: Callable[[str], None] = print) -> Dict:
    """Runs the soak; returns its numbers (and `ok`). Prints a table through `say`."""
    cluster = Cluster(workdir, 1, ["--usage-ship-interval-ms", "1000"])
    try:
        keys = cluster.create_tenant("soak")
        admin = keys["tenant-admin"]
        cluster.push_version("soak", admin, "adder", marker_model(1.0))
        cluster.api("POST", "/v1/tenants/soak/deployments", admin, {"name": "adder", "model": "adder"}, expect=201)
        d = cluster.wait_ready("soak", admin, "adder")
        replica = [(d["replica_status"][0]["http_endpoint"], d["replica_status"][0]["grpc_endpoint"])]
        worker_pid = cluster.workers[0].proc.pid
        # Two closed-loop clients per protocol; one in ten requests has a wrong shape (a 400).
        clients = [Client(p, "adder", keys["inference"], replica, bad_every=10).start()
                   for p in ("http", "grpc", "http", "grpc")]
        wait_until(lambda: len(all_sent(clients)) > 100, 30, "load")
        warmup = max(20.0, seconds / 5)
        samples: List[Dict] = []
        t0 = time.monotonic()
        say(f"{'t(s)':>6} {'requests':>9} {'req/s':>7} {'worker MiB':>11} {'runners MiB':>12} {'total MiB':>10} "
            f"{'procs':>5}")
        last_n, last_t = len(all_sent(clients)), t0
        while True:
            now = time.monotonic()
            pids = descendants(worker_pid)
            worker = rss_bytes(worker_pid)
            runners = sum(rss_bytes(p) for p in pids if p != worker_pid)
            n = len(all_sent(clients))
            rate = (n - last_n) / (now - last_t) if now - last_t >= 1.0 else 0.0
            last_n, last_t = n, now
            samples.append({"t": now - t0, "requests": n, "worker": worker, "runners": runners,
                            "total": worker + runners})
            mark = "" if now - t0 >= warmup else "  (warm-up)"
            say(f"{now - t0:6.0f} {n:9d} {rate:7.0f} {worker / MIB:11.1f} {runners / MIB:12.1f} "
                f"{(worker + runners) / MIB:10.1f} {len(pids):5d}{mark}")
            if now - t0 >= seconds:
                break
            time.sleep(max(0.0, min(interval_s, seconds - (time.monotonic() - t0))))
        for c in clients:
            c.finish()
        sent = all_sent(clients)
        failed = [s for s in sent if not s.expected]
        measured = [s for s in samples if s["t"] >= warmup]
        if len(measured) < 4:
            raise SystemExit(f"the run is too short to judge: {len(measured)} samples after warm-up")
        base = statistics.median(s["total"] for s in measured[:3])
        end = statistics.median(s["total"] for s in measured[-3:])
        bound = max(GROWTH_FRACTION * base, GROWTH_FLOOR)
        growth = end - base
        result = {
            "seconds": samples[-1]["t"], "requests": len(sent), "failed": len(failed), "base_mib": base / MIB,
            "end_mib": end / MIB, "growth_mib": growth / MIB, "bound_mib": bound / MIB,
            "peak_mib": max(s["total"] for s in samples) / MIB,
            "ok": growth <= bound and not failed,
        }
        say(f"soak: {len(sent)} requests in {samples[-1]['t']:.0f} s, {len(failed)} failed; resident memory after "
            f"warm-up {base / MIB:.1f} MiB -> {end / MIB:.1f} MiB (growth {growth / MIB:+.1f} MiB, bound "
            f"{bound / MIB:.1f} MiB = max(10 %, 32 MiB)); peak {result['peak_mib']:.1f} MiB: "
            f"{'PASS' if result['ok'] else 'FAIL'}")
        if failed:
            say(f"first failures: {[s.error for s in failed[:3]]}")
        return result
    finally:
        cluster.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=1800.0)
    parser.add_argument("--interval", type=float, default=5.0, help="seconds between memory samples")
    args = parser.parse_args()
    if not tessera_bin():
        print("TESSERA_BIN is not set to the built tessera binary", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="tessera-soak.") as tmp:
        result = soak(args.seconds, Path(tmp), args.interval, say=lambda m: print(m, flush=True))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
