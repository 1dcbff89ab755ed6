//! The per-redirect cost of recording a click: building the event and appending it to the
//! spool (a copy into the mapped segment, fsync in the background). Run: `cargo bench -p zlink-clients`.
//! The append benchmark writes a few hundred MB to the temp dir (deleted afterwards).

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use http::{header, HeaderMap, HeaderValue};
use std::time::Duration;
use zlink_clients::clicks;
use zlink_clients::spool::{Spool, SpoolConfig};
use zlink_wire::events::Tier;

fn headers() -> HeaderMap {
    let mut h = HeaderMap::new();
    h.insert(
        header::USER_AGENT,
        HeaderValue::from_static(
            "Mozilla/5.0 (X11; Linux x86_64; rv:128.0) Gecko/20100101 Firefox/128.0",
        ),
    );
    h.insert(
        header::REFERER,
        HeaderValue::from_static("https://news.example/item?id=1"),
    );
    h.insert("x-forwarded-for", HeaderValue::from_static("203.0.113.9"));
    h
}

fn bench(c: &mut Criterion) {
    let h = headers();
    let peer = "127.0.0.1".parse().unwrap();
    let trusted: clicks::TrustedProxies = clicks::DEFAULT_TRUSTED_PROXIES.parse().unwrap();
    let trace = zlink_clients::trace::TraceContext::root();
    let geo = zlink_clients::geo::Geo::none();
    let mut g = c.benchmark_group("click");
    g.throughput(Throughput::Elements(1));
    g.bench_function("event+frame", |b| {
        b.iter(|| {
            let origin = trusted.origin(peer, &h, 1);
            clicks::with_event(
                Tier::Lastresort,
                "salt",
                &geo,
                "aB3dE5f",
                &origin,
                &h,
                |ev| clicks::frame(ev, Some(&trace)),
            )
        })
    });
    let dir = std::env::temp_dir().join(format!("zlink-bench-spool-{}", std::process::id()));
    let cfg = SpoolConfig {
        // No cap: every measured append must be a real write, never a refusal.
        max_bytes: u64::MAX / 2,
        ..SpoolConfig::new(&dir)
    };
    let (spool, _reader, _) = Spool::open(cfg).expect("spool");
    let owned = clicks::event(
        Tier::Lastresort,
        "salt",
        &geo,
        "aB3dE5f",
        &trusted.origin(peer, &h, 1),
        &h,
    );
    let rec = clicks::frame(&owned.borrowed(), Some(&trace));
    // The record's JSON alone, both ways (the same bytes: wire's unit tests).
    let ev = owned.borrowed();
    let mut buf = Vec::with_capacity(1024);
    g.bench_function("event JSON (serde_json::to_writer)", |b| {
        b.iter(|| {
            buf.clear();
            serde_json::to_writer(&mut buf, std::hint::black_box(&ev)).expect("json");
            buf.len()
        })
    });
    g.bench_function("event JSON (ClickRef::write_json)", |b| {
        b.iter(|| {
            buf.clear();
            std::hint::black_box(&ev).write_json(&mut buf);
            buf.len()
        })
    });
    g.bench_function(
        "spool append (copy into the mapped segment, fsync every 1024 or 20 ms)",
        |b| b.iter(|| spool.append(&rec).expect("append")),
    );
    g.finish();
    drop(spool);
    let _ = std::fs::remove_dir_all(dir);
}

criterion_group! {
    name = benches;
    config = Criterion::default().measurement_time(Duration::from_secs(3)).warm_up_time(Duration::from_secs(1));
    targets = bench
}
criterion_main!(benches);
