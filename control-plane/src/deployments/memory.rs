//! How much memory a replica is given: what the scheduler fits onto slices and what a
//! deployment shows. One rule, used by both.

/// Memory a replica gets when its deployment does not say: four times the artifact, at least this.
pub const MIN_REPLICA_MEMORY: i64 = 64 * 1024 * 1024;

/// Memory of a replica: the deployment's setting, else four times the artifact (at least
/// [`MIN_REPLICA_MEMORY`]).
pub fn replica_memory(memory_bytes: Option<i64>, artifact_size: i64) -> i64 {
    memory_bytes.unwrap_or_else(|| artifact_size.saturating_mul(4).max(MIN_REPLICA_MEMORY))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_defaults_from_the_artifact() {
        assert_eq!(replica_memory(None, 100 << 20), 400 << 20);
        assert_eq!(replica_memory(None, 10), MIN_REPLICA_MEMORY);
        assert_eq!(replica_memory(Some(7), 100 << 20), 7);
        assert_eq!(replica_memory(None, i64::MAX), i64::MAX);
    }
}
