//! The click counter's per-click work in memory: counting a click into its (link, day)'s rows
//! (`DayCounts::count`, the hot path: a lookup per row, an allocation only for a new row) and
//! encoding a row as the blob `click_sums` stores (once per (link, day) per batch).
//! The counter counts into [`Tally`] (the same rows laid out for the hot path): both are here.
//! Run: `cargo bench -p zlink-store`.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use zlink_store::clicks::{Click, DayCounts, Tally};
use zlink_wire::events::{AgentClass, ClickEvent, Device, Tier, CLICK_EVENT_SCHEMA};

fn click(i: usize) -> ClickEvent {
    ClickEvent {
        schema: CLICK_EVENT_SCHEMA,
        id: uuid::Uuid::new_v4(),
        key: "aB3dE5f".into(),
        at_ms: 1_764_000_000_000,
        tier: [Tier::Primary, Tier::Lastresort][i % 2],
        referrer: Some(format!("https://ref{}.example/p?q={i}", i % 7)),
        user_agent: Some("bench".into()),
        agent: [AgentClass::Browser, AgentClass::Bot][usize::from(i.is_multiple_of(10))],
        ip_hash: "00".repeat(32),
        device: Device::Mobile,
        country: Some(["DE", "JP", "US", "BR"][i % 4].into()),
        city: (!i.is_multiple_of(3)).then(|| format!("City {}", i % 50)),
    }
}

fn bench(c: &mut Criterion) {
    let clicks: Vec<Click> = (0..1024).map(|i| Click::from(&click(i))).collect();
    let mut g = c.benchmark_group("counter");
    g.throughput(Throughput::Elements(1));
    // A link's day that has seen these clicks before: every row exists (the common case).
    let mut warm = DayCounts::default();
    for e in &clicks {
        warm.count(e);
    }
    let mut i = 0;
    g.bench_function("count (rows exist)", |b| {
        b.iter(|| {
            i = (i + 1) % clicks.len();
            warm.count(&clicks[i]);
        })
    });
    g.bench_function("count (first click of a link's day)", |b| {
        b.iter(|| {
            i = (i + 1) % clicks.len();
            let mut d = DayCounts::default();
            d.count(&clicks[i]);
            d
        })
    });
    // The same with the counter's in-memory rows (what it counts into since 2026-12-07).
    let mut warm = Tally::default();
    for e in &clicks {
        warm.count(e);
    }
    g.bench_function("tally count (rows exist)", |b| {
        b.iter(|| {
            i = (i + 1) % clicks.len();
            warm.count(&clicks[i]);
        })
    });
    g.bench_function("tally count (first click of a link's day)", |b| {
        b.iter(|| {
            i = (i + 1) % clicks.len();
            let mut t = Tally::default();
            t.count(&clicks[i]);
            t
        })
    });
    g.bench_function("tally encode (a day of 1,024 clicks)", |b| {
        b.iter(|| warm.encode())
    });
    let mut one = DayCounts::default();
    one.count(&clicks[1]);
    g.bench_function("encode (one click's rows)", |b| b.iter(|| one.encode()));
    g.bench_function("encode (a day of 1,024 clicks)", |b| {
        b.iter(|| warm.encode())
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
