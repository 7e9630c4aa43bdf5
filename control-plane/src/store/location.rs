//! Where the artifact store is: the `--object-store` value (`s3://`, `gs://`, `az://`, a
//! directory) read into an `object_store` backend under an optional key prefix.
//!
//! Credentials and endpoints come from each provider's usual variables (`AWS_*`, `GOOGLE_*`,
//! `AZURE_*`), as their own tools read them, so a pod's workload identity or a mounted key
//! file works without Tessera knowing about it.

use std::sync::Arc;

use anyhow::Context;
use object_store::ObjectStore;
use object_store::aws::AmazonS3Builder;
use object_store::azure::MicrosoftAzureBuilder;
use object_store::gcp::GoogleCloudStorageBuilder;
use object_store::local::LocalFileSystem;
use object_store::prefix::PrefixStore;
use object_store::signer::Signer;

/// An opened store: what reads and writes go to, and what presigns URLs where the provider
/// can (S3-compatible stores only: a presigned Azure PUT needs a header plain clients do not
/// send, and GCS signing needs a service-account key most deployments do not mount).
pub(super) struct Opened {
    pub store: Arc<dyn ObjectStore>,
    pub signer: Option<Arc<dyn Signer>>,
    pub description: String,
}

/// A cloud store named by URL: provider, bucket (or container) and key prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct CloudUrl {
    pub provider: Provider,
    pub bucket: String,
    /// Keys are stored under this prefix (no leading or trailing `/`); empty for none.
    pub prefix: String,
}

/// The object store providers Tessera opens by URL.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Provider {
    /// `s3://`: AWS S3 or any S3-compatible server.
    S3,
    /// `gs://`: Google Cloud Storage.
    Gcs,
    /// `az://` or `azure://`: an Azure Blob Storage container.
    Azure,
}

impl CloudUrl {
    /// Reads `spec` as a cloud URL; `Ok(None)` when it names a local directory.
    pub fn parse(spec: &str) -> anyhow::Result<Option<CloudUrl>> {
        let Some((scheme, rest)) = spec.split_once("://") else { return Ok(None) };
        let provider = match scheme {
            "s3" => Provider::S3,
            "gs" => Provider::Gcs,
            "az" | "azure" => Provider::Azure,
            "file" => return Ok(None),
            other => anyhow::bail!(
                "unsupported object store scheme {other}:// in {spec} (use s3://, gs://, az://, file:// or a directory)"
            ),
        };
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        if bucket.is_empty() {
            anyhow::bail!("the object store URL {spec} names no bucket or container");
        }
        if bucket.contains(['?', '#', '@']) || prefix.contains(['?', '#']) {
            anyhow::bail!("the object store URL {spec} may hold only a bucket and a key prefix");
        }
        let prefix = prefix.trim_matches('/').to_string();
        if prefix.split('/').any(|part| part.is_empty() || part == "." || part == "..") && !prefix.is_empty() {
            anyhow::bail!("the object store URL {spec} has an empty, `.` or `..` segment in its prefix");
        }
        Ok(Some(CloudUrl { provider, bucket: bucket.to_string(), prefix }))
    }
}

/// Opens `spec`: a cloud URL (see [`CloudUrl`]), `file:///dir`, or a plain directory path
/// (created if missing).
pub(super) fn open(spec: &str) -> anyhow::Result<Opened> {
    match CloudUrl::parse(spec)? {
        Some(url) => open_cloud(&url, spec),
        None => open_local(spec.strip_prefix("file://").unwrap_or(spec)),
    }
}

fn open_cloud(url: &CloudUrl, spec: &str) -> anyhow::Result<Opened> {
    let description = spec.to_string();
    let opened = match url.provider {
        Provider::S3 => {
            let s3 = AmazonS3Builder::from_env()
                .with_bucket_name(&url.bucket)
                .build()
                .with_context(|| format!("configure the S3 store {spec}"))?;
            // The prefixed store signs prefixed keys too, so presigned uploads land where
            // reads look.
            let s3 = Arc::new(PrefixStore::new(s3, url.prefix.as_str()));
            Opened { store: s3.clone(), signer: Some(s3), description }
        }
        Provider::Gcs => {
            let gcs = GoogleCloudStorageBuilder::from_env()
                .with_bucket_name(&url.bucket)
                .build()
                .with_context(|| format!("configure the Google Cloud Storage store {spec}"))?;
            Opened { store: Arc::new(PrefixStore::new(gcs, url.prefix.as_str())), signer: None, description }
        }
        Provider::Azure => {
            let azure = MicrosoftAzureBuilder::from_env()
                .with_container_name(&url.bucket)
                .build()
                .with_context(|| format!("configure the Azure Blob Storage store {spec}"))?;
            Opened { store: Arc::new(PrefixStore::new(azure, url.prefix.as_str())), signer: None, description }
        }
    };
    Ok(opened)
}

fn open_local(dir: &str) -> anyhow::Result<Opened> {
    std::fs::create_dir_all(dir).with_context(|| format!("create the artifact directory {dir}"))?;
    let local = LocalFileSystem::new_with_prefix(dir).with_context(|| format!("open the artifact directory {dir}"))?;
    Ok(Opened { store: Arc::new(local), signer: None, description: format!("local:{dir}") })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cloud(spec: &str) -> CloudUrl {
        CloudUrl::parse(spec).expect("parses").expect("a cloud url")
    }

    #[test]
    fn cloud_urls_name_provider_bucket_and_prefix() {
        assert_eq!(
            cloud("s3://artifacts"),
            CloudUrl { provider: Provider::S3, bucket: "artifacts".into(), prefix: "".into() }
        );
        assert_eq!(cloud("gs://b/tessera/prod/").prefix, "tessera/prod");
        assert_eq!(cloud("gs://b/tessera/prod/").provider, Provider::Gcs);
        assert_eq!(cloud("az://models/x").provider, Provider::Azure);
        assert_eq!(cloud("azure://models").bucket, "models");
    }

    #[test]
    fn directories_are_not_cloud_urls() {
        assert_eq!(CloudUrl::parse("tessera-artifacts").expect("parses"), None);
        assert_eq!(CloudUrl::parse("/var/lib/tessera").expect("parses"), None);
        assert_eq!(CloudUrl::parse("file:///var/lib/tessera").expect("parses"), None);
    }

    #[test]
    fn bad_urls_say_what_is_wrong() {
        let err = |spec: &str| CloudUrl::parse(spec).expect_err("refused").to_string();
        assert!(err("ftp://x").contains("unsupported object store scheme ftp://"), "{}", err("ftp://x"));
        assert!(err("s3://").contains("names no bucket"));
        assert!(err("s3:///prefix").contains("names no bucket"));
        assert!(err("gs://b/a/../c").contains("`..`"));
        assert!(err("az://user@container").contains("only a bucket"));
    }

    #[test]
    fn every_provider_opens_without_touching_the_network() {
        // Building a client checks its configuration only; credentials are fetched on use.
        // (Azure needs an account name from the environment, so it is opened by the e2e test
        // against Azurite instead.)
        for spec in ["s3://artifacts/p", "gs://artifacts/p"] {
            let opened = open(spec).unwrap_or_else(|e| panic!("{spec}: {e:#}"));
            assert_eq!(opened.description, spec);
            assert_eq!(opened.signer.is_some(), spec.starts_with("s3://"));
        }
    }
}
