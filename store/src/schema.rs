//! The schema (deploy/cql/schema.cql, the one source) and its migration: the keyspace, every
//! table, the columns added since a table's first release, and the rows a new schema starts
//! with.

use crate::config::StoreConfig;
use crate::db::{all, connect, first, unavailable, StoreError};
use crate::outbox::expiry_bucket;

const SCHEMA: &str = include_str!("../../deploy/cql/schema.cql");

/// Columns added to a table after its first release: (table, column, type). `migrate` adds
/// each one an existing table lacks; the schema file's CREATE TABLE already has them.
const ADDED_COLUMNS: &[(&str, &str, &str)] = &[
    ("links", "disabled_by", "text"),
    ("outbox", "traceparent", "text"),
];

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

#[cfg(test)]
mod tests {
    #[test]
    fn schema_file_splits_into_create_statements() {
        let stmts = super::schema_statements();
        assert_eq!(stmts.len(), 14);
        assert!(stmts
            .iter()
            .all(|s| s.starts_with("CREATE TABLE IF NOT EXISTS")));
        assert!(stmts.iter().all(|s| !s.contains("--")));
    }
}
