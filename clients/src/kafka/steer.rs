//! Where a keyed message goes when its partition's leader does not answer this client.
//!
//! A broker can be healthy to its cluster (heartbeating, in every ISR, leading its partitions)
//! and still not answer a client: a slow or blackholed path between the two, a gray failure.
//! Kafka moves leadership only when the controllers lose the broker, so a producer that keys
//! its messages to a fixed partition waits on that broker for as long as the fault lasts. For
//! a topic whose consumers need no order per key (every event carries its version and the
//! consumer applies only newer ones: `links`), a message may go to any partition instead.
//!
//! [`Steer`] picks each key's home partition (a stable hash of the key) unless its leader is
//! suspect, and then the next partition whose leader is not. A leader is suspect for a window
//! after a send to it did not complete in time (the caller's deadline) or when the metadata
//! shows a partition without one; so a bad broker costs one deadline per window, not one per
//! message. The leader map comes from the cluster's metadata ([`Steer::refresh`], from a
//! background loop); while it is unknown the client's own partitioner decides.

use rdkafka::client::{Client, ClientContext};
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

pub struct Steer {
    topic: String,
    /// How long a leader stays suspect after it missed a deadline.
    window: Duration,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// The leader (broker id) of each partition; below 0: none.
    leaders: Vec<i32>,
    /// Suspect brokers, and until when.
    suspect: HashMap<i32, Instant>,
}

impl Steer {
    pub fn new(topic: &str, window: Duration) -> Self {
        Steer {
            topic: topic.to_string(),
            window,
            state: Mutex::new(State::default()),
        }
    }

    pub fn topic(&self) -> &str {
        &self.topic
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The partitions' leaders, in partition order (as the metadata gives them).
    pub fn set_leaders(&self, leaders: Vec<i32>) {
        self.state().leaders = leaders;
    }

    /// Reads the topic's leaders from the cluster (blocking, up to `timeout`).
    pub fn refresh<C: ClientContext>(
        &self,
        client: &Client<C>,
        timeout: Duration,
    ) -> Result<(), rdkafka::error::KafkaError> {
        let md = client.fetch_metadata(Some(&self.topic), timeout)?;
        let Some(t) = md.topics().iter().find(|t| t.name() == self.topic) else {
            return Ok(());
        };
        let mut parts: Vec<(i32, i32)> = t
            .partitions()
            .iter()
            .map(|p| (p.id(), p.leader()))
            .collect();
        parts.sort_unstable();
        // Only a complete, dense map (0..n) is used: anything else leaves the old one.
        if !parts.is_empty()
            && parts
                .iter()
                .enumerate()
                .all(|(i, (id, _))| *id as usize == i)
        {
            self.set_leaders(parts.into_iter().map(|(_, l)| l).collect());
        }
        Ok(())
    }

    /// The partition for `key`: its home partition, else the first after it whose leader is
    /// neither missing nor suspect, else home. None while the leaders are unknown.
    pub fn pick(&self, key: &[u8], now: Instant) -> Option<i32> {
        let s = self.state();
        let n = s.leaders.len();
        if n == 0 {
            return None;
        }
        let home = (fnv1a(key) % n as u64) as usize;
        let ok = |p: usize| {
            let l = s.leaders[p];
            l >= 0 && s.suspect.get(&l).is_none_or(|until| *until <= now)
        };
        let p = (0..n)
            .map(|i| (home + i) % n)
            .find(|&p| ok(p))
            .unwrap_or(home);
        Some(p as i32)
    }

    /// A send to `partition` missed its deadline: its leader is suspect for the window.
    pub fn suspect(&self, partition: i32, now: Instant) {
        let mut s = self.state();
        let Some(&leader) = usize::try_from(partition)
            .ok()
            .and_then(|p| s.leaders.get(p))
        else {
            return;
        };
        if leader >= 0 {
            s.suspect.insert(leader, now + self.window);
        }
    }

    /// Brokers suspect at `now` (what the tests look at).
    #[cfg(test)]
    fn suspects(&self, now: Instant) -> usize {
        self.state().suspect.values().filter(|u| **u > now).count()
    }
}

/// FNV-1a, 64 bits: stable across builds and versions (a key's home partition must not move
/// with a compiler upgrade, or keys would spread differently per primary during a rollout).
fn fnv1a(key: &[u8]) -> u64 {
    key.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_leaders_leave_the_choice_to_the_client() {
        let s = Steer::new("links", Duration::from_secs(5));
        assert_eq!(s.pick(b"abc", Instant::now()), None);
    }

    #[test]
    fn a_key_stays_home_while_its_leader_answers() {
        let s = Steer::new("links", Duration::from_secs(5));
        s.set_leaders(vec![1, 2, 3, 1, 2, 3]);
        let now = Instant::now();
        let home = s.pick(b"abc", now).unwrap();
        assert_eq!(home, (fnv1a(b"abc") % 6) as i32);
        for _ in 0..3 {
            assert_eq!(s.pick(b"abc", now), Some(home));
        }
        // Keys spread over every partition.
        let mut seen = std::collections::HashSet::new();
        for i in 0..200 {
            seen.insert(s.pick(format!("slug{i}").as_bytes(), now).unwrap());
        }
        assert_eq!(seen.len(), 6);
    }

    #[test]
    fn a_suspect_leader_is_avoided_for_its_window_on_every_partition_it_leads() {
        let s = Steer::new("links", Duration::from_secs(5));
        s.set_leaders(vec![1, 2, 3, 1, 2, 3]);
        let t0 = Instant::now();
        // Find a key at home on partition 1 (led by broker 2).
        let key = (0..)
            .map(|i| format!("k{i}"))
            .find(|k| s.pick(k.as_bytes(), t0) == Some(1))
            .unwrap();
        s.suspect(1, t0);
        assert_eq!(s.suspects(t0), 1);
        assert_eq!(
            s.pick(key.as_bytes(), t0),
            Some(2),
            "the next partition, led by 3"
        );
        // Partition 4 is broker 2's too: a key at home there moves without a miss of its own.
        let key4 = (0..)
            .map(|i| format!("k{i}"))
            .find(|k| fnv1a(k.as_bytes()) % 6 == 4)
            .unwrap();
        assert_eq!(s.pick(key4.as_bytes(), t0), Some(5));
        // After the window the key goes home again.
        let later = t0 + Duration::from_secs(6);
        assert_eq!(s.suspects(later), 0);
        assert_eq!(s.pick(key.as_bytes(), later), Some(1));
    }

    #[test]
    fn partitions_without_a_leader_are_skipped_and_all_bad_falls_back_home() {
        let s = Steer::new("links", Duration::from_secs(5));
        s.set_leaders(vec![-1, 7]);
        let t0 = Instant::now();
        for i in 0..20 {
            assert_eq!(s.pick(format!("k{i}").as_bytes(), t0), Some(1));
        }
        s.suspect(1, t0);
        let key = (0..)
            .map(|i| format!("k{i}"))
            .find(|k| fnv1a(k.as_bytes()) % 2 == 1)
            .unwrap();
        assert_eq!(s.pick(key.as_bytes(), t0), Some(1), "nowhere better: home");
        // A partition out of range is ignored.
        s.suspect(9, t0);
        s.suspect(-3, t0);
    }
}
