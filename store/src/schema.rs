//! The schema (deploy/cql/schema.cql, the one source) and its migration: the keyspace, every
//! table, the columns added since a table's first release, and the rows a new schema starts
//! with.

use crate::config::StoreConfig;
use crate::db::{all, connect, first, unavailable, StoreError};
use crate::outbox::expiry_bucket;
use scylla::client::session::Session;
use scylla::value::CqlTimestamp;
use std::sync::Arc;

const SCHEMA: &str = include_str!("../../deploy/cql/schema.cql");

/// Columns added to a table after its first release: (table, column, type). `migrate` adds
/// each one an existing table lacks; the schema file's CREATE TABLE already has them.
const ADDED_COLUMNS: &[(&str, &str, &str)] = &[
    ("links", "disabled_by", "text"),
    ("outbox", "traceparent", "text"),
    ("links", "alias", "text"),
];

/// Creates the keyspace if it is missing and applies every statement of the schema file.
pub async fn migrate(cfg: &StoreConfig, replication_factor: u32) -> Result<(), StoreError> {
    crate::config::validate_keyspace(&cfg.keyspace).map_err(StoreError::Corrupt)?;
    let session = Arc::new(connect(cfg, None).await?);
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
    // Tables created before the schema set speculative_retry get it (once: then it matches).
    let res = session
        .query_unpaged(
            "SELECT table_name, speculative_retry FROM system_schema.tables \
             WHERE keyspace_name = ?",
            (&cfg.keyspace,),
        )
        .await
        .map_err(unavailable)?;
    for (table, retry) in all::<(String, Option<String>)>(res)? {
        let ours = table
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
        if ours && !is_speculative_retry(retry.as_deref().unwrap_or("")) {
            tracing::info!(
                table,
                ?retry,
                "setting speculative_retry = '{SPECULATIVE_RETRY}'"
            );
            session
                .query_unpaged(
                    format!("ALTER TABLE {table} WITH speculative_retry = '{SPECULATIVE_RETRY}'"),
                    &[],
                )
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
    // Links created before the owner index existed are entered in it once; a marker row
    // records that it was done (redoing it is harmless: every write is an upsert).
    let done = session
        .query_unpaged(
            "SELECT position FROM cursors WHERE name = 'owner_index'",
            &[],
        )
        .await
        .map_err(unavailable)?;
    if first::<(Option<i64>,)>(done)?.is_none() {
        let entered = index_existing_links(session.clone()).await?;
        tracing::info!(links = entered, "owner index filled from the links table");
        session
            .query_unpaged(
                "INSERT INTO cursors (name, position) VALUES ('owner_index', ?)",
                (entered as i64,),
            )
            .await
            .map_err(unavailable)?;
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
    // Counters from this schema on write click_sums. One from before it (still running during
    // a rolling upgrade, for up to a day) writes click_totals rows for clicks up to a day ahead:
    // the new counter reads their offsets for days up to two days from now. A store without
    // click_totals rows has none to read.
    upgrade_cursor(
        &session,
        "click_totals",
        crate::clicks::LEGACY_UNTIL,
        now_ms,
    )
    .await?;
    // Counters from this schema on write click_groups, except for the days up to this cursor,
    // which go on in click_sums: a counter from before it (for up to a day of a rolling
    // upgrade) writes click_sums rows for clicks up to a day ahead. A store without click_sums
    // rows has none to go on with.
    upgrade_cursor(&session, "click_sums", crate::clicks::SUMS_UNTIL, now_ms).await?;
    Ok(())
}

/// Writes the cursor `name` once (never moved after): two days from now if the click table
/// `table` has rows (the days a counter from before the change may still count there), else -1.
async fn upgrade_cursor(
    session: &Session,
    table: &str,
    name: &str,
    now_ms: i64,
) -> Result<(), StoreError> {
    let rows = session
        .query_unpaged(format!("SELECT slug FROM {table} LIMIT 1"), &[])
        .await
        .map_err(unavailable)?;
    let until = match first::<(String,)>(rows)? {
        Some(_) => i64::from(crate::clicks::day_of(now_ms)) + 2,
        None => -1,
    };
    session
        .query_unpaged(
            "INSERT INTO cursors (name, position) VALUES (?, ?) IF NOT EXISTS",
            (name, until),
        )
        .await
        .map_err(unavailable)?;
    Ok(())
}

/// Enters every link in `links_by_owner` and `owner_months`, a page of 256 at a time (the
/// page's writes concurrently). Returns how many links it entered.
async fn index_existing_links(session: Arc<Session>) -> Result<u64, StoreError> {
    let mut scan = session
        .prepare("SELECT owner, created_at, slug FROM links")
        .await
        .map_err(unavailable)?;
    scan.set_page_size(256);
    let add = session
        .prepare("INSERT INTO links_by_owner (owner, month, created_at, slug) VALUES (?, ?, ?, ?)")
        .await
        .map_err(unavailable)?;
    let add_month = session
        .prepare("INSERT INTO owner_months (owner, month) VALUES (?, ?)")
        .await
        .map_err(unavailable)?;
    let mut paging = scylla::response::PagingState::start();
    let mut entered = 0u64;
    loop {
        let (res, next) = session
            .execute_single_page(&scan, &[], paging)
            .await
            .map_err(unavailable)?;
        let mut writes = tokio::task::JoinSet::new();
        type Row = (Option<String>, Option<CqlTimestamp>, String);
        for (owner, created, slug) in all::<Row>(res)? {
            // The link reader refuses such a row too: nothing to list.
            let (Some(owner), Some(created)) = (owner, created) else {
                tracing::warn!(slug = %slug.escape_debug(), "link without owner or creation time not indexed");
                continue;
            };
            let (session, add, add_month) = (session.clone(), add.clone(), add_month.clone());
            entered += 1;
            writes.spawn(async move {
                let month = crate::links::month_of_ms(created.0);
                session.execute_unpaged(&add_month, (&owner, month)).await?;
                session
                    .execute_unpaged(&add, (&owner, month, created, &slug))
                    .await
            });
        }
        while let Some(r) = writes.join_next().await {
            r.map_err(|e| StoreError::Unavailable(format!("owner index task: {e}")))?
                .map_err(unavailable)?;
        }
        match next.into_paging_control_flow() {
            std::ops::ControlFlow::Continue(p) => paging = p,
            std::ops::ControlFlow::Break(()) => return Ok(entered),
        }
    }
}

/// The statements of deploy/cql/schema.cql, comments removed.
/// Every table's speculative_retry (deploy/cql/schema.cql says why).
const SPECULATIVE_RETRY: &str = "30ms";

/// Whether a table's speculative_retry as the store shows it is [`SPECULATIVE_RETRY`]
/// (Cassandra shows `30ms`, ScyllaDB `30.00ms`).
fn is_speculative_retry(shown: &str) -> bool {
    let s = shown.trim().to_ascii_lowercase();
    let want: f64 = SPECULATIVE_RETRY
        .trim_end_matches("ms")
        .parse()
        .unwrap_or(0.0);
    s.strip_suffix("ms")
        .and_then(|n| n.parse::<f64>().ok())
        .is_some_and(|n| (n - want).abs() < 1e-9)
}

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

#[cfg(test)]
mod tests {
    #[test]
    fn speculative_retry_is_recognised_as_either_store_shows_it() {
        for ok in ["30ms", "30.00ms", " 30MS "] {
            assert!(super::is_speculative_retry(ok), "{ok}");
        }
        for no in ["99p", "99PERCENTILE", "3ms", "300ms", "", "ms", "ALWAYS"] {
            assert!(!super::is_speculative_retry(no), "{no}");
        }
    }

    #[test]
    fn every_table_is_created_with_the_speculative_retry() {
        for stmt in super::schema_statements() {
            if stmt.starts_with("CREATE TABLE") {
                assert!(
                    stmt.contains("speculative_retry = '30ms'"),
                    "{}",
                    stmt.lines().next().unwrap_or("")
                );
            }
        }
    }
    #[test]
    fn schema_file_splits_into_create_statements() {
        let stmts = super::schema_statements();
        assert_eq!(stmts.len(), 22);
        assert!(stmts
            .iter()
            .all(|s| s.starts_with("CREATE TABLE IF NOT EXISTS")));
        assert!(stmts.iter().all(|s| !s.contains("--")));
    }
}
