"""Object stores by URL: Azure Blob Storage against Azurite (Microsoft's emulator, from npm) and
an S3 key prefix against moto. Artifacts are written, read back in ranges (the ONNX check),
deleted and, with an audit signing key, checkpoints are written with a conditional put; every
key lands under the URL's prefix."""

import hashlib
import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from conftest import free_port, onnx_model, wait_for_port

AZURITE_DIR = Path(__file__).resolve().parents[1] / "azurite"


def ensure_azurite_packages():
    if (AZURITE_DIR / "node_modules" / "azurite").is_dir():
        return
    npm = shutil.which("npm")
    assert npm, "npm is needed to install Azurite (tests/azurite): install Node.js 20+"
    env = {**os.environ}
    env.setdefault("npm_config_cache", str(Path.home() / ".cache" / "tessera" / "npm"))
    subprocess.run([npm, "ci", "--no-audit", "--no-fund"], cwd=AZURITE_DIR, check=True, env=env)


@pytest.fixture
def azurite(tmp_path):
    ensure_azurite_packages()
    port = free_port()
    proc = subprocess.Popen(
        [str(AZURITE_DIR / "node_modules" / ".bin" / "azurite-blob"), "--blobHost", "127.0.0.1",
         "--blobPort", str(port), "--inMemoryPersistence", "--disableTelemetry", "--skipApiVersionCheck",
         "--silent"],
        cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        try:
            wait_for_port("127.0.0.1", port, 60)
        except RuntimeError:
            proc.kill()
            raise RuntimeError("Azurite did not start: " + proc.stderr.read()) from None
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(10)


def container(command: str, endpoint: str, name: str):
    run = subprocess.run(["node", str(AZURITE_DIR / "container.mjs"), command, endpoint, name],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout) if command == "list" else None


def signing_key(tmp_path: Path) -> Path:
    key = tmp_path / "audit-signing-key.pem"
    subprocess.run(["openssl", "genpkey", "-algorithm", "ed25519", "-out", str(key)], check=True)
    return key


def upload(cp, model: str, body: bytes) -> dict:
    api = httpx.Client(base_url=cp.url, headers={"Authorization": f"Bearer {cp.admin_key}"}, timeout=30)
    if api.get("/v1/tenants/acme").status_code == 404:
        api.post("/v1/tenants", json={"name": "acme"}).raise_for_status()
    api.post("/v1/tenants/acme/models", json={"name": model}).raise_for_status()
    done = api.post(f"/v1/tenants/acme/models/{model}/versions?format=onnx", content=body,
                    headers={"Content-Type": "application/octet-stream"})
    assert done.status_code == 201, done.text
    return done.json()


def test_artifacts_and_checkpoints_live_in_an_azure_container_under_the_prefix(start_control_plane, azurite, tmp_path):
    container("create", azurite, "artifacts")
    env = {"AZURE_STORAGE_USE_EMULATOR": "true", "AZURITE_BLOB_STORAGE_URL": azurite}
    cp = start_control_plane(args=["--object-store", "az://artifacts/tessera/prod",
                                   "--audit-signing-key-file", str(signing_key(tmp_path))], env=env)
    api = httpx.Client(base_url=cp.url, headers={"Authorization": f"Bearer {cp.admin_key}"}, timeout=30)

    # A 2 MiB model: the upload goes through a multipart (block list) upload and the ONNX check
    # reads it back in ranges.
    body = onnx_model(2 << 20)
    version = upload(cp, "big", body)
    assert version["sha256"] == hashlib.sha256(body).hexdigest() and version["size_bytes"] == len(body)

    names = container("list", azurite, "artifacts")
    models = [n for n in names if n.endswith("/model.onnx")]
    assert len(models) == 1 and models[0].startswith("tessera/prod/tenants/"), names
    assert any(n.startswith("tessera/prod/audit/") for n in names), f"no audit checkpoint: {names}"
    assert all(n.startswith("tessera/prod/") for n in names), names

    # Presigned uploads need an S3-compatible store: a clear 409, not a broken URL.
    presign = api.post("/v1/tenants/acme/models/big/uploads", json={"format": "onnx"})
    assert presign.status_code == 409 and presign.json()["error"]["code"] == "presign_unsupported", presign.text

    # Deleting the version deletes its blob.
    api.delete("/v1/tenants/acme/models/big/versions/1").raise_for_status()
    deadline = time.monotonic() + 15
    while any(n.endswith("/model.onnx") for n in container("list", azurite, "artifacts")):
        assert time.monotonic() < deadline, "the deleted version's blob is still there"
        time.sleep(0.2)


def test_a_missing_azure_container_fails_the_upload_with_a_server_error_not_a_hang(start_control_plane, azurite):
    env = {"AZURE_STORAGE_USE_EMULATOR": "true", "AZURITE_BLOB_STORAGE_URL": azurite}
    cp = start_control_plane(args=["--object-store", "az://nowhere"], env=env)
    api = httpx.Client(base_url=cp.url, headers={"Authorization": f"Bearer {cp.admin_key}"}, timeout=60)
    api.post("/v1/tenants", json={"name": "acme"}).raise_for_status()
    api.post("/v1/tenants/acme/models", json={"name": "m"}).raise_for_status()
    done = api.post("/v1/tenants/acme/models/m/versions?format=onnx", content=onnx_model(),
                    headers={"Content-Type": "application/octet-stream"})
    assert done.status_code >= 500, done.text
    assert api.get("/v1/tenants/acme/models/m/versions").json()["versions"] == []


def test_s3_keys_and_presigned_uploads_go_under_the_prefix(start_control_plane, s3):
    env = {"AWS_ENDPOINT": s3, "AWS_ALLOW_HTTP": "true", "AWS_ACCESS_KEY_ID": "test",
           "AWS_SECRET_ACCESS_KEY": "test", "AWS_REGION": "us-east-1"}
    cp = start_control_plane(args=["--object-store", "s3://artifacts/team-a/"], env=env)
    upload(cp, "streamed", onnx_model())

    api = httpx.Client(base_url=cp.url, headers={"Authorization": f"Bearer {cp.admin_key}"}, timeout=30)
    api.post("/v1/tenants/acme/models", json={"name": "presigned"}).raise_for_status()
    artifact = onnx_model(1 << 10)
    u = api.post("/v1/tenants/acme/models/presigned/uploads", json={"format": "onnx"}).json()
    assert "/artifacts/team-a/tenants/" in u["url"], u["url"]
    httpx.put(u["url"], content=artifact).raise_for_status()
    done = api.post(f"/v1/tenants/acme/models/presigned/uploads/{u['upload_id']}/complete",
                    json={"sha256": hashlib.sha256(artifact).hexdigest()})
    assert done.status_code == 201, done.text

    listing = httpx.get(f"{s3}/artifacts?list-type=2").text
    keys = [part.split("</Key>")[0] for part in listing.split("<Key>")[1:]]
    assert len(keys) == 2 and all(k.startswith("team-a/tenants/") for k in keys), keys


def test_a_bad_object_store_url_stops_the_start_with_a_reason(tmp_path):
    from conftest import tessera_bin

    run = subprocess.run([tessera_bin(), "control-plane", "--listen", "127.0.0.1:0",
                          "--database-url", f"sqlite://{tmp_path / 'r.db'}", "--object-store", "ftp://x/y"],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode != 0
    assert "unsupported object store scheme ftp://" in run.stderr, run.stderr
