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

struct Ctx {
    store: Arc<ReconcileStore>,
    s3: Arc<S3Store>,
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
    let want = desired_for_link(&link, ctx.now_ms);
    let have = ctx.s3.get(&link.key).await?;
    let (drift, what) = match (&want, &have) {
        (Desired::Blob(_), None) => (Drift::Missing, "blob"),
        (Desired::Blob(w), Some(obj)) if !matches(obj, w) => (Drift::Stale, "blob"),
        (Desired::Blob(_), Some(_)) => return Ok(Checked::Ok),
        (Desired::Tombstone(_), Some(_)) => (Drift::Orphan, "blob"),
        (Desired::Tombstone(t), None) => match ctx.s3.get_tombstone(&link.key).await? {
            None => (Drift::Missing, "tombstone"),
            Some(have) if have != *t => (Drift::Stale, "tombstone"),
            Some(_) => return Ok(Checked::Ok),
        },
    };
    let detail = format!("{what} version={} status={}", link.version, link.status);
    if ctx.dry_run {
        return Ok(Checked::Drift(drift, detail));
    }
    let fresh = ctx.store.links.get_serial(&link.key).await?;
    if fresh.as_ref() != Some(&link) {
        return Ok(Checked::Changed);
    }
    match want {
        Desired::Blob(b) => ctx.s3.put(&link.key, &b).await?,
        Desired::Tombstone(t) => {
            ctx.s3.put_tombstone(&link.key, &t).await?;
            ctx.s3.delete(&link.key).await?;
        }
    }
    journal(ctx, &link.key).await?;
    ctx.store
        .replicas
        .set_version(&link.key, link.version, false)
        .await?;
    Ok(Checked::Repaired(drift, detail))
}

/// Names a repaired key in the change journal, so lastresort forgets what it held for it.
/// (Repairs are rare: one journal object each.)
async fn journal(ctx: &Ctx, key: &str) -> Result<(), S3Error> {
    ctx.s3.put_journal(JOURNAL_WRITER, &[key.to_string()]).await
}

/// Reconcile's name in journal keys.
const JOURNAL_WRITER: &str = "reconcile";

fn label(d: Drift) -> &'static str {
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

/// Runs both phases; drift lines go to `emit` as they are found.
pub async fn reconcile(
    store: Arc<ReconcileStore>,
    s3: Arc<S3Store>,
    args: &ReconcileArgs,
    now_ms: i64,
    mut emit: impl FnMut(&str),
) -> Result<Report, ReconcileError> {
    let ctx = Arc::new(Ctx {
        store,
        s3,
        dry_run: args.dry_run,
        now_ms,
    });
    let mut report = Report::default();
    let limit = Arc::new(Semaphore::new(args.concurrency.max(1)));

    // Phase 1: every link, token range by token range.
    let splits = i128::from(args.splits.max(1));
    let span = (i128::from(i64::MAX) - i128::from(i64::MIN) + 1) / splits;
    for i in 0..splits {
        let from = (i128::from(i64::MIN) + i * span) as i64;
        let to = if i == splits - 1 {
            i64::MAX
        } else {
            (i128::from(i64::MIN) + (i + 1) * span - 1) as i64
        };
        let mut page = ScanPage::start();
        loop {
            let (links, next) = ctx.store.links.scan(from, to, page).await?;
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
        let (keys, next) = ctx.s3.list_page(token).await?;
        for key in keys {
            report.objects += 1;
            // Blobs of known links were checked in phase 1; a tombstone belongs only to a
            // link that must not redirect.
            let known =
                match ctx.s3.kind_of(&key) {
                    KeyKind::Blob(slug) => ctx.store.links.get(slug).await?.is_some(),
                    KeyKind::Tombstone(slug) => ctx.store.links.get(slug).await?.is_some_and(|l| {
                        matches!(desired_for_link(&l, now_ms), Desired::Tombstone(_))
                    }),
                    KeyKind::Journal => true,
                    KeyKind::Other => false,
                };
            if known {
                continue;
            }
            report.orphans += 1;
            let shown = key.escape_debug().to_string();
            if ctx.dry_run {
                emit(&format!("orphan\t{shown}\tno such link"));
            } else {
                ctx.s3.delete_key(&key).await?;
                if let KeyKind::Blob(k) | KeyKind::Tombstone(k) = ctx.s3.kind_of(&key) {
                    journal(&ctx, k).await?;
                }
                report.repaired += 1;
                emit(&format!("orphan\t{shown}\tno such link\trepaired"));
            }
        }
        match next {
            Some(t) => token = Some(t),
            None => break,
        }
    }
    Ok(report)
}
