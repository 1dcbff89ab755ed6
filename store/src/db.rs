//! ScyllaDB access: every CQL statement primary runs, prepared once, plus schema migration.
//!
//! Lightweight transactions are used exactly where uniqueness or a state transition needs them
//! (slug claim, idempotency claim, ID block lease, status change). Their outcome is read from
//! the `[applied]` column only; when a claim loses, the winner is read back with a SERIAL read,
//! which is linearizable with the LWT that won.

use crate::config::StoreConfig;
use scylla::client::execution_profile::ExecutionProfile;
use scylla::client::session::Session;
use scylla::client::session_builder::SessionBuilder;
use scylla::deserialize::row::DeserializeRow;
use scylla::response::query_result::QueryResult;
use scylla::serialize::row::SerializeRow;
use scylla::statement::prepared::PreparedStatement;
use scylla::statement::{Consistency, SerialConsistency};
use scylla::value::{CqlTimestamp, CqlValue, Row};
use scylla::DeserializeRow;
use std::time::Duration;
use thiserror::Error;
use zlink_wire::LinkStatus;

const SCHEMA: &str = include_str!("../../deploy/cql/schema.cql");

#[derive(Debug, Error, Clone)]
pub enum StoreError {
    /// The database could not answer (down, timeout, overloaded): a retry may help.
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// The database answered with something this code cannot have written.
    #[error("unexpected data in store: {0}")]
    Corrupt(String),
    /// Compare-and-set kept losing to other writers.
    #[error("store contention: {0}")]
    Contention(&'static str),
    /// The store's circuit is open (it failed or hung recently): nothing was sent.
    #[error("store skipped: circuit open after recent failures")]
    CircuitOpen,
}

impl StoreError {
    /// Whether this error says the store is unhealthy (what the circuit breaker counts).
    /// Corrupt data and lost compare-and-sets are answers from a working store.
    pub fn is_outage(&self) -> bool {
        matches!(self, StoreError::Unavailable(_) | StoreError::CircuitOpen)
    }
}

pub(crate) fn unavailable(e: impl std::fmt::Display) -> StoreError {
    StoreError::Unavailable(e.to_string())
}

/// One link as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Link {
    pub slug: String,
    pub url: String,
    pub owner: String,
    pub status: LinkStatus,
    pub redirect_code: u16,
    pub created_at_ms: i64,
    pub expires_at_ms: Option<i64>,
    pub version: i64,
    /// Hash of (owner, Idempotency-Key) of the request that created the link.
    pub idem: Option<String>,
    /// Who disabled the link (see [`DisabledBy`]); `None` while it is active.
    pub disabled_by: Option<DisabledBy>,
}

/// Who disabled a link. An admin's disable is a takedown: only an admin can undo it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DisabledBy {
    pub admin: bool,
    pub key_id: String,
}

impl DisabledBy {
    /// Stored as `admin:<key id>` or `owner:<key id>`.
    pub fn to_column(&self) -> String {
        let role = if self.admin { "admin" } else { "owner" };
        format!("{role}:{}", self.key_id)
    }

    pub fn from_column(s: &str) -> Option<Self> {
        let (role, key_id) = s.split_once(':')?;
        let admin = match role {
            "admin" => true,
            "owner" => false,
            _ => return None,
        };
        Some(DisabledBy {
            admin,
            key_id: key_id.to_string(),
        })
    }
}

#[derive(DeserializeRow)]
struct LinkRow {
    slug: String,
    url: String,
    owner: String,
    status: String,
    redirect_code: i32,
    created_at: CqlTimestamp,
    expires_at: Option<CqlTimestamp>,
    version: i64,
    idem: Option<String>,
    disabled_by: Option<String>,
}

impl TryFrom<LinkRow> for Link {
    type Error = StoreError;
    fn try_from(r: LinkRow) -> Result<Self, StoreError> {
        let status = r.status.parse().map_err(|_| {
            StoreError::Corrupt(format!("link {:?} has status {:?}", r.slug, r.status))
        })?;
        let redirect_code = u16::try_from(r.redirect_code)
            .ok()
            .filter(|c| zlink_wire::link::is_redirect_code(*c))
            .ok_or_else(|| {
                StoreError::Corrupt(format!(
                    "link {:?} has redirect code {}",
                    r.slug, r.redirect_code
                ))
            })?;
        let disabled_by = match r.disabled_by.as_deref() {
            None | Some("") => None,
            Some(d) => Some(DisabledBy::from_column(d).ok_or_else(|| {
                StoreError::Corrupt(format!("link {:?} has disabled_by {d:?}", r.slug))
            })?),
        };
        Ok(Link {
            slug: r.slug,
            url: r.url,
            owner: r.owner,
            status,
            redirect_code,
            created_at_ms: r.created_at.0,
            expires_at_ms: r.expires_at.map(|t| t.0),
            version: r.version,
            idem: r.idem,
            disabled_by,
        })
    }
}

/// A stored API key (never the key itself).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiKeyRecord {
    pub key_id: String,
    pub owner: String,
    pub admin: bool,
    pub revoked: bool,
}

struct Statements {
    get_link: PreparedStatement,
    get_link_serial: PreparedStatement,
    insert_link: PreparedStatement,
    update_status: PreparedStatement,
    claim_idem: PreparedStatement,
    get_idem_serial: PreparedStatement,
    get_block_serial: PreparedStatement,
    get_block: PreparedStatement,
    init_block: PreparedStatement,
    cas_block: PreparedStatement,
    get_key: PreparedStatement,
    insert_key: PreparedStatement,
    insert_key_id: PreparedStatement,
    get_key_hash: PreparedStatement,
    revoke_key: PreparedStatement,
    ping: PreparedStatement,
    outbox_add: PreparedStatement,
    outbox_scan: PreparedStatement,
    outbox_delete: PreparedStatement,
    lease_take: PreparedStatement,
    lease_renew: PreparedStatement,
    expiry_add: PreparedStatement,
    expiry_scan: PreparedStatement,
    cursor_get: PreparedStatement,
    cursor_init: PreparedStatement,
    cursor_set: PreparedStatement,
    scan_links: PreparedStatement,
    replica_get: PreparedStatement,
    replica_init: PreparedStatement,
    replica_bump: PreparedStatement,
}

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
    pub slug: String,
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
            slug: slug.to_string(),
            version,
            traceparent: zlink_clients::trace::current().map(|t| t.header()),
        }
    }
}

/// Expiry buckets are hours since the epoch.
pub fn expiry_bucket(ms: i64) -> i64 {
    ms.div_euclid(3_600_000)
}

pub struct Store {
    session: Session,
    st: Statements,
    guard: Option<Guard>,
}

/// Deadlines and the circuit breaker of a serving process (primary): every statement within
/// the CQL timeout, the redirect's link read within its own tighter budget, and nothing sent
/// while the circuit is open. Background consumers (replicator, counter) run without one: they
/// retry with backoff and have nobody waiting.
struct Guard {
    breaker: zlink_clients::breaker::Breaker,
    statement_budget: Duration,
    read_budget: Duration,
}

const LINK_COLUMNS: &str =
    "slug, url, owner, status, redirect_code, created_at, expires_at, version, idem, disabled_by";

/// Columns added to a table after its first release: (table, column, type). `migrate` adds
/// each one an existing table lacks; the schema file's CREATE TABLE already has them.
const ADDED_COLUMNS: &[(&str, &str, &str)] = &[
    ("links", "disabled_by", "text"),
    ("outbox", "traceparent", "text"),
];

async fn connect(cfg: &StoreConfig, keyspace: Option<&str>) -> Result<Session, StoreError> {
    let profile = ExecutionProfile::builder()
        .consistency(Consistency::LocalQuorum)
        .serial_consistency(Some(SerialConsistency::LocalSerial))
        .request_timeout(Some(cfg.cql_timeout()))
        .build();
    let mut b = SessionBuilder::new()
        .known_nodes(
            cfg.cql_nodes
                .iter()
                .map(|n| n.trim())
                .filter(|n| !n.is_empty()),
        )
        .connection_timeout(Duration::from_secs(3))
        .default_execution_profile_handle(profile.into_handle());
    if let Some(ks) = keyspace {
        b = b.use_keyspace(ks, false);
    }
    b.build().await.map_err(unavailable)
}

/// Creates the keyspace if it is missing and applies every statement of the schema file.
pub async fn migrate(cfg: &StoreConfig, replication_factor: u32) -> Result<(), StoreError> {
    crate::config::validate_keyspace(&cfg.keyspace).map_err(StoreError::Corrupt)?;
    let session = connect(cfg, None).await?;
    // The keyspace name is validated to [a-z][a-z0-9_]*; DDL cannot bind it as a value.
    let ddl = format!(
        "CREATE KEYSPACE IF NOT EXISTS {} WITH replication = \
         {{'class': 'NetworkTopologyStrategy', 'replication_factor': {replication_factor}}}",
        cfg.keyspace
    );
    session.query_unpaged(ddl, &[]).await.map_err(unavailable)?;
    session
        .use_keyspace(&cfg.keyspace, false)
        .await
        .map_err(unavailable)?;
    for stmt in schema_statements() {
        session
            .query_unpaged(stmt, &[])
            .await
            .map_err(unavailable)?;
    }
    for (table, column, kind) in ADDED_COLUMNS {
        let res = session
            .query_unpaged(
                "SELECT column_name FROM system_schema.columns \
                 WHERE keyspace_name = ? AND table_name = ? AND column_name = ?",
                (&cfg.keyspace, table, column),
            )
            .await
            .map_err(unavailable)?;
        if first::<(String,)>(res)?.is_none() {
            tracing::info!(table, column, "adding a column to an existing table");
            // Names are constants of ours, never input.
            session
                .query_unpaged(format!("ALTER TABLE {table} ADD {column} {kind}"), &[])
                .await
                .map_err(unavailable)?;
        }
    }
    session
        .await_schema_agreement()
        .await
        .map_err(unavailable)?;
    // Keys created before api_key_ids existed get their id row (a handful of rows; idempotent).
    // Unpaged: the key table is small (one row per issued key).
    let keys = session
        .query_unpaged("SELECT key_hash, key_id FROM api_keys", &[])
        .await
        .map_err(unavailable)?;
    for (hash, id) in all::<(String, Option<String>)>(keys)? {
        if let Some(id) = id {
            session
                .query_unpaged(
                    "INSERT INTO api_key_ids (key_id, key_hash) VALUES (?, ?)",
                    (id, hash),
                )
                .await
                .map_err(unavailable)?;
        }
    }
    // The expiry scheduler starts at the hour the schema was created: every expiry ever
    // written lies after it.
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0);
    session
        .query_unpaged(
            "INSERT INTO cursors (name, position) VALUES ('expiry', ?) IF NOT EXISTS",
            (expiry_bucket(now_ms),),
        )
        .await
        .map_err(unavailable)?;
    Ok(())
}

/// The statements of deploy/cql/schema.cql, comments removed.
fn schema_statements() -> Vec<String> {
    let without_comments: String = SCHEMA
        .lines()
        .map(|l| l.split("--").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n");
    without_comments
        .split(';')
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .collect()
}

pub(crate) fn corrupt(e: impl std::fmt::Display) -> StoreError {
    StoreError::Corrupt(e.to_string())
}

/// The first row of a result, if any.
pub(crate) fn first<R>(res: QueryResult) -> Result<Option<R>, StoreError>
where
    R: for<'f> DeserializeRow<'f, 'f>,
{
    res.into_rows_result()
        .map_err(unavailable)?
        .maybe_first_row::<R>()
        .map_err(corrupt)
}

/// Every row of a single-page result.
pub(crate) fn all<R>(res: QueryResult) -> Result<Vec<R>, StoreError>
where
    R: for<'f> DeserializeRow<'f, 'f>,
{
    let rows = res.into_rows_result().map_err(unavailable)?;
    let it = rows.rows::<R>().map_err(corrupt)?;
    it.collect::<Result<_, _>>().map_err(corrupt)
}

pub(crate) fn applied(result: QueryResult) -> Result<bool, StoreError> {
    let rows = result.into_rows_result().map_err(unavailable)?;
    let row: Row = rows.first_row().map_err(unavailable)?;
    match row.columns.first() {
        Some(Some(CqlValue::Boolean(b))) => Ok(*b),
        other => Err(StoreError::Corrupt(format!(
            "LWT answered without [applied]: {other:?}"
        ))),
    }
}

impl Store {
    async fn exec(
        &self,
        stmt: &PreparedStatement,
        values: impl SerializeRow,
    ) -> Result<QueryResult, StoreError> {
        let budget = self.guard.as_ref().map(|g| g.statement_budget);
        self.exec_within(stmt, values, budget).await
    }

    async fn exec_within(
        &self,
        stmt: &PreparedStatement,
        values: impl SerializeRow,
        budget: Option<Duration>,
    ) -> Result<QueryResult, StoreError> {
        let run = async {
            self.session
                .execute_unpaged(stmt, values)
                .await
                .map_err(unavailable)
        };
        let Some(g) = &self.guard else {
            return run.await;
        };
        let budget = budget.unwrap_or(g.statement_budget);
        g.breaker
            .call(budget, StoreError::is_outage, run)
            .await
            .map_err(|e| match e {
                zlink_clients::breaker::CallError::Open(_) => StoreError::CircuitOpen,
                zlink_clients::breaker::CallError::Timeout(..) => {
                    StoreError::Unavailable(format!("no answer within {budget:?}"))
                }
                zlink_clients::breaker::CallError::Failed(e) => e,
            })
    }

    /// Connects to an existing keyspace (see [`migrate`]) and prepares every statement.
    pub async fn connect(cfg: &StoreConfig) -> Result<Self, StoreError> {
        let session = connect(cfg, Some(&cfg.keyspace)).await?;
        let prep = |q: String, idempotent: bool, serial: bool| {
            let session = &session;
            async move {
                let mut p = session.prepare(q).await.map_err(unavailable)?;
                p.set_is_idempotent(idempotent);
                if serial {
                    p.set_consistency(Consistency::LocalSerial);
                }
                Ok::<_, StoreError>(p)
            }
        };
        let st = Statements {
            get_link: prep(format!("SELECT {LINK_COLUMNS} FROM links WHERE slug = ?"), true, false).await?,
            get_link_serial: prep(format!("SELECT {LINK_COLUMNS} FROM links WHERE slug = ?"), true, true).await?,
            insert_link: prep(
                format!("INSERT INTO links ({LINK_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) IF NOT EXISTS"),
                false,
                false,
            )
            .await?,
            update_status: prep(
                "UPDATE links SET status = ?, version = ?, disabled_by = ? WHERE slug = ? IF status = ? AND version = ?".into(),
                false,
                false,
            )
            .await?,
            claim_idem: prep(
                "INSERT INTO idempotency (owner, idem_key, slug, fingerprint, created_at) \
                 VALUES (?, ?, ?, ?, ?) IF NOT EXISTS"
                    .into(),
                false,
                false,
            )
            .await?,
            get_idem_serial: prep(
                "SELECT slug, fingerprint FROM idempotency WHERE owner = ? AND idem_key = ?".into(),
                true,
                true,
            )
            .await?,
            get_block_serial: prep("SELECT next_id FROM id_blocks WHERE name = ?".into(), true, true).await?,
            get_block: prep("SELECT next_id FROM id_blocks WHERE name = ?".into(), true, false).await?,
            init_block: prep(
                "INSERT INTO id_blocks (name, next_id) VALUES (?, ?) IF NOT EXISTS".into(),
                false,
                false,
            )
            .await?,
            cas_block: prep("UPDATE id_blocks SET next_id = ? WHERE name = ? IF next_id = ?".into(), false, false)
                .await?,
            get_key: prep(
                "SELECT key_id, owner, role, revoked FROM api_keys WHERE key_hash = ?".into(),
                true,
                false,
            )
            .await?,
            insert_key: prep(
                "INSERT INTO api_keys (key_hash, key_id, owner, role, created_at, revoked) \
                 VALUES (?, ?, ?, ?, ?, false)"
                    .into(),
                true,
                false,
            )
            .await?,
            insert_key_id: prep(
                "INSERT INTO api_key_ids (key_id, key_hash) VALUES (?, ?)".into(),
                true,
                false,
            )
            .await?,
            get_key_hash: prep(
                "SELECT key_hash FROM api_key_ids WHERE key_id = ?".into(),
                true,
                false,
            )
            .await?,
            revoke_key: prep(
                "UPDATE api_keys SET revoked = true WHERE key_hash = ?".into(),
                true,
                false,
            )
            .await?,
            ping: prep("SELECT release_version FROM system.local".into(), true, false).await?,
            outbox_add: prep(
                "INSERT INTO outbox (shard, at_ms, slug, version, traceparent) VALUES (?, ?, ?, ?, ?)".into(),
                true,
                false,
            )
            .await?,
            outbox_scan: prep(
                "SELECT shard, at_ms, slug, version, traceparent FROM outbox WHERE shard = ? AND at_ms < ? LIMIT ?".into(),
                true,
                false,
            )
            .await?,
            outbox_delete: prep(
                "DELETE FROM outbox WHERE shard = ? AND at_ms = ? AND slug = ? AND version = ?".into(),
                true,
                false,
            )
            .await?,
            lease_take: prep(
                "INSERT INTO leases (name, holder) VALUES (?, ?) IF NOT EXISTS USING TTL ?".into(),
                false,
                false,
            )
            .await?,
            lease_renew: prep(
                "UPDATE leases USING TTL ? SET holder = ? WHERE name = ? IF holder = ?".into(),
                false,
                false,
            )
            .await?,
            expiry_add: prep(
                "INSERT INTO expiries (bucket, expires_at, slug) VALUES (?, ?, ?)".into(),
                true,
                false,
            )
            .await?,
            expiry_scan: prep(
                "SELECT expires_at, slug FROM expiries WHERE bucket = ? AND expires_at <= ?".into(),
                true,
                false,
            )
            .await?,
            cursor_get: prep("SELECT position FROM cursors WHERE name = ?".into(), true, false).await?,
            cursor_init: prep(
                "INSERT INTO cursors (name, position) VALUES (?, ?) IF NOT EXISTS".into(),
                false,
                false,
            )
            .await?,
            cursor_set: prep("UPDATE cursors SET position = ? WHERE name = ?".into(), true, false).await?,
            scan_links: {
                let mut p = prep(
                    format!("SELECT {LINK_COLUMNS} FROM links WHERE token(slug) >= ? AND token(slug) <= ?"),
                    true,
                    false,
                )
                .await?;
                p.set_page_size(500);
                p
            },
            replica_get: prep("SELECT version FROM replica_versions WHERE slug = ?".into(), true, false).await?,
            replica_init: prep(
                "INSERT INTO replica_versions (slug, version) VALUES (?, ?) IF NOT EXISTS".into(),
                false,
                false,
            )
            .await?,
            replica_bump: prep(
                "UPDATE replica_versions SET version = ? WHERE slug = ? IF version < ?".into(),
                false,
                false,
            )
            .await?,
        };
        Ok(Store {
            session,
            st,
            guard: None,
        })
    }

    /// Puts `breaker` in front of every statement: each has `statement_budget` (the redirect's
    /// link read: `read_budget`), a blown budget is a failure like a refused connection, and an
    /// open circuit fails statements at once with [`StoreError::CircuitOpen`].
    pub fn with_breaker(
        mut self,
        breaker: zlink_clients::breaker::Breaker,
        statement_budget: Duration,
        read_budget: Duration,
    ) -> Self {
        self.guard = Some(Guard {
            breaker,
            statement_budget,
            read_budget,
        });
        self
    }

    /// The session, for statements other modules prepare (click aggregates).
    pub(crate) fn session(&self) -> &Session {
        &self.session
    }

    pub async fn ping(&self) -> Result<(), StoreError> {
        self.exec(&self.st.ping, &[]).await?;
        Ok(())
    }

    async fn read_link(
        &self,
        stmt: &PreparedStatement,
        slug: &str,
        budget: Option<Duration>,
    ) -> Result<Option<Link>, StoreError> {
        let res = self.exec_within(stmt, (slug,), budget).await?;
        match first::<LinkRow>(res)? {
            Some(row) => Ok(Some(row.try_into()?)),
            None => Ok(None),
        }
    }

    /// The redirect's read: within the read budget when the store is guarded.
    pub async fn get_link(&self, slug: &str) -> Result<Option<Link>, StoreError> {
        let budget = self.guard.as_ref().map(|g| g.read_budget);
        self.read_link(&self.st.get_link, slug, budget).await
    }

    /// A linearizable read: sees the outcome of every LWT that completed before it.
    pub async fn get_link_serial(&self, slug: &str) -> Result<Option<Link>, StoreError> {
        self.read_link(&self.st.get_link_serial, slug, None).await
    }

    /// Claims `link.slug`. Returns false if any link already has that slug.
    pub async fn insert_link_if_absent(&self, link: &Link) -> Result<bool, StoreError> {
        let values = (
            &link.slug,
            &link.url,
            &link.owner,
            link.status.as_str(),
            i32::from(link.redirect_code),
            CqlTimestamp(link.created_at_ms),
            link.expires_at_ms.map(CqlTimestamp),
            link.version,
            &link.idem,
            link.disabled_by.as_ref().map(DisabledBy::to_column),
        );
        applied(self.exec(&self.st.insert_link, values).await?)
    }

    /// Moves a link from (`from`, `version`) to (`to`, `version + 1`), recording who disabled
    /// it (`None` clears it). False if the link was not in exactly that state (changed
    /// concurrently, or never was).
    pub async fn transition(
        &self,
        slug: &str,
        from: LinkStatus,
        version: i64,
        to: LinkStatus,
        disabled_by: Option<&DisabledBy>,
    ) -> Result<bool, StoreError> {
        let values = (
            to.as_str(),
            version + 1,
            disabled_by.map(DisabledBy::to_column),
            slug,
            from.as_str(),
            version,
        );
        applied(self.exec(&self.st.update_status, values).await?)
    }

    /// Claims an idempotency key for `slug`. On a lost claim returns the winner's (slug, fingerprint).
    pub async fn claim_idempotency(
        &self,
        owner: &str,
        key: &str,
        slug: &str,
        fingerprint: &str,
        now_ms: i64,
    ) -> Result<Option<(String, String)>, StoreError> {
        let values = (owner, key, slug, fingerprint, CqlTimestamp(now_ms));
        if applied(self.exec(&self.st.claim_idem, values).await?)? {
            return Ok(None);
        }
        let res = self.exec(&self.st.get_idem_serial, (owner, key)).await?;
        match first::<(String, String)>(res)? {
            Some(winner) => Ok(Some(winner)),
            // Lost the claim but the row is gone: it expired in between. Extremely unlikely.
            None => Err(StoreError::Contention(
                "idempotency key expired while being claimed",
            )),
        }
    }

    /// Leases `[start, start + n)` from the shared counter `name` with compare-and-set.
    /// The first ID of counter `name` not yet leased (0: none leased), as of a quorum read;
    /// within the redirect's read budget when the store is guarded.
    pub async fn ids_leased(&self, name: &str) -> Result<u64, StoreError> {
        let budget = self.guard.as_ref().map(|g| g.read_budget);
        let res = self
            .exec_within(&self.st.get_block, (name,), budget)
            .await?;
        Ok(first::<(i64,)>(res)?.map_or(0, |(n,)| u64::try_from(n).unwrap_or(0)))
    }

    pub async fn lease_ids(&self, name: &str, n: u64) -> Result<std::ops::Range<u64>, StoreError> {
        let n_i = i64::try_from(n).map_err(|_| StoreError::Corrupt("block size".into()))?;
        // Bounded: only concurrent leases by other instances make a round lose.
        for _ in 0..32 {
            let res = self.exec(&self.st.get_block_serial, (name,)).await?;
            let current = first::<(i64,)>(res)?;
            let won = match current {
                None => applied(self.exec(&self.st.init_block, (name, n_i)).await?)?.then_some(0),
                Some((cur,)) => {
                    let cas = self
                        .exec(&self.st.cas_block, (cur + n_i, name, cur))
                        .await?;
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

    pub async fn get_api_key(&self, key_hash: &str) -> Result<Option<ApiKeyRecord>, StoreError> {
        let res = self.exec(&self.st.get_key, (key_hash,)).await?;
        let row = first::<(String, String, String, Option<bool>)>(res)?;
        Ok(row.map(|(key_id, owner, role, revoked)| ApiKeyRecord {
            key_id,
            owner,
            admin: role == "admin",
            revoked: revoked.unwrap_or(false),
        }))
    }

    pub async fn insert_api_key(
        &self,
        key_hash: &str,
        key_id: &str,
        owner: &str,
        admin: bool,
        now_ms: i64,
    ) -> Result<(), StoreError> {
        let role = if admin { "admin" } else { "owner" };
        // The id row first: a key that exists can always be found by its id to be revoked.
        self.exec(&self.st.insert_key_id, (key_id, key_hash))
            .await?;
        let values = (key_hash, key_id, owner, role, CqlTimestamp(now_ms));
        self.exec(&self.st.insert_key, values).await?;
        Ok(())
    }

    /// Revokes the key with public id `key_id`. Returns its hash and its record as it was
    /// (`None`: no such key). Revoking twice is harmless.
    pub async fn revoke_api_key(
        &self,
        key_id: &str,
    ) -> Result<Option<(String, ApiKeyRecord)>, StoreError> {
        let res = self.exec(&self.st.get_key_hash, (key_id,)).await?;
        let Some((hash,)) = first::<(String,)>(res)? else {
            return Ok(None);
        };
        let Some(rec) = self.get_api_key(&hash).await? else {
            return Ok(None);
        };
        self.exec(&self.st.revoke_key, (&hash,)).await?;
        Ok(Some((hash, rec)))
    }
}

impl Store {
    pub async fn outbox_add(&self, row: &OutboxRow) -> Result<(), StoreError> {
        let v = (
            row.shard,
            row.at_ms,
            &row.slug,
            row.version,
            &row.traceparent,
        );
        self.exec(&self.st.outbox_add, v).await?;
        Ok(())
    }

    /// Rows of one shard written before `before_ms`, oldest first.
    pub async fn outbox_scan(
        &self,
        shard: i32,
        before_ms: i64,
        limit: i32,
    ) -> Result<Vec<OutboxRow>, StoreError> {
        let res = self
            .exec(&self.st.outbox_scan, (shard, before_ms, limit))
            .await?;
        all::<OutboxRow>(res)
    }

    pub async fn outbox_delete(&self, row: &OutboxRow) -> Result<(), StoreError> {
        let v = (row.shard, row.at_ms, &row.slug, row.version);
        self.exec(&self.st.outbox_delete, v).await?;
        Ok(())
    }

    /// Takes or renews the lease `name` for `ttl_s` seconds. True while `holder` holds it.
    pub async fn lease(&self, name: &str, holder: &str, ttl_s: i32) -> Result<bool, StoreError> {
        if applied(
            self.exec(&self.st.lease_renew, (ttl_s, holder, name, holder))
                .await?,
        )? {
            return Ok(true);
        }
        applied(
            self.exec(&self.st.lease_take, (name, holder, ttl_s))
                .await?,
        )
    }

    pub async fn expiry_add(&self, slug: &str, expires_at_ms: i64) -> Result<(), StoreError> {
        let v = (
            expiry_bucket(expires_at_ms),
            CqlTimestamp(expires_at_ms),
            slug,
        );
        self.exec(&self.st.expiry_add, v).await?;
        Ok(())
    }

    /// (expires_at_ms, slug) of the links in `bucket` that expire at or before `until_ms`.
    pub async fn expiry_scan(
        &self,
        bucket: i64,
        until_ms: i64,
    ) -> Result<Vec<(i64, String)>, StoreError> {
        let res = self
            .exec(&self.st.expiry_scan, (bucket, CqlTimestamp(until_ms)))
            .await?;
        Ok(all::<(CqlTimestamp, String)>(res)?
            .into_iter()
            .map(|(t, s)| (t.0, s))
            .collect())
    }

    /// The cursor's position, created at `initial` if it does not exist yet.
    pub async fn cursor(&self, name: &str, initial: i64) -> Result<i64, StoreError> {
        let res = self.exec(&self.st.cursor_get, (name,)).await?;
        if let Some((p,)) = first::<(i64,)>(res)? {
            return Ok(p);
        }
        self.exec(&self.st.cursor_init, (name, initial)).await?;
        let res = self.exec(&self.st.cursor_get, (name,)).await?;
        first::<(i64,)>(res)?
            .map(|(p,)| p)
            .ok_or_else(|| StoreError::Corrupt("cursor vanished".into()))
    }

    pub async fn cursor_set(&self, name: &str, position: i64) -> Result<(), StoreError> {
        self.exec(&self.st.cursor_set, (position, name)).await?;
        Ok(())
    }
}

/// A position in a token-range scan of `links`.
pub type ScanPage = scylla::response::PagingState;

impl Store {
    /// One page (≤ 500 links) of the links whose partition token lies in `[from, to]`, and the
    /// position of the next page if there is one. Memory stays bounded by the page size.
    pub async fn scan_links(
        &self,
        from: i64,
        to: i64,
        page: ScanPage,
    ) -> Result<(Vec<Link>, Option<ScanPage>), StoreError> {
        let (res, next) = self
            .session
            .execute_single_page(&self.st.scan_links, (from, to), page)
            .await
            .map_err(unavailable)?;
        let links = all::<LinkRow>(res)?
            .into_iter()
            .map(Link::try_from)
            .collect::<Result<Vec<_>, _>>()?;
        let next = match next.into_paging_control_flow() {
            std::ops::ControlFlow::Continue(p) => Some(p),
            std::ops::ControlFlow::Break(()) => None,
        };
        Ok((links, next))
    }

    /// The newest link version the replicator applied to S3 for `slug` (0: none).
    pub async fn replica_version(&self, slug: &str) -> Result<i64, StoreError> {
        let res = self.exec(&self.st.replica_get, (slug,)).await?;
        let row = first::<(i64,)>(res)?;
        Ok(row.map_or(0, |(v,)| v))
    }

    /// Records that `version` of `slug` is in S3, unless a newer version already is.
    pub async fn replica_version_set(&self, slug: &str, version: i64) -> Result<(), StoreError> {
        if applied(
            self.exec(&self.st.replica_bump, (version, slug, version))
                .await?,
        )? {
            return Ok(());
        }
        // Not applied: either a newer version is recorded (fine) or there is no row yet.
        if applied(self.exec(&self.st.replica_init, (slug, version)).await?)? {
            return Ok(());
        }
        // Someone created the row meanwhile: one more conditional bump settles it.
        applied(
            self.exec(&self.st.replica_bump, (version, slug, version))
                .await?,
        )?;
        Ok(())
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

    #[test]
    fn schema_file_splits_into_create_statements() {
        let stmts = super::schema_statements();
        assert_eq!(stmts.len(), 12);
        assert!(stmts
            .iter()
            .all(|s| s.starts_with("CREATE TABLE IF NOT EXISTS")));
        assert!(stmts.iter().all(|s| !s.contains("--")));
    }
}
