//! `replicator reconcile`: compares every link in ScyllaDB with S3 and repairs the difference.
//!
//! Phase 1 walks the token ring in `splits` ranges, a page of 500 links at a time, and checks
//! each link's object (GET: body byte-for-byte against the rendered blob, and metadata), with
//! at most `concurrency` checks in flight. Phase 2 lists the bucket under the prefix, a page of
//! 1000 keys at a time, and flags blobs with no link and tombstones with no gone link. Memory is bounded by the page
//! sizes. Before a repair the link is re-read (SERIAL), so a link that changed meanwhile is
//! left to the replicator instead of being overwritten with what reconcile saw earlier. Every
//! repaired key is named in the change journal after its repair (see `journal`). Journal
//! objects are neither checked nor removed here (the replicator prunes them).

use crate::apply::{desired_for_link, Desired};
use crate::s3::{KeyKind, S3Error, S3Store};
use std::sync::Arc;
use tokio::sync::Semaphore;
use zlink_store::links::ScanPage;
use zlink_store::replicas::Replicas;
use zlink_store::{Db, Links, StoreError};
use zlink_wire::blob::{self, Blob};

#[derive(Debug, Clone, clap::Args)]
pub struct ReconcileArgs {
    /// Report drift without repairing; exit non-zero if there is any.
    #[arg(long)]
    pub dry_run: bool,
    /// Token ranges to walk the links table in.
    #[arg(long, default_value_t = 64)]
    pub splits: u32,
    /// Object checks in flight at once.
    #[arg(long, default_value_t = 16)]
    pub concurrency: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Drift {
    /// A live link without its blob, or a disabled/expired one without its tombstone.
    Missing,
    /// A blob or tombstone that is not what the link renders to.
    Stale,
    /// A blob with no live link (disabled, expired, unknown or foreign key), or a tombstone of a
    /// live or unknown link.
    Orphan,
}

#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Report {
    pub links: u64,
    pub objects: u64,
    pub missing: u64,
    pub stale: u64,
    pub orphans: u64,
    pub repaired: u64,
    /// Links that changed while reconcile looked at them (left to the replicator).
    pub changed: u64,
}

impl Report {
    pub fn drift(&self) -> u64 {
        self.missing + self.stale + self.orphans
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    S3(#[from] S3Error),
}

/// Whether the stored object is exactly what `want` renders to.
fn matches(obj: &crate::s3::StoredObject, want: &Blob) -> bool {
    if obj.body != blob::render(want).as_bytes() {
        return false;
    }
    let meta = blob::parse_metadata(|k| obj.metadata.get(k).map(String::as_str));
    matches!(meta, Ok(m) if m.code == want.code && m.version == want.version
        && m.expires_at_ms == want.expires_at_ms && m.url.as_deref().is_none_or(|u| u == want.url))
}

/// What reconcile reads and writes in the store: links (scanned, re-read serially) and the
/// replica versions it repairs.
pub struct ReconcileStore {
    pub links: Links,
    pub replicas: Replicas,
}

impl ReconcileStore {
    pub async fn prepare(db: Arc<Db>) -> Result<Self, StoreError> {
        Ok(ReconcileStore {
            links: Links::prepare(db.clone()).await?,
            replicas: Replicas::prepare(db).await?,
        })
    }
}

/// One comparison of a link or an object with what the store says, and its repair: what
/// `reconcile` does for every link and object once, and the audit (`crate::audit`) does all
/// the time, slice by slice.
pub struct Checker {
    pub store: Arc<ReconcileStore>,
    pub s3: Arc<S3Store>,
}

/// What a repair found when it came to act.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Repair {
    Done,
    /// The link changed since it was read (or the orphan got a link): left to the replicator,
    /// whose event for that change writes S3.
    Changed,
}

impl Checker {
    /// Whether S3 holds what `link` renders to; if not, the drift and which object drifted.
    pub async fn inspect_link(
        &self,
        link: &zlink_store::Link,
        now_ms: i64,
    ) -> Result<Option<(Drift, &'static str)>, S3Error> {
        let want = desired_for_link(link, now_ms);
        let have = self.s3.get(&link.key).await?;
        Ok(match (&want, &have) {
            (Desired::Blob(_), None) => Some((Drift::Missing, "blob")),
            (Desired::Blob(w), Some(obj)) if !matches(obj, w) => Some((Drift::Stale, "blob")),
            (Desired::Blob(_), Some(_)) => None,
            (Desired::Tombstone(_), Some(_)) => Some((Drift::Orphan, "blob")),
            (Desired::Tombstone(t), None) => match self.s3.get_tombstone(&link.key).await? {
                None => Some((Drift::Missing, "tombstone")),
                Some(have) if have != *t => Some((Drift::Stale, "tombstone")),
                Some(_) => None,
            },
        })
    }

    /// Whether a difference for `link` may be a change on its way rather than drift: the
    /// replicator has not recorded the link's current version and the link changed less than
    /// `grace_ms` ago (its event may still be in Kafka), or the link is active and expired
    /// less than [`EXPIRY_GRACE_MS`] ago (the expiry scheduler moves it; its blob carries the
    /// expiry, so no rung serves it meanwhile). `grace_ms` 0: never (reconcile's rule).
    pub async fn in_flight(
        &self,
        link: &zlink_store::Link,
        now_ms: i64,
        grace_ms: i64,
    ) -> Result<bool, StoreError> {
        if grace_ms <= 0 {
            return Ok(false);
        }
        let expired_at = link.expires_at_ms.filter(|e| *e <= now_ms);
        if link.status == zlink_wire::LinkStatus::Active
            && expired_at.is_some_and(|e| now_ms - e < EXPIRY_GRACE_MS)
        {
            return Ok(true);
        }
        if self.store.replicas.version(&link.key).await? >= link.version {
            return Ok(false); // the replicator wrote this very version: any difference is drift
        }
        let changed = self.store.links.changed_at_ms(&link.key).await?;
        Ok(changed.is_none_or(|t| now_ms - t < grace_ms))
    }

    /// Whether a listed object that does not belong may be a change on its way: a tombstone of
    /// a link re-enabled a moment ago (see [`Checker::in_flight`]).
    pub async fn orphan_in_flight(
        &self,
        key: &str,
        now_ms: i64,
        grace_ms: i64,
    ) -> Result<bool, StoreError> {
        let KeyKind::Tombstone(slug) = self.s3.kind_of(key) else {
            return Ok(false);
        };
        match self.store.links.get(slug).await? {
            Some(link) => self.in_flight(&link, now_ms, grace_ms).await,
            None => Ok(false),
        }
    }

    /// Writes what `link` renders to, unless the link changed since it was read (re-read
    /// SERIAL, so the repair never writes an older state over the replicator's newer one);
    /// names the key in the change journal and records the version.
    pub async fn repair_link(
        &self,
        link: &zlink_store::Link,
        now_ms: i64,
    ) -> Result<Repair, ReconcileError> {
        let fresh = self.store.links.get_serial(&link.key).await?;
        if fresh.as_ref() != Some(link) {
            return Ok(Repair::Changed);
        }
        match desired_for_link(link, now_ms) {
            Desired::Blob(b) => self.s3.put(&link.key, &b).await?,
            Desired::Tombstone(t) => {
                self.s3.put_tombstone(&link.key, &t).await?;
                self.s3.delete(&link.key).await?;
            }
        }
        self.journal(&link.key).await?;
        self.store
            .replicas
            .set_version(&link.key, link.version, false)
            .await?;
        Ok(Repair::Done)
    }

    /// Whether a listed object belongs: a blob of a known link (its content is the link
    /// check's business), a tombstone of a link that must not redirect, a journal object.
    /// `serial`: read the link linearizably (before removing an object, so a link created a
    /// moment ago on another replica is seen).
    pub async fn object_belongs(
        &self,
        key: &str,
        now_ms: i64,
        serial: bool,
    ) -> Result<bool, StoreError> {
        let get = |slug: &str| {
            let (links, slug) = (&self.store.links, slug.to_string());
            async move {
                if serial {
                    links.get_serial(&slug).await
                } else {
                    links.get(&slug).await
                }
            }
        };
        Ok(match self.s3.kind_of(key) {
            KeyKind::Blob(slug) => get(slug).await?.is_some(),
            KeyKind::Tombstone(slug) => get(slug)
                .await?
                .is_some_and(|l| matches!(desired_for_link(&l, now_ms), Desired::Tombstone(_))),
            KeyKind::Journal => true,
            KeyKind::Other => false,
        })
    }

    /// Removes an object that does not belong, once a linearizable read confirms it.
    pub async fn remove_orphan(&self, key: &str, now_ms: i64) -> Result<Repair, ReconcileError> {
        if self.object_belongs(key, now_ms, true).await? {
            return Ok(Repair::Changed);
        }
        self.s3.delete_key(key).await?;
        if let KeyKind::Blob(k) | KeyKind::Tombstone(k) = self.s3.kind_of(key) {
            self.journal(k).await?;
        }
        Ok(Repair::Done)
    }

    /// Names a repaired key in the change journal, so lastresort forgets what it held for it.
    /// (Repairs are rare: one journal object each.)
    async fn journal(&self, key: &str) -> Result<(), S3Error> {
        self.s3
            .put_journal(JOURNAL_WRITER, &[key.to_string()])
            .await
    }
}

struct Ctx {
    checker: Checker,
    dry_run: bool,
    now_ms: i64,
}

enum Checked {
    Ok,
    Drift(Drift, String),
    Repaired(Drift, String),
    Changed,
}

async fn check_link(ctx: &Ctx, link: zlink_store::Link) -> Result<Checked, ReconcileError> {
    let Some((drift, what)) = ctx.checker.inspect_link(&link, ctx.now_ms).await? else {
        return Ok(Checked::Ok);
    };
    let detail = format!("{what} version={} status={}", link.version, link.status);
    if ctx.dry_run {
        return Ok(Checked::Drift(drift, detail));
    }
    Ok(match ctx.checker.repair_link(&link, ctx.now_ms).await? {
        Repair::Done => Checked::Repaired(drift, detail),
        Repair::Changed => Checked::Changed,
    })
}

/// How long after its expiry an active link may still have its blob: the expiry scheduler
/// runs every second under its lease, so minutes mean it is not running.
pub const EXPIRY_GRACE_MS: i64 = 300_000;

/// Reconcile's name in journal keys.
const JOURNAL_WRITER: &str = "reconcile";

pub fn label(d: Drift) -> &'static str {
    match d {
        Drift::Missing => "missing",
        Drift::Stale => "stale",
        Drift::Orphan => "orphan",
    }
}

fn count(report: &mut Report, d: Drift) {
    match d {
        Drift::Missing => report.missing += 1,
        Drift::Stale => report.stale += 1,
        Drift::Orphan => report.orphans += 1,
    }
}

/// The `i`th of `n` token ranges of the ring, inclusive at both ends.
pub fn token_range(i: u32, n: u32) -> (i64, i64) {
    let (i, n) = (i128::from(i), i128::from(n.max(1)));
    let span = (i128::from(i64::MAX) - i128::from(i64::MIN) + 1) / n;
    let from = (i128::from(i64::MIN) + i * span) as i64;
    let to = if i >= n - 1 {
        i64::MAX
    } else {
        (i128::from(i64::MIN) + (i + 1) * span - 1) as i64
    };
    (from, to)
}

/// Runs both phases; drift lines go to `emit` as they are found.
pub async fn reconcile(
    store: Arc<ReconcileStore>,
    s3: Arc<S3Store>,
    args: &ReconcileArgs,
    now_ms: i64,
    mut emit: impl FnMut(&str),
) -> Result<Report, ReconcileError> {
    let ctx = Arc::new(Ctx {
        checker: Checker { store, s3 },
        dry_run: args.dry_run,
        now_ms,
    });
    let mut report = Report::default();
    let limit = Arc::new(Semaphore::new(args.concurrency.max(1)));

    // Phase 1: every link, token range by token range.
    let splits = args.splits.max(1);
    for i in 0..splits {
        let (from, to) = token_range(i, splits);
        let mut page = ScanPage::start();
        loop {
            let (links, next) = ctx.checker.store.links.scan(from, to, page).await?;
            let mut checks = tokio::task::JoinSet::new();
            for link in links {
                report.links += 1;
                let (ctx, permit) = (
                    ctx.clone(),
                    limit.clone().acquire_owned().await.expect("semaphore open"),
                );
                checks.spawn(async move {
                    let slug = link.key.clone();
                    let r = check_link(&ctx, link).await;
                    drop(permit);
                    (slug, r)
                });
            }
            while let Some(done) = checks.join_next().await {
                let (slug, result) = done.expect("check task does not panic");
                match result? {
                    Checked::Ok => {}
                    Checked::Changed => report.changed += 1,
                    Checked::Drift(d, detail) => {
                        count(&mut report, d);
                        emit(&format!("{}\t{slug}\t{detail}", label(d)));
                    }
                    Checked::Repaired(d, detail) => {
                        count(&mut report, d);
                        report.repaired += 1;
                        emit(&format!("{}\t{slug}\t{detail}\trepaired", label(d)));
                    }
                }
            }
            match next {
                Some(p) => page = p,
                None => break,
            }
        }
    }

    // Phase 2: objects whose key names no link at all (links were checked in phase 1).
    let mut token = None;
    loop {
        let (keys, next) = ctx.checker.s3.list_page(token).await?;
        for key in keys {
            report.objects += 1;
            // Blobs of known links were checked in phase 1; a tombstone belongs only to a
            // link that must not redirect.
            if ctx.checker.object_belongs(&key, now_ms, false).await? {
                continue;
            }
            let shown = key.escape_debug().to_string();
            if ctx.dry_run {
                report.orphans += 1;
                emit(&format!("orphan\t{shown}\tno such link"));
            } else if ctx.checker.remove_orphan(&key, now_ms).await? == Repair::Done {
                report.orphans += 1;
                report.repaired += 1;
                emit(&format!("orphan\t{shown}\tno such link\trepaired"));
            } else {
                report.changed += 1;
            }
        }
        match next {
            Some(t) => token = Some(t),
            None => break,
        }
    }
    Ok(report)
}
