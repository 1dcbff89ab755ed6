//! The relay's tables: `outbox` (link changes waiting to reach Kafka, written with the change,
//! deleted once published) and `expiries` (links by the hour they expire in), with the relay's
//! lease (which primary runs the sweeper) and the expiry scheduler's cursor ([`crate::coord`]).

use crate::coord::{Cursors, Leases};
use crate::db::{all, Db, StoreError};
use scylla::statement::prepared::PreparedStatement;
use scylla::value::CqlTimestamp;
use scylla::DeserializeRow;
use std::sync::Arc;

/// Number of outbox partitions; the slug picks one.
pub const OUTBOX_SHARDS: i32 = 16;

pub fn outbox_shard(slug: &str) -> i32 {
    // FNV-1a: stable across processes and versions (unlike std's hasher).
    let h = slug.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    (h % OUTBOX_SHARDS as u64) as i32
}

/// One pending `links` event: "slug changed at at_ms to version".
#[derive(Debug, Clone, PartialEq, Eq, DeserializeRow)]
pub struct OutboxRow {
    pub shard: i32,
    pub at_ms: i64,
    /// The link's key ([`LinkKey`](zlink_wire::domain::LinkKey)), in the `slug` column.
    #[scylla(rename = "slug")]
    pub key: String,
    pub version: i64,
    /// The trace of the request that made the change, so an event the sweeper republishes
    /// after a crash or an outage still continues it.
    pub traceparent: Option<String>,
}

impl OutboxRow {
    /// The row for a change made under the current trace (if any).
    pub fn new(slug: &str, at_ms: i64, version: i64) -> Self {
        OutboxRow {
            shard: outbox_shard(slug),
            at_ms,
            key: slug.to_string(),
            version,
            traceparent: zlink_clients::trace::current().map(|t| t.header()),
        }
    }
}

/// Expiry buckets are hours since the epoch.
pub fn expiry_bucket(ms: i64) -> i64 {
    ms.div_euclid(3_600_000)
}

pub struct Outbox {
    db: Arc<Db>,
    add: PreparedStatement,
    scan: PreparedStatement,
    delete: PreparedStatement,
    leases: Leases,
}

impl Outbox {
    pub async fn prepare(db: Arc<Db>) -> Result<Self, StoreError> {
        Ok(Outbox {
            add: db
                .prepare(
                    "INSERT INTO outbox (shard, at_ms, slug, version, traceparent) VALUES (?, ?, ?, ?, ?)",
                    true,
                    false,
                )
                .await?,
            scan: db
                .prepare(
                    "SELECT shard, at_ms, slug, version, traceparent FROM outbox \
                     WHERE shard = ? AND at_ms >= ? AND at_ms < ? LIMIT ?",
                    true,
                    false,
                )
                .await?,
            delete: db
                .prepare(
                    "DELETE FROM outbox WHERE shard = ? AND at_ms = ? AND slug = ? AND version = ?",
                    true,
                    false,
                )
                .await?,
            leases: Leases::prepare(db.clone()).await?,
            db,
        })
    }

    pub async fn add(&self, row: &OutboxRow) -> Result<(), StoreError> {
        let v = (
            row.shard,
            row.at_ms,
            &row.key,
            row.version,
            &row.traceparent,
        );
        self.db.exec(&self.add, v).await?;
        Ok(())
    }

    /// Rows of one shard written before `before_ms`, oldest first.
    /// Rows of `shard` written at `from_ms` or later and before `before_ms`, oldest first, at
    /// most `limit`. Cassandra reads every deleted row (tombstone) of the range too, until
    /// gc_grace has passed and compaction dropped it: callers keep `from_ms` as late as they can.
    pub async fn scan(
        &self,
        shard: i32,
        from_ms: i64,
        before_ms: i64,
        limit: i32,
    ) -> Result<Vec<OutboxRow>, StoreError> {
        all::<OutboxRow>(
            self.db
                .exec(&self.scan, (shard, from_ms, before_ms, limit))
                .await?,
        )
    }

    pub async fn delete(&self, row: &OutboxRow) -> Result<(), StoreError> {
        let v = (row.shard, row.at_ms, &row.key, row.version);
        self.db.exec(&self.delete, v).await?;
        Ok(())
    }

    /// Takes or renews the lease `name` for `ttl_s` seconds. True while `holder` holds it.
    pub async fn lease(&self, name: &str, holder: &str, ttl_s: i32) -> Result<bool, StoreError> {
        self.leases.lease(name, holder, ttl_s).await
    }
}

pub struct Expiries {
    db: Arc<Db>,
    add: PreparedStatement,
    scan: PreparedStatement,
    cursors: Cursors,
}

impl Expiries {
    pub async fn prepare(db: Arc<Db>) -> Result<Self, StoreError> {
        Ok(Expiries {
            add: db
                .prepare(
                    "INSERT INTO expiries (bucket, expires_at, slug) VALUES (?, ?, ?)",
                    true,
                    false,
                )
                .await?,
            scan: db
                .prepare(
                    "SELECT expires_at, slug FROM expiries WHERE bucket = ? AND expires_at <= ?",
                    true,
                    false,
                )
                .await?,
            cursors: Cursors::prepare(db.clone()).await?,
            db,
        })
    }

    pub async fn add(&self, slug: &str, expires_at_ms: i64) -> Result<(), StoreError> {
        let v = (
            expiry_bucket(expires_at_ms),
            CqlTimestamp(expires_at_ms),
            slug,
        );
        self.db.exec(&self.add, v).await?;
        Ok(())
    }

    /// (expires_at_ms, slug) of the links in `bucket` that expire at or before `until_ms`.
    pub async fn scan(&self, bucket: i64, until_ms: i64) -> Result<Vec<(i64, String)>, StoreError> {
        let res = self
            .db
            .exec(&self.scan, (bucket, CqlTimestamp(until_ms)))
            .await?;
        Ok(all::<(CqlTimestamp, String)>(res)?
            .into_iter()
            .map(|(t, s)| (t.0, s))
            .collect())
    }

    /// The cursor's position, created at `initial` if it does not exist yet.
    pub async fn cursor(&self, name: &str, initial: i64) -> Result<i64, StoreError> {
        self.cursors.get(name, initial).await
    }

    pub async fn set_cursor(&self, name: &str, position: i64) -> Result<(), StoreError> {
        self.cursors.set(name, position).await
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn outbox_shards_are_stable_and_in_range() {
        assert_eq!(super::outbox_shard("abc"), super::outbox_shard("abc"));
        assert!((0..super::OUTBOX_SHARDS).contains(&super::outbox_shard("zzzzzzz")));
        let used: std::collections::HashSet<_> = (0..200)
            .map(|i| super::outbox_shard(&format!("s{i}")))
            .collect();
        assert_eq!(used.len(), super::OUTBOX_SHARDS as usize);
    }
}
