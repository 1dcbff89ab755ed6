//! Waiting for the store at start-up: it may still be starting when a service is.

use crate::config::StoreConfig;
use crate::db::{Db, StoreError};
use std::time::{Duration, Instant};

/// Retries `op` every 500 ms while it fails, for at most `within` (the store may be starting).
pub async fn retry_for<T, F, Fut>(what: &str, within: Duration, mut op: F) -> Result<T, StoreError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, StoreError>>,
{
    let deadline = Instant::now() + within;
    loop {
        match op().await {
            Ok(v) => return Ok(v),
            Err(e) if Instant::now() < deadline => {
                tracing::warn!(error = %e, "{what} failed; retrying");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(e) => return Err(e),
        }
    }
}

/// Connects to the store, retrying for at most `within`.
pub async fn connect_store(cfg: &StoreConfig, within: Duration) -> Result<Db, StoreError> {
    retry_for("connecting to the store", within, || Db::connect(cfg)).await
}
