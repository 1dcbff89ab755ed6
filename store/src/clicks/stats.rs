//! The read model: one link's clicks summed over the days (and month roll-ups) read, as the
//! stats API and the info page use them. Pure: the reads are [`super::ClickStore`]'s, the API's
//! JSON shape is primary's (`primary/src/views.rs`).

use super::rules::{RowKey, CITY, COUNT, COUNTRY, DAY, REFERRER};
use std::collections::BTreeMap;

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

    /// The `n` countries with the most clicks (ties by code).
    pub fn top_countries(&self, n: usize) -> Vec<(&str, i64)> {
        top(&self.countries, n)
    }

    /// The `n` cities (`<ISO code>/<city>`, or [`super::OTHER`]) with the most clicks.
    pub fn top_cities(&self, n: usize) -> Vec<(&str, i64)> {
        top(&self.cities, n)
    }
}

/// The `n` keys with the most clicks (ties by name).
fn top(counts: &BTreeMap<String, i64>, n: usize) -> Vec<(&str, i64)> {
    let mut v: Vec<(&str, i64)> = counts.iter().map(|(k, n)| (k.as_str(), *n)).collect();
    v.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    v.truncate(n);
    v
}
