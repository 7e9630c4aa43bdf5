"""Ensembles through the control plane: a tenant uploads its step models and an ensemble
archive (Triton's layout: config.pbtxt and an empty version directory), deploys the ensemble,
and `tritonclient` calls it over HTTP and gRPC on a real worker, which loaded the pinned
composing versions beside it. Steps resolve only in the tenant's own models, are pinned at
upload, and cannot be deleted while an ensemble version composes them."""

from __future__ import annotations

import io
import json
import tarfile

import numpy as np
import pytest

from conftest import ApiError, infer_grpc, infer_http, marker_model

X = np.zeros((2, 4), dtype=np.float32)

PIPELINE = """
name: "pipeline"
platform: "ensemble"
max_batch_size: 4
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
ensemble_scheduling {
  step [
    { model_name: "add_one" model_version: -1
      input_map { key: "INPUT0" value: "INPUT0" } output_map { key: "OUTPUT0" value: "mid" } },
    { model_name: "add_ten" model_version: 1
      input_map { key: "INPUT0" value: "mid" } output_map { key: "OUTPUT0" value: "OUTPUT0" } }
  ]
}
"""


def ensemble_tar(config: str) -> bytes:
    """Triton's model directory for an ensemble: config.pbtxt and an empty version directory."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name in ("pipeline", "pipeline/1"):
            d = tarfile.TarInfo(name)
            d.type, d.mode = tarfile.DIRTYPE, 0o755
            tar.addfile(d)
        data = config.encode()
        f = tarfile.TarInfo("pipeline/config.pbtxt")
        f.size = len(data)
        tar.addfile(f, io.BytesIO(data))
    return buf.getvalue()


def upload_ensemble(cluster, tenant: str, key: str, config: str, expect: int = 201):
    try:
        cluster.api("POST", f"/v1/tenants/{tenant}/models", key, {"name": "pipeline"}, expect=201)
    except ApiError as e:
        if e.status != 409:
            raise
    return cluster.api("POST", f"/v1/tenants/{tenant}/models/pipeline/versions?format=tar", key,
                       data=ensemble_tar(config), headers={"Content-Type": "application/octet-stream"},
                       expect=expect)


def refusal(e: ApiError) -> str:
    return json.loads(e.body)["error"]["message"]


def test_an_ensemble_deploys_with_its_pinned_steps_and_answers_tritonclient(make_cluster):
    cluster = make_cluster(1)
    keys = cluster.create_tenant("acme")
    admin, inference = keys["tenant-admin"], keys["inference"]

    # Steps must exist in the tenant before the ensemble that names them.
    with pytest.raises(ApiError) as e:
        upload_ensemble(cluster, "acme", admin, PIPELINE)
    assert e.value.status == 422 and "names model 'add_one', which this tenant does not have" in refusal(e.value)

    assert cluster.push_version("acme", admin, "add_one", marker_model(1.0)) == 1
    assert cluster.push_version("acme", admin, "add_ten", marker_model(10.0)) == 1
    v = upload_ensemble(cluster, "acme", admin, PIPELINE)
    steps = v["config"]["ensemble_scheduling"]["step"]
    assert [(s["model_name"], s["model_version"]) for s in steps] == [("add_one", 1), ("add_ten", 1)], "pinned"
    assert v["signature"]["platform"] == "ensemble"
    assert [t["name"] for t in v["signature"]["inputs"]] == ["INPUT0"]

    # A newer step version does not change the uploaded ensemble version.
    assert cluster.push_version("acme", admin, "add_one", marker_model(100.0)) == 2

    cluster.api("POST", "/v1/tenants/acme/deployments", admin,
                {"name": "pipeline", "model": "pipeline", "version": v["version"], "replicas": 1}, expect=201)
    d = cluster.wait_ready("acme", admin, "pipeline")
    replica = d["replica_status"][0]
    out = infer_http(replica["http_endpoint"], inference, "pipeline", X)
    assert out.tolist() == [[11.0] * 4] * 2, out
    out = infer_grpc(replica["grpc_endpoint"], inference, "pipeline", X)
    assert out.tolist() == [[11.0] * 4] * 2, out

    # Statistics per composing model, as Triton keeps them.
    import tritonclient.http as httpclient
    from urllib.parse import urlparse

    client = httpclient.InferenceServerClient(urlparse(replica["http_endpoint"]).netloc)
    try:
        auth = {"Authorization": f"Bearer {inference}"}
        stats = client.get_inference_statistics("add_ten", headers=auth)["model_stats"]
        assert stats[0]["version"] == "1" and stats[0]["inference_count"] >= 4, stats
        pipeline = client.get_inference_statistics("pipeline", headers=auth)["model_stats"][0]
        assert pipeline["inference_count"] >= 4, pipeline
    finally:
        client.close()

    # A composed version cannot go while the ensemble version names it; the newer one can.
    with pytest.raises(ApiError) as e:
        cluster.api("DELETE", "/v1/tenants/acme/models/add_one/versions/1", admin, expect=204)
    assert e.value.status == 409 and "composed by ensemble 'pipeline' version 1" in refusal(e.value)
    with pytest.raises(ApiError) as e:
        cluster.api("DELETE", "/v1/tenants/acme/models/add_ten", admin, expect=204)
    assert e.value.status == 409, e.value.body
    cluster.api("DELETE", "/v1/tenants/acme/models/add_one/versions/2", admin, expect=204)


def test_a_step_never_reaches_another_tenants_model(make_cluster):
    cluster = make_cluster(1)
    acme = cluster.create_tenant("acme")["tenant-admin"]
    other = cluster.create_tenant("other")["tenant-admin"]
    cluster.push_version("acme", acme, "add_one", marker_model(1.0))
    cluster.push_version("acme", acme, "add_ten", marker_model(10.0))
    with pytest.raises(ApiError) as e:
        upload_ensemble(cluster, "other", other, PIPELINE)
    assert e.value.status == 422 and "which this tenant does not have" in refusal(e.value)
    cluster.push_version("other", other, "add_one", marker_model(1.0))
    with pytest.raises(ApiError) as e:
        upload_ensemble(cluster, "other", other, PIPELINE)
    assert "names model 'add_ten'" in refusal(e.value)
    # Broken ensembles are refused at upload with the reason.
    cluster.push_version("other", other, "add_ten", marker_model(10.0))
    with pytest.raises(ApiError) as e:
        upload_ensemble(cluster, "other", other, PIPELINE.replace("model_version: 1", "model_version: 7"))
    assert "names model 'add_ten', which has no version 7" in refusal(e.value)
    with pytest.raises(ApiError) as e:
        upload_ensemble(cluster, "other", other, PIPELINE.replace('"add_ten"', '"pipeline"'))
    assert "names the ensemble itself" in refusal(e.value)
