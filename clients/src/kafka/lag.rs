//! How far a consumer, or its whole group, is behind its topic.

use rdkafka::consumer::{Consumer, ConsumerContext, StreamConsumer};
use rdkafka::TopicPartitionList;
use std::time::{Duration, Instant};

/// The most one look at a backlog ([`backlog`], [`consumer_lag`]) waits for Kafka, all its
/// requests together. A consumer that gets no answer (stuck, or its broker gone) costs one look
/// of this long instead of a timeout per request (committed offsets, then each partition's
/// watermarks: 7 s for six partitions), so a stall watch that looks every second while a
/// consumer is suspect still looks about every second. On a Kafka that answers a look takes
/// milliseconds; partitions left unasked when the budget is spent are unknown (not waiting,
/// not caught up).
pub const LOOK_BUDGET: Duration = Duration::from_secs(1);

/// Shorter than this left of a look's budget: the request is not sent.
const LEAST_WAIT: Duration = Duration::from_millis(100);

/// What is left of one look's time budget.
#[derive(Debug, Clone, Copy)]
struct Budget {
    until: Instant,
}

impl Budget {
    fn new(total: Duration) -> Self {
        Budget {
            until: Instant::now() + total,
        }
    }

    /// How long the next request may wait: `most`, or what is left if less; `None` when less
    /// than [`LEAST_WAIT`] is left.
    fn wait(&self, most: Duration) -> Option<Duration> {
        self.wait_at(Instant::now(), most)
    }

    fn wait_at(&self, now: Instant, most: Duration) -> Option<Duration> {
        let left = self.until.saturating_duration_since(now);
        (left >= LEAST_WAIT).then(|| left.min(most))
    }
}

/// How far a consumer, or with nothing assigned to it its whole group, is behind its topic.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Backlog {
    /// Messages behind the high watermark, per partition assigned to this consumer.
    pub lags: Vec<(i32, i64)>,
    /// `Some(true)`: messages wait for this consumer (with nothing assigned: for its group);
    /// `Some(false)`: none wait; `None`: Kafka did not say.
    pub waiting: Option<bool>,
    /// With nothing assigned: the group's committed offsets summed over the topic, so that a
    /// group making progress on another member is not taken for stalled.
    pub group_position: Option<i64>,
    /// Kafka answered (a partition's watermarks or, with nothing assigned, the topic's
    /// metadata): what readiness needs, without asking a second time.
    pub answered: bool,
    /// Partitions assigned to this consumer when it was asked.
    pub assigned: usize,
}

/// Asks Kafka how far `consumer` is behind on `topic`. Blocking (several requests, at most
/// [`LOOK_BUDGET`] in all): call it from `spawn_blocking`.
pub fn backlog<C: ConsumerContext>(consumer: &StreamConsumer<C>, topic: &str) -> Backlog {
    let budget = Budget::new(LOOK_BUDGET);
    let assigned = consumer.assignment().map(|a| a.count()).unwrap_or(0);
    if assigned > 0 {
        let lags = lag_within(consumer, &budget);
        let waiting = if lags.iter().any(|(_, l)| *l > 0) {
            Some(true)
        } else if lags.len() == assigned {
            Some(false)
        } else {
            None
        };
        return Backlog {
            answered: !lags.is_empty(),
            lags,
            waiting,
            group_position: None,
            assigned,
        };
    }
    // Nothing assigned to this member: it is only stalled if its group is (a member that lost
    // its assignment and never got one back is what a stuck consumer looked like here).
    let Some(md) = budget
        .wait(Duration::from_secs(1))
        .and_then(|t| consumer.fetch_metadata(Some(topic), t).ok())
    else {
        return Backlog::default();
    };
    let answered = Backlog {
        answered: true,
        ..Backlog::default()
    };
    let mut all = TopicPartitionList::new();
    for t in md.topics().iter().filter(|t| t.name() == topic) {
        for p in t.partitions() {
            all.add_partition(topic, p.id());
        }
    }
    if all.count() == 0 {
        return answered;
    }
    // The coordinator not answering says nothing is known (and, if it lasts, is the stall).
    let Some(committed) = budget
        .wait(Duration::from_secs(2))
        .and_then(|t| consumer.committed_offsets(all, t).ok())
    else {
        return answered;
    };
    let (mut waiting, mut known, mut position) = (false, true, 0i64);
    for e in committed.elements() {
        let Some((low, high)) = budget
            .wait(Duration::from_secs(1))
            .and_then(|t| consumer.fetch_watermarks(topic, e.partition(), t).ok())
        else {
            known = false;
            continue;
        };
        let at = e
            .offset()
            .to_raw()
            .filter(|o| *o >= 0)
            .unwrap_or(low)
            .max(low);
        position += at;
        waiting |= high > at;
    }
    Backlog {
        lags: Vec::new(),
        waiting: (waiting || known).then_some(waiting),
        group_position: known.then_some(position),
        answered: true,
        assigned: 0,
    }
}

/// Whether Kafka answers a fresh client built from `config` (no group): the topic's metadata
/// within a second. Blocking: call it from `spawn_blocking`. The client is closed before it
/// returns.
pub fn answers(config: &rdkafka::ClientConfig, topic: &str) -> bool {
    let client: Result<rdkafka::consumer::BaseConsumer<super::Quiet>, _> =
        config.create_with_context(super::Quiet::default());
    match client {
        Ok(c) => c
            .fetch_metadata(Some(topic), Duration::from_secs(1))
            .is_ok(),
        Err(e) => {
            tracing::warn!(error = %e, "creating the Kafka probe client failed");
            false
        }
    }
}

/// [`answers`] on a blocking thread, for the async callers (a consumer's stall watch, a
/// producer's): false also when that thread failed.
pub async fn answers_off_runtime(config: rdkafka::ClientConfig, topic: String) -> bool {
    tokio::task::spawn_blocking(move || answers(&config, &topic))
        .await
        .unwrap_or(false)
}

/// Messages behind the high watermark, per partition assigned to `consumer` (those Kafka
/// answered for within [`LOOK_BUDGET`]). Blocking (it asks the broker): call it from
/// `spawn_blocking`.
pub fn consumer_lag<C: ConsumerContext>(consumer: &StreamConsumer<C>) -> Vec<(i32, i64)> {
    lag_within(consumer, &Budget::new(LOOK_BUDGET))
}

fn lag_within<C: ConsumerContext>(
    consumer: &StreamConsumer<C>,
    budget: &Budget,
) -> Vec<(i32, i64)> {
    let mut out = Vec::new();
    let Ok(positions) = consumer.position() else {
        return out;
    };
    // Before the first message of a partition arrives its position is unknown; then the
    // committed offset is where consumption stands.
    let committed = budget
        .wait(Duration::from_secs(1))
        .and_then(|t| consumer.committed(t).ok());
    for e in positions.elements() {
        let Some((low, high)) = budget
            .wait(Duration::from_secs(1))
            .and_then(|t| consumer.fetch_watermarks(e.topic(), e.partition(), t).ok())
        else {
            continue;
        };
        let pos = e
            .offset()
            .to_raw()
            .filter(|o| *o >= 0)
            .or_else(|| {
                committed
                    .as_ref()?
                    .find_partition(e.topic(), e.partition())?
                    .offset()
                    .to_raw()
                    .filter(|o| *o >= 0)
            })
            .unwrap_or(0);
        // Below the low watermark is where nothing can be read (retention removed it).
        out.push((e.partition(), (high - pos.max(low)).max(0)));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_looks_requests_share_its_budget_and_none_is_sent_once_it_is_spent() {
        let b = Budget::new(Duration::from_millis(1500));
        let t0 = b.until - Duration::from_millis(1500);
        let ms = Duration::from_millis;
        // A request never waits longer than it would alone, nor longer than what is left.
        assert_eq!(b.wait_at(t0, ms(1000)), Some(ms(1000)));
        assert_eq!(b.wait_at(t0 + ms(1000), ms(1000)), Some(ms(500)));
        assert_eq!(b.wait_at(t0 + ms(1400), ms(1000)), Some(ms(100)));
        // Less than the least worth sending left, or past the end: nothing is sent.
        assert_eq!(b.wait_at(t0 + ms(1401), ms(1000)), None);
        assert_eq!(b.wait_at(t0 + ms(5000), ms(1000)), None);
    }
}
