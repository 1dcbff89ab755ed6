//! The seam between primary and the event pipeline.
//!
//! Handlers hand every link change and every click to an [`EventSink`]: `relay::KafkaSink`
//! (outbox for link events, the on-disk click spool for clicks) or [`LogSink`] (counts only).
//! Clicks must never block or fail a redirect, so `clicked` is synchronous and infallible.

use crate::metrics::Metrics;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use zlink_store::Link;
use zlink_wire::events::{ClickRef, LinkEvent, LinkEventKind, LINK_EVENT_SCHEMA};

pub trait EventSink: Send + Sync + 'static {
    /// True if this sink drains the outbox: handlers then write an outbox row
    /// `(ev.key, ev.at_ms, ev.version)` before every change they announce.
    fn uses_outbox(&self) -> bool {
        false
    }
    /// A link was created or changed state; called after the store accepted the change.
    fn link_changed(&self, ev: LinkEvent);
    /// A redirect was answered. Must return immediately; true if the click is durably recorded
    /// (then its id is shown to the client in `x-zlink-click-id`).
    fn clicked(&self, ev: &ClickRef<'_>) -> bool;
    /// Graceful shutdown, after requests drained: flush what is buffered.
    fn close(&self) -> Pin<Box<dyn Future<Output = ()> + Send + '_>> {
        Box::pin(async {})
    }
}

/// The `links` event announcing that `l` is now in its current state.
pub fn link_event(kind: LinkEventKind, l: &Link, now_ms: i64) -> LinkEvent {
    LinkEvent {
        schema: LINK_EVENT_SCHEMA,
        kind,
        key: l.key.clone(),
        url: l.url.clone(),
        status: l.status,
        version: l.version,
        redirect_code: l.redirect_code,
        created_at_ms: l.created_at_ms,
        expires_at_ms: l.expires_at_ms,
        at_ms: now_ms,
    }
}

pub fn kind_label(kind: LinkEventKind) -> &'static str {
    match kind {
        LinkEventKind::Created => "created",
        LinkEventKind::Disabled => "disabled",
        LinkEventKind::Enabled => "enabled",
        LinkEventKind::Expired => "expired",
        LinkEventKind::Deleted => "deleted",
        LinkEventKind::Updated => "updated",
    }
}

/// Counts events and logs them at debug level; publishes nothing.
pub struct LogSink {
    metrics: Arc<Metrics>,
}

impl LogSink {
    pub fn new(metrics: Arc<Metrics>) -> Self {
        Self { metrics }
    }
}

impl EventSink for LogSink {
    fn link_changed(&self, ev: LinkEvent) {
        self.metrics
            .events
            .with_label_values(&["links", kind_label(ev.kind)])
            .inc();
        tracing::debug!(slug = %ev.key, kind = kind_label(ev.kind), version = ev.version, "link event");
    }

    fn clicked(&self, ev: &ClickRef<'_>) -> bool {
        self.metrics.click_events.inc();
        tracing::trace!(slug = %ev.key, id = %ev.id, "click event");
        false
    }
}
