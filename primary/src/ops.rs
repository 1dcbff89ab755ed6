//! The operator endpoints: `/healthz` (alive), `/readyz` (the store answers), `/metrics`,
//! answered by [`zlink_clients::ops`] like every service's.

use crate::app::AppState;
use crate::error::Resp;
use std::time::Duration;
use zlink_clients::ops::{self, Readiness};

/// `GET /healthz`: the process is alive.
#[utoipa::path(operation_id = "healthz", get, path = "/healthz", tag = "ops", responses((status = 200, description = "alive")))]
pub(crate) fn healthz() -> Resp {
    ops::healthz()
}

/// `GET /readyz`: ready when the store answers a ping within a second.
#[utoipa::path(operation_id = "readyz", get, path = "/readyz", tag = "ops",
    responses((status = 200, description = "ready"), (status = 503, description = "store unavailable")))]
pub(crate) async fn readyz(state: &AppState) -> Resp {
    let state = match tokio::time::timeout(Duration::from_secs(1), state.store.db.ping()).await {
        Ok(Ok(())) => return ops::readyz(Readiness::Ready),
        Ok(Err(e)) => {
            // The error text (addresses, driver internals) goes to the log, never the response.
            tracing::warn!(error = %e, "not ready: store");
            "unavailable"
        }
        Err(_) => "timeout",
    };
    ops::readyz(Readiness::NotReady {
        dependency: "store",
        state,
    })
}

/// `GET /metrics`: every metric of this process (Prometheus text format).
#[utoipa::path(operation_id = "metrics", get, path = "/metrics", tag = "ops",
    responses((status = 200, content_type = "text/plain", description = "Prometheus text format")))]
pub(crate) fn metrics(state: &AppState) -> Resp {
    let (known, connected) = state.store.db.nodes();
    let nodes = &state.metrics.store_nodes;
    nodes
        .with_label_values(&["connected"])
        .set(connected as i64);
    nodes
        .with_label_values(&["unreachable"])
        .set(known.saturating_sub(connected) as i64);
    ops::metrics(state.metrics.render())
}
