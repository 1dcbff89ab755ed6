//! zlink's ScyllaDB store: the schema and one small repository per table family, each preparing
//! its own statements on the shared [`Db`]. Used by primary (links, keys, ids, outbox,
//! expiries), the replicator (replica versions, link scans for reconcile) and the click counter
//! (aggregates); each builds only the repositories it uses.
//!
//! Layers, top to bottom (a module uses only those below it):
//! - repositories: [`links`] (links, idempotency claims), [`domains`] (branded domains), [`outbox`] (outbox, sweeper lease,
//!   expiries and their cursor), [`coord`] (leases and cursors of background loops), [`keys`] (API keys), [`ids`] (ID blocks), [`replicas`]
//!   (replica versions), [`clicks`] (click aggregates, the exactly-once counting write, the
//!   stats read model);
//! - [`schema`]: migration (keyspace, tables, added columns);
//! - [`db`]: the session, deadlines and breaker, strict row reading; [`connect`]: connecting
//!   at start-up while the store may still be starting; [`config`]: where the store is.
//!
//! Depends on `zlink-wire` and `zlink-clients` only; no service crate.

pub mod clicks;
pub mod config;
pub mod connect;
pub mod coord;
pub mod db;
pub mod domains;
pub mod ids;
pub mod keys;
pub mod links;
pub mod outbox;
pub mod replicas;
pub mod schema;

pub use config::StoreConfig;
pub use db::{Db, StoreError};
pub use links::{DisabledBy, Link, Links};
