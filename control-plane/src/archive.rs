//! Triton model-directory archives (tar, gzipped tar, zip): what an uploaded archive holds.
//!
//! The layout accepted is Triton's model directory, either at the archive's root or under one
//! top-level `<model>/` directory: an optional `config.pbtxt`, and the model as `model.onnx`
//! (or the only `*.onnx`) next to it or in a numbered `<version>/` directory. Which directory
//! and which file are [`tessera_protocol::archive`]'s rule, the one a worker finds the model
//! by, so an archive accepted here loads on every worker.
//!
//! Every entry is checked before anything is believed: absolute paths, `..` components,
//! symbolic and hard links and special files are refused (an archive that would write outside
//! the model directory when a worker unpacks it never becomes a version). The archive is read
//! to its end: every `.onnx` file in it must be a well-formed ONNX model ([`crate::onnx`]),
//! every entry must hold the bytes its header promises, a tar must end with its end-of-archive
//! marker and a gzip stream with its checksum, so a truncated archive is refused. What the
//! archive expands to is bounded by [`ArchiveLimits`] (entries, and bytes in all and per byte
//! of archive), checked against the sizes entries declare before their data is read, so a
//! gzip or zip bomb is refused without being inflated. Inspection reads through any `Read`
//! (`Read + Seek` for zip, whose directory sits at the end): only entry headers and
//! `config.pbtxt` (capped at [`MAX_CONFIG_BYTES`]) are held in memory, never the artifact.

use std::cell::Cell;
use std::collections::{BTreeMap, BTreeSet};
use std::io::{self, BufRead, BufReader, Read, Seek};
use std::rc::Rc;

use crate::error::{Error, Result};
use crate::onnx::{GraphIo, OnnxError, Streamed, check_model};
use crate::types::ArtifactFormat;
use tessera_protocol::archive::{self as layout, EntryKind};

/// Largest `config.pbtxt` read.
pub const MAX_CONFIG_BYTES: u64 = 1024 * 1024;
/// Default [`ArchiveLimits::max_entries`] (a model directory has a handful).
pub const DEFAULT_MAX_ENTRIES: usize = 10_000;
/// Default [`ArchiveLimits::max_expansion_ratio`]: model weights compress poorly (about 1.1 to
/// 3 times), so sixteen leaves room for sparse models while refusing bombs (zeros compress
/// about a thousand times).
pub const DEFAULT_MAX_EXPANSION_RATIO: u64 = 16;
/// Every archive may expand to this much whatever its size (small archives of small files
/// compress well).
pub const EXPANSION_FLOOR_BYTES: u64 = 64 * 1024 * 1024;
/// Least default [`ArchiveLimits::max_expanded_bytes`]: 8 GiB (twice the upload cap when
/// that is larger).
pub const MIN_DEFAULT_EXPANDED_BYTES: u64 = 8 * 1024 * 1024 * 1024;

/// What an archive may expand to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArchiveLimits {
    /// Most entries (files, directories, links).
    pub max_entries: usize,
    /// Most bytes the entries may hold in all, whatever the archive's size.
    pub max_expanded_bytes: u64,
    /// Most bytes the entries may hold per byte of archive (above [`EXPANSION_FLOOR_BYTES`]).
    pub max_expansion_ratio: u64,
}

impl ArchiveLimits {
    /// The defaults for an upload cap of `max_upload_bytes`.
    pub fn for_upload_cap(max_upload_bytes: u64) -> Self {
        ArchiveLimits {
            max_entries: DEFAULT_MAX_ENTRIES,
            max_expanded_bytes: max_upload_bytes.saturating_mul(2).max(MIN_DEFAULT_EXPANDED_BYTES),
            max_expansion_ratio: DEFAULT_MAX_EXPANSION_RATIO,
        }
    }

    /// Most bytes an archive of `archive_bytes` may expand to.
    pub fn budget(&self, archive_bytes: u64) -> u64 {
        archive_bytes.saturating_mul(self.max_expansion_ratio).max(EXPANSION_FLOOR_BYTES).min(self.max_expanded_bytes)
    }

    fn too_large(&self, archive_bytes: u64) -> Error {
        refuse(format!(
            "the archive expands to more than {} bytes: an archive may expand to {}x its size of {archive_bytes} \
             bytes (at least {EXPANSION_FLOOR_BYTES} bytes), and to at most {} bytes in all",
            self.budget(archive_bytes),
            self.max_expansion_ratio,
            self.max_expanded_bytes
        ))
    }
}

/// What an archive turned out to hold.
#[derive(Debug, Clone, PartialEq)]
pub struct ArchiveManifest {
    /// The model config from `config.pbtxt`, as Triton's JSON, if the archive has one.
    pub config: Option<serde_json::Value>,
    /// The `.onnx` files, relative to the model directory.
    pub onnx_files: Vec<String>,
    /// The `.onnx` file a worker loads whatever the version number ([`layout::model_file`],
    /// relative to the model directory) and its graph's interface.
    pub model: Option<(String, GraphIo)>,
}

/// What to do with an entry's contents.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Contents {
    /// A `config.pbtxt` where a model directory's could be: read it.
    Config(Vec<String>),
    /// A `.onnx` file: check it is a model.
    Model(Vec<String>),
    /// Anything else: read it through, to know it is all there.
    Other,
}

fn refuse(message: String) -> Error {
    Error::invalid("body", message)
}

/// A path inside an archive, checked ([`layout::checked_path`]), as its components.
fn checked_path(raw: &str) -> Result<Vec<String>> {
    layout::checked_path(raw).map_err(refuse)
}

/// Marks the read error of a [`Budgeted`] reader that went over its budget.
#[derive(Debug)]
struct OverBudget;

impl std::fmt::Display for OverBudget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the archive expands past its limit")
    }
}

impl std::error::Error for OverBudget {}

/// A reader that counts the bytes through it and fails once they pass `limit`: the backstop
/// for data no header declared (gzip padding, a zip entry larger than it says).
struct Budgeted<R> {
    inner: R,
    used: Rc<Cell<u64>>,
    limit: u64,
}

impl<R: Read> Read for Budgeted<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        let used = self.used.get() + n as u64;
        self.used.set(used);
        if used > self.limit {
            return Err(io::Error::other(OverBudget));
        }
        Ok(n)
    }
}

/// Whether `e` (or what it wraps) is a [`Budgeted`] reader's refusal.
fn is_over_budget(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cause = Some(e);
    while let Some(c) = cause {
        if c.is::<OverBudget>() {
            return true;
        }
        if let Some(io) = c.downcast_ref::<io::Error>()
            && io.get_ref().is_some_and(|inner| inner.is::<OverBudget>())
        {
            return true;
        }
        cause = c.source();
    }
    false
}

/// Collects entries as an archive is walked, then finds the model directory in them.
struct Walk {
    limits: ArchiveLimits,
    archive_bytes: u64,
    files: Vec<Vec<String>>,
    /// Every directory the entries name or sit in: unpacking makes them, so no file may have
    /// one's path.
    dirs: BTreeSet<Vec<String>>,
    configs: BTreeMap<Vec<String>, String>,
    /// Each `.onnx` file's graph interface, by path.
    graphs: BTreeMap<Vec<String>, GraphIo>,
    entries: usize,
    /// Bytes the entries so far declared.
    declared: u64,
}

impl Walk {
    fn new(limits: ArchiveLimits, archive_bytes: u64) -> Self {
        Walk {
            limits,
            archive_bytes,
            files: Vec::new(),
            dirs: BTreeSet::new(),
            configs: BTreeMap::new(),
            graphs: BTreeMap::new(),
            entries: 0,
            declared: 0,
        }
    }

    /// The error for a failed read: over the expansion limit, or an unreadable archive.
    fn read_error(&self, e: impl std::error::Error + 'static) -> Error {
        if is_over_budget(&e) { self.limits.too_large(self.archive_bytes) } else { unreadable(e) }
    }

    /// Checks one entry of `size` bytes; says what to do with its contents.
    fn entry(&mut self, raw: &str, kind: EntryKind, size: u64) -> Result<Contents> {
        self.entries += 1;
        if self.entries > self.limits.max_entries {
            return Err(refuse(format!("the archive has more than {} entries", self.limits.max_entries)));
        }
        self.declared = self.declared.saturating_add(size);
        if self.declared > self.limits.budget(self.archive_bytes) {
            return Err(self.limits.too_large(self.archive_bytes));
        }
        let path = checked_path(raw)?;
        self.dirs.extend((0..path.len()).map(|n| path[..n].to_vec()));
        match kind {
            EntryKind::Link => return Err(refuse(format!("archive entry '{raw}' is a link; links are not allowed"))),
            EntryKind::Other => {
                return Err(refuse(format!("archive entry '{raw}' is not a regular file or directory")));
            }
            EntryKind::Dir => {
                self.dirs.insert(path);
                return Ok(Contents::Other);
            }
            // A worker unpacks files by name: one that names the model directory itself (`.`)
            // cannot be written.
            EntryKind::File if path.is_empty() => return Err(refuse(format!("archive entry '{raw}' has no name"))),
            EntryKind::File => {}
        }
        let name = path.last().map_or("", String::as_str);
        let contents = if path.len() <= 2 && name == "config.pbtxt" {
            Contents::Config(path.clone())
        } else if name.ends_with(".onnx") {
            Contents::Model(path.clone())
        } else {
            Contents::Other
        };
        self.files.push(path);
        Ok(contents)
    }

    /// Reads an entry's contents as `contents` says, checking it holds all `size` bytes.
    fn contents(&mut self, raw: &str, contents: Contents, size: u64, mut reader: impl Read) -> Result<()> {
        match contents {
            Contents::Config(path) => self.config_text(path, size, reader),
            Contents::Model(path) => {
                let io = check_model(&mut Streamed::new(reader), size).map_err(|e| match e {
                    OnnxError::Invalid(m) => refuse(format!("archive entry '{raw}' is not a valid ONNX model: {m}")),
                    OnnxError::Io(e) => self.read_error(e),
                })?;
                self.graphs.insert(path, io);
                Ok(())
            }
            Contents::Other => {
                let read = io::copy(&mut reader, &mut io::sink()).map_err(|e| self.read_error(e))?;
                if read != size {
                    return Err(refuse(format!("archive entry '{raw}' is truncated: {read} of its {size} bytes")));
                }
                Ok(())
            }
        }
    }

    fn config_text(&mut self, path: Vec<String>, size: u64, reader: impl Read) -> Result<()> {
        if size > MAX_CONFIG_BYTES {
            return Err(refuse(format!("config.pbtxt is larger than {MAX_CONFIG_BYTES} bytes")));
        }
        let mut text = String::new();
        reader
            .take(MAX_CONFIG_BYTES + 1)
            .read_to_string(&mut text)
            .map_err(|e| refuse(format!("config.pbtxt could not be read as UTF-8 text: {e}")))?;
        if text.len() as u64 != size {
            return Err(refuse(format!("config.pbtxt is truncated: {} of its {size} bytes", text.len())));
        }
        self.configs.insert(path, text);
        Ok(())
    }

    /// The model directory: the root, or the one top-level directory everything sits in.
    fn finish(mut self) -> Result<ArchiveManifest> {
        // A worker cannot unpack a file where a directory goes (`m/1` beside `m/1/model.onnx`).
        if let Some(file) = self.files.iter().find(|f| self.dirs.contains(*f)) {
            return Err(refuse(format!("archive entry '{}' is both a file and a directory", file.join("/"))));
        }
        let root = layout::model_root(&self.files);
        let relative: Vec<Vec<String>> = self.files.iter().map(|f| f[root.len()..].to_vec()).collect();
        let onnx_files = layout::model_candidates(&relative);
        let mut config_path = root.clone();
        config_path.push(layout::CONFIG_FILENAME.into());
        let parsed = match self.configs.remove(&config_path) {
            None => None,
            Some(text) => {
                let parsed = tessera_protocol::model_config::from_pbtxt(&text).map_err(|e| {
                    Error::invalid("config.pbtxt", format!("config.pbtxt is not a valid model config: {e}"))
                })?;
                crate::model_config::check("config.pbtxt", &parsed)?;
                Some(parsed)
            }
        };
        let config = parsed.as_ref().map(tessera_protocol::model_config::to_json_value);
        if !layout::needs_model_file(parsed.as_ref()) {
            // An ensemble: its steps run the tenant's other models; any .onnx file here is unused.
            return Ok(ArchiveManifest { config, onnx_files, model: None });
        }
        if onnx_files.is_empty() {
            return Err(refuse(
                "the archive holds no .onnx model file (expected model.onnx or <version>/model.onnx, \
                 at the root or under one <model>/ directory, or a config.pbtxt with platform \"ensemble\")"
                    .into(),
            ));
        }
        let filename = match &parsed {
            // Checked above: a plain file name.
            Some(c) => tessera_protocol::model_config::model_filename(c, layout::DEFAULT_MODEL_FILENAME)
                .unwrap_or(layout::DEFAULT_MODEL_FILENAME),
            None => layout::DEFAULT_MODEL_FILENAME,
        };
        // The file every version falls back to: refused here when a worker could not choose.
        let file = layout::model_file(&onnx_files, filename, None).map_err(refuse)?;
        let mut path = root.clone();
        path.extend(file.split('/').map(str::to_string));
        let model = self.graphs.remove(&path).map(|io| (file, io));
        Ok(ArchiveManifest { config, onnx_files, model })
    }
}

fn unreadable(e: impl std::fmt::Display) -> Error {
    refuse(format!("the archive could not be read: {e}"))
}

/// Inspects an archive of `format` (tar, gzipped tar or zip), `archive_bytes` long.
pub fn inspect<R: Read + Seek>(
    format: ArtifactFormat,
    reader: R,
    archive_bytes: u64,
    limits: ArchiveLimits,
) -> Result<ArchiveManifest> {
    match format {
        ArtifactFormat::Tar => inspect_tar(reader, archive_bytes, limits),
        ArtifactFormat::Zip => inspect_zip(reader, archive_bytes, limits),
        ArtifactFormat::Onnx => Err(Error::Internal("inspect called on a plain onnx artifact".into())),
    }
}

/// Inspects a tar archive, gzipped or not (told apart by the gzip magic number), reading it
/// through to its end.
pub fn inspect_tar<R: Read>(reader: R, archive_bytes: u64, limits: ArchiveLimits) -> Result<ArchiveManifest> {
    let mut buffered = BufReader::with_capacity(64 * 1024, reader);
    let gzipped = buffered.fill_buf().map_err(unreadable)?.starts_with(&[0x1f, 0x8b]);
    let mut walk = Walk::new(limits, archive_bytes);
    let used = Rc::new(Cell::new(0));
    let budget = limits.budget(archive_bytes).saturating_add(TAR_SLACK);
    if gzipped {
        let inner = flate2::bufread::GzDecoder::new(buffered);
        let mut rest = walk_tar(&mut walk, Budgeted { inner, used, limit: budget })?;
        // The gzip trailer (checksum and length) is only checked at the end of the stream.
        io::copy(&mut rest, &mut io::sink()).map_err(|e| walk.read_error(e))?;
    } else {
        walk_tar(&mut walk, Budgeted { inner: buffered, used, limit: budget })?;
    }
    walk.finish()
}

/// Room for tar headers and padding on top of what entries declare.
const TAR_SLACK: u64 = 16 * 1024 * 1024;

/// A tar block.
const BLOCK: u64 = 512;

/// Walks a tar's entries, reading each through; returns the reader after the end marker.
fn walk_tar<R: Read>(walk: &mut Walk, reader: Budgeted<R>) -> Result<Budgeted<R>> {
    let mut archive = tar::Archive::new(reader);
    // Where the last entry's data (padded to a block) ends: the end marker starts there.
    let mut data_end = 0;
    for entry in archive.entries().map_err(unreadable)? {
        let entry = entry.map_err(|e| walk.read_error(e))?;
        let raw = String::from_utf8_lossy(&entry.path_bytes()).into_owned();
        let kind = EntryKind::of_tar(entry.header().entry_type().as_byte());
        let size = entry.size();
        data_end = entry.raw_file_position().saturating_add(size.div_ceil(BLOCK) * BLOCK);
        let contents = walk.entry(&raw, kind, size)?;
        walk.contents(&raw, contents, size, entry)?;
    }
    let rest = archive.into_inner();
    // The tar reader stops at an all-zero block or, silently, at the end of its input: only
    // the first means the archive is complete.
    if rest.used.get() < data_end + BLOCK {
        return Err(refuse("the archive is truncated: it ends before its end-of-archive marker".into()));
    }
    Ok(rest)
}

/// Inspects a zip archive through its central directory (what unpackers trust), reading
/// every entry through (which checks its CRC).
pub fn inspect_zip<R: Read + Seek>(reader: R, archive_bytes: u64, limits: ArchiveLimits) -> Result<ArchiveManifest> {
    let mut archive = zip::ZipArchive::new(reader).map_err(unreadable)?;
    if archive.len() > limits.max_entries {
        return Err(refuse(format!("the archive has more than {} entries", limits.max_entries)));
    }
    // Refuse a bomb from its directory, before inflating anything.
    let mut declared: u64 = 0;
    for i in 0..archive.len() {
        declared = declared.saturating_add(archive.by_index_raw(i).map_err(unreadable)?.size());
    }
    if declared > limits.budget(archive_bytes) {
        return Err(limits.too_large(archive_bytes));
    }
    let mut walk = Walk::new(limits, archive_bytes);
    let used = Rc::new(Cell::new(0));
    let budget = limits.budget(archive_bytes);
    for i in 0..archive.len() {
        let (raw, contents, size) = {
            let file = archive.by_index_raw(i).map_err(unreadable)?;
            let kind = EntryKind::of_zip(file.is_symlink(), file.is_dir(), file.unix_mode());
            let raw = file.name().to_string();
            let contents = walk.entry(&raw, kind, file.size())?;
            (raw, contents, file.size())
        };
        let file = archive.by_index(i).map_err(unreadable)?;
        walk.contents(&raw, contents, size, Budgeted { inner: file, used: used.clone(), limit: budget })?;
    }
    walk.finish()
}

#[cfg(test)]
pub(crate) mod tests {
    use std::io::Cursor;

    pub use tessera_protocol::archive::test_support::{gzip, tar_of, zip_of};

    use super::*;
    use crate::onnx::tests::model;

    pub const CONFIG: &str = "name: \"resnet\"\nplatform: \"onnxruntime_onnx\"\nmax_batch_size: 8\n";

    fn limits() -> ArchiveLimits {
        ArchiveLimits::for_upload_cap(crate::config::DEFAULT_MAX_UPLOAD_BYTES)
    }

    fn inspect_tar_bytes(bytes: &[u8]) -> Result<ArchiveManifest> {
        inspect_tar(Cursor::new(bytes), bytes.len() as u64, limits())
    }

    fn inspect_zip_bytes(bytes: &[u8]) -> Result<ArchiveManifest> {
        inspect_zip(Cursor::new(bytes), bytes.len() as u64, limits())
    }

    fn tar(files: &[(&str, &[u8])]) -> Result<ArchiveManifest> {
        inspect_tar_bytes(&tar_of(files, &[]))
    }

    fn message(r: Result<ArchiveManifest>) -> String {
        match r {
            Err(Error::InvalidInput { message, .. }) => message,
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    /// Triton's ensemble layout: a config and an empty version directory, no model file.
    pub const ENSEMBLE: &str = "name: \"pipe\"\nplatform: \"ensemble\"\nmax_batch_size: 8\n\
        input [ { name: \"IN\" data_type: TYPE_FP32 dims: [ 4 ] } ]\n\
        output [ { name: \"OUT\" data_type: TYPE_FP32 dims: [ 4 ] } ]\n\
        ensemble_scheduling { step [ { model_name: \"m\" model_version: -1 \
        input_map { key: \"x\" value: \"IN\" } output_map { key: \"y\" value: \"OUT\" } } ] }\n";

    #[test]
    fn an_ensemble_needs_only_its_config() {
        let m = tar(&[("pipe/config.pbtxt", ENSEMBLE.as_bytes())]).expect("an ensemble");
        assert_eq!(m.config.expect("config")["platform"], "ensemble");
        assert!(m.model.is_none() && m.onnx_files.is_empty());
        let no_steps = "platform: \"ensemble\"\n";
        assert!(message(tar(&[("config.pbtxt", no_steps.as_bytes())])).contains("at least one step"));
        let backend = ENSEMBLE.replace("platform: \"ensemble\"", "backend: \"onnxruntime\"");
        assert!(message(tar(&[("config.pbtxt", backend.as_bytes())])).contains("no backend"));
        let no_config = message(tar(&[("pipe/1/readme.txt", b"x")]));
        assert!(no_config.contains("no .onnx model file") && no_config.contains("ensemble"), "{no_config}");
    }

    #[test]
    fn reads_the_config_in_every_layout_and_packaging() {
        let onnx = &model(10)[..];
        let layouts: [&[(&str, &[u8])]; 3] = [
            &[("resnet/config.pbtxt", CONFIG.as_bytes()), ("resnet/1/model.onnx", onnx)],
            &[("config.pbtxt", CONFIG.as_bytes()), ("1/model.onnx", onnx)],
            &[("config.pbtxt", CONFIG.as_bytes()), ("model.onnx", onnx)],
        ];
        for files in layouts {
            let plain = tar_of(files, &[]);
            for m in [
                inspect_tar_bytes(&plain).unwrap(),
                inspect_tar_bytes(&gzip(&plain)).unwrap(),
                inspect_zip_bytes(&zip_of(files, &[])).unwrap(),
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
        let onnx = &model(0)[..];
        assert!(message(tar(&[("m/1/model.onnx", onnx), ("../evil", b"x")])).contains("path traversal"));
        assert!(message(tar(&[("m/../../evil.onnx", onnx)])).contains("path traversal"));
        assert!(message(tar(&[("/etc/model.onnx", onnx)])).contains("absolute path"));
        let linked = tar_of(&[("m/1/model.onnx", onnx)], &[("m/config.pbtxt", "/etc/passwd")]);
        assert!(message(inspect_tar_bytes(&linked)).contains("is a link"));
        let zipped = zip_of(&[("m/1/model.onnx", onnx)], &[("m/2", "/tmp")]);
        assert!(message(inspect_zip_bytes(&zipped)).contains("is a link"));
        assert!(message(inspect_zip_bytes(&zip_of(&[("../x.onnx", onnx)], &[]))).contains("path traversal"));
        assert!(message(tar(&[("m/config.pbtxt", CONFIG.as_bytes())])).contains("no .onnx model file"));
        assert!(message(tar(&[("m/1/sub/model.onnx", onnx)])).contains("no .onnx model file"));
        let bad_config = tar(&[("config.pbtxt", b"max_batch_size: \"many\""), ("model.onnx", onnx)]);
        assert!(matches!(bad_config, Err(Error::InvalidInput { field: Some(f), .. }) if f == "config.pbtxt"));
        let outside =
            tar(&[("config.pbtxt", b"default_model_filename: \"../../t2/m/1/model.onnx\""), ("model.onnx", onnx)]);
        assert!(message(outside).contains("default_model_filename"));
        assert!(message(inspect_tar_bytes(&b"not a tar at all, just text".repeat(40))).contains("could not be read"));
    }

    #[test]
    fn refuses_what_a_worker_cannot_unpack() {
        // Found by the `archive` fuzz target, which unpacks on a worker what the control plane
        // accepts: a file without a name, and a file where a directory goes.
        let onnx = &model(0)[..];
        assert!(message(tar(&[("model.onnx", onnx), (".", b"x")])).contains("has no name"));
        assert!(message(tar(&[("m/1", b"x"), ("m/1/model.onnx", onnx)])).contains("'m/1' is both a file and"));
        let zipped = zip_of(&[("m/1/model.onnx", onnx), ("m/1/model.onnx/x", b"x")], &[]);
        assert!(message(inspect_zip_bytes(&zipped)).contains("'m/1/model.onnx' is both a file and"));
        // The same file twice is fine: a worker writes it twice.
        assert!(tar(&[("m/1/model.onnx", onnx), ("m/1/model.onnx", onnx)]).is_ok());
    }

    #[test]
    fn every_onnx_file_must_be_a_model() {
        let good = model(100);
        let fake: &[u8] = &[0x08, 0x07, b'h', b'i'];
        for files in [
            &[("m/1/model.onnx", fake)][..],
            &[("m/1/model.onnx", &good[..]), ("m/2/model.onnx", &good[..20])],
            &[("m/1/model.onnx", &good[..]), ("m/extra/other.onnx", fake)],
        ] {
            for r in [
                inspect_tar_bytes(&tar_of(files, &[])),
                inspect_tar_bytes(&gzip(&tar_of(files, &[]))),
                inspect_zip_bytes(&zip_of(files, &[])),
            ] {
                let m = message(r);
                assert!(m.contains("is not a valid ONNX model"), "{m}");
            }
        }
        let m = message(tar(&[("m/1/model.onnx", &good[..20])]));
        assert!(m.contains("'m/1/model.onnx' is not a valid ONNX model: truncated at byte 20"), "{m}");
    }

    #[test]
    fn truncated_archives_are_refused() {
        let good = model(5000);
        let files: &[(&str, &[u8])] = &[("m/config.pbtxt", CONFIG.as_bytes()), ("m/1/model.onnx", &good)];
        let whole = tar_of(files, &[]);
        assert!(inspect_tar_bytes(&whole).is_ok());
        // Cut inside the model, at a block boundary inside it, inside the config, and just
        // before the end-of-archive marker.
        let model_data = 3 * 512;
        for cut in [model_data + 100, model_data + 1024, 512 + 10, whole.len() - 1024] {
            let m = message(inspect_tar_bytes(&whole[..cut]));
            assert!(m.contains("truncated"), "cut at {cut}: {m}");
        }
        // A gzip stream cut short, or with its checksum wrong, is refused too.
        let gz = gzip(&whole);
        assert!(inspect_tar_bytes(&gz).is_ok());
        assert!(inspect_tar_bytes(&gz[..gz.len() - 4]).is_err());
        let mut bad_crc = gz.clone();
        let at = bad_crc.len() - 8;
        bad_crc[at] ^= 0xff;
        assert!(message(inspect_tar_bytes(&bad_crc)).contains("could not be read"));
        // A zip without its central directory cannot be read.
        let zipped = zip_of(files, &[]);
        assert!(message(inspect_zip_bytes(&zipped[..zipped.len() - 30])).contains("could not be read"));
    }

    #[test]
    fn archives_that_expand_too_far_are_refused_before_expanding() {
        let good = model(0);
        let zeros = vec![0u8; 8 * 1024 * 1024];
        let files: &[(&str, &[u8])] = &[("m/1/model.onnx", &good), ("m/1/weights.bin", &zeros)];
        let small = ArchiveLimits { max_entries: 10, max_expanded_bytes: 4 * 1024 * 1024, max_expansion_ratio: 16 };
        let tarred = tar_of(files, &[]);
        let gz = gzip(&tarred);
        let zipped = zip_of(files, &[]);
        for r in [
            inspect_tar(Cursor::new(&tarred), tarred.len() as u64, small),
            inspect_tar(Cursor::new(&gz), gz.len() as u64, small),
            inspect_zip(Cursor::new(&zipped), zipped.len() as u64, small),
        ] {
            let m = message(r);
            assert!(m.contains("expands to more than 4194304 bytes"), "{m}");
        }
        // The ratio: 8 MiB of zeros compress to a few KiB, far more than 16 times.
        let ratio_only = ArchiveLimits { max_expanded_bytes: u64::MAX, ..small };
        assert_eq!(ratio_only.budget(gz.len() as u64), EXPANSION_FLOOR_BYTES);
        let tight = ArchiveLimits { max_expansion_ratio: 1, ..ratio_only };
        assert_eq!(tight.budget(1 << 40), 1 << 40);
        assert!(inspect_tar(Cursor::new(&gz), gz.len() as u64, ratio_only).is_ok());
        // Entries are counted.
        let many: Vec<(String, Vec<u8>)> = (0..11).map(|i| (format!("m/{i}.txt"), vec![b'x'])).collect();
        let many: Vec<(&str, &[u8])> = many.iter().map(|(p, d)| (p.as_str(), d.as_slice())).collect();
        let m = message(inspect_tar(Cursor::new(tar_of(&many, &[])), 1 << 20, small));
        assert!(m.contains("more than 10 entries"), "{m}");
        let m = message(inspect_zip(Cursor::new(zip_of(&many, &[])), 1 << 20, small));
        assert!(m.contains("more than 10 entries"), "{m}");
    }

    #[test]
    fn default_limits_scale_with_the_upload_cap() {
        let l = ArchiveLimits::for_upload_cap(1 << 30);
        assert_eq!((l.max_entries, l.max_expanded_bytes, l.max_expansion_ratio), (10_000, 8 << 30, 16));
        assert_eq!(ArchiveLimits::for_upload_cap(16 << 30).max_expanded_bytes, 32 << 30);
        assert_eq!(l.budget(1 << 20), 64 << 20);
        assert_eq!(l.budget(1 << 30), 8 << 30);
    }

    #[test]
    fn the_loaded_file_is_the_one_a_worker_picks() {
        let m = tar(&[("m/config.pbtxt", CONFIG.as_bytes()), ("m/1/model.onnx", &model(0))]).unwrap();
        let (file, io) = m.model.expect("the model is known");
        assert_eq!((file.as_str(), io.inputs[0].name.as_str()), ("1/model.onnx", "x"));
        let m = tar(&[("1/model.onnx", &model(0)), ("2/model.onnx", &model(1))]).unwrap();
        assert_eq!(m.model.map(|(f, _)| f).as_deref(), Some("2/model.onnx"));
    }

    #[test]
    fn several_models_and_no_choice_are_refused() {
        // Every worker refuses to choose among them, so the upload is refused too.
        let onnx = &model(0)[..];
        for files in [&[("a.onnx", onnx), ("b.onnx", onnx)][..], &[("m/1/a.onnx", onnx), ("m/2/b.onnx", onnx)]] {
            let m = message(tar(files));
            assert!(m.contains("several .onnx files"), "{m}");
        }
        // A config that names one of them settles it.
        let named = tar(&[("config.pbtxt", b"default_model_filename: \"b.onnx\""), ("a.onnx", onnx), ("b.onnx", onnx)]);
        assert_eq!(named.unwrap().model.map(|(f, _)| f).as_deref(), Some("b.onnx"));
    }
}
