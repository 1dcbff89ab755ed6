//! Click aggregates in ScyllaDB: the counting rules (which rows one click changes), the
//! counter's exactly-once writer ([`writer`]), and the read model behind the stats API and the
//! info page.
//!
//! Exactly once, in short (the argument in full: docs/design/data-flow.md, "Counting"): every click of a
//! link goes to one partition of the clicks topic (the source); one counter owns a source at a
//! time and counts its clicks in offset order. Per (link, day, source) it stores absolute counts
//! together with `upto`, the offset of the newest click they include, written with that offset
//! as the write timestamp; the ids of counted clicks go to a dedup index per (source, minute of
//! the click) before the counts that include them. A redelivered click (offset ≤ `upto`) was
//! counted; a copy of a click (same id, another offset) is found in the index; a zombie writer
//! can only write values that are right for their offset, and the furthest offset wins.

use crate::db::{self as store, Db, StoreError};
use scylla::response::query_result::QueryResult;
use scylla::statement::prepared::PreparedStatement;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use zlink_wire::events::{AgentClass, ClickEvent, Device, Tier};

pub mod writer;

pub const DAY_MS: i64 = 86_400_000;
/// Distinct referrer hosts kept per link and day; the rest are counted under [`OTHER`].
pub const MAX_REFERRERS_PER_DAY: usize = 100;
/// Distinct cities kept per link and day (and source); the rest are counted under [`OTHER`].
pub const MAX_CITIES_PER_DAY: usize = 100;
pub const DIRECT: &str = "(direct)";
pub const OTHER: &str = "(other)";
pub const UNKNOWN: &str = "(unknown)";
const COUNT: &str = "c";
const REFERRER: &str = "r";
/// Country: key = ISO code or [`UNKNOWN`].
const COUNTRY: &str = "g";
/// City: key = `<ISO code>/<city name>`, only for clicks whose city is known.
const CITY: &str = "t";
/// In a month's roll-up only: key = the day (days since 1970-01-01), n = that day's total.
const DAY: &str = "d";
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

/// The bucket of a link's click rows: FNV-1a (32 bit) of the slug's bytes mod [`BUCKETS`]
/// (stable across builds and platforms, unlike std's hasher).
pub fn bucket_of(slug: &str) -> i32 {
    let mut h: u32 = 0x811c_9dc5;
    for b in slug.bytes() {
        h ^= u32::from(b);
        h = h.wrapping_mul(0x0100_0193);
    }
    (h % BUCKETS as u32) as i32
}

/// A roll-up is written with a timestamp this far before its reads began, so that the
/// counter's delete of it wins also against a reader whose clock is ahead by up to this much.
pub const ROLLUP_CLOCK_MARGIN_US: i64 = 10_000_000;

/// Days since 1970-01-01 (UTC) of a time in milliseconds.
pub fn day_of(ms: i64) -> i32 {
    ms.div_euclid(DAY_MS)
        .clamp(i64::from(i32::MIN), i64::from(i32::MAX)) as i32
}

pub fn tier_name(t: Tier) -> &'static str {
    match t {
        Tier::Primary => "primary",
        Tier::Lastresort => "lastresort",
        Tier::LastresortNginx => "lastresort-nginx",
    }
}

pub fn agent_name(a: AgentClass) -> &'static str {
    match a {
        AgentClass::Browser => "browser",
        AgentClass::Bot => "bot",
        AgentClass::Preview => "preview",
    }
}

/// The referrer as counted: its host, lowercased, without a leading `www.`; [`DIRECT`] when
/// there is none, [`UNKNOWN`] when it is not an http(s) URL with a host.
pub fn referrer_host(referrer: Option<&str>) -> String {
    let Some(r) = referrer.map(str::trim).filter(|r| !r.is_empty()) else {
        return DIRECT.into();
    };
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

impl DayCounts {
    /// Counts `events` (none of them counted before) and returns every row that changed with
    /// its new value.
    pub fn add(&mut self, events: &[&ClickEvent]) -> BTreeMap<RowKey, i64> {
        let mut changed = BTreeMap::new();
        for ev in events {
            self.count_into(ev, Some(&mut changed));
        }
        changed
    }

    /// Counts one event (not counted before): [`DayCounts::add`] without the list of changes,
    /// allocating only for rows it creates (the counter's hot path).
    pub fn count(&mut self, ev: &ClickEvent) {
        self.count_into(ev, None);
    }

    fn count_into(&mut self, ev: &ClickEvent, mut changed: Option<&mut BTreeMap<RowKey, i64>>) {
        let referrer = referrer_host(ev.referrer.as_deref());
        let referrer = self.capped(REFERRER, &referrer, MAX_REFERRERS_PER_DAY);
        let country = ev.country.as_deref().unwrap_or(UNKNOWN);
        let city = ev.city.as_ref().map(|c| format!("{country}/{c}"));
        let city = city
            .as_deref()
            .map(|c| self.capped(CITY, c, MAX_CITIES_PER_DAY));
        let rows = [
            (COUNT, "total", ""),
            (COUNT, "tier:", tier_name(ev.tier)),
            (COUNT, "agent:", agent_name(ev.agent)),
            (COUNT, "device:", ev.device.name()),
            (REFERRER, referrer, ""),
            (COUNTRY, country, ""),
        ];
        let city = city.map(|c| (CITY, c, ""));
        // One probe key, reused: a row that exists costs a lookup, not an allocation.
        let mut probe = (String::with_capacity(1), String::with_capacity(64));
        for (kind, a, b) in rows.into_iter().chain(city) {
            probe.0.clear();
            probe.0.push_str(kind);
            probe.1.clear();
            probe.1.push_str(a);
            probe.1.push_str(b);
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

    /// `key` if it has a row of `kind` already or there is room for one more (fewer than
    /// `cap` of `kind` besides [`OTHER`]), else [`OTHER`].
    fn capped<'a>(&self, kind: &str, key: &'a str, cap: usize) -> &'a str {
        if self.rows.contains_key(&(kind.to_string(), key.to_string())) {
            return key;
        }
        let distinct = self
            .rows
            .keys()
            .filter(|(k, key)| k == kind && key != OTHER)
            .count();
        if distinct < cap {
            key
        } else {
            OTHER
        }
    }

    /// The counts as a `click_sums.n` blob: per row, `<kind>:<key>` (u16 big-endian length,
    /// UTF-8) and its count (i64 big-endian), in row order. One cell however many rows, so a
    /// write of it costs the store one cell, not one per row. (A name over 65,535 bytes, which
    /// no rule makes, is left out.)
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.rows.len() * 32);
        for ((kind, key), n) in &self.rows {
            let Ok(len) = u16::try_from(kind.len() + 1 + key.len()) else {
                continue;
            };
            out.extend_from_slice(&len.to_be_bytes());
            out.extend_from_slice(kind.as_bytes());
            out.push(b':');
            out.extend_from_slice(key.as_bytes());
            out.extend_from_slice(&n.to_be_bytes());
        }
        out
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

/// Everything known about one link's clicks, summed over the days read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LinkStats {
    pub total: i64,
    pub by_tier: BTreeMap<String, i64>,
    pub by_agent: BTreeMap<String, i64>,
    pub per_day: BTreeMap<i32, i64>,
    pub referrers: BTreeMap<String, i64>,
    pub by_device: BTreeMap<String, i64>,
    /// ISO code (or `(unknown)`) → clicks.
    pub countries: BTreeMap<String, i64>,
    /// `<ISO code>/<city>` (or `(other)` past the daily cap) → clicks; clicks without a known
    /// city are not here.
    pub cities: BTreeMap<String, i64>,
}

impl LinkStats {
    /// Adds the count rows of one day.
    pub fn merge_day(&mut self, day: i32, rows: &BTreeMap<RowKey, i64>) {
        self.merge(Some(day), rows);
    }

    /// Adds a month's [`rollup`].
    pub fn merge_rollup(&mut self, rows: &BTreeMap<RowKey, i64>) {
        self.merge(None, rows);
    }

    fn merge(&mut self, day: Option<i32>, rows: &BTreeMap<RowKey, i64>) {
        for ((kind, key), n) in rows {
            match (kind.as_str(), key.as_str()) {
                (COUNT, "total") => {
                    self.total += n;
                    if let Some(day) = day {
                        *self.per_day.entry(day).or_insert(0) += n;
                    }
                }
                (DAY, d) if day.is_none() => {
                    if let Ok(d) = d.parse::<i32>() {
                        *self.per_day.entry(d).or_insert(0) += n;
                    }
                }
                (COUNT, k) => {
                    if let Some(t) = k.strip_prefix("tier:") {
                        *self.by_tier.entry(t.to_string()).or_insert(0) += n;
                    } else if let Some(a) = k.strip_prefix("agent:") {
                        *self.by_agent.entry(a.to_string()).or_insert(0) += n;
                    } else if let Some(d) = k.strip_prefix("device:") {
                        *self.by_device.entry(d.to_string()).or_insert(0) += n;
                    }
                }
                (REFERRER, host) => *self.referrers.entry(host.to_string()).or_insert(0) += n,
                (COUNTRY, cc) => *self.countries.entry(cc.to_string()).or_insert(0) += n,
                (CITY, city) => *self.cities.entry(city.to_string()).or_insert(0) += n,
                _ => {}
            }
        }
    }

    /// Clicks by browsers, i.e. people.
    pub fn humans(&self) -> i64 {
        self.by_agent.get("browser").copied().unwrap_or(0)
    }

    /// Clicks by bots and link-preview crawlers.
    pub fn bots(&self) -> i64 {
        self.total - self.humans()
    }

    /// The `n` referrers with the most clicks (ties by name).
    pub fn top_referrers(&self, n: usize) -> Vec<(&str, i64)> {
        top(&self.referrers, n)
    }

    /// The stats API's body: totals, the `days` days up to `today` (zeros included), per tier,
    /// humans vs bots, top referrers.
    pub fn to_json(&self, slug: &str, today: i32, days: i32) -> serde_json::Value {
        let date = |d: i32| {
            chrono::DateTime::from_timestamp_millis(i64::from(d) * DAY_MS)
                .map(|t| t.format("%Y-%m-%d").to_string())
                .unwrap_or_default()
        };
        let recent: Vec<serde_json::Value> = (today - days + 1..=today)
            .map(|d| {
                serde_json::json!({
                    "date": date(d),
                    "clicks": self.per_day.get(&d).copied().unwrap_or(0),
                })
            })
            .collect();
        let tiers: BTreeMap<&str, i64> = [Tier::Primary, Tier::Lastresort, Tier::LastresortNginx]
            .into_iter()
            .map(|t| {
                let name = tier_name(t);
                (name, self.by_tier.get(name).copied().unwrap_or(0))
            })
            .collect();
        let agents: BTreeMap<&str, i64> =
            [AgentClass::Browser, AgentClass::Bot, AgentClass::Preview]
                .into_iter()
                .map(|a| {
                    let name = agent_name(a);
                    (name, self.by_agent.get(name).copied().unwrap_or(0))
                })
                .collect();
        let referrers: Vec<serde_json::Value> = self
            .top_referrers(10)
            .into_iter()
            .map(|(r, n)| serde_json::json!({"referrer": r, "clicks": n}))
            .collect();
        let devices: BTreeMap<&str, i64> = [
            Device::Desktop,
            Device::Mobile,
            Device::Tablet,
            Device::Other,
        ]
        .into_iter()
        .map(|d| (d.name(), self.by_device.get(d.name()).copied().unwrap_or(0)))
        .collect();
        let countries: Vec<serde_json::Value> = top(&self.countries, 10)
            .into_iter()
            .map(|(c, n)| serde_json::json!({"country": c, "clicks": n}))
            .collect();
        let cities: Vec<serde_json::Value> = top(&self.cities, 10)
            .into_iter()
            .map(|(key, n)| match key.split_once('/') {
                Some((country, city)) => {
                    serde_json::json!({"country": country, "city": city, "clicks": n})
                }
                None => serde_json::json!({"country": null, "city": key, "clicks": n}),
            })
            .collect();
        serde_json::json!({
            "slug": slug,
            "total": self.total,
            "humans": self.humans(),
            "bots": self.bots(),
            "by_agent": agents,
            "by_tier": tiers,
            "last_days": recent,
            "top_referrers": referrers,
            "by_device": devices,
            "top_countries": countries,
            "top_cities": cities,
        })
    }
}

/// The `n` keys with the most clicks (ties by name).
fn top(counts: &BTreeMap<String, i64>, n: usize) -> Vec<(&str, i64)> {
    let mut v: Vec<(&str, i64)> = counts.iter().map(|(k, n)| (k.as_str(), *n)).collect();
    v.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    v.truncate(n);
    v
}

/// What counting one batch of a source did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counted {
    /// Events counted now.
    pub counted: u64,
    /// Copies of events already counted (same id, another offset): ignored.
    pub duplicates: u64,
    /// Events delivered again at an offset already counted (a predecessor counted them and
    /// did not commit): ignored.
    pub redelivered: u64,
}

pub struct ClickStore {
    db: Arc<Db>,
    read_legacy_day: PreparedStatement,
    read_day: PreparedStatement,
    read_legacy_upto: PreparedStatement,
    read_sums_day: PreparedStatement,
    read_sums: PreparedStatement,
    write_sum: PreparedStatement,
    read_seen: PreparedStatement,
    write_seen: PreparedStatement,
    add_index: PreparedStatement,
    list_index: PreparedStatement,
    list_days: PreparedStatement,
    read_months: PreparedStatement,
    write_month: PreparedStatement,
    drop_month: PreparedStatement,
    /// The last day that may have `click_totals` rows (see [`LEGACY_UNTIL`]).
    legacy_until: i32,
    /// How far before its reads a roll-up is timestamped ([`ROLLUP_CLOCK_MARGIN_US`]).
    rollup_margin_us: i64,
}

/// What one stats read cost, and what it left for the next.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StatsReads {
    /// (link, day) partitions read.
    pub days: usize,
    /// Month roll-ups used instead of their days.
    pub rollups_used: usize,
    /// Month roll-ups written by this read.
    pub rollups_written: usize,
}

/// Adds the `n` maps of `res` (rows of one column, `n`) to `out`.
fn add_cells(out: &mut DayCounts, res: QueryResult) -> Result<(), StoreError> {
    for (cells,) in store::all::<(Option<HashMap<String, i64>>,)>(res)? {
        for (name, n) in cells.unwrap_or_default() {
            if let Some(row) = parse_cell(&name) {
                *out.rows.entry(row).or_insert(0) += n;
            }
        }
    }
    Ok(())
}

/// Microseconds since 1970 by this machine's clock: the timestamps of roll-ups and of their
/// deletes.
pub fn now_us() -> i64 {
    chrono::Utc::now().timestamp_micros()
}

impl ClickStore {
    pub async fn prepare(db: Arc<Db>) -> Result<Self, StoreError> {
        let session = db.session();
        let prep = |q: &'static str, idempotent: bool| async move {
            let mut p = session.prepare(q).await.map_err(store::unavailable)?;
            p.set_is_idempotent(idempotent);
            Ok::<_, StoreError>(p)
        };
        let mut read_seen = prep(
            "SELECT ids FROM click_seen WHERE src = ? AND minute = ?",
            true,
        )
        .await?;
        // Rows of up to 64 KiB: pages of 2 MiB at most.
        read_seen.set_page_size(32);
        let legacy_until = session
            .query_unpaged(
                "SELECT position FROM cursors WHERE name = ?",
                (LEGACY_UNTIL,),
            )
            .await
            .map_err(store::unavailable)?;
        // No marker: a store not migrated since click_sums came; any day may have old rows.
        let legacy_until = store::first::<(Option<i64>,)>(legacy_until)?
            .and_then(|(p,)| p)
            .map_or(i32::MAX, |p| p.clamp(-1, i64::from(i32::MAX)) as i32);
        Ok(ClickStore {
            read_legacy_day: prep(
                "SELECT kind, key, n FROM click_counts \
                 WHERE slug = ? AND day = ? AND kind IN ('c', 'r')",
                true,
            )
            .await?,
            read_day: prep(
                "SELECT n FROM click_totals WHERE slug = ? AND day = ?",
                true,
            )
            .await?,
            read_legacy_upto: prep(
                "SELECT slug, upto FROM click_totals WHERE slug IN ? AND day = ? AND src = ?",
                true,
            )
            .await?,
            read_sums_day: prep(
                "SELECT n FROM click_sums WHERE day = ? AND bucket = ? AND slug = ?",
                true,
            )
            .await?,
            read_sums: prep(
                "SELECT slug, upto, n FROM click_sums \
                 WHERE day = ? AND bucket = ? AND slug IN ? AND src = ?",
                true,
            )
            .await?,
            // Absolute values at a fixed timestamp: retrying it is harmless.
            write_sum: prep(
                "UPDATE click_sums USING TIMESTAMP ? SET upto = ?, n = ? \
                 WHERE day = ? AND bucket = ? AND slug = ? AND src = ?",
                true,
            )
            .await?,
            read_seen,
            write_seen: prep(
                "INSERT INTO click_seen (src, minute, upto, writer, ids) VALUES (?, ?, ?, ?, ?) \
                 USING TTL ?",
                true,
            )
            .await?,
            add_index: prep(
                "INSERT INTO click_index (month, bucket, slug, day) VALUES (?, ?, ?, ?)",
                true,
            )
            .await?,
            list_index: prep(
                "SELECT day FROM click_index WHERE month = ? AND bucket = ? AND slug = ?",
                true,
            )
            .await?,
            list_days: prep("SELECT day FROM click_days WHERE slug = ?", true).await?,
            read_months: prep("SELECT month, n FROM click_months WHERE slug = ?", true).await?,
            write_month: prep(
                "INSERT INTO click_months (slug, month, n) VALUES (?, ?, ?) USING TIMESTAMP ?",
                true,
            )
            .await?,
            drop_month: prep(
                "DELETE FROM click_months USING TIMESTAMP ? WHERE slug = ? AND month = ?",
                true,
            )
            .await?,
            legacy_until,
            rollup_margin_us: ROLLUP_CLOCK_MARGIN_US,
            db,
        })
    }

    /// Another clock margin for roll-ups. A roll-up written within the margin after a delete
    /// of it is hidden by that delete (and rebuilt by a later read): tests that read right
    /// after counting late clicks use 0, which is safe on one clock.
    pub fn with_rollup_clock_margin_us(mut self, us: i64) -> Self {
        self.rollup_margin_us = us;
        self
    }

    /// The count rows of one (link, day) in the tables before `click_sums`: `click_totals`
    /// (every source's row) and `click_counts`.
    async fn legacy_day_counts(&self, slug: &str, day: i32) -> Result<DayCounts, StoreError> {
        let session = self.db.session();
        let (legacy, current) = tokio::join!(
            session.execute_unpaged(&self.read_legacy_day, (slug, day)),
            session.execute_unpaged(&self.read_day, (slug, day)),
        );
        let mut out = DayCounts::default();
        for (kind, key, n) in
            store::all::<(String, String, Option<i64>)>(legacy.map_err(store::unavailable)?)?
        {
            *out.rows.entry((kind, key)).or_insert(0) += n.unwrap_or(0);
        }
        add_cells(&mut out, current.map_err(store::unavailable)?)?;
        Ok(out)
    }

    /// The count rows of one (link, day) in `click_sums`: every source's row.
    async fn sums_day(&self, slug: &str, day: i32) -> Result<DayCounts, StoreError> {
        let res = self
            .db
            .session()
            .execute_unpaged(&self.read_sums_day, (day, bucket_of(slug), slug))
            .await
            .map_err(store::unavailable)?;
        let mut out = DayCounts::default();
        for (blob,) in store::all::<(Option<Vec<u8>>,)>(res)? {
            out.merge(DayCounts::decode(&blob.unwrap_or_default()));
        }
        Ok(out)
    }

    /// The days of `month` on which `slug` has `click_sums` rows.
    async fn index_days(&self, slug: &str, month: i32) -> Result<Vec<i32>, StoreError> {
        let res = self
            .db
            .session()
            .execute_unpaged(&self.list_index, (month, bucket_of(slug), slug))
            .await
            .map_err(store::unavailable)?;
        Ok(store::all::<(i32,)>(res)?
            .into_iter()
            .map(|(d,)| d)
            .collect())
    }

    /// Every click of `slug` on `since_day` or later (the day before the link was created
    /// will do: a link has no clicks before it exists), summed.
    pub async fn link_stats(
        self: &Arc<Self>,
        slug: &str,
        since_day: i32,
    ) -> Result<LinkStats, StoreError> {
        Ok(self.read_link_stats(slug, since_day).await?.0)
    }

    /// Every click of `slug` from `since_day` on, summed: the roll-up of each closed month that
    /// has one, the days of every other month (listed from `click_index`, a read per month;
    /// read 16 at a time). A closed month read day by day gets its roll-up written (an empty
    /// one for a month without clicks), so the next read of it is one row: a link with years
    /// of clicks costs its roll-ups and the days of the last month or two. Days counted before
    /// `click_sums` (`click_days`) are read whatever `since_day` says.
    ///
    /// A roll-up is only as old as its reads: it is written with the timestamp of the moment
    /// before the reads began (less a clock margin, [`ROLLUP_CLOCK_MARGIN_US`]), and the counter deletes it,
    /// timestamped after it counted, whenever it counts a late click of that month; a delete
    /// for a click these reads missed is newer, so it wins however the two writes interleave.
    pub async fn read_link_stats(
        self: &Arc<Self>,
        slug: &str,
        since_day: i32,
    ) -> Result<(LinkStats, StatsReads), StoreError> {
        let started_us = now_us();
        let today = day_of(started_us.div_euclid(1000));
        let this_month = month_of_day(today);
        let first_month = month_of_day(since_day.max(FIRST_CLICK_DAY)).min(this_month);
        let session = self.db.session();
        let (legacy_days, months) = tokio::join!(
            session.execute_unpaged(&self.list_days, (slug,)),
            session.execute_unpaged(&self.read_months, (slug,)),
        );
        let legacy_days: BTreeSet<i32> =
            store::all::<(i32,)>(legacy_days.map_err(store::unavailable)?)?
                .into_iter()
                .map(|(d,)| d)
                .collect();
        let mut rollups: BTreeMap<i32, BTreeMap<RowKey, i64>> = BTreeMap::new();
        for (month, cells) in
            store::all::<(i32, Option<HashMap<String, i64>>)>(months.map_err(store::unavailable)?)?
        {
            if month_closed(month, today) {
                let rows = cells
                    .unwrap_or_default()
                    .iter()
                    .filter_map(|(name, n)| parse_cell(name).map(|r| (r, *n)))
                    .collect();
                rollups.insert(month, rows);
            }
        }
        let mut stats = LinkStats::default();
        let mut reads = StatsReads {
            rollups_used: rollups.len(),
            ..StatsReads::default()
        };
        for rows in rollups.values() {
            stats.merge_rollup(rows);
        }
        let listed: Vec<i32> = (first_month..=this_month)
            .filter(|m| !rollups.contains_key(m))
            .collect();
        let mut days: BTreeMap<i32, (bool, bool)> = BTreeMap::new();
        for group in listed.chunks(16) {
            let mut tasks = tokio::task::JoinSet::new();
            for &month in group {
                let (this, slug) = (self.clone(), slug.to_string());
                tasks.spawn(async move { this.index_days(&slug, month).await });
            }
            while let Some(r) = tasks.join_next().await {
                for day in
                    r.map_err(|e| StoreError::Unavailable(format!("stats read task: {e}")))??
                {
                    days.entry(day).or_default().1 = true;
                }
            }
        }
        for &day in &legacy_days {
            if !rollups.contains_key(&month_of_day(day)) {
                days.entry(day).or_default().0 = true;
            }
        }
        reads.days = days.len();
        let mut read: BTreeMap<i32, DayCounts> = BTreeMap::new();
        let days: Vec<(i32, (bool, bool))> = days.into_iter().collect();
        for group in days.chunks(16) {
            let mut tasks = tokio::task::JoinSet::new();
            for &(day, (legacy, current)) in group {
                let (this, slug) = (self.clone(), slug.to_string());
                tasks.spawn(async move {
                    let mut counts = DayCounts::default();
                    if legacy {
                        counts.merge(this.legacy_day_counts(&slug, day).await?);
                    }
                    if current {
                        counts.merge(this.sums_day(&slug, day).await?);
                    }
                    Ok::<_, StoreError>((day, counts))
                });
            }
            while let Some(r) = tasks.join_next().await {
                let (day, counts) =
                    r.map_err(|e| StoreError::Unavailable(format!("stats read task: {e}")))??;
                read.insert(day, counts);
            }
        }
        // Every closed month these reads covered whole gets its roll-up, with no days too.
        let mut closed: BTreeMap<i32, Vec<(i32, &Cells)>> = listed
            .iter()
            .filter(|m| month_closed(**m, today))
            .map(|m| (*m, Vec::new()))
            .collect();
        for (day, counts) in &read {
            stats.merge_day(*day, &counts.rows);
            let month = month_of_day(*day);
            if month_closed(month, today) {
                closed.entry(month).or_default().push((*day, &counts.rows));
            }
        }
        let at = started_us - self.rollup_margin_us;
        for (month, days) in closed {
            let cells: HashMap<String, i64> = rollup(days)
                .iter()
                .map(|(r, n)| (cell_name(r), *n))
                .collect();
            // A roll-up not written is only a saving lost: the next read writes it.
            match session
                .execute_unpaged(&self.write_month, (slug, month, cells, at))
                .await
            {
                Ok(_) => reads.rollups_written += 1,
                Err(e) => tracing::warn!(month, error = %e, "click roll-up not written"),
            }
        }
        Ok((stats, reads))
    }

    /// Deletes the roll-ups of (link, month) at timestamp `at_us` (the counter, after counting
    /// late clicks of those months).
    pub async fn drop_rollup(&self, slug: &str, month: i32, at_us: i64) -> Result<(), StoreError> {
        self.db
            .session()
            .execute_unpaged(&self.drop_month, (at_us, slug, month))
            .await
            .map(drop)
            .map_err(store::unavailable)
    }
}

#[cfg(test)]
mod tests;
