//! Where the client finds the control plane, its key, tenant and the CA it trusts: flags, then
//! the `TESSERA_URL`, `TESSERA_API_KEY`, `TESSERA_TENANT`, `TESSERA_CA_CERT` variables (both
//! through clap), then the
//! config file (`$TESSERA_CONFIG`, else `$XDG_CONFIG_HOME/tessera/config.json`, else
//! `~/.config/tessera/config.json`), which `tessera login` writes with mode 0600.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use serde::{Deserialize, Serialize};

/// Connection flags every client verb takes.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct ConnectionArgs {
    /// Control plane URL, e.g. `http://127.0.0.1:8080`.
    #[arg(long, env = "TESSERA_URL")]
    pub url: Option<String>,
    /// API key (`tsk_…`).
    #[arg(long = "key", alias = "api-key", env = "TESSERA_API_KEY", hide_env_values = true)]
    pub key: Option<String>,
    /// Tenant to act in (default: the key's own).
    #[arg(long, env = "TESSERA_TENANT")]
    pub tenant: Option<String>,
    /// PEM certificate to trust for https besides the system's roots (e.g. the CA `tessera dev
    /// --tls` prints).
    #[arg(long, env = "TESSERA_CA_CERT")]
    pub ca_cert: Option<PathBuf>,
}

/// What `tessera login` saves.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConfigFile {
    /// Control plane URL.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// API key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_key: Option<String>,
    /// Tenant name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    /// CA certificate trusted for https.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_cert: Option<PathBuf>,
}

/// Resolved connection settings.
#[derive(Clone)]
pub struct Settings {
    /// Control plane URL, without a trailing `/`.
    pub url: String,
    /// API key.
    pub key: String,
    /// Tenant name.
    pub tenant: String,
    /// CA certificate trusted for https besides the system's roots.
    pub ca_cert: Option<PathBuf>,
}

impl std::fmt::Debug for Settings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Settings").field("url", &self.url).field("tenant", &self.tenant).finish_non_exhaustive()
    }
}

/// The config file's path.
pub fn config_path() -> anyhow::Result<PathBuf> {
    if let Some(path) = std::env::var_os("TESSERA_CONFIG").filter(|p| !p.is_empty()) {
        return Ok(PathBuf::from(path));
    }
    if let Some(dir) = std::env::var_os("XDG_CONFIG_HOME").filter(|p| !p.is_empty()) {
        return Ok(PathBuf::from(dir).join("tessera/config.json"));
    }
    match std::env::var_os("HOME").filter(|p| !p.is_empty()) {
        Some(home) => Ok(PathBuf::from(home).join(".config/tessera/config.json")),
        None => bail!("no config file location: set TESSERA_CONFIG or HOME"),
    }
}

impl ConfigFile {
    /// Reads the config file; a missing file is an empty config.
    pub fn load(path: &Path) -> anyhow::Result<Self> {
        match std::fs::read_to_string(path) {
            Ok(text) => serde_json::from_str(&text).with_context(|| format!("read the config file {}", path.display())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Self::default()),
            Err(e) => Err(e).with_context(|| format!("read the config file {}", path.display())),
        }
    }

    /// Writes the config file, readable by its owner only (it holds a key).
    pub fn save(&self, path: &Path) -> anyhow::Result<()> {
        let text = serde_json::to_string_pretty(self).context("encode the config")?;
        write_private(path, text.as_bytes()).with_context(|| format!("write the config file {}", path.display()))
    }
}

/// Writes `bytes` to `path` with mode 0600 (through a temporary file renamed into place, so
/// a reader never sees half a file and the secret is never world-readable).
pub fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let mut file = options.open(&tmp)?;
    file.write_all(bytes)?;
    file.sync_all()?;
    drop(file);
    std::fs::rename(&tmp, path)
}

impl ConnectionArgs {
    /// The settings, falling back to the config file for what flags and variables leave out.
    pub fn resolve(&self) -> anyhow::Result<Settings> {
        let complete = self.url.is_some() && self.key.is_some() && self.tenant.is_some();
        let file = if complete { ConfigFile::default() } else { ConfigFile::load(&config_path()?)? };
        self.resolve_with(file)
    }

    /// The settings and a client of the control plane they name.
    pub fn connect(&self) -> anyhow::Result<(Settings, super::api::ApiClient)> {
        let settings = self.resolve()?;
        let api = super::api::ApiClient::new(&settings.url, &settings.key, settings.ca_cert.as_deref())?;
        Ok((settings, api))
    }

    fn resolve_with(&self, file: ConfigFile) -> anyhow::Result<Settings> {
        let hint = "run `tessera login --url URL --key KEY` or set";
        let url = self.url.clone().or(file.url).with_context(|| format!("no control plane URL: {hint} TESSERA_URL"))?;
        let key = self.key.clone().or(file.api_key).with_context(|| format!("no API key: {hint} TESSERA_API_KEY"))?;
        let tenant =
            self.tenant.clone().or(file.tenant).with_context(|| format!("no tenant: {hint} TESSERA_TENANT"))?;
        let ca_cert = self.ca_cert.clone().or(file.ca_cert);
        Ok(Settings { url: url.trim_end_matches('/').to_string(), key, tenant, ca_cert })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_win_over_the_file() {
        let args = ConnectionArgs { url: Some("http://flag/".into()), ..ConnectionArgs::default() };
        let file = ConfigFile {
            url: Some("http://file".into()),
            api_key: Some("k".into()),
            tenant: Some("demo".into()),
            ca_cert: Some("ca.pem".into()),
        };
        let s = args.resolve_with(file).expect("complete");
        assert_eq!((s.url.as_str(), s.key.as_str(), s.tenant.as_str()), ("http://flag", "k", "demo"));
        assert_eq!(s.ca_cert, Some(PathBuf::from("ca.pem")), "the CA saved by login is used");
    }

    #[test]
    fn a_missing_setting_says_how_to_give_it() {
        let err = ConnectionArgs::default().resolve_with(ConfigFile::default()).expect_err("nothing set");
        assert!(err.to_string().contains("tessera login"), "{err}");
    }

    #[test]
    fn the_config_file_is_private_and_round_trips() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("sub/config.json");
        let file = ConfigFile { url: Some("http://x".into()), api_key: Some("tsk_x".into()), ..ConfigFile::default() };
        file.save(&path).expect("save");
        assert_eq!(ConfigFile::load(&path).expect("load"), file);
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&path).expect("stat").permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        assert_eq!(ConfigFile::load(&dir.path().join("none.json")).expect("missing"), ConfigFile::default());
    }
}
