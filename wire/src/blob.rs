//! The S3 blob format: the contract between the replicator (writes), lastresort (reads) and
//! nginx on lastresort hosts (serves the body as-is when lastresort is down).
//!
//! Key: `<prefix><key>` (the link key: `<slug>`, or `<domain>/<slug>` on a branded domain).
//! Body: a small, complete UTF-8 HTML document with a meta refresh, a
//! canonical link and a plain anchor, every copy of the URL HTML-escaped. The redirect code,
//! link version and expiry are in a `<meta name="zlink">` tag and, with the URL when it is short
//! enough for S3's 2 KiB metadata limit, in object metadata.
//!
//! [`parse`] accepts exactly what [`render`] writes and nothing else: for every accepted body,
//! `render(parse(body)) == body`. Anything else is malformed and must never be redirected to.

use crate::longurl;
use thiserror::Error;

pub const CONTENT_TYPE: &str = "text/html; charset=utf-8";
/// Largest body the parser looks at (a rendered blob of an 8 KiB URL is ~50 KiB at worst).
pub const MAX_BODY_BYTES: usize = 64 * 1024;
/// URLs longer than this are left out of object metadata (S3 allows 2 KiB in all).
pub const MAX_METADATA_URL_BYTES: usize = 1536;

/// Object metadata keys (sent as `x-amz-meta-<key>`).
pub mod meta {
    pub const SCHEMA: &str = "zlink-schema";
    pub const URL: &str = "zlink-url";
    pub const CODE: &str = "zlink-code";
    pub const VERSION: &str = "zlink-version";
    pub const EXPIRES_MS: &str = "zlink-expires-ms";
    /// Tombstones only: `DISABLED` or `EXPIRED`.
    pub const STATUS: &str = "zlink-status";
}

pub const SCHEMA_VERSION: u32 = 1;

/// What a blob says about a link.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Blob {
    pub url: String,
    pub code: u16,
    pub version: i64,
    pub expires_at_ms: Option<i64>,
}

#[derive(Debug, Error, PartialEq, Eq)]
pub enum BlobError {
    #[error("blob is larger than {MAX_BODY_BYTES} bytes")]
    TooLarge,
    #[error("blob is not UTF-8")]
    NotUtf8,
    #[error("blob does not have the zlink layout")]
    Layout,
    #[error("blob's zlink parameters are malformed")]
    Params,
    #[error("blob's URL copies disagree")]
    Mismatch,
    #[error("blob's URL is not a valid normalised URL")]
    Url,
    #[error("blob metadata is missing or malformed")]
    Metadata,
}

/// HTML-escapes for use inside a double-quoted attribute or text: nothing can break out.
pub fn escape_html(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 16);
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            c => out.push(c),
        }
    }
    out
}

/// Inverse of [`escape_html`] for exactly the entities it writes; `None` for anything else
/// (a bare `&`, a raw quote or angle bracket, an unknown entity).
fn unescape_html(s: &str) -> Option<String> {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find(['&', '"', '\'', '<', '>']) {
        out.push_str(&rest[..i]);
        rest = &rest[i..];
        let (ch, len) = [
            ("&amp;", '&'),
            ("&quot;", '"'),
            ("&#39;", '\''),
            ("&lt;", '<'),
            ("&gt;", '>'),
        ]
        .iter()
        .find(|(ent, _)| rest.starts_with(ent))
        .map(|(ent, ch)| (*ch, ent.len()))?;
        out.push(ch);
        rest = &rest[len..];
    }
    out.push_str(rest);
    Some(out)
}

const P0: &str = "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n<meta name=\"zlink\" content=\"";
const P1: &str = "\">\n<meta name=\"robots\" content=\"noindex\">\n<meta http-equiv=\"refresh\" content=\"0; url=";
const P2: &str = "\">\n<link rel=\"canonical\" href=\"";
const P3: &str = "\">\n<title>Redirecting</title></head>\n<body><p>Redirecting to <a href=\"";
const P4: &str = "\">";
const P5: &str = "</a></p></body></html>\n";

fn params(b: &Blob) -> String {
    match b.expires_at_ms {
        Some(e) => format!(
            "v={SCHEMA_VERSION}; code={}; version={}; expires={e}",
            b.code, b.version
        ),
        None => format!("v={SCHEMA_VERSION}; code={}; version={}", b.code, b.version),
    }
}

/// The body of the object for a link. `b.url` must be a normalised URL.
pub fn render(b: &Blob) -> String {
    let u = escape_html(&b.url);
    let mut out =
        String::with_capacity(P0.len() + P1.len() + P2.len() + P3.len() + 4 * u.len() + 128);
    for part in [P0, &params(b), P1, &u, P2, &u, P3, &u, P4, &u, P5] {
        out.push_str(part);
    }
    out
}

fn parse_params(s: &str) -> Option<(u16, i64, Option<i64>)> {
    let mut it = s.split("; ");
    if it.next()? != format!("v={SCHEMA_VERSION}") {
        return None;
    }
    let code: u16 = it.next()?.strip_prefix("code=")?.parse().ok()?;
    let version: i64 = it.next()?.strip_prefix("version=")?.parse().ok()?;
    let expires = match it.next() {
        Some(e) => Some(e.strip_prefix("expires=")?.parse().ok()?),
        None => None,
    };
    if it.next().is_some() || !crate::link::is_redirect_code(code) || version < 1 {
        return None;
    }
    Some((code, version, expires))
}

/// Reads a blob body. Accepts only bodies that [`render`] produces.
pub fn parse(body: &[u8]) -> Result<Blob, BlobError> {
    if body.len() > MAX_BODY_BYTES {
        return Err(BlobError::TooLarge);
    }
    let s = std::str::from_utf8(body).map_err(|_| BlobError::NotUtf8)?;
    let rest = s.strip_prefix(P0).ok_or(BlobError::Layout)?;
    let (p, rest) = rest.split_once(P1).ok_or(BlobError::Layout)?;
    let (u1, rest) = rest.split_once(P2).ok_or(BlobError::Layout)?;
    let (u2, rest) = rest.split_once(P3).ok_or(BlobError::Layout)?;
    let (u3, rest) = rest.split_once(P4).ok_or(BlobError::Layout)?;
    let u4 = rest.strip_suffix(P5).ok_or(BlobError::Layout)?;
    if !(u1 == u2 && u2 == u3 && u3 == u4) {
        return Err(BlobError::Mismatch);
    }
    let (code, version, expires_at_ms) = parse_params(p).ok_or(BlobError::Params)?;
    let url = unescape_html(u1).ok_or(BlobError::Url)?;
    if longurl::normalize(&url).as_deref() != Ok(url.as_str()) {
        return Err(BlobError::Url);
    }
    let blob = Blob {
        url,
        code,
        version,
        expires_at_ms,
    };
    // The final word: only the writer's exact bytes are accepted.
    if render(&blob) != s {
        return Err(BlobError::Layout);
    }
    Ok(blob)
}

/// Object metadata for a blob (keys without the `x-amz-meta-` prefix).
pub fn metadata(b: &Blob) -> Vec<(&'static str, String)> {
    let mut m = vec![
        (meta::SCHEMA, SCHEMA_VERSION.to_string()),
        (meta::CODE, b.code.to_string()),
        (meta::VERSION, b.version.to_string()),
    ];
    if b.url.len() <= MAX_METADATA_URL_BYTES {
        m.push((meta::URL, b.url.clone()));
    }
    if let Some(e) = b.expires_at_ms {
        m.push((meta::EXPIRES_MS, e.to_string()));
    }
    m
}

/// What object metadata says: code, version and expiry always; the URL when it fitted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlobMeta {
    pub url: Option<String>,
    pub code: u16,
    pub version: i64,
    pub expires_at_ms: Option<i64>,
}

/// Reads object metadata through `get` (key without prefix → value). Strict like [`parse`].
pub fn parse_metadata<'a>(get: impl Fn(&str) -> Option<&'a str>) -> Result<BlobMeta, BlobError> {
    if get(meta::SCHEMA) != Some(&*SCHEMA_VERSION.to_string()) {
        return Err(BlobError::Metadata);
    }
    let code: u16 = get(meta::CODE)
        .and_then(|c| c.parse().ok())
        .ok_or(BlobError::Metadata)?;
    let version: i64 = get(meta::VERSION)
        .and_then(|v| v.parse().ok())
        .ok_or(BlobError::Metadata)?;
    let expires_at_ms = match get(meta::EXPIRES_MS) {
        Some(e) => Some(e.parse().map_err(|_| BlobError::Metadata)?),
        None => None,
    };
    let url = match get(meta::URL) {
        Some(u) if longurl::normalize(u).as_deref() == Ok(u) => Some(u.to_string()),
        Some(_) => return Err(BlobError::Metadata),
        None => None,
    };
    if !crate::link::is_redirect_code(code) || version < 1 {
        return Err(BlobError::Metadata);
    }
    Ok(BlobMeta {
        url,
        code,
        version,
        expires_at_ms,
    })
}

/// The S3 key of a link's blob: `<prefix><slug>` on the default domain, `<prefix><domain>/<slug>`
/// on a branded one ([`crate::domain`]: the link key). Keys are validated (`[A-Za-z0-9_-]` slugs,
/// `[a-z0-9.-]` domains), so no escaping is needed.
pub fn object_key(prefix: &str, key: &str) -> String {
    debug_assert!(crate::domain::is_valid_key(key));
    format!("{prefix}{key}")
}

/// Folder of tombstones under the prefix. `.` is not in the slug alphabet and no domain starts
/// with it, so no blob key can ever be under it, and nginx (which fetches `<prefix><key>`) can
/// never serve one.
pub const TOMBSTONE_DIR: &str = ".gone/";

/// Tombstones: a link that exists but must not redirect (disabled or expired) has no blob
/// (SYSTEM.md) but a tombstone at `<prefix>.gone/<key>`, so that lastresort answers 410 like
/// primary instead of 404. Body: [`TOMBSTONE_BODY`]; everything is in metadata.
pub fn tombstone_key(prefix: &str, key: &str) -> String {
    debug_assert!(crate::domain::is_valid_key(key));
    format!("{prefix}{TOMBSTONE_DIR}{key}")
}

pub const TOMBSTONE_BODY: &str = "gone\n";

/// Folder of the change journal under the prefix (not servable, like [`TOMBSTONE_DIR`]).
///
/// Whoever changes blobs or tombstones (the replicator, `replicator reconcile`) also writes a
/// journal object `<prefix>.journal/<ms>-<writer>`: the 13-digit time of the write and the
/// writer's id, so keys sort by time; the body lists the changed link keys, one per line.
/// Lastresort lists the journal every second and forgets what it lists, so it can keep the
/// rest in memory for long: a change reaches it from S3 alone, within about a second.
pub const JOURNAL_DIR: &str = ".journal/";

/// The most keys one journal object lists (bounded: 300 bytes a key at most, < 1 MiB).
pub const JOURNAL_MAX_KEYS: usize = 3000;

/// A journal writer's id: 1-64 characters of `[A-Za-z0-9_.-]`.
pub fn is_journal_writer(w: &str) -> bool {
    (1..=64).contains(&w.len())
        && w.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b))
}

/// The key of a journal object written at `at_ms` by `writer`.
pub fn journal_key(prefix: &str, at_ms: i64, writer: &str) -> String {
    debug_assert!(is_journal_writer(writer));
    format!("{prefix}{JOURNAL_DIR}{:013}-{writer}", at_ms.max(0))
}

/// Where a listing of the journal written after `at_ms` starts (`StartAfter`).
pub fn journal_start_after(prefix: &str, at_ms: i64) -> String {
    format!("{prefix}{JOURNAL_DIR}{:013}", at_ms.max(0))
}

/// The write time of a journal object from its name under [`JOURNAL_DIR`]; `None` if the name
/// is not one a writer makes.
pub fn journal_time(name: &str) -> Option<i64> {
    let (ms, writer) = name.split_at_checked(13)?;
    let writer = writer.strip_prefix('-')?;
    if !ms.bytes().all(|b| b.is_ascii_digit()) || !is_journal_writer(writer) {
        return None;
    }
    ms.parse().ok()
}

/// A journal object's body: the keys, one per line.
pub fn render_journal<'a>(keys: impl IntoIterator<Item = &'a str>) -> String {
    let mut out = String::new();
    for k in keys {
        debug_assert!(crate::domain::is_valid_key(k));
        out.push_str(k);
        out.push('\n');
    }
    out
}

/// The link keys a journal body lists: only valid ones, at most [`JOURNAL_MAX_KEYS`]; the rest
/// of the body (anything else) is ignored.
pub fn parse_journal(body: &[u8]) -> Vec<String> {
    let Ok(text) = std::str::from_utf8(body) else {
        return Vec::new();
    };
    text.lines()
        .filter(|l| crate::domain::is_valid_key(l))
        .take(JOURNAL_MAX_KEYS)
        .map(str::to_string)
        .collect()
}

/// Why a link has a tombstone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GoneReason {
    Disabled,
    Expired,
    Deleted,
}

impl GoneReason {
    pub fn as_str(self) -> &'static str {
        match self {
            GoneReason::Disabled => "DISABLED",
            GoneReason::Expired => "EXPIRED",
            GoneReason::Deleted => "DELETED",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tombstone {
    pub reason: GoneReason,
    pub version: i64,
}

pub fn tombstone_metadata(t: &Tombstone) -> Vec<(&'static str, String)> {
    vec![
        (meta::SCHEMA, SCHEMA_VERSION.to_string()),
        (meta::STATUS, t.reason.as_str().to_string()),
        (meta::VERSION, t.version.to_string()),
    ]
}

/// Reads a tombstone's metadata; strict: anything else is not a tombstone.
pub fn parse_tombstone<'a>(get: impl Fn(&str) -> Option<&'a str>) -> Result<Tombstone, BlobError> {
    if get(meta::SCHEMA) != Some(&*SCHEMA_VERSION.to_string()) {
        return Err(BlobError::Metadata);
    }
    let reason = match get(meta::STATUS) {
        Some("DISABLED") => GoneReason::Disabled,
        Some("EXPIRED") => GoneReason::Expired,
        Some("DELETED") => GoneReason::Deleted,
        _ => return Err(BlobError::Metadata),
    };
    let version: i64 = get(meta::VERSION)
        .and_then(|v| v.parse().ok())
        .filter(|v| *v >= 1)
        .ok_or(BlobError::Metadata)?;
    Ok(Tombstone { reason, version })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    fn blob(url: &str) -> Blob {
        Blob {
            url: url.into(),
            code: 302,
            version: 3,
            expires_at_ms: None,
        }
    }

    #[test]
    fn tombstones_round_trip_and_live_outside_the_slug_namespace() {
        let t = Tombstone {
            reason: GoneReason::Expired,
            version: 4,
        };
        let m: HashMap<&str, String> = tombstone_metadata(&t).into_iter().collect();
        assert_eq!(parse_tombstone(|k| m.get(k).map(String::as_str)), Ok(t));
        let mut bad = m.clone();
        bad.insert(meta::STATUS, "ACTIVE".into());
        assert!(parse_tombstone(|k| bad.get(k).map(String::as_str)).is_err());
        // A blob's metadata is never a tombstone.
        let b: HashMap<&str, String> = metadata(&blob("https://e.com/")).into_iter().collect();
        assert!(parse_tombstone(|k| b.get(k).map(String::as_str)).is_err());
        assert_eq!(tombstone_key("p/", "gone"), "p/.gone/gone");
        assert!(!crate::slug::is_valid_slug(".gone"));
    }

    #[test]
    fn render_is_a_complete_document_with_three_escaped_copies() {
        let url = longurl::normalize("https://e.com/a?x=1&y=2#'f'").unwrap();
        assert_eq!(url, "https://e.com/a?x=1&y=2#'f'");
        let b = Blob {
            url,
            code: 301,
            version: 7,
            expires_at_ms: Some(99),
        };
        let html = render(&b);
        assert!(html.starts_with("<!DOCTYPE html>") && html.ends_with("</html>\n"));
        assert!(html.contains(
            r#"<meta http-equiv="refresh" content="0; url=https://e.com/a?x=1&amp;y=2#&#39;f&#39;">"#
        ));
        assert!(html
            .contains(r#"<link rel="canonical" href="https://e.com/a?x=1&amp;y=2#&#39;f&#39;">"#));
        assert!(html.contains(r#"<a href="https://e.com/a?x=1&amp;y=2#&#39;f&#39;">"#));
        assert!(html.contains(r#"content="v=1; code=301; version=7; expires=99""#));
        assert_eq!(parse(html.as_bytes()), Ok(b));
    }

    #[test]
    fn hostile_urls_cannot_break_out_of_the_attribute() {
        for raw in [
            "https://e.com/\"><script>alert(1)</script>",
            "https://e.com/?q=\"onmouseover=alert(1)",
            "https://e.com/#'><img/src=x/onerror=alert(1)>",
            "https://e.com/#\"><script>alert(1)</script>",
            "https://e.com/?a=<b>&c=d",
            "https://e.com/ünï/çødé?ключ=значение",
        ] {
            let url = longurl::normalize(raw).unwrap();
            let html = render(&blob(&url));
            // Exactly the template's own quotes and tags, whatever the URL.
            let plain = render(&blob("https://e.com/"));
            assert_eq!(
                html.matches('"').count(),
                plain.matches('"').count(),
                "{raw}"
            );
            assert_eq!(
                html.matches('<').count(),
                plain.matches('<').count(),
                "{raw}"
            );
            assert_eq!(
                html.matches('>').count(),
                plain.matches('>').count(),
                "{raw}"
            );
            assert_eq!(parse(html.as_bytes()).unwrap().url, url);
        }
    }

    #[test]
    fn anything_but_the_writers_bytes_is_refused() {
        let good = render(&blob("https://e.com/x"));
        let bad: Vec<String> = vec![
            String::new(),
            "<html></html>".into(),
            good.replace("https://e.com/x\">\n<link", "https://evil.com/\">\n<link"),
            good.replace("code=302", "code=200"),
            good.replace("version=3", "version=0"),
            good.replace("v=1;", "v=2;"),
            good.replacen("https://e.com/x", "javascript:alert(1)", 4),
            good.replacen("https://e.com/x", "https://e.com/a&b", 4),
            good.replacen("https://e.com/x", "https://e.com/a&lt", 4),
            good.replacen("https://e.com/x", "HTTPS://E.COM/x", 4),
            format!("{good} "),
            good.replace("</html>\n", "</html>\n<script></script>"),
            good.replace("<title>Redirecting</title>", "<title>x</title>"),
        ];
        for b in bad {
            assert!(parse(b.as_bytes()).is_err(), "accepted: {b:?}");
        }
        assert_eq!(parse(&[0xff, 0xfe]), Err(BlobError::NotUtf8));
        assert_eq!(
            parse(&vec![b'a'; MAX_BODY_BYTES + 1]),
            Err(BlobError::TooLarge)
        );
    }

    #[test]
    fn metadata_round_trips_and_drops_long_urls() {
        let short = Blob {
            url: "https://e.com/".into(),
            code: 308,
            version: 2,
            expires_at_ms: Some(5),
        };
        let m: HashMap<_, _> = metadata(&short).into_iter().collect();
        let parsed = parse_metadata(|k| m.get(k).map(String::as_str)).unwrap();
        assert_eq!(
            parsed,
            BlobMeta {
                url: Some(short.url.clone()),
                code: 308,
                version: 2,
                expires_at_ms: Some(5)
            }
        );

        let long = blob(&format!(
            "https://e.com/{}",
            "a".repeat(MAX_METADATA_URL_BYTES)
        ));
        let m: HashMap<_, _> = metadata(&long).into_iter().collect();
        assert!(!m.contains_key(meta::URL));
        assert_eq!(
            parse_metadata(|k| m.get(k).map(String::as_str))
                .unwrap()
                .url,
            None
        );
        let total: usize = metadata(&long)
            .iter()
            .map(|(k, v)| k.len() + v.len() + 11)
            .sum();
        assert!(total < 2048);

        assert!(parse_metadata(|_| None).is_err());
        assert!(parse_metadata(|k| (k == meta::SCHEMA).then_some("1")).is_err());
    }

    proptest! {
        #[test]
        fn parse_inverts_render_for_any_valid_url(raw in "https?://[a-z0-9.-]{1,20}\\.[a-z]{2,5}/\\PC{0,120}",
                                                  code in prop::sample::select(vec![301u16, 302, 307, 308]),
                                                  version in 1i64..i64::MAX,
                                                  expires in proptest::option::of(0i64..i64::MAX)) {
            if let Ok(url) = longurl::normalize(&raw) {
                let b = Blob { url, code, version, expires_at_ms: expires };
                prop_assert_eq!(parse(render(&b).as_bytes()), Ok(b));
            }
        }

        #[test]
        fn parse_never_panics_and_accepts_only_canonical_bodies(body in proptest::collection::vec(any::<u8>(), 0..600)) {
            if let Ok(b) = parse(&body) {
                let again = render(&b);
                prop_assert_eq!(again.as_bytes(), &body[..]);
            }
        }

        #[test]
        fn escaping_round_trips_and_leaves_no_markup(s in "\\PC{0,200}") {
            let e = escape_html(&s);
            prop_assert!(!e.contains(['"', '\'', '<', '>']));
            prop_assert_eq!(unescape_html(&e), Some(s));
        }
    }

    #[test]
    fn journal_keys_sort_by_time_and_only_valid_names_and_lines_are_read() {
        let a = journal_key("p/", 1_700_000_000_123, "replicator-1");
        let b = journal_key("p/", 1_700_000_000_124, "a");
        assert_eq!(a, "p/.journal/1700000000123-replicator-1");
        assert!(a < b && journal_start_after("p/", 1_700_000_000_123) < a);
        assert!(journal_start_after("p/", 1_700_000_000_124) < b);
        let name = a.strip_prefix("p/.journal/").unwrap();
        assert_eq!(journal_time(name), Some(1_700_000_000_123));
        for bad in [
            "",
            "123-x",
            "17000000001230replicator",
            "1700000000123-",
            "1700000000123-a/b",
            "170000000012x-a",
        ] {
            assert_eq!(journal_time(bad), None, "{bad:?}");
        }
        let body = render_journal(["abc", "shop.example/x_1"]);
        assert_eq!(body, "abc\nshop.example/x_1\n");
        let mut evil = body.into_bytes();
        evil.extend_from_slice(b"../etc\n<script>\n\nok-2\n");
        assert_eq!(parse_journal(&evil), ["abc", "shop.example/x_1", "ok-2"]);
        assert!(parse_journal(b"\xff\xfe").is_empty());
        let many = "abc\n".repeat(JOURNAL_MAX_KEYS + 10);
        assert_eq!(parse_journal(many.as_bytes()).len(), JOURNAL_MAX_KEYS);
    }
}
