//! Revocation on the control plane end to end: a revoked key's or disabled user's access tokens
//! are refused at once (401 saying why), and the revocation list goes to gateways (with the route
//! table) and workers (on their session) whole at start and again as soon as it changes. The
//! workers' and gateways' side runs in `tests/python_deploy/test_revocation.py`.

use std::time::Duration;

use futures::SinkExt;
use futures::channel::mpsc;
use serde_json::json;
use tessera_protocol::agent::{AuthenticateKeyRequest, Revocations, RouteTable, WatchRoutesRequest, control_message};

use super::deployments::{TOKEN, client};
use super::{Opts, TestApp};

/// How soon a connected stream must carry a revocation (the bound the README states).
const BOUND: Duration = Duration::from_secs(2);

/// Creates an inference key (of `user_id`, if given); returns (id, secret, token).
async fn key_and_token(app: &TestApp, admin: &str, user_id: Option<&str>) -> (String, String, String) {
    let body = json!({ "name": "app", "role": "inference", "user_id": user_id });
    let created = app.post(admin, "/v1/tenants/acme/api-keys", &body).await.expect(201).clone();
    let secret = created["key"].as_str().expect("a key").to_string();
    let token = app.token(&secret).await.expect(200)["access_token"].as_str().expect("a token").to_string();
    (created["api_key"]["id"].as_str().expect("an id").to_string(), secret, token)
}

fn ids(list: &Revocations) -> (Vec<&str>, Vec<&str>) {
    (list.keys.iter().map(|r| r.id.as_str()).collect(), list.users.iter().map(|r| r.id.as_str()).collect())
}

async fn next_table(routes: &mut tonic::Streaming<RouteTable>) -> RouteTable {
    let next = tokio::time::timeout(BOUND, routes.message()).await.expect("a table within the bound");
    next.expect("the stream holds").expect("not closed")
}

async fn assert_revoked(app: &TestApp, token: &str) {
    let refused = app.get(token, "/v1/whoami").await;
    assert_eq!(refused.status, 401, "{:?}", refused.body);
    let message = refused.body["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("revoked"), "{message}");
}

#[tokio::test]
async fn revoked_keys_and_disabled_users_lose_their_tokens_and_streams_carry_the_list() {
    let app = TestApp::spawn_with(Opts { args: &["--worker-token", TOKEN], ..Opts::default() }).await;
    let t = app.tenant("acme").await;
    let (key_id, key, token) = key_and_token(&app, &t.admin, None).await;
    let (_, _, bystander) = key_and_token(&app, &t.admin, None).await;
    app.get(&token, "/v1/whoami").await.expect(200);
    let mut agent = client(&app, TOKEN).await;
    // Workers learn which key a lookup resolved to: what the list names.
    let found = agent.authenticate_key(AuthenticateKeyRequest { api_key: key.clone() }).await.expect("found");
    assert_eq!(found.into_inner().key_id, key_id);

    let request = WatchRoutesRequest { gateway_id: "gw-1".into(), version: "test".into() };
    let mut routes = agent.watch_routes(request).await.expect("a route stream").into_inner();
    assert_eq!(next_table(&mut routes).await.revocations, Some(Revocations::default()));

    app.delete(&t.admin, &format!("/v1/tenants/acme/api-keys/{key_id}")).await.expect(200);
    assert_revoked(&app, &token).await;
    app.get(&bystander, "/v1/whoami").await.expect(200);
    let list = next_table(&mut routes).await.revocations.expect("a list");
    assert_eq!(ids(&list), (vec![key_id.as_str()], vec![]));

    // A user's tokens go with the user.
    let user = app
        .post(
            &t.admin,
            "/v1/tenants/acme/users",
            &json!({ "email": "ada@example.com", "name": "Ada", "role": "viewer" }),
        )
        .await
        .expect(201)["id"]
        .as_str()
        .expect("an id")
        .to_string();
    let (users_key, _, users_token) = key_and_token(&app, &t.admin, Some(&user)).await;
    app.get(&users_token, "/v1/whoami").await.expect(200);
    app.delete(&t.admin, &format!("/v1/tenants/acme/users/{user}")).await.expect(200);
    assert_revoked(&app, &users_token).await;
    // The user at once (this replica's own change), the user's key with the next registry
    // read (within a second): both within the bound.
    let deadline = tokio::time::Instant::now() + BOUND;
    let mut expected = vec![key_id.as_str(), users_key.as_str()];
    expected.sort_unstable();
    loop {
        let list = tokio::time::timeout_at(deadline, routes.message()).await.expect("the whole list within the bound");
        let list = list.expect("the stream holds").expect("not closed").revocations.expect("a list");
        let (mut keys, users) = ids(&list);
        keys.sort_unstable();
        assert_eq!(users, vec![user.as_str()], "the user is listed from the first table on");
        if keys == expected {
            break;
        }
    }

    // A worker gets the whole list right after registering.
    let (mut tx, rx) = mpsc::channel(4);
    tx.send(super::agent_tokens::registration("w-1")).await.expect("queue register");
    let mut session = agent.session(rx).await.expect("a session").into_inner();
    let mut kinds = Vec::new();
    while kinds.len() < 2 {
        let message = session.message().await.expect("a message").expect("not closed");
        kinds.push(message.kind.expect("a kind"));
    }
    assert!(matches!(kinds[0], control_message::Kind::Registered(_)), "{kinds:?}");
    let control_message::Kind::Revocations(list) = &kinds[1] else { panic!("expected the list second: {kinds:?}") };
    assert_eq!(list.users.len(), 1);
    assert_eq!(list.keys.len(), 2);
}
