//! Reads the change journal the replicator writes to S3 (`<prefix>.journal/`, see
//! [`zlink_wire::blob::JOURNAL_DIR`]) and forgets every key it lists, here and in this host's
//! memcached, so [`crate::lookup`] may keep what S3 said for long. Still S3 alone: nothing but
//! S3 tells this tier what changed.
//!
//! Every `--journal-poll-ms` it lists the objects written in the last [`WINDOW_MS`] (by the
//! writers' clocks) and reads those it has not read yet: an object whose write took a while to
//! show up in a listing is still found. Each key is forgotten three times, at the poll that
//! found it and the two after: a load that read S3 just before the change and finished just
//! after the first forget (a load takes at most `--s3-budget-ms`) is forgotten by a later one.
//! After 3 polls in a row that failed, the lookup stops trusting the journal (and forgets every
//! answer that relied on it) until a poll succeeds again.

use crate::http::State;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// How far back (writers' clocks, milliseconds) each poll lists the journal.
pub const WINDOW_MS: i64 = 10_000;
/// How far back the first listing reaches (this process's clock, so a writer whose clock is
/// behind is still found), milliseconds. That first poll reads what it lists (a few hundred
/// GETs at most, once per start) although this process has cached nothing yet: the host's
/// memcached outlives it, and may hold answers that changed while no lastresort here was
/// reading the journal.
pub const FIRST_LOOKBACK_MS: i64 = 60_000;
/// Journal objects read per poll at most (a backlog is read over several polls).
const MAX_PER_POLL: usize = 500;
/// Polls a key is forgotten at: the one that found it and the ones after.
const FORGET_ROUNDS: usize = 3;
/// Failed polls in a row after which the journal is no longer trusted.
const UNTRUSTED_AFTER: u32 = 3;

/// What one poll found.
#[derive(Default)]
struct Found {
    /// Names read (now seen) with their write times.
    read: Vec<(String, i64)>,
    keys: BTreeSet<String>,
    /// Every listed object was read.
    complete: bool,
}

pub struct Reader {
    seen: BTreeMap<String, i64>,
    /// The newest write time seen (writers' clocks, assumed within [`WINDOW_MS`] of each
    /// other); until one is seen, listings start [`FIRST_LOOKBACK_MS`] before this process's
    /// start.
    newest_ms: Option<i64>,
    started_ms: i64,
    recent: VecDeque<BTreeSet<String>>,
    failures: u32,
}

impl Reader {
    pub fn new(now_ms: i64) -> Self {
        Reader {
            seen: BTreeMap::new(),
            newest_ms: None,
            started_ms: now_ms,
            recent: VecDeque::new(),
            failures: 0,
        }
    }

    /// Polls until `shutdown`.
    pub async fn run(mut self, state: Arc<State>, poll: Duration, shutdown: CancellationToken) {
        loop {
            let started = Instant::now();
            self.poll_once(&state).await;
            let wait = poll.saturating_sub(started.elapsed());
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(wait) => {}
            }
        }
    }

    async fn poll_once(&mut self, state: &State) {
        let m = &state.metrics;
        let after = match self.newest_ms {
            Some(t) => t - WINDOW_MS,
            None => self.started_ms - FIRST_LOOKBACK_MS,
        };
        let found = list_and_read(state, after, &self.seen).await;
        for (name, t) in &found.read {
            self.seen.insert(name.clone(), *t);
            self.newest_ms = Some(self.newest_ms.map_or(*t, |n| n.max(*t)));
        }
        if let Some(newest) = self.newest_ms {
            self.seen.retain(|_, t| *t >= newest - WINDOW_MS);
        }
        // Forget what this poll found and what the two before it found.
        self.recent.push_front(found.keys);
        self.recent.truncate(FORGET_ROUNDS);
        let keys: BTreeSet<&String> = self.recent.iter().flatten().collect();
        for k in &keys {
            state.lookup.forget(k).await;
        }
        m.journal_forgets.inc_by(keys.len() as u64);
        if found.complete {
            m.journal_polls.with_label_values(&["ok"]).inc();
            self.failures = 0;
            state.lookup.trust_journal(true);
            m.journal_trusted.set(1);
        } else {
            m.journal_polls.with_label_values(&["error"]).inc();
            self.failures += 1;
            if self.failures >= UNTRUSTED_AFTER {
                state.lookup.trust_journal(false);
                m.journal_trusted.set(0);
            }
        }
    }
}

/// Lists the journal written after `after_ms` and reads the objects not in `seen`, within the
/// S3 budget per request; stops at the first failure.
async fn list_and_read(state: &State, after_ms: i64, seen: &BTreeMap<String, i64>) -> Found {
    let s3 = state.lookup.s3();
    let budget = state.lookup.s3_budget() * 2;
    let mut found = Found::default();
    let names = match tokio::time::timeout(budget, s3.list_journal(after_ms, 10_000)).await {
        Ok(Ok(n)) => n,
        Ok(Err(e)) => {
            tracing::debug!(error = %e, "journal listing failed");
            return found;
        }
        Err(_) => {
            tracing::debug!("journal listing timed out");
            return found;
        }
    };
    let mut unread = names.into_iter().filter_map(|n| {
        let t = zlink_wire::blob::journal_time(&n)?;
        (!seen.contains_key(&n)).then_some((n, t))
    });
    for (name, t) in unread.by_ref().take(MAX_PER_POLL) {
        match tokio::time::timeout(budget, s3.get_journal(&name)).await {
            // Pruned meanwhile: nothing to read.
            Ok(Ok(keys)) => found.keys.extend(keys.unwrap_or_default()),
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "journal object read failed");
                return found;
            }
            Err(_) => return found,
        }
        found.read.push((name, t));
    }
    found.complete = unread.next().is_none();
    found
}
