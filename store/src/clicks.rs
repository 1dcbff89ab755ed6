//! Click aggregates in ScyllaDB: the counting rules (which rows one click changes), the
//! counter's exactly-once writer ([`writer`]), and the read model behind the stats API and the
//! info page.
//!
//! Exactly once, in short (the argument in full: docs/design/data-flow.md, "Counting"): every click of a
//! link goes to one partition of the clicks topic (the source); one counter owns a source at a
//! time and counts its clicks in offset order. Per group of links, day and source (one row of
//! `click_groups` for about 16 links; `click_sums`, a row per link, for days up to the cursor
//! `click_sums_until`) it stores absolute counts together with `upto`, the offset of the newest
//! click they include, written with that offset as the write timestamp; the ids of counted
//! clicks go to a dedup index per (source, minute of the click) before the counts that include
//! them. A redelivered click (offset ≤ `upto`) was
//! counted; a copy of a click (same id, another offset) is found in the index; a zombie writer
//! can only write values that are right for their offset, and the furthest offset wins.
//!
//! Modules: [`rules`] (what one click counts, pure), [`stats`] (the read model, pure),
//! [`writer`] (the counter's exactly-once writer for one source); this file holds the
//! statements and the reads behind them ([`ClickStore`]).

use crate::db::{self as store, Db, StoreError};
use scylla::response::query_result::QueryResult;
use scylla::statement::prepared::PreparedStatement;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

pub mod rules;
pub mod stats;
pub mod writer;

pub use rules::*;
pub use stats::LinkStats;

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

impl std::ops::AddAssign for Counted {
    fn add_assign(&mut self, later: Counted) {
        self.counted += later.counted;
        self.duplicates += later.duplicates;
        self.redelivered += later.redelivered;
    }
}

pub struct ClickStore {
    db: Arc<Db>,
    read_legacy_day: PreparedStatement,
    read_day: PreparedStatement,
    read_legacy_upto: PreparedStatement,
    read_sums_day: PreparedStatement,
    read_sums: PreparedStatement,
    write_sum: PreparedStatement,
    read_groups_day: PreparedStatement,
    read_groups: PreparedStatement,
    write_group: PreparedStatement,
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
    /// The last day counted in `click_sums`, later days in `click_groups` (see [`SUMS_UNTIL`]):
    /// never before `legacy_until` (only the `click_sums` path reads `click_totals`).
    sums_until: i32,
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

/// The day the `cursors` row `name` holds; `i32::MAX` without one.
async fn read_until(
    session: &scylla::client::session::Session,
    name: &str,
) -> Result<i32, StoreError> {
    let res = session
        .query_unpaged("SELECT position FROM cursors WHERE name = ?", (name,))
        .await
        .map_err(store::unavailable)?;
    Ok(store::first::<(Option<i64>,)>(res)?
        .and_then(|(p,)| p)
        .map_or(i32::MAX, |p| p.clamp(-1, i64::from(i32::MAX)) as i32))
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
        // No marker: a store not migrated since click_sums came; any day may have old rows.
        let legacy_until = read_until(session, LEGACY_UNTIL).await?;
        // No marker: a store not migrated since click_groups came; every day goes on in
        // click_sums.
        let sums_until = read_until(session, SUMS_UNTIL).await?.max(legacy_until);
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
            read_groups_day: prep(
                "SELECT n FROM click_groups WHERE day = ? AND bucket = ? AND grp = ?",
                true,
            )
            .await?,
            read_groups: prep(
                "SELECT grp, upto, n FROM click_groups \
                 WHERE day = ? AND bucket = ? AND grp IN ? AND src = ?",
                true,
            )
            .await?,
            // Absolute values at a fixed timestamp: retrying it is harmless.
            write_group: prep(
                "UPDATE click_groups USING TIMESTAMP ? SET upto = ?, n = ? \
                 WHERE day = ? AND bucket = ? AND grp = ? AND src = ?",
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
            sums_until,
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

    /// The counts of one (link, day): every source's `click_sums` row and its member of every
    /// source's `click_groups` row (both read whatever the cursor says: a row in either is a
    /// count).
    async fn sums_day(&self, slug: &str, day: i32) -> Result<DayCounts, StoreError> {
        let session = self.db.session();
        let (bucket, group) = bucket_and_group(slug);
        let (sums, groups) = tokio::join!(
            session.execute_unpaged(&self.read_sums_day, (day, bucket, slug)),
            session.execute_unpaged(&self.read_groups_day, (day, bucket, group)),
        );
        let mut out = DayCounts::default();
        for (blob,) in store::all::<(Option<Vec<u8>>,)>(sums.map_err(store::unavailable)?)? {
            out.merge(DayCounts::decode(&blob.unwrap_or_default()));
        }
        for (blob,) in store::all::<(Option<Vec<u8>>,)>(groups.map_err(store::unavailable)?)? {
            let blob = blob.unwrap_or_default();
            for (member, counts) in decode_group(&blob) {
                if member == slug {
                    out.merge(DayCounts::decode(counts));
                }
            }
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
