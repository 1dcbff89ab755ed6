//! The counter's metrics (`zlink_clicks_*`), served on its ops endpoint.

use prometheus::{
    Gauge, Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGaugeVec, Opts, Registry,
};

pub struct CounterMetrics {
    registry: Registry,
    /// Events by outcome: counted, duplicate (a copy of a counted click), redelivered (an
    /// offset already counted), invalid (skipped).
    pub events: IntCounterVec,
    pub batches: IntCounter,
    /// What the sources hold in memory: `keys` ((link, day) states), `ids`.
    pub held: IntGaugeVec,
    /// Failed store round trips (retried).
    pub store_errors: IntCounter,
    /// From the click to its count being stored, seconds (stats freshness).
    pub click_to_count_seconds: Histogram,
    /// Messages behind, per partition (a message holds one or more clicks).
    pub consumer_lag: IntGaugeVec,
    /// How far behind the counter is in time: while messages wait, the time since the later of
    /// the newest consumed message's timestamp and the last moment none waited (an upper bound
    /// on the oldest waiting one's age); 0 when none waits.
    pub consumer_lag_seconds: Gauge,
    /// Consumers replaced because they stalled ([`kafka::StallWatch`]).
    pub consumer_resets: IntCounter,
}

impl CounterMetrics {
    pub fn new() -> Self {
        let registry =
            Registry::new_custom(Some("zlink_clicks".into()), None).expect("valid prefix");
        let events = IntCounterVec::new(
            Opts::new("events_total", "Click events by outcome"),
            &["outcome"],
        )
        .expect("metric");
        let batches = IntCounter::new("batches_total", "Windows of batches written (flushes)")
            .expect("metric");
        let held = IntGaugeVec::new(
            Opts::new("held", "State held in memory by the counter's sources"),
            &["what"],
        )
        .expect("metric");
        let store_errors =
            IntCounter::new("store_errors_total", "Failed store round trips").expect("metric");
        let click_to_count_seconds = Histogram::with_opts(
            HistogramOpts::new("click_to_count_seconds", "Click to counted").buckets(vec![
                0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 3600.0,
            ]),
        )
        .expect("metric");
        let consumer_lag = IntGaugeVec::new(
            Opts::new("consumer_lag", "Messages not yet consumed, per partition"),
            &["partition"],
        )
        .expect("metric");
        let consumer_lag_seconds = Gauge::new(
            "consumer_lag_seconds",
            "While click messages wait: seconds since the newest one consumed was written or none waited, whichever is later (0: none waits)",
        )
        .expect("metric");
        let consumer_resets = IntCounter::new(
            "consumer_resets_total",
            "Kafka consumers replaced because they stalled",
        )
        .expect("metric");
        zlink_clients::register_metrics!(
            registry,
            events,
            consumer_resets,
            batches,
            held,
            store_errors,
            click_to_count_seconds,
            consumer_lag,
            consumer_lag_seconds,
        );
        CounterMetrics {
            registry,
            events,
            batches,
            held,
            store_errors,
            click_to_count_seconds,
            consumer_lag,
            consumer_lag_seconds,
            consumer_resets,
        }
    }

    pub fn render(&self) -> Vec<u8> {
        zlink_clients::ops::render(&self.registry)
    }
}

impl Default for CounterMetrics {
    fn default() -> Self {
        Self::new()
    }
}
