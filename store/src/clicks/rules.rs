//! The counting rules: which count rows one click changes (per link, day and source), the
//! caps on distinct referrers and cities, the calendar (days, months, roll-ups, lateness) and
//! the blob a day's counts are stored as. Pure: no I/O.

use std::collections::BTreeMap;
use uuid::Uuid;
use zlink_wire::events::{AgentClass, ClickEvent, ClickRef, Device, Tier};

pub const DAY_MS: i64 = 86_400_000;
/// Distinct referrer hosts kept per link and day; the rest are counted under [`OTHER`].
pub const MAX_REFERRERS_PER_DAY: usize = 100;
/// Distinct cities kept per link and day (and source); the rest are counted under [`OTHER`].
pub const MAX_CITIES_PER_DAY: usize = 100;
pub const DIRECT: &str = "(direct)";
pub const OTHER: &str = "(other)";
pub const UNKNOWN: &str = "(unknown)";
pub(super) const COUNT: &str = "c";
pub(super) const REFERRER: &str = "r";
/// Country: key = ISO code or [`UNKNOWN`].
pub(super) const COUNTRY: &str = "g";
/// City: key = `<ISO code>/<city name>`, only for clicks whose city is known.
pub(super) const CITY: &str = "t";
/// In a month's roll-up only: key = the day (days since 1970-01-01), n = that day's total.
pub(super) const DAY: &str = "d";
/// Distinct referrers and cities kept in a month's roll-up each; the rest are summed under
/// [`OTHER`].
pub const MAX_KEYS_PER_MONTH: usize = 500;
/// A month is rolled up by the stats reader once its last day is this many days old.
pub const ROLLUP_AFTER_DAYS: i32 = 3;
/// The counter deletes the roll-up of the month of every click it counts whose day is this
/// many days old or more. Less than [`ROLLUP_AFTER_DAYS`]: every click of a month that may have
/// a roll-up is late, even with the counter's clock a day behind the reader's.
pub const LATE_DAYS: i32 = 2;
/// 2020-01-01: the counter takes no click older than this, so no stats read looks further back.
pub const FIRST_CLICK_DAY: i32 = 18_262;
/// [`FIRST_CLICK_DAY`] in milliseconds since 1970 (2020-01-01T00:00:00Z).
pub const FIRST_CLICK_MS: i64 = FIRST_CLICK_DAY as i64 * DAY_MS;
/// Partitions per day of `click_sums` (and per month of `click_index`): a batch of clicks costs
/// one write per (day, bucket) it touches however many links it has. Part of the schema: a
/// link's rows are found by [`bucket_of`] its slug, so changing it needs new tables.
pub const BUCKETS: i32 = 32;
/// The `cursors` row naming the last day that may have `click_totals` rows (written by the
/// migration that added `click_sums`: two days after it ran if `click_totals` had rows, else
/// -1).
pub const LEGACY_UNTIL: &str = "click_totals_until";

/// Groups per (day, bucket) of `click_groups`: a link's counts of a day share one row with the
/// other links of its group and source (about 16 of them at 100,000 links a day over 6
/// sources), because the store's cost follows requests and rows, not bytes (issue 37). Part of
/// the schema, as [`BUCKETS`].
pub const GROUPS: i32 = 32;
/// The `cursors` row naming the last day whose counts go to `click_sums` rather than
/// `click_groups` (written by the migration that added `click_groups`: two days after it ran
/// if `click_sums` had rows, so a counter from before it may still finish its day; else -1).
pub const SUMS_UNTIL: &str = "click_sums_until";

/// FNV-1a (32 bit) of the slug's bytes (stable across builds and platforms, unlike std's
/// hasher).
fn fnv1a(slug: &str) -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    for b in slug.bytes() {
        h ^= u32::from(b);
        h = h.wrapping_mul(0x0100_0193);
    }
    h
}

/// The bucket of a link's click rows: [`fnv1a`] of the slug mod [`BUCKETS`].
pub fn bucket_of(slug: &str) -> i32 {
    (fnv1a(slug) % BUCKETS as u32) as i32
}

/// A link's bucket ([`bucket_of`]) and the group of its counts within that bucket: the hash's
/// next bits, mod [`GROUPS`]. One hash for both.
pub fn bucket_and_group(slug: &str) -> (i32, i32) {
    let h = fnv1a(slug);
    (
        (h % BUCKETS as u32) as i32,
        ((h / BUCKETS as u32) % GROUPS as u32) as i32,
    )
}

/// A `click_groups.n` blob: per member, its slug (u16 big-endian length, UTF-8) and its counts
/// ([`DayCounts::encode`]'s blob, u32 big-endian length).
pub fn encode_group<'a>(members: impl IntoIterator<Item = (&'a str, Vec<u8>)>) -> Vec<u8> {
    let mut out = Vec::new();
    for (slug, counts) in members {
        let (Ok(len), Ok(n)) = (u16::try_from(slug.len()), u32::try_from(counts.len())) else {
            continue;
        };
        out.extend_from_slice(&len.to_be_bytes());
        out.extend_from_slice(slug.as_bytes());
        out.extend_from_slice(&n.to_be_bytes());
        out.extend_from_slice(&counts);
    }
    out
}

/// The members of a `click_groups.n` blob ([`encode_group`]): (slug, counts blob). Reading
/// stops at the first member that is cut short or whose slug is not UTF-8.
pub fn decode_group(mut b: &[u8]) -> Vec<(&str, &[u8])> {
    let mut out = Vec::new();
    while b.len() >= 2 {
        let len = usize::from(u16::from_be_bytes([b[0], b[1]]));
        let Some(slug) = b.get(2..2 + len).and_then(|s| std::str::from_utf8(s).ok()) else {
            break;
        };
        let Some(n) = b.get(2 + len..6 + len) else {
            break;
        };
        let n = u32::from_be_bytes([n[0], n[1], n[2], n[3]]) as usize;
        let Some(counts) = b.get(6 + len..6 + len + n) else {
            break;
        };
        out.push((slug, counts));
        b = &b[6 + len + n..];
    }
    out
}

/// A roll-up is written with a timestamp this far before its reads began, so that the
/// counter's delete of it wins also against a reader whose clock is ahead by up to this much.
pub const ROLLUP_CLOCK_MARGIN_US: i64 = 10_000_000;

/// Days since 1970-01-01 (UTC) of a time in milliseconds.
pub fn day_of(ms: i64) -> i32 {
    ms.div_euclid(DAY_MS)
        .clamp(i64::from(i32::MIN), i64::from(i32::MAX)) as i32
}

/// The referrer as counted: its host, lowercased, without a leading `www.`; [`DIRECT`] when
/// there is none, [`UNKNOWN`] when it is not an http(s) URL with a host.
pub fn referrer_host(referrer: Option<&str>) -> String {
    let mut host = String::new();
    push_referrer_host(referrer, &mut host);
    host
}

/// [`referrer_host`] appended to `out` (no allocation of its own on the fast path).
fn push_referrer_host(referrer: Option<&str>, out: &mut String) {
    let Some(r) = referrer.map(str::trim).filter(|r| !r.is_empty()) else {
        out.push_str(DIRECT);
        return;
    };
    if let Some(host) = plain_host(r) {
        let host = match host.get(..4) {
            Some(www) if www.eq_ignore_ascii_case("www.") => &host[4..],
            _ => host,
        };
        let at = out.len();
        out.push_str(host);
        out[at..].make_ascii_lowercase();
        return;
    }
    out.push_str(&host_by_url(r));
}

/// The referrer's host as `url` parses it (lowercased, without a leading `www.`), [`UNKNOWN`]
/// when it is not an http(s) URL with a host: the slow path of [`referrer_host`], and the
/// oracle its fast path is property-tested against.
pub(crate) fn host_by_url(r: &str) -> String {
    match url::Url::parse(r) {
        Ok(u) if matches!(u.scheme(), "http" | "https") => match u.host_str() {
            Some(h) if !h.is_empty() => {
                let h = h.to_ascii_lowercase();
                h.strip_prefix("www.").unwrap_or(&h).to_string()
            }
            _ => UNKNOWN.into(),
        },
        _ => UNKNOWN.into(),
    }
}

/// The host of `http://` or `https://` followed by a plain DNS name (ASCII letters, digits,
/// inner hyphens, dots between non-empty labels, its last label not a number), then the end,
/// `/`, `?` or `#`: the one form nearly every referrer has, whose host `url` would give
/// unchanged but for case. Anything else (a port, user info, percent signs, IP addresses,
/// IDNA, odd separators) is `None`, for `url` to judge. Property-tested against `url`.
fn plain_host(r: &str) -> Option<&str> {
    let rest = r
        .strip_prefix("https://")
        .or_else(|| r.strip_prefix("http://"))?;
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let host = &rest[..end];
    let labels = host.split('.');
    let mut last = "";
    for label in labels {
        let b = label.as_bytes();
        if b.is_empty()
            || b[0] == b'-'
            || b[b.len() - 1] == b'-'
            || !b.iter().all(|c| c.is_ascii_alphanumeric() || *c == b'-')
        {
            return None;
        }
        last = label;
    }
    // A last label of digits (or 0x...) makes the host an IPv4 address to `url`; IDNA labels
    // (xn--) may be rewritten or refused.
    let numeric = last.bytes().all(|c| c.is_ascii_digit())
        || last.get(..2).is_some_and(|p| p.eq_ignore_ascii_case("0x"));
    let idna = host
        .as_bytes()
        .windows(4)
        .any(|w| w.eq_ignore_ascii_case(b"xn--"));
    if numeric || host.len() > 253 || idna {
        return None;
    }
    Some(host)
}

/// Months since 1970-01 (UTC) of a day (days since 1970-01-01).
pub fn month_of_day(day: i32) -> i32 {
    use chrono::Datelike;
    let date = chrono::DateTime::from_timestamp(i64::from(day) * 86_400, 0)
        .map(|t| t.date_naive())
        .unwrap_or_default();
    (date.year() - 1970) * 12 + date.month0() as i32
}

/// The first day (days since 1970-01-01) of a month (months since 1970-01).
pub fn first_day_of_month(month: i32) -> i32 {
    let date = chrono::NaiveDate::from_ymd_opt(
        1970 + month.div_euclid(12),
        month.rem_euclid(12) as u32 + 1,
        1,
    )
    .unwrap_or_default();
    (date - chrono::DateTime::UNIX_EPOCH.date_naive()).num_days() as i32
}

/// Whether the stats reader may roll `month` up on `today`: its last day is
/// [`ROLLUP_AFTER_DAYS`] old.
pub fn month_closed(month: i32, today: i32) -> bool {
    first_day_of_month(month.saturating_add(1)) - 1 <= today - ROLLUP_AFTER_DAYS
}

/// Whether the counter, on `today`, deletes the roll-up of the month of a click of `day`.
pub fn is_late(day: i32, today: i32) -> bool {
    day <= today - LATE_DAYS
}

/// A month's roll-up: the count rows of its days summed, each day's total as a [`DAY`] row,
/// referrers and cities capped at [`MAX_KEYS_PER_MONTH`] each (the least clicked summed under
/// [`OTHER`]).
pub fn rollup<'a>(
    days: impl IntoIterator<Item = (i32, &'a BTreeMap<RowKey, i64>)>,
) -> BTreeMap<RowKey, i64> {
    let mut out: BTreeMap<RowKey, i64> = BTreeMap::new();
    for (day, rows) in days {
        for (key, n) in rows {
            *out.entry(key.clone()).or_insert(0) += n;
        }
        let total = rows
            .get(&(COUNT.to_string(), "total".to_string()))
            .copied()
            .unwrap_or(0);
        if total != 0 {
            *out.entry((DAY.to_string(), day.to_string())).or_insert(0) += total;
        }
    }
    for kind in [REFERRER, CITY] {
        let mut keys: Vec<(String, i64)> = out
            .iter()
            .filter(|((k, key), _)| k == kind && key != OTHER)
            .map(|((_, key), n)| (key.clone(), *n))
            .collect();
        if keys.len() <= MAX_KEYS_PER_MONTH {
            continue;
        }
        keys.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        for (key, n) in keys.split_off(MAX_KEYS_PER_MONTH) {
            out.remove(&(kind.to_string(), key));
            *out.entry((kind.to_string(), OTHER.to_string()))
                .or_insert(0) += n;
        }
    }
    out
}

/// What counting reads of one click: its id, link and time, and the names of the rows it
/// counts in, its referrer already reduced to the host ([`referrer_host`]). Made from a
/// borrowed event ([`Click::of`]: the counter's reading of a `clicks` line, or an owned
/// event's [`ClickEvent::borrowed`]); its strings share one buffer, so a click costs one
/// allocation, where the owned event costs up to six and counting it one more for the host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Click {
    pub id: Uuid,
    pub at_ms: i64,
    pub tier: Tier,
    pub agent: AgentClass,
    pub device: Device,
    /// The link's key, the referrer's host, the country, the city, one after the other.
    text: String,
    key_end: usize,
    host_end: usize,
    /// Where the country ends, if the click has one.
    country_end: Option<usize>,
    has_city: bool,
}

impl Click {
    /// The click of an event (its key unchecked: the caller judges it).
    pub fn of(e: &ClickRef) -> Click {
        let cap = e.key.len()
            + e.referrer.map_or(DIRECT.len(), str::len)
            + e.country.map_or(0, str::len)
            + e.city.map_or(0, str::len);
        let mut text = String::with_capacity(cap);
        text.push_str(e.key);
        let key_end = text.len();
        push_referrer_host(e.referrer, &mut text);
        let host_end = text.len();
        let country_end = e.country.map(|c| {
            text.push_str(c);
            text.len()
        });
        if let Some(city) = e.city {
            text.push_str(city);
        }
        Click {
            id: e.id,
            at_ms: e.at_ms,
            tier: e.tier,
            agent: e.agent,
            device: e.device,
            text,
            key_end,
            host_end,
            country_end,
            has_city: e.city.is_some(),
        }
    }

    /// The link's key (`slug` on the wire).
    pub fn key(&self) -> &str {
        &self.text[..self.key_end]
    }

    /// The referrer as counted: [`referrer_host`] of the event's.
    pub fn host(&self) -> &str {
        &self.text[self.key_end..self.host_end]
    }

    pub fn country(&self) -> Option<&str> {
        self.country_end.map(|end| &self.text[self.host_end..end])
    }

    pub fn city(&self) -> Option<&str> {
        let from = self.country_end.unwrap_or(self.host_end);
        self.has_city.then(|| &self.text[from..])
    }
}

impl From<&ClickEvent> for Click {
    fn from(e: &ClickEvent) -> Click {
        Click::of(&e.borrowed())
    }
}

/// The `click_sums.n` blob of `rows` ((kind, key, count), in row order; `n` of them): per row
/// `<kind>:<key>` (u16 big-endian length, UTF-8) and its count (i64 big-endian).
fn encode_rows<'a>(n: usize, rows: impl IntoIterator<Item = (&'a str, &'a str, i64)>) -> Vec<u8> {
    let mut out = Vec::with_capacity(n * 32);
    for (kind, key, count) in rows {
        let Ok(len) = u16::try_from(kind.len() + 1 + key.len()) else {
            continue;
        };
        out.extend_from_slice(&len.to_be_bytes());
        out.extend_from_slice(kind.as_bytes());
        out.push(b':');
        out.extend_from_slice(key.as_bytes());
        out.extend_from_slice(&count.to_be_bytes());
    }
    out
}

/// A count row one click counts in: its kind and its key's parts (joined).
type RowOf<'c> = (&'static str, [&'c str; 3]);

/// The rows one click counts in, the one statement of the counting rules ([`DayCounts`] and
/// [`Tally`] both count by it): the total, its tier, agent class and device, its referrer's
/// host, its country ([`UNKNOWN`] if none) and its city if known. A referrer or city the day
/// has no room for (`room(kind, key, cap)` false: the cap of distinct rows of its kind
/// reached) counts under [`OTHER`].
fn rows_of<'c>(
    ev: &'c Click,
    mut room: impl FnMut(&str, [&str; 3], usize) -> bool,
) -> std::iter::Chain<std::array::IntoIter<RowOf<'c>, 6>, std::option::IntoIter<RowOf<'c>>> {
    let host = ev.host();
    let referrer = if room(REFERRER, [host, "", ""], MAX_REFERRERS_PER_DAY) {
        host
    } else {
        OTHER
    };
    let country = ev.country().unwrap_or(UNKNOWN);
    let city = ev.city().map(|c| {
        let named = [country, "/", c];
        if room(CITY, named, MAX_CITIES_PER_DAY) {
            (CITY, named)
        } else {
            (CITY, [OTHER, "", ""])
        }
    });
    [
        (COUNT, ["total", "", ""]),
        (COUNT, ["tier:", ev.tier.name(), ""]),
        (COUNT, ["agent:", ev.agent.name(), ""]),
        (COUNT, ["device:", ev.device.name(), ""]),
        (REFERRER, [referrer, "", ""]),
        (COUNTRY, [country, "", ""]),
    ]
    .into_iter()
    .chain(city)
}

/// (kind, key) of a count row.
pub type RowKey = (String, String);
/// Count rows and their values.
pub type Cells = BTreeMap<RowKey, i64>;

/// The count rows of one (link, day) as one source counted them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DayCounts {
    pub rows: BTreeMap<RowKey, i64>,
}

/// A count row's name in `click_totals.n`: `<kind>:<key>` (the kind is one letter, so a key
/// with colons, e.g. an IPv6 referrer host, splits back unchanged).
pub fn cell_name((kind, key): &RowKey) -> String {
    format!("{kind}:{key}")
}

/// The row a `click_totals.n` name stands for; `None` for a name no rule writes.
pub fn parse_cell(name: &str) -> Option<RowKey> {
    let (kind, key) = name.split_once(':')?;
    matches!(kind, COUNT | REFERRER | COUNTRY | CITY | DAY)
        .then(|| (kind.to_string(), key.to_string()))
}

/// Writes the row key (`kind`, `key`'s parts joined) into `probe`, reusing its buffers.
fn fill(probe: &mut RowKey, kind: &str, key: [&str; 3]) {
    probe.0.clear();
    probe.0.push_str(kind);
    probe.1.clear();
    for part in key {
        probe.1.push_str(part);
    }
}

impl DayCounts {
    /// Counts `events` (none of them counted before) and returns every row that changed with
    /// its new value.
    pub fn add(&mut self, events: &[&ClickEvent]) -> BTreeMap<RowKey, i64> {
        let mut changed = BTreeMap::new();
        for ev in events {
            self.count_into(&Click::from(*ev), Some(&mut changed));
        }
        changed
    }

    /// Counts one event (not counted before): [`DayCounts::add`] without the list of changes,
    /// allocating only for rows it creates (the counter's hot path).
    pub fn count(&mut self, ev: &Click) {
        self.count_into(ev, None);
    }

    fn count_into(&mut self, ev: &Click, mut changed: Option<&mut BTreeMap<RowKey, i64>>) {
        // One probe key, reused: a row that exists costs a lookup, not an allocation.
        let mut probe = (String::with_capacity(1), String::with_capacity(64));
        let rows = rows_of(ev, |kind, key, cap| self.room(&mut probe, kind, key, cap));
        for (kind, key) in rows {
            fill(&mut probe, kind, key);
            let n = match self.rows.get_mut(&probe) {
                Some(n) => {
                    *n += 1;
                    *n
                }
                None => {
                    self.rows.insert(probe.clone(), 1);
                    1
                }
            };
            if let Some(changed) = changed.as_deref_mut() {
                changed.insert(probe.clone(), n);
            }
        }
    }

    /// Whether the row of `kind` named by `key`'s parts (joined) may be counted: it has a row
    /// already, or there is room for one more (fewer than `cap` of `kind` besides [`OTHER`]);
    /// else the click counts under [`OTHER`]. `probe` is scratch space.
    fn room(&self, probe: &mut RowKey, kind: &str, key: [&str; 3], cap: usize) -> bool {
        // Fewer rows in all than the cap: fewer of `kind` too, without a lookup or a scan (a
        // link's day with a few clicks, the common case).
        if self.rows.len() < cap {
            return true;
        }
        fill(probe, kind, key);
        if self.rows.contains_key(probe) {
            return true;
        }
        let first = (kind.to_string(), String::new());
        let distinct = self
            .rows
            .range(first..)
            .take_while(|((k, _), _)| k == kind)
            .filter(|((_, key), _)| key != OTHER)
            .count();
        distinct < cap
    }

    /// The counts as a `click_sums.n` blob: per row, `<kind>:<key>` (u16 big-endian length,
    /// UTF-8) and its count (i64 big-endian), in row order. One cell however many rows, so a
    /// write of it costs the store one cell, not one per row. (A name over 65,535 bytes, which
    /// no rule makes, is left out.)
    pub fn encode(&self) -> Vec<u8> {
        encode_rows(
            self.rows.len(),
            self.rows
                .iter()
                .map(|((kind, key), n)| (kind.as_str(), key.as_str(), *n)),
        )
    }

    /// The counts of a `click_sums.n` blob ([`DayCounts::encode`]); reading stops at the first
    /// record that is cut short or not UTF-8, and names no rule writes are skipped.
    pub fn decode(mut b: &[u8]) -> DayCounts {
        let mut out = DayCounts::default();
        while b.len() >= 2 {
            let len = usize::from(u16::from_be_bytes([b[0], b[1]]));
            let Some(rec) = b.get(2..2 + len + 8) else {
                break;
            };
            let Ok(name) = std::str::from_utf8(&rec[..len]) else {
                break;
            };
            let n = i64::from_be_bytes(rec[len..].try_into().expect("8 bytes"));
            if let Some(row) = parse_cell(name) {
                *out.rows.entry(row).or_insert(0) += n;
            }
            b = &b[2 + len + 8..];
        }
        out
    }

    /// Adds another set of counts of the same (link, day) (another table's rows).
    pub fn merge(&mut self, other: DayCounts) {
        for (key, n) in other.rows {
            *self.rows.entry(key).or_insert(0) += n;
        }
    }
}

/// A (link, day)'s count rows as the counter holds them while it counts: the rows
/// [`DayCounts`] would have for the same clicks (the same rules and caps, the same blob; a
/// property test holds the two together), laid out for the hot path. The row names (the kind's
/// letter, then the key) lie side by side in one buffer; each row is the hash of its name,
/// where the name lies, and its count, kept in hash order. A click finds each of its rows by a
/// binary search over the hashes and one compare of the name that matched, where the map
/// compared two heap strings at every step of its search (a fifth of the counter's CPU, issue
/// 37: the (link, day)s of a window do not stay in the cache). The hash is not keyed: names
/// that collide cost a scan of the equal hashes, which the caps bound (at most
/// [`MAX_REFERRERS_PER_DAY`] referrers and [`MAX_CITIES_PER_DAY`] cities a day).
#[derive(Debug, Clone, Default)]
pub struct Tally {
    names: String,
    rows: Vec<TallyRow>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct TallyRow {
    hash: u64,
    start: u32,
    len: u32,
    n: i64,
}

/// The hash of a row name, eight bytes at a time (FxHash's step).
fn name_hash(name: &[u8]) -> u64 {
    const K: u64 = 0xf135_7aea_2e62_a9c5;
    let mut h = name.len() as u64;
    let mut chunks = name.chunks_exact(8);
    for c in &mut chunks {
        let word = u64::from_le_bytes(c.try_into().expect("8 bytes"));
        h = (h.rotate_left(26) ^ word).wrapping_mul(K);
    }
    let rest = chunks.remainder();
    if !rest.is_empty() {
        let mut last = [0u8; 8];
        last[..rest.len()].copy_from_slice(rest);
        h = (h.rotate_left(26) ^ u64::from_le_bytes(last)).wrapping_mul(K);
    }
    h ^ (h >> 29)
}

impl Tally {
    /// The counts of a `click_sums.n` blob, as [`DayCounts::decode`] reads it.
    pub fn decode(blob: &[u8]) -> Tally {
        Tally::from(&DayCounts::decode(blob))
    }

    /// Counts one click (not counted before), by [`DayCounts::count`]'s rules.
    pub fn count(&mut self, ev: &Click) {
        // One name buffer, reused: a row that exists costs a search, not an allocation.
        let mut probe = String::with_capacity(64);
        let rows = rows_of(ev, |kind, key, cap| self.room(&mut probe, kind, key, cap));
        for (kind, key) in rows {
            fill_name(&mut probe, kind, key);
            self.add(&probe, 1);
        }
    }

    /// Where the row named `name` is (`Ok`), or where a row of its hash goes (`Err`).
    fn find(&self, name: &str, hash: u64) -> Result<usize, usize> {
        let mut at = self.rows.partition_point(|r| r.hash < hash);
        while let Some(r) = self.rows.get(at).filter(|r| r.hash == hash) {
            if self.name(r) == name {
                return Ok(at);
            }
            at += 1;
        }
        Err(at)
    }

    fn name(&self, r: &TallyRow) -> &str {
        &self.names[r.start as usize..(r.start + r.len) as usize]
    }

    /// Adds `n` to the row named `name`, making it if it is new.
    fn add(&mut self, name: &str, n: i64) {
        let hash = name_hash(name.as_bytes());
        match self.find(name, hash) {
            Ok(at) => self.rows[at].n += n,
            Err(at) => {
                let (Ok(start), Ok(len)) =
                    (u32::try_from(self.names.len()), u32::try_from(name.len()))
                else {
                    return; // 4 GiB of names: no rule makes one
                };
                self.names.push_str(name);
                self.rows.insert(
                    at,
                    TallyRow {
                        hash,
                        start,
                        len,
                        n,
                    },
                );
            }
        }
    }

    /// [`DayCounts`]'s rule: the row may be counted if it exists or there is room for one
    /// more of its kind (fewer than `cap` besides [`OTHER`]). `probe` is scratch space.
    fn room(&self, probe: &mut String, kind: &str, key: [&str; 3], cap: usize) -> bool {
        if self.rows.len() < cap {
            return true;
        }
        fill_name(probe, kind, key);
        if self.find(probe, name_hash(probe.as_bytes())).is_ok() {
            return true;
        }
        let distinct = self
            .rows
            .iter()
            .map(|r| self.name(r))
            .filter(|name| name.starts_with(kind) && &name[kind.len()..] != OTHER)
            .count();
        distinct < cap
    }

    /// The rows in the order of their names (the blob's and [`DayCounts`]' order), as (kind,
    /// key, count).
    fn sorted(&self) -> Vec<(&str, &str, i64)> {
        let mut rows: Vec<(&str, &str, i64)> = self
            .rows
            .iter()
            .map(|r| {
                let name = self.name(r);
                (&name[..1], &name[1..], r.n)
            })
            .collect();
        rows.sort_unstable();
        rows
    }

    /// The same blob as [`DayCounts::encode`] of the same rows.
    pub fn encode(&self) -> Vec<u8> {
        encode_rows(self.rows.len(), self.sorted())
    }

    /// The rows as [`DayCounts`].
    pub fn to_counts(&self) -> DayCounts {
        let rows = self
            .sorted()
            .into_iter()
            .map(|(kind, key, n)| ((kind.to_string(), key.to_string()), n))
            .collect();
        DayCounts { rows }
    }
}

impl From<&DayCounts> for Tally {
    fn from(d: &DayCounts) -> Tally {
        let mut t = Tally::default();
        let mut name = String::new();
        for ((kind, key), n) in &d.rows {
            // Every kind a rule writes is one letter; the name is the letter, then the key.
            fill_name(&mut name, kind, [key, "", ""]);
            t.add(&name, *n);
        }
        t
    }
}

/// Writes a row's name (its kind's letter, then `key`'s parts joined) into `name`.
fn fill_name(name: &mut String, kind: &str, key: [&str; 3]) {
    name.clear();
    name.push_str(kind);
    for part in key {
        name.push_str(part);
    }
}
