//! The spool directory (`<data-dir>/usage/`): append-only files of records and the shipper's
//! cursor.
//!
//! Files are named `<seq:016>-<nonce>.usage`; `seq` only grows (a new file per worker start and
//! whenever the current one passes the rotation size), the random nonce keeps names unique even
//! if the directory is wiped under a fixed `--worker-id`. Only the newest file is written; an
//! older one is *sealed*. Each file starts its own labels dictionary. The cursor
//! (`cursor.json`, replaced atomically) says how far the shipper got and, while a batch is being
//! sent, which byte range it is, so a restart sends exactly that range again (same keys).

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::record::{Decoded, Labels, Record, decode, encode};

/// Default size past which the writer starts a new file.
pub const ROTATE_BYTES: u64 = 16 * 1024 * 1024;
const EXTENSION: &str = "usage";
const CURSOR_FILE: &str = "cursor.json";

/// One spool file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpoolFile {
    /// Position in the sequence.
    pub seq: u64,
    /// File name (part of every idempotency key built from it).
    pub name: String,
    /// Full path.
    pub path: PathBuf,
}

/// The spool files in `dir`, oldest first.
pub fn files(dir: &Path) -> io::Result<Vec<SpoolFile>> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(stem) = name.strip_suffix(&format!(".{EXTENSION}")) else { continue };
        let Some(seq) = stem.split_once('-').and_then(|(seq, _)| seq.parse::<u64>().ok()) else { continue };
        found.push(SpoolFile { seq, name, path: entry.path() });
    }
    found.sort_by_key(|f| f.seq);
    Ok(found)
}

/// Spooled bytes the control plane has not acknowledged yet (files from the cursor on).
pub fn backlog_bytes(dir: &Path) -> io::Result<u64> {
    let cursor = Cursor::load(dir)?;
    let mut total = 0;
    for file in files(dir)?.into_iter().filter(|f| f.seq >= cursor.file) {
        let len = file.path.metadata()?.len();
        total += if file.seq == cursor.file { len.saturating_sub(cursor.offset) } else { len };
    }
    Ok(total)
}

/// How far the shipper got.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cursor {
    /// Spool file (`seq`) being shipped; older files are done.
    pub file: u64,
    /// Bytes of it acknowledged.
    pub offset: u64,
    /// End of the range `offset..pending_end` sent but not yet acknowledged.
    pub pending_end: Option<u64>,
}

impl Cursor {
    /// The cursor in `dir`; the start when there is none.
    pub fn load(dir: &Path) -> io::Result<Self> {
        match std::fs::read(dir.join(CURSOR_FILE)) {
            Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Self::default()),
            Err(e) => Err(e),
        }
    }

    /// Replaces the cursor in `dir`: written aside, synced, renamed (old or new, never half).
    pub fn save(&self, dir: &Path) -> io::Result<()> {
        let tmp = dir.join(format!("{CURSOR_FILE}.tmp"));
        let mut file = File::create(&tmp)?;
        file.write_all(&serde_json::to_vec(self).map_err(io::Error::other)?)?;
        file.sync_all()?;
        std::fs::rename(&tmp, dir.join(CURSOR_FILE))
    }
}

/// Appends records to the newest spool file, defining each labels id in a file before its
/// first use there. Callers serialise access (one writer per directory).
pub struct SpoolWriter {
    dir: PathBuf,
    rotate_at: u64,
    /// The current file (shared with whoever syncs it outside the writer's lock).
    file: Arc<File>,
    /// Files sealed since the last [`SpoolWriter::take_unsynced`].
    sealed: Vec<Arc<File>>,
    seq: u64,
    len: u64,
    /// Labels ids of the current file, by the address of the `Arc` (held here, so an address is
    /// never reused while the file is current).
    ids: HashMap<usize, (Arc<Labels>, u32)>,
    /// A write failed part-way: the next append starts a new file rather than write after it.
    damaged: bool,
}

impl SpoolWriter {
    /// Starts a new file in `dir` (created if missing), after every file and the cursor there.
    pub fn open(dir: &Path, rotate_at: u64) -> io::Result<Self> {
        std::fs::create_dir_all(dir)?;
        let last = files(dir)?.last().map_or(0, |f| f.seq);
        // A damaged cursor stops the shipper (loudly), not the serving: names stay unique anyway.
        let shipped = Cursor::load(dir).map_or_else(
            |e| {
                tracing::error!(dir = %dir.display(), error = %e, "the usage cursor is unreadable");
                0
            },
            |c| c.file,
        );
        let seq = last.max(shipped) + 1;
        let file = create(dir, seq)?;
        Ok(Self {
            dir: dir.to_path_buf(),
            rotate_at,
            file: Arc::new(file),
            sealed: Vec::new(),
            seq,
            len: 0,
            ids: HashMap::new(),
            damaged: false,
        })
    }

    /// Appends the record `make` builds for the labels' id, with one `write` (the labels'
    /// definition goes in the same write when the file has not seen them).
    pub fn append(&mut self, labels: &Arc<Labels>, make: impl FnOnce(u32) -> Record) -> io::Result<()> {
        if self.damaged || self.len >= self.rotate_at {
            self.rotate()?;
        }
        let address = Arc::as_ptr(labels) as usize;
        let mut bytes = Vec::with_capacity(128);
        let id = match self.ids.get(&address) {
            Some((_, id)) => *id,
            None => {
                let id = u32::try_from(self.ids.len()).map_err(io::Error::other)?;
                bytes = encode(&Record::Labels(id, Labels::clone(labels)))
                    .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "labels too long for the spool"))?;
                id
            }
        };
        let record = encode(&make(id)).ok_or_else(|| io::Error::other("record cannot be framed"))?;
        bytes.extend_from_slice(&record);
        match self.file.as_ref().write(&bytes) {
            Ok(n) if n == bytes.len() => {
                self.len += n as u64;
                self.ids.entry(address).or_insert_with(|| (labels.clone(), id));
                Ok(())
            }
            Ok(n) => {
                self.damaged = true;
                Err(io::Error::new(io::ErrorKind::WriteZero, format!("short spool write: {n} of {}", bytes.len())))
            }
            // A failed `write` wrote nothing (Linux reports a partial write as a short count):
            // the file is whole and the next append goes after its last record.
            Err(e) => Err(e),
        }
    }

    /// The files written since the previous call (those sealed meanwhile and the current one),
    /// to be synced to disk outside the writer's lock.
    pub fn take_unsynced(&mut self) -> Vec<Arc<File>> {
        let mut files = std::mem::take(&mut self.sealed);
        files.push(self.file.clone());
        files
    }

    /// Puts `file` in place of the current file and returns that (tests: a failing disk).
    #[cfg(test)]
    pub(crate) fn swap_file(&mut self, file: Arc<File>) -> Arc<File> {
        std::mem::replace(&mut self.file, file)
    }

    /// Seals the current file and starts the next.
    fn rotate(&mut self) -> io::Result<()> {
        let next = Arc::new(create(&self.dir, self.seq + 1)?);
        self.sealed.push(std::mem::replace(&mut self.file, next));
        self.seq += 1;
        self.len = 0;
        self.ids.clear();
        self.damaged = false;
        Ok(())
    }
}

fn create(dir: &Path, seq: u64) -> io::Result<File> {
    let nonce = uuid::Uuid::new_v4().simple().to_string();
    let path = dir.join(format!("{seq:016}-{}.{EXTENSION}", &nonce[..16]));
    OpenOptions::new().create_new(true).append(true).open(path)
}

/// Reads up to `max` bytes of `path` from `offset`.
pub fn read_at(path: &Path, offset: u64, max: usize) -> io::Result<Vec<u8>> {
    let mut file = File::open(path)?;
    file.seek(SeekFrom::Start(offset))?;
    let mut buf = Vec::new();
    file.take(max as u64).read_to_end(&mut buf)?;
    Ok(buf)
}

/// The complete records at the start of `buf`, each with its offset in `buf`; and where they
/// end. `damaged` when a corrupt frame stopped the scan (rather than the end of the data).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Scan {
    /// Records and their offsets.
    pub records: Vec<(usize, Record)>,
    /// Bytes of `buf` the records cover.
    pub end: usize,
    /// A corrupt frame follows `end`.
    pub damaged: bool,
}

/// Splits `buf` into complete records (see [`Scan`]).
pub fn scan(buf: &[u8]) -> Scan {
    let mut out = Scan::default();
    loop {
        match decode(&buf[out.end..]) {
            Decoded::Record(record, len) => {
                out.records.push((out.end, record));
                out.end += len;
            }
            Decoded::Incomplete => return out,
            Decoded::Corrupt => {
                out.damaged = true;
                return out;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::worker::usage::record::{RequestRecord, SliceRecord};

    fn labels(model: &str) -> Arc<Labels> {
        Arc::new(Labels { tenant_id: "t".into(), model_name: model.into(), version: 1, slice_profile: "cpu".into() })
    }

    fn request(id: u32) -> Record {
        Record::Request(RequestRecord {
            id,
            at_us: 1,
            success: true,
            rows: 1,
            latency_us: 2,
            bytes_in: 3,
            bytes_out: 4,
        })
    }

    fn contents(file: &SpoolFile) -> Scan {
        scan(&std::fs::read(&file.path).expect("read"))
    }

    #[test]
    fn labels_are_defined_once_per_file_and_files_rotate() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (a, b) = (labels("a"), labels("b"));
        let mut writer = SpoolWriter::open(dir.path(), 200).expect("open");
        writer.append(&a, request).expect("append");
        writer.append(&b, request).expect("append");
        writer.append(&a, request).expect("append");
        let first = files(dir.path()).expect("list");
        assert_eq!(first.len(), 1);
        let scanned = contents(&first[0]);
        let kinds: Vec<String> = scanned.records.iter().map(|(_, r)| format!("{r:?}")[..8].to_string()).collect();
        assert_eq!(kinds, ["Labels(0", "Request(", "Labels(1", "Request(", "Request("]);
        assert!(!scanned.damaged);
        // Past 200 bytes the next append opens a new file with its own dictionary.
        writer.append(&a, |id| Record::Slice(SliceRecord { id, start_us: 0, reserved_us: 9 })).expect("append");
        let all = files(dir.path()).expect("list");
        assert_eq!(all.len(), 2);
        assert_eq!(all[1].seq, all[0].seq + 1);
        assert!(matches!(contents(&all[1]).records[0].1, Record::Labels(0, ref l) if l.model_name == "a"));
        // A new writer (a restart) never appends to an old file.
        drop(writer);
        let mut again = SpoolWriter::open(dir.path(), 200).expect("reopen");
        again.append(&b, request).expect("append");
        assert_eq!(files(dir.path()).expect("list").len(), 3);
    }

    #[test]
    fn files_to_sync_are_the_sealed_ones_and_the_current_one_once_each() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut writer = SpoolWriter::open(dir.path(), 1).expect("open");
        let labels = labels("m");
        writer.append(&labels, |_| request(1)).expect("append");
        writer.append(&labels, |_| request(2)).expect("append, rotating");
        let files = writer.take_unsynced();
        assert_eq!(files.len(), 2, "the sealed file and the current one");
        for file in &files {
            file.sync_data().expect("sync");
        }
        assert_eq!(writer.take_unsynced().len(), 1, "only the current file is left to sync");
    }

    #[test]
    fn a_restart_starts_after_the_cursor_even_when_every_file_is_gone() {
        let dir = tempfile::tempdir().expect("tempdir");
        Cursor { file: 41, offset: 0, pending_end: None }.save(dir.path()).expect("save");
        let mut writer = SpoolWriter::open(dir.path(), ROTATE_BYTES).expect("open");
        writer.append(&labels("a"), request).expect("append");
        assert_eq!(files(dir.path()).expect("list")[0].seq, 42);
    }

    #[test]
    fn the_backlog_counts_from_the_cursor() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut writer = SpoolWriter::open(dir.path(), 100).expect("open");
        for _ in 0..4 {
            writer.append(&labels("a"), request).expect("append");
        }
        let all = files(dir.path()).expect("list");
        let sizes: Vec<u64> = all.iter().map(|f| f.path.metadata().expect("meta").len()).collect();
        assert_eq!(backlog_bytes(dir.path()).expect("backlog"), sizes.iter().sum::<u64>());
        Cursor { file: all[0].seq, offset: 10, pending_end: None }.save(dir.path()).expect("save");
        assert_eq!(backlog_bytes(dir.path()).expect("backlog"), sizes.iter().sum::<u64>() - 10);
        Cursor { file: all[1].seq, offset: 0, pending_end: None }.save(dir.path()).expect("save");
        assert_eq!(backlog_bytes(dir.path()).expect("backlog"), sizes[1..].iter().sum::<u64>());
    }

    #[test]
    fn the_cursor_survives_and_defaults_to_the_start() {
        let dir = tempfile::tempdir().expect("tempdir");
        assert_eq!(Cursor::load(dir.path()).expect("load"), Cursor::default());
        let cursor = Cursor { file: 3, offset: 129, pending_end: Some(400) };
        cursor.save(dir.path()).expect("save");
        assert_eq!(Cursor::load(dir.path()).expect("load"), cursor);
        std::fs::write(dir.path().join(CURSOR_FILE), "{").expect("damage");
        assert!(Cursor::load(dir.path()).is_err());
    }

    #[test]
    fn a_truncated_last_record_is_left_until_complete() {
        let a = labels("a");
        let mut bytes = encode(&Record::Labels(0, Labels::clone(&a))).expect("frame");
        let whole = encode(&request(0)).expect("frame");
        bytes.extend_from_slice(&whole);
        let complete = bytes.len();
        bytes.extend_from_slice(&whole[..whole.len() - 3]);
        let partial = scan(&bytes);
        assert_eq!((partial.records.len(), partial.end, partial.damaged), (2, complete, false));
        bytes.extend_from_slice(&whole[whole.len() - 3..]);
        let finished = scan(&bytes);
        assert_eq!((finished.records.len(), finished.end), (3, bytes.len()));
        assert_eq!(read_at_bytes(&bytes, complete), whole);
        // Garbage (a hole of zeros) stops the scan and says so.
        bytes.extend_from_slice(&[0u8; 32]);
        let damaged = scan(&bytes);
        assert_eq!((damaged.records.len(), damaged.damaged), (3, true));
    }

    fn read_at_bytes(bytes: &[u8], offset: usize) -> Vec<u8> {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("f");
        std::fs::write(&path, bytes).expect("write");
        read_at(&path, offset as u64, 1 << 20).expect("read")
    }
}
