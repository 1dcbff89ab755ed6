//! The continuous store ↔ S3 audit: `reconcile`, run all the time in bounded slices by one
//! replicator (the holder of the `s3_audit` lease), plus a read-back of every object a
//! replicator writes, a little after writing it.
//!
//! - **Sweep.** The token ring is cut into `--audit-slices` ranges; one is checked every
//!   `--audit-period-secs / --audit-slices`, so every link is compared with its object at
//!   least once a period (default a day). The next range is a durable cursor (`cursors`
//!   row `s3_audit`): a restart or a new lease holder goes on where the last one stopped. A
//!   range whose checks could not all be made (store or S3 failing) is checked again, so a
//!   pass never skips a link. Alongside, the bucket is listed at the pace that lists it once
//!   per pass (pages per slice from the last pass's size), and every object that names no
//!   link, or a tombstone of a live link, is an orphan.
//! - **Read-back.** Each object the applier wrote is read again `--audit-recheck-secs` later
//!   (a bounded queue, per replicator): an S3 that acknowledged a write and lost it (the
//!   local SeaweedFS did, on SIGKILL) is found within minutes, not at the next pass.
//! - **Repair** is `reconcile`'s (`reconcile::Checker`): the store is the truth; the link is
//!   re-read SERIAL first and a link that changed meanwhile is left to its own event; an
//!   orphan is removed only when a SERIAL read confirms there is no link for it; each repair
//!   is named in the change journal. A repair that fails stays outstanding and is retried
//!   every few seconds until it succeeds or the drift is gone.
//! - **Gauges.** `audit_drift{kind}`: drift found and not repaired yet (missing, stale,
//!   orphan); `audit_drift_found_total` and `audit_repaired_total` count what was found and
//!   fixed, so drift repaired at once still shows (something outside zlink writes the bucket,
//!   or S3 loses writes).

use crate::metrics::Metrics;
use crate::rechecks::Rechecks;
use crate::reconcile::{label, token_range, Checker, Drift, ReconcileError, Repair};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use zlink_clients::clock::Clock;
use zlink_store::coord::{Cursors, Leases};
use zlink_store::links::ScanPage;
use zlink_store::Link;

/// The defaults of [`AuditArgs`], for the command line and [`Default`] alike.
const DEFAULT_PERIOD_SECS: u64 = 86_400;
const DEFAULT_SLICES: u32 = 1024;
const DEFAULT_RECHECK_SECS: u64 = 120;
const DEFAULT_CONCURRENCY: u16 = 8;

#[derive(Debug, Clone, clap::Args)]
pub struct AuditArgs {
    /// One pass over every link and every object takes this long, in seconds (0: no sweep).
    #[arg(
        long = "audit-period-secs",
        env = "ZLINK_AUDIT_PERIOD_SECS",
        default_value_t = DEFAULT_PERIOD_SECS
    )]
    pub period_secs: u64,
    /// Token ranges a pass is cut into; one is checked every period / slices.
    #[arg(long = "audit-slices", env = "ZLINK_AUDIT_SLICES", default_value_t = DEFAULT_SLICES,
          value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub slices: u32,
    /// Every object this replicator writes is read back this long after, in seconds (0: no
    /// read-back).
    #[arg(
        long = "audit-recheck-secs",
        env = "ZLINK_AUDIT_RECHECK_SECS",
        default_value_t = DEFAULT_RECHECK_SECS
    )]
    pub recheck_secs: u64,
    /// Object checks in flight at once.
    #[arg(long = "audit-concurrency", env = "ZLINK_AUDIT_CONCURRENCY", default_value_t = DEFAULT_CONCURRENCY,
          value_parser = clap::value_parser!(u16).range(1..=256))]
    pub concurrency: u16,
}

impl Default for AuditArgs {
    fn default() -> Self {
        AuditArgs {
            period_secs: DEFAULT_PERIOD_SECS,
            slices: DEFAULT_SLICES,
            recheck_secs: DEFAULT_RECHECK_SECS,
            concurrency: DEFAULT_CONCURRENCY,
        }
    }
}

/// The lease one replicator holds while it sweeps, and the cursor of the sweep.
const LEASE: &str = "s3_audit";
const CURSOR: &str = "s3_audit";
const LEASE_TTL_S: i32 = 30;
const LEASE_EVERY: Duration = Duration::from_secs(10);
/// How often outstanding repairs are tried again.
const RETRY_EVERY: Duration = Duration::from_secs(5);
/// Outstanding repairs held; beyond this new drift is counted but left to the next pass.
const OUTSTANDING_CAP: usize = 10_000;
/// Read-backs per second at most (a replicator applies far fewer writes a second).
const READ_BACKS_PER_TICK: usize = 4096;
/// A difference on a link the replicator has not applied yet, changed less than this ago, is
/// a change on its way (replication's budget is 5 s; its lag alerts fire within minutes).
const IN_FLIGHT_GRACE_MS: i64 = 120_000;

/// What an outstanding repair is about.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Target {
    /// A link whose object(s) must be rewritten.
    Link(String),
    /// A listed object that belongs to no link.
    Object(String),
}

/// Where the listing side of the pass is.
#[derive(Default)]
struct Listing {
    token: Option<String>,
    /// Pages listed in this pass so far, and in the last whole pass.
    pages: u64,
    last_pass_pages: u64,
    /// The pass is over; the next starts with the next pass of the links.
    done: bool,
}

pub struct Audit {
    checker: Checker,
    leases: Leases,
    cursors: Cursors,
    metrics: Arc<Metrics>,
    clock: Arc<dyn Clock>,
    args: AuditArgs,
    holder: String,
    pub rechecks: Arc<Rechecks>,
    outstanding: Mutex<HashMap<Target, Drift>>,
    /// Whether this replicator held the lease at its last renewal, and when that was.
    lease: tokio::sync::Mutex<(bool, Option<Instant>)>,
}

/// The result of checking one link or object.
enum Seen {
    Fine,
    /// Drift found and repaired (or left to the replicator because the link changed).
    Fixed,
    /// Drift found, repair failed: outstanding.
    Outstanding,
    /// The check itself could not be made.
    Failed,
}

impl Audit {
    pub fn new(
        checker: Checker,
        leases: Leases,
        cursors: Cursors,
        metrics: Arc<Metrics>,
        clock: Arc<dyn Clock>,
        args: AuditArgs,
        rechecks: Arc<Rechecks>,
    ) -> Self {
        let holder = format!(
            "{}-{}-{}",
            std::env::var("HOSTNAME").unwrap_or_else(|_| "replicator".into()),
            std::process::id(),
            clock.now_ms()
        );
        Audit {
            checker,
            leases,
            cursors,
            metrics,
            clock,
            args,
            holder,
            rechecks,
            outstanding: Mutex::new(HashMap::new()),
            lease: tokio::sync::Mutex::new((false, None)),
        }
    }

    /// Read-backs, retries and (while this replicator holds the lease) the sweep, until
    /// `shutdown`.
    pub async fn run(self: Arc<Self>, shutdown: CancellationToken) {
        let sweeping = self.args.period_secs > 0;
        let slice_every = Duration::from_millis(
            (self.args.period_secs.saturating_mul(1000) / u64::from(self.args.slices.max(1)))
                .max(1000),
        );
        let start = Instant::now();
        let (mut next_slice, mut next_retry) = (start, start);
        let mut listing = Listing::default();
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => break,
                _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            }
            self.read_back().await;
            let now = Instant::now();
            if now >= next_retry {
                self.retry_outstanding().await;
                next_retry = now + RETRY_EVERY;
            }
            if sweeping && self.keep_lease().await && now >= next_slice {
                self.slice(&mut listing).await;
                next_slice = (next_slice + slice_every).max(Instant::now());
            }
        }
        self.metrics.audit_leader.set(0);
    }

    /// Whether this replicator holds the sweep's lease, renewing it (or trying to take it)
    /// when the last renewal is [`LEASE_EVERY`] old: called between pages too, so a long
    /// slice does not outlive its lease.
    async fn keep_lease(&self) -> bool {
        let mut lease = self.lease.lock().await;
        if lease.1.is_some_and(|at| at.elapsed() < LEASE_EVERY) {
            return lease.0;
        }
        let held = match self.leases.lease(LEASE, &self.holder, LEASE_TTL_S).await {
            Ok(held) => held,
            Err(e) => {
                tracing::warn!(error = %e, "audit lease unavailable");
                false
            }
        };
        *lease = (held, Some(Instant::now()));
        self.metrics.audit_leader.set(i64::from(held));
        held
    }

    /// Checks the next token range of the pass (and its share of the listing); advances the
    /// cursor only when every check in it was made.
    async fn slice(&self, listing: &mut Listing) {
        let slices = self.args.slices.max(1);
        let position = match self.cursors.get(CURSOR, i64::MIN).await {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!(error = %e, "audit cursor unavailable");
                self.metrics.audit_failures.inc();
                return;
            }
        };
        let index = slice_of(position, slices);
        let (from, to) = token_range(index, slices);
        let links_ok = self.sweep_links(from, to).await;
        let objects_ok = self.sweep_objects(listing, slices).await;
        if !(links_ok && objects_ok) {
            self.metrics.audit_failures.inc();
            return;
        }
        let next = if index + 1 >= slices {
            self.metrics
                .audit_passes
                .with_label_values(&["links"])
                .inc();
            if listing.done {
                *listing = Listing {
                    last_pass_pages: listing.last_pass_pages,
                    ..Listing::default()
                };
            }
            0
        } else {
            index + 1
        };
        if let Err(e) = self.cursors.set(CURSOR, token_range(next, slices).0).await {
            tracing::warn!(error = %e, "audit cursor not saved");
            return;
        }
        self.metrics.audit_slices.inc();
        self.metrics
            .audit_position
            .set(f64::from(next) / f64::from(slices));
    }

    /// Every link of the range against its object. False if any check could not be made.
    async fn sweep_links(&self, from: i64, to: i64) -> bool {
        let mut page = ScanPage::start();
        let mut ok = true;
        loop {
            let (links, next) = match self.checker.store.links.scan(from, to, page).await {
                Ok(r) => r,
                Err(e) => {
                    tracing::warn!(error = %e, "audit: link scan failed");
                    return false;
                }
            };
            let now_ms = self.clock.now_ms();
            let checks = links
                .into_iter()
                .map(|l| self.check_link(l, now_ms, "sweep"));
            ok &= self.all(checks).await;
            match next {
                Some(p) => page = p,
                None => return ok,
            }
        }
    }

    /// This slice's share of the listing: every object naming no link is an orphan.
    async fn sweep_objects(&self, listing: &mut Listing, slices: u32) -> bool {
        if listing.done {
            return true;
        }
        let pages = listing.last_pass_pages.div_ceil(u64::from(slices)).max(1);
        for _ in 0..pages {
            let (keys, next) = match self.checker.s3.list_page(listing.token.clone()).await {
                Ok(r) => r,
                Err(e) => {
                    tracing::warn!(error = %e, "audit: listing failed");
                    return false;
                }
            };
            let now_ms = self.clock.now_ms();
            let checks = keys.into_iter().map(|k| self.check_object(k, now_ms));
            if !self.all(checks).await {
                return false; // the same page again next time
            }
            listing.pages += 1;
            listing.token = next;
            if listing.token.is_none() {
                listing.last_pass_pages = listing.pages.max(1);
                listing.done = true;
                self.metrics
                    .audit_passes
                    .with_label_values(&["objects"])
                    .inc();
                return true;
            }
        }
        true
    }

    /// Runs `checks` with at most `--audit-concurrency` in flight; true if each was made.
    async fn all(
        &self,
        checks: impl Iterator<Item = impl std::future::Future<Output = Seen>>,
    ) -> bool {
        use futures_util::StreamExt;
        futures_util::stream::iter(checks)
            .buffer_unordered(usize::from(self.args.concurrency.max(1)))
            .fold(true, |ok, seen| async move {
                ok && !matches!(seen, Seen::Failed)
            })
            .await
    }

    async fn check_link(&self, link: Link, now_ms: i64, source: &str) -> Seen {
        self.metrics
            .audit_checked
            .with_label_values(&[source])
            .inc();
        let drift = match self.checker.inspect_link(&link, now_ms).await {
            Ok(None) => return Seen::Fine,
            Ok(Some((drift, _))) => drift,
            Err(e) => {
                tracing::debug!(key = %link.key.escape_debug(), error = %e, "audit: object unreadable");
                return Seen::Failed;
            }
        };
        // A read-back compares the version it wrote; the sweep may meet a change on its way.
        let grace = if source == "recheck" {
            0
        } else {
            IN_FLIGHT_GRACE_MS
        };
        match self.checker.in_flight(&link, now_ms, grace).await {
            Ok(false) => {}
            Ok(true) => return Seen::Fine,
            Err(_) => return Seen::Failed,
        }
        let result = self.checker.repair_link(&link, now_ms).await;
        self.settle(Target::Link(link.key.to_string()), drift, &link.key, result)
    }

    async fn check_object(&self, key: String, now_ms: i64) -> Seen {
        self.metrics
            .audit_checked
            .with_label_values(&["listing"])
            .inc();
        match self.checker.object_belongs(&key, now_ms, false).await {
            Ok(true) => return Seen::Fine,
            Ok(false) => {}
            Err(e) => {
                tracing::debug!(error = %e, "audit: link of a listed object unreadable");
                return Seen::Failed;
            }
        }
        match self
            .checker
            .orphan_in_flight(&key, now_ms, IN_FLIGHT_GRACE_MS)
            .await
        {
            Ok(false) => {}
            Ok(true) => return Seen::Fine,
            Err(_) => return Seen::Failed,
        }
        let result = self.checker.remove_orphan(&key, now_ms).await;
        self.settle(Target::Object(key.clone()), Drift::Orphan, &key, result)
    }

    /// Records a repair's outcome: done, left to the replicator (the link changed: no drift
    /// after all), or outstanding. Drift is counted as found once, when first repaired or
    /// first failing to be.
    fn settle(
        &self,
        target: Target,
        drift: Drift,
        key: &str,
        result: Result<Repair, ReconcileError>,
    ) -> Seen {
        let mut outstanding = self.outstanding.lock().expect("outstanding");
        let known = outstanding.contains_key(&target);
        let found = |what: &str| {
            if !known {
                self.metrics
                    .audit_found
                    .with_label_values(&[label(drift)])
                    .inc();
                tracing::warn!(key = %key.escape_debug(), drift = label(drift), what, "audit: S3 differed from the store");
            }
        };
        let seen = match result {
            Ok(Repair::Done) => {
                found("repaired");
                self.metrics
                    .audit_repaired
                    .with_label_values(&[label(drift)])
                    .inc();
                outstanding.remove(&target);
                Seen::Fixed
            }
            Ok(Repair::Changed) => {
                outstanding.remove(&target);
                Seen::Fixed
            }
            Err(e) => {
                found("repair failed");
                tracing::warn!(error = %e, drift = label(drift), "audit: repair failed; retrying");
                if outstanding.len() < OUTSTANDING_CAP || outstanding.contains_key(&target) {
                    outstanding.insert(target, drift);
                }
                Seen::Outstanding
            }
        };
        self.set_drift_gauges(&outstanding);
        seen
    }

    fn set_drift_gauges(&self, outstanding: &HashMap<Target, Drift>) {
        for d in [Drift::Missing, Drift::Stale, Drift::Orphan] {
            let n = outstanding.values().filter(|v| **v == d).count();
            self.metrics
                .audit_drift
                .with_label_values(&[label(d)])
                .set(n as i64);
        }
    }

    /// The objects written `--audit-recheck-secs` ago, read back (at most
    /// [`READ_BACKS_PER_TICK`] a second: the rest wait, the lease and the sweep go on).
    async fn read_back(&self) {
        for _ in 0..READ_BACKS_PER_TICK / 256 {
            let due = self.rechecks.due(self.clock.now_ms(), 256);
            if due.is_empty() {
                return;
            }
            let checks = due.into_iter().map(|(key, written)| async move {
                match self.checker.store.links.get(&key).await {
                    // The version written is still the link's: S3 must hold exactly it.
                    Ok(Some(link)) if link.version == written => {
                        self.check_link(link, self.clock.now_ms(), "recheck").await
                    }
                    // Changed since (its own event is read back) or gone: nothing to compare.
                    Ok(_) => Seen::Fine,
                    Err(_) => Seen::Failed,
                }
            });
            if !self.all(checks).await {
                self.metrics.audit_failures.inc();
            }
        }
    }

    /// Each outstanding repair tried again: the drift may be gone, repaired, or still there.
    async fn retry_outstanding(&self) {
        let targets: Vec<(Target, Drift)> = {
            let o = self.outstanding.lock().expect("outstanding");
            o.iter().map(|(t, d)| (t.clone(), *d)).collect()
        };
        for (target, drift) in targets {
            let now_ms = self.clock.now_ms();
            let result = match &target {
                Target::Link(key) => match self.checker.store.links.get(key).await {
                    Ok(None) => Ok(Repair::Changed),
                    Ok(Some(link)) => match self.checker.inspect_link(&link, now_ms).await {
                        Ok(None) => Ok(Repair::Changed),
                        Ok(Some(_)) => self.checker.repair_link(&link, now_ms).await,
                        Err(e) => Err(e.into()),
                    },
                    Err(e) => Err(e.into()),
                },
                Target::Object(key) => self.checker.remove_orphan(key, now_ms).await,
            };
            let key = match &target {
                Target::Link(k) | Target::Object(k) => k.clone(),
            };
            if let Seen::Outstanding = self.settle(target, drift, &key, result) {
                return; // still failing: the rest wait for the next round
            }
        }
    }
}

/// The slice of `slices` whose range holds `token`.
fn slice_of(token: i64, slices: u32) -> u32 {
    let n = i128::from(slices.max(1));
    let span = (i128::from(i64::MAX) - i128::from(i64::MIN) + 1) / n;
    let i = (i128::from(token) - i128::from(i64::MIN)) / span;
    i.clamp(0, n - 1) as u32
}

#[cfg(test)]
mod tests;
