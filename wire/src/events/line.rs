//! Reading a `clicks` line the way the tiers write it, without serde's machinery.
//!
//! Every redirect tier writes its clicks with [`ClickRef::write_json`](super::ClickRef::write_json):
//! one field order, no whitespace, no escapes in the common case. [`ClickLine::read`] reads that
//! form directly and hands anything else (another order, whitespace, an escape, a number in an
//! unusual form, an unknown field, a line cut short) to `serde_json`, whose reading stays the
//! rule: the fast reading either returns exactly what serde returns or declines (a property test
//! in `events.rs` holds it to that over mangled lines). serde_json was the largest part of the
//! click counter's CPU after its counting got cheaper (19-23 % of its samples, issue 37).

use super::{AgentClass, ClickLine, Device, Text, Tier};
use std::borrow::Cow;
use uuid::Uuid;

impl<'a> ClickLine<'a> {
    /// One line of a `clicks` message: the tiers' own form read directly ([`ClickLine::fast`]),
    /// anything else by `serde_json` (the same result, or its error).
    pub fn read(line: &'a [u8]) -> Result<ClickLine<'a>, serde_json::Error> {
        match Self::fast(line) {
            Some(read) => Ok(read),
            None => serde_json::from_slice(line),
        }
    }

    /// The line if it is exactly in the tiers' form (fields in
    /// [`ClickRef::write_json`](super::ClickRef::write_json)'s order, no whitespace, strings
    /// without escapes, numbers as plain integers, known enum names, nothing after the
    /// object); `None` otherwise, including for every line serde would refuse.
    pub fn fast(line: &'a [u8]) -> Option<ClickLine<'a>> {
        let mut c = Cursor { b: line, at: 0 };
        c.lit(b"{\"schema\":")?;
        let schema = u16::try_from(c.int()?).ok()?;
        c.lit(b",\"id\":")?;
        let id = Uuid::try_parse(c.str()?).ok()?;
        c.lit(b",\"slug\":")?;
        let key = c.str()?;
        c.lit(b",\"at_ms\":")?;
        let at_ms = c.int()?;
        c.lit(b",\"tier\":")?;
        let tier = named(Tier::ALL, Tier::name, c.str()?)?;
        c.lit(b",\"referrer\":")?;
        let referrer = c.opt_str()?;
        c.lit(b",\"user_agent\":")?;
        let user_agent = c.opt_str()?;
        c.lit(b",\"agent\":")?;
        let agent = named(AgentClass::ALL, AgentClass::name, c.str()?)?;
        c.lit(b",\"ip_hash\":")?;
        let ip_hash = c.str()?;
        c.lit(b",\"device\":")?;
        let device = named(Device::ALL, Device::name, c.str()?)?;
        let country = if c.lit(b",\"country\":").is_some() {
            c.opt_str()?
        } else {
            None
        };
        let city = if c.lit(b",\"city\":").is_some() {
            c.opt_str()?
        } else {
            None
        };
        c.lit(b"}")?;
        if c.at != line.len() {
            return None;
        }
        let text = |s: &'a str| Text(Cow::Borrowed(s));
        Some(ClickLine {
            schema,
            id,
            key: text(key),
            at_ms,
            tier,
            referrer: referrer.map(text),
            user_agent: user_agent.map(text),
            agent,
            ip_hash: text(ip_hash),
            device,
            country: country.map(text),
            city: city.map(text),
        })
    }
}

/// The variant of `all` whose JSON name ([`Tier::name`] and its kin) is `s`.
fn named<T: Copy, const N: usize>(all: [T; N], name: fn(T) -> &'static str, s: &str) -> Option<T> {
    all.into_iter().find(|v| name(*v) == s)
}

/// A position in a line; every reading returns `None` (decline) on anything unexpected, never
/// panics, and moves only on success.
struct Cursor<'a> {
    b: &'a [u8],
    at: usize,
}

impl<'a> Cursor<'a> {
    fn lit(&mut self, want: &[u8]) -> Option<()> {
        let rest = self.b.get(self.at..)?;
        rest.starts_with(want).then(|| self.at += want.len())
    }

    /// A JSON string without escapes or control characters, valid UTF-8 (serde's rules for a
    /// string it can borrow; anything else is declined).
    fn str(&mut self) -> Option<&'a str> {
        let rest = self.b.get(self.at..)?;
        if rest.first() != Some(&b'"') {
            return None;
        }
        let len = plain_run(&rest[1..])?;
        if rest[1 + len] != b'"' {
            return None;
        }
        let s = std::str::from_utf8(&rest[1..1 + len]).ok()?;
        self.at += len + 2;
        Some(s)
    }

    /// `null` or a string.
    fn opt_str(&mut self) -> Option<Option<&'a str>> {
        if self.lit(b"null").is_some() {
            return Some(None);
        }
        self.str().map(Some)
    }

    /// A JSON integer as an `i64`: `0` or digits without a leading zero, followed by something
    /// that cannot continue a number. Declined: a negative number (serde reads `-0` as a float,
    /// so its rules decide those; no valid click has one), an overflow, a fraction or an
    /// exponent.
    fn int(&mut self) -> Option<i64> {
        let digits = self.b.get(self.at..)?;
        let len = digits.iter().take_while(|b| b.is_ascii_digit()).count();
        if len == 0 || (len > 1 && digits[0] == b'0') || len > 19 {
            return None;
        }
        if matches!(digits.get(len), Some(b'.' | b'e' | b'E')) {
            return None;
        }
        let mut v: i64 = 0;
        for &d in &digits[..len] {
            v = v.checked_mul(10)?.checked_add(i64::from(d - b'0'))?;
        }
        self.at += len;
        Some(v)
    }
}

/// Where the first `"`, `\\` or control character (U+0000-U+001F) of `s` is: where a JSON string
/// ends or needs unescaping. Eight bytes at a time (each test below is exact for "some byte of
/// the word is ..."; the word holding one is then searched byte by byte); `None` if there is none.
fn plain_run(s: &[u8]) -> Option<usize> {
    const ONES: u64 = u64::from_ne_bytes([1; 8]);
    const HIGH: u64 = ONES << 7;
    let zero_byte = |v: u64| v.wrapping_sub(ONES) & !v & HIGH;
    let mut at = 0;
    while let Some(chunk) = s.get(at..at + 8) {
        let w = u64::from_le_bytes(chunk.try_into().expect("8 bytes"));
        let below_space = w.wrapping_sub(ONES * 0x20) & !w & HIGH;
        if zero_byte(w ^ (ONES * u64::from(b'"')))
            | zero_byte(w ^ (ONES * u64::from(b'\\')))
            | below_space
            != 0
        {
            break;
        }
        at += 8;
    }
    Some(
        at + s[at..]
            .iter()
            .position(|&b| b == b'"' || b == b'\\' || b < 0x20)?,
    )
}

#[cfg(test)]
mod tests {
    use super::super::{ClickRef, CLICK_EVENT_SCHEMA};
    use super::*;

    fn event<'a>(referrer: Option<&'a str>, city: Option<&'a str>) -> ClickRef<'a> {
        ClickRef {
            schema: CLICK_EVENT_SCHEMA,
            id: Uuid::from_u128(0x0193_0000_0000_7000_8000_0000_0000_0001),
            key: "aB3dE",
            at_ms: 1_764_000_000_000,
            tier: Tier::Lastresort,
            referrer,
            user_agent: Some("Mozilla/5.0 (Windows NT 10.0)"),
            agent: AgentClass::Browser,
            ip_hash: "0f0f",
            device: Device::Desktop,
            country: Some("DE"),
            city,
        }
    }

    #[test]
    fn reads_what_the_tiers_write() {
        for ev in [
            event(Some("https://a.example/"), Some("Köln")),
            event(None, None),
            event(Some(""), None),
        ] {
            let mut line = Vec::new();
            ev.write_json(&mut line);
            let fast = ClickLine::fast(&line).expect("the tiers' own form");
            assert_eq!(fast.borrowed(), ev);
            assert_eq!(
                Ok(fast),
                serde_json::from_slice::<ClickLine>(&line).map_err(|_| ())
            );
        }
    }

    #[test]
    fn declines_other_forms_and_read_gives_serdes_answer() {
        let mut line = Vec::new();
        event(Some("https://a.example/"), None).write_json(&mut line);
        let text = String::from_utf8(line).unwrap();
        let cases = [
            // serde reads these the same; the fast reading declines them.
            text.replace(",\"id\"", ", \"id\""),
            text.replace("//a.example", "//\\u0061.example"),
            text.replace("1764000000000", "1764000000000.0"),
            text.replace("{\"schema\":1", "{\"schema\":1,\"extra\":[1]"),
            format!("{text} "),
            text.replace("\"at_ms\":", "\"at_ms\":-"),
            // serde refuses these; so must the fast reading.
            text.replace("{\"schema\":1", "{\"schema\":01"),
            text.replace("{\"schema\":1", "{\"schema\":70000"),
            text.replace("1764000000000", "99999999999999999999"),
            text.replace("\"lastresort\"", "\"Lastresort\""),
            text.replace("//a.example", "//a\u{1}.example"),
            text.replace("//a.example", "//a\u{1f}.example"),
            text.replace("//a.example", "//a\u{0}.example"),
            format!("{text}}}"),
            text[..text.len() - 1].to_string(),
        ];
        let mut bad_utf8 = text.clone().into_bytes();
        let at = text.find("a.example").unwrap();
        bad_utf8[at] = 0xff;
        assert!(ClickLine::fast(&bad_utf8).is_none());
        assert!(ClickLine::read(&bad_utf8).is_err());
        let null_country = text.replace("\"country\":\"DE\"", "\"country\":null");
        let serde = serde_json::from_slice::<ClickLine>(null_country.as_bytes()).ok();
        assert_eq!(ClickLine::fast(null_country.as_bytes()), serde);
        for case in cases {
            assert!(ClickLine::fast(case.as_bytes()).is_none(), "{case}");
            let serde = serde_json::from_slice::<ClickLine>(case.as_bytes()).map_err(|_| ());
            assert_eq!(
                ClickLine::read(case.as_bytes()).map_err(|_| ()),
                serde,
                "{case}"
            );
        }
    }

    #[test]
    fn a_plain_run_stops_where_a_byte_loop_does() {
        let stop = |s: &[u8]| s.iter().position(|&b| b == b'"' || b == b'\\' || b < 0x20);
        let mut s = vec![b'a'; 40];
        assert_eq!(plain_run(&s), None);
        for at in 0..s.len() {
            for b in 0..=255u8 {
                s[at] = b;
                assert_eq!(plain_run(&s), stop(&s), "{b} at {at}");
                assert_eq!(plain_run(&s[..at]), None);
            }
            s[at] = 0xc3;
        }
    }

    #[test]
    fn integers_at_their_edges() {
        for (text, want) in [
            ("0,", Some(0)),
            ("17}", Some(17)),
            ("9223372036854775807,", Some(i64::MAX)),
            ("9223372036854775808,", None),
            ("-0,", None),
            ("-1,", None),
            ("1e3,", None),
            ("00,", None),
        ] {
            let mut c = Cursor {
                b: text.as_bytes(),
                at: 0,
            };
            assert_eq!(c.int(), want, "{text}");
        }
    }
}
