//! Model-directory archives as the control plane inspects uploads (tar, gzipped tar, zip).
//!
//! Input: a selector byte (even: tar or tar.gz, odd: zip), then the archive. What the control
//! plane accepts must name only `.onnx` files inside the model directory, carry a config that
//! passes its own check again from its stored JSON, and unpack on a worker, which checks every
//! entry again rather than trust the upload, and finds the model in it.

use std::io::Cursor;

use tessera_control_plane::archive::{ArchiveLimits, ArchiveManifest, inspect_tar, inspect_zip};
use tessera_data_plane::worker::archive::{ArchiveKind, find_model, unpack};

/// Limits far below the defaults, so a bomb costs the fuzzer a megabyte, not gigabytes.
const LIMITS: ArchiveLimits = ArchiveLimits { max_entries: 64, max_expanded_bytes: 1 << 20, max_expansion_ratio: 16 };

/// Inspects `data` as an uploaded archive.
pub fn run(data: &[u8]) {
    let Some((selector, archive)) = data.split_first() else { return };
    let size = archive.len() as u64;
    let (kind, inspected) = if selector & 1 == 0 {
        (ArchiveKind::Tar, inspect_tar(archive, size, LIMITS))
    } else {
        (ArchiveKind::Zip, inspect_zip(Cursor::new(archive), size, LIMITS))
    };
    let Ok(manifest) = inspected else { return };
    check_manifest(&manifest);
    let dir = tempfile::tempdir().expect("a temporary directory");
    let file = dir.path().join("archive");
    std::fs::write(&file, archive).expect("write the archive");
    let dest = dir.path().join("model");
    if let Err(e) = unpack(kind, &file, &dest) {
        panic!("the control plane accepted an archive that a worker refuses to unpack: {e}");
    }
    if let Err(e) = find_model(&dest, 1) {
        panic!("the control plane accepted an archive in which a worker finds no model: {e}");
    }
}

fn check_manifest(manifest: &ArchiveManifest) {
    assert!(!manifest.onnx_files.is_empty(), "an accepted archive holds a model");
    for file in &manifest.onnx_files {
        let parts: Vec<&str> = file.split('/').collect();
        assert!(file.ends_with(".onnx") && parts.len() <= 2, "model file '{file}'");
        assert!(parts.iter().all(|p| !p.is_empty() && *p != "." && *p != ".." && !p.contains('\\')), "'{file}'");
    }
    if let Some(config) = &manifest.config {
        tessera_control_plane::model_config::check_json("config", config)
            .expect("a stored config passes its check again");
    }
}
