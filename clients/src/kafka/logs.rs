//! librdkafka's log lines and global errors, with repeats held back.
//!
//! While a cluster is unreachable (the case lastresort exists for: its datacenter is down)
//! librdkafka reports every failed reconnect, and `AllBrokersDown` each time the last
//! connection drops again: measured with a lastresort whose Kafka refused connections, 452
//! error lines in 10 s, 12 a second once steady (up to 74 a second while the producer retried a
//! batch). rdkafka's default context logs each of them, so an outage of a day writes a million
//! identical lines per process and buries what else happened.
//!
//! [`Quiet`] (the context of every zlink Kafka client) logs the first line of each kind at
//! once, then at most one of that kind per [`REPEAT_WINDOW`], carrying how many were held back
//! since (`repeated`). A kind is the facility and the text with its digits blanked out
//! (`0/1 brokers are down` and `1/1 brokers are down` are one kind). Lines of other kinds pass
//! as before; debug lines are not limited (they are off unless asked for).

use rdkafka::client::ClientContext;
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::consumer::ConsumerContext;
use rdkafka::error::KafkaError;
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How often, at most, one kind of line is logged.
pub const REPEAT_WINDOW: Duration = Duration::from_secs(60);
/// Kinds remembered at once; past that the memory starts over (each kind logs once more).
const MAX_KINDS: usize = 256;

/// When each kind of line was last logged and how many were held back since.
#[derive(Debug, Default)]
pub struct Repeats {
    kinds: Mutex<HashMap<String, (Instant, u64)>>,
}

impl Repeats {
    /// Whether a line of `kind` seen at `now` is logged: `Some(held back since the last one
    /// logged)`, or `None` (held back, counted).
    pub fn admit(&self, kind: String, now: Instant) -> Option<u64> {
        let mut kinds = self.kinds.lock().unwrap_or_else(|p| p.into_inner());
        if kinds.len() >= MAX_KINDS && !kinds.contains_key(&kind) {
            kinds.clear();
        }
        match kinds.get_mut(&kind) {
            Some((logged, held)) if now.saturating_duration_since(*logged) < REPEAT_WINDOW => {
                *held += 1;
                None
            }
            Some((logged, held)) => {
                *logged = now;
                Some(std::mem::take(held))
            }
            None => {
                kinds.insert(kind, (now, 0));
                Some(0)
            }
        }
    }
}

/// A line's kind: its facility and text, digits blanked (counts, ports, milliseconds).
pub fn kind_of(fac: &str, text: &str) -> String {
    let mut k = String::with_capacity(fac.len() + 1 + text.len().min(200));
    k.push_str(fac);
    k.push(' ');
    k.extend(
        text.chars()
            .take(200)
            .map(|c| if c.is_ascii_digit() { '#' } else { c }),
    );
    k
}

/// The client context of zlink's Kafka clients: rdkafka's default, with repeated log lines and
/// global errors held back ([`Repeats`]).
#[derive(Debug, Default)]
pub struct Quiet {
    repeats: Repeats,
}

impl Quiet {
    /// Logs a line unless it is a repeat within the window.
    pub fn log_line(&self, level: tracing::Level, fac: &str, text: &str) {
        if level == tracing::Level::DEBUG || level == tracing::Level::TRACE {
            tracing::debug!(target: "librdkafka", "librdkafka: {fac} {text}");
            return;
        }
        let Some(repeated) = self.repeats.admit(kind_of(fac, text), Instant::now()) else {
            return;
        };
        match level {
            tracing::Level::ERROR => {
                tracing::error!(target: "librdkafka", repeated, "librdkafka: {fac} {text}")
            }
            tracing::Level::WARN => {
                tracing::warn!(target: "librdkafka", repeated, "librdkafka: {fac} {text}")
            }
            _ => tracing::info!(target: "librdkafka", repeated, "librdkafka: {fac} {text}"),
        }
    }
}

impl ClientContext for Quiet {
    fn log(&self, level: RDKafkaLogLevel, fac: &str, log_message: &str) {
        self.log_line(level_of(level), fac, log_message);
    }

    fn error(&self, error: KafkaError, reason: &str) {
        self.log_line(tracing::Level::ERROR, &format!("{error}:"), reason);
    }
}

impl ConsumerContext for Quiet {}

/// rdkafka's mapping of librdkafka's syslog levels.
pub fn level_of(level: RDKafkaLogLevel) -> tracing::Level {
    match level {
        RDKafkaLogLevel::Emerg
        | RDKafkaLogLevel::Alert
        | RDKafkaLogLevel::Critical
        | RDKafkaLogLevel::Error => tracing::Level::ERROR,
        RDKafkaLogLevel::Warning => tracing::Level::WARN,
        RDKafkaLogLevel::Notice | RDKafkaLogLevel::Info => tracing::Level::INFO,
        RDKafkaLogLevel::Debug => tracing::Level::DEBUG,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kind_logs_once_per_window_with_the_count_held_back() {
        let r = Repeats::default();
        let t0 = Instant::now();
        let down = |n: u32| kind_of("AllBrokersDown", &format!("{n}/1 brokers are down"));
        assert_eq!(r.admit(down(0), t0), Some(0));
        for i in 1..=10 {
            assert_eq!(
                r.admit(down(i % 2), t0 + Duration::from_secs(i.into())),
                None
            );
        }
        // Another kind is not held back by the first.
        assert_eq!(r.admit(kind_of("FAIL", "connect refused"), t0), Some(0));
        assert_eq!(r.admit(down(1), t0 + REPEAT_WINDOW), Some(10));
        assert_eq!(r.admit(down(1), t0 + REPEAT_WINDOW), None);
        assert_eq!(r.admit(down(1), t0 + 2 * REPEAT_WINDOW), Some(1));
    }

    #[test]
    fn kinds_blank_digits_and_stay_bounded() {
        assert_eq!(kind_of("f", "after 12ms, 3 left"), "f after ##ms, # left");
        assert_eq!(kind_of("f", &"x".repeat(1000)).len(), 2 + 200);
        let r = Repeats::default();
        let t0 = Instant::now();
        for i in 0..(MAX_KINDS + 10) {
            assert_eq!(r.admit(format!("kind {i:x}"), t0), Some(0));
        }
        assert!(r.kinds.lock().unwrap().len() <= MAX_KINDS);
    }
}
