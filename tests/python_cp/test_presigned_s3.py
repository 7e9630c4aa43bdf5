"""Presigned uploads against an S3-compatible server (moto): the artifact goes straight to
the store, the completion call verifies its sha256; a corrupted one is refused and deleted."""

import hashlib

import httpx

from conftest import onnx_model


def bucket_keys(endpoint):
    listing = httpx.get(f"{endpoint}/artifacts?list-type=2").text
    return [part.split("</Key>")[0] for part in listing.split("<Key>")[1:]]


def test_presigned_upload_round_trip(start_control_plane, s3):
    env = {"AWS_ENDPOINT": s3, "AWS_ALLOW_HTTP": "true", "AWS_ACCESS_KEY_ID": "test",
           "AWS_SECRET_ACCESS_KEY": "test", "AWS_REGION": "us-east-1"}
    cp = start_control_plane(args=["--object-store", "s3://artifacts"], env=env)
    admin = {"Authorization": f"Bearer {cp.admin_key}"}
    api = httpx.Client(base_url=cp.url, headers=admin)
    api.post("/v1/tenants", json={"name": "acme"}).raise_for_status()
    api.post("/v1/tenants/acme/models", json={"name": "big"}).raise_for_status()

    artifact = onnx_model(1 << 20)
    digest = hashlib.sha256(artifact).hexdigest()
    upload = api.post("/v1/tenants/acme/models/big/uploads", json={"format": "onnx"})
    assert upload.status_code == 201, upload.text
    u = upload.json()
    assert u["method"] == "PUT" and "X-Amz-Signature" in u["url"]
    httpx.put(u["url"], content=artifact).raise_for_status()
    done = api.post(f"/v1/tenants/acme/models/big/uploads/{u['upload_id']}/complete", json={"sha256": digest})
    assert done.status_code == 201, done.text
    assert done.json()["size_bytes"] == len(artifact) and done.json()["version"] == 1
    again = api.post(f"/v1/tenants/acme/models/big/uploads/{u['upload_id']}/complete", json={"sha256": digest})
    assert again.status_code == 409
    assert len(bucket_keys(s3)) == 1

    # A corrupted upload (sha256 differs) is refused and removed from the bucket.
    bad = api.post("/v1/tenants/acme/models/big/uploads", json={"format": "onnx"}).json()
    httpx.put(bad["url"], content=artifact[:-1] + b"!").raise_for_status()
    refused = api.post(f"/v1/tenants/acme/models/big/uploads/{bad['upload_id']}/complete", json={"sha256": digest})
    assert refused.status_code == 422 and refused.json()["error"]["field"] == "sha256"
    assert len(bucket_keys(s3)) == 1

    # API uploads land in the same bucket under the tenant's prefix.
    direct = api.post("/v1/tenants/acme/models/big/versions", content=artifact,
                      headers={"content-type": "application/octet-stream"})
    assert direct.status_code == 201, direct.text
    keys = bucket_keys(s3)
    assert len(keys) == 2 and all(k.startswith("tenants/") for k in keys)
