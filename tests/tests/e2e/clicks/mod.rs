//! Click analytics end to end against real Kafka and Cassandra — SYSTEM.md invariant 6, every
//! click counted exactly once: through a counter crash between counting and committing, a
//! SIGKILL at an arbitrary moment, one spool replayed twice, and a Kafka outage during which
//! primary and lastresort both take clicks. Also the stats API and the info page.
//!
//! Here: the counter process through crashes and redelivery, a spool replayed twice. In
//! modules: the store's writer and read model driven directly ([`store`]), the Kafka outage
//! with both redirect tiers, the stats API and the info page ([`outage`]).

use rdkafka::producer::{FutureProducer, FutureRecord};
use reqwest::StatusCode;
use serde_json::{json, Value};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;
use uuid::Uuid;
use zlink_e2e::*;
use zlink_store::clicks::writer::{Limits, SourceCounter};
use zlink_store::clicks::{
    day_of, first_day_of_month, month_closed, month_of_day, referrer_host, ClickStore, Counted,
    LinkStats, StatsReads, DAY_MS,
};
use zlink_wire::events::{AgentClass, ClickEvent, Device, Tier, CLICK_EVENT_SCHEMA};

const SLUGS: usize = 10;

fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

/// Click `i` of a varied stream: ten links, three days, every tier, bots and previews,
/// five referrers (one of them none), four devices, three countries (one unknown) and cities.
fn event(i: usize) -> ClickEvent {
    let tiers = Tier::ALL;
    let agents = [
        AgentClass::Bot,
        AgentClass::Preview,
        AgentClass::Browser,
        AgentClass::Browser,
    ];
    ClickEvent {
        schema: CLICK_EVENT_SCHEMA,
        id: Uuid::new_v4(),
        key: format!("count-{}", i % SLUGS).into(),
        at_ms: now_ms() - (i % 3) as i64 * DAY_MS,
        tier: tiers[i % 3],
        referrer: (!i.is_multiple_of(5)).then(|| format!("https://ref{}.example/p?q={i}", i % 5)),
        user_agent: Some("zlink-test".into()),
        agent: agents[i % 4],
        ip_hash: "00".repeat(32),
        device: [
            Device::Desktop,
            Device::Mobile,
            Device::Tablet,
            Device::Other,
        ][i % 4],
        country: [Some("DE"), Some("JP"), None][i % 3].map(String::from),
        city: (!i.is_multiple_of(7)).then(|| ["Berlin", "Tokyo", "Köln"][i % 3].to_string()),
    }
}

/// What the stats must say for these events, each id counted once (computed independently of
/// the counter's own row rules).
fn expected(events: &[ClickEvent]) -> BTreeMap<String, LinkStats> {
    let mut seen = HashSet::new();
    let mut out: BTreeMap<String, LinkStats> = BTreeMap::new();
    for e in events.iter().filter(|e| seen.insert(e.id)) {
        let s = out.entry(e.key.to_string()).or_default();
        s.total += 1;
        *s.by_tier.entry(e.tier.name().into()).or_default() += 1;
        *s.by_agent.entry(e.agent.name().into()).or_default() += 1;
        *s.per_day.entry(day_of(e.at_ms)).or_default() += 1;
        *s.referrers
            .entry(referrer_host(e.referrer.as_deref()))
            .or_default() += 1;
        *s.by_device.entry(e.device.name().into()).or_default() += 1;
        let country = e.country.clone().unwrap_or_else(|| "(unknown)".into());
        if let Some(city) = &e.city {
            *s.cities.entry(format!("{country}/{city}")).or_default() += 1;
        }
        *s.countries.entry(country).or_default() += 1;
    }
    out
}

async fn produce(brokers: &str, topic: &str, events: &[ClickEvent]) {
    let producer: FutureProducer = rdkafka::config::ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("enable.idempotence", "true")
        .set("linger.ms", "5")
        .create()
        .expect("producer");
    for chunk in events.chunks(500) {
        let sends: Vec<_> = chunk
            .iter()
            .map(|e| {
                let payload = serde_json::to_vec(e).unwrap();
                let producer = producer.clone();
                let (slug, topic) = (e.key.to_string(), topic.to_string());
                tokio::spawn(async move {
                    producer
                        .send(
                            FutureRecord::to(&topic).key(&slug).payload(&payload),
                            Duration::from_secs(20),
                        )
                        .await
                        .map(|_| ())
                        .map_err(|(e, _)| e)
                })
            })
            .collect();
        for s in sends {
            s.await.unwrap().expect("acknowledged");
        }
    }
}

/// `events` as the replayer sends them: per partition their slugs hash to, messages of up to
/// 50 events, one per line (a message of one keyed by its slug).
async fn produce_batched(brokers: &str, topic: &str, events: &[ClickEvent], partitions: u32) {
    use zlink_clients::clicks::partition_of;
    let producer: FutureProducer = rdkafka::config::ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("enable.idempotence", "true")
        .create()
        .expect("producer");
    let mut by_partition: BTreeMap<i32, Vec<&ClickEvent>> = BTreeMap::new();
    for e in events {
        by_partition
            .entry(partition_of(e.key.as_bytes(), partitions))
            .or_default()
            .push(e);
    }
    for (p, evs) in by_partition {
        for chunk in evs.chunks(50) {
            let lines: Vec<Vec<u8>> = chunk
                .iter()
                .map(|e| serde_json::to_vec(e).unwrap())
                .collect();
            let value = lines.join(&b'\n');
            let key = chunk[0].key.to_string();
            let mut record = FutureRecord::<str, [u8]>::to(topic)
                .partition(p)
                .payload(&value);
            if chunk.len() == 1 {
                record = record.key(&key);
            }
            producer
                .send(record, Duration::from_secs(20))
                .await
                .map_err(|(e, _)| e)
                .expect("acknowledged");
        }
    }
}

async fn click_store(infra: &Infra, ks: &str) -> Arc<ClickStore> {
    let db = Arc::new(
        zlink_store::Db::connect(&infra.store_config(ks))
            .await
            .unwrap(),
    );
    Arc::new(ClickStore::prepare(db).await.unwrap())
}

async fn stats_of(cs: &Arc<ClickStore>, slugs: &[String]) -> BTreeMap<String, LinkStats> {
    let mut out = BTreeMap::new();
    for s in slugs {
        // The events are up to two days old.
        let st = cs.link_stats(s, day_of(now_ms()) - 3).await.unwrap();
        if st.total > 0 {
            out.insert(s.clone(), st);
        }
    }
    out
}

async fn wait_stats(
    cs: &Arc<ClickStore>,
    want: &BTreeMap<String, LinkStats>,
    within: Duration,
) -> BTreeMap<String, LinkStats> {
    let slugs: Vec<String> = want.keys().cloned().collect();
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let got = stats_of(cs, &slugs).await;
        if &got == want || tokio::time::Instant::now() >= deadline {
            return got;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn total(stats: &BTreeMap<String, LinkStats>) -> i64 {
    stats.values().map(|s| s.total).sum()
}

/// Counts a run of (offset, click) of one source as one batch.
async fn count_batch(
    c: &mut SourceCounter,
    batch: &[(i64, ClickEvent)],
) -> Result<zlink_store::clicks::Counted, zlink_store::StoreError> {
    let batch = counted(batch);
    c.count(batch[0].0, batch[batch.len() - 1].0, &batch).await
}

/// The clicks as the counter reads them.
fn counted(events: &[(i64, ClickEvent)]) -> Vec<(i64, zlink_store::clicks::Click)> {
    events.iter().map(|(o, e)| (*o, e.into())).collect()
}

mod outage;
mod store;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn counts_exactly_once_through_a_crash_before_commit_a_sigkill_and_redelivered_duplicates() {
    let infra = Infra::from_env();
    let ks = fresh_keyspace(&infra).await;
    let topic = format!("clicks-{ks}");
    let group = format!("counter-{ks}");
    create_topics(&infra.kafka, &[(&topic, 3)]).await;
    let cs = click_store(&infra, &ks).await;

    // 3,000 clicks a message each (as every tier sent them before batching), then 300 of them
    // again in messages of many (what a spool replayed after the upgrade produces).
    let mut events: Vec<ClickEvent> = (0..3000).map(event).collect();
    let replayed: Vec<ClickEvent> = events[..300].to_vec();
    produce(&infra.kafka, &topic, &events).await;
    produce_batched(&infra.kafka, &topic, &replayed, 3).await;
    let want = expected(&events);
    let slugs: Vec<String> = want.keys().cloned().collect();

    // 1. A counter that crashes after writing its second window (of two batches each, in
    // production's window), before storing its offsets.
    let crashing = ServiceProcess::counter(
        &infra,
        &infra.kafka,
        &ks,
        &topic,
        &group,
        &[
            "--batch-max",
            "400",
            "--flush-ms",
            "5000",
            "--flush-clicks",
            "800",
            "--failpoint-abort-after-batches",
            "2",
        ],
    );
    let status = crashing.exited(Duration::from_secs(60)).await;
    assert!(!status.success(), "the failpoint aborts the counter");
    let partial = total(&stats_of(&cs, &slugs).await);
    assert!(
        partial > 0 && partial < 3000,
        "the crash came mid-stream ({partial} counted)"
    );

    // 2. Restarted: it re-reads the uncommitted batches; nothing is counted twice.
    let counter = ServiceProcess::counter(&infra, &infra.kafka, &ks, &topic, &group, &[])
        .ready()
        .await;
    let got = wait_stats(&cs, &want, Duration::from_secs(60)).await;
    assert_eq!(got, want, "every click exactly once after the crash");
    assert!(caught_up(&infra.kafka, &group, &topic, Duration::from_secs(30)).await);
    assert_eq!(
        stats_of(&cs, &slugs).await,
        want,
        "and still once when caught up"
    );
    let dups = metric_sum(
        &counter.url("/metrics"),
        "zlink_clicks_events_total{outcome=\"duplicate\"}",
    )
    .await;
    assert!(dups >= 300.0, "replayed copies seen and ignored ({dups})");
    assert!(counter.terminate().await.success(), "SIGTERM: clean stop");

    // 3. SIGKILL at whatever moment the counter is in, while it works through 2,000 more,
    // many to a message (batches of 100 clicks end inside runs of one message's clicks),
    // written in windows of several batches.
    let more: Vec<ClickEvent> = (3000..5000).map(event).collect();
    produce_batched(&infra.kafka, &topic, &more, 3).await;
    events.extend(more);
    let want = expected(&events);
    let counter = ServiceProcess::counter(
        &infra,
        &infra.kafka,
        &ks,
        &topic,
        &group,
        &[
            "--batch-max",
            "100",
            "--flush-ms",
            "5000",
            "--flush-clicks",
            "300",
        ],
    );
    assert!(
        eventually(Duration::from_secs(60), || {
            let (cs, slugs) = (cs.clone(), slugs.clone());
            async move { total(&stats_of(&cs, &slugs).await) > 3000 }
        })
        .await,
        "the counter got going"
    );
    counter.kill().await;
    let killed_at = total(&stats_of(&cs, &slugs).await);
    let counter = ServiceProcess::counter(&infra, &infra.kafka, &ks, &topic, &group, &[])
        .ready()
        .await;
    let got = wait_stats(&cs, &want, Duration::from_secs(60)).await;
    assert_eq!(
        got, want,
        "exactly once after a SIGKILL at {killed_at} of 5000"
    );
    assert!(caught_up(&infra.kafka, &group, &topic, Duration::from_secs(30)).await);
    assert_eq!(stats_of(&cs, &slugs).await, want);
    assert!(counter.terminate().await.success());
}

/// The replayer puts each click where librdkafka's default partitioner put it when every click
/// was a keyed message of its own, so a copy sent in either form reaches the same source.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_replayers_partition_of_a_slug_is_librdkafkas() {
    let infra = Infra::from_env();
    let topic = format!("clicks-part-{}", Uuid::new_v4().simple());
    create_topics(&infra.kafka, &[(&topic, 7)]).await;
    let producer: FutureProducer = rdkafka::config::ClientConfig::new()
        .set("bootstrap.servers", &infra.kafka)
        .create()
        .expect("producer");
    let mut seen = HashSet::new();
    for i in 0..200 {
        let slug = format!("p{i}-{}", "x".repeat(i % 13));
        let partition = producer
            .send(
                FutureRecord::to(&topic).key(&slug).payload("{}"),
                Duration::from_secs(20),
            )
            .await
            .map_err(|(e, _)| e)
            .expect("acknowledged")
            .partition;
        assert_eq!(
            partition,
            zlink_clients::clicks::partition_of(slug.as_bytes(), 7),
            "{slug}"
        );
        seen.insert(partition);
    }
    assert_eq!(seen.len(), 7, "keys spread over every partition");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_spool_replayed_twice_is_counted_once() {
    use zlink_clients::clicks::{ClickArgs, ClickMetrics, Clicks};
    let infra = Infra::from_env();
    let ks = fresh_keyspace(&infra).await;
    let topic = format!("clicks-{ks}");
    let group = format!("counter-{ks}");
    create_topics(&infra.kafka, &[(&topic, 3)]).await;
    let spool = TempDir::new("spool-twice");
    let copy = TempDir::new("spool-twice-copy");
    let args = |dir: &TempDir| ClickArgs {
        spool_dir: Some(dir.path().to_path_buf()),
        spool_max_bytes: 1 << 30,
        spool_segment_bytes: 256 << 10,
        spool_fsync_records: 1024,
        spool_fsync_ms: 20,
        spool_ring_bytes: zlink_clients::spool::DEFAULT_RING_BYTES,
        clicks_topic: topic.clone(),
        clicks_message_bytes: 256 * 1024,
        clicks_timeout_ms: 1000,
        clicks_linger_ms: zlink_clients::clicks::DEFAULT_LINGER_MS,
        ip_hash_salt: zlink_clients::Secret("salt-of-sixteen-bytes".into()),
        trusted_proxies: zlink_clients::clicks::DEFAULT_TRUSTED_PROXIES
            .parse()
            .unwrap(),
        geoip_db: None,
        kafka_tls: Default::default(),
    };
    let metrics = || ClickMetrics::register(&prometheus::Registry::new()).unwrap();

    // Spooled while no broker answers (a port nothing listens on).
    let events: Vec<ClickEvent> = (0..300).map(event).collect();
    let offline = Clicks::start(
        &args(&spool),
        "127.0.0.1:9",
        Tier::Lastresort,
        "t",
        metrics(),
    )
    .unwrap();
    for e in &events {
        assert!(offline.spool_event(&e.borrowed(), None));
    }
    offline.shutdown().await;
    drop(offline); // releases the spool directory's lock
    for f in std::fs::read_dir(spool.path()).unwrap() {
        let f = f.unwrap().path();
        std::fs::copy(&f, copy.path().join(f.file_name().unwrap())).unwrap();
    }

    // The spool and its copy both replay into Kafka: every event is there twice.
    for dir in [&spool, &copy] {
        let m = metrics();
        let c = Clicks::start(&args(dir), &infra.kafka, Tier::Lastresort, "t", m.clone()).unwrap();
        assert!(
            eventually(Duration::from_secs(30), || {
                let c = c.clone();
                async move { c.stats().pending == 0 }
            })
            .await,
            "spool replayed"
        );
        c.shutdown().await;
        // Many clicks to a message: a spooled backlog of 300 over 3 partitions is a few.
        let (clicks, messages) = (m.replayed.get(), m.replay_messages.get());
        assert_eq!(clicks, 300);
        assert!(messages <= 30, "{clicks} clicks in {messages} messages");
    }

    let cs = click_store(&infra, &ks).await;
    let counter = ServiceProcess::counter(&infra, &infra.kafka, &ks, &topic, &group, &[])
        .ready()
        .await;
    let want = expected(&events);
    assert!(caught_up(&infra.kafka, &group, &topic, Duration::from_secs(60)).await);
    assert_eq!(
        stats_of(&cs, &want.keys().cloned().collect::<Vec<_>>()).await,
        want
    );
    let m = counter.url("/metrics");
    let counted = metric_sum(&m, "zlink_clicks_events_total{outcome=\"counted\"}").await;
    let dups = metric_sum(&m, "zlink_clicks_events_total{outcome=\"duplicate\"}").await;
    assert_eq!((counted, dups), (300.0, 300.0));
    assert!(counter.terminate().await.success());
}
