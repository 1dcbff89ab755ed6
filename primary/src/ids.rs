//! Auto-slug IDs: blocks leased from the shared counter with one compare-and-set, then handed
//! out from memory. Instances never coordinate per request; a create pays the LWT only when its
//! instance's block runs out (once every `block_size` creates). IDs of a block that is never
//! used up (instance restart) are simply skipped: the space is 62^7.

use crate::store::Store;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::Mutex;
use zlink_store::StoreError;

const COUNTER: &str = "auto";

pub struct IdAllocator {
    store: Arc<Store>,
    block_size: u64,
    current: Mutex<Range<u64>>,
}

impl IdAllocator {
    pub fn new(store: Arc<Store>, block_size: u64) -> Self {
        Self {
            store,
            block_size,
            current: Mutex::new(0..0),
        }
    }

    pub async fn next_id(&self) -> Result<u64, StoreError> {
        let mut cur = self.current.lock().await;
        if cur.is_empty() {
            *cur = self.store.ids.lease(COUNTER, self.block_size).await?;
        }
        let id = cur.start;
        cur.start += 1;
        Ok(id)
    }

    /// `n` consecutive IDs of their own (a bulk create's, so that its retries find them again).
    pub async fn lease_block(&self, n: u64) -> Result<Range<u64>, StoreError> {
        self.store.ids.lease(COUNTER, n).await
    }
}

/// Which auto-slug IDs have been handed out, so that a scan of random auto-shaped slugs is
/// answered 404 without a store read per slug: an auto slug decodes to its ID, and an ID at
/// or past the counter's high-water mark cannot belong to any link (custom slugs never have
/// the auto shape). The mark only grows. A slug past the mark this process knows triggers
/// one re-read of the counter, unless a re-read that started after the request arrived has
/// already answered: re-reads run one at a time, so a scan costs at most one store read in
/// flight per primary instead of one per request, and a link created a moment ago on another
/// primary (its block leased before its create answered) is never refused.
pub struct IssuedIds {
    store: Arc<Store>,
    mark: AtomicU64,
    /// When the latest re-read started.
    reread: Mutex<Option<Instant>>,
}

impl IssuedIds {
    pub fn new(store: Arc<Store>) -> Self {
        Self {
            store,
            mark: AtomicU64::new(0),
            reread: Mutex::new(None),
        }
    }

    /// Whether `id` was handed out by the mark known here (no store read): the hot path's
    /// answer for nearly every real slug; [`Self::may_exist`] when it says no.
    pub fn known_issued(&self, id: u64) -> bool {
        id < self.mark.load(Ordering::Acquire)
    }

    /// Whether `id` may have been handed out. Errors only when the counter had to be re-read
    /// and the store failed.
    pub async fn may_exist(&self, id: u64) -> Result<bool, StoreError> {
        if self.known_issued(id) {
            return Ok(true);
        }
        let arrived = Instant::now();
        let mut last = self.reread.lock().await;
        if last.is_none_or(|started| started < arrived) {
            *last = Some(Instant::now());
            let leased = self.store.ids.leased(COUNTER).await?;
            self.mark.fetch_max(leased, Ordering::AcqRel);
        }
        Ok(id < self.mark.load(Ordering::Acquire))
    }
}
