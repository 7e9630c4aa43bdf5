"""perf_analyzer against add_sub over HTTP and gRPC (needs PERF_ANALYZER).

PERF_ANALYZER is the command to run; it may carry a prefix, e.g. a loader
and library path: ``PERF_ANALYZER="/opt/ld-linux-x86-64.so.2 --library-path
/opt/lib /opt/perf_analyzer"`` (split with shlex).

perf_analyzer reads the model config and the statistics endpoint; its
"Server:" section (queue / compute input / compute infer / compute output)
comes from the statistics extension, so it proves that part is compatible.
"""

import csv
import os
import shlex
import subprocess

import pytest

PA = os.environ.get("PERF_ANALYZER", "")
PA_TIMEOUT_S = 100

pytestmark = [
    pytest.mark.perf,
    pytest.mark.timeout(PA_TIMEOUT_S + 20),
    pytest.mark.skipif(
        not PA,
        reason="PERF_ANALYZER is not set: perf_analyzer compatibility was NOT tested "
        "(export PERF_ANALYZER=/path/to/perf_analyzer to run it)",
    ),
]


def _run_pa(protocol, url, out_csv, extra=()):
    cmd = shlex.split(PA) + [
        "-m", "add_sub",
        "-u", url,
        "-i", protocol,
        "--concurrency-range", "1:1",
        "--measurement-mode", "count_windows",
        "--measurement-request-count", "200",
        "--stability-percentage", "100",
        "--max-trials", "6",
        "-f", str(out_csv),
        *extra,
    ]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=PA_TIMEOUT_S)
    out = p.stdout + "\n" + p.stderr
    assert p.returncode == 0, f"perf_analyzer exited {p.returncode}\n$ {' '.join(cmd)}\n{out[-4000:]}"
    return out


def _check_output(out, out_csv):
    assert "Server:" in out, f"no server-side breakdown in perf_analyzer output:\n{out[-3000:]}"
    server = out.split("Server:", 1)[1].lower()
    for word in ("inference count", "queue", "compute infer", "compute input", "compute output"):
        assert word in server, f"{word!r} missing from the Server section:\n{server[:2000]}"
    with open(out_csv, newline="") as f:
        rows = list(csv.DictReader(f))
    assert rows, f"empty CSV {out_csv}"
    row = rows[0]
    for col in ("Inferences/Second", "Server Queue", "Server Compute Infer"):
        assert col in row, f"CSV lacks {col!r}: {list(row)}"
    assert float(row["Inferences/Second"]) > 0, row
    assert float(row["Server Compute Infer"]) >= 0, row


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_perf_analyzer_add_sub(server, tmp_path, protocol):
    url = server.http_url if protocol == "http" else server.grpc_url
    out_csv = tmp_path / f"pa-{protocol}.csv"
    out = _run_pa(protocol, url, out_csv)
    _check_output(out, out_csv)


def test_perf_analyzer_http_json_tensors(server, tmp_path):
    out_csv = tmp_path / "pa-json.csv"
    out = _run_pa(
        "http", server.http_url, out_csv, extra=["--input-tensor-format", "json", "--output-tensor-format", "json"]
    )
    _check_output(out, out_csv)
