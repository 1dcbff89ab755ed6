//! Formats that cross zlink process boundaries; every tier agrees on these.
//!
//! - [`slug`]: slug rules (auto vs custom, reserved words) and the keyed auto-slug codec.
//! - [`canary`]: the system's canary links (reserved slugs, probed on every rung, no clicks).
//! - [`domain`]: branded domains, link keys (`slug` or `<domain>/<slug>`), Host → domain.
//! - [`longurl`]: validation and normalisation of destination URLs.
//! - [`destination`]: which hosts a link may lead to (no private, internal or own hosts).
//! - [`link`]: the link state machine and the allowed redirect codes.
//! - [`events`]: `links` and `clicks` Kafka event schemas.
//! - [`blob`]: the S3 meta-refresh HTML blob (render, strict parse, object metadata).

pub mod blob;
pub mod canary;
pub mod destination;
pub mod domain;
pub mod events;
pub mod link;
pub mod longurl;
pub mod slug;

pub use link::LinkStatus;
