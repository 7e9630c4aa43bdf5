//! Unpacking Triton model-directory archives (tar, gzipped tar, zip) from the artifact cache,
//! and finding the model inside.
//!
//! Archives are unpacked by hand, entry by entry, and every entry is checked before anything is
//! written: absolute paths, `..` components, symbolic and hard links and special files are
//! refused, as are archives with more than [`MAX_ENTRIES`] entries or more than
//! [`MAX_UNPACKED_BYTES`] of contents. The control plane refused such archives at upload; the
//! worker checks again rather than trust what it downloads.
//!
//! Which directory is the model's and which file is the model is [`tessera_protocol::archive`]'s
//! rule, the one the control plane checked the upload against.

use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};

use tessera_protocol::archive::{self as layout, CONFIG_FILENAME, DEFAULT_MODEL_FILENAME, EntryKind};
use tessera_protocol::inference::ModelConfig;

/// Most entries an archive may have (a model directory has a handful).
pub const MAX_ENTRIES: usize = 10_000;
/// Most bytes an archive may unpack to.
pub const MAX_UNPACKED_BYTES: u64 = 64 << 30;

/// Archive packagings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ArchiveKind {
    /// tar, gzipped or not (told apart by the gzip magic number).
    Tar,
    /// zip.
    Zip,
}

/// A path inside an archive, checked ([`layout::checked_path`]), as a relative path.
pub fn checked_path(raw: &str) -> Result<PathBuf, String> {
    layout::checked_path(raw).map(|parts| parts.iter().collect())
}

/// Writes checked entries under one directory, counting entries and bytes.
struct Unpacker<'a> {
    dest: &'a Path,
    entries: usize,
    bytes: u64,
}

impl Unpacker<'_> {
    fn entry(&mut self, raw: &str, kind: EntryKind, contents: impl Read) -> Result<(), String> {
        self.entries += 1;
        if self.entries > MAX_ENTRIES {
            return Err(format!("the archive has more than {MAX_ENTRIES} entries"));
        }
        let relative = checked_path(raw)?;
        let path = self.dest.join(&relative);
        match kind {
            EntryKind::Link => Err(format!("archive entry '{raw}' is a link; links are not allowed")),
            EntryKind::Other => Err(format!("archive entry '{raw}' is not a regular file or directory")),
            EntryKind::Dir => std::fs::create_dir_all(&path).map_err(|e| format!("cannot create {raw}: {e}")),
            EntryKind::File if relative.as_os_str().is_empty() => Err(format!("archive entry '{raw}' has no name")),
            EntryKind::File => self.file(raw, &path, contents),
        }
    }

    fn file(&mut self, raw: &str, path: &Path, contents: impl Read) -> Result<(), String> {
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(|e| format!("cannot create the directory of {raw}: {e}"))?;
        }
        let mut out = File::create(path).map_err(|e| format!("cannot create {raw}: {e}"))?;
        let left = MAX_UNPACKED_BYTES - self.bytes;
        let written =
            std::io::copy(&mut contents.take(left + 1), &mut out).map_err(|e| format!("cannot unpack {raw}: {e}"))?;
        self.bytes += written;
        if self.bytes > MAX_UNPACKED_BYTES {
            return Err(format!("the archive unpacks to more than {MAX_UNPACKED_BYTES} bytes"));
        }
        Ok(())
    }
}

/// Unpacks `archive` into `dest` (an empty directory). Blocking.
pub fn unpack(kind: ArchiveKind, archive: &Path, dest: &Path) -> Result<(), String> {
    let file = File::open(archive).map_err(|e| format!("cannot open {}: {e}", archive.display()))?;
    let mut unpacker = Unpacker { dest, entries: 0, bytes: 0 };
    match kind {
        ArchiveKind::Tar => unpack_tar(file, &mut unpacker),
        ArchiveKind::Zip => unpack_zip(file, &mut unpacker),
    }
}

fn unreadable(e: impl std::fmt::Display) -> String {
    format!("the archive could not be read: {e}")
}

fn unpack_tar(file: File, unpacker: &mut Unpacker<'_>) -> Result<(), String> {
    let mut buffered = BufReader::with_capacity(64 * 1024, file);
    let gzipped = buffered.fill_buf().map_err(unreadable)?.starts_with(&[0x1f, 0x8b]);
    let reader: Box<dyn Read> =
        if gzipped { Box::new(flate2::bufread::GzDecoder::new(buffered)) } else { Box::new(buffered) };
    let mut archive = tar::Archive::new(reader);
    for entry in archive.entries().map_err(unreadable)? {
        let entry = entry.map_err(unreadable)?;
        let raw = String::from_utf8_lossy(&entry.path_bytes()).into_owned();
        let kind = EntryKind::of_tar(entry.header().entry_type().as_byte());
        unpacker.entry(&raw, kind, entry)?;
    }
    Ok(())
}

fn unpack_zip(file: File, unpacker: &mut Unpacker<'_>) -> Result<(), String> {
    let mut archive = zip::ZipArchive::new(BufReader::new(file)).map_err(unreadable)?;
    for i in 0..archive.len() {
        let entry = archive.by_index(i).map_err(unreadable)?;
        let kind = EntryKind::of_zip(entry.is_symlink(), entry.is_dir(), entry.unix_mode());
        let raw = entry.name().to_string();
        unpacker.entry(&raw, kind, entry)?;
    }
    Ok(())
}

/// The model found in an unpacked archive.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelDir {
    /// The ONNX file to load; for an ensemble, which has none, the model directory.
    pub model_file: PathBuf,
    /// The directory's `config.pbtxt`, if it has one.
    pub config: Option<ModelConfig>,
}

/// Finds the model directory under `root` and, in it, the file for `version`. Blocking.
pub fn find_model(root: &Path, version: i64) -> Result<ModelDir, String> {
    let files = list_files(root)?;
    let model_root = layout::model_root(&files);
    let dir = model_root.iter().fold(root.to_path_buf(), |dir, part| dir.join(part));
    let pbtxt = dir.join(CONFIG_FILENAME);
    let config = if pbtxt.is_file() {
        let text = std::fs::read_to_string(&pbtxt).map_err(|e| format!("cannot read config.pbtxt: {e}"))?;
        Some(tessera_protocol::model_config::from_pbtxt(&text).map_err(|e| format!("invalid config.pbtxt: {e}"))?)
    } else {
        None
    };
    if !layout::needs_model_file(config.as_ref()) {
        return Ok(ModelDir { model_file: dir, config });
    }
    let filename = match &config {
        Some(c) => tessera_protocol::model_config::model_filename(c, DEFAULT_MODEL_FILENAME)?,
        None => DEFAULT_MODEL_FILENAME,
    };
    let relative: Vec<Vec<String>> = files.iter().map(|f| f[model_root.len()..].to_vec()).collect();
    let file = layout::model_file(&layout::model_candidates(&relative), filename, Some(version))?;
    Ok(ModelDir { model_file: file.split('/').fold(dir, |path, part| path.join(part)), config })
}

/// Every regular file under `root`, as path components relative to it, sorted (what an
/// unpacked archive holds: unpacking refused links and special files).
fn list_files(root: &Path) -> Result<Vec<Vec<String>>, String> {
    let mut files = Vec::new();
    let mut dirs = vec![Vec::<String>::new()];
    while let Some(relative) = dirs.pop() {
        let dir = relative.iter().fold(root.to_path_buf(), |dir, part| dir.join(part));
        let read = std::fs::read_dir(&dir).map_err(|e| format!("cannot list {}: {e}", dir.display()))?;
        for entry in read.flatten() {
            let (Ok(name), Ok(kind)) = (entry.file_name().into_string(), entry.file_type()) else { continue };
            let mut path = relative.clone();
            path.push(name);
            if kind.is_dir() {
                dirs.push(path);
            } else if kind.is_file() {
                files.push(path);
            }
        }
    }
    files.sort();
    Ok(files)
}

#[cfg(test)]
pub(crate) mod tests {
    use tessera_protocol::archive::test_support::{gzip, tar_of, zip_of};

    use super::*;

    fn unpack_bytes(kind: ArchiveKind, bytes: &[u8]) -> (tempfile::TempDir, Result<(), String>) {
        let dir = tempfile::tempdir().expect("tempdir");
        let archive = dir.path().join("a");
        std::fs::write(&archive, bytes).expect("write");
        let dest = dir.path().join("out");
        std::fs::create_dir(&dest).expect("mkdir");
        let result = unpack(kind, &archive, &dest);
        (dir, result)
    }

    #[test]
    fn unpacks_every_packaging_and_finds_the_model() {
        let config = b"name: \"x\"\nmax_batch_size: 4\n";
        let files: &[(&str, &[u8])] = &[("m/config.pbtxt", config), ("m/3/model.onnx", b"onnx")];
        let plain = tar_of(files, &[]);
        for (kind, bytes) in [
            (ArchiveKind::Tar, plain.clone()),
            (ArchiveKind::Tar, gzip(&plain)),
            (ArchiveKind::Zip, zip_of(files, &[])),
        ] {
            let (dir, result) = unpack_bytes(kind, &bytes);
            result.expect("unpacks");
            let found = find_model(&dir.path().join("out"), 7).expect("model found");
            assert!(found.model_file.ends_with("m/3/model.onnx"), "{found:?}");
            assert_eq!(found.config.map(|c| c.max_batch_size), Some(4));
        }
    }

    #[test]
    fn refuses_traversal_absolute_paths_and_links() {
        let onnx: &[u8] = b"onnx";
        let cases = [
            (ArchiveKind::Tar, tar_of(&[("m/1/model.onnx", onnx), ("../evil", b"x")], &[]), "'..'"),
            (ArchiveKind::Tar, tar_of(&[("/etc/model.onnx", onnx)], &[]), "absolute path"),
            (ArchiveKind::Tar, tar_of(&[("m/1/model.onnx", onnx)], &[("m/config.pbtxt", "/etc/passwd")]), "link"),
            (ArchiveKind::Zip, zip_of(&[("m/1/model.onnx", onnx)], &[("m/2", "/tmp")]), "link"),
            (ArchiveKind::Zip, zip_of(&[("../x.onnx", onnx)], &[]), "'..'"),
            (ArchiveKind::Tar, b"not a tar at all, just text".repeat(40), "could not be read"),
        ];
        for (kind, bytes, needle) in cases {
            let (dir, result) = unpack_bytes(kind, &bytes);
            let err = result.expect_err(needle);
            assert!(err.contains(needle), "{err}");
            assert!(!dir.path().join("evil").exists() && !dir.path().join("x.onnx").exists());
        }
        assert_eq!(checked_path("./m//1/model.onnx").expect("ok"), PathBuf::from("m/1/model.onnx"));
    }

    #[test]
    fn model_file_preference() {
        let dir = tempfile::tempdir().expect("tempdir");
        let put = |rel: &str| {
            let p = dir.path().join(rel);
            std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
            std::fs::write(p, b"x").expect("write");
        };
        put("1/model.onnx");
        put("2/model.onnx");
        let find = |v| find_model(dir.path(), v).map(|m| m.model_file.strip_prefix(dir.path()).expect("in").to_owned());
        assert_eq!(find(1).expect("exact"), PathBuf::from("1/model.onnx"));
        assert_eq!(find(9).expect("highest"), PathBuf::from("2/model.onnx"));

        let other = tempfile::tempdir().expect("tempdir");
        std::fs::write(other.path().join("resnet.onnx"), b"x").expect("write");
        assert!(find_model(other.path(), 1).expect("only onnx").model_file.ends_with("resnet.onnx"));
        std::fs::write(other.path().join("second.onnx"), b"x").expect("write");
        assert!(find_model(other.path(), 1).expect_err("ambiguous").contains("several .onnx files"));
        let empty = tempfile::tempdir().expect("tempdir");
        assert!(find_model(empty.path(), 1).expect_err("none").contains("no model.onnx"));
        // A config naming a path outside the model (another tenant's cached model) is refused.
        std::fs::write(empty.path().join("config.pbtxt"), "default_model_filename: \"../../t2/m/1/model.onnx\"")
            .expect("write");
        assert!(find_model(empty.path(), 1).expect_err("a path").contains("default_model_filename"));
    }

    #[test]
    fn an_ensemble_needs_no_model_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let model = dir.path().join("pipeline");
        std::fs::create_dir_all(model.join("1")).expect("mkdir");
        std::fs::write(model.join("config.pbtxt"), "platform: \"ensemble\"").expect("write");
        let found = find_model(dir.path(), 1).expect("an ensemble");
        assert_eq!(found.model_file, model);
        assert_eq!(found.config.expect("its config").platform, "ensemble");
    }
}
