//! The link state machine and redirect codes, shared by every tier.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// Lifecycle of a link: ACTIVE ↔ DISABLED (owner or admin), ACTIVE → EXPIRED (the clock),
/// any other state → DELETED (owner or admin, `DELETE /api/v1/links/{slug}`). DELETED is
/// final; EXPIRED only leads to DELETED. A deleted link's slug stays taken (its tombstone
/// answers 410 on every rung).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum LinkStatus {
    Active,
    Disabled,
    Expired,
    Deleted,
}

impl LinkStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            LinkStatus::Active => "ACTIVE",
            LinkStatus::Disabled => "DISABLED",
            LinkStatus::Expired => "EXPIRED",
            LinkStatus::Deleted => "DELETED",
        }
    }

    /// Invariant 4: the only transitions that exist. Staying in the same state is not a transition.
    pub fn can_become(self, to: LinkStatus) -> bool {
        matches!(
            (self, to),
            (LinkStatus::Active, LinkStatus::Disabled)
                | (LinkStatus::Disabled, LinkStatus::Active)
                | (LinkStatus::Active, LinkStatus::Expired)
                | (
                    LinkStatus::Active | LinkStatus::Disabled | LinkStatus::Expired,
                    LinkStatus::Deleted
                )
        )
    }
}

/// The expiry rule, once for every tier: a link with an expiry is expired from that instant on
/// (`exp <= now`). The API's effective status and every rung's redirect decision use it.
pub fn is_expired(expires_at_ms: Option<i64>, now_ms: i64) -> bool {
    expires_at_ms.is_some_and(|exp| exp <= now_ms)
}

impl LinkStatus {
    /// The status a reader sees: a link past its expiry ([`is_expired`]) is EXPIRED whatever
    /// the row says, unless it was deleted.
    pub fn effective(self, expires_at_ms: Option<i64>, now_ms: i64) -> LinkStatus {
        if self != LinkStatus::Deleted && is_expired(expires_at_ms, now_ms) {
            LinkStatus::Expired
        } else {
            self
        }
    }
}

impl fmt::Display for LinkStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for LinkStatus {
    type Err = ();
    fn from_str(s: &str) -> Result<Self, ()> {
        match s {
            "ACTIVE" => Ok(LinkStatus::Active),
            "DISABLED" => Ok(LinkStatus::Disabled),
            "EXPIRED" => Ok(LinkStatus::Expired),
            "DELETED" => Ok(LinkStatus::Deleted),
            _ => Err(()),
        }
    }
}

/// HTTP status codes a redirect may use.
pub const REDIRECT_CODES: [u16; 4] = [301, 302, 307, 308];

pub fn is_redirect_code(code: u16) -> bool {
    REDIRECT_CODES.contains(&code)
}

#[cfg(test)]
mod tests {
    use super::LinkStatus::*;

    #[test]
    fn only_the_specified_transitions_are_allowed() {
        let all = [Active, Disabled, Expired, Deleted];
        let allowed: Vec<_> = all
            .iter()
            .flat_map(|&a| all.iter().map(move |&b| (a, b)))
            .filter(|&(a, b)| a.can_become(b))
            .collect();
        assert_eq!(
            allowed,
            vec![
                (Active, Disabled),
                (Active, Expired),
                (Active, Deleted),
                (Disabled, Active),
                (Disabled, Deleted),
                (Expired, Deleted)
            ]
        );
    }

    #[test]
    fn status_round_trips_through_text() {
        for s in [Active, Disabled, Expired] {
            assert_eq!(s.as_str().parse::<super::LinkStatus>(), Ok(s));
        }
        assert!("active".parse::<super::LinkStatus>().is_err());
    }

    #[test]
    fn the_effective_status_applies_expiry_from_its_instant_on() {
        use super::is_expired;
        use super::LinkStatus::*;
        assert!(!is_expired(None, 10));
        assert!(!is_expired(Some(11), 10));
        assert!(is_expired(Some(10), 10));
        assert_eq!(Active.effective(None, 10), Active);
        assert_eq!(Active.effective(Some(11), 10), Active);
        assert_eq!(Active.effective(Some(10), 10), Expired);
        assert_eq!(Disabled.effective(Some(5), 10), Expired);
        assert_eq!(Deleted.effective(Some(5), 10), Deleted);
    }
}
