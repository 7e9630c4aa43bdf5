//! TLS on the control plane with a certificate the test makes: the CLI logs in over https
//! trusting the test CA (`--ca-cert`), the other verbs use the CA login saved, a client that
//! does not trust it is refused, and a key that is not the certificate's fails the start
//! naming both files.

use std::path::Path;
use std::process::{Command, Output};

use tessera_protocol::tls::local;

use super::{Opts, TestApp};

/// The CLI with its own config file and no connection variables from the environment.
fn cli(config: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args(args)
        .env("TESSERA_CONFIG", config)
        .env_remove("TESSERA_URL")
        .env_remove("TESSERA_API_KEY")
        .env_remove("TESSERA_TENANT")
        .env_remove("TESSERA_CA_CERT")
        .output()
        .expect("run tessera")
}

fn text(out: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

#[tokio::test(flavor = "multi_thread")]
async fn the_cli_reaches_an_https_control_plane_trusting_the_test_ca() {
    let certs = tempfile::tempdir().expect("tempdir");
    let files = local::make(certs.path(), &["localhost", "127.0.0.1"]).expect("certificate");
    let (cert, key) = (files.pair.cert.to_str().expect("utf-8"), files.pair.key.to_str().expect("utf-8"));
    let app = TestApp::spawn_with(Opts { args: &["--tls-cert", cert, "--tls-key", key], ..Opts::default() }).await;
    let url = app.url.replacen("http://", "https://", 1);
    let config = certs.path().join("cli/config.json");

    let refused = cli(&config, &["login", "--url", &url, "--key", &app.admin_key]);
    assert!(!refused.status.success(), "the test CA is not trusted without --ca-cert");
    assert!(text(&refused).contains("certificate"), "{}", text(&refused));

    let ca = files.ca.to_str().expect("utf-8");
    let login = cli(&config, &["login", "--url", &url, "--key", &app.admin_key, "--ca-cert", ca]);
    assert!(login.status.success(), "{}", text(&login));
    assert!(text(&login).contains(&format!("logged in to {url}")), "{}", text(&login));
    // The next verb trusts the CA login saved.
    let list = cli(&config, &["deployments", "list"]);
    assert!(list.status.success(), "{}", text(&list));

    // Plain HTTP on the TLS port gets no answer.
    let plain = reqwest::Client::new().get(format!("{}/v1/tenants", app.url)).send().await;
    assert!(plain.is_err() || !plain.expect("answer").status().is_success());
}

#[test]
fn a_key_that_is_not_the_certificates_fails_the_start_naming_both_files() {
    let dir = tempfile::tempdir().expect("tempdir");
    let one = local::make(&dir.path().join("one"), &["localhost"]).expect("certificate");
    let other = local::make(&dir.path().join("other"), &["localhost"]).expect("certificate");
    let database = format!("sqlite://{}", dir.path().join("registry.db").display());
    let out = Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args(["control-plane", "--listen", "127.0.0.1:0", "--database-url", &database])
        .arg("--tls-cert")
        .arg(&one.pair.cert)
        .arg("--tls-key")
        .arg(&other.pair.key)
        .output()
        .expect("run tessera");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("do not make a usable pair"), "{stderr}");
    assert!(stderr.contains(&one.pair.cert.display().to_string()), "{stderr}");
    assert!(stderr.contains(&other.pair.key.display().to_string()), "{stderr}");

    let alone = Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args(["control-plane", "--listen", "127.0.0.1:0", "--database-url", &database])
        .arg("--tls-cert")
        .arg(&one.pair.cert)
        .output()
        .expect("run tessera");
    assert!(!alone.status.success());
    assert!(String::from_utf8_lossy(&alone.stderr).contains("--tls-key"), "both or neither");
}
