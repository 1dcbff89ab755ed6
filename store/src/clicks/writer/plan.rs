//! The writer's pure half: what one batch of a source's clicks changes, decided in memory
//! from what is known to be counted ([`SourceState::plan`]), and what of that state stays in
//! memory between batches ([`SourceState::evict`]). No I/O: [`super::SourceCounter`] loads the
//! state this needs and writes the plan.

use super::Limits;
use crate::clicks::{bucket_and_group, day_of, Click, Counted, DayCounts, Tally};
use std::borrow::Borrow;
use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::hash::{Hash, Hasher};
use uuid::Uuid;

/// The counter's maps and sets: each click is looked up in several (its (link, day), its
/// minute, its id, the batch's writes), where std's SipHash was a visible part of the counter's
/// CPU (issue 37). foldhash seeds each map at random, as SipHash does.
pub type Map<K, V> = HashMap<K, V, foldhash::fast::RandomState>;
pub type Set<T> = HashSet<T, foldhash::fast::RandomState>;

pub const MINUTE_MS: i64 = 60_000;

/// Minutes since 1970-01-01 (UTC) of a time in milliseconds: the dedup index's bucket.
pub fn minute_of(ms: i64) -> i64 {
    ms.div_euclid(MINUTE_MS)
}

/// (link, day).
pub(super) type Key = (String, i32);

/// A (link, day) that may borrow its link: what the maps of [`Key`]s are looked up by
/// (`&(slug, day) as &dyn KeyRef`), so a click costs no copy of its link's key unless it adds
/// one. Hashed and compared as the tuple, as `Borrow` requires.
pub(super) trait KeyRef {
    fn parts(&self) -> (&str, i32);
}

impl KeyRef for Key {
    fn parts(&self) -> (&str, i32) {
        (&self.0, self.1)
    }
}

impl KeyRef for (&str, i32) {
    fn parts(&self) -> (&str, i32) {
        *self
    }
}

impl<'a> Borrow<dyn KeyRef + 'a> for Key {
    fn borrow(&self) -> &(dyn KeyRef + 'a) {
        self
    }
}

impl Hash for dyn KeyRef + '_ {
    fn hash<H: Hasher>(&self, h: &mut H) {
        self.parts().hash(h);
    }
}

impl PartialEq for dyn KeyRef + '_ {
    fn eq(&self, other: &Self) -> bool {
        self.parts() == other.parts()
    }
}

impl Eq for dyn KeyRef + '_ {}

impl KeyState {
    /// Offset of the newest click included (-1: none).
    pub(super) fn upto(&self) -> i64 {
        self.upto
    }
}

#[derive(Debug, Clone, Default)]
pub(super) struct KeyState {
    /// Offset of the newest click included (-1: none).
    upto: i64,
    pub(super) counts: Tally,
    /// `click_days` has this (link, day).
    pub(super) listed: bool,
    touched: u64,
}

/// A group of `click_groups`: (day, bucket, group).
pub(super) type Group = (i32, i32, i32);

/// The group of a (link, day).
pub(super) fn group_key(slug: &str, day: i32) -> Group {
    let (bucket, group) = bucket_and_group(slug);
    (day, bucket, group)
}

/// A group whose row was read: every member the row has is in `keys`, and a link of the group
/// that is not was never counted up to `upto` (the row includes every click of every member
/// up to it).
#[derive(Debug, Clone, Copy)]
pub(super) struct GroupState {
    pub(super) upto: i64,
}

#[derive(Debug, Default)]
struct Bucket {
    /// Id → the smallest offset it was counted (or tried to be counted) at.
    ids: Map<Uuid, i64>,
    touched: u64,
}

/// What one batch changes, decided in memory.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Plan {
    pub counted: u64,
    pub duplicates: u64,
    pub redelivered: u64,
    /// New ids per minute, with their offsets, in offset order.
    pub ids: BTreeMap<i64, Vec<(i64, Uuid)>>,
    /// Per changed (link, day): the new `upto` (its counts are in the state).
    pub writes: Map<Key, i64>,
}

impl Plan {
    /// Adds `later`, the plan of the batch that came right after this one's (the next
    /// offsets of the same source, planned on the state this one left): the two together are
    /// what one plan of both batches would be, so their writes can go to the store as one.
    pub fn absorb(&mut self, later: Plan) {
        self.counted += later.counted;
        self.duplicates += later.duplicates;
        self.redelivered += later.redelivered;
        for (minute, ids) in later.ids {
            self.ids.entry(minute).or_default().extend(ids);
        }
        self.writes.extend(later.writes);
    }

    /// What the plan's batches decided, in counts.
    pub fn decided(&self) -> Counted {
        Counted {
            counted: self.counted,
            duplicates: self.duplicates,
            redelivered: self.redelivered,
        }
    }

    /// Nothing to write.
    pub fn is_empty(&self) -> bool {
        self.ids.is_empty() && self.writes.is_empty()
    }
}

/// A source's state: what is known to be counted.
#[derive(Debug, Default)]
pub struct SourceState {
    /// The offset the next batch must start at for this state to still be the truth.
    pub(super) next: Option<i64>,
    pub(super) keys: Map<Key, KeyState>,
    /// The groups read (days after `click_sums_until`): in memory whole or not at all, since a
    /// group's row is written whole from what memory holds.
    pub(super) groups: Map<Group, GroupState>,
    buckets: Map<i64, Bucket>,
    pub(super) ids: usize,
    clock: u64,
}

impl SourceState {
    pub(super) fn key_missing(&self, slug: &str, day: i32) -> bool {
        !self.keys.contains_key(&(slug, day) as &dyn KeyRef)
    }

    pub(super) fn group_missing(&self, g: &Group) -> bool {
        !self.groups.contains_key(g)
    }

    /// A read group: its members, and the group itself (so every other link of it is known to
    /// have no clicks up to `upto`).
    pub(super) fn insert_group(&mut self, g: Group, upto: i64, members: Vec<(String, DayCounts)>) {
        for (slug, counts) in members {
            // Memory holds the group whole or not at all: a member is only ever missing here.
            self.insert_key((slug, g.0), upto, counts, true);
        }
        self.groups.insert(g, GroupState { upto });
    }

    /// A link of a read group that its row does not have: no clicks up to the group's `upto`.
    pub(super) fn insert_new_member(&mut self, slug: &str, day: i32) {
        let upto = self
            .groups
            .get(&group_key(slug, day))
            .map_or(-1, |g| g.upto);
        self.insert_key((slug.to_owned(), day), upto, DayCounts::default(), false);
    }

    pub(super) fn bucket_missing(&self, minute: i64) -> bool {
        !self.buckets.contains_key(&minute)
    }

    pub(super) fn insert_key(&mut self, k: Key, upto: i64, counts: DayCounts, listed: bool) {
        self.keys.insert(
            k,
            KeyState {
                upto,
                counts: Tally::from(&counts),
                listed,
                touched: self.clock,
            },
        );
    }

    pub(super) fn insert_bucket(&mut self, minute: i64, ids: Map<Uuid, i64>) {
        self.ids += ids.len();
        self.buckets.insert(
            minute,
            Bucket {
                ids,
                touched: self.clock,
            },
        );
    }

    /// Decides `events` (this source's, in offset order), given that the state of every
    /// (link, day) and minute they touch is loaded. A click at an offset its (link, day)
    /// already includes was counted by whoever wrote that; a click whose id the minute holds at
    /// an earlier offset is a copy; anything else is counted. The same id at the same offset
    /// is this very message, whose ids reached the index in an attempt that died before its
    /// counts did: not a copy.
    ///
    /// A message may hold several clicks, which share its offset: a batch always has whole
    /// messages, and a (link, day) row is written once per batch with all of them, so `upto`
    /// still means "every click of the messages up to here". Within one batch, a click at the
    /// offset this batch just wrote for its (link, day) is the same message's, not a
    /// redelivery; and an id counted once in this batch at this offset is a copy inside the
    /// message.
    pub fn plan(&mut self, events: &[(i64, &Click)]) -> Plan {
        self.clock += 1;
        let mut plan = Plan::default();
        let mut counted_here: Set<Uuid> = Set::default();
        for &(offset, e) in events {
            let minute = minute_of(e.at_ms);
            let day = day_of(e.at_ms);
            let key = &(e.key(), day) as &dyn KeyRef;
            let bucket = self.buckets.get_mut(&minute).expect("minute loaded");
            bucket.touched = self.clock;
            let ks = self.keys.get_mut(key).expect("key loaded");
            ks.touched = self.clock;
            let first = match bucket.ids.entry(e.id) {
                Entry::Occupied(mut o) => {
                    let first = *o.get();
                    *o.get_mut() = first.min(offset);
                    Some(first)
                }
                Entry::Vacant(v) => {
                    v.insert(offset);
                    self.ids += 1;
                    None
                }
            };
            if offset <= ks.upto && plan.writes.get(key) != Some(&offset) {
                plan.redelivered += 1;
                continue;
            }
            if first.is_some_and(|o| o < offset) || !counted_here.insert(e.id) {
                plan.duplicates += 1;
                continue;
            }
            ks.counts.count(e);
            ks.upto = offset;
            match plan.writes.get_mut(key) {
                Some(upto) => *upto = offset,
                None => {
                    plan.writes.insert((e.key().to_owned(), day), offset);
                }
            }
            plan.ids.entry(minute).or_default().push((offset, e.id));
            plan.counted += 1;
        }
        plan
    }

    /// Drops the least recently used (link, day) states and minutes beyond the limits (down to
    /// 90% of them), never those the last batch used. A read group goes whole: kept while any
    /// of its members is.
    pub(super) fn evict(&mut self, limits: &Limits) {
        if self.keys.len() > limits.keys {
            // What is let go of together: a read group, or a (link, day) of the days before
            // groups; each with its newest touch and its (link, day)s.
            let mut groups: Map<Group, (u64, usize)> = Map::default();
            let mut units: Vec<(u64, usize)> = Vec::new();
            for ((slug, day), k) in &self.keys {
                let g = group_key(slug, *day);
                if self.groups.contains_key(&g) {
                    let u = groups.entry(g).or_insert((0, 0));
                    *u = (u.0.max(k.touched), u.1 + 1);
                } else {
                    units.push((k.touched, 1));
                }
            }
            units.extend(groups.values().copied());
            units.sort_unstable();
            // The oldest units until 10% below the limit, never one the last batch used.
            let cut = self.keys.len() - limits.keys * 9 / 10;
            let mut freed = 0;
            let mut threshold = 0;
            for (touched, n) in units {
                if freed >= cut || touched >= self.clock {
                    break;
                }
                (freed, threshold) = (freed + n, touched);
            }
            self.keys
                .retain(|(slug, day), k| match groups.get(&group_key(slug, *day)) {
                    Some((t, _)) => *t > threshold,
                    None => k.touched > threshold,
                });
            self.groups
                .retain(|g, _| groups.get(g).is_some_and(|(t, _)| *t > threshold));
        }
        if self.ids > limits.ids {
            let mut minutes: Vec<(u64, i64, usize)> = self
                .buckets
                .iter()
                .filter(|(_, b)| b.touched < self.clock)
                .map(|(m, b)| (b.touched, *m, b.ids.len()))
                .collect();
            minutes.sort_unstable();
            let keep = limits.ids * 9 / 10;
            for (_, m, n) in minutes {
                if self.ids <= keep {
                    break;
                }
                self.buckets.remove(&m);
                self.ids -= n;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use zlink_wire::events::{AgentClass, ClickEvent, Tier};

    const AT: i64 = 1_700_000_000_000;

    fn ev(slug: &str, at_ms: i64) -> Click {
        Click::from(&ClickEvent {
            schema: 1,
            id: Uuid::new_v4(),
            key: slug.into(),
            at_ms,
            tier: Tier::Primary,
            referrer: None,
            user_agent: None,
            agent: AgentClass::Browser,
            ip_hash: String::new(),
            device: Default::default(),
            country: None,
            city: None,
        })
    }

    /// A state with everything `events` touch loaded as empty (a fresh store).
    fn fresh(events: &[(i64, &Click)]) -> SourceState {
        let mut s = SourceState::default();
        for (_, e) in events {
            let k = (e.key().to_owned(), day_of(e.at_ms));
            if s.key_missing(&k.0, k.1) {
                s.insert_key(k, -1, DayCounts::default(), false);
            }
            if s.bucket_missing(minute_of(e.at_ms)) {
                s.insert_bucket(minute_of(e.at_ms), Map::default());
            }
        }
        s
    }

    /// The total of (slug, day of `at`) in the state, if `p` wrote it.
    fn total(s: &SourceState, p: &Plan, slug: &str, at: i64) -> Option<i64> {
        let key = (slug.to_string(), day_of(at));
        p.writes.get(&key)?;
        s.keys[&key]
            .counts
            .to_counts()
            .rows
            .get(&("c".to_string(), "total".to_string()))
            .copied()
    }

    #[test]
    fn copies_are_ignored_and_upto_is_the_newest_offset_counted() {
        let (a, b) = (ev("a", AT), ev("b", AT + 61_000));
        let evs = [(10, &a), (11, &b), (12, &a), (13, &a)];
        let mut s = fresh(&evs);
        let p = s.plan(&evs);
        assert_eq!((p.counted, p.duplicates, p.redelivered), (2, 2, 0));
        assert_eq!(total(&s, &p, "a", AT), Some(1));
        assert_eq!(p.writes[&("a".to_string(), day_of(AT))], 10);
        assert_eq!(p.writes[&("b".to_string(), day_of(AT))], 11);
        // Two minutes, one new id each.
        assert_eq!(p.ids.len(), 2);
        assert_eq!(p.ids[&minute_of(AT)], vec![(10, a.id)]);
    }

    #[test]
    fn a_redelivered_batch_counts_nothing_and_later_copies_stay_copies() {
        let (a, b) = (ev("a", AT), ev("a", AT + 1));
        let evs = [(5, &a), (6, &b)];
        let mut s = fresh(&evs);
        assert_eq!(s.plan(&evs).counted, 2);
        // A successor that read upto = 6 from the store and the ids from the index.
        let again = s.plan(&evs);
        assert_eq!((again.counted, again.redelivered), (0, 2));
        assert!(again.writes.is_empty() && again.ids.is_empty());
        let later = s.plan(&[(9, &a)]);
        assert_eq!((later.counted, later.duplicates), (0, 1));
    }

    #[test]
    fn a_successor_that_only_saw_upto_still_learns_the_ids_from_the_stream() {
        // The predecessor counted offsets 0..=1 and wrote upto = 1, but this process loaded the
        // minute before the predecessor's ids reached the index.
        let a = ev("a", AT);
        let mut s = fresh(&[(0, &a)]);
        s.keys.get_mut(&("a".to_string(), day_of(AT))).unwrap().upto = 1;
        s.keys
            .get_mut(&("a".to_string(), day_of(AT)))
            .unwrap()
            .counts = {
            let mut t = Tally::default();
            t.count(&a);
            t
        };
        let p = s.plan(&[(0, &a), (3, &a)]);
        assert_eq!((p.counted, p.redelivered, p.duplicates), (0, 1, 1));
    }

    #[test]
    fn ids_left_by_an_attempt_that_died_before_its_counts_are_not_copies() {
        // The index has a@4 and b@5 (written, then the process died before the counts); the
        // (link, day) still says upto = 3.
        let (a, b) = (ev("a", AT), ev("a", AT + 2));
        let mut s = fresh(&[(4, &a)]);
        let bucket = s.buckets.get_mut(&minute_of(AT)).unwrap();
        bucket.ids.insert(a.id, 4);
        bucket.ids.insert(b.id, 5);
        s.keys.get_mut(&("a".to_string(), day_of(AT))).unwrap().upto = 3;
        let p = s.plan(&[(4, &a), (5, &b), (6, &a), (7, &b)]);
        assert_eq!((p.counted, p.duplicates, p.redelivered), (2, 2, 0));
        assert_eq!(total(&s, &p, "a", AT), Some(2));
    }

    #[test]
    fn clicks_of_one_message_share_its_offset_and_are_each_counted_once() {
        // Message 7 holds three clicks of a (one of them twice: a copy inside the message) and
        // one of b; message 8 one more of a.
        let (a1, a2, b1, a3) = (ev("a", AT), ev("a", AT + 1), ev("b", AT), ev("a", AT + 2));
        let evs = [(7, &a1), (7, &a2), (7, &a1), (7, &b1), (8, &a3)];
        let mut s = fresh(&evs);
        let p = s.plan(&evs);
        assert_eq!((p.counted, p.duplicates, p.redelivered), (4, 1, 0));
        assert_eq!(total(&s, &p, "a", AT), Some(3));
        assert_eq!(total(&s, &p, "b", AT), Some(1));
        assert_eq!(p.writes[&("a".to_string(), day_of(AT))], 8);
        assert_eq!(p.ids[&minute_of(AT)].len(), 4);
        // Redelivered whole (the offsets were not committed): nothing counted again.
        let again = s.plan(&evs);
        assert_eq!((again.counted, again.redelivered), (0, 5));
        // A copy of a1 in a later message is a copy.
        let later = s.plan(&[(9, &a1)]);
        assert_eq!((later.counted, later.duplicates), (0, 1));
    }

    #[test]
    fn a_message_whose_ids_were_indexed_before_a_crash_is_counted_once_on_redelivery() {
        // An attempt wrote message 7's ids (a1, a2, a1's copy) and died before the counts; a
        // successor loads the index and upto = 6.
        let (a1, a2) = (ev("a", AT), ev("a", AT + 1));
        let mut s = fresh(&[(7, &a1)]);
        let bucket = s.buckets.get_mut(&minute_of(AT)).unwrap();
        bucket.ids.insert(a1.id, 7);
        bucket.ids.insert(a2.id, 7);
        s.keys.get_mut(&("a".to_string(), day_of(AT))).unwrap().upto = 6;
        let p = s.plan(&[(7, &a1), (7, &a2), (7, &a1)]);
        assert_eq!((p.counted, p.duplicates, p.redelivered), (2, 1, 0));
        assert_eq!(total(&s, &p, "a", AT), Some(2));
    }

    #[test]
    fn plans_of_consecutive_batches_absorbed_are_the_plan_of_them_all() {
        // Copies inside a message, across messages and across batches; messages of several
        // clicks; two days and three minutes; a redelivered prefix.
        let evs: Vec<Click> = (0..12)
            .map(|i| ev(["a", "b", "c"][i % 3], AT + (i as i64 % 4) * 40_000_000))
            .collect();
        let stream: Vec<(i64, &Click)> = [
            (0, 0),
            (0, 1),
            (1, 2),
            (2, 3),
            (2, 0),
            (3, 4),
            (4, 5),
            (4, 6),
            (4, 5),
            (5, 7),
            (6, 2),
            (7, 8),
            (8, 9),
            (8, 10),
            (9, 11),
            (10, 3),
        ]
        .iter()
        .map(|&(o, i)| (o, &evs[i]))
        .collect();
        // Batch boundaries fall between messages only (a message is never split).
        for cuts in [
            vec![3],
            vec![1, 5, 9],
            vec![2, 3, 6, 10, 12, 15],
            (1..16).collect(),
        ] {
            let mut whole = fresh(&stream);
            let want = whole.plan(&stream);
            let mut folded = fresh(&stream);
            let mut got = Plan::default();
            let mut start = 0;
            for cut in cuts.iter().copied().chain([stream.len()]) {
                if stream[..cut].last().map(|l| l.0) == stream.get(cut).map(|n| n.0) {
                    continue; // inside a message
                }
                got.absorb(folded.plan(&stream[start..cut]));
                start = cut;
            }
            assert_eq!(got, want, "cuts {cuts:?}");
            for (k, ks) in &whole.keys {
                assert_eq!(
                    folded.keys[k].counts.to_counts(),
                    ks.counts.to_counts(),
                    "{k:?}"
                );
                assert_eq!(folded.keys[k].upto, ks.upto, "{k:?}");
            }
        }
        // And a redelivery of the first messages after both is counted by neither.
        let mut s = fresh(&stream);
        let mut p = s.plan(&stream[..6]);
        p.absorb(s.plan(&stream[6..]));
        let again = s.plan(&stream[..6]);
        assert_eq!(again.counted, 0);
        assert_eq!(again.redelivered + again.duplicates, 6);
        assert!(again.is_empty());
    }

    #[test]
    fn a_read_group_is_let_go_of_whole_or_not_at_all() {
        let limits = Limits {
            keys: 40,
            ..Limits::default()
        };
        let day = day_of(AT);
        let mut s = SourceState::default();
        // 200 links; each link's group read (with no row) as its first click needs it.
        let clicks: Vec<Click> = (0..200).map(|i| ev(&format!("g{i}"), AT)).collect();
        for c in &clicks {
            let g = group_key(c.key(), day);
            if s.group_missing(&g) {
                s.insert_group(g, -1, Vec::new());
            }
            s.insert_new_member(c.key(), day);
            s.insert_bucket(minute_of(AT), Map::default());
        }
        let refs: Vec<(i64, &Click)> = (0..).zip(clicks.iter()).collect();
        s.plan(&refs[..190]);
        s.plan(&refs[190..]);
        s.evict(&limits);
        // Down to the limit: whole groups are counted as what they free.
        assert!(s.keys.len() <= limits.keys, "{}", s.keys.len());
        for c in &clicks {
            let key = (c.key().to_string(), day);
            assert_eq!(
                s.keys.contains_key(&key),
                !s.group_missing(&group_key(c.key(), day)),
                "{key:?}: in memory exactly when its group is"
            );
        }
        // What the last batch used stays.
        for c in &clicks[190..] {
            assert!(s.keys.contains_key(&(c.key().to_string(), day)));
        }
    }

    #[test]
    fn eviction_keeps_what_the_last_batch_used() {
        let limits = Limits {
            keys: 10,
            ids: 10,
            ..Limits::default()
        };
        let old: Vec<Click> = (0..20)
            .map(|i| ev(&format!("s{i}"), AT + i * MINUTE_MS))
            .collect();
        let refs: Vec<(i64, &Click)> = (0..).zip(old.iter()).collect();
        let mut s = fresh(&refs);
        s.plan(&refs);
        let recent = ev("s19", AT + 19 * MINUTE_MS);
        let refs = [(20, &recent)];
        s.plan(&refs);
        s.evict(&limits);
        assert!(s.keys.len() <= 10, "{}", s.keys.len());
        assert!(s.ids <= 10, "{}", s.ids);
        assert!(s
            .keys
            .contains_key(&("s19".to_string(), day_of(recent.at_ms))));
        assert!(s.buckets.contains_key(&minute_of(recent.at_ms)));
        assert_eq!(
            s.ids,
            s.buckets.values().map(|b| b.ids.len()).sum::<usize>()
        );
    }
}
