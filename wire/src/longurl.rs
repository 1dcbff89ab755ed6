//! Validation and normalisation of destination ("long") URLs.
//!
//! A long URL is accepted only if it is absolute http(s) with a host, has no credentials, and
//! contains no whitespace, control or invisible formatting characters. The stored form is the
//! WHATWG serialisation from the `url` crate: pure ASCII (IDN hosts punycoded, non-ASCII path and
//! query percent-encoded), so it is always a valid `Location` header value.

use thiserror::Error;
use url::Url;

/// Maximum length of a long URL, in bytes, before and after normalisation.
pub const MAX_URL_BYTES: usize = 8 * 1024;

#[derive(Debug, Error, PartialEq, Eq)]
pub enum UrlError {
    #[error("url must not be empty")]
    Empty,
    #[error("url is longer than {MAX_URL_BYTES} bytes")]
    TooLong,
    #[error("url contains whitespace, control or invisible characters")]
    ForbiddenCharacter,
    #[error("url is not a valid absolute URL")]
    Unparseable,
    #[error("url scheme must be http or https")]
    Scheme,
    #[error("url must have a host")]
    NoHost,
    #[error("url must not contain a username or password")]
    Credentials,
}

/// Characters that would let a URL look like something it is not, or break a header or log line.
fn is_forbidden(c: char) -> bool {
    c.is_whitespace()
        || c.is_control()
        || matches!(c,
            '\u{200B}'..='\u{200F}' // zero-width and directional marks
            | '\u{202A}'..='\u{202E}' // bidi embeddings and overrides
            | '\u{2060}'..='\u{2064}' // word joiner, invisible operators
            | '\u{2066}'..='\u{2069}' // bidi isolates
            | '\u{FEFF}' // BOM / zero-width no-break space
            | '\u{FFF9}'..='\u{FFFB}') // interlinear annotations
}

/// Returns the normalised URL to store and redirect to.
pub fn normalize(raw: &str) -> Result<String, UrlError> {
    if raw.is_empty() {
        return Err(UrlError::Empty);
    }
    if raw.len() > MAX_URL_BYTES {
        return Err(UrlError::TooLong);
    }
    if raw.chars().any(is_forbidden) {
        return Err(UrlError::ForbiddenCharacter);
    }
    let url = Url::parse(raw).map_err(|_| UrlError::Unparseable)?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(UrlError::Scheme);
    }
    match url.host_str() {
        Some(h) if !h.is_empty() => {}
        _ => return Err(UrlError::NoHost),
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(UrlError::Credentials);
    }
    let out = String::from(url);
    if out.len() > MAX_URL_BYTES {
        return Err(UrlError::TooLong);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_and_normalises_ordinary_urls() {
        assert_eq!(
            normalize("https://example.com").unwrap(),
            "https://example.com/"
        );
        assert_eq!(
            normalize("HTTP://Example.COM/a?b=c#d").unwrap(),
            "http://example.com/a?b=c#d"
        );
        assert_eq!(
            normalize("https://bücher.de/straße").unwrap(),
            "https://xn--bcher-kva.de/stra%C3%9Fe"
        );
        assert_eq!(
            normalize("https://[::1]:8080/x").unwrap(),
            "https://[::1]:8080/x"
        );
    }

    #[test]
    fn output_is_always_ascii_without_quotes_or_angle_brackets_in_the_path() {
        let u = normalize("https://e.com/\"><script>alert(1)</script>").unwrap();
        assert!(u.is_ascii());
        assert!(!u.contains('"') && !u.contains('<') && !u.contains('>'));
    }

    #[test]
    fn rejects_bad_urls() {
        let cases: &[(&str, UrlError)] = &[
            ("", UrlError::Empty),
            ("javascript:alert(1)", UrlError::Scheme),
            ("ftp://example.com/", UrlError::Scheme),
            ("data:text/html,hi", UrlError::Scheme),
            ("file:///etc/passwd", UrlError::Scheme),
            ("//example.com/", UrlError::Unparseable),
            ("example.com", UrlError::Unparseable),
            ("https://", UrlError::Unparseable),
            ("https://exa mple.com/", UrlError::ForbiddenCharacter),
            ("https://example.com/\n", UrlError::ForbiddenCharacter),
            (
                "https://example.com/\r\nSet-Cookie: x",
                UrlError::ForbiddenCharacter,
            ),
            ("https://example.com/\t", UrlError::ForbiddenCharacter),
            ("https://example.com/\u{0}", UrlError::ForbiddenCharacter),
            (
                "https://example.com/\u{202E}gpj.exe",
                UrlError::ForbiddenCharacter,
            ),
            ("https://exa\u{200B}mple.com/", UrlError::ForbiddenCharacter),
            ("https://user:pw@example.com/", UrlError::Credentials),
            ("https://user@example.com/", UrlError::Credentials),
        ];
        for (raw, want) in cases {
            assert_eq!(normalize(raw).as_ref(), Err(want), "{raw:?}");
        }
    }

    #[test]
    fn length_limit_is_enforced_before_and_after_normalisation() {
        let at_limit = format!("https://e.com/{}", "a".repeat(MAX_URL_BYTES - 14));
        assert_eq!(at_limit.len(), MAX_URL_BYTES);
        assert!(normalize(&at_limit).is_ok());
        let over = format!("{at_limit}a");
        assert_eq!(normalize(&over), Err(UrlError::TooLong));
        // 'é' becomes %C3%A9: under the limit raw, over it once encoded.
        let grows = format!("https://e.com/{}", "é".repeat(3000));
        assert!(grows.len() < MAX_URL_BYTES);
        assert_eq!(normalize(&grows), Err(UrlError::TooLong));
    }
}

#[cfg(test)]
mod proptests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Any input: no panic; anything accepted is ASCII, within the limit, a valid
        /// http(s) URL with a host, and already in normal form.
        #[test]
        fn accepted_urls_are_safe_and_stable(raw in "\\PC{0,200}|https?://[a-z0-9.-]{1,30}(:[0-9]{1,5})?/\\PC{0,100}") {
            if let Ok(url) = normalize(&raw) {
                prop_assert!(url.is_ascii());
                prop_assert!(url.len() <= MAX_URL_BYTES);
                // Quotes, angle brackets and whitespace are always percent-encoded (a backslash may
                // remain in a fragment: legal in a header, and escaped wherever it is embedded).
                prop_assert!(!url.contains(['"', '<', '>', ' ', '\n', '\r']));
                prop_assert!(url.starts_with("http://") || url.starts_with("https://"));
                prop_assert!(http_header_safe(&url));
                prop_assert_eq!(normalize(&url), Ok(url.clone()));
            }
        }
    }

    fn http_header_safe(s: &str) -> bool {
        s.bytes().all(|b| (0x21..0x7f).contains(&b))
    }
}
