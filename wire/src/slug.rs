//! Slug rules and the auto-slug codec.
//!
//! Two kinds of slug share one namespace:
//! - **auto**: exactly [`AUTO_LEN`] base62 characters, the image of a leased integer ID under a
//!   keyed permutation of `[0, 62^7)` (collision-free by construction, unguessable without the key);
//! - **custom**: `[A-Za-z0-9_-]{3,64}`, chosen by the user, minus reserved words and minus the
//!   auto shape (7 letters/digits), so a custom claim can never take a slug the codec will emit.
//!
//! Every valid slug is safe, unescaped, as an S3 key, a memcached key part and a URL path segment.

use sha2::{Digest, Sha256};
use thiserror::Error;

/// Length of every auto slug.
pub const AUTO_LEN: usize = 7;
/// Size of the auto-slug space: 62^7.
pub const AUTO_SPACE: u64 = 3_521_614_606_208;
pub const CUSTOM_MIN: usize = 3;
pub const CUSTOM_MAX: usize = 64;

const ALPHABET: &[u8; 62] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";

/// Paths and names that must never be claimable as slugs (compared case-insensitively).
pub const RESERVED: &[&str] = &[
    "about",
    "admin",
    "api",
    "assets",
    "bulk",
    "dashboard",
    "debug",
    "docs",
    "favicon",
    "health",
    "healthz",
    "help",
    "info",
    "livez",
    "login",
    "logout",
    "metrics",
    "readyz",
    "robots",
    "signup",
    "static",
    "stats",
    "status",
    "www",
];

#[derive(Debug, Error, PartialEq, Eq)]
pub enum SlugError {
    #[error("slug must be {CUSTOM_MIN} to {CUSTOM_MAX} characters long")]
    Length,
    #[error("slug may contain only letters, digits, '_' and '-'")]
    Charset,
    #[error("slug is a reserved word")]
    Reserved,
    #[error("slugs of exactly 7 letters and digits are reserved for generated links")]
    AutoShape,
}

fn is_slug_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_' || b == b'-'
}

/// True for any slug that can exist (auto or custom): the cheap check on the redirect path.
pub fn is_valid_slug(s: &str) -> bool {
    (CUSTOM_MIN..=CUSTOM_MAX).contains(&s.len()) && s.bytes().all(is_slug_byte)
}

/// True when `s` has the shape of an auto slug.
pub fn is_auto_shape(s: &str) -> bool {
    s.len() == AUTO_LEN && s.bytes().all(|b| b.is_ascii_alphanumeric())
}

/// Validates a user-chosen slug.
pub fn validate_custom(s: &str) -> Result<(), SlugError> {
    if !(CUSTOM_MIN..=CUSTOM_MAX).contains(&s.len()) {
        return Err(SlugError::Length);
    }
    if !s.bytes().all(is_slug_byte) {
        return Err(SlugError::Charset);
    }
    if RESERVED.iter().any(|r| r.eq_ignore_ascii_case(s)) || crate::canary::is_canary(s) {
        return Err(SlugError::Reserved);
    }
    if is_auto_shape(s) {
        return Err(SlugError::AutoShape);
    }
    Ok(())
}

/// Base62 of `n` in exactly `width` characters (most significant first). `n < 62^width`.
fn base62_fixed(mut n: u64, width: usize) -> String {
    let mut out = vec![b'0'; width];
    for slot in out.iter_mut().rev() {
        *slot = ALPHABET[(n % 62) as usize];
        n /= 62;
    }
    debug_assert_eq!(n, 0, "value does not fit the width");
    // The alphabet is ASCII, so this cannot fail.
    String::from_utf8(out).unwrap_or_default()
}

fn base62_value(b: u8) -> Option<u64> {
    match b {
        b'0'..=b'9' => Some((b - b'0') as u64),
        b'A'..=b'Z' => Some((b - b'A') as u64 + 10),
        b'a'..=b'z' => Some((b - b'a') as u64 + 36),
        _ => None,
    }
}

/// A keyed permutation of `[0, domain)`: a balanced Feistel network over `2 * half_bits` bits
/// with a SHA-256-based round function, plus cycle-walking to stay inside the domain.
/// Cycle-walking preserves bijectivity: the walk from any in-domain point through the
/// permutation of the larger power-of-two space reaches the next in-domain point, and
/// inverting walks back the same path.
#[derive(Clone)]
pub struct Permutation {
    keyed: Sha256,
    half_bits: u32,
    domain: u64,
}

const ROUNDS: u8 = 6;

impl Permutation {
    pub fn new(key: &[u8], half_bits: u32, domain: u64) -> Self {
        assert!((1..=31).contains(&half_bits), "half_bits out of range");
        assert!(
            domain >= 1 && domain <= 1u64 << (2 * half_bits),
            "domain exceeds the Feistel space"
        );
        let mut keyed = Sha256::new();
        keyed.update(b"zlink-slug-feistel-v1\0");
        keyed.update((key.len() as u64).to_be_bytes());
        keyed.update(key);
        Self {
            keyed,
            half_bits,
            domain,
        }
    }

    fn mask(&self) -> u64 {
        (1u64 << self.half_bits) - 1
    }

    fn round(&self, round: u8, half: u64) -> u64 {
        let mut h = self.keyed.clone();
        h.update([round]);
        h.update(half.to_be_bytes());
        let d = h.finalize();
        u64::from_be_bytes([d[0], d[1], d[2], d[3], d[4], d[5], d[6], d[7]]) & self.mask()
    }

    fn feistel(&self, x: u64) -> u64 {
        let (mut l, mut r) = (x >> self.half_bits, x & self.mask());
        for i in 0..ROUNDS {
            (l, r) = (r, l ^ self.round(i, r));
        }
        (l << self.half_bits) | r
    }

    fn feistel_inv(&self, y: u64) -> u64 {
        let (mut l, mut r) = (y >> self.half_bits, y & self.mask());
        for i in (0..ROUNDS).rev() {
            (l, r) = (r ^ self.round(i, l), l);
        }
        (l << self.half_bits) | r
    }

    /// Maps `x` (must be `< domain`) to a unique value `< domain`.
    pub fn forward(&self, x: u64) -> u64 {
        debug_assert!(x < self.domain);
        let mut y = self.feistel(x);
        while y >= self.domain {
            y = self.feistel(y);
        }
        y
    }

    pub fn inverse(&self, y: u64) -> u64 {
        debug_assert!(y < self.domain);
        let mut x = self.feistel_inv(y);
        while x >= self.domain {
            x = self.feistel_inv(x);
        }
        x
    }
}

/// Auto slugs: ID → keyed permutation of `[0, 62^7)` → 7-character base62.
#[derive(Clone)]
pub struct SlugCodec {
    perm: Permutation,
}

#[derive(Debug, Error, PartialEq, Eq)]
#[error("auto-slug ID space exhausted (id {0} >= 62^7)")]
pub struct IdOutOfRange(pub u64);

impl SlugCodec {
    /// `key` must stay the same for the life of a deployment: changing it remaps every future ID.
    pub fn new(key: &[u8]) -> Self {
        // 2 * 21 bits = 2^42 ≥ 62^7, so cycle-walking takes ~1.25 steps on average.
        Self {
            perm: Permutation::new(key, 21, AUTO_SPACE),
        }
    }

    pub fn encode(&self, id: u64) -> Result<String, IdOutOfRange> {
        if id >= AUTO_SPACE {
            return Err(IdOutOfRange(id));
        }
        Ok(base62_fixed(self.perm.forward(id), AUTO_LEN))
    }

    /// The ID an auto slug was made from; `None` for anything that is not auto-shaped.
    pub fn decode(&self, slug: &str) -> Option<u64> {
        if slug.len() != AUTO_LEN {
            return None;
        }
        let mut n = 0u64;
        for b in slug.bytes() {
            n = n * 62 + base62_value(b)?;
        }
        Some(self.perm.inverse(n))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn canary_slugs_are_valid_keys_no_client_can_claim() {
        for (_, s, _) in crate::canary::all() {
            assert!(is_valid_slug(&s), "{s}");
            assert!(validate_custom(&s).is_err(), "{s} is claimable");
        }
        assert_eq!(validate_custom("Zlink-Canary-x"), Err(SlugError::Reserved));
    }

    #[test]
    fn permutation_is_a_bijection_on_a_small_domain_exhaustively() {
        // 62^3 = 238,328 inside 2^18: same construction as the real codec, small enough to check every point.
        let domain = 62u64.pow(3);
        let p = Permutation::new(b"test-key", 9, domain);
        let mut seen = vec![false; domain as usize];
        for x in 0..domain {
            let y = p.forward(x);
            assert!(y < domain);
            assert!(!seen[y as usize], "{y} hit twice");
            seen[y as usize] = true;
            assert_eq!(p.inverse(y), x);
        }
    }

    #[test]
    fn auto_slugs_are_fixed_width_unique_and_round_trip() {
        let codec = SlugCodec::new(b"k1");
        let mut seen = HashSet::new();
        for id in (0..50_000u64).chain(AUTO_SPACE - 1000..AUTO_SPACE) {
            let s = codec.encode(id).unwrap();
            assert_eq!(s.len(), AUTO_LEN);
            assert!(is_auto_shape(&s) && is_valid_slug(&s));
            assert!(seen.insert(s.clone()), "duplicate slug {s}");
            assert_eq!(codec.decode(&s), Some(id));
        }
    }

    #[test]
    fn different_keys_give_different_sequences() {
        let a = SlugCodec::new(b"key-a");
        let b = SlugCodec::new(b"key-b");
        let same = (0..1000).filter(|&i| a.encode(i) == b.encode(i)).count();
        assert!(same < 5);
    }

    #[test]
    fn consecutive_ids_do_not_give_neighbouring_slugs() {
        let codec = SlugCodec::new(b"k");
        let s0 = codec.encode(1000).unwrap();
        let s1 = codec.encode(1001).unwrap();
        let common = s0
            .bytes()
            .zip(s1.bytes())
            .take_while(|(x, y)| x == y)
            .count();
        assert!(common < 4, "{s0} vs {s1}");
    }

    #[test]
    fn out_of_range_ids_are_refused() {
        assert_eq!(
            SlugCodec::new(b"k").encode(AUTO_SPACE),
            Err(IdOutOfRange(AUTO_SPACE))
        );
    }

    #[test]
    fn base62_is_fixed_width() {
        assert_eq!(base62_fixed(0, 7), "0000000");
        assert_eq!(base62_fixed(61, 7), "000000z");
        assert_eq!(base62_fixed(AUTO_SPACE - 1, 7), "zzzzzzz");
    }

    #[test]
    fn custom_slug_rules() {
        assert_eq!(validate_custom("my-link_1"), Ok(()));
        assert_eq!(validate_custom("ab"), Err(SlugError::Length));
        assert_eq!(validate_custom(&"a".repeat(65)), Err(SlugError::Length));
        assert_eq!(validate_custom("a b"), Err(SlugError::Charset));
        assert_eq!(validate_custom("../etc"), Err(SlugError::Charset));
        assert_eq!(validate_custom("café"), Err(SlugError::Charset));
        assert_eq!(validate_custom("a%2f"), Err(SlugError::Charset));
        assert_eq!(validate_custom("API"), Err(SlugError::Reserved));
        assert_eq!(validate_custom("Metrics"), Err(SlugError::Reserved));
        assert_eq!(validate_custom("abcDEF1"), Err(SlugError::AutoShape));
        assert_eq!(validate_custom("abc-EF1"), Ok(()));
        assert_eq!(validate_custom("abcDEF12"), Ok(()));
    }
}

#[cfg(test)]
mod proptests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn any_id_round_trips(id in 0..AUTO_SPACE, key in proptest::collection::vec(any::<u8>(), 16..48)) {
            let codec = SlugCodec::new(&key);
            let slug = codec.encode(id).unwrap();
            prop_assert!(is_auto_shape(&slug));
            prop_assert!(validate_custom(&slug).is_err());
            prop_assert_eq!(codec.decode(&slug), Some(id));
        }

        #[test]
        fn slug_validation_never_accepts_unsafe_characters(s in "\\PC{0,80}") {
            if is_valid_slug(&s) {
                prop_assert!(s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-'));
            }
        }
    }
}
