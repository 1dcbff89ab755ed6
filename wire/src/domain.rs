//! Branded short domains and link keys.
//!
//! A link is unique per `(domain, slug)`. Its **key** — the one string every table, event,
//! cache entry and S3 object is keyed by — is the bare slug on the default domain (so links made
//! before branded domains existed keep their keys) and `<domain>/<slug>` on a branded domain.
//! Neither part can contain the other's separator: slugs have no `.` or `/`, domains no `/`, so a
//! key splits one way only, and a key is safe unescaped as an S3 key, a CQL value, a log field
//! and (hashed when long, see the memcached layer) a memcached key.
//!
//! Which domain a request is for comes from its `Host` ([`Hosts::domain_of`]): the service's
//! own short hosts and IP literals are the default domain; any other well-formed name is that
//! branded domain (a link exists there only if its owner registered the domain); anything else
//! is no domain at all (404). An unknown host therefore never reaches another domain's links.

use serde::{Deserialize, Serialize};
use std::borrow::{Borrow, Cow};
use std::collections::HashSet;
use std::fmt;
use std::net::Ipv4Addr;
use std::ops::Deref;
use thiserror::Error;

/// Longest domain name (DNS's limit).
pub const MAX_DOMAIN_LEN: usize = 253;

#[derive(Debug, Error, PartialEq, Eq, Clone)]
pub enum DomainError {
    #[error("domain must be a host name of at most {MAX_DOMAIN_LEN} characters")]
    Length,
    #[error("domain must be ASCII (use the xn-- form of an internationalised name)")]
    NotAscii,
    #[error("domain must be a name with at least two labels of letters, digits and '-' (not starting or ending with '-', at most 63 each), not an IP address")]
    Shape,
}

fn is_label(l: &[u8]) -> bool {
    (1..=63).contains(&l.len())
        && l.iter()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
        && l[0] != b'-'
        && l[l.len() - 1] != b'-'
}

/// True for a domain as [`normalize`] returns it: lower case, at least two labels, a top label
/// that is not all digits (so never an IPv4 address).
pub fn is_domain(d: &str) -> bool {
    if d.is_empty() || d.len() > MAX_DOMAIN_LEN {
        return false;
    }
    let mut labels = 0;
    let mut last: &[u8] = b"";
    for l in d.as_bytes().split(|b| *b == b'.') {
        if !is_label(l) {
            return false;
        }
        labels += 1;
        last = l;
    }
    labels >= 2 && !last.iter().all(u8::is_ascii_digit)
}

/// A domain as stored: trimmed, lower case, without a trailing dot; refused unless it is a
/// plain DNS name (see [`is_domain`]).
pub fn normalize(raw: &str) -> Result<String, DomainError> {
    let d = raw.trim();
    let d = d.strip_suffix('.').unwrap_or(d);
    if !d.is_ascii() {
        return Err(DomainError::NotAscii);
    }
    if d.is_empty() || d.len() > MAX_DOMAIN_LEN {
        return Err(DomainError::Length);
    }
    let d = d.to_ascii_lowercase();
    if is_domain(&d) {
        Ok(d)
    } else {
        Err(DomainError::Shape)
    }
}

/// The key of the link `slug` on `domain` (`None`: the default domain).
pub fn key(domain: Option<&str>, slug: &str) -> String {
    match domain {
        Some(d) => format!("{d}/{slug}"),
        None => slug.to_string(),
    }
}

/// A key's domain (`None`: the default domain) and slug.
pub fn split(key: &str) -> (Option<&str>, &str) {
    match key.rsplit_once('/') {
        Some((d, s)) => (Some(d), s),
        None => (None, key),
    }
}

/// True for any key a link can have: a valid slug, on a valid domain if it has one.
pub fn is_valid_key(key: &str) -> bool {
    match split(key) {
        (Some(d), s) => is_domain(d) && crate::slug::is_valid_slug(s),
        (None, s) => crate::slug::is_valid_slug(s),
    }
}

/// A link's key (see the module docs): what the store's `slug` column, the events' `slug`
/// field, the outbox and the S3 object name hold. Serialised as the bare string, so the wire
/// and CQL names stay `slug`. A key read from outside (an event, a log line) is what it claims
/// to be: consumers check [`LinkKey::is_valid`] where trust ends; keys built with
/// [`LinkKey::new`] from a checked domain and slug are valid by construction.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct LinkKey(String);

impl LinkKey {
    /// The key of `slug` on `domain` (`None`: the default domain).
    pub fn new(domain: Option<&str>, slug: &str) -> LinkKey {
        LinkKey(key(domain, slug))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    pub fn into_string(self) -> String {
        self.0
    }

    /// The domain (`None`: the default domain).
    pub fn domain(&self) -> Option<&str> {
        split(&self.0).0
    }

    /// The slug on its domain.
    pub fn slug(&self) -> &str {
        split(&self.0).1
    }

    /// A valid slug, on a valid domain if it has one.
    pub fn is_valid(&self) -> bool {
        is_valid_key(&self.0)
    }
}

impl From<String> for LinkKey {
    fn from(s: String) -> LinkKey {
        LinkKey(s)
    }
}

impl From<&str> for LinkKey {
    fn from(s: &str) -> LinkKey {
        LinkKey(s.to_string())
    }
}

impl From<LinkKey> for String {
    fn from(k: LinkKey) -> String {
        k.0
    }
}

impl Deref for LinkKey {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

impl AsRef<str> for LinkKey {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl Borrow<str> for LinkKey {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for LinkKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl PartialEq<str> for LinkKey {
    fn eq(&self, other: &str) -> bool {
        self.0 == other
    }
}

impl PartialEq<&str> for LinkKey {
    fn eq(&self, other: &&str) -> bool {
        self.0 == *other
    }
}

impl PartialEq<String> for LinkKey {
    fn eq(&self, other: &String) -> bool {
        &self.0 == other
    }
}

/// Which domain a request's `Host` names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostDomain<'a> {
    /// The service's own hosts, IP literals, or no Host at all.
    Default,
    /// Another well-formed name (lower case, no port, no trailing dot).
    Branded(Cow<'a, str>),
    /// Not a host name: nothing is served for it.
    Invalid,
}

/// The default domain's host names (the service's own short domains); everything else that is
/// a name is a branded domain.
#[derive(Debug, Clone, Default)]
pub struct Hosts {
    default: HashSet<String>,
}

impl Hosts {
    /// `names`: the service's own hosts (any case, a trailing dot or port ignored); `localhost`
    /// is always one of them. Entries that are not names (IP literals, which are always the
    /// default domain anyway) are skipped.
    pub fn new<'a>(names: impl IntoIterator<Item = &'a str>) -> Hosts {
        let mut default: HashSet<String> = names
            .into_iter()
            .filter_map(|n| normalize(strip_port(n.trim())).ok())
            .collect();
        default.insert("localhost".into());
        Hosts { default }
    }

    /// The default domain's names (sorted), e.g. for an nginx map.
    pub fn default_names(&self) -> Vec<&str> {
        let mut v: Vec<&str> = self.default.iter().map(String::as_str).collect();
        v.sort_unstable();
        v
    }

    /// Which domain `host` (a `Host` header's value) names. No allocation for the default
    /// domain's names or a branded name already in lower case.
    pub fn domain_of<'a>(&self, host: Option<&'a str>) -> HostDomain<'a> {
        let Some(host) = host else {
            return HostDomain::Default;
        };
        if host.starts_with('[') {
            // An IPv6 literal, with or without a port.
            return HostDomain::Default;
        }
        let name = strip_port(host);
        let name = name.strip_suffix('.').unwrap_or(name);
        if name.parse::<Ipv4Addr>().is_ok() {
            return HostDomain::Default;
        }
        let lower: Cow<'a, str> = if name.bytes().any(|b| b.is_ascii_uppercase()) {
            Cow::Owned(name.to_ascii_lowercase())
        } else {
            Cow::Borrowed(name)
        };
        if self.default.contains(lower.as_ref()) {
            HostDomain::Default
        } else if is_domain(&lower) {
            HostDomain::Branded(lower)
        } else {
            HostDomain::Invalid
        }
    }

    /// The key of `slug` as requested on `host`; `None` when the host names no domain.
    pub fn key_of<'a>(&self, host: Option<&str>, slug: &'a str) -> Option<Cow<'a, str>> {
        match self.domain_of(host) {
            HostDomain::Default => Some(Cow::Borrowed(slug)),
            HostDomain::Branded(d) => Some(Cow::Owned(key(Some(&d), slug))),
            HostDomain::Invalid => None,
        }
    }

    /// True when `domain` (normalised) is one of the default domain's names.
    pub fn is_default(&self, domain: &str) -> bool {
        self.default.contains(domain)
    }
}

/// `host` without a `:port` suffix (digits only).
fn strip_port(host: &str) -> &str {
    match host.rsplit_once(':') {
        Some((h, p)) if !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) => h,
        _ => host,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn domains_are_normalised_and_checked() {
        assert_eq!(normalize(" Go.Example.COM. ").unwrap(), "go.example.com");
        assert_eq!(
            normalize("xn--bcher-kva.example").unwrap(),
            "xn--bcher-kva.example"
        );
        for bad in [
            "",
            "example",
            "1.2.3.4",
            "-a.example",
            "a-.example",
            "a..example",
            "a_b.example",
            "a/b.example",
            "a.example:80",
            "bücher.example",
            "[::1]",
            ".example",
        ] {
            assert!(normalize(bad).is_err(), "{bad:?}");
        }
        let long = format!("{}.com", "a.".repeat(125));
        assert!(long.len() > MAX_DOMAIN_LEN && normalize(&long).is_err());
        assert!(normalize(&format!("{}.com", "a".repeat(64))).is_err());
    }

    #[test]
    fn keys_split_one_way_only() {
        assert_eq!(key(None, "abc"), "abc");
        assert_eq!(key(Some("go.example.com"), "abc"), "go.example.com/abc");
        assert_eq!(split("go.example.com/abc"), (Some("go.example.com"), "abc"));
        assert_eq!(split("abc"), (None, "abc"));
        assert!(is_valid_key("abc") && is_valid_key("go.example.com/a-c"));
        let k = LinkKey::new(Some("go.example.com"), "abc");
        assert_eq!(
            (k.domain(), k.slug(), k.is_valid()),
            (Some("go.example.com"), "abc", true)
        );
        assert_eq!(
            serde_json::to_string(&k).unwrap(),
            r#""go.example.com/abc""#
        );
        let back: LinkKey = serde_json::from_str(r#""abc""#).unwrap();
        assert_eq!((back.domain(), back.slug()), (None, "abc"));
        assert!(!LinkKey::from("a/b/c").is_valid());
        for bad in [
            "go.example.com/",
            "/abc",
            "Go.example.com/abc",
            "a/b/c",
            "x.y/.gone",
            "ab",
        ] {
            assert!(!is_valid_key(bad), "{bad:?}");
        }
    }

    #[test]
    fn hosts_map_to_the_default_domain_a_branded_one_or_none() {
        let h = Hosts::new(["Short.Example:8080", "go.zlink.test", "127.0.0.1"]);
        assert_eq!(h.domain_of(None), HostDomain::Default);
        assert_eq!(h.domain_of(Some("short.example")), HostDomain::Default);
        assert_eq!(h.domain_of(Some("SHORT.example.:443")), HostDomain::Default);
        assert_eq!(h.domain_of(Some("localhost:21080")), HostDomain::Default);
        assert_eq!(h.domain_of(Some("127.0.0.1:21080")), HostDomain::Default);
        assert_eq!(h.domain_of(Some("10.231.3.2")), HostDomain::Default);
        assert_eq!(h.domain_of(Some("[::1]:80")), HostDomain::Default);
        assert_eq!(
            h.domain_of(Some("Go.Brand.example:80")),
            HostDomain::Branded(Cow::Borrowed("go.brand.example"))
        );
        for bad in [
            "",
            "brand",
            "a b.example",
            "a/b.example",
            "x.example:80:80",
            "_.example",
        ] {
            assert_eq!(h.domain_of(Some(bad)), HostDomain::Invalid, "{bad:?}");
        }
        assert_eq!(
            h.key_of(Some("go.brand.example"), "abc").unwrap(),
            "go.brand.example/abc"
        );
        assert_eq!(h.key_of(Some("short.example"), "abc").unwrap(), "abc");
        assert_eq!(h.key_of(Some("nope"), "abc"), None);
        assert_eq!(
            h.default_names(),
            ["go.zlink.test", "localhost", "short.example"]
        );
    }

    proptest! {
        /// Whatever a Host header says, the key it leads to is a valid key or none, and a
        /// branded key's domain is exactly the host's name.
        #[test]
        fn any_host_gives_a_valid_key_or_none(host in ".{0,40}", slug in "[A-Za-z0-9_-]{3,10}") {
            let h = Hosts::new(["short.example"]);
            if let Some(k) = h.key_of(Some(&host), &slug) {
                prop_assert!(is_valid_key(&k), "{k:?}");
                if let (Some(d), _) = split(&k) {
                    prop_assert_eq!(d, strip_port(&host).trim_end_matches('.').to_ascii_lowercase());
                }
            }
        }
    }
}
