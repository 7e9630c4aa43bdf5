"""Single sign-on end to end: the real `tessera control-plane` and a real OpenID provider (the
npm `oidc-provider` package, tests/oidc/provider.mjs) on loopback, signing in through the
provider's login form with plain HTTP requests, as a browser would.

Covers sign-in, role mapping and provisioning, the session cookie and its CSRF token, sign-out,
and the refusals: a wrong audience, a replayed callback and a replayed code, a disabled user,
an unknown user, and sessions that expire (idle and absolute).
"""

import json
import os
import re
import shutil
import subprocess
import threading
import time
from pathlib import Path
from urllib.parse import parse_qs, urljoin, urlparse

import pytest
import requests

ROOT = Path(__file__).resolve().parents[2]
PROVIDER_DIR = ROOT / "tests" / "oidc"
CLIENT_ID = "tessera-console"
CLIENT_SECRET = "provider-test-secret"
ACCOUNTS = {
    "alice@acme.example": {"groups": ["ml-admins", "staff"], "name": "Alice"},
    "bob@acme.example": {"groups": ["staff"]},
    "carol@acme.example": {"groups": ["ml-admins"]},
    "dave@acme.example": {"groups": []},
}


def ensure_provider_packages():
    if (PROVIDER_DIR / "node_modules" / "oidc-provider").is_dir():
        return
    npm = shutil.which("npm")
    assert npm, "npm is needed to install the test OpenID provider (tests/oidc): install Node.js 20.19+"
    env = {**os.environ}
    env.setdefault("npm_config_cache", str(Path.home() / ".cache" / "tessera" / "npm"))
    subprocess.run([npm, "ci", "--no-audit", "--no-fund"], cwd=PROVIDER_DIR, check=True, env=env)


class Provider:
    def __init__(self, redirect_uri: str):
        ensure_provider_packages()
        self.proc = subprocess.Popen(
            ["node", str(PROVIDER_DIR / "provider.mjs"), "--client-id", CLIENT_ID,
             "--client-secret", CLIENT_SECRET, "--redirect-uri", redirect_uri,
             "--accounts", json.dumps(ACCOUNTS)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        self.errors = []
        threading.Thread(target=lambda: self.errors.extend(self.proc.stderr), daemon=True).start()
        line = self.proc.stdout.readline()
        if not line:
            self.proc.wait(5)
            raise RuntimeError("the OpenID provider did not start:\n" + "".join(self.errors))
        self.issuer = json.loads(line)["issuer"]

    def set_id_token_audience(self, aud: str):
        requests.post(f"{self.issuer}/__test/id-token-audience", params={"aud": aud}).raise_for_status()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)


class Tessera:
    """The control plane as a platform admin (API key) sees it."""

    def __init__(self, cp):
        self.url = cp.url
        self.admin = {"Authorization": f"Bearer {cp.admin_key}"}

    def call(self, method, path, **kw):
        kw.setdefault("headers", self.admin)
        return requests.request(method, self.url + path, timeout=30, **kw)

    def create_tenant(self, name):
        r = self.call("POST", "/v1/tenants", json={"name": name})
        assert r.status_code == 201, r.text

    def create_user(self, tenant, email, role):
        r = self.call("POST", f"/v1/tenants/{tenant}/users", json={"email": email, "name": email, "role": role})
        assert r.status_code == 201, r.text
        return r.json()["id"]

    def set_issuer(self, tenant, issuer, **extra):
        spec = {"issuer": issuer, "client_id": CLIENT_ID, "client_secret": CLIENT_SECRET,
                "scopes": ["openid", "email", "profile", "groups"], "role_claim": "groups",
                "role_mapping": {"ml-admins": "tenant-admin"}, **extra}
        return self.call("PUT", f"/v1/tenants/{tenant}/oidc-issuer", json=spec)


def to_callback(t: Tessera, provider: Provider, tenant: str, login: str, return_to: str = "/") -> str:
    """Starts a sign-in and goes through the provider's login form; returns the callback URL
    the provider sends the browser to (not yet visited)."""
    browser = requests.Session()
    r = browser.get(f"{t.url}/v1/auth/oidc/{tenant}/login", params={"return_to": return_to},
                    allow_redirects=False)
    assert r.status_code == 303, r.text
    location = r.headers["location"]
    assert location.startswith(provider.issuer), f"not sent to the provider: {location}"
    query = parse_qs(urlparse(location).query)
    assert query["code_challenge_method"] == ["S256"] and query["nonce"] and query["state"], location
    # The provider's own pages: redirects to its login form, the form, then back to us.
    page = None
    for _ in range(10):
        r = browser.get(urljoin(provider.issuer, location), allow_redirects=False)
        if r.status_code != 303 and r.status_code != 302:
            page = r
            break
        location = r.headers["location"]
    assert page is not None and 'name="login"' in page.text, page.text if page else "no login form"
    action = re.search(r'<form[^>]*action="([^"]+)"', page.text).group(1)
    r = browser.post(urljoin(page.url, action), data={"prompt": "login", "login": login, "password": "any"},
                     allow_redirects=False)
    for _ in range(10):
        location = urljoin(provider.issuer, r.headers["location"])
        if location.startswith(t.url):
            return location
        r = browser.get(location, allow_redirects=False)
    raise AssertionError(f"the provider never sent the browser back: {r.status_code} {r.text[:500]}")


def finish(callback_url: str):
    """Visits the callback: (session cookie, location) on success, (None, sso_error) else."""
    r = requests.get(callback_url, allow_redirects=False)
    assert r.status_code == 303, r.text
    location = r.headers["location"]
    cookie = r.headers.get("set-cookie", "")
    m = re.search(r"tessera_session=([^;]+);", cookie)
    if m:
        assert "tessera_sso=1;" in cookie, cookie
        for attr in ("HttpOnly", "Secure", "SameSite=Lax", "Path=/"):
            assert attr in cookie, cookie
        return m.group(1), location
    error = parse_qs(urlparse(location).query).get("sso_error", [""])[0]
    assert error, f"neither a session nor an error: {location}"
    return None, error


class Console:
    """What the console does with a session cookie."""

    def __init__(self, url, token):
        self.url, self.cookie = url, {"Cookie": f"tessera_session={token}"}
        self.csrf = None

    def call(self, method, path, csrf=True, **kw):
        headers = {**self.cookie, **kw.pop("headers", {})}
        if csrf and self.csrf:
            headers["X-CSRF-Token"] = self.csrf
        return requests.request(method, self.url + path, headers=headers, timeout=30, **kw)

    def session(self):
        r = self.call("GET", "/v1/auth/session")
        if r.status_code == 200:
            self.csrf = r.json()["csrf_token"]
        return r


@pytest.fixture
def sso(start_control_plane):
    def start(*args):
        cp = start_control_plane(["--oidc-allow-http-issuers", *args])
        provider = Provider(f"{cp.url}/v1/auth/oidc/callback")
        providers.append(provider)
        t = Tessera(cp)
        t.create_tenant("acme")
        r = t.set_issuer("acme", provider.issuer, provision_users=True, default_role="viewer")
        assert r.status_code == 200, r.text
        return t, provider

    providers = []
    yield start
    for p in providers:
        p.stop()


def sign_in(t, provider, login, tenant="acme"):
    token, where = finish(to_callback(t, provider, tenant, login))
    assert token, f"sign-in of {login} refused: {where}"
    console = Console(t.url, token)
    assert console.session().status_code == 200
    return console


def test_sign_in_uses_the_api_with_csrf_and_signs_out(sso):
    t, provider = sso()
    t.create_user("acme", "alice@acme.example", "viewer")
    token, where = finish(to_callback(t, provider, "acme", "alice@acme.example", return_to="/t/acme/models"))
    assert token and where == "/t/acme/models"
    console = Console(t.url, token)
    me = console.session()
    assert me.status_code == 200, me.text
    # The mapped group wins over the stored role.
    assert (me.json()["tenant"], me.json()["email"], me.json()["role"]) == ("acme", "alice@acme.example", "tenant-admin")
    assert console.call("GET", "/v1/whoami").json()["credential"] == "session"
    assert console.call("GET", "/v1/tenants/acme/models").status_code == 200
    # Reads of another tenant are not found, as with keys.
    t.create_tenant("other")
    assert console.call("GET", "/v1/tenants/other/models").status_code == 404
    # A write without the CSRF token is refused; with it, it goes through.
    r = console.call("POST", "/v1/tenants/acme/models", csrf=False, json={"name": "m1"})
    assert r.status_code == 403 and "X-CSRF-Token" in r.json()["error"]["message"], r.text
    r = console.call("POST", "/v1/tenants/acme/models", csrf=False, headers={"X-CSRF-Token": "forged"}, json={"name": "m1"})
    assert r.status_code == 403, r.text
    r = console.call("POST", "/v1/tenants/acme/models", json={"name": "m1"})
    assert r.status_code == 201, r.text
    # Sessions cannot mint API tokens.
    assert console.call("POST", "/v1/auth/token").status_code == 403
    # API keys keep working beside sessions.
    assert t.call("GET", "/v1/tenants/acme/models").json()["models"][0]["name"] == "m1"
    audit = t.call("GET", "/v1/audit", params={"tenant": "acme"})
    assert audit.status_code == 200, audit.text
    actions = [e["action"] for e in audit.json()["events"]]
    assert "session.sign_in" in actions and "oidc_issuer.set" in actions, actions
    # Sign-out needs the CSRF token too, then the session is gone for good.
    assert console.call("POST", "/v1/auth/logout", csrf=False).status_code == 403
    r = console.call("POST", "/v1/auth/logout")
    assert r.status_code == 204 and "Max-Age=0" in r.headers["set-cookie"]
    r = console.session()
    assert r.status_code == 401 and "signed out" in r.json()["error"]["message"], r.text


def test_unknown_users_are_provisioned_with_a_mapped_or_default_role(sso):
    t, provider = sso()
    bob = sign_in(t, provider, "bob@acme.example")
    assert bob.session().json()["role"] == "viewer"
    # A viewer may read but not write.
    assert bob.call("GET", "/v1/tenants/acme/models").status_code == 200
    assert bob.call("POST", "/v1/tenants/acme/models", json={"name": "m2"}).status_code == 403
    carol = sign_in(t, provider, "carol@acme.example")
    assert carol.session().json()["role"] == "tenant-admin"
    users = {u["email"]: u for u in t.call("GET", "/v1/tenants/acme/users").json()["users"]}
    assert users["bob@acme.example"]["role"] == "viewer" and users["carol@acme.example"]["role"] == "tenant-admin"


def test_unknown_users_are_refused_without_provisioning(sso):
    t, provider = sso()
    r = t.set_issuer("acme", provider.issuer, provision_users=False)
    assert r.status_code == 200, r.text
    token, error = finish(to_callback(t, provider, "acme", "dave@acme.example"))
    assert token is None and "no user dave@acme.example" in error, error


def test_a_token_for_another_audience_is_refused(sso):
    t, provider = sso()
    provider.set_id_token_audience("some-other-client")
    token, error = finish(to_callback(t, provider, "acme", "alice@acme.example"))
    assert token is None and "wrong audience" in error, error
    provider.set_id_token_audience("")
    assert sign_in(t, provider, "alice@acme.example")


def test_replayed_callbacks_and_codes_are_refused(sso):
    t, provider = sso()
    callback = to_callback(t, provider, "acme", "alice@acme.example")
    token, _ = finish(callback)
    assert token
    # The same callback again: our single-use state refuses it.
    again, error = finish(callback)
    assert again is None and "already used" in error, error
    # The same code under a fresh state: the provider refuses the code.
    r = requests.get(f"{t.url}/v1/auth/oidc/acme/login", allow_redirects=False)
    fresh_state = parse_qs(urlparse(r.headers["location"]).query)["state"][0]
    code = parse_qs(urlparse(callback).query)["code"][0]
    again, error = finish(f"{t.url}/v1/auth/oidc/callback?code={code}&state={fresh_state}")
    assert again is None and "refused the code" in error and "invalid_grant" in error, error


def test_disabled_users_cannot_sign_in_and_their_sessions_end(sso):
    t, provider = sso()
    carol_id = t.create_user("acme", "carol@acme.example", "deployer")
    carol = sign_in(t, provider, "carol@acme.example")
    assert t.call("DELETE", f"/v1/tenants/acme/users/{carol_id}").status_code == 200
    r = carol.call("GET", "/v1/tenants/acme/models")
    assert r.status_code == 401 and "disabled" in r.json()["error"]["message"], r.text
    token, error = finish(to_callback(t, provider, "acme", "carol@acme.example"))
    assert token is None and "carol@acme.example is disabled" in error, error


def test_sessions_expire_when_idle_and_at_their_maximum_age(sso):
    t, provider = sso("--session-idle-timeout-secs", "2", "--session-max-age-secs", "5")
    idle = sign_in(t, provider, "alice@acme.example")
    time.sleep(3)
    r = idle.session()
    assert r.status_code == 401 and "without use" in r.json()["error"]["message"], r.text
    busy = sign_in(t, provider, "bob@acme.example")
    deadline = time.monotonic() + 7
    while time.monotonic() < deadline:
        r = busy.session()
        if r.status_code != 200:
            break
        time.sleep(0.5)
    assert r.status_code == 401 and "maximum age" in r.json()["error"]["message"], r.text


def test_issuers_are_checked_and_only_platform_admins_set_them(start_control_plane):
    cp = start_control_plane()
    t = Tessera(cp)
    t.create_tenant("acme")
    # Plain http is refused unless the server allows it (tests, trusted networks).
    r = t.set_issuer("acme", "http://127.0.0.1:9")
    assert r.status_code == 422 and "https" in r.json()["error"]["message"], r.text
    r = t.set_issuer("acme", "https://127.0.0.1:9", scopes=["email"])
    assert r.status_code == 422 and r.json()["error"]["field"] == "scopes", r.text
    r = t.set_issuer("acme", "https://127.0.0.1:9", role_mapping={"x": "platform-admin"})
    assert r.status_code == 422 and r.json()["error"]["field"] == "role_mapping", r.text
    # An issuer that does not answer is refused, naming the issuer field.
    r = t.set_issuer("acme", "https://127.0.0.1:9")
    assert r.status_code == 422 and r.json()["error"]["field"] == "issuer", r.text
    # A tenant admin may not set it.
    r = t.call("POST", "/v1/tenants/acme/api-keys", json={"name": "adm", "role": "tenant-admin"})
    assert r.status_code == 201, r.text
    admin = {"Authorization": f"Bearer {r.json()['key']}"}
    r = t.call("PUT", "/v1/tenants/acme/oidc-issuer", headers=admin,
               json={"issuer": "https://x.example", "client_id": "c", "client_secret": "s"})
    assert r.status_code == 403, r.text
    # Sign-in for a tenant without an issuer goes back to the console with the reason.
    r = requests.get(f"{cp.url}/v1/auth/oidc/acme/login", allow_redirects=False)
    assert r.status_code == 303, r.text
    error = parse_qs(urlparse(r.headers["location"]).query)["sso_error"][0]
    assert "not set up for tenant 'acme'" in error, error


def test_the_issuer_is_shown_without_its_secret(sso):
    t, provider = sso()
    r = t.call("GET", "/v1/tenants/acme/oidc-issuer")
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["client_secret_set"] is True and CLIENT_SECRET not in r.text
    assert body["redirect_uri"] == f"{t.url}/v1/auth/oidc/callback"
    # Updating without a secret keeps the stored one: sign-in still works.
    r = t.set_issuer("acme", provider.issuer, client_secret=None, provision_users=True, default_role="viewer")
    assert r.status_code == 200, r.text
    assert sign_in(t, provider, "bob@acme.example")
    assert t.call("DELETE", "/v1/tenants/acme/oidc-issuer").status_code == 204
    r = requests.get(f"{t.url}/v1/auth/oidc/acme/login", allow_redirects=False)
    error = parse_qs(urlparse(r.headers["location"]).query)["sso_error"][0]
    assert "not set up for tenant 'acme'" in error, error
