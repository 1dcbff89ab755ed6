//! The per-thread front of a [`LocalCache`](crate::cache::LocalCache): a small direct-mapped
//! table on each runtime thread in front of moka, so that a hot link's redirect reads no shared
//! structure but two read-mostly counters.
//!
//! Why: a moka hit (hash, concurrent map walk, the read recorded for its eviction policy, the
//! clock read for expiry, the inline housekeeping that drains those records) was 6% of a pinned
//! primary's CPU per hot redirect (perf, 2026-12-02), the largest user-space item after hyper.
//!
//! What a front entry may answer, and for how long: exactly what moka would. Each value in the
//! local cache carries the instant it expires ([`Stamped`], the same instant moka's expiry
//! policy is given), and a front entry is only used before it, so the in-process TTLs (which
//! bound how long another instance's change goes unseen) are unchanged. Invalidation reaches
//! every thread through generations: [`Front::forgot`] bumps the key's stripe (one of
//! [`STRIPES`] counters) after moka forgot the key, [`Front::forgot_all`] bumps the cache's
//! own; an entry remembers both as they were read *before* the moka read that filled it and is
//! used only while both are unchanged. So a front never serves a value that moka had already
//! dropped, or serves it longer. A front entry is also kept at most [`FRONT_TTL`], so moka
//! still sees each hot key read about once a second per thread (its eviction policy counts
//! reads).
//!
//! Memory: [`SLOTS`] entries per thread and local cache, made when the thread first reads it
//! (about 300 KiB); a cache's tables on threads that outlive it are not reclaimed.

use std::any::Any;
use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// Entries per thread's table (a power of two), in sets of two: a key may sit in either slot
/// of its set, so two hot keys of one set do not evict each other (with one slot per key, a
/// quarter of 300 hot keys shared a slot with another and went on to moka every time).
pub const SLOTS: usize = 4096;
/// Invalidation stripes per cache (a power of two).
pub const STRIPES: usize = 1024;
/// The longest a front entry is used (see the module doc).
pub const FRONT_TTL: Duration = Duration::from_secs(1);

/// A cached value and the instant it expires (moka's expiry is set to the same instant).
#[derive(Clone)]
pub struct Stamped<V> {
    pub value: V,
    pub until: Instant,
}

/// One cache's invalidation generations and its id in every thread's tables.
pub struct Front {
    id: usize,
    seed: u64,
    all: AtomicU64,
    stripes: Box<[AtomicU64]>,
}

/// What a read saw before it went to moka (so a fill can be tagged with it).
#[derive(Clone, Copy)]
pub struct Seen {
    hash: u64,
    all: u64,
    stripe: u64,
}

struct Entry<V> {
    key: Box<str>,
    hash: u64,
    all: u64,
    stripe: u64,
    until: Instant,
    value: V,
}

type Table<V> = Box<[Option<Entry<V>>]>;

thread_local! {
    /// This thread's tables, by cache id (`Table<V>` of that cache's `V`).
    static TABLES: RefCell<Vec<Option<Box<dyn Any>>>> = const { RefCell::new(Vec::new()) };
}

static NEXT_ID: AtomicUsize = AtomicUsize::new(0);

impl Default for Front {
    fn default() -> Self {
        Self::new()
    }
}

impl Front {
    pub fn new() -> Self {
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        // A per-cache seed: slugs chosen to collide in one process's tables collide nowhere
        // else (and a collision only sends a read on to moka).
        let seed = rand_seed(id);
        Front {
            id,
            seed,
            all: AtomicU64::new(0),
            stripes: (0..STRIPES).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    fn hash(&self, key: &str) -> u64 {
        // FNV-1a over the key, from the seed, then a final mix (keys are short).
        let mut h = self.seed ^ 0xcbf2_9ce4_8422_2325;
        for &b in key.as_bytes() {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
        h ^= h >> 29;
        h = h.wrapping_mul(0xbf58_476d_1ce4_e5b9);
        h ^ (h >> 32)
    }

    fn stripe(&self, hash: u64) -> &AtomicU64 {
        &self.stripes[(hash >> 40) as usize & (STRIPES - 1)]
    }

    /// The generations of `key` now: read them before the moka read whose answer
    /// [`Front::fill`] keeps.
    pub fn seen(&self, key: &str) -> Seen {
        let hash = self.hash(key);
        Seen {
            hash,
            all: self.all.load(Ordering::Acquire),
            stripe: self.stripe(hash).load(Ordering::Acquire),
        }
    }

    /// This thread's answer for `key`, if it holds one still valid at `now` under the
    /// generations `seen` (read once per lookup: the same [`Seen`] tags a fill after a miss).
    pub fn get<V: Clone + 'static>(&self, key: &str, seen: Seen, now: Instant) -> Option<V> {
        TABLES.with_borrow(|tables| {
            let table = tables.get(self.id)?.as_ref()?.downcast_ref::<Table<V>>()?;
            let set = seen.hash as usize & (SLOTS - 2);
            table[set..set + 2].iter().flatten().find_map(|e| {
                (e.hash == seen.hash
                    && e.all == seen.all
                    && e.stripe == seen.stripe
                    && now < e.until
                    && *e.key == *key)
                    .then(|| e.value.clone())
            })
        })
    }

    /// Keeps moka's answer `v` for `key` on this thread, tagged with what was `seen` before
    /// moka was read, until `v` expires (at most [`FRONT_TTL`] from `now`).
    pub fn fill<V: Clone + 'static>(&self, key: &str, seen: Seen, v: &Stamped<V>, now: Instant) {
        let until = v.until.min(now + FRONT_TTL);
        if now >= until {
            return;
        }
        TABLES.with_borrow_mut(|tables| {
            if tables.len() <= self.id {
                tables.resize_with(self.id + 1, || None);
            }
            let slot = &mut tables[self.id];
            if slot.as_ref().is_none_or(|t| !t.is::<Table<V>>()) {
                let table: Table<V> = (0..SLOTS).map(|_| None).collect();
                *slot = Some(Box::new(table));
            }
            let Some(table) = slot.as_mut().and_then(|t| t.downcast_mut::<Table<V>>()) else {
                return;
            };
            let set = seen.hash as usize & (SLOTS - 2);
            let pair = &mut table[set..set + 2];
            // The key's own slot, else an empty one, else the one that runs out first.
            let i = pair
                .iter()
                .position(|e| {
                    e.as_ref()
                        .is_some_and(|e| e.hash == seen.hash && *e.key == *key)
                })
                .or_else(|| pair.iter().position(Option::is_none))
                .unwrap_or_else(|| {
                    let until = |i: usize| pair[i].as_ref().map(|e| e.until);
                    usize::from(until(1) < until(0))
                });
            let e = &mut pair[i];
            match e {
                // The same key again (its previous entry ran out): no new allocation.
                Some(old) if old.hash == seen.hash && *old.key == *key => {
                    old.all = seen.all;
                    old.stripe = seen.stripe;
                    old.until = until;
                    old.value = v.value.clone();
                }
                _ => {
                    *e = Some(Entry {
                        key: key.into(),
                        hash: seen.hash,
                        all: seen.all,
                        stripe: seen.stripe,
                        until,
                        value: v.value.clone(),
                    })
                }
            }
        });
    }

    /// `key` was forgotten by moka: no thread's front answers it from before.
    pub fn forgot(&self, key: &str) {
        let hash = self.hash(key);
        self.stripe(hash).fetch_add(1, Ordering::AcqRel);
    }

    /// Everything was forgotten by moka.
    pub fn forgot_all(&self) {
        self.all.fetch_add(1, Ordering::AcqRel);
    }
}

/// A seed from the clock and the cache id (not a secret: see [`Front::new`]).
fn rand_seed(id: usize) -> u64 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let mut h = t ^ (id as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^ (h >> 33)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stamped(v: u32, ttl: Duration) -> Stamped<u32> {
        Stamped {
            value: v,
            until: Instant::now() + ttl,
        }
    }

    #[test]
    fn a_fill_answers_on_its_thread_until_it_expires() {
        let f = Front::new();
        let now = Instant::now();
        assert_eq!(f.get::<u32>("abc", f.seen("abc"), now), None);
        let seen = f.seen("abc");
        f.fill("abc", seen, &stamped(7, Duration::from_millis(500)), now);
        assert_eq!(f.get::<u32>("abc", f.seen("abc"), now), Some(7));
        assert_eq!(f.get::<u32>("abd", f.seen("abd"), now), None, "another key");
        // Not past the value's own expiry, and not past FRONT_TTL.
        assert_eq!(
            f.get::<u32>("abc", f.seen("abc"), now + Duration::from_millis(600)),
            None
        );
        let seen = f.seen("long");
        f.fill("long", seen, &stamped(8, Duration::from_secs(60)), now);
        assert_eq!(
            f.get::<u32>("long", f.seen("long"), now + FRONT_TTL / 2),
            Some(8)
        );
        assert_eq!(f.get::<u32>("long", f.seen("long"), now + FRONT_TTL), None);
        // Another thread has its own table.
        let other = std::thread::scope(|s| {
            s.spawn(|| f.get::<u32>("abc", f.seen("abc"), now))
                .join()
                .unwrap()
        });
        assert_eq!(other, None);
    }

    #[test]
    fn forgetting_a_key_or_everything_ends_its_entries() {
        let f = Front::new();
        let now = Instant::now();
        for k in ["a", "b"] {
            let seen = f.seen(k);
            f.fill(k, seen, &stamped(1, Duration::from_secs(5)), now);
        }
        f.forgot("a");
        assert_eq!(f.get::<u32>("a", f.seen("a"), now), None);
        assert_eq!(f.get::<u32>("b", f.seen("b"), now), Some(1));
        f.forgot_all();
        assert_eq!(f.get::<u32>("b", f.seen("b"), now), None);
    }

    #[test]
    fn a_fill_seen_before_a_forget_is_never_used() {
        // A read saw the generations, read moka (the old value), then the key was forgotten
        // before the fill: the fill carries the old generation and is not used.
        let f = Front::new();
        let now = Instant::now();
        let seen = f.seen("k");
        f.forgot("k");
        f.fill("k", seen, &stamped(1, Duration::from_secs(5)), now);
        assert_eq!(f.get::<u32>("k", f.seen("k"), now), None);
        let seen = f.seen("k");
        f.forgot_all();
        f.fill("k", seen, &stamped(1, Duration::from_secs(5)), now);
        assert_eq!(f.get::<u32>("k", f.seen("k"), now), None);
    }

    #[test]
    fn caches_do_not_share_entries_and_colliding_keys_replace_each_other() {
        let (f, g) = (Front::new(), Front::new());
        let now = Instant::now();
        let seen = f.seen("k");
        f.fill("k", seen, &stamped(1, Duration::from_secs(5)), now);
        assert_eq!(g.get::<u32>("k", g.seen("k"), now), None);
        // Every key of a full table's worth and more: each read is its own key's or none.
        let keys: Vec<String> = (0..3 * SLOTS).map(|i| format!("s{i}")).collect();
        for (i, k) in keys.iter().enumerate() {
            let seen = f.seen(k);
            f.fill(k, seen, &stamped(i as u32, Duration::from_secs(5)), now);
        }
        let mut hits = 0;
        for (i, k) in keys.iter().enumerate() {
            if let Some(v) = f.get::<u32>(k, f.seen(k), now) {
                assert_eq!(v, i as u32, "{k}");
                hits += 1;
            }
        }
        assert!(hits > 0 && hits <= SLOTS, "{hits}");
    }

    #[test]
    fn two_keys_of_one_set_both_stay() {
        let f = Front::new();
        let now = Instant::now();
        let set = |k: &str| f.seen(k).hash as usize & (SLOTS - 2);
        let a = "k0".to_string();
        let b = (1..)
            .map(|i| format!("k{i}"))
            .find(|k| set(k) == set(&a))
            .unwrap();
        for (i, k) in [&a, &b].into_iter().enumerate() {
            let seen = f.seen(k);
            f.fill(k, seen, &stamped(i as u32, Duration::from_secs(5)), now);
        }
        assert_eq!(f.get::<u32>(&a, f.seen(&a), now), Some(0));
        assert_eq!(f.get::<u32>(&b, f.seen(&b), now), Some(1));
        // A third key of the set takes the slot that runs out first.
        let c = (1..)
            .map(|i| format!("c{i}"))
            .find(|k| set(k) == set(&a))
            .unwrap();
        let seen = f.seen(&c);
        f.fill(&c, seen, &stamped(2, Duration::from_secs(5)), now);
        assert_eq!(f.get::<u32>(&c, f.seen(&c), now), Some(2));
        assert_eq!(f.get::<u32>(&a, f.seen(&a), now), None, "a ran out first");
        assert_eq!(f.get::<u32>(&b, f.seen(&b), now), Some(1));
    }
}
