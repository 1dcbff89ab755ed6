//! Exponential backoff with a cap, for every retry loop (store, S3, Kafka, memcached deletes):
//! doubling from `initial` up to `max`, each delay drawn from its upper half ("equal jitter")
//! so that processes that failed together do not retry in lockstep.

use std::time::Duration;

#[derive(Debug, Clone)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
    next: Duration,
}

impl Backoff {
    pub fn new(initial: Duration, max: Duration) -> Self {
        Backoff {
            initial,
            max,
            next: initial,
        }
    }

    /// The delay to wait now; the following one is twice as long, up to the cap.
    pub fn next_delay(&mut self) -> Duration {
        let d = self.next;
        self.next = (self.next * 2).min(self.max);
        d.mul_f64(rand::random_range(0.5..=1.0))
    }

    /// After a success: the next failure waits `initial` again.
    pub fn reset(&mut self) {
        self.next = self.initial;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_up_to_the_cap_with_bounded_jitter_and_resets() {
        let ms = Duration::from_millis;
        let mut b = Backoff::new(ms(100), ms(500));
        for want in [100, 200, 400, 500, 500] {
            let d = b.next_delay();
            assert!(d <= ms(want) && d >= ms(want) / 2, "{d:?} vs {want}");
        }
        b.reset();
        assert!(b.next_delay() <= ms(100));
    }
}
