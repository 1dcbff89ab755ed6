//! Redirects since start, in all and per slug, for `/stats` (this tier assumes no metrics system
//! is alive, so it keeps its own).
//!
//! Counted on every redirect, so the count must cost next to nothing and share nothing between
//! cores: each thread counts into a part of its own (a lock no other thread takes on the hot
//! path, a small map) and moves its counts into the shared, bounded map (the busiest-recent
//! [`SLUGS`] slugs, moka's admission and eviction) every [`MERGE_EVERY`] redirects or once
//! it holds [`PART_SLUGS`] slugs. A read ([`Redirects::snapshot`]) moves every part's counts
//! first, so it sees every redirect counted before it started. The shared map sees one read
//! per slug and merge, not per redirect: which slugs it keeps when more than [`SLUGS`] are
//! busy follows how often each was redirected in a merge window, not its exact count.
//!
//! Before this, each redirect looked its slug up in the shared moka map (the map walk, the read
//! recorded for its policy, the housekeeping that drains those records) and incremented one
//! atomic total that every core wrote.

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

/// Slugs the shared map keeps (the busiest recent ones).
pub const SLUGS: u64 = 100_000;
/// Redirects a thread counts before it moves its counts into the shared map.
pub const MERGE_EVERY: u32 = 4096;
/// Distinct slugs a thread's part holds before it moves its counts (bounds its memory).
pub const PART_SLUGS: usize = 1024;

#[derive(Default)]
struct Part {
    total: u64,
    slugs: HashMap<Box<str>, u64>,
    since_merge: u32,
}

/// Redirect counts, total and per slug.
pub struct Redirects {
    /// Tells this instance's parts from another's in a thread's list (tests run several).
    id: u64,
    parts: Mutex<Vec<Arc<Mutex<Part>>>>,
    /// Counts moved out of the parts.
    total: AtomicU64,
    per_slug: moka::sync::Cache<String, Arc<AtomicU64>>,
}

static NEXT_ID: AtomicU64 = AtomicU64::new(0);

thread_local! {
    /// This thread's part of each [`Redirects`] it counted into (one in a running process).
    static PARTS: RefCell<Vec<(u64, Arc<Mutex<Part>>)>> = const { RefCell::new(Vec::new()) };
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while counting leaves counts, not broken invariants: keep using them.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Default for Redirects {
    fn default() -> Self {
        Self::new()
    }
}

impl Redirects {
    pub fn new() -> Self {
        Redirects {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            parts: Mutex::new(Vec::new()),
            total: AtomicU64::new(0),
            per_slug: moka::sync::Cache::new(SLUGS),
        }
    }

    /// Counts one redirect of `slug`.
    pub fn add(&self, slug: &str) {
        PARTS.with(|parts| {
            let mut parts = parts.borrow_mut();
            let i = match parts.iter().position(|(id, _)| *id == self.id) {
                Some(i) => i,
                None => {
                    let part = Arc::new(Mutex::new(Part::default()));
                    lock(&self.parts).push(part.clone());
                    parts.push((self.id, part));
                    parts.len() - 1
                }
            };
            let mut p = lock(&parts[i].1);
            p.total += 1;
            match p.slugs.get_mut(slug) {
                Some(n) => *n += 1,
                None => {
                    p.slugs.insert(slug.into(), 1);
                }
            }
            p.since_merge += 1;
            if p.since_merge >= MERGE_EVERY || p.slugs.len() >= PART_SLUGS {
                self.merge(&mut p);
            }
        })
    }

    /// Moves one part's counts into the shared total and map.
    fn merge(&self, p: &mut Part) {
        self.total
            .fetch_add(std::mem::take(&mut p.total), Ordering::Relaxed);
        for (slug, n) in p.slugs.drain() {
            self.per_slug
                .get_with_by_ref(&*slug, || Arc::new(AtomicU64::new(0)))
                .fetch_add(n, Ordering::Relaxed);
        }
        p.since_merge = 0;
    }

    /// Every redirect counted so far, and the per-slug counts the shared map keeps.
    pub fn snapshot(&self) -> (u64, Vec<(String, u64)>) {
        let parts: Vec<_> = lock(&self.parts).clone();
        for part in parts {
            self.merge(&mut lock(&part));
        }
        let slugs = self
            .per_slug
            .iter()
            .map(|(k, v)| ((*k).clone(), v.load(Ordering::Relaxed)))
            .collect();
        (self.total.load(Ordering::Relaxed), slugs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counts(r: &Redirects) -> (u64, HashMap<String, u64>) {
        let (total, slugs) = r.snapshot();
        (total, slugs.into_iter().collect())
    }

    #[test]
    fn a_snapshot_sees_every_redirect_counted_on_any_thread_before_it() {
        let r = Arc::new(Redirects::new());
        // Fewer than a merge's worth on each thread: nothing reached the shared map yet.
        std::thread::scope(|s| {
            for t in 0..4 {
                let r = r.clone();
                s.spawn(move || {
                    for i in 0..100 {
                        r.add(if i % 4 == 0 {
                            "hot"
                        } else {
                            ["a", "b", "c", "d"][t]
                        });
                    }
                });
            }
        });
        let (total, slugs) = counts(&r);
        assert_eq!(total, 400);
        assert_eq!(slugs["hot"], 100);
        for s in ["a", "b", "c", "d"] {
            assert_eq!(slugs[s], 75, "{s}");
        }
        // Counting goes on after a snapshot, on the same parts.
        r.add("hot");
        assert_eq!(counts(&r).1["hot"], 101);
        assert_eq!(counts(&r).0, 401);
    }

    #[test]
    fn a_part_moves_its_counts_after_a_merge_worth_or_enough_slugs() {
        let r = Redirects::new();
        for _ in 0..MERGE_EVERY {
            r.add("x");
        }
        // Moved by the thread itself, without a snapshot.
        assert_eq!(r.total.load(Ordering::Relaxed), u64::from(MERGE_EVERY));
        for i in 0..PART_SLUGS {
            r.add(&format!("s{i}"));
        }
        let held = PARTS.with(|p| {
            let p = p.borrow();
            let part = &p.iter().find(|(id, _)| *id == r.id).unwrap().1;
            let n = lock(part).slugs.len();
            n
        });
        assert_eq!(held, 0, "a part holds fewer than {PART_SLUGS} slugs");
        let (total, slugs) = counts(&r);
        assert_eq!(total, u64::from(MERGE_EVERY) + PART_SLUGS as u64);
        assert_eq!(slugs.len(), PART_SLUGS + 1);
    }

    #[test]
    fn two_instances_on_one_thread_count_apart() {
        let (a, b) = (Redirects::new(), Redirects::new());
        a.add("x");
        b.add("x");
        b.add("x");
        assert_eq!(counts(&a).1["x"], 1);
        assert_eq!(counts(&b).1["x"], 2);
    }
}
