//! The seam between primary and the event pipeline.
//!
//! Handlers hand every link change and every click to an [`EventSink`]. Publishing to Kafka
//! (with an outbox for link events) plugs in here; until then [`LogSink`] counts and logs them.
//! Clicks must never block or fail a redirect, so `clicked` is synchronous and infallible:
//! implementations enqueue and drop (counted) when full.

use crate::metrics::Metrics;
use std::sync::Arc;
use zlink_wire::events::{ClickEvent, LinkEvent, LinkEventKind};

pub trait EventSink: Send + Sync + 'static {
    /// True if this sink drains the outbox: handlers then write an outbox row
    /// `(ev.slug, ev.at_ms, ev.version)` before every change they announce.
    fn uses_outbox(&self) -> bool {
        false
    }
    /// A link was created or changed state; called after the store accepted the change.
    fn link_changed(&self, ev: LinkEvent);
    /// A redirect was answered. Must return immediately.
    fn clicked(&self, ev: ClickEvent);
}

pub fn kind_label(kind: LinkEventKind) -> &'static str {
    match kind {
        LinkEventKind::Created => "created",
        LinkEventKind::Disabled => "disabled",
        LinkEventKind::Enabled => "enabled",
        LinkEventKind::Expired => "expired",
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
        tracing::debug!(slug = %ev.slug, kind = kind_label(ev.kind), version = ev.version, "link event");
    }

    fn clicked(&self, ev: ClickEvent) {
        self.metrics
            .events
            .with_label_values(&["clicks", "click"])
            .inc();
        tracing::trace!(slug = %ev.slug, id = %ev.id, "click event");
    }
}
