//! Canary links: a few links the system itself creates and owns, so that every rung of the
//! ladder can be probed all the time (Prometheus' blackbox exporter, `deploy/local/probes.tsv`
//! and the k8s overlays), not only during an outage.
//!
//! - Their slugs are reserved: no API client can create or claim one
//!   ([`crate::slug::validate_custom`] refuses the prefix).
//! - They count no click anywhere: the redirect kit emits none, lastresort's nginx-log ingest
//!   skips them, the counter drops any that still arrive.
//! - They lead to a name under `.invalid` (RFC 2606): a canary never sends anyone anywhere.
//! - Canary `n` is probed on rung `n` (1: frontend → primary, 2: lastresort, 3: the lastresort
//!   host's S3 path), so its destination says which probe it is.

/// Every canary slug starts with this (compared case-insensitively for custom slugs).
pub const PREFIX: &str = "zlink-canary-";
/// The owner of the canary links (not an API key's owner: no key can manage them).
pub const OWNER: &str = "zlink-canary";
/// How many canaries there are: `zlink-canary-1` … `zlink-canary-3`.
pub const COUNT: u8 = 3;

/// The slug of canary `n` (1-based).
pub fn slug(n: u8) -> String {
    format!("{PREFIX}{n}")
}

/// Where canary `n` leads.
pub fn url(n: u8) -> String {
    format!("https://canary.zlink.invalid/{n}")
}

/// Every canary: `(n, slug, url)`.
pub fn all() -> impl Iterator<Item = (u8, String, String)> {
    (1..=COUNT).map(|n| (n, slug(n), url(n)))
}

/// True when `key`'s slug (on any domain) is a canary's: such a redirect is not a click.
pub fn is_canary(key: &str) -> bool {
    // The slug: after the domain's `/`, if there is one (crate::domain::split, which sits
    // above this module).
    let slug = key.rsplit_once('/').map_or(key, |(_, s)| s);
    slug.len() >= PREFIX.len()
        && slug.as_bytes()[..PREFIX.len()].eq_ignore_ascii_case(PREFIX.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn canaries_lead_to_reserved_names_and_are_told_by_their_slug() {
        for (n, s, u) in all() {
            assert!(is_canary(&s));
            assert_eq!(crate::longurl::normalize(&u).unwrap(), u, "{u}");
            assert!(u.ends_with(&n.to_string()));
        }
        assert!(is_canary("go.example.com/ZLINK-CANARY-1"));
        for not in [
            "zlink-canar",
            "abc",
            "a.example/abc",
            "zlink-canary.example/abc",
        ] {
            assert!(!is_canary(not), "{not}");
        }
    }
}
