//! The click counter's reading of a `clicks` message: a replayer's message of 50 lines, each
//! a click as the redirect tiers write it (a browser's user agent, a referrer, a city), read
//! into what counting needs ([`counter::decode_all`]), next to reading the same lines into the
//! owned event (what the counter did before it read them borrowed), and by serde_json into the
//! borrowed line (what it did before [`ClickLine::fast`]).
//! Run: `cargo bench -p counter --bench decode`.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use zlink_wire::events::{
    AgentClass, ClickEvent, ClickLine, ClickRef, Device, Tier, CLICK_EVENT_SCHEMA,
};

const AT: i64 = 1_764_000_000_000;
const UA: &str = "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like \
                  Gecko) Chrome/131.0.0.0 Safari/537.36";

fn message() -> Vec<u8> {
    let mut m = Vec::new();
    let ip_hash = "0f".repeat(32);
    for i in 0..50 {
        let referrer = format!("https://www.ref{}.example/p?q={i}", i % 7);
        let city = format!("City {}", i % 50);
        let key = format!("aB3dE{i:02}");
        if i > 0 {
            m.push(b'\n');
        }
        ClickRef {
            schema: CLICK_EVENT_SCHEMA,
            id: uuid::Uuid::now_v7(),
            key: &key,
            at_ms: AT + i,
            tier: [Tier::Primary, Tier::Lastresort][i as usize % 2],
            referrer: Some(&referrer),
            user_agent: Some(UA),
            agent: AgentClass::Browser,
            ip_hash: &ip_hash,
            device: Device::Desktop,
            country: Some("DE"),
            city: (i % 3 != 0).then_some(city.as_str()),
        }
        .write_json(&mut m);
    }
    m
}

fn bench(c: &mut Criterion) {
    let m = message();
    let mut g = c.benchmark_group("counter");
    g.throughput(Throughput::Elements(50));
    g.bench_function("decode a message of 50 clicks", |b| {
        b.iter(|| counter::decode_all(Some(&m), AT + 1000))
    });
    g.bench_function(
        "the same lines read by serde_json (before ClickLine::fast)",
        |b| {
            b.iter(|| {
                zlink_wire::events::click_lines(&m)
                    .map(|l| serde_json::from_slice::<ClickLine>(l).unwrap())
                    .collect::<Vec<_>>()
            })
        },
    );
    g.bench_function("the same lines by ClickLine::fast", |b| {
        b.iter(|| {
            zlink_wire::events::click_lines(&m)
                .map(|l| ClickLine::fast(l).unwrap())
                .collect::<Vec<_>>()
        })
    });
    g.bench_function("the same lines as owned events (reference)", |b| {
        b.iter(|| {
            zlink_wire::events::click_lines(&m)
                .map(|l| serde_json::from_slice::<ClickEvent>(l).unwrap())
                .collect::<Vec<_>>()
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
