//! Validation at upload: a version's signature (inputs, outputs, max batch size, platform) is
//! learned from its ONNX graph and config and shown in the version view; a model no worker could
//! serve (scikit-learn's ZipMap output) or a config that contradicts the graph is refused at
//! upload, naming the tensor, and leaves nothing behind: no object, no version, no model.

use serde_json::json;
use tessera_data_plane::tools::onnx_builder;

use super::{TestApp, zipmap_onnx};

#[tokio::test]
async fn a_zipmap_model_is_refused_at_upload_with_a_hint_and_leaves_no_model() {
    let app = TestApp::spawn().await;
    let t = app.tenant("acme").await;
    let r = app.upload(&t.deployer, "acme", "iris", "?create_model=true", zipmap_onnx()).await;
    assert_eq!((r.status, r.body["error"]["field"].as_str()), (422, Some("body")), "{:?}", r.body);
    let message = r.body["error"]["message"].as_str().unwrap_or_default();
    assert!(message.starts_with("model.onnx: output 'output_probability' is a sequence, not a tensor"), "{message}");
    assert!(message.contains("options={id(model): {'zipmap': False}}"), "{message}");
    assert_eq!(app.get(&t.viewer, "/v1/tenants/acme/models/iris").await.status, 404, "no empty model");
    let models = app.get(&t.viewer, "/v1/tenants/acme/models").await;
    assert_eq!(models.expect(200)["models"], json!([]));
    assert_eq!(app.stored_files(), 0, "no object either");

    // Uploaded to a model that exists: refused the same way, no version.
    app.create_model(&t.deployer, "acme", "iris").await.expect(201);
    let r = app.upload(&t.deployer, "acme", "iris", "", zipmap_onnx()).await;
    assert_eq!(r.status, 422);
    let versions = app.get(&t.viewer, "/v1/tenants/acme/models/iris/versions").await;
    assert_eq!(versions.expect(200)["versions"], json!([]));
    // Without create_model an unknown model is still not found.
    let r = app.upload(&t.deployer, "acme", "nope", "", onnx_builder::simple()).await;
    assert_eq!((r.status, r.code()), (404, "not_found"));
    assert_eq!(app.stored_files(), 0);
}

#[tokio::test]
async fn the_version_view_shows_the_signature_and_configs_must_match_the_graph() {
    let app = TestApp::spawn().await;
    let t = app.tenant("acme").await;
    let upload = |config: Option<serde_json::Value>, model: &'static str| {
        let path = format!("{}/v1/tenants/acme/models/{model}/versions?create_model=true", app.url);
        let mut req = app
            .client
            .post(path)
            .bearer_auth(&t.deployer)
            .header("content-type", "application/octet-stream")
            .body(onnx_builder::simple());
        if let Some(c) = config {
            req = req.header("x-model-config", c.to_string());
        }
        app.raw(req)
    };
    // Contradicting configs are refused naming the tensor, blaming the config.
    let wrong_type = json!({ "max_batch_size": 8, "input": [
        { "name": "INPUT0", "data_type": "TYPE_FP32", "dims": [16] },
        { "name": "INPUT1", "data_type": "TYPE_INT32", "dims": [16] }] });
    let r = upload(Some(wrong_type), "simple").await;
    assert_eq!((r.status, r.body["error"]["field"].as_str()), (422, Some("X-Model-Config")), "{:?}", r.body);
    let message = r.body["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("input 'INPUT0' is TYPE_FP32 in the config but TYPE_INT32 in the model"), "{message}");
    let unknown = json!({ "output": [{ "name": "SUM", "data_type": "TYPE_INT32", "dims": [16] }] });
    let r = upload(Some(unknown), "simple").await;
    let message = r.body["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("output 'SUM' is not an output of the model"), "{message}");
    assert_eq!(app.get(&t.viewer, "/v1/tenants/acme/models/simple").await.status, 404);
    assert_eq!(app.stored_files(), 0);

    // A model created by its first upload, with the signature worked out as a worker will.
    let v = upload(Some(json!({ "max_batch_size": 8 })), "simple").await;
    let v = v.expect(201);
    let int32 = |name: &str| json!({ "name": name, "datatype": "INT32", "shape": [-1, 16] });
    let expected = json!({
        "inputs": [int32("INPUT0"), int32("INPUT1")],
        "outputs": [int32("OUTPUT0"), int32("OUTPUT1")],
        "max_batch_size": 8,
        "platform": "onnxruntime_onnx",
    });
    assert_eq!(v["signature"], expected);
    assert_eq!(v["status"], "uploaded");
    let got = app.get(&t.viewer, "/v1/tenants/acme/models/simple/versions/1").await;
    assert_eq!(got.expect(200)["signature"], expected);
    let listed = app.get(&t.viewer, "/v1/tenants/acme/models/simple/versions").await;
    assert_eq!(listed.expect(200)["versions"][0]["signature"], expected);
    let model = app.get(&t.viewer, "/v1/tenants/acme/models/simple").await;
    assert_eq!(model.expect(200)["latest_version"], 1);
    // create_model on a model that exists just adds a version; no config: Triton's default batch.
    let v2 = upload(None, "simple").await;
    assert_eq!(v2.expect(201)["version"], 2);
    assert_eq!(v2.body["signature"]["max_batch_size"], 4);
}
