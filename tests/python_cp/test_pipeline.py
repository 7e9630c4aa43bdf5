"""An MLOps pipeline driving the API through a client generated at test time from the
committed openapi/openapi.json with openapi-python-client: create a tenant key, a model,
upload a version, move an alias, read the audit trail."""

import hashlib
import importlib
import io
import subprocess
import sys

from conftest import OPENAPI, onnx_model


def generate_client(tmp_path):
    out = tmp_path / "tessera_client"
    config = tmp_path / "client-config.yaml"
    config.write_text("post_hooks: []\n")
    subprocess.run(
        [sys.executable, "-m", "openapi_python_client", "generate", "--path", str(OPENAPI),
         "--output-path", str(out), "--meta", "none", "--config", str(config)],
        check=True, capture_output=True, text=True,
    )
    sys.path.insert(0, str(tmp_path))
    return importlib.import_module("tessera_client")


def test_pipeline_with_generated_client(control_plane, tmp_path):
    tc = generate_client(tmp_path)
    from tessera_client.api.api_keys import create_api_key
    from tessera_client.api.audit import list_audit_events, verify_audit_chain
    from tessera_client.api.auth import create_token
    from tessera_client.api.models import create_model, get_alias, list_versions, set_alias, upload_version
    from tessera_client.api.tenants import create_tenant
    from tessera_client.models import CreateApiKey, CreateModel, CreateTenant, Role, SetAlias
    from tessera_client.types import File

    admin = tc.AuthenticatedClient(base_url=control_plane.url, token=control_plane.admin_key)
    tenant = create_tenant.sync(client=admin, body=CreateTenant(name="acme"))
    assert tenant.name == "acme"
    tenant_admin = create_api_key.sync(client=admin, tenant="acme", body=CreateApiKey(name="ops", role=Role.TENANT_ADMIN))
    ops = tc.AuthenticatedClient(base_url=control_plane.url, token=tenant_admin.key)
    created = create_api_key.sync(client=ops, tenant="acme", body=CreateApiKey(name="pipeline", role=Role.DEPLOYER))
    assert created.key.startswith(created.api_key.prefix)

    # The pipeline swaps its key for a short-lived token and works with that.
    key_client = tc.AuthenticatedClient(base_url=control_plane.url, token=created.key)
    token = create_token.sync(client=key_client)
    pipeline = tc.AuthenticatedClient(base_url=control_plane.url, token=token.access_token)

    model = create_model.sync(client=pipeline, tenant="acme", body=CreateModel(name="resnet"), idempotency_key="run-1")
    retried = create_model.sync(client=pipeline, tenant="acme", body=CreateModel(name="resnet"), idempotency_key="run-1")
    assert retried.id == model.id

    artifact = onnx_model(4000)
    digest = hashlib.sha256(artifact).hexdigest()
    for _ in range(2):
        version = upload_version.sync(
            client=pipeline, tenant="acme", model="resnet", body=File(payload=io.BytesIO(artifact)), sha256=digest,
        )
        assert version.sha256 == digest and version.size_bytes == len(artifact)
    versions = list_versions.sync(client=pipeline, tenant="acme", model="resnet")
    assert [v.version for v in versions.versions] == [2, 1]

    set_alias.sync(client=pipeline, tenant="acme", model="resnet", alias="production", body=SetAlias(version=2))
    set_alias.sync(client=pipeline, tenant="acme", model="resnet", alias="production", body=SetAlias(version=1))
    assert get_alias.sync(client=pipeline, tenant="acme", model="resnet", alias="production").version == 1

    page = list_audit_events.sync(client=ops, action="alias.set")
    assert [e.after["version"] for e in page.events] == [1, 2]
    assert page.events[0].before["version"] == 2
    verdict = verify_audit_chain.sync(client=ops)
    assert verdict.ok and verdict.events_checked >= 7

    # Errors come back typed.
    denied = create_model.sync_detailed(client=tc.AuthenticatedClient(base_url=control_plane.url, token="nope"),
                                        tenant="acme", body=CreateModel(name="x"))
    assert denied.status_code == 401
