//! Triton model-directory archives: a tar (gzipped or not) or zip upload becomes a version
//! with the config read from its `config.pbtxt`; archives with path traversal, links, no
//! `.onnx` file, an `.onnx` file that is not a model, a truncated end, or more content than
//! the expansion limits allow (a gzip bomb) are refused with a 422 naming the problem, and
//! leave nothing behind.

use serde_json::json;
use tessera_protocol::archive::test_support::{gzip, tar_of, zip_of};

use super::{TestApp, onnx_bytes};

const CONFIG: &str = "name: \"resnet\"\nplatform: \"onnxruntime_onnx\"\nmax_batch_size: 8\n\
                      input [ { name: \"x\" data_type: TYPE_FP32 dims: [ 3 ] } ]\n";

#[tokio::test]
async fn archives_become_versions_with_their_config() {
    let app = TestApp::spawn().await;
    let t = app.tenant("acme").await;
    app.create_model(&t.deployer, "acme", "resnet").await.expect(201);
    let onnx = onnx_bytes(64 * 1024);
    let nested: &[(&str, &[u8])] = &[("resnet/config.pbtxt", CONFIG.as_bytes()), ("resnet/1/model.onnx", &onnx)];
    let flat: &[(&str, &[u8])] = &[("config.pbtxt", CONFIG.as_bytes()), ("model.onnx", &onnx)];
    let uploads = [
        ("?format=tar", tar_of(nested, &[])),
        ("?format=tar", gzip(&tar_of(flat, &[]))),
        ("?format=zip", zip_of(nested, &[])),
        ("?format=zip", zip_of(flat, &[])),
    ];
    for (n, (query, body)) in uploads.into_iter().enumerate() {
        let v = app.upload(&t.deployer, "acme", "resnet", query, body).await;
        let v = v.expect(201);
        assert_eq!(v["version"], json!(n + 1));
        assert_eq!((v["config"]["name"].as_str(), v["config"]["max_batch_size"].as_i64()), (Some("resnet"), Some(8)));
        assert_eq!(v["config"]["input"][0]["data_type"], "TYPE_FP32");
    }
    // A config comes from the archive or from the client, not both.
    let req = app
        .client
        .post(format!("{}/v1/tenants/acme/models/resnet/versions?format=tar", app.url))
        .bearer_auth(&t.deployer)
        .header("x-model-config", r#"{"max_batch_size": 1}"#)
        .body(tar_of(nested, &[]));
    let r = app.raw(req).await;
    assert_eq!((r.status, r.body["error"]["field"].as_str()), (422, Some("config")));
    // Without a config.pbtxt, the client's is kept.
    let req = app
        .client
        .post(format!("{}/v1/tenants/acme/models/resnet/versions?format=zip", app.url))
        .bearer_auth(&t.deployer)
        .header("x-model-config", r#"{"max_batch_size": 1}"#)
        .body(zip_of(&[("1/model.onnx", &onnx)], &[]));
    assert_eq!(app.raw(req).await.expect(201)["config"], json!({ "max_batch_size": 1 }));
    assert_eq!(app.stored_files(), 5);
}

/// Accepted at upload means loads on a worker: the control plane's inspection and a worker's
/// unpacking and model finder agree on every layout, several `.onnx` files at the root included.
#[test]
fn an_archive_accepted_at_upload_is_one_a_worker_finds_its_model_in() {
    use tessera_control_plane::archive::{ArchiveLimits, inspect_tar};
    use tessera_data_plane::worker::archive::{ArchiveKind, find_model, unpack};

    let onnx = onnx_bytes(16);
    let m: &[u8] = &onnx;
    let named: &[u8] = b"default_model_filename: \"b.onnx\"";
    let layouts: [&[(&str, &[u8])]; 9] = [
        &[("m/config.pbtxt", CONFIG.as_bytes()), ("m/1/model.onnx", m)],
        &[("model.onnx", m)],
        &[("net.onnx", m)],
        &[("a.onnx", m), ("b.onnx", m)],
        &[("m/a.onnx", m), ("m/b.onnx", m)],
        &[("1/a.onnx", m), ("2/b.onnx", m)],
        &[("1/model.onnx", m), ("2/model.onnx", m), ("x.onnx", m)],
        &[("config.pbtxt", named), ("a.onnx", m), ("b.onnx", m)],
        &[("01/model.onnx", m)],
    ];
    let limits = ArchiveLimits::for_upload_cap(1 << 30);
    for files in layouts {
        let tar = tar_of(files, &[]);
        let accepted = inspect_tar(&tar[..], tar.len() as u64, limits);
        let dir = tempfile::tempdir().expect("a temporary directory");
        let (archive, dest) = (dir.path().join("a.tar"), dir.path().join("model"));
        std::fs::write(&archive, &tar).expect("write the archive");
        std::fs::create_dir(&dest).expect("make the model directory");
        unpack(ArchiveKind::Tar, &archive, &dest).expect("a worker unpacks it");
        for version in [1, 2, 7] {
            let found = find_model(&dest, version);
            assert_eq!(accepted.is_ok(), found.is_ok(), "{files:?} v{version}: {accepted:?} / {found:?}");
            if let (Ok(manifest), Ok(found)) = (&accepted, &found)
                && version == 7
            {
                let (file, _) = manifest.model.as_ref().expect("an accepted archive names its model");
                assert!(found.model_file.ends_with(file), "{files:?}: {file} / {found:?}");
            }
        }
    }
}

#[tokio::test]
async fn unsafe_or_incomplete_archives_are_refused_and_leave_nothing() {
    let app = TestApp::spawn().await;
    let t = app.tenant("acme").await;
    app.create_model(&t.deployer, "acme", "m").await.expect(201);
    let onnx = onnx_bytes(1024);
    let model: (&str, &[u8]) = ("m/1/model.onnx", &onnx);
    let refused = [
        ("tar", tar_of(&[model, ("m/../../etc/cron.d/x", b"x")], &[]), "path traversal"),
        ("tar", gzip(&tar_of(&[model, ("/etc/passwd", b"x")], &[])), "absolute path"),
        ("tar", tar_of(&[model], &[("m/config.pbtxt", "/etc/passwd")]), "is a link"),
        ("zip", zip_of(&[model, ("../../x", b"x")], &[]), "path traversal"),
        ("zip", zip_of(&[model], &[("m/2", "/")]), "is a link"),
        ("tar", tar_of(&[("m/config.pbtxt", CONFIG.as_bytes())], &[]), "no .onnx model file"),
        ("zip", zip_of(&[("m/README", b"hello")], &[]), "no .onnx model file"),
        ("tar", gzip(b"this is not a tar"), "could not be read"),
        // No worker could choose among them: refused here, not at every load.
        ("tar", tar_of(&[("m/a.onnx", &onnx), ("m/b.onnx", &onnx)], &[]), "several .onnx files"),
    ];
    for (format, body, problem) in refused {
        let r = app.upload(&t.deployer, "acme", "m", &format!("?format={format}"), body).await;
        let message = r.body["error"]["message"].as_str().unwrap_or("").to_string();
        assert_eq!(r.status, 422, "{format} ({problem}): {:?}", r.body);
        assert!(message.contains(problem), "{format}: '{message}' should name '{problem}'");
    }
    let bad_config = tar_of(&[("m/config.pbtxt", b"max_batch_size: \"lots\""), model], &[]);
    let r = app.upload(&t.deployer, "acme", "m", "?format=tar", bad_config).await;
    assert_eq!((r.status, r.body["error"]["field"].as_str()), (422, Some("config.pbtxt")));
    assert_eq!(app.stored_files(), 0, "refused archives leave nothing behind");
    let versions = app.get(&t.viewer, "/v1/tenants/acme/models/m/versions").await;
    assert_eq!(versions.expect(200)["versions"].as_array().unwrap().len(), 0);
}

/// Raw deflate of `input` from a fresh compressor: a full flush (byte-aligned, nothing
/// referred to across it, so copies can be concatenated) or the stream's final block.
fn deflate_part(input: &[u8], finish: bool) -> Vec<u8> {
    use flate2::{Compress, Compression, FlushCompress, Status};
    let flush = if finish { FlushCompress::Finish } else { FlushCompress::Full };
    let mut c = Compress::new(Compression::best(), false);
    let mut out = Vec::new();
    loop {
        out.reserve(1 << 20);
        let consumed = c.total_in() as usize;
        let status = c.compress_vec(&input[consumed..], &mut out, flush).expect("deflate");
        let all_in = c.total_in() as usize == input.len();
        if (finish && status == Status::StreamEnd) || (!finish && all_in && out.len() < out.capacity()) {
            return out;
        }
    }
}

fn tar_header(path: &str, size: u64) -> Vec<u8> {
    let mut h = tar::Header::new_gnu();
    h.set_path(path).unwrap();
    h.set_size(size);
    h.set_mode(0o644);
    h.set_entry_type(tar::EntryType::Regular);
    h.set_cksum();
    h.as_bytes().to_vec()
}

/// A valid gzipped tar (a model, then `m/1/weights.bin` of 1 GiB of zeros) built without
/// compressing 1 GiB: one megabyte of zeros is deflated once and its block repeated.
fn gzip_bomb(model: &[u8]) -> Vec<u8> {
    const MIB: usize = 1 << 20;
    const COPIES: usize = 1024;
    let mut head = tar_header("m/1/model.onnx", model.len() as u64);
    head.extend_from_slice(model);
    head.resize(head.len().div_ceil(512) * 512, 0);
    head.extend_from_slice(&tar_header("m/1/weights.bin", (COPIES * MIB) as u64));
    let zeros = vec![0u8; MIB];
    let tail = vec![0u8; 1024];

    let mut gz = vec![0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 0xff];
    gz.extend_from_slice(&deflate_part(&head, false));
    let block = deflate_part(&zeros, false);
    for _ in 0..COPIES {
        gz.extend_from_slice(&block);
    }
    gz.extend_from_slice(&deflate_part(&tail, true));
    let mut crc = flate2::Crc::new();
    crc.update(&head);
    let mut zeros_crc = flate2::Crc::new();
    zeros_crc.update(&zeros);
    for _ in 0..COPIES {
        crc.combine(&zeros_crc);
    }
    let mut tail_crc = flate2::Crc::new();
    tail_crc.update(&tail);
    crc.combine(&tail_crc);
    gz.extend_from_slice(&crc.sum().to_le_bytes());
    gz.extend_from_slice(&crc.amount().to_le_bytes());
    gz
}

#[tokio::test]
async fn truncated_archives_bad_models_and_bombs_are_refused() {
    let app = TestApp::spawn().await;
    let t = app.tenant("acme").await;
    app.create_model(&t.deployer, "acme", "m").await.expect(201);
    let onnx = onnx_bytes(64 * 1024);
    let whole = tar_of(&[("m/config.pbtxt", CONFIG.as_bytes()), ("m/1/model.onnx", &onnx)], &[]);
    let cut = whole[..whole.len() / 2].to_vec();
    let fake: &[u8] = &[0x08, 0x07, b'h', b'i'];
    let bomb = gzip_bomb(&onnx);
    assert!(bomb.len() < 8 << 20, "the bomb is small: {} bytes", bomb.len());
    let refused = [
        ("tar", cut.clone(), "truncated"),
        ("tar", gzip(&cut), "truncated"),
        ("tar", whole[..whole.len() - 1024].to_vec(), "end-of-archive marker"),
        ("tar", tar_of(&[("m/1/model.onnx", fake)], &[]), "'m/1/model.onnx' is not a valid ONNX model"),
        ("zip", zip_of(&[("1/model.onnx", &onnx[..20])], &[]), "not a valid ONNX model: truncated at byte 20"),
        ("tar", bomb, "the archive expands to more than"),
    ];
    for (format, body, problem) in refused {
        let started = std::time::Instant::now();
        let r = app.upload(&t.deployer, "acme", "m", &format!("?format={format}"), body).await;
        let message = r.body["error"]["message"].as_str().unwrap_or("").to_string();
        assert_eq!(r.status, 422, "{format} ({problem}): {:?}", r.body);
        assert!(message.contains(problem), "{format}: '{message}' should name '{problem}'");
        assert!(started.elapsed() < std::time::Duration::from_secs(20), "{problem}: refused promptly");
    }
    assert_eq!(app.stored_files(), 0, "refused archives leave nothing behind");
    app.upload(&t.deployer, "acme", "m", "?format=tar", gzip(&whole)).await.expect(201);
}
