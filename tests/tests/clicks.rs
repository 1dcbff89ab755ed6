//! Click analytics end to end against real Kafka and Cassandra — SYSTEM.md invariant 6, every
//! click counted exactly once: through a counter crash between counting and committing, a
//! SIGKILL at an arbitrary moment, one spool replayed twice, and a Kafka outage during which
//! primary and lastresort both take clicks. Also the stats API and the info page.

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
    day_of, first_day_of_month, month_closed, month_of_day, referrer_host, tier_name, ClickStore,
    Counted, LinkStats, StatsReads, DAY_MS,
};
use zlink_wire::events::{AgentClass, ClickEvent, Device, Tier, CLICK_EVENT_SCHEMA};

const SLUGS: usize = 10;

fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

/// Click `i` of a varied stream: ten links, three days, every tier, bots and previews,
/// five referrers (one of them none), four devices, three countries (one unknown) and cities.
fn event(i: usize) -> ClickEvent {
    let tiers = [Tier::Primary, Tier::Lastresort, Tier::LastresortNginx];
    let agents = [
        AgentClass::Bot,
        AgentClass::Preview,
        AgentClass::Browser,
        AgentClass::Browser,
    ];
    ClickEvent {
        schema: CLICK_EVENT_SCHEMA,
        id: Uuid::new_v4(),
        slug: format!("count-{}", i % SLUGS),
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
        let s = out.entry(e.slug.clone()).or_default();
        s.total += 1;
        *s.by_tier.entry(tier_name(e.tier).into()).or_default() += 1;
        let agent = match e.agent {
            AgentClass::Browser => "browser",
            AgentClass::Bot => "bot",
            AgentClass::Preview => "preview",
        };
        *s.by_agent.entry(agent.into()).or_default() += 1;
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
                let (slug, topic) = (e.slug.clone(), topic.to_string());
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
    c.count(batch[0].0, batch[batch.len() - 1].0, batch).await
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
    let mut originals: Vec<ClickEvent> = Vec::new();
    let mut stream: Vec<(i64, ClickEvent)> = Vec::new();
    for i in 0..3000usize {
        let e = if i % 5 == 4 && i > 100 {
            originals[(i * 7) % originals.len()].clone()
        } else {
            originals.push(event(i));
            originals[originals.len() - 1].clone()
        };
        stream.push((i as i64, e));
    }
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
                c.counted += r.counted;
                c.redelivered += r.redelivered;
            }
            c
        },
        async {
            let mut c = Counted::default();
            for batch in stream[1000..].chunks(400) {
                let r = count_batch(&mut next, batch).await.unwrap();
                c.counted += r.counted;
                c.redelivered += r.redelivered;
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
        e.slug = slug.clone();
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

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn counts_exactly_once_through_a_crash_before_commit_a_sigkill_and_redelivered_duplicates() {
    let infra = Infra::from_env();
    let ks = fresh_keyspace(&infra).await;
    let topic = format!("clicks-{ks}");
    let group = format!("counter-{ks}");
    create_topics(&infra.kafka, &[(&topic, 3)]).await;
    let cs = click_store(&infra, &ks).await;

    // 3,000 clicks, then 300 of them again (what a replayed spool produces).
    let mut events: Vec<ClickEvent> = (0..3000).map(event).collect();
    let replayed: Vec<ClickEvent> = events[..300].to_vec();
    produce(&infra.kafka, &topic, &events).await;
    produce(&infra.kafka, &topic, &replayed).await;
    let want = expected(&events);
    let slugs: Vec<String> = want.keys().cloned().collect();

    // 1. A counter that crashes after counting its second batch, before storing its offsets.
    let crashing = ServiceProcess::counter(
        &infra,
        &infra.kafka,
        &ks,
        &topic,
        &group,
        &["--batch-max", "400", "--failpoint-abort-after-batches", "2"],
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

    // 3. SIGKILL at whatever moment the counter is in, while it works through 2,000 more.
    let more: Vec<ClickEvent> = (3000..5000).map(event).collect();
    produce(&infra.kafka, &topic, &more).await;
    events.extend(more);
    let want = expected(&events);
    let counter = ServiceProcess::counter(
        &infra,
        &infra.kafka,
        &ks,
        &topic,
        &group,
        &["--batch-max", "100"],
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
        clicks_topic: topic.clone(),
        clicks_timeout_ms: 1000,
        ip_hash_salt: zlink_clients::Secret("salt-of-sixteen-bytes".into()),
        trusted_proxies: zlink_clients::clicks::DEFAULT_TRUSTED_PROXIES
            .parse()
            .unwrap(),
        geoip_db: None,
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
        assert!(offline.spool_event(e, None));
    }
    offline.shutdown().await;
    drop(offline); // releases the spool directory's lock
    for f in std::fs::read_dir(spool.path()).unwrap() {
        let f = f.unwrap().path();
        std::fs::copy(&f, copy.path().join(f.file_name().unwrap())).unwrap();
    }

    // The spool and its copy both replay into Kafka: every event is there twice.
    for dir in [&spool, &copy] {
        let c = Clicks::start(&args(dir), &infra.kafka, Tier::Lastresort, "t", metrics()).unwrap();
        assert!(
            eventually(Duration::from_secs(30), || {
                let c = c.clone();
                async move { c.stats().pending == 0 }
            })
            .await,
            "spool replayed"
        );
        c.shutdown().await;
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

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn clicks_on_primary_and_lastresort_during_a_kafka_outage_are_counted_by_tier_place_and_device(
) {
    let infra = Infra::from_env();
    let ks = fresh_keyspace(&infra).await;
    let n = names(&ks);
    let kafka = OwnKafka::start(26400).await;
    let topic = format!("clicks-{ks}");
    let group = format!("counter-{ks}");
    create_topics(
        &kafka.brokers,
        &[(&n.links_topic, 3), (&n.dlq_topic, 1), (&topic, 3)],
    )
    .await;
    // A City database of the test's own: two documentation networks known, a third not.
    let geo_dir = TempDir::new("geoip");
    let geo_db = geo_dir.path().join("city.mmdb");
    zlink_clients::geo::write_test_db(
        &geo_db,
        &[
            ("203.0.113.0/24", "DE", Some("Berlin")),
            ("198.51.100.0/24", "JP", Some("Tokyo")),
        ],
    )
    .unwrap();
    let geo_db = geo_db.to_string_lossy().to_string();
    let BothTiers {
        primary: p,
        replicator,
        lastresort: lr,
        key,
    } = both_tiers_with_a_link(
        &infra,
        &ks,
        &kafka.brokers,
        (&topic, &["--geoip-db", &geo_db], 45),
        "outage-clicks",
        "https://example.com/outage?a=1&b=<2>",
    )
    .await;
    let other = create_key(&p.state, "mallory", false).await;

    kafka.stop().await;
    let mut ids = HashSet::new();
    for (base, tier) in [(&p.base, "primary"), (&lr.base, "lastresort")] {
        for i in 0..1000 {
            let ua = if i % 10 == 0 {
                "Twitterbot/1.0".to_string()
            } else if i % 2 == 0 {
                format!("Mozilla/5.0 (iPhone; CPU iPhone OS 17_0 like Mac OS X) zlink-test/{i}")
            } else {
                format!("Mozilla/5.0 (Windows NT 10.0; Win64; x64) zlink-test/{i}")
            };
            // The client as the trusted frontend (this test, on loopback) says.
            let client_ip = ["203.0.113.7", "198.51.100.7", "192.0.2.7"][i % 3];
            let r = client()
                .get(format!("{base}/outage-clicks"))
                .header("user-agent", ua)
                .header("x-forwarded-for", client_ip)
                .header("referer", "https://news.example/item")
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), StatusCode::FOUND, "{tier} redirect {i}");
            assert!(ids.insert(
                r.headers()["x-zlink-click-id"]
                    .to_str()
                    .unwrap()
                    .to_string()
            ));
        }
    }
    assert_eq!(ids.len(), 2000);

    kafka.up().await;
    let counter = ServiceProcess::counter(&infra, &kafka.brokers, &ks, &topic, &group, &[])
        .ready()
        .await;
    let stats_url = p.url("/api/v1/links/outage-clicks/stats");
    let stats = |key: String| {
        let u = stats_url.clone();
        async move {
            let r = client().get(&u).bearer_auth(key).send().await.unwrap();
            (r.status(), r.json::<Value>().await.unwrap())
        }
    };
    assert!(
        eventually(Duration::from_secs(60), || {
            let s = stats(key.clone());
            async move { s.await.1["total"] == 2000 }
        })
        .await,
        "all 2,000 clicks counted within 60 s of Kafka's return"
    );
    let (status, body) = stats(key.clone()).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["by_tier"]["primary"], 1000);
    assert_eq!(body["by_tier"]["lastresort"], 1000);
    assert_eq!(body["by_tier"]["lastresort-nginx"], 0);
    assert_eq!(body["humans"], 1800);
    assert_eq!(body["bots"], 200, "link previews are counted apart");
    assert_eq!(body["by_agent"]["preview"], 200);
    assert_eq!(body["top_referrers"][0]["referrer"], "news.example");
    assert_eq!(body["top_referrers"][0]["clicks"], 2000);
    let days = body["last_days"].as_array().unwrap();
    assert_eq!(days.len(), 30);
    assert_eq!(days[29]["clicks"], 2000, "today");
    // Places, from the database on both tiers (lastresort's clicks were made while the
    // primary site could not take them): 334 + 333 per tier.
    assert_eq!(
        body["top_countries"],
        json!([
            {"country": "DE", "clicks": 668},
            {"country": "(unknown)", "clicks": 666},
            {"country": "JP", "clicks": 666},
        ])
    );
    assert_eq!(
        body["top_cities"],
        json!([
            {"country": "DE", "city": "Berlin", "clicks": 668},
            {"country": "JP", "city": "Tokyo", "clicks": 666},
        ])
    );
    assert_eq!(
        body["by_device"],
        json!({"desktop": 1000, "mobile": 800, "tablet": 0, "other": 200})
    );

    // Freshness in normal operation: a click shows up in the stats well within 60 s.
    let r = client()
        .get(p.url("/outage-clicks"))
        .header("user-agent", "Mozilla/5.0 zlink-test/fresh")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::FOUND);
    assert!(
        eventually(Duration::from_secs(60), || {
            let s = stats(key.clone());
            async move { s.await.1["total"] == 2001 }
        })
        .await,
        "a click counted within 60 s"
    );
    assert!(caught_up(&kafka.brokers, &group, &topic, Duration::from_secs(30)).await);
    assert_eq!(stats(key.clone()).await.1["total"], 2001);

    // Only the owner (or an admin) reads stats; errors are JSON.
    let (status, body) = stats(other.clone()).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert!(body["error"]["code"].is_string());
    let r = client().get(&stats_url).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    let r = client()
        .get(p.url("/api/v1/links/no-such-link/stats"))
        .bearer_auth(&key)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NOT_FOUND);

    // The info page: destination (escaped), creation date, clicks; viewing it is no click.
    let r = client().get(p.url("/outage-clicks+")).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(r.headers()["content-type"], "text/html; charset=utf-8");
    let html = r.text().await.unwrap();
    assert!(html.contains("Clicks</dt><dd>2001 (1801 by people, 200 by bots"));
    assert!(
        html.contains("outage?a=1&amp;b="),
        "destination escaped: {html}"
    );
    assert!(!html.contains("<2>"), "destination escaped: {html}");
    assert!(html.contains(&chrono::Utc::now().format("%Y-%m-%d").to_string()));
    let r = client().get(p.url("/no-such-link+")).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
    assert!(caught_up(&kafka.brokers, &group, &topic, Duration::from_secs(30)).await);
    assert_eq!(stats(key.clone()).await.1["total"], 2001);

    assert!(counter.terminate().await.success());
    assert!(lr.terminate().await.success());
    replicator.stop().await;
    p.stop().await;
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
    let session = scylla::client::session_builder::SessionBuilder::new()
        .known_node(&infra.cql)
        .use_keyspace(&ks, false)
        .build()
        .await
        .unwrap();
    let src = format!("clicks-{ks}:0");
    let at = now_ms();
    let events: Vec<ClickEvent> = (0..5)
        .map(|i| {
            let mut e = event(i);
            e.slug = "upgraded".into();
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
