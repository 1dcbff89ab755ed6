//! Rate limits: token buckets per API key and per client IP, kept in this process.
//!
//! Each bucket is GCRA (the "generic cell rate algorithm": one timestamp per key, the
//! theoretical arrival time of the next request, moved forward by one emission interval per
//! request admitted; a request is refused when that time lies more than the burst ahead of now).
//! Buckets live in a bounded moka cache and are dropped once idle long enough to be full again,
//! so memory is bounded whatever the number of keys or addresses; an attacker who churns
//! through more addresses than the cache holds at most resets other buckets to full.
//!
//! Limits are per primary process: behind a frontend that spreads requests over N primaries,
//! a key's effective limit is up to N times the configured one. The frontend nginx adds a
//! per-address limit shared by its workers (`limit_req`), in front of all primaries.

use std::hash::Hash;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// `RATE/UNIT[:BURST]` (`10/s:50`, `600/m`), or `off`. Burst defaults to the rate per unit.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rate {
    /// Time between two admitted requests at the sustained rate.
    pub interval: Duration,
    /// Requests admitted at once from a full bucket.
    pub burst: u32,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RateSpec(pub Option<Rate>);

impl std::str::FromStr for RateSpec {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let s = s.trim();
        if s.eq_ignore_ascii_case("off") {
            return Ok(RateSpec(None));
        }
        let bad = || format!("{s:?} is not a rate like 10/s:50, 600/m or off");
        let (rate, burst) = match s.split_once(':') {
            Some((r, b)) => (r, Some(b.parse::<u32>().map_err(|_| bad())?)),
            None => (s, None),
        };
        let (n, unit) = rate.split_once('/').ok_or_else(bad)?;
        let n: u32 = n.parse().map_err(|_| bad())?;
        let per = match unit {
            "s" => Duration::from_secs(1),
            "m" => Duration::from_secs(60),
            "h" => Duration::from_secs(3600),
            _ => return Err(bad()),
        };
        let burst = burst.unwrap_or(n);
        if n == 0 || burst == 0 || n > 1_000_000 {
            return Err(bad());
        }
        Ok(RateSpec(Some(Rate {
            interval: per / n,
            burst,
        })))
    }
}

/// A set of token buckets, one per key.
pub struct Limiter<K: Hash + Eq + Send + Sync + 'static> {
    rate: Option<Rate>,
    epoch: Instant,
    /// Per key: the theoretical arrival time, nanoseconds since `epoch`.
    tats: moka::sync::Cache<K, Arc<AtomicU64>>,
}

impl<K: Hash + Eq + Send + Sync + Clone + 'static> Limiter<K> {
    pub fn new(spec: RateSpec, capacity: u64) -> Self {
        // Idle for burst × interval, a bucket is full again: forgetting it changes nothing.
        let idle = spec
            .0
            .map_or(Duration::from_secs(1), |r| r.interval * r.burst)
            .max(Duration::from_secs(1));
        Self {
            rate: spec.0,
            epoch: Instant::now(),
            tats: moka::sync::Cache::builder()
                .max_capacity(capacity)
                .time_to_idle(idle)
                .build(),
        }
    }

    /// Admits one request for `key`, or says how long until one would be admitted.
    pub fn check(&self, key: K) -> Result<(), Duration> {
        let Some(rate) = self.rate else { return Ok(()) };
        self.check_at(key, self.epoch.elapsed(), rate)
    }

    /// Admits as many of `n` requests for `key` as its bucket holds now (at least one), or
    /// says how long until one would be admitted.
    pub fn check_n(&self, key: K, n: u32) -> Result<u32, Duration> {
        let Some(rate) = self.rate else { return Ok(n) };
        self.check_n_at(key, self.epoch.elapsed(), rate, n)
    }

    fn check_n_at(&self, key: K, now: Duration, rate: Rate, n: u32) -> Result<u32, Duration> {
        let now = u64::try_from(now.as_nanos()).unwrap_or(u64::MAX);
        let interval = u64::try_from(rate.interval.as_nanos())
            .unwrap_or(u64::MAX)
            .max(1);
        let tolerance = interval.saturating_mul(u64::from(rate.burst));
        let cell = self.tats.get_with(key, || Arc::new(AtomicU64::new(0)));
        let mut tat = cell.load(Ordering::Acquire);
        loop {
            let start = tat.max(now);
            // Requests that fit: start + k × interval - now ≤ tolerance.
            let room = tolerance.saturating_add(now).saturating_sub(start) / interval;
            let k = room.min(u64::from(n));
            if k == 0 {
                let next = start.saturating_add(interval);
                return Err(Duration::from_nanos(
                    next.saturating_sub(now).saturating_sub(tolerance),
                ));
            }
            let next = start.saturating_add(k * interval);
            match cell.compare_exchange_weak(tat, next, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return Ok(k as u32),
                Err(current) => tat = current,
            }
        }
    }

    fn check_at(&self, key: K, now: Duration, rate: Rate) -> Result<(), Duration> {
        self.check_n_at(key, now, rate, 1).map(drop)
    }
}

/// `Retry-After` in whole seconds, at least 1.
pub fn retry_after_secs(wait: Duration) -> u64 {
    wait.as_secs() + u64::from(wait.subsec_nanos() > 0).max(u64::from(wait.is_zero()))
}

/// The primary's limits (see the `--limit-*` flags).
pub struct Limits {
    /// Link writes (create, status change) per API key; admin keys are not limited.
    pub writes_per_key: Limiter<String>,
    /// Link writes per client address.
    pub writes_per_ip: Limiter<IpAddr>,
    /// Info pages (`/{slug}+`) per client address.
    pub info_per_ip: Limiter<IpAddr>,
    /// Bearer tokens that are not already known (each costs a store read) per client address.
    pub unknown_keys_per_ip: Limiter<IpAddr>,
    /// Addresses no per-address limit applies to (the load generator).
    pub exempt: zlink_clients::clicks::TrustedProxies,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rate(s: &str) -> Rate {
        s.parse::<RateSpec>().unwrap().0.unwrap()
    }

    #[test]
    fn specs_parse() {
        assert_eq!(
            rate("10/s:50"),
            Rate {
                interval: Duration::from_millis(100),
                burst: 50
            }
        );
        assert_eq!(rate("600/m").burst, 600);
        assert_eq!(rate("600/m").interval, Duration::from_millis(100));
        assert_eq!("off".parse::<RateSpec>().unwrap(), RateSpec(None));
        for bad in ["", "10", "10/d", "0/s", "10/s:0", "x/s", "10/s:y", "-1/s"] {
            assert!(bad.parse::<RateSpec>().is_err(), "{bad}");
        }
    }

    #[test]
    fn a_full_bucket_admits_the_burst_then_the_rate() {
        let r = rate("10/s:5");
        let l = Limiter::<&str>::new(RateSpec(Some(r)), 100);
        let t0 = Duration::from_secs(100);
        for _ in 0..5 {
            assert!(l.check_at("k", t0, r).is_ok());
        }
        let wait = l.check_at("k", t0, r).unwrap_err();
        assert_eq!(wait, Duration::from_millis(100));
        assert!(l.check_at("k", t0 + Duration::from_millis(99), r).is_err());
        assert!(l.check_at("k", t0 + Duration::from_millis(100), r).is_ok());
        // Other keys have their own buckets.
        assert!(l.check_at("other", t0, r).is_ok());
        // After burst × interval idle, the bucket is full again.
        let later = t0 + Duration::from_millis(700);
        for _ in 0..5 {
            assert!(l.check_at("k", later, r).is_ok());
        }
        assert!(l.check_at("k", later, r).is_err());
    }

    #[test]
    fn a_batch_takes_what_the_bucket_holds() {
        let r = rate("10/s:5");
        let l = Limiter::<&str>::new(RateSpec(Some(r)), 100);
        let t0 = Duration::from_secs(100);
        assert_eq!(l.check_n_at("k", t0, r, 3), Ok(3));
        assert_eq!(
            l.check_n_at("k", t0, r, 1000),
            Ok(2),
            "the rest of the burst"
        );
        assert_eq!(
            l.check_n_at("k", t0, r, 1000),
            Err(Duration::from_millis(100))
        );
        assert_eq!(
            l.check_n_at("k", t0 + Duration::from_millis(250), r, 1000),
            Ok(2)
        );
        assert!(l.check_at("k", t0 + Duration::from_millis(250), r).is_err());
    }

    #[test]
    fn over_a_long_run_the_rate_holds() {
        let r = rate("10/s:5");
        let l = Limiter::<u8>::new(RateSpec(Some(r)), 10);
        // 1,000 attempts over 10 s (one every 10 ms): burst + 10/s × 10 s admitted.
        let admitted = (0..1000)
            .filter(|i| l.check_at(1, Duration::from_millis(10 * i), r).is_ok())
            .count();
        assert!((104..=106).contains(&admitted), "{admitted}");
    }

    #[test]
    fn off_admits_everything() {
        let l = Limiter::<u8>::new("off".parse().unwrap(), 10);
        assert!((0..10_000).all(|_| l.check(1).is_ok()));
    }

    #[test]
    fn retry_after_rounds_up() {
        assert_eq!(retry_after_secs(Duration::from_millis(1)), 1);
        assert_eq!(retry_after_secs(Duration::ZERO), 1);
        assert_eq!(retry_after_secs(Duration::from_secs(2)), 2);
        assert_eq!(retry_after_secs(Duration::from_millis(2001)), 3);
    }
}
