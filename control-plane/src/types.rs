//! Validated domain values shared by the registry and the API: roles (the shared
//! [`tessera_protocol::auth::Role`]), resource names, formats.

use std::fmt;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::error::Error;

/// What a credential may do: the contract both planes read.
pub use tessera_protocol::auth::Role;

/// A resource name (tenant, model, alias): 1–63 characters of `a-z`, `0-9`, `-`, `_`, `.`,
/// starting with a letter or digit. Safe in URLs, object-store keys and Triton repositories.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Name(String);

impl Name {
    /// Longest accepted name.
    pub const MAX_LEN: usize = 63;

    /// Parses a name, describing what is wrong.
    pub fn parse(s: &str) -> Result<Self, String> {
        if s.is_empty() || s.len() > Self::MAX_LEN {
            return Err(format!("must be 1 to {} characters long", Self::MAX_LEN));
        }
        let first_ok = s.bytes().next().is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
        let rest_ok = s.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"-_.".contains(&b));
        if !first_ok || !rest_ok {
            return Err("must be lower-case letters, digits, '-', '_' or '.', starting with a letter or digit".into());
        }
        Ok(Name(s.to_string()))
    }

    /// Parses a path segment, blaming `field` when it is not a valid name.
    pub fn from_path(field: &str, s: &str) -> Result<Self, Error> {
        Name::parse(s).map_err(|m| Error::invalid(field, format!("{field} {m}")))
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for Name {
    type Error = String;

    fn try_from(s: String) -> Result<Self, String> {
        Name::parse(&s)
    }
}

impl From<Name> for String {
    fn from(n: Name) -> String {
        n.0
    }
}

impl fmt::Display for Name {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Earliest time a stored timestamp may name (a price's `effective_from`, a key's expiry):
/// 2000-01-01T00:00:00Z.
pub const EARLIEST_TIME: i64 = 946_684_800;
/// Latest: 9999-12-31T23:59:59Z.
pub const LATEST_TIME: i64 = 253_402_300_799;

/// Refuses a time outside [`EARLIEST_TIME`]..=[`LATEST_TIME`], blaming `field`: RFC 3339 lets
/// a client send year 0, which nothing here means.
pub fn check_time(field: &str, t: time::OffsetDateTime) -> Result<(), Error> {
    if (EARLIEST_TIME..=LATEST_TIME).contains(&t.unix_timestamp()) {
        Ok(())
    } else {
        Err(Error::invalid(field, format!("{field} must be between 2000-01-01T00:00:00Z and 9999-12-31T23:59:59Z")))
    }
}

/// Whether `s` names a slice profile: `cpu`, `gpu` or `mig-<profile>` (1 to 32 of `a-z`,
/// `0-9`, `.`, e.g. `mig-1g.10gb`).
pub fn is_slice_profile(s: &str) -> bool {
    let mig_ok = s.strip_prefix("mig-").is_some_and(|p| {
        !p.is_empty() && p.len() <= 32 && p.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'.')
    });
    s == "cpu" || s == "gpu" || mig_ok
}

/// Whether a slice profile is a GPU's: a whole GPU (`gpu`) or a MIG instance (`mig-…`).
pub fn is_gpu_profile(profile: &str) -> bool {
    profile == "gpu" || profile.starts_with("mig-")
}

/// The pattern [`is_slice_profile`] accepts, for OpenAPI schemas.
pub const SLICE_PROFILE_PATTERN: &str = "^(cpu|gpu|mig-[a-z0-9.]{1,32})$";

/// A user's email address, lower-cased: `local@domain`, at most 254 characters, no spaces or
/// control characters. Not proof the mailbox exists; only a stable, unique handle per tenant.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Email(String);

impl Email {
    /// Longest accepted address (RFC 5321's path limit less the brackets).
    pub const MAX_LEN: usize = 254;

    /// Parses an address, describing what is wrong.
    pub fn parse(s: &str) -> Result<Self, String> {
        let s = s.trim();
        if s.is_empty() || s.len() > Self::MAX_LEN {
            return Err(format!("email must be 1 to {} characters long", Self::MAX_LEN));
        }
        if s.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err("email must not contain spaces or control characters".into());
        }
        match s.split_once('@') {
            Some((local, domain)) if !local.is_empty() && !domain.is_empty() && !domain.contains('@') => {
                Ok(Email(s.to_lowercase()))
            }
            _ => Err("email must look like name@example.com".into()),
        }
    }
}

impl TryFrom<String> for Email {
    type Error = String;

    fn try_from(s: String) -> Result<Self, String> {
        Email::parse(&s)
    }
}

impl From<Email> for String {
    fn from(e: Email) -> String {
        e.0
    }
}

impl fmt::Display for Email {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// How a model version's artifact is packaged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum ArtifactFormat {
    /// A single ONNX file.
    Onnx,
    /// A tar archive of a Triton model directory, optionally gzipped.
    Tar,
    /// A zip archive of a Triton model directory.
    Zip,
}

impl ArtifactFormat {
    /// The format's wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            ArtifactFormat::Onnx => "onnx",
            ArtifactFormat::Tar => "tar",
            ArtifactFormat::Zip => "zip",
        }
    }

    /// Parses a stored format name.
    pub fn parse(s: &str) -> Option<Self> {
        [ArtifactFormat::Onnx, ArtifactFormat::Tar, ArtifactFormat::Zip].into_iter().find(|f| f.as_str() == s)
    }

    /// File name of the artifact in the object store.
    pub fn file_name(self) -> &'static str {
        match self {
            ArtifactFormat::Onnx => "model.onnx",
            ArtifactFormat::Tar => "model.tar",
            ArtifactFormat::Zip => "model.zip",
        }
    }

    /// Checks the first bytes of an artifact against the format's signature, so a zip sent as
    /// `onnx` (or an HTML error page sent as anything) is refused as soon as it is stored. Only
    /// a first filter: ONNX files are then walked whole ([`crate::onnx`]), archives read
    /// through ([`crate::archive`]).
    pub fn matches_head(self, head: &[u8]) -> bool {
        match self {
            // ONNX is a protobuf ModelProto: its first byte is the key of one of its fields
            // (ir_version = 1 .. graph = 7, opset_import = 8, metadata_props = 14, or a
            // two-byte key for the newer fields), with a varint, fixed or length wire type.
            ArtifactFormat::Onnx => head.first().is_some_and(|&b| {
                let (field, wire) = (b >> 3, b & 0x07);
                let wire_ok = matches!(wire, 0 | 1 | 2 | 5);
                wire_ok && (b & 0x80 != 0 || (1..=8).contains(&field) || field == 14)
            }),
            ArtifactFormat::Tar => {
                (head.len() >= 262 && &head[257..262] == b"ustar") || head.starts_with(&[0x1f, 0x8b])
            }
            ArtifactFormat::Zip => head.starts_with(b"PK\x03\x04"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked() {
        for ok in ["a", "resnet-50", "bert_base.v2", "0day"] {
            assert!(Name::parse(ok).is_ok(), "{ok}");
        }
        for bad in ["", "-a", "A", "a/b", "a b", "é", &"x".repeat(64)] {
            assert!(Name::parse(bad).is_err(), "{bad}");
        }
        let e = serde_json::from_str::<Name>("\"Bad\"").map(|_| ()).unwrap_err();
        assert!(e.to_string().contains("lower-case"));
    }

    #[test]
    fn emails_are_checked_and_lower_cased() {
        assert_eq!(Email::parse(" Ada@Example.COM ").unwrap().to_string(), "ada@example.com");
        for bad in [
            "",
            "ada",
            "@example.com",
            "ada@",
            "a@b@c",
            "a da@x.io",
            "a\u{0}@x.io",
            &format!("{}@x.io", "a".repeat(250)),
        ] {
            assert!(Email::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn times_are_bounded() {
        use time::macros::datetime;
        assert!(check_time("t", datetime!(2000-01-01 0:00 UTC)).is_ok());
        assert!(check_time("t", datetime!(9999-12-31 23:59:59 UTC)).is_ok());
        assert!(check_time("t", datetime!(0000-01-01 0:00 UTC)).is_err());
        assert!(check_time("t", datetime!(1999-12-31 23:59:59 UTC)).is_err());
    }

    #[test]
    fn formats_check_their_signatures() {
        assert!(ArtifactFormat::Zip.matches_head(b"PK\x03\x04rest"));
        assert!(!ArtifactFormat::Zip.matches_head(b"<html>"));
        let mut tar = vec![0u8; 512];
        tar[257..262].copy_from_slice(b"ustar");
        assert!(ArtifactFormat::Tar.matches_head(&tar));
        assert!(ArtifactFormat::Onnx.matches_head(&[0x08, 0x07]));
        assert!(!ArtifactFormat::Onnx.matches_head(b""));
        assert!(!ArtifactFormat::Onnx.matches_head(&[0x07]));
        assert!(!ArtifactFormat::Onnx.matches_head(b"PK\x03\x04"));
        assert!(!ArtifactFormat::Onnx.matches_head(b"<html>"));
        assert!(!ArtifactFormat::Onnx.matches_head(b"{\"a\": 1}"));
    }
}
