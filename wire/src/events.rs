//! Event schemas carried on Kafka (`links`, `clicks`).
//!
//! Encoding: JSON. Every consumer (the replicator, the click counter, an SRE with
//! kafka-console-consumer during an incident) can read it without a schema registry. Each event
//! carries `schema` so a consumer can refuse versions it does not know instead of misreading them.
//!
//! `links`: one event per message, keyed by slug. `clicks`: a message holds one or more click
//! events, one JSON document per line ([`click_lines`]), all of the same partition (the one
//! their slugs hash to); one click alone is keyed by its slug. A redirect's click is small and
//! there is one per redirect: a message per click cost the redirect tiers, Kafka and the counter
//! their per-message work on every click (issue 37). A message of one event is a message of
//! one line, so readers of the one-event form read both.

use crate::domain::LinkKey;
use crate::link::LinkStatus;
use serde::{Deserialize, Serialize};
use std::borrow::Cow;
use uuid::Uuid;

mod line;

pub const LINK_EVENT_SCHEMA: u16 = 1;
pub const CLICK_EVENT_SCHEMA: u16 = 1;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LinkEventKind {
    Created,
    Disabled,
    Enabled,
    Expired,
    Deleted,
    /// A new destination and/or expiry; the status is unchanged.
    Updated,
}

/// The state of one link after a change. `version` increases by one with every change of the
/// link, so a consumer applies an event only if it is newer than what it has applied before:
/// a replayed or reordered event can never resurrect a disabled link.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LinkEvent {
    pub schema: u16,
    pub kind: LinkEventKind,
    /// The link's key ([`LinkKey`]); `slug` on the wire.
    #[serde(rename = "slug")]
    pub key: LinkKey,
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

impl Tier {
    pub const ALL: [Tier; 3] = [Tier::Primary, Tier::Lastresort, Tier::LastresortNginx];

    /// Its JSON name.
    pub fn name(self) -> &'static str {
        match self {
            Tier::Primary => "primary",
            Tier::Lastresort => "lastresort",
            Tier::LastresortNginx => "lastresort-nginx",
        }
    }
}

/// Who followed the link, from the user agent: people, crawlers, or the bots that fetch a link
/// to draw its preview card in a chat or social app. Counted apart (bots are not audience).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum AgentClass {
    #[default]
    Browser,
    Bot,
    Preview,
}

/// Link-preview fetchers (checked first: several also say "bot").
const PREVIEW_AGENTS: &[&str] = &[
    "slackbot-linkexpanding",
    "slack-imgproxy",
    "twitterbot",
    "facebookexternalhit",
    "facebookcatalog",
    "linkedinbot",
    "discordbot",
    "telegrambot",
    "whatsapp",
    "skypeuripreview",
    "iframely",
    "embedly",
    "pinterestbot",
    "redditbot",
    "vkshare",
    "mastodon",
    "google-pagerenderer",
];

/// Crawlers, monitors and HTTP libraries.
const BOT_AGENTS: &[&str] = &[
    "bot",
    "crawler",
    "spider",
    "slurp",
    "curl/",
    "wget/",
    "python-requests",
    "python-urllib",
    "go-http-client",
    "java/",
    "okhttp",
    "libwww",
    "httpclient",
    "headlesschrome",
    "phantomjs",
    "monitor",
    "pingdom",
    "uptime",
    "scrapy",
    "axios/",
    "node-fetch",
];

impl AgentClass {
    pub const ALL: [AgentClass; 3] = [AgentClass::Browser, AgentClass::Bot, AgentClass::Preview];

    /// Classifies a `User-Agent` (case-insensitive substring rules). No user agent at all is
    /// a bot: every browser sends one.
    pub fn of(user_agent: Option<&str>) -> AgentClass {
        classify(user_agent).0
    }

    /// Its JSON name.
    pub fn name(self) -> &'static str {
        match self {
            AgentClass::Browser => "browser",
            AgentClass::Bot => "bot",
            AgentClass::Preview => "preview",
        }
    }
}

/// The kind of device a click came from, from the user agent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum Device {
    Desktop,
    Mobile,
    Tablet,
    /// Anything else: bots, HTTP libraries, TVs, consoles, no user agent.
    #[default]
    Other,
}

/// What a device rule looks for in a user agent (bits of [`Marks`]).
const DEVICE_MARKS: &[(&str, u32)] = &[
    ("android", ANDROID),
    ("ipad", TABLET),
    ("tablet", TABLET),
    ("mobile", MOBILE_WORD),
    ("mobi", MOBI),
    ("iphone", MOBI),
    ("ipod", MOBI),
    ("windows nt", DESKTOP),
    ("macintosh", DESKTOP),
    ("x11", DESKTOP),
    ("cros", DESKTOP),
    ("linux x86_64", DESKTOP),
];
const PREVIEW: u32 = 1;
const BOT: u32 = 1 << 1;
const ANDROID: u32 = 1 << 2;
const TABLET: u32 = 1 << 3;
const MOBILE_WORD: u32 = 1 << 4;
const MOBI: u32 = 1 << 5;
const DESKTOP: u32 = 1 << 6;

/// Every pattern of the rules in one automaton, ASCII case-insensitive, with the bit each
/// sets: a user agent is read once, without a lowercased copy (it was lowercased and
/// searched once per pattern, about 80 searches per click, twice the cost of the rest of the
/// click's event; issue 37).
struct Marks {
    automaton: aho_corasick::AhoCorasick,
    bits: Vec<u32>,
}

fn marks() -> &'static Marks {
    static MARKS: std::sync::OnceLock<Marks> = std::sync::OnceLock::new();
    MARKS.get_or_init(|| {
        let patterns = (PREVIEW_AGENTS.iter().map(|p| (*p, PREVIEW)))
            .chain(BOT_AGENTS.iter().map(|p| (*p, BOT)))
            .chain(DEVICE_MARKS.iter().copied());
        let (pats, bits): (Vec<&str>, Vec<u32>) = patterns.unzip();
        let automaton = aho_corasick::AhoCorasick::builder()
            .ascii_case_insensitive(true)
            .build(pats)
            .expect("fixed patterns build");
        Marks { automaton, bits }
    })
}

/// [`AgentClass::of`] and [`Device::of`] of one user agent, read once.
pub fn classify(user_agent: Option<&str>) -> (AgentClass, Device) {
    let Some(ua) = user_agent else {
        return (AgentClass::Bot, Device::Other);
    };
    let m = marks();
    let found = m
        .automaton
        .find_overlapping_iter(ua)
        .fold(0, |acc, hit| acc | m.bits[hit.pattern().as_usize()]);
    let has = |bit: u32| found & bit != 0;
    let class = if has(PREVIEW) {
        AgentClass::Preview
    } else if ua.trim().is_empty() || has(BOT) {
        AgentClass::Bot
    } else {
        AgentClass::Browser
    };
    // Tablets before phones: an Android tablet says "Android" without "Mobile", an iPad says
    // "iPad".
    let device = if has(TABLET) || (has(ANDROID) && !has(MOBILE_WORD)) {
        Device::Tablet
    } else if has(MOBI) || has(MOBILE_WORD) || has(ANDROID) {
        Device::Mobile
    } else if class != AgentClass::Browser {
        Device::Other
    } else if has(DESKTOP) {
        Device::Desktop
    } else {
        Device::Other
    };
    (class, device)
}

impl Device {
    pub const ALL: [Device; 4] = [
        Device::Desktop,
        Device::Mobile,
        Device::Tablet,
        Device::Other,
    ];

    /// Classifies a `User-Agent` (case-insensitive substring rules, tablets before phones).
    pub fn of(user_agent: Option<&str>) -> Device {
        classify(user_agent).1
    }

    pub fn name(self) -> &'static str {
        match self {
            Device::Desktop => "desktop",
            Device::Mobile => "mobile",
            Device::Tablet => "tablet",
            Device::Other => "other",
        }
    }
}

/// One redirect. `id` is unique per click and is what the counter deduplicates on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClickEvent {
    pub schema: u16,
    pub id: Uuid,
    /// The link's key ([`LinkKey`]); `slug` on the wire.
    #[serde(rename = "slug")]
    pub key: LinkKey,
    pub at_ms: i64,
    pub tier: Tier,
    pub referrer: Option<String>,
    pub user_agent: Option<String>,
    /// [`AgentClass::of`] the user agent, decided where the click happened.
    #[serde(default)]
    pub agent: AgentClass,
    /// Hex SHA-256 of a deployment salt and the client IP: countable, not reversible.
    pub ip_hash: String,
    /// [`Device::of`] the user agent, decided where the click happened.
    #[serde(default)]
    pub device: Device,
    /// ISO 3166-1 alpha-2 country of the client address, looked up where the click happened
    /// (the address itself is never stored); `None`: unknown (no or no matching database).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub country: Option<String>,
    /// The city's English name, from the same lookup.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub city: Option<String>,
}

/// A [`ClickEvent`] that borrows its strings: what a redirect writes into its spool record.
/// It serialises to the very JSON of the owned event (same fields, order, names and rules;
/// tested), so a tier builds the click from the request's headers and the link's key without
/// copying any of them into owned strings first (four allocations and frees per redirect,
/// issue 37).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct ClickRef<'a> {
    pub schema: u16,
    pub id: Uuid,
    #[serde(rename = "slug")]
    pub key: &'a str,
    pub at_ms: i64,
    pub tier: Tier,
    pub referrer: Option<&'a str>,
    pub user_agent: Option<&'a str>,
    pub agent: AgentClass,
    pub ip_hash: &'a str,
    pub device: Device,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub country: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub city: Option<&'a str>,
}

impl ClickEvent {
    /// This event as a [`ClickRef`] (same JSON).
    pub fn borrowed(&self) -> ClickRef<'_> {
        ClickRef {
            schema: self.schema,
            id: self.id,
            key: self.key.as_str(),
            at_ms: self.at_ms,
            tier: self.tier,
            referrer: self.referrer.as_deref(),
            user_agent: self.user_agent.as_deref(),
            agent: self.agent,
            ip_hash: &self.ip_hash,
            device: self.device,
            country: self.country.as_deref(),
            city: self.city.as_deref(),
        }
    }
}

impl ClickRef<'_> {
    /// The owned event (for sinks that keep clicks).
    pub fn to_event(&self) -> ClickEvent {
        ClickEvent {
            schema: self.schema,
            id: self.id,
            key: self.key.into(),
            at_ms: self.at_ms,
            tier: self.tier,
            referrer: self.referrer.map(str::to_owned),
            user_agent: self.user_agent.map(str::to_owned),
            agent: self.agent,
            ip_hash: self.ip_hash.to_owned(),
            device: self.device,
            country: self.country.map(str::to_owned),
            city: self.city.map(str::to_owned),
        }
    }

    /// Appends this event's JSON to `out`: the very bytes `serde_json` writes for it (and for
    /// the owned [`ClickEvent`]; the unit tests and a property test compare them), without
    /// serde's machinery. It runs on every redirect (the spool record's body), where
    /// `serde_json::to_writer` was 2 % of a pinned primary's CPU (perf, 2026-12-04).
    pub fn write_json(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(b"{\"schema\":");
        push_int(out, i64::from(self.schema));
        out.extend_from_slice(b",\"id\":\"");
        let mut id = Uuid::encode_buffer();
        out.extend_from_slice(self.id.hyphenated().encode_lower(&mut id).as_bytes());
        out.extend_from_slice(b"\",\"slug\":");
        push_str(out, self.key);
        out.extend_from_slice(b",\"at_ms\":");
        push_int(out, self.at_ms);
        out.extend_from_slice(b",\"tier\":\"");
        out.extend_from_slice(self.tier.name().as_bytes());
        out.extend_from_slice(b"\",\"referrer\":");
        push_opt(out, self.referrer);
        out.extend_from_slice(b",\"user_agent\":");
        push_opt(out, self.user_agent);
        out.extend_from_slice(b",\"agent\":\"");
        out.extend_from_slice(self.agent.name().as_bytes());
        out.extend_from_slice(b"\",\"ip_hash\":");
        push_str(out, self.ip_hash);
        out.extend_from_slice(b",\"device\":\"");
        out.extend_from_slice(self.device.name().as_bytes());
        out.push(b'"');
        if let Some(c) = self.country {
            out.extend_from_slice(b",\"country\":");
            push_str(out, c);
        }
        if let Some(c) = self.city {
            out.extend_from_slice(b",\"city\":");
            push_str(out, c);
        }
        out.push(b'}');
    }
}

fn push_opt(out: &mut Vec<u8>, v: Option<&str>) {
    match v {
        Some(v) => push_str(out, v),
        None => out.extend_from_slice(b"null"),
    }
}

/// How `serde_json` writes each byte inside a string: 0 as is, `u` as `\u00xx` (lowercase
/// hex), anything else as that short escape after a backslash.
static ESCAPE: [u8; 256] = {
    let mut t = [0u8; 256];
    let mut i = 0;
    while i < 0x20 {
        t[i] = b'u';
        i += 1;
    }
    t[0x08] = b'b';
    t[0x09] = b't';
    t[0x0a] = b'n';
    t[0x0c] = b'f';
    t[0x0d] = b'r';
    t[b'"' as usize] = b'"';
    t[b'\\' as usize] = b'\\';
    t
};

/// A JSON string as `serde_json` writes one: `"` and `\` escaped, the control characters
/// U+0000-U+001F as `\b \t \n \f \r` or `\u00xx` (lowercase hex), everything else as is.
fn push_str(out: &mut Vec<u8>, v: &str) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    out.push(b'"');
    let bytes = v.as_bytes();
    let mut start = 0;
    for (i, &b) in bytes.iter().enumerate() {
        let e = ESCAPE[usize::from(b)];
        if e == 0 {
            continue;
        }
        out.extend_from_slice(&bytes[start..i]);
        if e == b'u' {
            out.extend_from_slice(&[
                b'\\',
                b'u',
                b'0',
                b'0',
                HEX[usize::from(b >> 4)],
                HEX[usize::from(b & 0xf)],
            ]);
        } else {
            out.extend_from_slice(&[b'\\', e]);
        }
        start = i + 1;
    }
    out.extend_from_slice(&bytes[start..]);
    out.push(b'"');
}

/// A decimal integer, without `core::fmt`.
fn push_int(out: &mut Vec<u8>, v: i64) {
    let mut buf = [0u8; 20];
    let mut n = v.unsigned_abs();
    let mut at = buf.len();
    loop {
        at -= 1;
        buf[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    if v < 0 {
        out.push(b'-');
    }
    out.extend_from_slice(&buf[at..]);
}

/// A string of a [`ClickLine`]: borrowed from the line when the JSON holds it as is (no
/// escapes, the common case), else unescaped into a copy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Text<'a>(pub Cow<'a, str>);

impl std::ops::Deref for Text<'_> {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for Text<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = Text<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E: serde::de::Error>(self, v: &'de str) -> Result<Text<'de>, E> {
                Ok(Text(Cow::Borrowed(v)))
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Text<'de>, E> {
                Ok(Text(Cow::Owned(v.to_owned())))
            }
            fn visit_string<E: serde::de::Error>(self, v: String) -> Result<Text<'de>, E> {
                Ok(Text(Cow::Owned(v)))
            }
        }
        d.deserialize_str(V)
    }
}

/// A [`ClickEvent`] as the click counter reads it from a `clicks` line: the same fields,
/// names, types and defaults, so a line one refuses the other refuses and what both read is
/// equal (a property test), but its strings borrow from the line ([`Text`]): reading one
/// allocates nothing unless a string holds an escape, where the owned event allocates up to
/// six strings (the user agent and the address hash among them, which counting never reads).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct ClickLine<'a> {
    pub schema: u16,
    pub id: Uuid,
    #[serde(rename = "slug", borrow)]
    pub key: Text<'a>,
    pub at_ms: i64,
    pub tier: Tier,
    #[serde(borrow)]
    pub referrer: Option<Text<'a>>,
    #[serde(borrow)]
    pub user_agent: Option<Text<'a>>,
    #[serde(default)]
    pub agent: AgentClass,
    #[serde(borrow)]
    pub ip_hash: Text<'a>,
    #[serde(default)]
    pub device: Device,
    #[serde(default, borrow)]
    pub country: Option<Text<'a>>,
    #[serde(default, borrow)]
    pub city: Option<Text<'a>>,
}

impl ClickLine<'_> {
    /// This line as a [`ClickRef`] (the same event).
    pub fn borrowed(&self) -> ClickRef<'_> {
        ClickRef {
            schema: self.schema,
            id: self.id,
            key: &self.key,
            at_ms: self.at_ms,
            tier: self.tier,
            referrer: self.referrer.as_deref(),
            user_agent: self.user_agent.as_deref(),
            agent: self.agent,
            ip_hash: &self.ip_hash,
            device: self.device,
            country: self.country.as_deref(),
            city: self.city.as_deref(),
        }
    }
}

/// The click events of one `clicks` message: its lines (separated by `\n`), blank ones skipped.
/// JSON escapes every control character inside strings, so an event never spans two lines.
pub fn click_lines(payload: &[u8]) -> impl Iterator<Item = &[u8]> {
    payload
        .split(|b| *b == b'\n')
        .filter(|line| !line.iter().all(u8::is_ascii_whitespace))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn devices_from_user_agents() {
        let cases = [
            (
                "Mozilla/5.0 (iPhone; CPU iPhone OS 17_0 like Mac OS X) Mobile/15E148",
                Device::Mobile,
            ),
            (
                "Mozilla/5.0 (Linux; Android 14; Pixel 8) Chrome/120 Mobile Safari/537.36",
                Device::Mobile,
            ),
            (
                "Mozilla/5.0 (Linux; Android 13; SM-X700) Chrome/120 Safari/537.36",
                Device::Tablet,
            ),
            (
                "Mozilla/5.0 (iPad; CPU OS 17_0 like Mac OS X)",
                Device::Tablet,
            ),
            (
                "Mozilla/5.0 (Windows NT 10.0; Win64; x64) Chrome/120",
                Device::Desktop,
            ),
            (
                "Mozilla/5.0 (Macintosh; Intel Mac OS X 14_0) Safari/605",
                Device::Desktop,
            ),
            (
                "Mozilla/5.0 (X11; Linux x86_64; rv:120.0) Firefox/120.0",
                Device::Desktop,
            ),
            ("curl/8.5.0", Device::Other),
            (
                "Mozilla/5.0 (compatible; Googlebot/2.1; +http://www.google.com/bot.html)",
                Device::Other,
            ),
            ("", Device::Other),
        ];
        for (ua, want) in cases {
            assert_eq!(Device::of(Some(ua)), want, "{ua}");
        }
        assert_eq!(Device::of(None), Device::Other);
    }

    /// Every word the device rules below look for (the generator's, independent of
    /// [`DEVICE_MARKS`]).
    const DEVICE_WORDS: &[&str] = &[
        "android",
        "ipad",
        "tablet",
        "mobile",
        "mobi",
        "iphone",
        "ipod",
        "windows nt",
        "macintosh",
        "x11",
        "cros",
        "linux x86_64",
    ];

    /// The rules as they read before the one-pass classifier: lowercase, one search per
    /// pattern.
    fn by_substrings(user_agent: Option<&str>) -> (AgentClass, Device) {
        let Some(ua) = user_agent.map(str::to_ascii_lowercase) else {
            return (AgentClass::Bot, Device::Other);
        };
        let class = if PREVIEW_AGENTS.iter().any(|p| ua.contains(p)) {
            AgentClass::Preview
        } else if ua.trim().is_empty() || BOT_AGENTS.iter().any(|p| ua.contains(p)) {
            AgentClass::Bot
        } else {
            AgentClass::Browser
        };
        let android = ua.contains("android");
        let device = if ua.contains("ipad")
            || ua.contains("tablet")
            || (android && !ua.contains("mobile"))
        {
            Device::Tablet
        } else if ua.contains("mobi") || ua.contains("iphone") || ua.contains("ipod") || android {
            Device::Mobile
        } else if class != AgentClass::Browser {
            Device::Other
        } else if ["windows nt", "macintosh", "x11", "cros", "linux x86_64"]
            .iter()
            .any(|p| ua.contains(p))
        {
            Device::Desktop
        } else {
            Device::Other
        };
        (class, device)
    }

    proptest::proptest! {
        /// User agents made of the rules' own words (in any case, overlapping, between other
        /// text) classify as the substring rules do.
        #[test]
        fn one_pass_classification_is_the_substring_rules(
            parts in proptest::collection::vec(
                proptest::prop_oneof![
                    proptest::sample::select(
                        PREVIEW_AGENTS.iter().chain(BOT_AGENTS).map(|p| p.to_string())
                            .chain(DEVICE_WORDS.iter().map(|p| p.to_string()))
                            .collect::<Vec<_>>()
                    ),
                    "[ -~]{0,12}",
                    "\\PC{0,4}",
                ],
                0..8,
            ),
            upper in proptest::collection::vec(proptest::bool::ANY, 64),
        ) {
            let ua: String = parts
                .concat()
                .chars()
                .zip(upper.iter().cycle())
                .map(|(c, up)| if *up { c.to_ascii_uppercase() } else { c })
                .collect();
            proptest::prop_assert_eq!(classify(Some(&ua)), by_substrings(Some(&ua)), "{:?}", ua);
        }
    }

    #[test]
    fn one_pass_classification_of_real_agents() {
        for ua in [
            "Mozilla/5.0 (Linux; Android 14; Pixel 8) Chrome/120 Mobile Safari/537.36",
            "Mozilla/5.0 (Linux; Android 13; SM-X700) Chrome/120 Safari/537.36",
            "Mozilla/5.0 (iPhone; CPU iPhone OS 17_0 like Mac OS X) Mobile/15E148",
            "Mozilla/5.0 (X11; CrOS x86_64 14541.0.0) Chrome/120",
            "Mozilla/5.0 (CrOS aarch64 14541.0.0) Chrome/120",
            "Mozilla/5.0 (compatible; Googlebot/2.1; +http://www.google.com/bot.html)",
            "Mozilla/5.0 (Linux; Android 14) Mobile TelegramBot (like TwitterBot)",
            "   ",
            "",
        ] {
            assert_eq!(classify(Some(ua)), by_substrings(Some(ua)), "{ua}");
        }
        assert_eq!(classify(None), by_substrings(None));
    }

    #[test]
    fn click_events_without_the_newer_fields_still_decode() {
        let old = r#"{"schema":1,"id":"7b0e2f5c-1d0a-4d4e-9a55-1a2b3c4d5e6f","slug":"abc","at_ms":5,
            "tier":"primary","referrer":null,"user_agent":null,"ip_hash":"00"}"#;
        let ev: ClickEvent = serde_json::from_str(old).unwrap();
        assert_eq!(
            (ev.device, ev.country, ev.city),
            (Device::Other, None, None)
        );
    }

    #[test]
    fn a_borrowed_click_writes_the_owned_events_json() {
        let full = ClickEvent {
            schema: CLICK_EVENT_SCHEMA,
            id: Uuid::from_u128(0x7b0e2f5c_1d0a_4d4e_9a55_1a2b3c4d5e6f),
            key: "example.com/abc".into(),
            at_ms: 1_795_328_181_123,
            tier: Tier::Lastresort,
            referrer: Some("https://news.example/?q=\"x\"\n<b>".into()),
            user_agent: Some("Mozilla/5.0 (iPhone) Mobile \u{e9}".into()),
            agent: AgentClass::Browser,
            ip_hash: "ab".repeat(32),
            device: Device::Mobile,
            country: Some("DE".into()),
            city: Some("M\u{fc}nchen".into()),
        };
        let bare = ClickEvent {
            referrer: None,
            user_agent: None,
            country: None,
            city: None,
            tier: Tier::Primary,
            ..full.clone()
        };
        for ev in [full, bare] {
            let owned = serde_json::to_string(&ev).unwrap();
            assert_eq!(serde_json::to_string(&ev.borrowed()).unwrap(), owned);
            let mut written = Vec::new();
            ev.borrowed().write_json(&mut written);
            assert_eq!(String::from_utf8(written).unwrap(), owned);
            assert_eq!(ev.borrowed().to_event(), ev);
            let back: ClickEvent = serde_json::from_str(&owned).unwrap();
            assert_eq!(back, ev);
        }
    }

    #[test]
    fn link_event_json_is_stable() {
        let ev = LinkEvent {
            schema: LINK_EVENT_SCHEMA,
            kind: LinkEventKind::Disabled,
            key: "abc".into(),
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
    fn user_agents_are_classified_people_bots_and_previews_apart() {
        let firefox = "Mozilla/5.0 (X11; Linux x86_64; rv:128.0) Gecko/20100101 Firefox/128.0";
        assert_eq!(AgentClass::of(Some(firefox)), AgentClass::Browser);
        for ua in [
            "Slackbot-LinkExpanding 1.0 (+https://api.slack.com/robots)",
            "Twitterbot/1.0",
            "facebookexternalhit/1.1 (+http://www.facebook.com/externalhit_uatext.php)",
            "WhatsApp/2.23.20.0",
            "Mozilla/5.0 (compatible; Discordbot/2.0; +https://discordapp.com)",
        ] {
            assert_eq!(AgentClass::of(Some(ua)), AgentClass::Preview, "{ua}");
        }
        for ua in [
            "Mozilla/5.0 (compatible; Googlebot/2.1; +http://www.google.com/bot.html)",
            "curl/8.5.0",
            "python-requests/2.31",
            "",
        ] {
            assert_eq!(AgentClass::of(Some(ua)), AgentClass::Bot, "{ua}");
        }
        assert_eq!(AgentClass::of(None), AgentClass::Bot);
        // Events from before the field existed read as browser clicks.
        let old = r#"{"schema":1,"id":"0190b4a2-0000-7000-8000-000000000000","slug":"a","at_ms":1,"tier":"primary","referrer":null,"user_agent":null,"ip_hash":"x"}"#;
        assert_eq!(
            serde_json::from_str::<ClickEvent>(old).unwrap().agent,
            AgentClass::Browser
        );
    }

    #[test]
    fn a_clicks_message_is_one_event_per_line_and_one_event_alone_is_one_line() {
        let ev = |slug: &str| ClickEvent {
            schema: CLICK_EVENT_SCHEMA,
            id: Uuid::now_v7(),
            key: slug.into(),
            at_ms: 5,
            tier: Tier::Primary,
            referrer: Some("https://a.example/\n<script>".into()),
            user_agent: Some("line\r\nbreak".into()),
            agent: AgentClass::Browser,
            ip_hash: "00".into(),
            device: Device::Other,
            country: None,
            city: Some("K\u{f6}ln".into()),
        };
        let (a, b) = (ev("a"), ev("b"));
        let one = serde_json::to_vec(&a).unwrap();
        assert!(!one.contains(&b'\n'), "newlines inside strings are escaped");
        let lines: Vec<&[u8]> = click_lines(&one).collect();
        assert_eq!(lines, vec![one.as_slice()]);
        let mut two = one.clone();
        two.push(b'\n');
        two.extend_from_slice(&serde_json::to_vec(&b).unwrap());
        two.extend_from_slice(b"\n\n");
        let got: Vec<ClickEvent> = click_lines(&two)
            .map(|l| serde_json::from_slice(l).unwrap())
            .collect();
        assert_eq!(got, vec![a, b]);
        assert_eq!(click_lines(b"").count(), 0);
    }

    proptest::proptest! {
        /// The hand-written JSON of a click is serde_json's, byte for byte, whatever its
        /// strings hold (quotes, backslashes, every control character, any Unicode) and
        /// whatever its numbers, names and optional fields are.
        #[test]
        fn written_json_is_serde_jsons(
            id in proptest::num::u128::ANY,
            key in "\\PC{0,12}",
            at_ms in proptest::num::i64::ANY,
            schema in proptest::num::u16::ANY,
            tier in 0usize..3,
            referrer in proptest::option::of("[\\x00-\\x20\"\\\\a\\x7f\u{e9}\u{1f600}]{0,12}"),
            user_agent in proptest::option::of(".{0,24}"),
            agent in 0usize..3,
            ip_hash in "[0-9a-f\\x00\"]{0,8}",
            device in 0usize..4,
            country in proptest::option::of("\\PC{0,3}"),
            city in proptest::option::of("\\PC{0,8}"),
        ) {
            let ev = ClickRef {
                schema,
                id: Uuid::from_u128(id),
                key: &key,
                at_ms,
                tier: Tier::ALL[tier],
                referrer: referrer.as_deref(),
                user_agent: user_agent.as_deref(),
                agent: AgentClass::ALL[agent],
                ip_hash: &ip_hash,
                device: Device::ALL[device],
                country: country.as_deref(),
                city: city.as_deref(),
            };
            let mut written = Vec::new();
            ev.write_json(&mut written);
            proptest::prop_assert_eq!(
                String::from_utf8(written).unwrap(),
                serde_json::to_string(&ev).unwrap()
            );
        }
    }

    /// `json` with every `/` and non-ASCII character written as a JSON escape (both occur only
    /// inside strings): the same document, none of whose strings can be borrowed.
    fn escaped(json: &str) -> String {
        let mut out = String::new();
        for c in json.chars() {
            if c == '/' {
                out.push_str("\\/");
            } else if c.is_ascii() {
                out.push(c);
            } else {
                let mut units = [0u16; 2];
                for u in c.encode_utf16(&mut units) {
                    out.push_str(&format!("\\u{u:04x}"));
                }
            }
        }
        out
    }

    proptest::proptest! {
        /// The counter's borrowed reading of a line ([`ClickLine`]) refuses what the owned
        /// event's refuses and reads what it reads: over events with any strings, each
        /// written as serde_json does, with its strings escaped, with a field dropped, with a
        /// field of the wrong type, with a field unknown to both, repeated, or cut short.
        #[test]
        fn a_click_line_reads_as_the_owned_event(
            id in proptest::num::u128::ANY,
            key in "\\PC{0,12}",
            at_ms in proptest::num::i64::ANY,
            tier in 0usize..3,
            referrer in proptest::option::of("[\\x00-\\x20\"\\\\/a:\\x7f\u{e9}\u{1f600}]{0,16}"),
            user_agent in proptest::option::of(".{0,24}"),
            country in proptest::option::of("\\PC{0,3}"),
            city in proptest::option::of("\\PC{0,8}"),
            field in 0usize..12,
            how in 0usize..7,
            cut in proptest::num::usize::ANY,
        ) {
            let ev = ClickRef {
                schema: CLICK_EVENT_SCHEMA,
                id: Uuid::from_u128(id),
                key: &key,
                at_ms,
                tier: Tier::ALL[tier],
                referrer: referrer.as_deref(),
                user_agent: user_agent.as_deref(),
                agent: AgentClass::Browser,
                ip_hash: "00ff",
                device: Device::Mobile,
                country: country.as_deref(),
                city: city.as_deref(),
            };
            let mut doc = serde_json::to_value(ev).unwrap();
            let obj = doc.as_object_mut().unwrap();
            let names: Vec<String> = obj.keys().cloned().collect();
            let name = names[field % names.len()].clone();
            let mut json = match how {
                0 => serde_json::to_string(&doc).unwrap(),
                1 => escaped(&serde_json::to_string(&doc).unwrap()),
                2 => {
                    obj.remove(&name);
                    serde_json::to_string(&doc).unwrap()
                }
                3 => {
                    let wrong = [serde_json::json!(7), serde_json::json!("x"), serde_json::json!(null),
                        serde_json::json!(true), serde_json::json!([1])];
                    obj.insert(name, wrong[cut % wrong.len()].clone());
                    serde_json::to_string(&doc).unwrap()
                }
                4 => {
                    obj.insert("extra".into(), serde_json::json!({"a": [1, "b"]}));
                    serde_json::to_string(&doc).unwrap()
                }
                5 => {
                    let again = format!(",\"{name}\":{}}}", obj[&name]);
                    let text = serde_json::to_string(&doc).unwrap();
                    format!("{}{again}", &text[..text.len() - 1])
                }
                _ => serde_json::to_string(&doc).unwrap(),
            };
            if how == 6 {
                let mut at = cut % (json.len() + 1);
                while !json.is_char_boundary(at) {
                    at -= 1;
                }
                json.truncate(at);
            }
            let owned = serde_json::from_str::<ClickEvent>(&json);
            let line = serde_json::from_str::<ClickLine>(&json);
            // The fast reading returns serde's very answer or declines; the tiers' own form
            // (nothing to escape) it always reads.
            let fast = ClickLine::fast(json.as_bytes());
            if let Some(fast) = &fast {
                proptest::prop_assert_eq!(line.as_ref().ok(), Some(fast), "{}", json);
            }
            let plain = [Some(key.as_str()), referrer.as_deref(), user_agent.as_deref(),
                country.as_deref(), city.as_deref()]
                .iter()
                .flatten()
                .all(|s| !s.chars().any(|c| c == '"' || c == '\\' || c < ' '));
            if plain && at_ms >= 0 {
                let mut written = Vec::new();
                ev.write_json(&mut written);
                let fast = ClickLine::fast(&written).map(|l| l.borrowed().to_event());
                proptest::prop_assert_eq!(fast, Some(ev.to_event()));
            }
            match (owned, line) {
                (Ok(o), Ok(l)) => proptest::prop_assert_eq!(o, l.borrowed().to_event(), "{}", json),
                (Err(_), Err(_)) => {}
                (o, l) => proptest::prop_assert!(false, "{}: owned {:?}, line {:?}", json, o, l),
            }
        }
    }

    #[test]
    fn a_click_line_borrows_its_strings_unless_escaped() {
        let ev = ClickRef {
            schema: CLICK_EVENT_SCHEMA,
            id: Uuid::from_u128(7),
            key: "abc",
            at_ms: 1,
            tier: Tier::Primary,
            referrer: Some("https://x.example/a"),
            user_agent: Some("Mozilla/5.0"),
            agent: AgentClass::Browser,
            ip_hash: "00ff",
            device: Device::Desktop,
            country: Some("DE"),
            city: Some("Köln"),
        };
        let json = serde_json::to_string(&ev).unwrap();
        let line: ClickLine = serde_json::from_str(&json).unwrap();
        let borrowed = |t: &Text| matches!(t.0, Cow::Borrowed(_));
        assert!(borrowed(&line.key) && borrowed(&line.ip_hash));
        assert!(
            [&line.referrer, &line.user_agent, &line.country, &line.city]
                .iter()
                .all(|t| t.as_ref().is_some_and(borrowed))
        );
        let json = escaped(&json);
        let line: ClickLine = serde_json::from_str(&json).unwrap();
        assert!(
            !borrowed(line.referrer.as_ref().unwrap()) && !borrowed(line.city.as_ref().unwrap())
        );
        assert_eq!(line.borrowed().to_event(), ev.to_event());
    }

    #[test]
    fn tiers_serialise_as_documented() {
        assert_eq!(
            serde_json::to_string(&Tier::LastresortNginx).unwrap(),
            r#""lastresort-nginx""#
        );
    }
}
