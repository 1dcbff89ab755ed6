//! Clients shared by the zlink tiers. Depends on no service crate, so the last-resort tier can
//! use it while depending on nothing of primary's.
//!
//! - [`backoff`]: exponential backoff with a cap and jitter, for every retry loop.
//! - [`breaker`]: deadlines and circuit breaking in front of any dependency.
//! - [`memcache`]: small async memcached client with hard timeouts and a breaker.
//! - [`s3`]: S3 blob objects (aws-sdk-s3), errors classified transient/permanent.
//! - [`kafka`]: the producer, consumer and reconnect settings every process shares; consumer lag.
//! - [`process`]: logging and shutdown signals for every binary.
//! - [`ops`]: the ops endpoint (`/healthz`, `/readyz`, `/metrics`) of the background services.
//! - [`clock`]: time as a dependency (a manual clock for tests).
//! - [`spool`]: the durable on-disk record spool (segments, checksums, batched fsync).
//! - [`tls`]: CA files of the command line, checked as trust anchors (S3's, the domain API's).
//! - [`clicks`]: click events: built per redirect, spooled, replayed to Kafka.
//! - [`geo`]: country and city of a client address (MaxMind-format database, hot reload).
//! - [`trace`]: W3C trace context, spans exported over OTLP, sampled request logs.
//! - [`Secret`]: a config value that never prints.

pub mod backoff;
pub mod breaker;
pub mod clicks;
pub mod clock;
pub mod geo;
pub mod kafka;
pub mod memcache;
pub mod ops;
pub mod process;
pub mod s3;
pub mod spool;
pub mod tls;
pub mod trace;

use std::fmt;

/// Wall-clock milliseconds since the Unix epoch (0 if the clock is before it).
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// A value that must never appear in logs or `Debug` output.
#[derive(Clone, Default)]
pub struct Secret(pub String);

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(***)")
    }
}

impl std::str::FromStr for Secret {
    type Err = std::convert::Infallible;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(Secret(s.to_string()))
    }
}
