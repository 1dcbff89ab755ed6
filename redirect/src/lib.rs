//! The redirect-tier kit: what both redirect tiers (primary, rung 1; lastresort, rung 2) do
//! the same way, written once so that "every rung answers identically" (SYSTEM.md invariant 7)
//! holds by construction. Each tier supplies only its lookup chain and its click sink
//! ([`pipeline::RedirectTier`]).
//!
//! Layers, top to bottom:
//! - [`serve`]: the accept loop with graceful shutdown; the peer address of every request.
//! - [`hot`]: counters whose busiest label values are resolved once (no lock per request).
//! - [`pipeline`]: `GET|HEAD /{slug}` as named phases: parse the slug → screen → look up
//!   through the cache layers → decide → respond → emit the click.
//! - [`cache`]: the in-process cache with coalesced loads and the memcached layer (untrusted
//!   values validated, fills in the background), and the lookup metrics they count.
//! - [`front`]: each runtime thread's table in front of the in-process cache (a hot hit reads
//!   no shared structure), invalidated with it.
//! - [`decide`]: the pure decision (what a lookup found + now → redirect, 404, 410 or 500).
//! - [`error`]: [`Reject`], the errors a redirect can end in, and the one JSON error renderer
//!   every response of either tier goes through (primary's API errors included).
//!
//! Depends on `zlink-wire` and `zlink-clients` only, never on a service crate.

pub mod cache;
pub mod decide;
pub mod error;
pub mod front;
pub mod hot;
pub mod pipeline;
pub mod serve;

pub use decide::{decide, Answer, Decision, Located, Target, Url, View};
pub use error::{Reject, Resp};
pub use pipeline::RedirectTier;
pub use serve::Peer;

/// Labels of the layer that answered a lookup (metrics `layer`, span and log `cache_layer`).
pub mod layer {
    pub use zlink_clients::trace::LAYER_STALE as STALE;
    pub use zlink_clients::trace::{LAYER_LOCAL as LOCAL, LAYER_MEMCACHED as MEMCACHED};
    /// Primary read ScyllaDB.
    pub const STORE: &str = "store";
    /// Lastresort read S3.
    pub const S3: &str = "s3";
    /// Primary: an auto-shaped slug whose id was never issued (no lookup made).
    pub const NEVER_ISSUED: &str = "never_issued";
}
