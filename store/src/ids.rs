//! `id_blocks`: shared counters from which each primary leases blocks of IDs for auto slugs,
//! with compare-and-set, so no two instances ever issue the same ID.

use crate::db::{applied, first, Db, StoreError};
use scylla::statement::prepared::PreparedStatement;
use std::sync::Arc;

pub struct IdBlocks {
    db: Arc<Db>,
    get_serial: PreparedStatement,
    get: PreparedStatement,
    init: PreparedStatement,
    cas: PreparedStatement,
}

impl IdBlocks {
    pub async fn prepare(db: Arc<Db>) -> Result<Self, StoreError> {
        let select = "SELECT next_id FROM id_blocks WHERE name = ?";
        Ok(IdBlocks {
            get_serial: db.prepare(select, true, true).await?,
            get: db.prepare(select, true, false).await?,
            init: db
                .prepare(
                    "INSERT INTO id_blocks (name, next_id) VALUES (?, ?) IF NOT EXISTS",
                    // May be sent twice (speculatively): a second copy finds the first's row
                    // or value and does not apply; a lease that applied unseen is a gap in the
                    // IDs, never an ID issued twice.
                    true,
                    false,
                )
                .await?,
            cas: db
                .prepare(
                    "UPDATE id_blocks SET next_id = ? WHERE name = ? IF next_id = ?",
                    true,
                    false,
                )
                .await?,
            db,
        })
    }

    /// The first ID of counter `name` not yet leased (0: none leased), as of a quorum read;
    /// within the redirect's read budget when the store is guarded.
    pub async fn leased(&self, name: &str) -> Result<u64, StoreError> {
        let res = self.db.read(&self.get, (name,)).await?;
        Ok(first::<(i64,)>(res)?.map_or(0, |(n,)| u64::try_from(n).unwrap_or(0)))
    }

    /// Leases `[start, start + n)` from the shared counter `name` with compare-and-set.
    pub async fn lease(&self, name: &str, n: u64) -> Result<std::ops::Range<u64>, StoreError> {
        let n_i = i64::try_from(n).map_err(|_| StoreError::Corrupt("block size".into()))?;
        // Bounded: only concurrent leases by other instances make a round lose.
        for _ in 0..32 {
            let res = self.db.exec(&self.get_serial, (name,)).await?;
            let won = match first::<(i64,)>(res)? {
                None => applied(self.db.exec(&self.init, (name, n_i)).await?)?.then_some(0),
                Some((cur,)) => {
                    let cas = self.db.exec(&self.cas, (cur + n_i, name, cur)).await?;
                    applied(cas)?.then_some(cur)
                }
            };
            if let Some(start) = won {
                let start =
                    u64::try_from(start).map_err(|_| StoreError::Corrupt("negative id".into()))?;
                return Ok(start..start + n);
            }
        }
        Err(StoreError::Contention("could not lease an ID block"))
    }
}
