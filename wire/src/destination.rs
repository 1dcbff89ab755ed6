//! Destination policy: which hosts a short link may lead to (SYSTEM.md invariant 13).
//!
//! A public short link leads only to a public destination. Refused: hosts that are IP literals
//! in loopback, private, link-local, unique-local, CGNAT, multicast, unspecified, documentation,
//! benchmarking or reserved ranges (IPv4 and IPv6, including IPv4-mapped, IPv4-compatible,
//! NAT64 and 6to4 addresses that embed such an IPv4 address); single-label hosts and the
//! internal suffixes (`localhost`, `.local`, `.internal`, `.home.arpa`, …); the service's own
//! short domains and their subdomains (a link to a link: loops and chains); hosts on the
//! operator's deny list (a suffix match: `evil.example` also denies `a.evil.example`). The
//! operator's allow list permits an internal host on purpose; it never overrides the deny list
//! or the own-domain rule.
//!
//! The check runs on the host of the *normalised* URL ([`crate::longurl::normalize`]), the
//! string that is stored and redirected to, so it judges exactly the host a browser will
//! contact: every IPv4 spelling the WHATWG parser accepts (decimal `2130706433`, octal `0177.1`,
//! hex `0x7f.1`) is already an IPv4 address there. No I/O here: lists come from the caller.

use std::net::{Ipv4Addr, Ipv6Addr};
use thiserror::Error;
use url::{Host, Url};

/// Why a destination is refused. `code()` is the stable API error code.
#[derive(Debug, Error, PartialEq, Eq, Clone)]
pub enum PolicyError {
    #[error("destination {0} is not a public address ({1})")]
    NonPublicAddress(String, &'static str),
    #[error("destination host {0:?} is an internal name, not a public host")]
    InternalHost(String),
    #[error("destination host {0:?} is one of this service's short domains (a link to a link)")]
    OwnDomain(String),
    #[error("destination host {0:?} is on the operator's deny list")]
    Denied(String),
    #[error("destination URL has no host")]
    NoHost,
}

impl PolicyError {
    pub fn code(&self) -> &'static str {
        match self {
            PolicyError::NonPublicAddress(..) => "destination_not_public",
            PolicyError::InternalHost(_) => "destination_internal_host",
            PolicyError::OwnDomain(_) => "destination_own_domain",
            PolicyError::Denied(_) => "destination_denied",
            PolicyError::NoHost => "invalid_url",
        }
    }
}

/// Name suffixes that never resolve to a public host (RFC 6761, 6762, 8375 and common private
/// conventions). A host equal to one of them (without the dot) is refused too.
const INTERNAL_SUFFIXES: [&str; 9] = [
    "localhost",
    "local",
    "internal",
    "home.arpa",
    "localdomain",
    "lan",
    "intranet",
    "corp",
    "invalid",
];

/// The operator's part of the policy.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Policy {
    /// The service's own short domains (lower case, no trailing dot).
    pub own_domains: Vec<String>,
    /// Refused hosts; a name also refuses its subdomains.
    pub deny: Vec<String>,
    /// Hosts (names or IP literals) allowed although the built-in rules refuse them; a name
    /// also allows its subdomains.
    pub allow: Vec<String>,
}

/// A host list entry as stored: lower case, without a trailing dot, IPv6 without brackets.
pub fn list_entry(s: &str) -> Option<String> {
    let s = s.trim().trim_end_matches('.').to_ascii_lowercase();
    let s = s.trim_start_matches('[').trim_end_matches(']').to_string();
    (!s.is_empty() && !s.contains(['/', ' ', '@', ':']) || s.parse::<Ipv6Addr>().is_ok())
        .then_some(s)
}

/// Parses a list file: one host per line, `#` starts a comment, blank lines ignored. Lines
/// that are not a host are returned as errors (with their line number) for the caller to log.
pub fn parse_list(text: &str) -> (Vec<String>, Vec<usize>) {
    let (mut hosts, mut bad) = (Vec::new(), Vec::new());
    for (i, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        match list_entry(line) {
            Some(h) => hosts.push(h),
            None => bad.push(i + 1),
        }
    }
    (hosts, bad)
}

fn matches_suffix(host: &str, entry: &str) -> bool {
    host == entry
        || (host.len() > entry.len()
            && host.ends_with(entry)
            && host.as_bytes()[host.len() - entry.len() - 1] == b'.')
}

/// True when `host` is an entry of `list` or under one.
pub fn in_list(host: &str, list: &[String]) -> bool {
    list.iter().any(|e| matches_suffix(host, e))
}

/// Why an IPv4 address is not public, or None.
pub fn ipv4_class(a: Ipv4Addr) -> Option<&'static str> {
    let o = a.octets();
    let v = u32::from(a);
    let net = |base: [u8; 4], bits: u32| {
        let mask = if bits == 0 {
            0
        } else {
            u32::MAX << (32 - bits)
        };
        v & mask == u32::from(Ipv4Addr::from(base)) & mask
    };
    Some(match () {
        _ if net([0, 0, 0, 0], 8) => "unspecified / this network",
        _ if net([127, 0, 0, 0], 8) => "loopback",
        _ if net([10, 0, 0, 0], 8) || net([172, 16, 0, 0], 12) || net([192, 168, 0, 0], 16) => {
            "private"
        }
        _ if net([100, 64, 0, 0], 10) => "carrier-grade NAT",
        _ if net([169, 254, 0, 0], 16) => "link-local",
        _ if net([192, 0, 0, 0], 24) => "IETF protocol assignments",
        _ if net([192, 0, 2, 0], 24) || net([198, 51, 100, 0], 24) || net([203, 0, 113, 0], 24) => {
            "documentation"
        }
        _ if net([192, 88, 99, 0], 24) => "6to4 relay anycast",
        _ if net([198, 18, 0, 0], 15) => "benchmarking",
        _ if net([224, 0, 0, 0], 4) => "multicast",
        _ if o == [255, 255, 255, 255] => "broadcast",
        _ if net([240, 0, 0, 0], 4) => "reserved",
        _ => return None,
    })
}

/// Why an IPv6 address is not public, or None. Addresses that embed an IPv4 address are
/// judged by it.
pub fn ipv6_class(a: Ipv6Addr) -> Option<&'static str> {
    let s = a.segments();
    let embedded = |hi: usize| {
        Ipv4Addr::new(
            (s[hi] >> 8) as u8,
            s[hi] as u8,
            (s[hi + 1] >> 8) as u8,
            s[hi + 1] as u8,
        )
    };
    if a.is_unspecified() {
        return Some("unspecified");
    }
    if a.is_loopback() {
        return Some("loopback");
    }
    // ::ffff:a.b.c.d (IPv4-mapped) and 64:ff9b::a.b.c.d (NAT64) reach that IPv4 address.
    if s[..6] == [0, 0, 0, 0, 0, 0xffff] {
        return ipv4_class(embedded(6));
    }
    if s[..6] == [0; 6] {
        return Some("IPv4-compatible (deprecated)");
    }
    if s[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
        return ipv4_class(embedded(6));
    }
    if s[0] == 0x2002 {
        return ipv4_class(embedded(1)).map(|_| "6to4 of a non-public IPv4 address");
    }
    Some(match s[0] {
        x if x & 0xffc0 == 0xfe80 => "link-local",
        x if x & 0xffc0 == 0xfec0 => "site-local (deprecated)",
        x if x & 0xfe00 == 0xfc00 => "unique-local",
        x if x & 0xff00 == 0xff00 => "multicast",
        0x2001 if s[1] == 0x0db8 => "documentation",
        0x2001 if s[1] == 0 => "Teredo",
        0x2001 if s[1] & 0xfff0 == 0x0010 || s[1] & 0xfff0 == 0x0020 => "ORCHID",
        0x0100 if s[1..4] == [0, 0, 0] => "discard-only",
        // Only 2000::/3 is allocated as global unicast.
        x if x & 0xe000 != 0x2000 => "reserved",
        _ => return None,
    })
}

/// Checks the host of an already normalised URL against the built-in rules and `p`.
pub fn check(url: &Url, p: &Policy) -> Result<(), PolicyError> {
    let host = url.host().ok_or(PolicyError::NoHost)?;
    let name = match &host {
        Host::Domain(d) => d.trim_end_matches('.').to_ascii_lowercase(),
        Host::Ipv4(a) => a.to_string(),
        Host::Ipv6(a) => a.to_string(),
    };
    if name.is_empty() {
        return Err(PolicyError::NoHost);
    }
    if in_list(&name, &p.deny) {
        return Err(PolicyError::Denied(name));
    }
    if let Host::Domain(_) = host {
        if in_list(&name, &p.own_domains) {
            return Err(PolicyError::OwnDomain(name));
        }
    }
    if in_list(&name, &p.allow) {
        return Ok(());
    }
    match host {
        Host::Ipv4(a) => match ipv4_class(a) {
            Some(why) => Err(PolicyError::NonPublicAddress(name, why)),
            None => Ok(()),
        },
        Host::Ipv6(a) => match ipv6_class(a) {
            Some(why) => Err(PolicyError::NonPublicAddress(name, why)),
            None => Ok(()),
        },
        Host::Domain(_) => {
            let internal = !name.contains('.')
                || INTERNAL_SUFFIXES.iter().any(|s| matches_suffix(&name, s))
                // A name that is all digits and dots but not an IPv4 address (e.g. 1.2.3.4.5)
                // cannot be a public name: refuse rather than guess how a resolver reads it.
                || name.bytes().all(|b| b.is_ascii_digit() || b == b'.');
            if internal {
                Err(PolicyError::InternalHost(name))
            } else {
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::longurl::normalize;

    fn policy() -> Policy {
        Policy {
            own_domains: vec!["zl.example".into(), "go.example.org".into()],
            deny: vec!["evil.example".into(), "203.0.113.7".into()],
            allow: vec!["wiki.corp".into(), "10.1.2.3".into()],
        }
    }

    fn verdict(raw: &str) -> Result<(), String> {
        let n = normalize(raw).map_err(|e| format!("url: {e}"))?;
        check(&Url::parse(&n).unwrap(), &policy()).map_err(|e| e.code().to_string())
    }

    /// Every class of destination the policy refuses, each as the API would receive it (the
    /// file is the API-level security test's corpus too).
    const REFUSED: &str = include_str!("../../tests/corpus/bad-destinations.txt");

    fn refused() -> Vec<&'static str> {
        REFUSED
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .collect()
    }

    #[test]
    fn every_class_is_refused() {
        assert!(refused().len() >= 60);
        for raw in refused() {
            assert!(verdict(raw).is_err(), "{raw} must be refused");
        }
        assert_eq!(
            verdict("http://127.0.0.1/").unwrap_err(),
            "destination_not_public"
        );
        assert_eq!(
            verdict("http://db.internal/").unwrap_err(),
            "destination_internal_host"
        );
        assert_eq!(
            verdict("https://zl.example/a").unwrap_err(),
            "destination_own_domain"
        );
        assert_eq!(
            verdict("https://a.evil.example/").unwrap_err(),
            "destination_denied"
        );
    }

    #[test]
    fn public_destinations_and_allowed_internal_hosts_pass() {
        for raw in [
            "https://example.com/",
            "https://www.example.com:8443/a?b=c",
            "https://bücher.de/",
            "http://8.8.8.8/",
            "http://1.1.1.1/",
            "http://172.32.0.1/",
            "http://100.128.0.1/",
            "http://[2606:4700::1111]/",
            "http://[::ffff:8.8.8.8]/",
            "http://[2002:0808:0808::1]/",
            "https://notevil.example/",
            "https://zl.example.com/",
            "https://example.local.com/",
            // The allow list: an internal host on purpose.
            "https://wiki.corp/page",
            "https://team.wiki.corp/page",
            "http://10.1.2.3/",
        ] {
            assert_eq!(verdict(raw), Ok(()), "{raw}");
        }
    }

    #[test]
    fn lists_parse_with_comments_and_report_bad_lines() {
        let (hosts, bad) =
            parse_list("# deny\nEvil.Example.\n\n  phish.test  # reported\nnot a host\n[::1]\n");
        assert_eq!(hosts, vec!["evil.example", "phish.test", "::1"]);
        assert_eq!(bad, vec![5]);
    }

    mod props {
        use super::*;
        use proptest::prelude::*;

        proptest! {
            /// Normalising never changes which host a URL names: the normalised URL parses to
            /// the same host, normalising again changes nothing, and so the policy's verdict is
            /// the same on the stored URL as on what a browser gets.
            #[test]
            fn normalisation_keeps_the_host(raw in "https?://[a-zA-Z0-9.\\[\\]:@%\\\\-]{1,40}(/[a-z0-9@\\\\%.:-]{0,20})?") {
                if let Ok(n) = normalize(&raw) {
                    let u = Url::parse(&n).unwrap();
                    let again = normalize(&n);
                    prop_assert_eq!(again.as_ref(), Ok(&n));
                    let original = Url::parse(&raw).unwrap();
                    prop_assert_eq!(original.host_str(), u.host_str());
                    prop_assert_eq!(check(&u, &policy()), check(&original, &policy()));
                }
            }

            /// Every IPv4 address in a refused range is refused in dotted, decimal and hex form,
            /// and IPv4-mapped.
            #[test]
            fn ipv4_spellings_agree(a in any::<u32>()) {
                let ip = Ipv4Addr::from(a);
                let want = ipv4_class(ip).is_some() && !policy().allow.contains(&ip.to_string())
                    || policy().deny.contains(&ip.to_string());
                for raw in [format!("http://{ip}/"), format!("http://{a}/"), format!("http://0x{a:x}/")] {
                    let n = normalize(&raw).unwrap();
                    prop_assert_eq!(check(&Url::parse(&n).unwrap(), &policy()).is_err(), want, "{}", raw);
                }
                let mapped = format!("http://[::ffff:{ip}]/");
                let n = normalize(&mapped).unwrap();
                prop_assert_eq!(check(&Url::parse(&n).unwrap(), &Policy::default()).is_err(), ipv4_class(ip).is_some(), "{}", mapped);
            }
        }
    }
}
