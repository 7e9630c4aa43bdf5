//! The last assignment set, kept on disk so that a worker restarted while the control plane is
//! unreachable goes back to serving what it was last told to serve (static stability); the
//! artifacts themselves are already in the cache.

use std::path::{Path, PathBuf};

use prost::Message;
use tessera_protocol::agent;

/// Where the last assignment set lives: `<data-dir>/assignments.pb`.
#[derive(Debug, Clone)]
pub struct SavedAssignments {
    path: PathBuf,
}

impl SavedAssignments {
    /// The file in `data_dir`.
    pub fn in_dir(data_dir: &Path) -> Self {
        Self { path: data_dir.join("assignments.pb") }
    }

    /// The saved set; `None` when there is none or it cannot be read (logged: the control
    /// plane sends a fresh one on connect anyway).
    pub fn load(&self) -> Option<agent::Assignments> {
        let bytes = match std::fs::read(&self.path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
            Err(e) => {
                tracing::warn!(path = %self.path.display(), error = %e, "cannot read the saved assignments");
                return None;
            }
        };
        match agent::Assignments::decode(bytes.as_slice()) {
            Ok(set) => Some(set),
            Err(e) => {
                tracing::warn!(path = %self.path.display(), error = %e, "saved assignments are damaged; ignoring them");
                None
            }
        }
    }

    /// Replaces the saved set (written aside, then renamed, so a crash leaves the old or the new
    /// set, never half of one).
    pub fn save(&self, set: &agent::Assignments) -> std::io::Result<()> {
        let tmp = self.path.with_extension("pb.tmp");
        std::fs::write(&tmp, set.encode_to_vec())?;
        std::fs::rename(&tmp, &self.path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_saved_set_comes_back_and_damage_is_ignored() {
        let dir = tempfile::tempdir().expect("tempdir");
        let saved = SavedAssignments::in_dir(dir.path());
        assert_eq!(saved.load(), None);
        let set = agent::Assignments {
            generation: 7,
            assignments: vec![agent::Assignment { replica_id: "r1".into(), version: 2, ..Default::default() }],
        };
        saved.save(&set).expect("save");
        assert_eq!(saved.load(), Some(set));
        std::fs::write(dir.path().join("assignments.pb"), b"\xff\xff\xff").expect("damage");
        assert_eq!(saved.load(), None);
    }
}
