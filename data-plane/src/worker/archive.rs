//! Unpacking Triton model-directory archives (tar, gzipped tar, zip) from the artifact cache,
//! and finding the model inside.
//!
//! Archives are unpacked by hand, entry by entry, and every entry is checked before anything is
//! written: absolute paths, `..` components, symbolic and hard links and special files are
//! refused, as are archives with more than [`MAX_ENTRIES`] entries or more than
//! [`MAX_UNPACKED_BYTES`] of contents. The control plane refused such archives at upload; the
//! worker checks again rather than trust what it downloads.
//!
//! The model directory is the archive's root, or the one non-numeric top-level directory
//! everything sits in; it may hold `config.pbtxt` and the model as `<version>/model.onnx`,
//! `model.onnx`, or a single `*.onnx` file.

use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};

use tessera_protocol::inference::ModelConfig;

use crate::engine::repository::{DEFAULT_MODEL_FILENAME, version_of_dir};

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

/// A path inside an archive, checked: relative, no `..`, no drive letters or NULs.
pub fn checked_path(raw: &str) -> Result<PathBuf, String> {
    if raw.contains('\0') {
        return Err(format!("archive entry '{}' has a NUL in its name", raw.escape_default()));
    }
    let windows_absolute = raw.len() >= 2 && raw.as_bytes()[1] == b':';
    if raw.starts_with('/') || raw.starts_with('\\') || windows_absolute {
        return Err(format!("archive entry '{raw}' has an absolute path"));
    }
    let parts: Vec<&str> = raw.split(['/', '\\']).filter(|p| !p.is_empty() && *p != ".").collect();
    if parts.contains(&"..") {
        return Err(format!("archive entry '{raw}' escapes the model directory ('..')"));
    }
    Ok(parts.iter().collect())
}

/// What an archive entry is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum EntryKind {
    File,
    Dir,
    Link,
    Other,
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
        let kind = match entry.header().entry_type() {
            tar::EntryType::Regular | tar::EntryType::Continuous => EntryKind::File,
            tar::EntryType::Directory => EntryKind::Dir,
            tar::EntryType::Symlink | tar::EntryType::Link => EntryKind::Link,
            // Long names and pax attributes are folded into the entries they describe.
            _ => EntryKind::Other,
        };
        unpacker.entry(&raw, kind, entry)?;
    }
    Ok(())
}

fn unpack_zip(file: File, unpacker: &mut Unpacker<'_>) -> Result<(), String> {
    let mut archive = zip::ZipArchive::new(BufReader::new(file)).map_err(unreadable)?;
    for i in 0..archive.len() {
        let entry = archive.by_index(i).map_err(unreadable)?;
        let kind = if entry.is_symlink() {
            EntryKind::Link
        } else if entry.is_dir() {
            EntryKind::Dir
        } else if entry.unix_mode().is_some_and(|m| m & 0o170000 != 0 && m & 0o170000 != 0o100000) {
            EntryKind::Other
        } else {
            EntryKind::File
        };
        let raw = entry.name().to_string();
        unpacker.entry(&raw, kind, entry)?;
    }
    Ok(())
}

/// The model found in an unpacked archive.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelDir {
    /// The ONNX file to load.
    pub model_file: PathBuf,
    /// The directory's `config.pbtxt`, if it has one.
    pub config: Option<ModelConfig>,
}

/// Finds the model directory under `root` and, in it, the file for `version`. Blocking.
pub fn find_model(root: &Path, version: i64) -> Result<ModelDir, String> {
    let dir = model_dir(root)?;
    let pbtxt = dir.join("config.pbtxt");
    let config = if pbtxt.is_file() {
        let text = std::fs::read_to_string(&pbtxt).map_err(|e| format!("cannot read config.pbtxt: {e}"))?;
        Some(tessera_protocol::model_config::from_pbtxt(&text).map_err(|e| format!("invalid config.pbtxt: {e}"))?)
    } else {
        None
    };
    let filename = match &config {
        Some(c) => tessera_protocol::model_config::model_filename(c, DEFAULT_MODEL_FILENAME)?,
        None => DEFAULT_MODEL_FILENAME,
    };
    let model_file = model_file(&dir, version, filename)?;
    Ok(ModelDir { model_file, config })
}

/// The root, or the one non-numeric directory everything sits in (`<model>/...`).
fn model_dir(root: &Path) -> Result<PathBuf, String> {
    let entries = list(root)?;
    match entries.as_slice() {
        [(name, true)] if version_of_dir(name).is_none() => Ok(root.join(name)),
        _ => Ok(root.to_path_buf()),
    }
}

/// Names in a directory with whether each is a directory, sorted.
fn list(dir: &Path) -> Result<Vec<(String, bool)>, String> {
    let read = std::fs::read_dir(dir).map_err(|e| format!("cannot list {}: {e}", dir.display()))?;
    let mut names: Vec<(String, bool)> = read
        .flatten()
        .filter_map(|e| Some((e.file_name().into_string().ok()?, e.file_type().ok()?.is_dir())))
        .collect();
    names.sort();
    Ok(names)
}

/// In order: `<version>/<filename>`, the highest `<n>/<filename>`, `<filename>`, the only
/// `*.onnx` at the root or in a version directory.
fn model_file(dir: &Path, version: i64, filename: &str) -> Result<PathBuf, String> {
    let exact = dir.join(version.to_string()).join(filename);
    if exact.is_file() {
        return Ok(exact);
    }
    let entries = list(dir)?;
    let mut versions: Vec<i64> = entries.iter().filter(|(_, d)| *d).filter_map(|(n, _)| version_of_dir(n)).collect();
    versions.sort_unstable();
    if let Some(v) = versions.iter().rev().find(|v| dir.join(v.to_string()).join(filename).is_file()) {
        return Ok(dir.join(v.to_string()).join(filename));
    }
    if dir.join(filename).is_file() {
        return Ok(dir.join(filename));
    }
    let mut onnx: Vec<PathBuf> =
        entries.iter().filter(|(n, d)| !*d && n.ends_with(".onnx")).map(|(n, _)| dir.join(n)).collect();
    for v in &versions {
        let sub = dir.join(v.to_string());
        onnx.extend(list(&sub)?.into_iter().filter(|(n, d)| !*d && n.ends_with(".onnx")).map(|(n, _)| sub.join(n)));
    }
    match onnx.as_slice() {
        [only] => Ok(only.clone()),
        [] => Err(format!("the archive holds no {filename} (nor any .onnx file)")),
        _ => Err(format!("the archive holds several .onnx files and no {version}/{filename}")),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::io::{Cursor, Write};

    use super::*;

    /// A tar of `(path, contents)` files (names written raw, so `..` and `/x` can be tested)
    /// and `links` as symlinks.
    pub fn tar_of(files: &[(&str, &[u8])], links: &[(&str, &str)]) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        for (path, data) in files {
            let mut h = tar::Header::new_gnu();
            h.set_size(data.len() as u64);
            h.set_mode(0o644);
            h.set_entry_type(tar::EntryType::Regular);
            h.as_old_mut().name[..path.len()].copy_from_slice(path.as_bytes());
            h.set_cksum();
            b.append(&h, *data).expect("append");
        }
        for (path, target) in links {
            let mut h = tar::Header::new_gnu();
            h.set_entry_type(tar::EntryType::Symlink);
            h.set_size(0);
            b.append_link(&mut h, path, target).expect("link");
        }
        b.into_inner().expect("tar")
    }

    pub fn gzip(data: &[u8]) -> Vec<u8> {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        e.write_all(data).expect("gzip");
        e.finish().expect("gzip")
    }

    pub fn zip_of(files: &[(&str, &[u8])], links: &[(&str, &str)]) -> Vec<u8> {
        let mut w = zip::ZipWriter::new(Cursor::new(Vec::new()));
        let options = zip::write::SimpleFileOptions::default().compression_method(zip::CompressionMethod::Deflated);
        for (path, data) in files {
            w.start_file(*path, options).expect("zip entry");
            w.write_all(data).expect("zip write");
        }
        for (path, target) in links {
            w.add_symlink(*path, *target, options).expect("zip link");
        }
        w.finish().expect("zip").into_inner()
    }

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
        for bad in ["/a", "\\a", "C:\\a", "a/../../b", "a\\..\\b", "..", "a\0b"] {
            assert!(checked_path(bad).is_err(), "{bad}");
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
        assert!(find_model(other.path(), 1).expect_err("ambiguous").contains("several"));
        let empty = tempfile::tempdir().expect("tempdir");
        assert!(find_model(empty.path(), 1).expect_err("none").contains("no model.onnx"));
        // A config naming a path outside the model (another tenant's cached model) is refused.
        std::fs::write(empty.path().join("config.pbtxt"), "default_model_filename: \"../../t2/m/1/model.onnx\"")
            .expect("write");
        assert!(find_model(empty.path(), 1).expect_err("a path").contains("default_model_filename"));
    }
}
