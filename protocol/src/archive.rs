//! The layout of a Triton model-directory archive, as both planes read it: the control plane
//! when it inspects an upload, a worker when it finds the model in what it unpacked. Both call
//! these functions, so an archive accepted at upload is one every worker can load.
//!
//! The model directory is the archive's root, or the one top-level directory that every file
//! sits in when that directory's name is not a version number. In it: an optional
//! `config.pbtxt`, and the model as `<version>/<filename>` or `<filename>` (`filename` is the
//! config's `default_model_filename`, `model.onnx` by default), or as the only `*.onnx` file at
//! the root or in a version directory. An ensemble's directory needs no model file: its
//! config is the model ([`needs_model_file`]).

/// The model file's name when the config names none (Triton's default for ONNX).
pub const DEFAULT_MODEL_FILENAME: &str = "model.onnx";

/// The model config's file name, in the model directory.
pub const CONFIG_FILENAME: &str = "config.pbtxt";

/// A path inside an archive, checked: relative, no `..`, no drive letters or NULs; returned as
/// its components (empty and `.` components dropped; `/` and `\` both separate).
pub fn checked_path(raw: &str) -> Result<Vec<String>, String> {
    if raw.contains('\0') {
        return Err(format!("archive entry '{}' has a NUL in its name", raw.escape_default()));
    }
    let windows_absolute = raw.len() >= 2 && raw.as_bytes()[1] == b':';
    if raw.starts_with('/') || raw.starts_with('\\') || windows_absolute {
        return Err(format!("archive entry '{raw}' has an absolute path"));
    }
    let parts: Vec<String> =
        raw.split(['/', '\\']).filter(|p| !p.is_empty() && *p != ".").map(str::to_string).collect();
    if parts.iter().any(|p| p == "..") {
        return Err(format!("archive entry '{raw}' escapes the model directory (path traversal with '..')"));
    }
    Ok(parts)
}

/// What an archive entry is. Only files and directories are unpacked: links and special
/// files are refused wherever they are met.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryKind {
    /// A regular file.
    File,
    /// A directory.
    Dir,
    /// A symbolic or hard link.
    Link,
    /// Anything else (devices, FIFOs, unknown types).
    Other,
}

impl EntryKind {
    /// The kind of a tar entry by its header's type flag (pax and GNU long-name headers never
    /// reach here: the reader folds them into the entries they describe).
    pub fn of_tar(typeflag: u8) -> Self {
        match typeflag {
            b'0' | b'\0' | b'7' => EntryKind::File,
            b'5' => EntryKind::Dir,
            b'1' | b'2' => EntryKind::Link,
            _ => EntryKind::Other,
        }
    }

    /// The kind of a zip entry: a symlink, a directory, a file with a Unix mode other than a
    /// regular file's, or a file.
    pub fn of_zip(is_symlink: bool, is_dir: bool, unix_mode: Option<u32>) -> Self {
        if is_symlink {
            EntryKind::Link
        } else if is_dir {
            EntryKind::Dir
        } else if unix_mode.is_some_and(|m| m & 0o170000 != 0 && m & 0o170000 != 0o100000) {
            EntryKind::Other
        } else {
            EntryKind::File
        }
    }
}

/// The version a directory name stands for: plain decimal digits without a sign or leading
/// zeros, so each version has exactly one directory (`01` or `+5` would otherwise alias `1` and
/// `5`, and the model file would be looked for under the other name). Anything else is not a
/// version directory.
pub fn version_of_dir(name: &str) -> Option<i64> {
    let canonical =
        !name.is_empty() && name.bytes().all(|b| b.is_ascii_digit()) && (name == "0" || !name.starts_with('0'));
    if canonical { name.parse().ok() } else { None }
}

/// Whether a model directory whose config is `config` needs a model file: every model does
/// except an ensemble, whose steps run other models.
pub fn needs_model_file(config: Option<&crate::inference::ModelConfig>) -> bool {
    !config.is_some_and(crate::model_config::is_ensemble)
}

/// The model directory among `files` (each a checked path's components): the root (empty), or
/// the one top-level directory every file sits in when its name is not a version number.
pub fn model_root(files: &[Vec<String>]) -> Vec<String> {
    match files.first().and_then(|f| f.first()) {
        Some(top) if files.iter().all(|f| f.len() > 1 && f[0] == *top) && version_of_dir(top).is_none() => {
            vec![top.clone()]
        }
        _ => Vec::new(),
    }
}

/// The `.onnx` files that can be the model, among `files` relative to the model directory:
/// those at its root and those in a version directory, as `/`-joined paths.
pub fn model_candidates(files: &[Vec<String>]) -> Vec<String> {
    files
        .iter()
        .filter(|f| match f.as_slice() {
            [name] => name.ends_with(".onnx"),
            [version, name] => version_of_dir(version).is_some() && name.ends_with(".onnx"),
            _ => false,
        })
        .map(|f| f.join("/"))
        .collect()
}

/// The file a worker loads for `version` among `candidates` ([`model_candidates`]): in order
/// `<version>/<filename>`, the highest `<n>/<filename>`, `<filename>`, the only candidate.
/// With `version` `None` (at upload, before a worker is given a version number) the first step
/// is skipped; the answer is then the one every version falls back to, so a choice made without
/// a version means every version finds a file.
pub fn model_file(candidates: &[String], filename: &str, version: Option<i64>) -> Result<String, String> {
    if let Some(v) = version {
        let exact = format!("{v}/{filename}");
        if candidates.contains(&exact) {
            return Ok(exact);
        }
    }
    let highest = candidates
        .iter()
        .filter_map(|f| {
            let (dir, name) = f.split_once('/')?;
            (name == filename).then(|| version_of_dir(dir).map(|n| (n, f)))?
        })
        .max();
    if let Some((_, f)) = highest {
        return Ok(f.clone());
    }
    if candidates.iter().any(|f| f == filename) {
        return Ok(filename.to_string());
    }
    match candidates {
        [only] => Ok(only.clone()),
        [] => Err(format!("the archive holds no {filename} (nor any .onnx file)")),
        _ => Err(format!(
            "the archive holds several .onnx files ({}) and no {filename} or <version>/{filename}: \
             name the model with default_model_filename in config.pbtxt, or keep one .onnx file",
            candidates.join(", ")
        )),
    }
}

/// Archive builders for tests of both planes (and the end-to-end tests).
#[cfg(feature = "test-support")]
pub mod test_support {
    use std::io::{Cursor, Write};

    /// A tar of `(path, contents)` files, and `links` as symlinks. Names are written raw into
    /// the header, so `..` and absolute paths can be tested.
    pub fn tar_of(files: &[(&str, &[u8])], links: &[(&str, &str)]) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        for (path, data) in files {
            let mut h = tar::Header::new_gnu();
            h.set_size(data.len() as u64);
            h.set_mode(0o644);
            h.set_entry_type(tar::EntryType::Regular);
            h.as_old_mut().name[..path.len()].copy_from_slice(path.as_bytes());
            h.set_cksum();
            b.append(&h, *data).expect("append to an in-memory tar");
        }
        for (path, target) in links {
            let mut h = tar::Header::new_gnu();
            h.set_entry_type(tar::EntryType::Symlink);
            h.set_size(0);
            b.append_link(&mut h, path, target).expect("append a link to an in-memory tar");
        }
        b.into_inner().expect("finish an in-memory tar")
    }

    /// `data` gzipped.
    pub fn gzip(data: &[u8]) -> Vec<u8> {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        e.write_all(data).expect("gzip in memory");
        e.finish().expect("finish gzip in memory")
    }

    /// A zip (deflated, with a fixed time so the bytes do not change with the clock) of
    /// `(path, contents)` files, and `links` as symlinks.
    pub fn zip_of(files: &[(&str, &[u8])], links: &[(&str, &str)]) -> Vec<u8> {
        let mut w = zip::ZipWriter::new(Cursor::new(Vec::new()));
        let options = zip::write::SimpleFileOptions::default()
            .compression_method(zip::CompressionMethod::Deflated)
            .last_modified_time(zip::DateTime::default());
        for (path, data) in files {
            w.start_file(*path, options).expect("start an in-memory zip entry");
            w.write_all(data).expect("write an in-memory zip entry");
        }
        for (path, target) in links {
            w.add_symlink(*path, *target, options).expect("add a link to an in-memory zip");
        }
        w.finish().expect("finish an in-memory zip").into_inner()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn paths(files: &[&str]) -> Vec<Vec<String>> {
        files.iter().map(|f| checked_path(f).expect("a valid path")).collect()
    }

    fn strings(files: &[&str]) -> Vec<String> {
        files.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn paths_are_checked() {
        assert_eq!(checked_path("./m//1/model.onnx").expect("ok"), ["m", "1", "model.onnx"]);
        for bad in ["/a", "\\a", "C:\\a", "a/../../b", "a\\..\\b", "..", "a\0b"] {
            assert!(checked_path(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn entry_kinds() {
        let tar: Vec<EntryKind> = [b'0', 0, b'7', b'5', b'1', b'2', b'3', b'6', b'x'].map(EntryKind::of_tar).to_vec();
        use EntryKind::*;
        assert_eq!(tar, [File, File, File, Dir, Link, Link, Other, Other, Other]);
        assert_eq!(EntryKind::of_zip(true, false, None), Link);
        assert_eq!(EntryKind::of_zip(false, true, None), Dir);
        assert_eq!(EntryKind::of_zip(false, false, Some(0o100644)), File);
        assert_eq!(EntryKind::of_zip(false, false, Some(0o644)), File, "no file type bits");
        assert_eq!(EntryKind::of_zip(false, false, Some(0o020644)), Other, "a character device");
    }

    #[test]
    fn only_plain_decimal_directory_names_are_versions() {
        for (name, want) in [("1", Some(1)), ("0", Some(0)), ("42", Some(42)), ("9223372036854775807", Some(i64::MAX))]
        {
            assert_eq!(version_of_dir(name), want, "{name}");
        }
        for name in ["01", "+5", "-1", "", "1a", " 1", "1.0", "99999999999999999999", "٣"] {
            assert_eq!(version_of_dir(name), None, "{name}");
        }
    }

    #[test]
    fn the_model_directory_is_the_root_or_one_named_directory() {
        assert_eq!(model_root(&paths(&["m/config.pbtxt", "m/1/model.onnx"])), ["m"]);
        assert!(model_root(&paths(&["1/model.onnx", "2/model.onnx"])).is_empty(), "a version directory");
        assert!(model_root(&paths(&["m/1/model.onnx", "model.onnx"])).is_empty());
        assert!(model_root(&paths(&["m/1/model.onnx", "n/1/model.onnx"])).is_empty());
        assert_eq!(model_root(&paths(&["01/model.onnx"])), ["01"], "not a version: a model directory");
        assert_eq!(
            model_candidates(&paths(&["config.pbtxt", "1/a.onnx", "x.onnx", "1/sub/b.onnx", "01/c.onnx", "w.bin"])),
            ["1/a.onnx", "x.onnx"]
        );
    }

    #[test]
    fn only_an_ensemble_needs_no_model_file() {
        let parse = |text: &str| crate::model_config::from_pbtxt(text).expect("a valid config");
        assert!(needs_model_file(None));
        assert!(needs_model_file(Some(&parse("max_batch_size: 4"))));
        assert!(!needs_model_file(Some(&parse("platform: \"ensemble\""))));
        let scheduled = "ensemble_scheduling { step [ { model_name: \"a\" model_version: -1 } ] }";
        assert!(!needs_model_file(Some(&parse(scheduled))));
    }

    #[test]
    fn the_model_file_choice() {
        let pick = |files: &[&str], version| model_file(&strings(files), "model.onnx", version);
        assert_eq!(pick(&["1/model.onnx", "2/model.onnx"], Some(1)).as_deref(), Ok("1/model.onnx"));
        assert_eq!(pick(&["1/model.onnx", "2/model.onnx"], Some(9)).as_deref(), Ok("2/model.onnx"));
        assert_eq!(pick(&["10/model.onnx", "9/model.onnx"], None).as_deref(), Ok("10/model.onnx"));
        assert_eq!(pick(&["model.onnx", "x.onnx"], None).as_deref(), Ok("model.onnx"));
        assert_eq!(pick(&["1/net.onnx"], Some(3)).as_deref(), Ok("1/net.onnx"));
        assert!(pick(&[], None).expect_err("none").contains("no model.onnx"));
        for version in [None, Some(1), Some(2)] {
            let e = pick(&["a.onnx", "b.onnx"], version).expect_err("ambiguous");
            assert!(e.contains("several .onnx files (a.onnx, b.onnx)"), "{e}");
        }
        assert_eq!(model_file(&strings(&["a.onnx", "b.onnx"]), "b.onnx", None).as_deref(), Ok("b.onnx"));
    }

    /// What the choice without a version accepts, every version finds (and what it refuses,
    /// none does): the rule that makes an upload's check the workers' answer.
    #[test]
    fn a_choice_without_a_version_decides_for_every_version() {
        let layouts: [&[&str]; 6] = [
            &["1/model.onnx", "2/model.onnx"],
            &["model.onnx", "x.onnx"],
            &["a.onnx", "b.onnx"],
            &["1/a.onnx", "2/b.onnx"],
            &["1/a.onnx"],
            &["3/model.onnx", "a.onnx", "1/b.onnx"],
        ];
        for files in layouts {
            let files = strings(files);
            let at_upload = model_file(&files, "model.onnx", None).is_ok();
            for v in 0..5 {
                assert_eq!(model_file(&files, "model.onnx", Some(v)).is_ok(), at_upload, "{files:?} v{v}");
            }
        }
    }
}
