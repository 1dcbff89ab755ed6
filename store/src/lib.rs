//! zlink's ScyllaDB store: the schema, every CQL statement the services run (prepared once),
//! and the click aggregates. Used by primary (links, keys, ids, outbox, expiries), the
//! replicator (replica versions, link scans for reconcile) and the click counter (aggregates).
//!
//! - [`config`]: where the store is (`--cql-nodes`, keyspace, statement timeout).
//! - [`db`]: the session, statements, deadlines/breaker, schema migration, row types.
//! - [`clicks`]: click aggregates, the exactly-once counting write, the stats read model.
//! - [`connect`]: connecting at start-up, retrying while the store starts.
//!
//! Depends on `zlink-wire` and `zlink-clients` only; no service crate depends on another's.

pub mod clicks;
pub mod config;
pub mod connect;
pub mod db;

pub use config::StoreConfig;
pub use db::{Link, Store, StoreError};
