"""An MLOps pipeline driving the API through a client generated at test time from the
committed openapi/openapi.json with openapi-python-client: create a tenant key, a model,
upload a version, move an alias, read the audit trail; walk lists page by page with their
cursors, and get closed sets (roles, audit actions, error codes) as Python enums."""

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


def walk_versions(client, list_versions):
    """Every version of `resnet`, one page of one at a time."""
    cursor = None
    while True:
        page = list_versions.sync(client=client, tenant="acme", model="resnet", limit=1,
                                  **({"cursor": cursor} if cursor else {}))
        yield from page.versions
        if not isinstance(page.next_cursor, str):
            return
        cursor = page.next_cursor


def test_pipeline_with_generated_client(control_plane, tmp_path):
    tc = generate_client(tmp_path)
    from tessera_client.api.api_keys import create_api_key, list_api_keys
    from tessera_client.api.audit import list_audit_events, verify_audit_chain
    from tessera_client.api.auth import create_token
    from tessera_client.api.models import create_model, get_alias, list_versions, set_alias, upload_version
    from tessera_client.api.tenants import create_tenant
    from tessera_client.models import (AuditAction, AuditResourceType, CreateApiKey, CreateModel, CreateTenant,
                                       ErrorBody, ErrorCode, Role, SetAlias)
    from tessera_client.types import UNSET, File

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

    # Enums round-trip: a filter given as an enum value comes back as that enum.
    page = list_audit_events.sync(client=ops, action=AuditAction.ALIAS_SET)
    assert [e.after["version"] for e in page.events] == [1, 2]
    assert page.events[0].before["version"] == 2
    assert all(e.action is AuditAction.ALIAS_SET and e.resource_type is AuditResourceType.MODEL_ALIAS
               for e in page.events)
    verdict = verify_audit_chain.sync(client=ops)
    assert verdict.ok and verdict.events_checked >= 7

    # A conflict's code is an enum member too.
    taken = create_model.sync_detailed(client=pipeline, tenant="acme", body=CreateModel(name="resnet"))
    assert taken.status_code == 409 and isinstance(taken.parsed, ErrorBody)
    assert taken.parsed.error.code is ErrorCode.ALREADY_EXISTS

    # Every list pages with opaque cursors: walk the keys two at a time.
    for i in range(3):
        create_api_key.sync(client=ops, tenant="acme", body=CreateApiKey(name=f"batch-{i}", role=Role.VIEWER))
    names, cursor, pages = [], UNSET, 0
    while True:
        key_page = list_api_keys.sync(client=ops, tenant="acme", limit=2, cursor=cursor)
        assert len(key_page.api_keys) <= 2
        names += [k.name for k in key_page.api_keys]
        pages += 1
        if not isinstance(key_page.next_cursor, str):
            break
        cursor = key_page.next_cursor
    assert pages == 3 and names == ["ops", "pipeline", "batch-0", "batch-1", "batch-2"]
    assert all(isinstance(k.role, Role) for k in key_page.api_keys)
    versions = [v.version for v in walk_versions(pipeline, list_versions)]
    assert versions == [2, 1]
    # A cursor this server did not issue is refused, naming the parameter.
    forged = list_api_keys.sync_detailed(client=ops, tenant="acme", cursor="bm90LWEtY3Vyc29y")
    assert forged.status_code == 400 and forged.parsed.error.code is ErrorCode.BAD_REQUEST
    assert forged.parsed.error.field == "cursor"

    # Errors come back typed.
    denied = create_model.sync_detailed(client=tc.AuthenticatedClient(base_url=control_plane.url, token="nope"),
                                        tenant="acme", body=CreateModel(name="x"))
    assert denied.status_code == 401
