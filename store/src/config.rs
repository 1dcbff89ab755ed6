//! Where the store is and how long a statement may take: the flags every service that talks to
//! ScyllaDB shares.

use clap::Args;
use std::time::Duration;

#[derive(Debug, Clone, Args)]
pub struct StoreConfig {
    /// ScyllaDB/Cassandra contact points, host:port, comma-separated.
    #[arg(
        long,
        env = "ZLINK_CQL_NODES",
        value_delimiter = ',',
        default_value = "127.0.0.1:9042"
    )]
    pub cql_nodes: Vec<String>,
    /// Keyspace holding every zlink table ([a-z0-9_], at most 48 characters).
    #[arg(long, env = "ZLINK_KEYSPACE", default_value = "zlink")]
    pub keyspace: String,
    /// Per-request timeout for CQL statements, in milliseconds.
    #[arg(long, env = "ZLINK_CQL_TIMEOUT_MS", default_value_t = 2000)]
    pub cql_timeout_ms: u64,
    /// A statement that may be sent twice (reads, plain writes, the LWTs whose outcome the
    /// caller verifies) and has no answer after this many milliseconds is also sent to the
    /// next node of its plan, at most twice: a hung node costs this, not a timeout. 0: never.
    #[arg(long, env = "ZLINK_CQL_SPECULATIVE_MS", default_value_t = 50)]
    pub cql_speculative_ms: u64,
    /// The driver sends a keepalive on every connection this often (ms) and closes one that
    /// has not answered any for --cql-keepalive-timeout-ms: a node hung for longer has its
    /// connections dropped and gets no statements until it answers a new connection. Not
    /// shorter: a node that thaws sooner keeps its connections (the driver takes seconds to
    /// tens of seconds to reconnect to one it dropped), and meanwhile statements that may be
    /// sent twice go around it after --cql-speculative-ms.
    #[arg(long, env = "ZLINK_CQL_KEEPALIVE_MS", default_value_t = 2000)]
    pub cql_keepalive_ms: u64,
    #[arg(long, env = "ZLINK_CQL_KEEPALIVE_TIMEOUT_MS", default_value_t = 10000)]
    pub cql_keepalive_timeout_ms: u64,
}

impl StoreConfig {
    pub fn validate(&self) -> Result<(), String> {
        if self.cql_nodes.iter().all(|n| n.trim().is_empty()) {
            return Err("--cql-nodes: at least one contact point is required".into());
        }
        validate_keyspace(&self.keyspace)?;
        if !(10..=60_000).contains(&self.cql_timeout_ms) {
            return Err("--cql-timeout-ms must be between 10 and 60000".into());
        }
        if self.cql_speculative_ms >= self.cql_timeout_ms {
            return Err("--cql-speculative-ms must be below --cql-timeout-ms (0: off)".into());
        }
        if !(100..=60_000).contains(&self.cql_keepalive_ms)
            || !(100..=60_000).contains(&self.cql_keepalive_timeout_ms)
        {
            return Err(
                "--cql-keepalive-ms and --cql-keepalive-timeout-ms must be between 100 and 60000"
                    .into(),
            );
        }
        Ok(())
    }

    pub fn cql_timeout(&self) -> Duration {
        Duration::from_millis(self.cql_timeout_ms)
    }
}

/// Keyspace names reach CQL text (DDL cannot bind them), so only `[a-z0-9_]` is accepted.
pub fn validate_keyspace(ks: &str) -> Result<(), String> {
    let ok = !ks.is_empty()
        && ks.len() <= 48
        && ks
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
        && ks.as_bytes()[0].is_ascii_lowercase();
    if ok {
        Ok(())
    } else {
        Err(format!("keyspace {ks:?} must match [a-z][a-z0-9_]{{0,47}}"))
    }
}
