//! Triton's JSON trace file: a JSON array of objects, per trace one
//! `{"id", "model_name", "model_version", "request_id"}` object and one
//! `{"id", "timestamps": [{"name", "ns"}]}` object per event, in steady-clock nanoseconds.
//!
//! With `log_frequency` 0 every trace goes to `<file>`, which is rewritten after each trace so
//! it is always a complete JSON array (Triton writes it only at exit); with `log_frequency` N
//! every N traces go to a new `<file>.<index>`, the index counting from 0 as in Triton.

use std::fs::File;
use std::io::{Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use serde_json::json;

use super::record::Finished;

/// The objects of one trace, comma-separated (no brackets).
pub fn trace_objects(trace: &Finished) -> String {
    let mut info = json!({"id": trace.id, "model_name": trace.model, "model_version": trace.version});
    if !trace.request_id.is_empty() {
        info["request_id"] = json!(trace.request_id);
    }
    // A composing model's trace names its ensemble's, as Triton's does.
    if trace.lineage.parent_id != 0 {
        info["parent_id"] = json!(trace.lineage.parent_id);
    }
    let mut parts = vec![info.to_string()];
    for (event, steady_ns, _) in &trace.events {
        parts.push(json!({"id": trace.id, "timestamps": [{"name": event.as_str(), "ns": steady_ns}]}).to_string());
    }
    parts.join(",")
}

/// Writes the traces that arrive on `traces` until every sender is gone, then writes what a
/// rotation still held.
pub fn run_writer(path: PathBuf, traces: crossbeam_channel::Receiver<Finished>) {
    let mut writer = Writer { path, main: None, held: Vec::new(), index: 0 };
    while let Ok(trace) = traces.recv() {
        if let Err(e) = writer.write(&trace) {
            tracing::warn!(file = %writer.path.display(), error = %e, "trace could not be written");
        }
    }
    if let Err(e) = writer.flush_rotation() {
        tracing::warn!(file = %writer.path.display(), error = %e, "trace could not be written");
    }
}

struct Writer {
    path: PathBuf,
    /// `<file>` once the first unrotated trace was written to it.
    main: Option<File>,
    /// Traces waiting for their rotation's file.
    held: Vec<String>,
    /// The next rotation's index.
    index: u64,
}

impl Writer {
    fn write(&mut self, trace: &Finished) -> std::io::Result<()> {
        let objects = trace_objects(trace);
        if trace.log_frequency == 0 {
            return self.append_main(&objects);
        }
        self.held.push(objects);
        if self.held.len() >= trace.log_frequency as usize {
            self.flush_rotation()?;
        }
        Ok(())
    }

    /// Appends to `<file>`, replacing its closing bracket so the file stays a JSON array.
    fn append_main(&mut self, objects: &str) -> std::io::Result<()> {
        match &mut self.main {
            Some(file) => {
                file.seek(SeekFrom::End(-1))?;
                file.write_all(format!(",{objects}]").as_bytes())?;
            }
            None => {
                let mut file = File::create(&self.path)?;
                file.write_all(format!("[{objects}]").as_bytes())?;
                self.main = Some(file);
            }
        }
        Ok(())
    }

    /// Writes the held traces to `<file>.<index>`.
    fn flush_rotation(&mut self) -> std::io::Result<()> {
        if self.held.is_empty() {
            return Ok(());
        }
        let path = rotated(&self.path, self.index);
        self.index += 1;
        let body = format!("[{}]", self.held.join(","));
        self.held.clear();
        std::fs::write(path, body)
    }
}

fn rotated(path: &Path, index: u64) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(format!(".{index}"));
    PathBuf::from(name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::record::Event;

    fn trace(id: u64, log_frequency: u32) -> Finished {
        Finished {
            id,
            model: "add_sub".into(),
            version: 1,
            request_id: format!("r{id}"),
            lineage: crate::trace::record::Lineage::root(None),
            log_frequency,
            events: vec![(Event::RequestStart, 10, 1_010), (Event::RequestEnd, 20, 1_020)],
        }
    }

    fn read(path: &Path) -> serde_json::Value {
        serde_json::from_slice(&std::fs::read(path).expect("written")).expect("a JSON document")
    }

    #[test]
    fn a_trace_is_an_info_object_and_one_object_per_event() {
        let objects: serde_json::Value =
            serde_json::from_str(&format!("[{}]", trace_objects(&trace(3, 0)))).expect("JSON");
        assert_eq!(
            objects,
            json!([
                {"id": 3, "model_name": "add_sub", "model_version": 1, "request_id": "r3"},
                {"id": 3, "timestamps": [{"name": "REQUEST_START", "ns": 10}]},
                {"id": 3, "timestamps": [{"name": "REQUEST_END", "ns": 20}]},
            ])
        );
    }

    #[test]
    fn the_file_stays_a_json_array_and_rotations_get_their_own_files() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("trace.json");
        let (tx, rx) = crossbeam_channel::unbounded();
        for t in [trace(1, 0), trace(2, 0), trace(3, 2), trace(4, 2), trace(5, 2)] {
            tx.send(t).expect("open");
        }
        drop(tx);
        run_writer(path.clone(), rx);
        let main = read(&path);
        assert_eq!(main.as_array().map(Vec::len), Some(6), "{main}");
        let first = read(&rotated(&path, 0));
        let ids: Vec<_> = first.as_array().expect("array").iter().map(|o| o["id"].as_u64()).collect();
        assert_eq!(ids, [Some(3), Some(3), Some(3), Some(4), Some(4), Some(4)]);
        // The leftover trace is written when the writer stops.
        assert_eq!(read(&rotated(&path, 1)).as_array().map(Vec::len), Some(3));
    }
}
