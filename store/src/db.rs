//! The session every repository shares: connecting, preparing, running a statement within its
//! deadline behind the serving tier's circuit breaker, and reading rows strictly.
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
use scylla::policies::speculative_execution::{
    SimpleSpeculativeExecutionPolicy, SpeculativeExecutionPolicy,
};
use scylla::response::query_result::QueryResult;
use scylla::serialize::row::SerializeRow;
use scylla::statement::prepared::PreparedStatement;
use scylla::statement::{Consistency, SerialConsistency};
use scylla::value::{CqlValue, Row};
use std::sync::Arc;
use std::time::Duration;
use thiserror::Error;

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

/// Deadlines and circuit breakers of a serving process (primary): every statement within the
/// CQL timeout behind one breaker, the redirect's reads within their own tighter budget behind
/// another, and nothing sent while a circuit is open. Two breakers, because a blown 150 ms read
/// budget says the store cannot answer a redirect in time, not that it cannot take a write in
/// 2 s: with one breaker three slow reads on a starved box refused creates (503) the store
/// would have taken. A dead or hung store blows both budgets and opens both. Background
/// consumers (replicator, counter) run without a guard: they retry with backoff and have
/// nobody waiting.
struct Guard {
    statements: Guarded,
    reads: Guarded,
}

/// One class of statements: its breaker and its budget.
struct Guarded {
    breaker: zlink_clients::breaker::Breaker,
    budget: Duration,
}

/// A connected session on the keyspace; repositories ([`crate::links::Links`] and friends)
/// prepare their statements on it and run them through it.
pub struct Db {
    session: Session,
    guard: Option<Guard>,
    ping: PreparedStatement,
}

pub(crate) async fn connect(
    cfg: &StoreConfig,
    keyspace: Option<&str>,
) -> Result<Session, StoreError> {
    // A hung node (SIGSTOP, a long GC pause, a dead disk) still accepts connections and never
    // answers: the driver cannot tell it from a slow one. Statements that may be sent twice go
    // to the next replica after `cql_speculative_ms`, so one hung node of three costs that
    // much, not a timeout (and the serving tier's breaker never sees it).
    let speculative = (cfg.cql_speculative_ms > 0).then(|| {
        Arc::new(SimpleSpeculativeExecutionPolicy {
            max_retry_count: 2,
            retry_interval: Duration::from_millis(cfg.cql_speculative_ms),
        }) as Arc<dyn SpeculativeExecutionPolicy>
    });
    let profile = ExecutionProfile::builder()
        .consistency(Consistency::LocalQuorum)
        .serial_consistency(Some(SerialConsistency::LocalSerial))
        .request_timeout(Some(cfg.cql_timeout()))
        .speculative_execution_policy(speculative)
        .build();
    let mut b = SessionBuilder::new()
        .known_nodes(
            cfg.cql_nodes
                .iter()
                .map(|n| n.trim())
                .filter(|n| !n.is_empty()),
        )
        .connection_timeout(Duration::from_secs(3))
        // ...and its connections are closed once keepalives go unanswered, so statements whose
        // outcome cannot be checked (and new ones) stop going there until it answers again.
        .keepalive_interval(Duration::from_millis(cfg.cql_keepalive_ms))
        .keepalive_timeout(Duration::from_millis(cfg.cql_keepalive_timeout_ms))
        .default_execution_profile_handle(profile.into_handle());
    if let Some(ks) = keyspace {
        b = b.use_keyspace(ks, false);
    }
    b.build().await.map_err(unavailable)
}

impl Db {
    /// Connects to an existing keyspace (see [`crate::schema::migrate`]).
    pub async fn connect(cfg: &StoreConfig) -> Result<Self, StoreError> {
        let session = connect(cfg, Some(&cfg.keyspace)).await?;
        let mut ping = session
            .prepare("SELECT release_version FROM system.local")
            .await
            .map_err(unavailable)?;
        ping.set_is_idempotent(true);
        Ok(Db {
            session,
            guard: None,
            ping,
        })
    }

    /// Puts `statements` in front of every statement, each with `statement_budget`, except the
    /// redirect's reads ([`Db::read`]): `reads` with `read_budget`. A blown budget is a failure
    /// like a refused connection, and an open circuit fails its statements at once with
    /// [`StoreError::CircuitOpen`].
    pub fn with_breakers(
        mut self,
        statements: zlink_clients::breaker::Breaker,
        statement_budget: Duration,
        reads: zlink_clients::breaker::Breaker,
        read_budget: Duration,
    ) -> Self {
        self.guard = Some(Guard {
            statements: Guarded {
                breaker: statements,
                budget: statement_budget,
            },
            reads: Guarded {
                breaker: reads,
                budget: read_budget,
            },
        });
        self
    }

    /// The nodes the driver knows of and how many of them it holds an open connection to. A
    /// node it cannot connect to (down) or whose connections it closed (hung: keepalives
    /// unanswered) is known and not connected.
    pub fn nodes(&self) -> (usize, usize) {
        let state = self.session.get_cluster_state();
        let nodes = state.get_nodes_info();
        let connected = nodes.iter().filter(|n| n.is_connected()).count();
        (nodes.len(), connected)
    }

    pub async fn ping(&self) -> Result<(), StoreError> {
        self.exec(&self.ping, &[]).await?;
        Ok(())
    }

    /// Prepares a statement; `serial`: read at LOCAL_SERIAL (linearizable with LWTs).
    pub(crate) async fn prepare(
        &self,
        q: impl Into<String>,
        idempotent: bool,
        serial: bool,
    ) -> Result<PreparedStatement, StoreError> {
        let mut p = self.session.prepare(q.into()).await.map_err(unavailable)?;
        p.set_is_idempotent(idempotent);
        if serial {
            p.set_consistency(Consistency::LocalSerial);
        }
        Ok(p)
    }

    /// The session, for paged scans and batches.
    pub(crate) fn session(&self) -> &Session {
        &self.session
    }

    /// Runs a statement within the statement budget, behind the statements' breaker (when
    /// guarded).
    pub(crate) async fn exec(
        &self,
        stmt: &PreparedStatement,
        values: impl SerializeRow,
    ) -> Result<QueryResult, StoreError> {
        self.exec_within(stmt, values, |g| &g.statements).await
    }

    /// Runs a read the redirect path waits for: within the tighter read budget, behind the
    /// reads' breaker (when guarded).
    pub(crate) async fn read(
        &self,
        stmt: &PreparedStatement,
        values: impl SerializeRow,
    ) -> Result<QueryResult, StoreError> {
        self.exec_within(stmt, values, |g| &g.reads).await
    }

    async fn exec_within(
        &self,
        stmt: &PreparedStatement,
        values: impl SerializeRow,
        class: fn(&Guard) -> &Guarded,
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
        let Guarded { breaker, budget } = class(g);
        let budget = *budget;
        breaker
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
