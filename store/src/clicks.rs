//! Click aggregates in ScyllaDB: the counting rules (which rows one click changes), the
//! counter's exactly-once write, and the read model behind the stats API and the info page.
//!
//! Exactly once: all clicks of one link on one UTC day live in one partition of
//! `click_counts`, next to the ids of the events already counted there. The counter reads the
//! partition (version, counts), drops events whose id is already recorded, and writes the new
//! counts plus the new ids in ONE conditional single-partition batch guarded by
//! `IF version = <the version it read>`. Such a batch is atomic and isolated, so either the
//! ids and the counts they produced are both stored or neither is: a crash before it changes
//! nothing, a crash after it leaves ids that make any redelivery a no-op, and a concurrent
//! writer (a consumer that lost its partition but does not know yet) makes the condition fail,
//! after which the batch is recomputed from a fresh read.

use crate::db::{self as store, Db, StoreError};
use scylla::statement::batch::{Batch, BatchType};
use scylla::statement::prepared::PreparedStatement;
use scylla::value::CqlValue;
use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use uuid::Uuid;
use zlink_wire::events::{AgentClass, ClickEvent, Tier};

pub const DAY_MS: i64 = 86_400_000;
/// Distinct referrer hosts kept per link and day; the rest are counted under [`OTHER`].
pub const MAX_REFERRERS_PER_DAY: usize = 100;
pub const DIRECT: &str = "(direct)";
pub const OTHER: &str = "(other)";
pub const UNKNOWN: &str = "(unknown)";
/// Events per conditional batch: keeps every batch far below Cassandra's 50 KiB batch limit.
pub const CHUNK: usize = 100;
/// Conditional batches lost in a row before giving up (only a second writer makes one lose).
const MAX_ATTEMPTS: usize = 16;

const COUNT: &str = "c";
const REFERRER: &str = "r";

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

/// (kind, key) of a count row.
pub type RowKey = (String, String);

/// The count rows of one (link, day) partition and its version (`None`: never written).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DayCounts {
    pub version: Option<i64>,
    pub rows: BTreeMap<RowKey, i64>,
}

impl DayCounts {
    /// Counts `events` (none of them counted before) and returns every row that changed with
    /// its new value.
    pub fn add(&mut self, events: &[&ClickEvent]) -> BTreeMap<RowKey, i64> {
        let mut changed = BTreeMap::new();
        let mut referrers = self
            .rows
            .keys()
            .filter(|(kind, key)| kind == REFERRER && key != OTHER)
            .count();
        for ev in events {
            let host = referrer_host(ev.referrer.as_deref());
            let known = self
                .rows
                .contains_key(&(REFERRER.to_string(), host.clone()));
            let referrer = if known {
                host
            } else if referrers < MAX_REFERRERS_PER_DAY {
                referrers += 1;
                host
            } else {
                OTHER.to_string()
            };
            for key in [
                (COUNT.to_string(), "total".to_string()),
                (COUNT.to_string(), format!("tier:{}", tier_name(ev.tier))),
                (COUNT.to_string(), format!("agent:{}", agent_name(ev.agent))),
                (REFERRER.to_string(), referrer),
            ] {
                let n = self.rows.entry(key.clone()).or_insert(0);
                *n += 1;
                changed.insert(key, *n);
            }
        }
        changed
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
}

impl LinkStats {
    pub fn merge_day(&mut self, day: i32, rows: &BTreeMap<RowKey, i64>) {
        for ((kind, key), n) in rows {
            match (kind.as_str(), key.as_str()) {
                (COUNT, "total") => {
                    self.total += n;
                    *self.per_day.entry(day).or_insert(0) += n;
                }
                (COUNT, k) => {
                    if let Some(t) = k.strip_prefix("tier:") {
                        *self.by_tier.entry(t.to_string()).or_insert(0) += n;
                    } else if let Some(a) = k.strip_prefix("agent:") {
                        *self.by_agent.entry(a.to_string()).or_insert(0) += n;
                    }
                }
                (REFERRER, host) => *self.referrers.entry(host.to_string()).or_insert(0) += n,
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
        let mut v: Vec<(&str, i64)> = self
            .referrers
            .iter()
            .map(|(k, n)| (k.as_str(), *n))
            .collect();
        v.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
        v.truncate(n);
        v
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
        serde_json::json!({
            "slug": slug,
            "total": self.total,
            "humans": self.humans(),
            "bots": self.bots(),
            "by_agent": agents,
            "by_tier": tiers,
            "last_days": recent,
            "top_referrers": referrers,
        })
    }
}

/// What one [`ClickStore::count`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counted {
    /// Events counted now.
    pub counted: u64,
    /// Events already counted before (or twice in the input): ignored.
    pub duplicates: u64,
    /// Conditional batches that lost to another writer and were recomputed.
    pub conflicts: u64,
}

pub struct ClickStore {
    db: Arc<Db>,
    read_day: PreparedStatement,
    seen: PreparedStatement,
    bump: PreparedStatement,
    set_count: PreparedStatement,
    mark_id: PreparedStatement,
    add_day: PreparedStatement,
    list_days: PreparedStatement,
}

type Values = Vec<Option<CqlValue>>;

impl ClickStore {
    pub async fn prepare(db: Arc<Db>) -> Result<Self, StoreError> {
        let session = db.session();
        let prep = |q: &'static str, idempotent: bool| async move {
            let mut p = session.prepare(q).await.map_err(store::unavailable)?;
            p.set_is_idempotent(idempotent);
            Ok::<_, StoreError>(p)
        };
        Ok(ClickStore {
            read_day: prep(
                "SELECT version, kind, key, n FROM click_counts \
                 WHERE slug = ? AND day = ? AND kind IN ('c', 'r')",
                true,
            )
            .await?,
            seen: prep(
                "SELECT key FROM click_counts WHERE slug = ? AND day = ? AND kind = 'i' AND key IN ?",
                true,
            )
            .await?,
            bump: prep(
                "UPDATE click_counts SET version = ? WHERE slug = ? AND day = ? IF version = ?",
                false,
            )
            .await?,
            set_count: prep(
                "UPDATE click_counts SET n = ? WHERE slug = ? AND day = ? AND kind = ? AND key = ?",
                false,
            )
            .await?,
            mark_id: prep(
                "INSERT INTO click_counts (slug, day, kind, key, n) VALUES (?, ?, 'i', ?, 1) USING TTL ?",
                false,
            )
            .await?,
            add_day: prep("INSERT INTO click_days (slug, day) VALUES (?, ?)", true).await?,
            list_days: prep("SELECT day FROM click_days WHERE slug = ?", true).await?,
            db,
        })
    }

    /// The count rows and version of one (link, day).
    pub async fn day_counts(&self, slug: &str, day: i32) -> Result<DayCounts, StoreError> {
        let res = self
            .db
            .session()
            .execute_unpaged(&self.read_day, (slug, day))
            .await
            .map_err(store::unavailable)?;
        let mut out = DayCounts::default();
        for (version, kind, key, n) in
            store::all::<(Option<i64>, String, String, Option<i64>)>(res)?
        {
            out.version = out.version.or(version);
            out.rows.insert((kind, key), n.unwrap_or(0));
        }
        Ok(out)
    }

    /// The ids among `ids` already counted in (slug, day).
    async fn seen(&self, slug: &str, day: i32, ids: &[Uuid]) -> Result<HashSet<Uuid>, StoreError> {
        let keys: Vec<String> = ids.iter().map(Uuid::to_string).collect();
        let res = self
            .db
            .session()
            .execute_unpaged(&self.seen, (slug, day, keys))
            .await
            .map_err(store::unavailable)?;
        Ok(store::all::<(String,)>(res)?
            .into_iter()
            .filter_map(|(k,)| k.parse().ok())
            .collect())
    }

    /// Counts `events` — all of link `slug` on UTC day `day` — exactly once, however often any
    /// of them was counted before. Ids are remembered for `dedup_ttl_s` seconds.
    pub async fn count(
        &self,
        slug: &str,
        day: i32,
        events: &[ClickEvent],
        dedup_ttl_s: i32,
    ) -> Result<Counted, StoreError> {
        let mut out = Counted::default();
        let mut ids = HashSet::new();
        let unique: Vec<&ClickEvent> = events.iter().filter(|e| ids.insert(e.id)).collect();
        out.duplicates += (events.len() - unique.len()) as u64;
        if unique.is_empty() {
            return Ok(out);
        }
        // Before any count: a reader may see a day without counts (zero), never counts it
        // cannot find.
        self.db
            .session()
            .execute_unpaged(&self.add_day, (slug, day))
            .await
            .map_err(store::unavailable)?;
        // After an applied batch the partition's new state is known exactly (version + 1 and
        // the rows just written), so the next chunk needs no read; after a lost condition it
        // is read again.
        let mut known: Option<DayCounts> = None;
        for chunk in unique.chunks(CHUNK) {
            let chunk_ids: Vec<Uuid> = chunk.iter().map(|e| e.id).collect();
            let mut done = false;
            for _ in 0..MAX_ATTEMPTS {
                let mut state = match known.take() {
                    Some(s) => s,
                    None => self.day_counts(slug, day).await?,
                };
                let seen = self.seen(slug, day, &chunk_ids).await?;
                let fresh: Vec<&ClickEvent> = chunk
                    .iter()
                    .copied()
                    .filter(|e| !seen.contains(&e.id))
                    .collect();
                if fresh.is_empty() {
                    out.duplicates += chunk.len() as u64;
                    known = Some(state);
                    done = true;
                    break;
                }
                let changed = state.add(&fresh);
                let (batch, values) = self.batch(slug, day, &state, changed, &fresh, dedup_ttl_s);
                let res = self
                    .db
                    .session()
                    .batch(&batch, values)
                    .await
                    .map_err(store::unavailable)?;
                if store::applied(res)? {
                    out.counted += fresh.len() as u64;
                    out.duplicates += (chunk.len() - fresh.len()) as u64;
                    state.version = Some(state.version.unwrap_or(0) + 1);
                    known = Some(state);
                    done = true;
                    break;
                }
                out.conflicts += 1;
            }
            if !done {
                return Err(StoreError::Contention(
                    "click counts kept changing under the counter",
                ));
            }
        }
        Ok(out)
    }

    /// The conditional batch: version bump (the condition), changed counts, new ids.
    fn batch(
        &self,
        slug: &str,
        day: i32,
        state: &DayCounts,
        changed: BTreeMap<RowKey, i64>,
        fresh: &[&ClickEvent],
        ttl_s: i32,
    ) -> (Batch, Vec<Values>) {
        let text = |s: &str| Some(CqlValue::Text(s.to_string()));
        let mut batch = Batch::new(BatchType::Unlogged);
        let mut values: Vec<Values> = Vec::with_capacity(1 + changed.len() + fresh.len());
        batch.append_statement(self.bump.clone());
        values.push(vec![
            Some(CqlValue::BigInt(state.version.unwrap_or(0) + 1)),
            text(slug),
            Some(CqlValue::Int(day)),
            state.version.map(CqlValue::BigInt),
        ]);
        for ((kind, key), n) in changed {
            batch.append_statement(self.set_count.clone());
            values.push(vec![
                Some(CqlValue::BigInt(n)),
                text(slug),
                Some(CqlValue::Int(day)),
                text(&kind),
                text(&key),
            ]);
        }
        for e in fresh {
            batch.append_statement(self.mark_id.clone());
            values.push(vec![
                text(slug),
                Some(CqlValue::Int(day)),
                text(&e.id.to_string()),
                Some(CqlValue::Int(ttl_s)),
            ]);
        }
        (batch, values)
    }

    /// Every day's counts of `slug`, summed (the days are read 16 at a time).
    pub async fn link_stats(self: &Arc<Self>, slug: &str) -> Result<LinkStats, StoreError> {
        let res = self
            .db
            .session()
            .execute_unpaged(&self.list_days, (slug,))
            .await
            .map_err(store::unavailable)?;
        let days: Vec<i32> = store::all::<(i32,)>(res)?
            .into_iter()
            .map(|(d,)| d)
            .collect();
        let mut stats = LinkStats::default();
        for group in days.chunks(16) {
            let mut reads = tokio::task::JoinSet::new();
            for &day in group {
                let (this, slug) = (self.clone(), slug.to_string());
                reads.spawn(async move { (day, this.day_counts(&slug, day).await) });
            }
            while let Some(r) = reads.join_next().await {
                let (day, counts) =
                    r.map_err(|e| StoreError::Unavailable(format!("stats read task: {e}")))?;
                stats.merge_day(day, &counts?.rows);
            }
        }
        Ok(stats)
    }
}

#[cfg(test)]
mod tests;
