//! The counter's writer and the stats read model driven directly against the store: racing
//! writers and a crash mid-write, month roll-ups and late clicks, rows of the counter before
//! `click_sums`, and the days counted in `click_sums` beside those in `click_groups`.

use super::*;

/// A source's stream of `n` clicks at offsets 0.. in which every fifth click past offset
/// `after` is a copy of an earlier original (the `(i * stride)`-th, cyclically) at a later
/// offset, as a replayed spool or a failed-over request gives: the originals and the stream.
fn stream_with_copies(
    n: usize,
    after: usize,
    stride: usize,
) -> (Vec<ClickEvent>, Vec<(i64, ClickEvent)>) {
    let mut originals: Vec<ClickEvent> = Vec::new();
    let mut stream = Vec::with_capacity(n);
    for i in 0..n {
        let e = if i % 5 == 4 && i > after {
            originals[(i * stride) % originals.len()].clone()
        } else {
            originals.push(event(i));
            originals[originals.len() - 1].clone()
        };
        stream.push((i as i64, e));
    }
    (originals, stream)
}

/// The writers of one source as a rebalance leaves them, against the real store: the old owner
/// dies in mid-write (ids and some counts stored, its offsets not committed) and keeps going as
/// a zombie with other batch boundaries while its successor counts the same offsets; a third
/// owner then re-reads part of the stream. One click in five is a copy of an earlier one at a
/// later offset (a replayed spool, a failed-over request), a third are days old. Every click is
/// counted once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn writers_racing_on_one_source_and_a_crash_in_mid_write_count_every_click_once() {
    let infra = Infra::from_env();
    let ks = fresh_keyspace(&infra).await;
    let cs = click_store(&infra, &ks).await;
    let (originals, stream) = stream_with_copies(3000, 100, 7);
    let want = expected(&originals);
    let slugs: Vec<String> = want.keys().cloned().collect();
    let limits = Limits {
        concurrency: 16,
        ..Limits::default()
    };
    let src = format!("clicks-{ks}:0");

    // The old owner: offsets 0..=999 counted (and, say, committed), then a batch that dies
    // after 10 of its 30 (link, day) writes.
    let mut old = SourceCounter::new(cs.clone(), src.clone(), limits);
    for batch in stream[..1000].chunks(250) {
        count_batch(&mut old, batch).await.unwrap();
    }
    old.fail_next_batch_after(10);
    assert!(count_batch(&mut old, &stream[1000..1500]).await.is_err());
    let partial = total(&stats_of(&cs, &slugs).await);
    assert!(
        partial > 800,
        "the first 1,000 offsets are counted ({partial})"
    );

    // The successor starts at the committed offset 1000 while the old owner, now a zombie,
    // keeps counting from there too, in batches of another size.
    let mut next = SourceCounter::new(cs.clone(), src.clone(), limits);
    let (zombie, successor) = tokio::join!(
        async {
            let mut c = Counted::default();
            for batch in stream[1000..2200].chunks(333) {
                let r = count_batch(&mut old, batch).await.unwrap();
                c += r;
            }
            c
        },
        async {
            let mut c = Counted::default();
            for batch in stream[1000..].chunks(400) {
                let r = count_batch(&mut next, batch).await.unwrap();
                c += r;
            }
            c
        }
    );
    assert!(
        zombie.redelivered + successor.redelivered > 0,
        "the writers found offsets the other had counted ({zombie:?}, {successor:?})"
    );
    assert_eq!(stats_of(&cs, &slugs).await, want, "every click once");

    // A third owner re-reads from offset 1800 (its predecessor never committed past it).
    let mut third = SourceCounter::new(cs.clone(), src, limits);
    let mut again = Counted::default();
    for batch in stream[1800..].chunks(500) {
        let r = count_batch(&mut third, batch).await.unwrap();
        again.counted += r.counted;
        again.redelivered += r.redelivered + r.duplicates;
    }
    assert_eq!(again.counted, 0, "nothing counted twice: {again:?}");
    assert_eq!(again.redelivered, 1200);
    assert_eq!(stats_of(&cs, &slugs).await, want, "and still once");
}

/// A session of its own in keyspace `ks`, for writing rows the counter did not.
async fn session_in(infra: &Infra, ks: &str) -> scylla::client::session::Session {
    scylla::client::session_builder::SessionBuilder::new()
        .known_node(&infra.cql)
        .use_keyspace(ks, false)
        .build()
        .await
        .unwrap()
}

/// Folds `part` into `c`'s window in batches of `size`: what they decided, summed.
async fn fold_all(c: &mut SourceCounter, part: &[(i64, ClickEvent)], size: usize) -> Counted {
    let mut sum = Counted::default();
    for b in part.chunks(size) {
        let r = c.fold(b[0].0, b[b.len() - 1].0, &counted(b)).await.unwrap();
        sum += r;
    }
    sum
}

/// Windows of several batches, as the counter writes them: each source's batches folded in
/// memory and written in one flush. A flush that dies in mid-write is tried again from memory
/// (no batch folded again) and counts nothing twice; a window that was folded and never
/// written (the process died, its offsets uncommitted) leaves nothing in the store and is
/// counted whole by the successor that re-reads it; a window's (link, day)s are each written
/// once however many of its batches touched them. One click in five is a copy.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn windows_of_folded_batches_count_every_click_once_through_a_failed_flush_and_a_lost_window()
{
    let infra = Infra::from_env();
    let ks = fresh_keyspace(&infra).await;
    let cs = click_store(&infra, &ks).await;
    let (originals, stream) = stream_with_copies(2400, 50, 11);
    let want = expected(&originals);
    let slugs: Vec<String> = want.keys().cloned().collect();
    let src = format!("clicks-{ks}:0");
    // Window 1: offsets 0..=799 in eight batches, nothing in the store until the flush.
    let mut first = SourceCounter::new(cs.clone(), src.clone(), Limits::default());
    let w1 = fold_all(&mut first, &stream[..800], 100).await;
    assert!(w1.counted > 600 && w1.duplicates > 0, "{w1:?}");
    assert_eq!(first.pending(), w1.counted);
    assert_eq!(
        total(&stats_of(&cs, &slugs).await),
        0,
        "folded, not written"
    );
    assert_eq!(first.flush().await.unwrap(), w1, "what the flush wrote");
    assert_eq!(first.pending(), 0);
    assert_eq!(
        total(&stats_of(&cs, &slugs).await),
        w1.counted as i64,
        "the window's clicks, each once"
    );

    // Window 2: 800..=1599, a flush that dies after 5 of its (link, day) writes, tried again
    // from memory.
    let w2 = fold_all(&mut first, &stream[800..1600], 160).await;
    first.fail_next_batch_after(5);
    assert!(first.flush().await.is_err());
    assert_eq!(
        first.pending(),
        w2.counted,
        "a failed flush keeps the window"
    );
    assert_eq!(first.flush().await.unwrap(), w2);
    assert_eq!(
        total(&stats_of(&cs, &slugs).await),
        (w1.counted + w2.counted) as i64
    );

    // Window 3: 1600..=2399 folded, then the process dies before its flush. The successor
    // starts at the committed offset 1600 with windows of other batch sizes.
    let w3 = fold_all(&mut first, &stream[1600..], 200).await;
    drop(first);
    let mut next = SourceCounter::new(cs.clone(), src.clone(), Limits::default());
    let again = fold_all(&mut next, &stream[1600..], 75).await;
    assert_eq!(
        (again.counted, again.redelivered),
        (w3.counted, 0),
        "the lost window counted whole, nothing of it found counted"
    );
    assert_eq!(next.flush().await.unwrap(), again);
    assert_eq!(stats_of(&cs, &slugs).await, want, "every click once");

    // Redelivered from 1000 (that successor never committed past it): nothing counts again.
    // The third owner's consumer first goes back from 1400 to 1200 (a seek after a rebalance):
    // what it had folded is dropped, not written, and the flush says so.
    let mut third = SourceCounter::new(cs.clone(), src, Limits::default());
    let dropped = fold_all(&mut third, &stream[1000..1400], 200).await;
    assert_eq!(
        (dropped.counted, dropped.redelivered + dropped.duplicates),
        (0, 400),
        "{dropped:?}"
    );
    let late = fold_all(&mut third, &stream[1200..], 500).await;
    assert_eq!(
        (late.counted, late.redelivered + late.duplicates),
        (0, 1200),
        "{late:?}"
    );
    assert_eq!(
        third.flush().await.unwrap(),
        late,
        "the dropped batches not among it"
    );
    assert_eq!(stats_of(&cs, &slugs).await, want, "and still once");
}

/// A link with clicks in old months: the first stats read rolls each closed month up, later
/// reads use the roll-up instead of the month's days. Clicks of a rolled-up month counted late
/// (a spool replayed after a long outage) delete its roll-up, also when the counter that counted
/// them died before it could and a successor only finds them redelivered; no read ever misses
/// a click whose batch was committed.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn old_months_are_read_as_rollups_and_late_clicks_reopen_their_month() {
    let infra = Infra::from_env();
    let ks = fresh_keyspace(&infra).await;
    // Reads follow the counter's deletes within milliseconds here, on the same clock: no margin
    // (with the default 10 s, a roll-up written that soon after a delete is hidden by it).
    let db = Arc::new(
        zlink_store::Db::connect(&infra.store_config(&ks))
            .await
            .unwrap(),
    );
    let cs = Arc::new(
        ClickStore::prepare(db)
            .await
            .unwrap()
            .with_rollup_clock_margin_us(0),
    );
    let src = format!("clicks-{ks}:0");
    let slug = "rolled".to_string();
    let today = day_of(now_ms());
    let this = month_of_day(today);
    let mut n = 0usize;
    let mut click = |day: i32| {
        n += 1;
        let mut e = event(n);
        e.key = slug.as_str().into();
        e.at_ms = i64::from(day) * DAY_MS + (n as i64 % 1000) * 60_000;
        e
    };
    // Three clicks on each of 12 days in each of the three months before last (closed
    // whatever today's date), and three today.
    let mut events: Vec<ClickEvent> = Vec::new();
    for month in this - 4..this - 1 {
        for k in 0..12 {
            for _ in 0..3 {
                events.push(click(first_day_of_month(month) + 2 * k));
            }
        }
    }
    for _ in 0..3 {
        events.push(click(today));
    }
    let mut offset = 0i64;
    let mut numbered = |batch: &[ClickEvent]| -> Vec<(i64, ClickEvent)> {
        batch
            .iter()
            .map(|e| {
                offset += 1;
                (offset, e.clone())
            })
            .collect()
    };
    let mut counter = SourceCounter::new(cs.clone(), src.clone(), Limits::default());
    count_batch(&mut counter, &numbered(&events)).await.unwrap();
    let want = |events: &[ClickEvent]| expected(events).remove(&slug).unwrap();
    // The link's first day: months this-4 to this are read. Last month has no clicks: once it
    // is closed (from the 3rd on), it gets an empty roll-up.
    let since = first_day_of_month(this - 4);
    let empty = usize::from(month_closed(this - 1, today));

    let (first, reads) = cs.read_link_stats(&slug, since).await.unwrap();
    assert_eq!(first, want(&events));
    assert_eq!(
        reads,
        StatsReads {
            days: 37,
            rollups_used: 0,
            rollups_written: 3 + empty
        }
    );
    let (second, reads) = cs.read_link_stats(&slug, since).await.unwrap();
    assert_eq!(second, first, "the roll-ups say what the days said");
    assert_eq!(
        reads,
        StatsReads {
            days: 1,
            rollups_used: 3 + empty,
            rollups_written: 0
        },
        "only today is read day by day"
    );

    // Late clicks of month this-3: on a day it has and on one it had no clicks on.
    let late: Vec<ClickEvent> = [0, 0, 1, 1, 1]
        .iter()
        .map(|k| click(first_day_of_month(this - 3) + k))
        .collect();
    count_batch(&mut counter, &numbered(&late)).await.unwrap();
    events.extend(late);
    let (third, reads) = cs.read_link_stats(&slug, since).await.unwrap();
    assert_eq!(third, want(&events), "the late clicks are in");
    assert_eq!(
        reads,
        StatsReads {
            days: 14,
            rollups_used: 2 + empty,
            rollups_written: 1
        },
        "month this-3 read day by day again and rolled up anew"
    );

    // A batch of a late click and one of today; its counter writes the late click's count and
    // dies before anything else. Its successor finds that click redelivered and today's new.
    let batch = numbered(&[click(first_day_of_month(this - 2) + 5), click(today)]);
    let mut dying = SourceCounter::new(cs.clone(), src.clone(), Limits::default());
    dying.fail_next_batch_after(1);
    assert!(count_batch(&mut dying, &batch).await.is_err());
    let mut successor = SourceCounter::new(cs.clone(), src, Limits::default());
    let c = count_batch(&mut successor, &batch).await.unwrap();
    assert_eq!((c.counted, c.redelivered), (1, 1));
    events.extend(batch.into_iter().map(|(_, e)| e));
    let (fourth, reads) = cs.read_link_stats(&slug, since).await.unwrap();
    assert_eq!(
        fourth,
        want(&events),
        "the redelivered click's month was reopened"
    );
    assert_eq!((reads.rollups_used, reads.rollups_written), (2 + empty, 1));
    let (fifth, reads) = cs.read_link_stats(&slug, since).await.unwrap();
    assert_eq!(fifth, fourth);
    assert_eq!(reads.days, 1);
}

/// The upgrade from the counter before `click_sums`: it counted offsets 0..=2 of a source into
/// `click_totals` (ids in the index, the day in `click_days`) and died before committing them.
/// The migration, finding such rows, lets the new counter read their offsets, so the
/// redelivered batch counts only what came after, and the stats sum both tables: each click
/// once. (Without the old row's offset the three would count again: their ids are in the
/// index at those very offsets, which looks like an attempt that died before its counts.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn rows_of_the_counter_before_click_sums_are_read_and_their_clicks_not_counted_again() {
    use zlink_store::clicks::{cell_name, DayCounts};
    let infra = Infra::from_env();
    let ks = fresh_keyspace(&infra).await;
    let session = session_in(&infra, &ks).await;
    let src = format!("clicks-{ks}:0");
    let at = now_ms();
    let events: Vec<ClickEvent> = (0..5)
        .map(|i| {
            let mut e = event(i);
            e.key = "upgraded".into();
            e.at_ms = at;
            e
        })
        .collect();
    let day = day_of(at);
    // What the old counter left of offsets 0..=2: their counts, their ids at those offsets,
    // the listed day.
    let mut counts = DayCounts::default();
    counts.add(&events[..3].iter().collect::<Vec<_>>());
    let cells: HashMap<String, i64> = counts
        .rows
        .iter()
        .map(|(r, n)| (cell_name(r), *n))
        .collect();
    session
        .query_unpaged(
            "UPDATE click_totals USING TIMESTAMP 3 SET upto = 2, n = n + ? \
             WHERE slug = 'upgraded' AND day = ? AND src = ?",
            (cells, day, &src),
        )
        .await
        .unwrap();
    session
        .query_unpaged(
            "INSERT INTO click_days (slug, day) VALUES ('upgraded', ?)",
            (day,),
        )
        .await
        .unwrap();
    let batch: Vec<(i64, ClickEvent)> = events
        .iter()
        .cloned()
        .enumerate()
        .map(|(o, e)| (o as i64, e))
        .collect();
    let mut blob = Vec::new();
    for (offset, e) in &batch[..3] {
        blob.extend_from_slice(e.id.as_bytes());
        blob.extend_from_slice(&offset.to_be_bytes());
    }
    session
        .query_unpaged(
            "INSERT INTO click_seen (src, minute, upto, writer, ids) VALUES (?, ?, 2, ?, ?)",
            (&src, at.div_euclid(60_000), Uuid::new_v4(), blob),
        )
        .await
        .unwrap();
    // The migration, run again as an upgrade runs it, finds the old rows.
    session
        .query_unpaged("DELETE FROM cursors WHERE name = 'click_totals_until'", ())
        .await
        .unwrap();
    zlink_store::schema::migrate(&infra.store_config(&ks), 1)
        .await
        .unwrap();

    let cs = click_store(&infra, &ks).await;
    let mut counter = SourceCounter::new(cs.clone(), src, Limits::default());
    let c = count_batch(&mut counter, &batch).await.unwrap();
    assert_eq!((c.counted, c.redelivered, c.duplicates), (2, 3, 0));
    let since = day_of(now_ms()) - 3;
    let stats = cs.link_stats("upgraded", since).await.unwrap();
    assert_eq!(stats, expected(&events).remove("upgraded").unwrap());
}

/// The upgrade to `click_groups`: days up to the cursor `click_sums_until` go on in
/// `click_sums` (a counter from before may still be counting them), later days go to
/// `click_groups`, and the stats sum both tables. One click in five is a copy, a third of them
/// are a day or two old (so on both sides of the cursor), and a successor re-reading half the
/// stream counts nothing again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn days_up_to_the_sums_cursor_stay_in_click_sums_and_later_ones_go_to_groups() {
    use std::collections::BTreeSet;
    let infra = Infra::from_env();
    let ks = fresh_keyspace(&infra).await;
    let session = session_in(&infra, &ks).await;
    let today = day_of(now_ms());
    session
        .query_unpaged(
            "UPDATE cursors SET position = ? WHERE name = 'click_sums_until'",
            (i64::from(today - 1),),
        )
        .await
        .unwrap();
    let cs = click_store(&infra, &ks).await;
    let (originals, stream) = stream_with_copies(600, 50, 3);
    let want = expected(&originals);
    let slugs: Vec<String> = want.keys().cloned().collect();
    let src = format!("clicks-{ks}:0");
    let mut counter = SourceCounter::new(cs.clone(), src.clone(), Limits::default());
    for batch in stream.chunks(100) {
        count_batch(&mut counter, batch).await.unwrap();
    }
    assert_eq!(stats_of(&cs, &slugs).await, want, "every click once");

    let days_of = |table: &'static str| {
        let session = &session;
        async move {
            let res = session
                .query_unpaged(format!("SELECT day FROM {table}"), ())
                .await
                .unwrap()
                .into_rows_result()
                .unwrap();
            res.rows::<(i32,)>()
                .unwrap()
                .map(|r| r.unwrap().0)
                .collect::<BTreeSet<i32>>()
        }
    };
    assert_eq!(
        days_of("click_sums").await,
        BTreeSet::from([today - 2, today - 1]),
        "the days up to the cursor in click_sums"
    );
    assert_eq!(
        days_of("click_groups").await,
        BTreeSet::from([today]),
        "the days after it in click_groups"
    );

    let mut next = SourceCounter::new(cs.clone(), src, Limits::default());
    let mut again = Counted::default();
    for batch in stream[300..].chunks(77) {
        again += count_batch(&mut next, batch).await.unwrap();
    }
    assert_eq!(again.counted, 0, "nothing counted twice: {again:?}");
    assert_eq!(stats_of(&cs, &slugs).await, want, "and still once");
}
