//! The consumer a service uses now, replaced when it stalls or dies.

use super::{backlog, Activity, Backlog, ClosingConsumer, StallWatch};
use prometheus::{IntCounter, IntGaugeVec};
use rdkafka::error::KafkaResult;
use rdkafka::ClientConfig;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

/// The consumer a service uses now, replaced when it stalls ([`StallWatch`]) or fails fatally
/// ([`is_fatal`]). The service runs one loop per consumer ([`Self::start`]); a loop ends when
/// the watch calls [`Self::stop_current`] or the consumer died, and [`Self::replace`] puts a
/// fresh consumer in place. The old one closes on a thread of its own once nothing holds it.
pub struct Replaceable {
    current: RwLock<Arc<ClosingConsumer>>,
    generation: Mutex<tokio_util::sync::CancellationToken>,
    connect: Box<dyn Fn() -> KafkaResult<ClosingConsumer> + Send + Sync>,
    /// Settings of the fresh client that asks Kafka whether it answers at all, when the current
    /// consumer gets no answer ([`StallWatch::wants_probe`]).
    probe: Option<ClientConfig>,
}

impl Replaceable {
    /// Connects the first consumer with `connect` (also used for every replacement).
    pub fn new(
        connect: impl Fn() -> KafkaResult<ClosingConsumer> + Send + Sync + 'static,
    ) -> KafkaResult<Self> {
        Ok(Replaceable {
            current: RwLock::new(Arc::new(connect()?)),
            generation: Mutex::new(tokio_util::sync::CancellationToken::new()),
            connect: Box::new(connect),
            probe: None,
        })
    }

    /// Lets the stall watch ask a fresh client built from `config` (the brokers and the TLS
    /// settings of the consumer, no group) whether Kafka answers, when the consumer gets no
    /// answer itself: a consumer stuck while Kafka answers everyone else is then replaced within
    /// seconds, not after the long window.
    pub fn with_probe(mut self, config: ClientConfig) -> Self {
        self.probe = Some(config);
        self
    }

    /// The consumer in use.
    pub fn current(&self) -> Arc<ClosingConsumer> {
        self.current
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The consumer for the next loop, and the token that stops that loop: `shutdown`'s child,
    /// also cancelled by [`Self::stop_current`].
    pub fn start(
        &self,
        shutdown: &tokio_util::sync::CancellationToken,
    ) -> (Arc<ClosingConsumer>, tokio_util::sync::CancellationToken) {
        let stop = shutdown.child_token();
        *self.generation.lock().unwrap_or_else(|p| p.into_inner()) = stop.clone();
        (self.current(), stop)
    }

    /// Stops the current consumer's loop (the watch found it stalled).
    pub fn stop_current(&self) {
        self.generation
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .cancel();
    }

    /// One round of a stall watch on `topic`: asks Kafka (off the runtime) how far the current
    /// consumer is behind, sets `lag` per assigned partition and, when `stall` finds it stalled
    /// (given what `activity` saw since the last round), counts it in `resets` and stops its loop
    /// so the service replaces it. With a probe ([`Self::with_probe`]) and when the watch asks,
    /// a fresh client first asks Kafka whether it answers at all. Returns the [`Backlog`] (its
    /// `answered` is Kafka's liveness as the current consumer sees it).
    pub async fn check_stall(
        &self,
        topic: &str,
        stall: &mut StallWatch,
        activity: &Activity,
        lag: &IntGaugeVec,
        resets: &IntCounter,
    ) -> Backlog {
        let (consumer, t) = (self.current(), topic.to_owned());
        let backlog = tokio::task::spawn_blocking(move || backlog(&consumer, &t))
            .await
            .unwrap_or_default();
        for (p, l) in &backlog.lags {
            lag.with_label_values(&[&p.to_string()]).set(*l);
        }
        let (received, busy) = activity.take();
        let now = Instant::now();
        let probe = match &self.probe {
            Some(config) if stall.wants_probe(now, received, busy, &backlog) => {
                let answered = super::answers_off_runtime(config.clone(), topic.to_owned()).await;
                tracing::info!(
                    topic,
                    answered,
                    "Kafka asked by a fresh client: the consumer gets no answer"
                );
                Some(answered)
            }
            _ => None,
        };
        if stall.observe(now, received, busy, &backlog, probe) {
            tracing::warn!(
                topic,
                waiting = ?backlog.waiting,
                assigned = backlog.assigned,
                answered = backlog.answered,
                why = stall.reason(),
                "Kafka consumer stalled; replacing it"
            );
            resets.inc();
            self.stop_current();
        }
        backlog
    }

    /// After a loop ended other than by `shutdown`: a second later (two members fencing each
    /// other, e.g. a duplicate `--group-instance-id`, alternate once a second instead of
    /// spinning), a fresh consumer in place of the current one, retried every second. False if
    /// `shutdown` came first.
    pub async fn replace(&self, shutdown: &tokio_util::sync::CancellationToken) -> bool {
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return false,
                _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            }
            match (self.connect)() {
                Ok(fresh) => {
                    *self.current.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(fresh);
                    return true;
                }
                Err(e) => tracing::error!(error = %e, "creating a Kafka consumer failed"),
            }
        }
    }
}
