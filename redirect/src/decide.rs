//! The redirect decision, pure: what a lookup found and the time → redirect (status +
//! `Location`), 404, 410 or 500. Both tiers call [`decide`] on a [`View`] of their own lookup
//! result; `tests/tests/e2e/deciders.rs` drives both tiers' lookups (primary's cached row,
//! lastresort's S3 object as the replicator writes it) with the same generated links and
//! asserts identical answers.

use bytes::Bytes;
use http::{HeaderValue, StatusCode};
use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// What a redirect needs; lastresort's memcached value (JSON).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Target {
    pub url: String,
    pub code: u16,
    /// Unix milliseconds.
    pub exp: Option<i64>,
}

impl Target {
    /// A value read from memcached is untrusted input (anyone who can reach memcached can write
    /// it): used only if it is what a tier would have written — a URL that is its own normal
    /// form (so a valid `Location`), an allowed redirect code.
    pub fn is_valid(&self) -> bool {
        is_servable(&self.url, self.code)
    }
}

/// A cached link's target URL (what [`Located`] builds its `Location` from).
pub trait Url {
    fn url(&self) -> &str;
}

impl Url for Target {
    fn url(&self) -> &str {
        &self.url
    }
}

/// A link as a tier's caches hold it, with its `Location` header value built once, when it is
/// cached: a redirect then neither copies nor checks the URL (a clone of the value is a
/// reference count, where building it was an allocation, a copy and a check of every byte).
/// `None` when the URL is no valid header value (the decider answers 500 for it).
#[derive(Debug)]
pub struct Located<T> {
    link: T,
    location: Option<HeaderValue>,
}

impl<T: Url> Located<T> {
    pub fn new(link: T) -> Self {
        let location =
            HeaderValue::from_maybe_shared(Bytes::copy_from_slice(link.url().as_bytes())).ok();
        Located { link, location }
    }
}

impl<T> Located<T> {
    /// The `Location` value of the link's URL, if it is a valid one.
    pub fn location(&self) -> Option<&HeaderValue> {
        self.location.as_ref()
    }
}

impl<T> std::ops::Deref for Located<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.link
    }
}

/// A URL that is its own normal form and an allowed redirect code.
pub fn is_servable(url: &str, code: u16) -> bool {
    zlink_wire::link::is_redirect_code(code)
        && zlink_wire::longurl::normalize(url).is_ok_and(|n| n == url)
}

/// A lookup result, as the decider sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum View<'a> {
    /// An active link (not yet checked for expiry: the decider does that with its clock).
    Redirect {
        url: &'a str,
        code: u16,
        exp: Option<i64>,
    },
    /// Disabled (a status, or a tombstone in S3).
    Gone,
    Missing,
}

/// A tier's lookup result: cached in-process, weighed by its size.
pub trait Answer: Clone + Send + Sync + 'static {
    fn view(&self) -> View<'_>;

    /// The redirect's `Location`, built when the answer was cached ([`Located`]); `None`: the
    /// decider builds it from the view's URL.
    fn location(&self) -> Option<&HeaderValue> {
        None
    }

    /// Bytes this entry holds in the in-process cache, roughly (key and overhead included).
    fn weight(&self, key: &str) -> u32 {
        let n = match self.view() {
            View::Redirect { url, .. } => url.len(),
            View::Gone | View::Missing => 0,
        };
        let location = self.location().map_or(0, HeaderValue::len);
        u32::try_from(key.len() + n + location + 96).unwrap_or(u32::MAX)
    }

    /// Negative answers are cached for a shorter time.
    fn is_missing(&self) -> bool {
        matches!(self.view(), View::Missing)
    }

    /// An answer its tier trusts only for the short TTL (lastresort: one not covered by the
    /// change journal).
    fn is_short_lived(&self) -> bool {
        false
    }
}

/// Lastresort's lookup result: what S3 (or a cache of it) holds for a slug.
#[derive(Debug, Clone)]
pub enum Outcome {
    Found(Arc<Located<Target>>),
    /// No blob, but a tombstone: the link exists and is disabled or expired (410).
    Gone,
    Missing,
}

impl Answer for Outcome {
    fn view(&self) -> View<'_> {
        match self {
            Outcome::Found(t) => View::Redirect {
                url: &t.url,
                code: t.code,
                exp: t.exp,
            },
            Outcome::Gone => View::Gone,
            Outcome::Missing => View::Missing,
        }
    }

    fn location(&self) -> Option<&HeaderValue> {
        match self {
            Outcome::Found(t) => t.location(),
            Outcome::Gone | Outcome::Missing => None,
        }
    }
}

impl Outcome {
    /// A found target, its `Location` built once.
    pub fn found(t: Target) -> Self {
        Outcome::Found(Arc::new(Located::new(t)))
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    Redirect {
        code: StatusCode,
        location: HeaderValue,
    },
    Reject(crate::Reject),
}

/// The decision. Expired ([`zlink_wire::link::is_expired`]) is 410 like disabled; a stored URL or code that cannot
/// be sent is 500 (never a broken `Location`).
pub fn decide(view: View<'_>, now_ms: i64) -> Decision {
    decide_located(view, None, now_ms)
}

/// [`decide`] with the `Location` of the view's URL built ahead ([`Answer::location`]): the
/// same decision, the header value cloned instead of built.
pub fn decide_located(view: View<'_>, location: Option<&HeaderValue>, now_ms: i64) -> Decision {
    use crate::Reject;
    match view {
        View::Missing => Decision::Reject(Reject::NotFound),
        View::Gone => Decision::Reject(Reject::Gone),
        View::Redirect { exp, .. } if zlink_wire::link::is_expired(exp, now_ms) => {
            Decision::Reject(Reject::Gone)
        }
        View::Redirect { url, code, .. } => {
            let location = match location {
                Some(l) => Ok(l.clone()),
                None => HeaderValue::from_str(url).map_err(|_| ()),
            };
            match (location, StatusCode::from_u16(code)) {
                (Ok(location), Ok(code)) if code.is_redirection() => {
                    Decision::Redirect { code, location }
                }
                _ => Decision::Reject(Reject::Internal),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Reject;
    use proptest::prelude::*;

    #[test]
    fn decisions() {
        let r = |exp| View::Redirect {
            url: "https://e.com/",
            code: 301,
            exp,
        };
        assert_eq!(
            decide(r(None), 5),
            Decision::Redirect {
                code: StatusCode::MOVED_PERMANENTLY,
                location: HeaderValue::from_static("https://e.com/")
            }
        );
        assert!(matches!(decide(r(Some(6)), 5), Decision::Redirect { .. }));
        assert_eq!(decide(r(Some(5)), 5), Decision::Reject(Reject::Gone));
        assert_eq!(decide(View::Gone, 5), Decision::Reject(Reject::Gone));
        assert_eq!(decide(View::Missing, 5), Decision::Reject(Reject::NotFound));
        let bad = View::Redirect {
            url: "https://e.com/\r\nx: y",
            code: 302,
            exp: None,
        };
        assert_eq!(decide(bad, 5), Decision::Reject(Reject::Internal));
        let not_redirect = View::Redirect {
            url: "https://e.com/",
            code: 200,
            exp: None,
        };
        assert_eq!(decide(not_redirect, 5), Decision::Reject(Reject::Internal));
    }

    proptest! {
        /// Whatever a cache holds, the decider never panics and never redirects to a value
        /// that is not a valid header with a 3xx code.
        #[test]
        fn never_panics_never_bad_location(url in ".{0,64}", code in 0u16..1000, exp in proptest::option::of(any::<i64>()), now in any::<i64>()) {
            let d = decide(View::Redirect { url: &url, code, exp }, now);
            if let Decision::Redirect { code, location } = d {
                prop_assert!(code.is_redirection());
                prop_assert_eq!(location.as_bytes(), url.as_bytes());
                prop_assert!(exp.is_none_or(|e| e > now));
            }
        }

        /// A `Location` built when the link was cached decides exactly what building it per
        /// redirect does, for any URL (valid header value or not) and any code.
        #[test]
        fn a_location_built_ahead_decides_the_same(url in ".{0,64}|[ -~]{0,64}", code in 290u16..320, exp in proptest::option::of(0i64..10), now in 0i64..10) {
            let cached = Outcome::found(Target { url: url.clone(), code, exp });
            prop_assert_eq!(
                decide_located(cached.view(), cached.location(), now),
                decide(View::Redirect { url: &url, code, exp }, now)
            );
            prop_assert_eq!(cached.location().is_some(), HeaderValue::from_str(&url).is_ok());
        }
    }
}
