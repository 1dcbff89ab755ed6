//! The S3 side of replication: PUT, DELETE, GET and LIST of blob objects, with errors
//! classified as transient (retry) or permanent (dead-letter).

use aws_sdk_s3::config::{BehaviorVersion, Credentials, Region};
use aws_sdk_s3::error::SdkError;
use aws_sdk_s3::primitives::ByteStream;
use aws_smithy_types::error::display::DisplayErrorContext;
use aws_smithy_types::retry::RetryConfig;
use aws_smithy_types::timeout::TimeoutConfig;
use std::collections::HashMap;
use std::time::Duration;
use zlink_wire::blob::{self, Blob, Tombstone};

#[derive(Debug, Clone, clap::Args)]
pub struct S3Config {
    /// S3 endpoint URL (path-style addressing is used).
    #[arg(
        long,
        env = "ZLINK_S3_ENDPOINT",
        default_value = "http://127.0.0.1:8333"
    )]
    pub s3_endpoint: String,
    /// Bucket holding the blobs.
    #[arg(long, env = "ZLINK_S3_BUCKET", default_value = "links")]
    pub s3_bucket: String,
    /// Key prefix of every blob (the key is prefix + slug).
    #[arg(long, env = "ZLINK_S3_PREFIX", default_value = "")]
    pub s3_prefix: String,
    #[arg(long, env = "ZLINK_S3_REGION", default_value = "us-east-1")]
    pub s3_region: String,
    #[arg(long, env = "ZLINK_S3_ACCESS_KEY", hide_env_values = true)]
    pub s3_access_key: String,
    #[arg(long, env = "ZLINK_S3_SECRET_KEY", hide_env_values = true)]
    pub s3_secret_key: crate::Secret,
    /// Cache-Control stored with each blob (what nginx passes on when it serves the blob).
    #[arg(
        long,
        env = "ZLINK_BLOB_CACHE_CONTROL",
        default_value = "public, max-age=300"
    )]
    pub blob_cache_control: String,
    /// Budget for one S3 request, milliseconds. Well under ε (5 s, docs/design/budgets.md):
    /// the replicator applies a partition's events in order, so a PUT sent into a hung S3
    /// holds that partition's later links for one budget after S3 answers again (at 5 s a
    /// create took 5.6 s to every rung). Every request here is one small object or one page of
    /// a listing; the lastresort's reads have their own tighter `--s3-budget-ms` inside this.
    #[arg(long, env = "ZLINK_S3_TIMEOUT_MS", default_value_t = 2000)]
    pub s3_timeout_ms: u64,
    /// PEM file of CA certificates trusted for an `https://` endpoint besides the system's
    /// roots (a private CA in front of the store, the local topology's CA). The server's
    /// certificate is always verified: there is no option to skip it.
    #[arg(long, env = "ZLINK_S3_CA_FILE")]
    pub s3_ca_file: Option<std::path::PathBuf>,
}

impl S3Config {
    pub fn validate(&self) -> Result<(), String> {
        if !(self.s3_endpoint.starts_with("http://") || self.s3_endpoint.starts_with("https://")) {
            return Err("--s3-endpoint must be an http(s) URL".into());
        }
        if self.s3_bucket.is_empty()
            || !self
                .s3_bucket
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"-.".contains(&b))
        {
            return Err("--s3-bucket must be a valid lowercase bucket name".into());
        }
        if !self
            .s3_prefix
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_/.".contains(&b))
        {
            return Err("--s3-prefix may contain only [A-Za-z0-9-_/.]".into());
        }
        if self.s3_access_key.is_empty() || self.s3_secret_key.0.is_empty() {
            return Err("--s3-access-key and --s3-secret-key are required".into());
        }
        if http::HeaderValue::from_str(&self.blob_cache_control).is_err() {
            return Err("--blob-cache-control is not a valid header value".into());
        }
        if let Some(path) = &self.s3_ca_file {
            if !self.s3_endpoint.starts_with("https://") {
                return Err("--s3-ca-file needs an https:// --s3-endpoint".into());
            }
            read_ca_file(path)?;
        }
        Ok(())
    }
}

/// The CA certificates of `path` (checked here, once at start-up, with a clear error, because
/// the SDK's TLS layer panics on a certificate it cannot parse).
pub fn read_ca_file(path: &std::path::Path) -> Result<Vec<u8>, String> {
    crate::tls::read_ca_file("--s3-ca-file", path, &mut rustls::RootCertStore::empty())
}

/// The SDK's HTTPS client (hyper 1 and rustls on aws-lc, as its default) trusting the system's
/// roots and the certificates of `ca_pem`.
fn https_client_trusting(
    ca_pem: Vec<u8>,
) -> aws_smithy_runtime_api::client::http::SharedHttpClient {
    use aws_smithy_http_client::tls;
    let trust = tls::TrustStore::default().with_pem_certificate(ca_pem);
    let context = tls::TlsContext::builder()
        .with_trust_store(trust)
        .build()
        .expect("a trust store with native roots and checked certificates is a valid TLS context");
    aws_smithy_http_client::Builder::new()
        .tls_provider(tls::Provider::Rustls(
            tls::rustls_provider::CryptoMode::AwsLc,
        ))
        .tls_context(context)
        .build_https()
}

#[derive(Debug, thiserror::Error)]
pub enum S3Error {
    /// Worth retrying: timeouts, connection failures, 5xx, throttling, auth hiccups.
    #[error("S3 transient failure: {0}")]
    Transient(String),
    /// Retrying cannot help: the request itself is wrong.
    #[error("S3 permanent failure: {0}")]
    Permanent(String),
}

fn classify<E: std::error::Error + 'static>(
    e: SdkError<E, aws_smithy_runtime_api::http::Response>,
) -> S3Error {
    match &e {
        SdkError::ServiceError(se) => {
            let status = se.raw().status().as_u16();
            // 403 is retried: a credentials problem is an incident to fix, not data to drop.
            if status >= 500 || matches!(status, 403 | 408 | 429) {
                S3Error::Transient(format!("HTTP {status}: {:?}", se.err()))
            } else {
                S3Error::Permanent(format!("HTTP {status}: {:?}", se.err()))
            }
        }
        SdkError::ConstructionFailure(_) => S3Error::Permanent(format!("{e:?}")),
        // With its causes: "dispatch failure" alone hides a refused certificate or a reset.
        _ => S3Error::Transient(DisplayErrorContext(&e).to_string()),
    }
}

fn status_of<E>(e: &SdkError<E, aws_smithy_runtime_api::http::Response>) -> Option<u16> {
    e.raw_response().map(|r| r.status().as_u16())
}

/// A key listed under the prefix: a blob, a tombstone, or something we never write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyKind<'a> {
    Blob(&'a str),
    Tombstone(&'a str),
    /// An object of the change journal ([`blob::JOURNAL_DIR`]).
    Journal,
    Other,
}

/// The largest object body read: far above any blob zlink writes (an 8 KiB URL, HTML-escaped,
/// in the page template), so a bigger object is not ours and is treated as unreadable (empty
/// body: lastresort counts it malformed, reconcile rewrites it) instead of being buffered.
pub const MAX_OBJECT_BYTES: usize = 256 * 1024;

/// A stored blob object: its body and user metadata.
pub struct StoredObject {
    pub body: Vec<u8>,
    pub metadata: HashMap<String, String>,
}

pub struct S3Store {
    client: aws_sdk_s3::Client,
    bucket: String,
    prefix: String,
    cache_control: String,
}

impl S3Store {
    /// The client for `cfg`; fails only on an unreadable or unusable `--s3-ca-file`.
    pub fn new(cfg: &S3Config) -> Result<Self, String> {
        let creds = Credentials::new(
            &cfg.s3_access_key,
            &cfg.s3_secret_key.0,
            None,
            None,
            "zlink-static",
        );
        let mut conf = aws_sdk_s3::config::Builder::new();
        if let Some(path) = &cfg.s3_ca_file {
            conf.set_http_client(Some(https_client_trusting(read_ca_file(path)?)));
        }
        let conf = conf
            .behavior_version(BehaviorVersion::latest())
            .endpoint_url(&cfg.s3_endpoint)
            .region(Region::new(cfg.s3_region.clone()))
            .credentials_provider(creds)
            .force_path_style(true)
            // Retries are ours (backoff with jitter, classified errors), not the SDK's.
            .retry_config(RetryConfig::disabled())
            .timeout_config(
                TimeoutConfig::builder()
                    .connect_timeout(Duration::from_secs(1))
                    .operation_timeout(Duration::from_millis(cfg.s3_timeout_ms))
                    .build(),
            )
            .build();
        Ok(S3Store {
            client: aws_sdk_s3::Client::from_conf(conf),
            bucket: cfg.s3_bucket.clone(),
            prefix: cfg.s3_prefix.clone(),
            cache_control: cfg.blob_cache_control.clone(),
        })
    }

    pub fn key(&self, slug: &str) -> String {
        blob::object_key(&self.prefix, slug)
    }

    pub async fn put(&self, slug: &str, b: &Blob) -> Result<(), S3Error> {
        let body = ByteStream::from(blob::render(b).into_bytes());
        let cache = Some(self.cache_control.as_str());
        self.put_object(
            self.key(slug),
            body,
            blob::CONTENT_TYPE,
            cache,
            blob::metadata(b),
        )
        .await
    }

    /// Writes an arbitrary object under `slug`'s key (repair tooling and tests; the replicator
    /// only ever writes [`S3Store::put`]'s blobs).
    pub async fn put_raw(&self, slug: &str, body: Vec<u8>) -> Result<(), S3Error> {
        self.put_object(
            self.key(slug),
            ByteStream::from(body),
            "application/octet-stream",
            None,
            Vec::new(),
        )
        .await
    }

    async fn put_object(
        &self,
        key: String,
        body: ByteStream,
        content_type: &str,
        cache_control: Option<&str>,
        metadata: Vec<(&'static str, String)>,
    ) -> Result<(), S3Error> {
        let metadata: HashMap<String, String> = metadata
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect();
        self.client
            .put_object()
            .bucket(&self.bucket)
            .key(key)
            .body(body)
            .content_type(content_type)
            .set_cache_control(cache_control.map(str::to_string))
            .set_metadata(Some(metadata))
            .send()
            .await
            .map_err(classify)?;
        Ok(())
    }

    /// Deletes by key (deleting a missing key succeeds).
    pub async fn delete_key(&self, key: &str) -> Result<(), S3Error> {
        self.client
            .delete_object()
            .bucket(&self.bucket)
            .key(key)
            .send()
            .await
            .map_err(classify)?;
        Ok(())
    }

    pub async fn delete(&self, slug: &str) -> Result<(), S3Error> {
        self.delete_key(&self.key(slug)).await
    }

    pub async fn get(&self, slug: &str) -> Result<Option<StoredObject>, S3Error> {
        self.get_key(&self.key(slug)).await
    }

    pub async fn get_key(&self, key: &str) -> Result<Option<StoredObject>, S3Error> {
        match self
            .client
            .get_object()
            .bucket(&self.bucket)
            .key(key)
            .send()
            .await
        {
            Ok(mut out) => {
                let metadata = out.metadata().cloned().unwrap_or_default();
                let oversized = || {
                    tracing::warn!(
                        key,
                        limit = MAX_OBJECT_BYTES,
                        "S3 object larger than any blob we write; its body is not read"
                    );
                    Ok(Some(StoredObject {
                        body: Vec::new(),
                        metadata: metadata.clone(),
                    }))
                };
                // Never buffer more than a blob can be: the declared length first, then while
                // streaming (a length can be absent or wrong).
                if out.content_length().unwrap_or(0) > MAX_OBJECT_BYTES as i64 {
                    return oversized();
                }
                let mut body = Vec::new();
                while let Some(chunk) = out.body.next().await {
                    let chunk = chunk.map_err(|e| S3Error::Transient(e.to_string()))?;
                    if body.len() + chunk.len() > MAX_OBJECT_BYTES {
                        return oversized();
                    }
                    body.extend_from_slice(&chunk);
                }
                Ok(Some(StoredObject { body, metadata }))
            }
            Err(e) if status_of(&e) == Some(404) => Ok(None),
            Err(e) => Err(classify(e)),
        }
    }

    pub fn tombstone_key(&self, slug: &str) -> String {
        blob::tombstone_key(&self.prefix, slug)
    }

    /// Writes the tombstone of a disabled or expired link (see [`blob::tombstone_key`]).
    pub async fn put_tombstone(&self, slug: &str, t: &Tombstone) -> Result<(), S3Error> {
        let body = ByteStream::from_static(blob::TOMBSTONE_BODY.as_bytes());
        let metadata = blob::tombstone_metadata(t);
        self.put_object(
            self.tombstone_key(slug),
            body,
            "text/plain; charset=utf-8",
            None,
            metadata,
        )
        .await
    }

    pub async fn delete_tombstone(&self, slug: &str) -> Result<(), S3Error> {
        self.delete_key(&self.tombstone_key(slug)).await
    }

    /// The tombstone of `slug`, if there is a well-formed one.
    pub async fn get_tombstone(&self, slug: &str) -> Result<Option<Tombstone>, S3Error> {
        Ok(self
            .get_key(&self.tombstone_key(slug))
            .await?
            .and_then(|o| blob::parse_tombstone(|k| o.metadata.get(k).map(String::as_str)).ok()))
    }

    /// What a listed key under our prefix is.
    pub fn kind_of<'a>(&self, key: &'a str) -> KeyKind<'a> {
        let Some(rest) = key.strip_prefix(&self.prefix) else {
            return KeyKind::Other;
        };
        if let Some(s) = rest.strip_prefix(blob::TOMBSTONE_DIR) {
            if zlink_wire::domain::is_valid_key(s) {
                return KeyKind::Tombstone(s);
            }
        } else if let Some(name) = rest.strip_prefix(blob::JOURNAL_DIR) {
            if blob::journal_time(name).is_some() {
                return KeyKind::Journal;
            }
        } else if zlink_wire::domain::is_valid_key(rest) {
            return KeyKind::Blob(rest);
        }
        KeyKind::Other
    }

    /// One page of keys under the prefix, and the token of the next page.
    pub async fn list_page(
        &self,
        token: Option<String>,
    ) -> Result<(Vec<String>, Option<String>), S3Error> {
        let out = self
            .client
            .list_objects_v2()
            .bucket(&self.bucket)
            .prefix(&self.prefix)
            .set_continuation_token(token)
            .max_keys(1000)
            .send()
            .await
            .map_err(classify)?;
        let keys = out
            .contents()
            .iter()
            .filter_map(|o| o.key().map(str::to_string))
            .collect();
        let next = if out.is_truncated() == Some(true) {
            out.next_continuation_token().map(str::to_string)
        } else {
            None
        };
        Ok((keys, next))
    }

    /// Writes a journal object listing `keys`, stamped with the current time (so it shows up
    /// in listings at about the time its name says, however long earlier attempts took).
    pub async fn put_journal(&self, writer: &str, keys: &[String]) -> Result<(), S3Error> {
        let key = blob::journal_key(&self.prefix, crate::now_ms(), writer);
        let body = blob::render_journal(keys.iter().map(String::as_str));
        self.put_object(
            key,
            ByteStream::from(body.into_bytes()),
            "text/plain; charset=utf-8",
            None,
            Vec::new(),
        )
        .await
    }

    /// Names (under [`blob::JOURNAL_DIR`]) of the journal objects written after `after_ms`,
    /// oldest first, at most `max`.
    pub async fn list_journal(&self, after_ms: i64, max: usize) -> Result<Vec<String>, S3Error> {
        let dir = format!("{}{}", self.prefix, blob::JOURNAL_DIR);
        let mut names = Vec::new();
        let mut token = None;
        loop {
            let out = self
                .client
                .list_objects_v2()
                .bucket(&self.bucket)
                .prefix(&dir)
                .start_after(blob::journal_start_after(&self.prefix, after_ms))
                .set_continuation_token(token)
                .max_keys(1000)
                .send()
                .await
                .map_err(classify)?;
            names.extend(
                out.contents()
                    .iter()
                    .filter_map(|o| o.key()?.strip_prefix(&dir).map(str::to_string)),
            );
            token = match out.next_continuation_token() {
                Some(t) if out.is_truncated() == Some(true) && names.len() < max => {
                    Some(t.to_string())
                }
                _ => break,
            };
        }
        names.truncate(max);
        Ok(names)
    }

    /// The link keys a journal object (by its name under [`blob::JOURNAL_DIR`]) lists; `None`
    /// if it is gone (pruned).
    pub async fn get_journal(&self, name: &str) -> Result<Option<Vec<String>>, S3Error> {
        let key = format!("{}{}{name}", self.prefix, blob::JOURNAL_DIR);
        Ok(self
            .get_key(&key)
            .await?
            .map(|o| blob::parse_journal(&o.body)))
    }

    /// Deletes a journal object by its name under [`blob::JOURNAL_DIR`].
    pub async fn delete_journal(&self, name: &str) -> Result<(), S3Error> {
        self.delete_key(&format!("{}{}{name}", self.prefix, blob::JOURNAL_DIR))
            .await
    }

    pub async fn ping(&self) -> Result<(), S3Error> {
        self.client
            .head_bucket()
            .bucket(&self.bucket)
            .send()
            .await
            .map_err(classify)?;
        Ok(())
    }
}
