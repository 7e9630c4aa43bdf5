//! A Triton model repository on disk: `<model>/config.pbtxt|config.json`, `<model>/<version>/<file>`.

use std::path::{Path, PathBuf};
use std::time::SystemTime;

use tessera_protocol::inference::{ModelConfig, model_version_policy::PolicyChoice};
use tessera_protocol::model_config;

/// File name used when a config names no `default_model_filename`.
pub use tessera_protocol::archive::DEFAULT_MODEL_FILENAME;

/// A repository directory.
#[derive(Debug, Clone)]
pub struct Repository {
    root: PathBuf,
}

impl Repository {
    /// Opens `root`, which must be a directory.
    pub fn open(root: impl Into<PathBuf>) -> Result<Self, String> {
        let root = root.into();
        if !root.is_dir() {
            return Err(format!("model repository {} is not a directory", root.display()));
        }
        Ok(Self { root })
    }

    /// The repository directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Model names: the repository's visible subdirectories, sorted.
    pub fn model_names(&self) -> Vec<String> {
        let Ok(entries) = std::fs::read_dir(&self.root) else {
            return Vec::new();
        };
        let mut names: Vec<String> = entries
            .flatten()
            .filter(|e| e.path().is_dir())
            .filter_map(|e| e.file_name().into_string().ok())
            .filter(|n| !n.starts_with('.'))
            .collect();
        names.sort();
        names
    }

    /// Whether `name` is a model directory here (a plain name, no path tricks).
    pub fn contains(&self, name: &str) -> bool {
        valid_model_name(name) && self.root.join(name).is_dir()
    }

    /// Reads the model's config file; a model without one gets an empty config to auto-complete.
    pub fn read_config(&self, name: &str) -> Result<ModelConfig, String> {
        let dir = self.root.join(name);
        let pbtxt = dir.join("config.pbtxt");
        let json = dir.join("config.json");
        if pbtxt.is_file() {
            let text = std::fs::read_to_string(&pbtxt).map_err(|e| format!("failed to read config.pbtxt: {e}"))?;
            model_config::from_pbtxt(&text).map_err(|e| format!("invalid config.pbtxt: {e}"))
        } else if json.is_file() {
            let text = std::fs::read_to_string(&json).map_err(|e| format!("failed to read config.json: {e}"))?;
            model_config::from_json(&text).map_err(|e| format!("invalid config.json: {e}"))
        } else {
            Ok(ModelConfig::default())
        }
    }

    /// Version numbers present on disk (numeric subdirectories), ascending.
    pub fn versions_on_disk(&self, name: &str) -> Vec<i64> {
        let Ok(entries) = std::fs::read_dir(self.root.join(name)) else {
            return Vec::new();
        };
        let mut versions: Vec<i64> = entries
            .flatten()
            .filter(|e| e.path().is_dir())
            .filter_map(|e| e.file_name().to_str().and_then(version_of_dir))
            .collect();
        versions.sort_unstable();
        versions
    }

    /// The model file of one version; refused when the config's `default_model_filename` is
    /// not a plain file name.
    pub fn model_file(&self, name: &str, version: i64, config: &ModelConfig) -> Result<PathBuf, String> {
        let file = model_config::model_filename(config, DEFAULT_MODEL_FILENAME)?;
        Ok(self.root.join(name).join(version.to_string()).join(file))
    }

    /// A cheap fingerprint of everything that would change what gets loaded (for polling).
    pub fn fingerprint(&self, name: &str) -> Vec<(PathBuf, Option<SystemTime>, u64)> {
        let mut out = Vec::new();
        let mut stack = vec![self.root.join(name)];
        while let Some(dir) = stack.pop() {
            let Ok(entries) = std::fs::read_dir(&dir) else { continue };
            for entry in entries.flatten() {
                let path = entry.path();
                let meta = entry.metadata().ok();
                if meta.as_ref().is_some_and(|m| m.is_dir()) {
                    stack.push(path.clone());
                }
                out.push((path, meta.as_ref().and_then(|m| m.modified().ok()), meta.map_or(0, |m| m.len())));
            }
        }
        out.sort();
        out
    }
}

pub(crate) use tessera_protocol::archive::version_of_dir;

/// Model names are single path components without hidden-file or traversal tricks.
pub fn valid_model_name(name: &str) -> bool {
    !name.is_empty() && !name.starts_with('.') && !name.contains(['/', '\\', '\0'])
}

/// The versions a config's `version_policy` selects from those available (Triton's rules).
pub fn select_versions(config: &ModelConfig, available: &[i64]) -> Vec<i64> {
    let policy = config.version_policy.as_ref().and_then(|p| p.policy_choice.as_ref());
    match policy {
        Some(PolicyChoice::All(_)) => available.to_vec(),
        Some(PolicyChoice::Specific(s)) => available.iter().copied().filter(|v| s.versions.contains(v)).collect(),
        Some(PolicyChoice::Latest(l)) => latest(available, l.num_versions.max(1) as usize),
        None => latest(available, 1),
    }
}

fn latest(available: &[i64], n: usize) -> Vec<i64> {
    let skip = available.len().saturating_sub(n);
    available[skip..].to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_protocol::inference::{ModelVersionPolicy, model_version_policy};

    fn with_policy(choice: PolicyChoice) -> ModelConfig {
        ModelConfig { version_policy: Some(ModelVersionPolicy { policy_choice: Some(choice) }), ..Default::default() }
    }

    #[test]
    fn version_policies_pick_like_triton() {
        let available = [1, 2, 3];
        assert_eq!(select_versions(&ModelConfig::default(), &available), vec![3]);
        assert_eq!(
            select_versions(&with_policy(PolicyChoice::All(model_version_policy::All {})), &available),
            vec![1, 2, 3]
        );
        let latest2 = PolicyChoice::Latest(model_version_policy::Latest { num_versions: 2 });
        assert_eq!(select_versions(&with_policy(latest2), &available), vec![2, 3]);
        let specific = PolicyChoice::Specific(model_version_policy::Specific { versions: vec![1, 3, 9] });
        assert_eq!(select_versions(&with_policy(specific), &available), vec![1, 3]);
        assert!(select_versions(&ModelConfig::default(), &[]).is_empty());
    }

    #[test]
    fn repository_lists_models_versions_and_reads_configs() {
        let dir = tempfile::tempdir().expect("tempdir");
        let m = dir.path().join("m");
        std::fs::create_dir_all(m.join("1")).expect("mkdir");
        std::fs::create_dir_all(m.join("10")).expect("mkdir");
        std::fs::create_dir_all(m.join("notes")).expect("mkdir");
        std::fs::create_dir_all(dir.path().join(".hidden")).expect("mkdir");
        std::fs::write(m.join("config.pbtxt"), "max_batch_size: 8\ndefault_model_filename: \"net.onnx\"")
            .expect("write");
        let repo = Repository::open(dir.path()).expect("open");
        assert_eq!(repo.model_names(), vec!["m".to_string()]);
        assert_eq!(repo.versions_on_disk("m"), vec![1, 10]);
        let config = repo.read_config("m").expect("config");
        assert_eq!(config.max_batch_size, 8);
        assert!(repo.model_file("m", 1, &config).expect("a file name").ends_with("m/1/net.onnx"));
        let outside = ModelConfig { default_model_filename: "../../other/1/model.onnx".into(), ..config.clone() };
        assert!(repo.model_file("m", 1, &outside).expect_err("a path").contains("default_model_filename"));
        std::fs::write(m.join("config.pbtxt"), "max_batch_size: {").expect("write");
        assert!(repo.read_config("m").expect_err("bad").contains("config.pbtxt"));
        assert!(!repo.contains("../m") && !repo.contains(".hidden"));
    }
}
