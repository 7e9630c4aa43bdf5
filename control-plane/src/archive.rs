//! Triton model-directory archives (tar, gzipped tar, zip): what an uploaded archive holds.
//!
//! The layout accepted is Triton's model directory, either at the archive's root or under one
//! top-level `<model>/` directory: an optional `config.pbtxt`, and at least one `.onnx` file,
//! as `model.onnx` (or any `*.onnx`) next to it or in a numbered `<version>/` directory.
//!
//! Every entry is checked before anything is believed: absolute paths, `..` components,
//! symbolic and hard links and special files are refused (an archive that would write outside
//! the model directory when a worker unpacks it never becomes a version). Inspection reads
//! through any `Read` (`Read + Seek` for zip, whose directory sits at the end): only entry
//! headers and `config.pbtxt` (capped at [`MAX_CONFIG_BYTES`]) are held in memory, never the
//! artifact.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Seek};

use crate::error::{Error, Result};
use crate::types::ArtifactFormat;

/// Largest `config.pbtxt` read.
pub const MAX_CONFIG_BYTES: u64 = 1024 * 1024;
/// Most entries an archive may have (a model directory has a handful).
pub const MAX_ENTRIES: usize = 10_000;

/// What an archive turned out to hold.
#[derive(Debug, Clone, PartialEq)]
pub struct ArchiveManifest {
    /// The model config from `config.pbtxt`, as Triton's JSON, if the archive has one.
    pub config: Option<serde_json::Value>,
    /// The `.onnx` files, relative to the model directory.
    pub onnx_files: Vec<String>,
}

/// What kind of entry an archive holds at a path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum EntryKind {
    File,
    Dir,
    Link,
    Other,
}

fn refuse(message: String) -> Error {
    Error::invalid("body", message)
}

/// A path inside an archive, checked: relative, no `..`, as `/`-separated components.
fn checked_path(raw: &str) -> Result<Vec<String>> {
    if raw.contains('\0') {
        return Err(refuse(format!("archive entry '{}' has a NUL in its name", raw.escape_default())));
    }
    let windows_absolute = raw.len() >= 2 && raw.as_bytes()[1] == b':';
    if raw.starts_with('/') || raw.starts_with('\\') || windows_absolute {
        return Err(refuse(format!("archive entry '{raw}' has an absolute path")));
    }
    let parts: Vec<String> =
        raw.split(['/', '\\']).filter(|p| !p.is_empty() && *p != ".").map(str::to_string).collect();
    if parts.iter().any(|p| p == "..") {
        return Err(refuse(format!("archive entry '{raw}' escapes the model directory (path traversal with '..')")));
    }
    Ok(parts)
}

/// Collects entries as an archive is walked, then finds the model directory in them.
#[derive(Default)]
struct Walk {
    files: Vec<Vec<String>>,
    configs: BTreeMap<Vec<String>, String>,
    entries: usize,
}

impl Walk {
    /// Checks one entry; returns its path when it is a file whose contents are wanted (a
    /// `config.pbtxt` where a model directory's could be).
    fn entry(&mut self, raw: &str, kind: EntryKind) -> Result<Option<Vec<String>>> {
        self.entries += 1;
        if self.entries > MAX_ENTRIES {
            return Err(refuse(format!("the archive has more than {MAX_ENTRIES} entries")));
        }
        let path = checked_path(raw)?;
        match kind {
            EntryKind::Link => return Err(refuse(format!("archive entry '{raw}' is a link; links are not allowed"))),
            EntryKind::Other => {
                return Err(refuse(format!("archive entry '{raw}' is not a regular file or directory")));
            }
            EntryKind::Dir => return Ok(None),
            EntryKind::File => {}
        }
        let wanted = path.len() <= 2 && path.last().is_some_and(|n| n == "config.pbtxt");
        self.files.push(path.clone());
        Ok(wanted.then_some(path))
    }

    fn config_text(&mut self, path: Vec<String>, reader: impl Read) -> Result<()> {
        let mut text = String::new();
        reader
            .take(MAX_CONFIG_BYTES + 1)
            .read_to_string(&mut text)
            .map_err(|e| refuse(format!("config.pbtxt could not be read as UTF-8 text: {e}")))?;
        if text.len() as u64 > MAX_CONFIG_BYTES {
            return Err(refuse(format!("config.pbtxt is larger than {MAX_CONFIG_BYTES} bytes")));
        }
        self.configs.insert(path, text);
        Ok(())
    }

    /// The model directory: the root, or the one top-level directory everything sits in.
    fn finish(mut self) -> Result<ArchiveManifest> {
        let root: Vec<String> = match self.files.first().and_then(|f| f.first()) {
            Some(top) if self.files.iter().all(|f| f.len() > 1 && f[0] == *top) && !is_version(top) => {
                vec![top.clone()]
            }
            _ => Vec::new(),
        };
        let relative = |f: &Vec<String>| f[root.len()..].to_vec();
        let onnx_files: Vec<String> = self
            .files
            .iter()
            .map(relative)
            .filter(|f| match f.as_slice() {
                [name] => name.ends_with(".onnx"),
                [version, name] => is_version(version) && name.ends_with(".onnx"),
                _ => false,
            })
            .map(|f| f.join("/"))
            .collect();
        if onnx_files.is_empty() {
            return Err(refuse(
                "the archive holds no .onnx model file (expected model.onnx or <version>/model.onnx, \
                 at the root or under one <model>/ directory)"
                    .into(),
            ));
        }
        let mut config_path = root;
        config_path.push("config.pbtxt".into());
        let config = match self.configs.remove(&config_path) {
            None => None,
            Some(text) => {
                let parsed = tessera_protocol::model_config::from_pbtxt(&text).map_err(|e| {
                    Error::invalid("config.pbtxt", format!("config.pbtxt is not a valid model config: {e}"))
                })?;
                // Workers join this name to the version directory: a path would reach outside it.
                tessera_protocol::model_config::model_filename(&parsed, "model.onnx")
                    .map_err(|e| Error::invalid("config.pbtxt", e))?;
                Some(tessera_protocol::model_config::to_json_value(&parsed))
            }
        };
        Ok(ArchiveManifest { config, onnx_files })
    }
}

fn is_version(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit())
}

fn unreadable(e: impl std::fmt::Display) -> Error {
    refuse(format!("the archive could not be read: {e}"))
}

/// Inspects an archive of `format` (tar, gzipped tar or zip).
pub fn inspect<R: Read + Seek>(format: ArtifactFormat, reader: R) -> Result<ArchiveManifest> {
    match format {
        ArtifactFormat::Tar => inspect_tar(reader),
        ArtifactFormat::Zip => inspect_zip(reader),
        ArtifactFormat::Onnx => Err(Error::Internal("inspect called on a plain onnx artifact".into())),
    }
}

/// Inspects a tar archive, gzipped or not (told apart by the gzip magic number). A plain tar
/// is walked with seeks over file contents; a gzipped one has to be read through.
pub fn inspect_tar<R: Read + Seek>(reader: R) -> Result<ArchiveManifest> {
    let mut buffered = BufReader::with_capacity(64 * 1024, reader);
    let gzipped = buffered.fill_buf().map_err(unreadable)?.starts_with(&[0x1f, 0x8b]);
    if gzipped {
        let mut archive = tar::Archive::new(flate2::bufread::GzDecoder::new(buffered));
        walk_tar(archive.entries().map_err(unreadable)?)
    } else {
        let mut archive = tar::Archive::new(buffered);
        walk_tar(archive.entries_with_seek().map_err(unreadable)?)
    }
}

fn walk_tar<R: Read>(entries: tar::Entries<'_, R>) -> Result<ArchiveManifest> {
    let mut walk = Walk::default();
    for entry in entries {
        let entry = entry.map_err(unreadable)?;
        let raw = String::from_utf8_lossy(&entry.path_bytes()).into_owned();
        let kind = match entry.header().entry_type() {
            tar::EntryType::Regular | tar::EntryType::Continuous => EntryKind::File,
            tar::EntryType::Directory => EntryKind::Dir,
            tar::EntryType::Symlink | tar::EntryType::Link => EntryKind::Link,
            // pax and GNU long-name headers are folded into the entries they describe.
            _ => EntryKind::Other,
        };
        if let Some(path) = walk.entry(&raw, kind)? {
            walk.config_text(path, entry)?;
        }
    }
    walk.finish()
}

/// Inspects a zip archive through its central directory (what unpackers trust).
pub fn inspect_zip<R: Read + Seek>(reader: R) -> Result<ArchiveManifest> {
    let mut archive = zip::ZipArchive::new(reader).map_err(unreadable)?;
    let mut walk = Walk::default();
    for i in 0..archive.len() {
        let wanted = {
            let file = archive.by_index_raw(i).map_err(unreadable)?;
            let kind = if file.is_symlink() {
                EntryKind::Link
            } else if file.is_dir() {
                EntryKind::Dir
            } else if file.unix_mode().is_some_and(|m| m & 0o170000 != 0 && m & 0o170000 != 0o100000) {
                EntryKind::Other
            } else {
                EntryKind::File
            };
            walk.entry(file.name(), kind)?
        };
        if let Some(path) = wanted {
            let file = archive.by_index(i).map_err(unreadable)?;
            walk.config_text(path, file)?;
        }
    }
    walk.finish()
}

#[cfg(test)]
pub(crate) mod tests {
    use std::io::{Cursor, Write};

    use super::*;

    pub const CONFIG: &str = "name: \"resnet\"\nplatform: \"onnxruntime_onnx\"\nmax_batch_size: 8\n";

    /// A tar of `(path, contents)` files, and `links` as symlinks.
    pub fn tar_of(files: &[(&str, &[u8])], links: &[(&str, &str)]) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        for (path, data) in files {
            let mut h = tar::Header::new_gnu();
            h.set_size(data.len() as u64);
            h.set_mode(0o644);
            h.set_entry_type(tar::EntryType::Regular);
            // set_path refuses '..' and absolute paths: write the name field raw.
            let name = &mut h.as_old_mut().name;
            name[..path.len()].copy_from_slice(path.as_bytes());
            h.set_cksum();
            b.append(&h, *data).unwrap();
        }
        for (path, target) in links {
            let mut h = tar::Header::new_gnu();
            h.set_entry_type(tar::EntryType::Symlink);
            h.set_size(0);
            b.append_link(&mut h, path, target).unwrap();
        }
        b.into_inner().unwrap()
    }

    pub fn gzip(data: &[u8]) -> Vec<u8> {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        e.write_all(data).unwrap();
        e.finish().unwrap()
    }

    /// A zip of `(path, contents)` files, and `links` as symlinks.
    pub fn zip_of(files: &[(&str, &[u8])], links: &[(&str, &str)]) -> Vec<u8> {
        let mut w = zip::ZipWriter::new(Cursor::new(Vec::new()));
        let options = zip::write::SimpleFileOptions::default().compression_method(zip::CompressionMethod::Deflated);
        for (path, data) in files {
            w.start_file(*path, options).unwrap();
            w.write_all(data).unwrap();
        }
        for (path, target) in links {
            w.add_symlink(*path, *target, options).unwrap();
        }
        w.finish().unwrap().into_inner()
    }

    fn tar(files: &[(&str, &[u8])]) -> Result<ArchiveManifest> {
        inspect_tar(Cursor::new(tar_of(files, &[])))
    }

    fn message(r: Result<ArchiveManifest>) -> String {
        match r {
            Err(Error::InvalidInput { message, .. }) => message,
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    #[test]
    fn reads_the_config_in_every_layout_and_packaging() {
        let onnx: &[u8] = &[0x08, 0x07];
        let layouts: [&[(&str, &[u8])]; 3] = [
            &[("resnet/config.pbtxt", CONFIG.as_bytes()), ("resnet/1/model.onnx", onnx)],
            &[("config.pbtxt", CONFIG.as_bytes()), ("1/model.onnx", onnx)],
            &[("config.pbtxt", CONFIG.as_bytes()), ("model.onnx", onnx)],
        ];
        for files in layouts {
            let plain = tar_of(files, &[]);
            for m in [
                inspect_tar(Cursor::new(plain.clone())).unwrap(),
                inspect_tar(Cursor::new(gzip(&plain))).unwrap(),
                inspect_zip(Cursor::new(zip_of(files, &[]))).unwrap(),
            ] {
                let config = m.config.expect("config read");
                assert_eq!((config["name"].as_str(), config["max_batch_size"].as_i64()), (Some("resnet"), Some(8)));
                assert_eq!(m.onnx_files.len(), 1);
            }
        }
        // No config is fine (Triton can complete an ONNX model's).
        assert_eq!(tar(&[("m/1/model.onnx", onnx)]).unwrap().config, None);
    }

    #[test]
    fn refuses_traversal_links_and_archives_without_a_model() {
        let onnx: &[u8] = &[0x08, 0x07];
        assert!(message(tar(&[("m/1/model.onnx", onnx), ("../evil", b"x")])).contains("path traversal"));
        assert!(message(tar(&[("m/../../evil.onnx", onnx)])).contains("path traversal"));
        assert!(message(tar(&[("/etc/model.onnx", onnx)])).contains("absolute path"));
        let linked = tar_of(&[("m/1/model.onnx", onnx)], &[("m/config.pbtxt", "/etc/passwd")]);
        assert!(message(inspect_tar(Cursor::new(linked))).contains("is a link"));
        let zipped = zip_of(&[("m/1/model.onnx", onnx)], &[("m/2", "/tmp")]);
        assert!(message(inspect_zip(Cursor::new(zipped))).contains("is a link"));
        assert!(message(inspect_zip(Cursor::new(zip_of(&[("../x.onnx", onnx)], &[])))).contains("path traversal"));
        assert!(message(tar(&[("m/config.pbtxt", CONFIG.as_bytes())])).contains("no .onnx model file"));
        assert!(message(tar(&[("m/1/sub/model.onnx", onnx)])).contains("no .onnx model file"));
        let bad_config = tar(&[("config.pbtxt", b"max_batch_size: \"many\""), ("model.onnx", onnx)]);
        assert!(matches!(bad_config, Err(Error::InvalidInput { field: Some(f), .. }) if f == "config.pbtxt"));
        let outside =
            tar(&[("config.pbtxt", b"default_model_filename: \"../../t2/m/1/model.onnx\""), ("model.onnx", onnx)]);
        assert!(message(outside).contains("default_model_filename"));
        assert!(
            message(inspect_tar(Cursor::new(b"not a tar at all, just text".repeat(40)))).contains("could not be read")
        );
    }

    #[test]
    fn paths_are_checked() {
        assert_eq!(checked_path("./m/1/model.onnx").unwrap(), ["m", "1", "model.onnx"]);
        for bad in ["/a", "\\a", "C:\\a", "a/../../b", "a\\..\\b", ".."] {
            assert!(checked_path(bad).is_err(), "{bad}");
        }
    }
}
