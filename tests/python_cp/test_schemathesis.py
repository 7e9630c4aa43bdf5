"""schemathesis against the live server's spec: no 5xx, every status documented, every
response matching its schema."""

import os
import subprocess
import sys
from pathlib import Path


def test_live_spec_holds(control_plane, tmp_path):
    checks = ",".join([
        "not_a_server_error", "status_code_conformance", "content_type_conformance",
        "response_schema_conformance", "response_headers_conformance",
    ])
    st = Path(sys.executable).with_name("schemathesis")
    cmd = [
        str(st), "run", f"{control_plane.url}/v1/openapi.json",
        "-H", f"Authorization: Bearer {control_plane.admin_key}",
        "-c", checks,
        "-n", os.environ.get("TESSERA_ST_MAX_EXAMPLES", "25"),
        "--max-time", os.environ.get("TESSERA_ST_MAX_TIME", "60"),
        "--seed", "1",
        "--report-dir", str(tmp_path),
    ]
    run = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path)
    assert run.returncode == 0, run.stdout[-8000:] + run.stderr[-2000:]
    assert not [line for line in control_plane.lines if " ERROR " in line], "server logged errors"
