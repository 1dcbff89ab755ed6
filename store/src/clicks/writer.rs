//! The counter's writer for one source (one partition of the clicks topic): its clicks in
//! offset order, counted exactly once, at a cost that grows with clicks, not with links.
//!
//! State, kept in memory while the source stays with this process and reloaded from the store
//! on first use: per (link, day) the absolute counts and `upto` (the offset of the newest click
//! they include), and per minute of click time the ids already counted. A batch is decided in
//! memory ([`plan`]: [`SourceState::plan`]), then written: the new ids first (`click_seen`, one row per
//! minute and up to 2,048 ids, each with its offset), then the days new to the index
//! (`click_index`), then every group with a changed (link, day) as one row carrying every
//! member's counts and `upto`, using it as the write timestamp (`click_groups`; days up to
//! `click_sums_until`: a `click_sums` row per (link, day)). Rows of one partition ((day, bucket)
//! for the counts, (month, bucket) for the index; see [`super::bucket_of`], [`super::group_of`])
//! go as one single-partition unlogged batch, so a batch of 5,000 clicks over 5,000 links costs
//! about 32 writes of some 30 group rows each, not 5,000 writes; state missing from memory is
//! read the same way (one read per partition of its groups, or of up to 100 links), a group
//! whole: memory holds a group whole or not at all, since its row is written from what memory
//! holds. Only then does the caller store the batch's offsets.
//!
//! A batch that does not start where the last one ended (a rebalance moved the source away and
//! back, or the group's position jumped) drops the state first, and so does any failed batch:
//! the next one reloads what the store has.
//!
//! The two halves can also run apart: [`SourceCounter::fold`] decides a batch in memory and
//! adds its plan to what is pending, [`SourceCounter::flush`] writes everything pending at
//! once. Folded batches are one plan of all of them ([`Plan::absorb`]), so a (link, day) that
//! several batches touch is written once: the store's cost follows the (link, day)s of a flush
//! window, not the clicks in it. The caller stores the offsets of every folded batch only after
//! the flush; a flush that fails changed nothing in memory and may simply be tried again (every
//! row it writes is the same on each try, and idempotent).

use super::{
    bucket_of, day_of, decode_group, encode_group, is_late, month_of_day, now_us, Click,
    ClickStore, Counted, DayCounts,
};
use crate::db::{self as store, StoreError};
use scylla::serialize::row::SerializeRow;
use scylla::statement::batch::{Batch, BatchType};
use scylla::statement::prepared::PreparedStatement;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::ops::ControlFlow;
use std::sync::Arc;
use tokio::task::JoinSet;
use uuid::Uuid;

mod plan;
use plan::{group_key, Group, Key, Map};
pub use plan::{minute_of, Plan, SourceState, MINUTE_MS};

/// Ids per `click_seen` row (24 bytes each: the id and the offset it was counted at): 48 KiB.
pub const IDS_PER_ROW: usize = 2048;
const RECORD: usize = 24;
/// Slugs per read of one `click_sums` partition (`slug IN ?`).
const SLUGS_PER_READ: usize = 100;
/// Rows per single-partition batch of `click_sums` or `click_index` writes.
const ROWS_PER_BATCH: usize = 128;

/// The name of a source: `<topic>:<partition>`.
pub fn source_name(topic: &str, partition: i32) -> String {
    format!("{topic}:{partition}")
}

/// How much of a source's state stays in memory, and how the writer talks to the store.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// (link, day) states kept between batches.
    pub keys: usize,
    /// Click ids kept between batches (about 40 bytes each).
    pub ids: usize,
    /// Store round trips in flight at once.
    pub concurrency: usize,
    /// How long ids stay in the dedup index, seconds.
    pub dedup_ttl_s: i32,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            keys: 200_000,
            ids: 4_000_000,
            concurrency: 64,
            dedup_ttl_s: 45 * 86_400,
        }
    }
}

/// Counts one source's clicks; one per source, owned by the task counting it.
pub struct SourceCounter {
    store: Arc<ClickStore>,
    src: String,
    limits: Limits,
    state: SourceState,
    writer: Uuid,
    last_batch: std::time::Instant,
    /// Tests: fail a batch after this many (link, day) writes (a crash in mid-write).
    fail_after_writes: Option<usize>,
    /// Folded and not yet written.
    pending: Plan,
    /// (link, day) of folded clicks that may be late by the time they are flushed (see
    /// [`Self::drop_rollups`]).
    late: BTreeSet<Key>,
}

impl SourceCounter {
    pub fn new(store: Arc<ClickStore>, src: String, limits: Limits) -> Self {
        SourceCounter {
            store,
            src,
            limits,
            state: SourceState::default(),
            writer: Uuid::new_v4(),
            last_batch: std::time::Instant::now(),
            fail_after_writes: None,
            pending: Plan::default(),
            late: BTreeSet::new(),
        }
    }

    /// How long since the last batch was counted (or since creation).
    pub fn idle_for(&self) -> std::time::Duration {
        self.last_batch.elapsed()
    }

    /// New limits, from the next batch's end on.
    pub fn set_limits(&mut self, limits: Limits) {
        self.limits = limits;
    }

    pub fn source(&self) -> &str {
        &self.src
    }

    /// Makes the next batch fail after `writes` of its (link, day) writes reached the store, as
    /// a process dying in mid-write would (a batch with no more writes than that succeeds).
    /// Tests only.
    pub fn fail_next_batch_after(&mut self, writes: usize) {
        self.fail_after_writes = Some(writes);
    }

    /// Whether the state held has outgrown the memory limits: it is let go of only after a
    /// flush, so the caller should flush.
    pub fn over_limits(&self) -> bool {
        self.state.keys.len() > self.limits.keys || self.state.ids > self.limits.ids
    }

    /// (link, day) states and ids held in memory.
    pub fn held(&self) -> (usize, usize) {
        (self.state.keys.len(), self.state.ids)
    }

    /// Counts the batch of offsets `first..=last` of this source; `events` are its valid
    /// clicks, in offset order (the invalid ones were skipped by the caller). When this returns
    /// Ok, every click of the batch is counted exactly once and the offsets may be committed.
    /// [`Self::fold`] and [`Self::flush`] in one; whatever fails, the state is dropped.
    pub async fn count(
        &mut self,
        first: i64,
        last: i64,
        events: &[(i64, Click)],
    ) -> Result<Counted, StoreError> {
        let r = match self.fold(first, last, events).await {
            Ok(_) => self.flush().await,
            Err(e) => Err(e),
        };
        if r.is_err() {
            self.reset();
        }
        r
    }

    /// Decides the batch of offsets `first..=last` (`events` as for [`Self::count`]) in memory,
    /// reading the state it needs, and adds it to what is pending; nothing is written. The
    /// batch's offsets may be committed only after the next [`Self::flush`] succeeded. On an
    /// error nothing was decided and the same batch may be folded again.
    pub async fn fold(
        &mut self,
        first: i64,
        last: i64,
        events: &[(i64, Click)],
    ) -> Result<Counted, StoreError> {
        if self.state.next != Some(first) {
            if self.state.next.is_some() {
                tracing::info!(
                    src = %self.src,
                    expected = self.state.next,
                    got = first,
                    pending = self.pending.counted,
                    "the source did not continue where it stopped; reloading its state (clicks \
                     not yet written are counted by whoever reads from the committed offset)"
                );
            }
            self.reset();
        }
        self.load(events).await?;
        let refs: Vec<(i64, &Click)> = events.iter().map(|(o, e)| (*o, e)).collect();
        let plan = self.state.plan(&refs);
        // Late by the flush, which comes before tomorrow (see `drop_rollups`).
        let tomorrow = day_of(chrono::Utc::now().timestamp_millis()) + 1;
        for (_, e) in events {
            let day = day_of(e.at_ms);
            if is_late(day, tomorrow) {
                self.late.insert((e.key().to_owned(), day));
            }
        }
        self.state.next = Some(last + 1);
        self.last_batch = std::time::Instant::now();
        let counted = plan.decided();
        self.pending.absorb(plan);
        Ok(counted)
    }

    /// Clicks folded since the last flush and not yet written (copies and redeliveries aside).
    pub fn pending(&self) -> u64 {
        self.pending.counted
    }

    /// Writes what every batch folded since the last flush changed: the new ids first, then
    /// the days new to the index, then the counts, then the roll-ups of late clicks dropped.
    /// On an error the state and what is pending stay as they were: trying again writes the
    /// same rows. Then the state beyond the memory limits is let go. What the written batches
    /// decided (of those folded since the source last did not continue, which were dropped).
    pub async fn flush(&mut self) -> Result<Counted, StoreError> {
        if !self.pending.is_empty() || !self.late.is_empty() {
            self.write_ids(&self.pending.ids).await?;
            self.write_index(&self.pending.writes).await?;
            let failpoint = self.fail_after_writes.take();
            self.write_counts(&self.pending.writes, failpoint).await?;
            self.drop_rollups(&self.late).await?;
            for k in self.pending.writes.keys() {
                if let Some(ks) = self.state.keys.get_mut(k) {
                    ks.listed = true;
                }
            }
        }
        let written = std::mem::take(&mut self.pending).decided();
        self.late.clear();
        self.state.evict(&self.limits);
        Ok(written)
    }

    /// Forgets the state and what is pending: the next batch reloads what the store has.
    fn reset(&mut self) {
        self.state = SourceState::default();
        self.pending = Plan::default();
        self.late.clear();
    }

    /// Reads the state of every (link, day) and minute the batch touches and memory lacks: a
    /// read per minute, and per (day, bucket) one read of its missing groups (days after
    /// `click_sums_until`; a link its group's row lacks then joins the group) or of up to
    /// [`SLUGS_PER_READ`] links (days up to it).
    async fn load(&mut self, events: &[(i64, Click)]) -> Result<(), StoreError> {
        let mut keys: BTreeMap<(i32, i32), BTreeSet<String>> = BTreeMap::new();
        let mut groups: BTreeMap<(i32, i32), BTreeSet<i32>> = BTreeMap::new();
        let mut minutes: HashSet<i64> = HashSet::new();
        let sums_until = self.store.sums_until;
        for (_, e) in events {
            let (slug, day) = (e.key(), day_of(e.at_ms));
            if self.state.key_missing(slug, day) {
                if day > sums_until {
                    // Read whole, with its group; a link the group's row lacks joins it after.
                    let g = group_key(slug, day);
                    if self.state.group_missing(&g) {
                        groups.entry((g.0, g.1)).or_default().insert(g.2);
                    }
                } else {
                    let slugs = keys.entry((day, bucket_of(slug))).or_default();
                    if !slugs.contains(slug) {
                        slugs.insert(slug.to_owned());
                    }
                }
            }
            let m = minute_of(e.at_ms);
            if self.state.bucket_missing(m) {
                minutes.insert(m);
            }
        }
        let mut work: Vec<Load> = minutes.into_iter().map(Load::Minute).collect();
        for ((day, bucket), grps) in groups {
            work.push(Load::Groups(day, bucket, grps.into_iter().collect()));
        }
        for ((day, bucket), slugs) in keys {
            let slugs: Vec<String> = slugs.into_iter().collect();
            for chunk in slugs.chunks(SLUGS_PER_READ) {
                work.push(Load::Keys(day, bucket, chunk.to_vec()));
            }
        }
        let mut running = JoinSet::new();
        let mut work = work.into_iter();
        loop {
            while running.len() < self.limits.concurrency {
                let Some(item) = work.next() else { break };
                let (store, src) = (self.store.clone(), self.src.clone());
                running.spawn(async move { item.run(&store, &src).await });
            }
            let Some(done) = running.join_next().await else {
                break;
            };
            match done.map_err(|e| StoreError::Unavailable(format!("click load task: {e}")))?? {
                Loaded::Keys(found) => {
                    for (k, upto, counts, listed) in found {
                        self.state.insert_key(k, upto, counts, listed);
                    }
                }
                Loaded::Groups(found) => {
                    for (g, upto, members) in found {
                        self.state.insert_group(g, upto, members);
                    }
                }
                Loaded::Minute(m, ids) => self.state.insert_bucket(m, ids),
            }
        }
        for (_, e) in events {
            let (slug, day) = (e.key(), day_of(e.at_ms));
            if day > sums_until && self.state.key_missing(slug, day) {
                self.state.insert_new_member(slug, day);
            }
        }
        Ok(())
    }

    async fn write_ids(&self, ids: &BTreeMap<i64, Vec<(i64, Uuid)>>) -> Result<(), StoreError> {
        let mut rows = Vec::new();
        for (minute, list) in ids {
            for chunk in list.chunks(IDS_PER_ROW) {
                let upto = chunk.last().map(|(o, _)| *o).unwrap_or(0);
                let mut blob = Vec::with_capacity(chunk.len() * RECORD);
                for (offset, id) in chunk {
                    blob.extend_from_slice(id.as_bytes());
                    blob.extend_from_slice(&offset.to_be_bytes());
                }
                rows.push((*minute, upto, blob));
            }
        }
        let (src, writer, ttl) = (self.src.clone(), self.writer, self.limits.dedup_ttl_s);
        self.run_all(rows, move |store, (minute, upto, blob)| {
            let src = src.clone();
            async move {
                store
                    .db
                    .session()
                    .execute_unpaged(&store.write_seen, (src, minute, upto, writer, blob, ttl))
                    .await
                    .map(drop)
                    .map_err(store::unavailable)
            }
        })
        .await
    }

    /// Before any count of a (link, day) exists: a reader may list a day without counts
    /// (zero), never have counts it cannot find. One batch per (month, bucket).
    async fn write_index(&self, writes: &Map<Key, i64>) -> Result<(), StoreError> {
        type Row = (i32, i32, String, i32);
        let mut parts: BTreeMap<(i32, i32), Vec<Row>> = BTreeMap::new();
        for (slug, day) in writes
            .keys()
            .filter(|k| !self.state.keys.get(*k).is_some_and(|s| s.listed))
        {
            let (month, bucket) = (month_of_day(*day), bucket_of(slug));
            parts
                .entry((month, bucket))
                .or_default()
                .push((month, bucket, slug.clone(), *day));
        }
        self.write_partitions(|s| &s.add_index, parts).await
    }

    /// Every changed (link, day)'s counts: up to `click_sums_until` its own `click_sums` row,
    /// after it its group's `click_groups` row, written whole (every member memory holds, which
    /// is every member: groups are read and let go of whole). One single-partition batch per
    /// (day, bucket) (up to [`ROWS_PER_BATCH`] rows each).
    async fn write_counts(
        &self,
        writes: &Map<Key, i64>,
        failpoint: Option<usize>,
    ) -> Result<(), StoreError> {
        type Row = (i64, i64, Vec<u8>, i32, i32, String, String);
        type GroupRow = (i64, i64, Vec<u8>, i32, i32, i32, String);
        // A member of a group row: its slug and counts blob.
        type Member<'a> = (&'a str, Vec<u8>);
        let sums_until = self.store.sums_until;
        let mut parts: BTreeMap<(i32, i32), Vec<Row>> = BTreeMap::new();
        let mut touched: BTreeSet<Group> = BTreeSet::new();
        for (key, upto) in writes.iter() {
            let (slug, day) = key;
            if *day > sums_until {
                touched.insert(group_key(slug, *day));
                continue;
            }
            let bucket = bucket_of(slug);
            // The whole (link, day) as of `upto`: what `plan` left in memory.
            let counts = self
                .state
                .keys
                .get(key)
                .map(|k| k.counts.encode())
                .unwrap_or_default();
            parts.entry((*day, bucket)).or_default().push((
                upto + 1,
                *upto,
                counts,
                *day,
                bucket,
                slug.clone(),
                self.src.clone(),
            ));
        }
        // Every member of every touched group, and the newest offset any of them includes. The
        // written (link, day)s are among them, at the offset they were written for: memory
        // holds what is pending until the flush (a reset drops both, eviction follows it).
        let mut members: BTreeMap<Group, (i64, Vec<Member>)> = BTreeMap::new();
        if !touched.is_empty() {
            for ((slug, day), ks) in &self.state.keys {
                let g = group_key(slug, *day);
                if touched.contains(&g) {
                    let (upto, m) = members.entry(g).or_insert((-1, Vec::new()));
                    *upto = (*upto).max(ks.upto());
                    m.push((slug, ks.counts.encode()));
                }
            }
        }
        let mut groups: BTreeMap<(i32, i32), Vec<GroupRow>> = BTreeMap::new();
        for (g, (upto, mut m)) in members {
            m.sort_unstable_by(|a, b| a.0.cmp(b.0));
            groups.entry((g.0, g.1)).or_default().push((
                upto + 1,
                upto,
                encode_group(m),
                g.0,
                g.1,
                g.2,
                self.src.clone(),
            ));
        }
        let total = parts.values().map(Vec::len).sum::<usize>()
            + groups.values().map(Vec::len).sum::<usize>();
        let failpoint = failpoint.filter(|n| *n < total);
        if let Some(n) = failpoint {
            truncate_rows(&mut parts, n);
            let left = n.saturating_sub(parts.values().map(Vec::len).sum());
            truncate_rows(&mut groups, left);
        }
        self.write_partitions(|s| &s.write_sum, parts).await?;
        self.write_partitions(|s| &s.write_group, groups).await?;
        match failpoint {
            Some(n) => Err(StoreError::Unavailable(format!(
                "failpoint: stopped after {n} count writes"
            ))),
            None => Ok(()),
        }
    }

    /// Writes each partition's rows with `stmt`, as single-partition unlogged batches of at
    /// most [`ROWS_PER_BATCH`] rows (one mutation each), `concurrency` at a time.
    async fn write_partitions<K, R>(
        &self,
        stmt: fn(&ClickStore) -> &PreparedStatement,
        parts: BTreeMap<K, Vec<R>>,
    ) -> Result<(), StoreError>
    where
        R: SerializeRow + Send + Sync + 'static,
    {
        self.run_all(chunked(parts), move |store, rows| async move {
            let batch = batch_of(stmt(&store), rows.len());
            store
                .db
                .session()
                .batch(&batch, rows)
                .await
                .map(drop)
                .map_err(store::unavailable)
        })
        .await
    }

    /// After the counts: deletes the roll-up of every month a late click folded since the last
    /// flush (see [`is_late`]; `late` holds every (link, day) that may be late by now) belongs
    /// to, whether counted now or before: a batch delivered again after a predecessor counted it
    /// and died before this step deletes what that one did not.
    async fn drop_rollups(&self, late: &BTreeSet<Key>) -> Result<(), StoreError> {
        let today = day_of(chrono::Utc::now().timestamp_millis());
        let months: BTreeSet<(String, i32)> = late
            .iter()
            .filter(|(_, day)| is_late(*day, today))
            .map(|(slug, day)| (slug.clone(), month_of_day(*day)))
            .collect();
        if months.is_empty() {
            return Ok(());
        }
        // Taken after every count of the batch was written: newer than the start of any read
        // that missed one.
        let at = now_us();
        self.run_all(
            months.into_iter().collect(),
            move |store, (slug, month)| async move { store.drop_rollup(&slug, month, at).await },
        )
        .await
    }

    /// Runs `f` on every item, `concurrency` at a time; the first error ends it.
    async fn run_all<T, F, Fut>(&self, items: Vec<T>, f: F) -> Result<(), StoreError>
    where
        T: Send + 'static,
        F: Fn(Arc<ClickStore>, T) -> Fut,
        Fut: std::future::Future<Output = Result<(), StoreError>> + Send + 'static,
    {
        let mut running = JoinSet::new();
        let mut items = items.into_iter();
        loop {
            while running.len() < self.limits.concurrency {
                let Some(item) = items.next() else { break };
                running.spawn(f(self.store.clone(), item));
            }
            match running.join_next().await {
                None => return Ok(()),
                Some(r) => {
                    r.map_err(|e| StoreError::Unavailable(format!("click write task: {e}")))??
                }
            }
        }
    }
}

/// Keeps the first `n` rows of `parts`, in their order.
fn truncate_rows<K: Ord, R>(parts: &mut BTreeMap<K, Vec<R>>, mut n: usize) {
    for rows in parts.values_mut() {
        rows.truncate(n);
        n -= rows.len();
    }
    parts.retain(|_, rows| !rows.is_empty());
}

/// Each partition's rows in chunks of at most [`ROWS_PER_BATCH`].
fn chunked<K, R>(parts: BTreeMap<K, Vec<R>>) -> Vec<Vec<R>> {
    let mut out = Vec::new();
    for (_, mut rows) in parts {
        while rows.len() > ROWS_PER_BATCH {
            let rest = rows.split_off(ROWS_PER_BATCH);
            out.push(std::mem::replace(&mut rows, rest));
        }
        out.push(rows);
    }
    out
}

/// An unlogged batch of `n` executions of `stmt` (rows of one partition: applied as one
/// mutation). Idempotent: every statement it is made of is.
fn batch_of(stmt: &PreparedStatement, n: usize) -> Batch {
    let mut batch = Batch::new(BatchType::Unlogged);
    for _ in 0..n {
        batch.append_statement(stmt.clone());
    }
    batch.set_is_idempotent(true);
    batch
}

enum Load {
    /// Links of one (day, bucket).
    Keys(i32, i32, Vec<String>),
    /// Groups of one (day, bucket).
    Groups(i32, i32, Vec<i32>),
    Minute(i64),
}

/// A group read: its key, `upto` (-1: no row) and its members' counts.
type LoadedGroup = (Group, i64, Vec<(String, DayCounts)>);

/// A (link, day)'s state: the key, `upto`, the counts in `click_sums`, and whether
/// `click_index` lists it.
type LoadedKey = (Key, i64, DayCounts, bool);

enum Loaded {
    Keys(Vec<LoadedKey>),
    Groups(Vec<LoadedGroup>),
    Minute(i64, Map<Uuid, i64>),
}

impl Load {
    async fn run(self, store: &ClickStore, src: &str) -> Result<Loaded, StoreError> {
        let session = store.db.session();
        match self {
            Load::Keys(day, bucket, slugs) => {
                let legacy = async {
                    if day > store.legacy_until {
                        return Ok(HashMap::new());
                    }
                    let res = session
                        .execute_unpaged(&store.read_legacy_upto, (&slugs, day, src))
                        .await
                        .map_err(store::unavailable)?;
                    Ok::<_, StoreError>(
                        store::all::<(String, Option<i64>)>(res)?
                            .into_iter()
                            .filter_map(|(slug, upto)| Some((slug, upto?)))
                            .collect::<HashMap<String, i64>>(),
                    )
                };
                let current = session.execute_unpaged(&store.read_sums, (day, bucket, &slugs, src));
                let (legacy, current) = tokio::join!(legacy, current);
                let legacy = legacy?;
                let mut rows: HashMap<String, (i64, DayCounts)> = HashMap::new();
                for (slug, upto, blob) in store::all::<(String, Option<i64>, Option<Vec<u8>>)>(
                    current.map_err(store::unavailable)?,
                )? {
                    let counts = DayCounts::decode(&blob.unwrap_or_default());
                    rows.insert(slug, (upto.unwrap_or(-1), counts));
                }
                let found = slugs
                    .into_iter()
                    .map(|slug| {
                        // A row of click_totals holds the clicks up to its upto; this source's
                        // click_sums row only those after it.
                        let before = legacy.get(&slug).copied().unwrap_or(-1);
                        let (upto, counts, listed) = match rows.remove(&slug) {
                            Some((upto, counts)) => (upto.max(before), counts, true),
                            None => (before, DayCounts::default(), false),
                        };
                        ((slug, day), upto, counts, listed)
                    })
                    .collect();
                Ok(Loaded::Keys(found))
            }
            Load::Groups(day, bucket, grps) => {
                let res = session
                    .execute_unpaged(&store.read_groups, (day, bucket, &grps, src))
                    .await
                    .map_err(store::unavailable)?;
                let mut rows: HashMap<i32, (i64, Vec<(String, DayCounts)>)> = HashMap::new();
                for (grp, upto, blob) in store::all::<(i32, Option<i64>, Option<Vec<u8>>)>(res)? {
                    let blob = blob.unwrap_or_default();
                    let members = decode_group(&blob)
                        .into_iter()
                        .map(|(slug, counts)| (slug.to_owned(), DayCounts::decode(counts)))
                        .collect();
                    rows.insert(grp, (upto.unwrap_or(-1), members));
                }
                let found = grps
                    .into_iter()
                    .map(|grp| {
                        let (upto, members) = rows.remove(&grp).unwrap_or((-1, Vec::new()));
                        ((day, bucket, grp), upto, members)
                    })
                    .collect();
                Ok(Loaded::Groups(found))
            }
            Load::Minute(minute) => {
                let mut ids: Map<Uuid, i64> = Map::default();
                let mut page = scylla::response::PagingState::start();
                loop {
                    let (res, next) = session
                        .execute_single_page(&store.read_seen, (src, minute), page)
                        .await
                        .map_err(store::unavailable)?;
                    for (blob,) in store::all::<(Vec<u8>,)>(res)? {
                        for r in blob.chunks_exact(RECORD) {
                            let (id, offset) = r.split_at(16);
                            let id = Uuid::from_bytes(id.try_into().expect("16 bytes"));
                            let offset = i64::from_be_bytes(offset.try_into().expect("8 bytes"));
                            let o = ids.entry(id).or_insert(offset);
                            *o = (*o).min(offset);
                        }
                    }
                    match next.into_paging_control_flow() {
                        ControlFlow::Continue(p) => page = p,
                        ControlFlow::Break(()) => break,
                    }
                }
                Ok(Loaded::Minute(minute, ids))
            }
        }
    }
}
