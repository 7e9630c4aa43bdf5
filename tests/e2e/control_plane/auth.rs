//! Keys and tokens: exchange, offline verification via JWKS, refusal of expired, not yet
//! valid, forged, wrong-audience and `alg: none` tokens, rotation, revocation, expiry, bootstrap.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use serde_json::{Value, json};

use super::{Opts, TestApp};

fn now() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as i64
}

/// Claims like the server's, for the tenant of `token`.
fn claims_of(token: &str) -> Value {
    let payload = token.split('.').nth(1).unwrap();
    serde_json::from_slice(&URL_SAFE_NO_PAD.decode(payload).unwrap()).unwrap()
}

async fn sign_with_server_key(app: &TestApp, kid: &str, claims: &Value) -> String {
    let der = app.db.fetch_bytes(&format!("SELECT private_der FROM signing_keys WHERE kid = '{kid}'")).await;
    let mut header = Header::new(Algorithm::EdDSA);
    header.kid = Some(kid.to_string());
    jsonwebtoken::encode(&header, claims, &EncodingKey::from_ed_der(&der)).unwrap()
}

#[tokio::test]
async fn tokens_work_offline_and_bad_ones_are_refused() {
    let app = TestApp::spawn().await;
    let t = app.tenant("acme").await;
    let tok = app.token(&t.viewer).await;
    let body = tok.expect(200);
    assert_eq!((body["token_type"].as_str(), body["expires_in"].as_u64()), (Some("Bearer"), Some(900)));
    let token = body["access_token"].as_str().unwrap().to_string();
    app.get(&token, "/v1/tenants/acme/models").await.expect(200);
    assert_eq!(app.create_model(&token, "acme", "x").await.status, 403, "the token carries the viewer role");
    assert_eq!(app.token(&token).await.status, 403, "tokens are not exchanged for tokens");

    // A worker verifies the token with nothing but the JWKS.
    let jwks = app.get("", "/.well-known/jwks.json").await;
    let jwk: jsonwebtoken::jwk::Jwk = serde_json::from_value(jwks.expect(200)["keys"][0].clone()).unwrap();
    let mut v = Validation::new(Algorithm::EdDSA);
    v.set_audience(&["tessera"]);
    let claims = jsonwebtoken::decode::<Value>(&token, &DecodingKey::from_jwk(&jwk).unwrap(), &v).unwrap().claims;
    assert_eq!((claims["tenant_name"].as_str(), claims["role"].as_str()), (Some("acme"), Some("viewer")));

    let kid = jwk.common.key_id.clone().unwrap();
    let good = claims_of(&token);
    let with = |k: &str, val: Value| {
        let mut c = good.clone();
        c[k] = val;
        c
    };
    let expired = sign_with_server_key(&app, &kid, &with("exp", json!(now() - 120))).await;
    let wrong_aud = sign_with_server_key(&app, &kid, &with("aud", json!("someone-else"))).await;
    let wrong_iss = sign_with_server_key(&app, &kid, &with("iss", json!("evil"))).await;
    let escalated = sign_with_server_key(&app, &kid, &with("role", json!("tenant-admin"))).await;
    assert_eq!(app.get(&escalated, "/v1/tenants/acme/api-keys").await.status, 200, "sanity: the key signs");

    // Same claims, but the signature is over different ones.
    let parts: Vec<&str> = token.split('.').collect();
    let tampered_payload = URL_SAFE_NO_PAD.encode(serde_json::to_vec(&with("role", json!("tenant-admin"))).unwrap());
    let forged = format!("{}.{}.{}", parts[0], tampered_payload, parts[2]);
    let none_header = URL_SAFE_NO_PAD.encode(br#"{"alg":"none","typ":"JWT","kid":"x"}"#);
    let alg_none = format!("{none_header}.{tampered_payload}.");
    let hs_header = URL_SAFE_NO_PAD.encode(format!(r#"{{"alg":"HS256","typ":"JWT","kid":"{kid}"}}"#));
    let hs256 = format!("{hs_header}.{tampered_payload}.{}", parts[2]);
    for (what, bad) in [
        ("expired", expired),
        ("wrong audience", wrong_aud),
        ("wrong issuer", wrong_iss),
        ("forged", forged),
        ("alg none", alg_none),
        ("alg confusion", hs256),
        ("garbage", "a.b.c".into()),
    ] {
        let r = app.get(&bad, "/v1/tenants/acme/models").await;
        assert_eq!((r.status, r.code()), (401, "unauthenticated"), "{what}");
    }
}

#[tokio::test]
async fn tokens_are_refused_before_nbf_and_iat_beyond_the_leeway() {
    let app = TestApp::spawn().await;
    let t = app.tenant("acme").await;
    let token = app.token(&t.viewer).await.expect(200)["access_token"].as_str().unwrap().to_string();
    let good = claims_of(&token);
    assert_eq!(good["nbf"], good["iat"], "issued tokens carry nbf");
    let kid = jsonwebtoken::decode_header(&token).unwrap().kid.unwrap();
    let with = |changes: &[(&str, Value)]| {
        let mut c = good.clone();
        for (k, v) in changes {
            c[*k] = v.clone();
        }
        c
    };
    let (hour, day) = (now() + 3600, now() + 86_400);
    for (what, claims) in [
        ("nbf in an hour", with(&[("nbf", json!(hour))])),
        ("nbf in a day", with(&[("nbf", json!(day))])),
        ("iat in an hour", with(&[("iat", json!(hour))])),
        ("nbf and iat in a day", with(&[("nbf", json!(day)), ("iat", json!(day))])),
    ] {
        let bad = sign_with_server_key(&app, &kid, &claims).await;
        let r = app.get(&bad, "/v1/tenants/acme/models").await;
        assert_eq!((r.status, r.code()), (401, "unauthenticated"), "{what}");
    }

    // A little clock skew is tolerated, and tokens issued before nbf was added stay valid.
    let skewed = with(&[("nbf", json!(now() + 10)), ("iat", json!(now() + 10))]);
    let mut older = good.clone();
    older.as_object_mut().unwrap().remove("nbf");
    for (what, claims) in [("within the leeway", skewed), ("no nbf", older)] {
        let ok = sign_with_server_key(&app, &kid, &claims).await;
        assert_eq!(app.get(&ok, "/v1/tenants/acme/models").await.status, 200, "{what}");
    }
}

#[tokio::test]
async fn rotation_keeps_tokens_in_flight_valid() {
    let app = TestApp::spawn().await;
    let t = app.tenant("acme").await;
    let old = app.token(&t.viewer).await.expect(200)["access_token"].as_str().unwrap().to_string();
    let rotated = app.post(&app.admin_key, "/v1/auth/signing-keys/rotate", &json!({})).await;
    let new_kid = rotated.expect(200)["kid"].as_str().unwrap().to_string();
    let new = app.token(&t.viewer).await.expect(200)["access_token"].as_str().unwrap().to_string();
    let header = jsonwebtoken::decode_header(&new).unwrap();
    assert_eq!(header.kid.as_deref(), Some(new_kid.as_str()));
    assert_ne!(jsonwebtoken::decode_header(&old).unwrap().kid, header.kid);
    app.get(&old, "/v1/tenants/acme/models").await.expect(200);
    app.get(&new, "/v1/tenants/acme/models").await.expect(200);
    let jwks = app.get("", "/.well-known/jwks.json").await;
    assert_eq!(jwks.expect(200)["keys"].as_array().unwrap().len(), 2);
    let audit = app.get(&app.admin_key, "/v1/audit?action=signing_key.rotate").await;
    assert_eq!(audit.expect(200)["events"].as_array().unwrap().len(), 1);
}

#[tokio::test]
async fn keys_are_listed_without_secrets_revoked_and_expire() {
    let app = TestApp::spawn().await;
    let t = app.tenant("acme").await;
    let created = app.post(&t.admin, "/v1/tenants/acme/api-keys", &json!({ "name": "ci", "role": "deployer" })).await;
    let body = created.expect(201).clone();
    let secret = body["key"].as_str().unwrap().to_string();
    let id = body["api_key"]["id"].as_str().unwrap().to_string();
    assert!(secret.starts_with(body["api_key"]["prefix"].as_str().unwrap()));

    let list = app.get(&t.admin, "/v1/tenants/acme/api-keys").await;
    let text = list.expect(200).to_string();
    assert!(!text.contains(&secret), "listing shows no secret");
    assert_eq!(list.body["api_keys"].as_array().unwrap().len(), 5);
    app.create_model(&secret, "acme", "m").await.expect(201);
    let got = app.get(&t.admin, &format!("/v1/tenants/acme/api-keys/{id}")).await;
    assert!(got.expect(200)["last_used_at"].is_string());

    let revoked = app.delete(&t.admin, &format!("/v1/tenants/acme/api-keys/{id}")).await;
    assert!(revoked.expect(200)["revoked_at"].is_string());
    assert_eq!(app.get(&secret, "/v1/tenants/acme/models").await.status, 401);
    assert_eq!(app.token(&secret).await.status, 401);

    let past = app
        .post(
            &t.admin,
            "/v1/tenants/acme/api-keys",
            &json!({ "name": "x", "role": "viewer", "expires_at": "2020-01-01T00:00:00Z" }),
        )
        .await;
    assert_eq!((past.status, past.body["error"]["field"].as_str()), (422, Some("expires_at")));
    let soon = time_in(2);
    let short = app
        .post(&t.admin, "/v1/tenants/acme/api-keys", &json!({ "name": "x", "role": "viewer", "expires_at": soon }))
        .await;
    let short = short.expect(201)["key"].as_str().unwrap().to_string();
    app.get(&short, "/v1/tenants/acme/models").await.expect(200);
    tokio::time::sleep(std::time::Duration::from_millis(2500)).await;
    assert_eq!(app.get(&short, "/v1/tenants/acme/models").await.status, 401);
}

#[tokio::test]
async fn a_key_carries_its_own_limits_which_tenant_admins_change() {
    let app = TestApp::spawn().await;
    let t = app.tenant("acme").await;
    let body = json!({ "name": "batch", "role": "inference", "limits": { "requests_per_second": 20 } });
    let created = app.post(&t.admin, "/v1/tenants/acme/api-keys", &body).await.expect(201).clone();
    let id = created["api_key"]["id"].as_str().unwrap().to_string();
    assert_eq!(created["api_key"]["limits"], json!({ "requests_per_second": 20, "concurrent_requests": 0 }));
    let plain = app.post(&t.admin, "/v1/tenants/acme/api-keys", &json!({ "name": "x", "role": "viewer" })).await;
    assert_eq!(plain.expect(201)["api_key"]["limits"], json!({ "requests_per_second": 0, "concurrent_requests": 0 }));

    let path = format!("/v1/tenants/acme/api-keys/{id}");
    let change = json!({ "limits": { "requests_per_second": 5, "concurrent_requests": 2 } });
    let changed = app.patch(&t.admin, &path, &change).await.expect(200).clone();
    assert_eq!(changed["limits"], change["limits"]);
    assert_eq!(app.get(&t.admin, &path).await.expect(200)["limits"], change["limits"]);
    assert_eq!(app.patch(&t.deployer, &path, &change).await.status, 403, "tenant admins only");
    let unknown = "/v1/tenants/acme/api-keys/00000000-0000-7000-8000-000000000000";
    assert_eq!(app.patch(&t.admin, unknown, &change).await.status, 404);
    for (bad, field) in [
        (json!({ "limits": { "requests_per_second": -1 } }), "limits.requests_per_second"),
        (json!({ "limits": { "concurrent_requests": 2_000_000_000_i64 } }), "limits.concurrent_requests"),
    ] {
        let r = app.patch(&t.admin, &path, &bad).await;
        assert_eq!((r.status, r.body["error"]["field"].as_str()), (422, Some(field)), "{:?}", r.body);
    }
    let r = app.patch(&t.admin, &path, &json!({ "limits": { "rps": 1 } })).await;
    assert_eq!(r.status, 422, "an unknown field is named: {:?}", r.body);
    let bad_create = json!({ "name": "y", "role": "viewer", "limits": { "requests_per_second": -5 } });
    let r = app.post(&t.admin, "/v1/tenants/acme/api-keys", &bad_create).await;
    assert_eq!((r.status, r.body["error"]["field"].as_str()), (422, Some("limits.requests_per_second")));

    let audit = app.get(&t.admin, "/v1/audit?action=api_key.update").await.expect(200).clone();
    let events = audit["events"].as_array().expect("events");
    assert_eq!(events.len(), 1, "{audit:#}");
    assert_eq!(events[0]["before"]["max_requests_per_second"], 20);
    assert_eq!(events[0]["after"]["max_concurrent_requests"], 2);
}

/// RFC 3339 time `secs` from now.
fn time_in(secs: i64) -> String {
    let t = time::OffsetDateTime::now_utc() + time::Duration::seconds(secs);
    t.format(&time::format_description::well_known::Rfc3339).unwrap()
}

#[tokio::test]
async fn first_start_prints_a_platform_admin_key() {
    let app = TestApp::spawn_with(Opts { no_bootstrap_key: true, ..Opts::default() }).await;
    assert!(app.admin_key.starts_with("tsk_"));
    app.create_tenant("acme").await.expect(201);
    let logs = app.stderr.lock().unwrap().join("\n");
    assert!(!logs.contains(&app.admin_key), "the key is not logged");
}
