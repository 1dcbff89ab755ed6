//! Auto-slug IDs: blocks leased from the shared counter with one compare-and-set, then handed
//! out from memory. Instances never coordinate per request; a create pays the LWT only when its
//! instance's block runs out (once every `block_size` creates). IDs of a block that is never
//! used up (instance restart) are simply skipped: the space is 62^7.

use crate::store::{Store, StoreError};
use std::ops::Range;
use std::sync::Arc;
use tokio::sync::Mutex;

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
            *cur = self.store.lease_ids(COUNTER, self.block_size).await?;
        }
        let id = cur.start;
        cur.start += 1;
        Ok(id)
    }
}
