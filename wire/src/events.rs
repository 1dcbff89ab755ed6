//! Event schemas carried on Kafka (`links`, `clicks`).
//!
//! Encoding: JSON, one event per message, keyed by slug. JSON because every consumer (the
//! replicator, the click counter, an SRE with kafka-console-consumer during an incident) can read
//! it without a schema registry, and events are small and rare next to redirects. Each event carries
//! `schema` so a consumer can refuse versions it does not know instead of misreading them.

use crate::link::LinkStatus;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

pub const LINK_EVENT_SCHEMA: u16 = 1;
pub const CLICK_EVENT_SCHEMA: u16 = 1;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LinkEventKind {
    Created,
    Disabled,
    Enabled,
    Expired,
}

/// The state of one link after a change. `version` increases by one with every change of the
/// link, so a consumer applies an event only if it is newer than what it has applied before:
/// a replayed or reordered event can never resurrect a disabled link.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LinkEvent {
    pub schema: u16,
    pub kind: LinkEventKind,
    pub slug: String,
    pub url: String,
    pub status: LinkStatus,
    pub version: i64,
    pub redirect_code: u16,
    /// Unix milliseconds.
    pub created_at_ms: i64,
    pub expires_at_ms: Option<i64>,
    /// When the change happened, Unix milliseconds.
    pub at_ms: i64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Tier {
    Primary,
    Lastresort,
    LastresortNginx,
}

/// One redirect. `id` is unique per click and is what the counter deduplicates on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClickEvent {
    pub schema: u16,
    pub id: Uuid,
    pub slug: String,
    pub at_ms: i64,
    pub tier: Tier,
    pub referrer: Option<String>,
    pub user_agent: Option<String>,
    /// Hex SHA-256 of a deployment salt and the client IP: countable, not reversible.
    pub ip_hash: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn link_event_json_is_stable() {
        let ev = LinkEvent {
            schema: LINK_EVENT_SCHEMA,
            kind: LinkEventKind::Disabled,
            slug: "abc".into(),
            url: "https://e.com/".into(),
            status: LinkStatus::Disabled,
            version: 2,
            redirect_code: 302,
            created_at_ms: 1,
            expires_at_ms: None,
            at_ms: 5,
        };
        let json = serde_json::to_string(&ev).unwrap();
        assert_eq!(
            json,
            r#"{"schema":1,"kind":"disabled","slug":"abc","url":"https://e.com/","status":"DISABLED","version":2,"redirect_code":302,"created_at_ms":1,"expires_at_ms":null,"at_ms":5}"#
        );
        assert_eq!(serde_json::from_str::<LinkEvent>(&json).unwrap(), ev);
    }

    #[test]
    fn tiers_serialise_as_documented() {
        assert_eq!(
            serde_json::to_string(&Tier::LastresortNginx).unwrap(),
            r#""lastresort-nginx""#
        );
    }
}
