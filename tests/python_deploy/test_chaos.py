"""Chaos tests, bounded and on loopback: a worker SIGKILLed under load, Postgres stopped for a
minute, the control plane SIGKILLed mid-rollout, the usage spool's disk full, and a short soak.
Each prints what it measured ([chaos] lines; run pytest with -s to see them)."""

from __future__ import annotations

import os
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections import Counter

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from chaos import Client, Seen, ThrowawayPostgres, all_sent, metric, stored_usage
from conftest import marker_model, wait_until

SHIP = ["--usage-ship-interval-ms", "300"]
PG_DOWN_S = float(os.environ.get("TESSERA_CHAOS_PG_DOWN_S", "60"))
SOAK_S = float(os.environ.get("TESSERA_CHAOS_SOAK_S", "60"))


def say(msg: str):
    print(f"\n[chaos] {msg}", flush=True)


def replicas_by_worker(d: dict):
    """(http, grpc) endpoints of a deployment's ready replicas, one per worker, by worker id."""
    return {r["worker_id"]: (r["http_endpoint"], r["grpc_endpoint"]) for r in d["replica_status"]
            if r["state"] == "ready"}


def spread(d: dict) -> bool:
    return len({r["worker_id"] for r in d["replica_status"]}) == d["replicas"]


def backlog_empty(cluster) -> bool:
    return all(metric(w, "tessera_usage_spool_backlog_bytes") == 0
               for w in cluster.workers if w and w.proc.poll() is None)


# --------------------------------------------------------------------------
# 1. A worker SIGKILLed under load
# --------------------------------------------------------------------------


def test_a_worker_killed_under_load_fails_only_its_in_flight_requests_and_bills_each_once(make_cluster):
    cluster = make_cluster(2, worker_args=SHIP)
    keys = cluster.create_tenant("acme")
    admin = keys["tenant-admin"]
    models = ("alpha", "beta")
    for i, model in enumerate(models):
        cluster.push_version("acme", admin, model, marker_model(float(i + 1)))
        cluster.api("POST", "/v1/tenants/acme/deployments", admin, {"name": model, "model": model, "replicas": 2},
                    expect=201)
    placed = {m: replicas_by_worker(cluster.wait_ready("acme", admin, m, pred=spread)) for m in models}
    worker_ids = sorted(placed["alpha"])
    assert sorted(placed["beta"]) == worker_ids and len(worker_ids) == 2, placed
    # Each (model, protocol) has one client preferring each worker; the other is its fallback.
    clients = []
    for model in models:
        for protocol in ("http", "grpc"):
            for first in worker_ids:
                order = [placed[model][first]] + [placed[model][w] for w in worker_ids if w != first]
                clients.append(Client(protocol, model, keys["inference"], order, bad_every=7,
                                      name=f"{protocol}/{model}/{first[:8]}"))
    for c in clients:
        c.start()
    victim_http = placed["alpha"][worker_ids[0]][0]
    victim = cluster.worker_by_http(victim_http)
    wait_until(lambda: sum(s.worker == victim_http for s in all_sent(clients)) > 400, 30, "load on the victim")

    t_kill = time.monotonic()
    cluster.workers[victim].kill()
    t_dead = time.monotonic()
    # The survivor carries everything for a while; then the victim comes back on its data dir.
    n = len(all_sent(clients))
    wait_until(lambda: len(all_sent(clients)) > n + 600, 60, "load on the survivor after the kill")
    cluster.start_worker(victim)
    n = len(all_sent(clients))
    wait_until(lambda: len(all_sent(clients)) > n + 300, 60, "load after the restart")
    for c in clients:
        c.finish()

    sent = all_sent(clients)
    # In flight on the victim at the kill: started there before it was dead, not finished before
    # the signal went out.
    in_flight = [s for s in sent if s.worker == victim_http and s.start < t_dead and s.end > t_kill]
    failed = [s for s in sent if not s.expected]
    seen = Seen(sent)
    say(f"worker kill: {len(sent)} requests ({len(clients)} clients, HTTP and gRPC), {len(failed)} failed "
        f"unexpectedly, {len(in_flight)} in flight on the killed worker at the kill; "
        f"errors: {sorted(Counter(s.error[:60] for s in failed).items())[:4]}")
    # Only the killed worker's requests fail, one per client at most (it then moves on), and no
    # more than were in flight there at the kill.
    assert all(s.worker == victim_http and s.end >= t_kill for s in failed), failed[:3]
    assert all(sum(not s.expected for s in c.snapshot()) <= 1 for c in clients), failed
    assert len(failed) <= len(in_flight), (failed, in_flight)

    # Stored usage: every request a client saw answered is billed once; a request lost at the
    # kill may have been billed (the worker spools before it answers) or not, never twice.
    lost = Counter(s.model for s in failed)

    def caught_up():
        # Backlogs first: once every spool is acknowledged (the clients have stopped), the usage
        # read after it holds everything. Read the other way round, a range shipped between the
        # two reads would arrive "later".
        if not backlog_empty(cluster):
            return None
        usage = stored_usage(cluster, "acme", admin)
        return usage if all(
            m in usage and usage[m]["requests"] >= seen.ok[m] and usage[m]["failures"] >= seen.bad[m]
            and usage[m]["inferences"] >= seen.rows[m] for m in models
        ) else None

    # Request counts alone can be met early: a lost request billed at the kill stands in for an
    # answered one whose record is still on its way, so rows are waited for too.

    usage = wait_until(caught_up, 60, "stored usage to cover what the clients saw")
    extra_total = 0
    for m in models:
        u = usage[m]
        extra = (u["requests"] - seen.ok[m]) + (u["failures"] - seen.bad[m])
        extra_total += extra
        say(f"usage {m}: stored requests/failures/inferences {u['requests']}/{u['failures']}/{u['inferences']}; "
            f"clients saw {seen.ok[m]}/{seen.bad[m]}/{seen.rows[m]} and lost {lost[m]} at the kill")
        # The bound: 0 <= stored - seen <= lost at the kill (per model), inferences likewise
        # (at most 3 rows per request).
        assert 0 <= extra <= lost[m], (m, u, seen.ok[m], seen.bad[m], lost[m])
        assert seen.rows[m] <= u["inferences"] <= seen.rows[m] + 3 * (u["requests"] - seen.ok[m]), (m, u)
    say(f"worker kill: billed {extra_total} of the {len(failed)} lost requests (the rest never reached a "
        f"record); none twice, none seen lost")
    # Nothing arrives later (no replay billed twice once the backlog is empty).
    time.sleep(1.0)
    counts = lambda us: {m: (us[m]["requests"], us[m]["failures"], us[m]["inferences"]) for m in models}  # noqa: E731
    assert counts(stored_usage(cluster, "acme", admin)) == counts(usage)


# --------------------------------------------------------------------------
# 2. Postgres stopped for a while
# --------------------------------------------------------------------------


@pytest.fixture
def throwaway_pg():
    try:
        pg = ThrowawayPostgres()
    except (RuntimeError, subprocess.CalledProcessError, FileNotFoundError) as e:
        pytest.skip(f"cannot start a throwaway PostgreSQL cluster: {e}")
    yield pg
    pg.destroy()


def rest_probe(cluster, method: str, path: str, key: str, body: bytes = None):
    """(status, Retry-After, seconds) of one REST call, never raising on a status."""
    hdrs = {"Authorization": f"Bearer {key}"}
    if body is not None:
        hdrs["Content-Type"] = "application/json"
    req = urllib.request.Request(cluster.url + path, data=body, method=method, headers=hdrs)
    t0 = time.monotonic()
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            resp.read()
            return resp.status, resp.headers.get("Retry-After"), time.monotonic() - t0
    except urllib.error.HTTPError as e:
        e.read()
        return e.code, e.headers.get("Retry-After"), time.monotonic() - t0


def test_postgres_down_for_a_minute_inference_goes_on_and_the_rest_api_says_503(throwaway_pg, make_cluster):
    cluster = make_cluster(1, worker_args=SHIP, db_admin=throwaway_pg.url)
    keys = cluster.create_tenant("acme")
    admin = keys["tenant-admin"]
    cluster.push_version("acme", admin, "adder", marker_model(1.0))
    cluster.api("POST", "/v1/tenants/acme/deployments", admin, {"name": "adder", "model": "adder"}, expect=201)
    d = cluster.wait_ready("acme", admin, "adder")
    replica = [(d["replica_status"][0]["http_endpoint"], d["replica_status"][0]["grpc_endpoint"])]
    clients = [Client(p, "adder", keys["inference"], replica).start() for p in ("http", "grpc")]
    # Workers answer from their credential cache while the control plane cannot look a key up:
    # the key must have been seen once before the outage.
    wait_until(lambda: sum(s.ok for s in all_sent(clients)) > 50, 30, "inference before the outage")
    write = b'{"version": 1}'
    write_path = "/v1/tenants/acme/models/adder/aliases/probe"
    assert rest_probe(cluster, "PUT", write_path, admin, write)[0] == 200

    t_stop = time.monotonic()
    throwaway_pg.stop("fast")
    t_down = time.monotonic()
    probes = []
    while time.monotonic() - t_down < PG_DOWN_S:
        probes.append(("GET",) + rest_probe(cluster, "GET", "/v1/tenants/acme/deployments/adder", admin))
        probes.append(("PUT",) + rest_probe(cluster, "PUT", write_path, admin, write))
        time.sleep(0.5)
    t_up0 = time.monotonic()
    throwaway_pg.start()
    t_up = time.monotonic()
    first_write = wait_until(lambda: rest_probe(cluster, "PUT", write_path, admin, write)[0] == 200 and time.monotonic(),
                             60, "a REST write to succeed after Postgres restarted", interval_s=0.2)
    recovered_s = first_write - t_up
    # Inference went on through the outage and after it.
    n = len(all_sent(clients))
    wait_until(lambda: len(all_sent(clients)) > n + 50, 30, "inference after the outage")
    for c in clients:
        c.finish()
    sent = all_sent(clients)
    during = [s for s in sent if t_stop <= s.start < t_up]
    failed = [s for s in sent if not s.ok]
    statuses = Counter((p[0], p[1]) for p in probes)
    slowest = max(p[3] for p in probes)
    say(f"postgres down {t_up0 - t_down:.0f} s (stop took {t_down - t_stop:.1f} s): {len(sent)} inferences "
        f"({len(during)} during the outage), {len(failed)} failed; REST answers {dict(statuses)}, slowest "
        f"{slowest:.2f} s; a write succeeded {recovered_s:.2f} s after Postgres was back")
    assert not failed, failed[:3]
    assert during, "no inference ran during the outage"
    assert all(p[1] == 503 for p in probes), statuses
    assert all(p[2] is not None and int(p[2]) >= 1 for p in probes), "503 without Retry-After"
    assert slowest < 10.0, f"a REST call took {slowest:.1f} s while Postgres was down"
    assert recovered_s < 15.0, recovered_s
    # The deployment is still there and ready, and the worker still serves it.
    assert cluster.wait_ready("acme", admin, "adder", timeout_s=30)["state"] == "ready"


# --------------------------------------------------------------------------
# 3. The control plane SIGKILLed mid-rollout
# --------------------------------------------------------------------------


def padded_marker_model(marker: float, pad_mib: int) -> bytes:
    """The marker model plus an unused initializer of `pad_mib` MiB: slower to fetch and load."""
    model = onnx.load_from_string(marker_model(marker))
    pad = np.zeros(pad_mib * 1024 * 1024 // 4, dtype=np.float32)
    model.graph.initializer.append(helper.make_tensor("pad", TensorProto.FLOAT, pad.shape, pad.tobytes(), raw=True))
    return model.SerializeToString()


def version_ready(endpoint: str, key: str, model: str, version: int) -> bool:
    req = urllib.request.Request(f"{endpoint}/v2/models/{model}/versions/{version}/ready",
                                 headers={"Authorization": f"Bearer {key}"})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status == 200
    except urllib.error.HTTPError:
        return False


def test_the_control_plane_killed_mid_rollout_comes_back_and_finishes_it(make_cluster):
    cluster = make_cluster(2)
    keys = cluster.create_tenant("acme")
    admin = keys["tenant-admin"]
    cluster.push_version("acme", admin, "marker", padded_marker_model(1.0, 24))
    cluster.push_version("acme", admin, "marker", padded_marker_model(2.0, 24))
    cluster.api("POST", "/v1/tenants/acme/deployments", admin,
                {"name": "marker", "model": "marker", "version": 1, "replicas": 2}, expect=201)
    d = cluster.wait_ready("acme", admin, "marker", pred=spread)
    placed = replicas_by_worker(d)
    ids = sorted(placed)
    clients = [Client(p, "marker", keys["inference"], [placed[w]] + [placed[o] for o in ids if o != w]).start()
               for p in ("http", "grpc") for w in ids]

    samples = []
    sampling = threading.Event()

    def sample():
        while not sampling.is_set():
            try:
                samples.append((time.monotonic(), cluster.deployment("acme", admin, "marker")["replica_status"]))
            except Exception:  # noqa: BLE001 - the control plane is down for a while
                pass
            time.sleep(0.05)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    cluster.api("PATCH", "/v1/tenants/acme/deployments/marker", admin, {"version": 2})

    def loading():
        rs = cluster.deployment("acme", admin, "marker")["replica_status"]
        new = [r for r in rs if r["version"] == 2]
        return new if new and any(r["state"] != "ready" for r in new) else None

    new_at_kill = wait_until(loading, 30, "new replicas placed and loading", interval_s=0.02)
    t_kill = time.monotonic()
    cluster.cp.kill()
    states_at_kill = Counter(r["state"] for r in new_at_kill)
    time.sleep(1.0)  # down for a moment: workers keep loading and serving on their own
    cluster.start_control_plane()
    t_back = time.monotonic()
    done = cluster.wait_ready("acme", admin, "marker", timeout_s=60, pred=lambda d: (
        d["serving_version"] == 2 and len(d["replica_status"]) == 2
        and all(r["version"] == 2 for r in d["replica_status"])))
    t_done = time.monotonic()
    # Old versions unload from the workers; each worker ends with version 2 only.
    endpoints = {r["worker_id"]: r["http_endpoint"] for r in done["replica_status"]}
    for ep in endpoints.values():
        wait_until(lambda: version_ready(ep, keys["inference"], "marker", 2)
                   and not version_ready(ep, keys["inference"], "marker", 1), 30, f"only version 2 on {ep}")
    n = len(all_sent(clients))
    wait_until(lambda: len(all_sent(clients)) > n + 50, 30, "traffic after the rollout")
    sampling.set()
    sampler.join(10)
    for c in clients:
        c.finish()

    sent = all_sent(clients)
    failed = [s for s in sent if not s.ok]
    # Never more replicas than a rollout allows: at most `replicas` per version, at most one
    # replica of a version per worker (spread), and at most old + new in all.
    most = max(len(rs) for _, rs in samples)
    per_version = max(max(Counter(r["version"] for r in rs).values()) for _, rs in samples)
    per_worker_version = max(max(Counter((r["worker_id"], r["version"]) for r in rs if r["worker_id"]).values(),
                                 default=0) for _, rs in samples)
    say(f"control plane killed mid-rollout (new replicas {dict(states_at_kill)} at the kill), back after "
        f"{t_back - t_kill:.1f} s, rollout done {t_done - t_back:.1f} s later; {len(samples)} status samples: "
        f"at most {most} replicas, {per_version} per version, {per_worker_version} per worker and version; "
        f"{len(sent)} requests, {len(failed)} failed")
    assert most <= 4 and per_version <= 2 and per_worker_version <= 1, (most, per_version, per_worker_version)
    assert len(endpoints) == 2, "the two new replicas are on two workers"
    assert not failed, failed[:3]


# --------------------------------------------------------------------------
# 4. The usage spool's disk full
# --------------------------------------------------------------------------


def test_a_full_usage_disk_keeps_serving_and_loses_no_record_once_space_returns(make_cluster):
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs for the usage spool needs root")
    cluster = make_cluster(0, worker_args=SHIP)
    spool = cluster.workdir / "worker0" / "usage"
    spool.mkdir(parents=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(spool)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"mount -t tmpfs is not permitted here: {mounted.stderr.strip()}")
    filler = spool / "filler.bin"
    try:
        cluster.start_worker()
        keys = cluster.create_tenant("acme")
        admin = keys["tenant-admin"]
        cluster.push_version("acme", admin, "adder", marker_model(1.0))
        cluster.api("POST", "/v1/tenants/acme/deployments", admin, {"name": "adder", "model": "adder"}, expect=201)
        d = cluster.wait_ready("acme", admin, "adder")
        replica = [(d["replica_status"][0]["http_endpoint"], d["replica_status"][0]["grpc_endpoint"])]
        worker = cluster.workers[0]

        def send(n: int):
            c = Client("http", "adder", keys["inference"], replica, bad_every=5).start()
            wait_until(lambda: len(c.snapshot()) >= n, 60, f"{n} requests")
            c.finish()
            return c.snapshot()

        sent = send(50)
        # Fill the disk: write until ENOSPC.
        fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            while True:
                os.write(fd, b"\0" * 4096)
        except OSError:
            pass
        finally:
            os.close(fd)
        free = os.statvfs(spool).f_bavail
        full = send(600)  # more than the spool file's last page holds
        sent += full
        errors_full = metric(worker, "tessera_usage_spool_write_errors_total")
        pending_full = metric(worker, "tessera_usage_spool_pending_records")
        answered = sum(s.expected for s in full)
        say(f"usage disk full ({free} free blocks): {len(full)} requests, {answered} answered as intended, "
            f"{len(full) - answered} not; spool write errors {errors_full}, records held in memory {pending_full}")
        # Held, not lost: the full disk delays usage (pending records) and drops none.
        assert errors_full == 0 and pending_full and pending_full > 0, (errors_full, pending_full)
        t_free = time.monotonic()
        filler.unlink()
        wait_until(lambda: metric(worker, "tessera_usage_spool_pending_records") == 0, 10,
                   "held records written once space returned")
        say(f"usage disk freed: held records written within {time.monotonic() - t_free:.2f} s")
        sent += send(50)
        seen = Seen(sent)

        def matches():
            u = stored_usage(cluster, "acme", admin).get("adder")
            return u if u and (u["requests"], u["failures"], u["inferences"]) == (
                seen.ok["adder"], seen.bad["adder"], seen.rows["adder"]) else None

        try:
            usage = wait_until(matches, 30, "stored usage to equal what the clients saw")
        finally:
            say(f"usage after space returned: stored {stored_usage(cluster, 'acme', admin).get('adder')}, clients saw "
                f"{seen.ok['adder']} ok ({seen.rows['adder']} rows), {seen.bad['adder']} failed; lost records "
                f"{metric(worker, 'tessera_usage_spool_write_errors_total')}")
        assert all(s.expected for s in sent), [s for s in sent if not s.expected][:3]
        assert metric(worker, "tessera_usage_spool_write_errors_total") == 0
        assert usage["requests"] + usage["failures"] == len(sent)
    finally:
        for w in cluster.workers:
            if w:
                w.terminate()
        subprocess.run(["umount", "-l", str(spool)], capture_output=True)


# --------------------------------------------------------------------------
# 5. A short soak (scripts/soak.sh runs the same check for 30 minutes)
# --------------------------------------------------------------------------


def test_a_short_soak_keeps_memory_flat(tmp_path):
    from soak import soak

    result = soak(SOAK_S, tmp_path, interval_s=5.0, say=lambda m: print(f"[chaos] {m}", flush=True))
    assert result["failed"] == 0, result
    assert result["growth_mib"] <= result["bound_mib"], result
