//! Click ingest benchmark against a running topology (see deploy/local/bench-clicks): produces
//! N click events over S links to the `clicks` topic as fast as Kafka takes them, and follows
//! the counter's own metrics until all N are counted. Prints the produce rate, the end-to-end
//! ingest throughput (first event produced → last counted) and the consumer lag sampled on the
//! way (messages, and seconds at the measured rate). `--per-message N` sends the clicks as the
//! tiers' replayers do, N of one partition to a message.

use clap::Parser;
use rdkafka::producer::{FutureProducer, FutureRecord};
use std::time::{Duration, Instant};
use zlink_wire::events::{AgentClass, ClickEvent, Device, Tier, CLICK_EVENT_SCHEMA};

#[derive(Parser)]
struct Args {
    #[arg(long)]
    kafka: String,
    /// The click counter's base URL (its /metrics is followed).
    #[arg(long)]
    counter: String,
    #[arg(long, default_value = "clicks")]
    topic: String,
    #[arg(long, default_value_t = 50_000)]
    events: u64,
    #[arg(long, default_value_t = 1_000)]
    slugs: u64,
    /// Stop waiting after this many seconds.
    #[arg(long, default_value_t = 300)]
    max_seconds: u64,
    /// First wait (at most this long) until the counter has no backlog (consumer lag under
    /// 100), so that only this run's events are counted in its time; fail if it does not.
    #[arg(long, default_value_t = 0)]
    settle_seconds: u64,
    /// Clicks per Kafka message, as the tiers' replayers send them (one partition's clicks,
    /// one event per line); 1: a keyed message per click, the form from before batching.
    #[arg(long, default_value_t = 1)]
    per_message: usize,
    /// The links' slug prefix (default: new for every run, so every link starts cold); the
    /// same prefix again measures links whose state the counter already holds.
    #[arg(long)]
    prefix: Option<String>,
    /// Produce at most this many clicks a second, paced evenly (0: as fast as Kafka takes
    /// them): a sustained rate the counter must keep up with, not a backlog to drain.
    #[arg(long, default_value_t = 0)]
    rate: u64,
}

async fn metric(client: &reqwest::Client, url: &str, name: &str) -> Option<f64> {
    let text = client.get(url).send().await.ok()?.text().await.ok()?;
    let mut found = false;
    let sum = text
        .lines()
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|r| r.starts_with(' ') || r.starts_with('{'))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .inspect(|_| found = true)
        .sum();
    found.then_some(sum)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let a = Args::parse();
    anyhow::ensure!(
        a.events > 0 && a.events <= 10_000_000,
        "--events 1..=10000000"
    );
    anyhow::ensure!(a.slugs > 0 && a.slugs <= 1_000_000, "--slugs 1..=1000000");
    anyhow::ensure!(a.rate <= 1_000_000, "--rate 0..=1000000");
    anyhow::ensure!(
        (1..=1000).contains(&a.per_message),
        "--per-message 1..=1000"
    );
    let http = reqwest::Client::new();
    let metrics = format!("{}/metrics", a.counter.trim_end_matches('/'));
    if a.settle_seconds > 0 {
        let until = Instant::now() + Duration::from_secs(a.settle_seconds);
        loop {
            let lag = metric(&http, &metrics, "zlink_clicks_consumer_lag").await;
            if lag.is_some_and(|l| l < 100.0) {
                break;
            }
            anyhow::ensure!(
                Instant::now() < until,
                "the counter still has a backlog ({lag:?} messages) after {} s: its rate would not be this run's",
                a.settle_seconds
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
    let counted = r#"zlink_clicks_events_total{outcome="counted"}"#;
    let base = metric(&http, &metrics, counted).await.unwrap_or(0.0);
    let run = a
        .prefix
        .clone()
        .unwrap_or_else(|| uuid::Uuid::new_v4().simple().to_string()[..8].to_string());
    let producer: FutureProducer = rdkafka::config::ClientConfig::new()
        .set("bootstrap.servers", &a.kafka)
        .set("enable.idempotence", "true")
        .set("linger.ms", "10")
        .set("queue.buffering.max.messages", "1000000")
        .create()?;

    let partitions = if a.per_message > 1 {
        use rdkafka::producer::Producer;
        let md = producer
            .client()
            .fetch_metadata(Some(&a.topic), Duration::from_secs(10))?;
        let n = md.topics().first().map_or(0, |t| t.partitions().len());
        anyhow::ensure!(n > 0, "topic {} has no partitions", a.topic);
        n as u32
    } else {
        0
    };

    let started = Instant::now();
    let produce = {
        let (producer, topic, run) = (producer.clone(), a.topic.clone(), run.clone());
        let (events, slugs, per_message, rate) = (a.events, a.slugs, a.per_message, a.rate);
        tokio::spawn(async move {
            let mut inflight = tokio::task::JoinSet::new();
            // Per partition, the lines of the message being filled.
            let mut open: std::collections::HashMap<i32, (Vec<u8>, usize)> =
                std::collections::HashMap::new();
            let send = |inflight: &mut tokio::task::JoinSet<bool>,
                        partition: Option<i32>,
                        key: Option<String>,
                        payload: Vec<u8>| {
                let (producer, topic) = (producer.clone(), topic.clone());
                inflight.spawn(async move {
                    let mut record = FutureRecord::<str, [u8]>::to(&topic).payload(&payload);
                    if let Some(k) = &key {
                        record = record.key(k);
                    }
                    if let Some(p) = partition {
                        record = record.partition(p);
                    }
                    producer.send(record, Duration::from_secs(30)).await.is_ok()
                });
            };
            for i in 0..events {
                if rate > 0 && i % 1000 == 0 {
                    // Click i is due i / rate seconds after the start.
                    let due = started + Duration::from_micros(i * 1_000_000 / rate);
                    tokio::time::sleep_until(due.into()).await;
                }
                let ev = ClickEvent {
                    schema: CLICK_EVENT_SCHEMA,
                    id: uuid::Uuid::new_v4(),
                    key: format!("bench-{run}-{}", i % slugs).into(),
                    at_ms: chrono::Utc::now().timestamp_millis(),
                    tier: if i % 2 == 0 {
                        Tier::Primary
                    } else {
                        Tier::Lastresort
                    },
                    referrer: Some(format!("https://ref{}.example/", i % 7)),
                    user_agent: Some("zlink-bench".into()),
                    agent: if i % 10 == 0 {
                        AgentClass::Bot
                    } else {
                        AgentClass::Browser
                    },
                    ip_hash: "00".repeat(32),
                    device: Device::Mobile,
                    country: Some(["DE", "JP", "US", "BR"][(i % 4) as usize].into()),
                    city: (!i.is_multiple_of(3)).then(|| format!("City {}", i % 50)),
                };
                let payload = serde_json::to_vec(&ev).expect("json");
                if per_message == 1 {
                    send(&mut inflight, None, Some(ev.key.to_string()), payload);
                } else {
                    let p = zlink_clients::clicks::partition_of(ev.key.as_bytes(), partitions);
                    let (buf, n) = open.entry(p).or_default();
                    if *n > 0 {
                        buf.push(b'\n');
                    }
                    buf.extend_from_slice(&payload);
                    *n += 1;
                    if *n == per_message {
                        let full = std::mem::take(buf);
                        *n = 0;
                        send(&mut inflight, Some(p), None, full);
                    }
                }
                while inflight.len() >= 10_000 {
                    inflight.join_next().await;
                }
            }
            for (p, (buf, n)) in open {
                if n > 0 {
                    send(&mut inflight, Some(p), None, buf);
                }
            }
            let mut failed = 0u64;
            while let Some(r) = inflight.join_next().await {
                failed += u64::from(!r.unwrap_or(false));
            }
            failed
        })
    };

    let mut lags = Vec::new();
    let mut produced_at = None;
    let deadline = started + Duration::from_secs(a.max_seconds);
    let mut done = 0.0;
    while Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(500)).await;
        if produced_at.is_none() && produce.is_finished() {
            produced_at = Some(started.elapsed());
        }
        done = metric(&http, &metrics, counted).await.unwrap_or(base) - base;
        if let Some(lag) = metric(&http, &metrics, "zlink_clicks_consumer_lag").await {
            lags.push(lag);
        }
        if done >= a.events as f64 {
            break;
        }
    }
    let elapsed = started.elapsed();
    let failed = produce.await?;
    let produced_s = produced_at.unwrap_or(elapsed).as_secs_f64();
    let rate = done / elapsed.as_secs_f64();
    lags.sort_by(f64::total_cmp);
    let pick = |q: f64| {
        lags.get(((lags.len() as f64 - 1.0) * q).round() as usize)
            .copied()
            .unwrap_or(0.0)
    };
    println!(
        "events {} over {} links, produce failures {failed}",
        a.events, a.slugs
    );
    println!(
        "produced in {produced_s:.1} s ({:.0} events/s into Kafka)",
        a.events as f64 / produced_s
    );
    println!(
        "counted {done:.0} in {:.1} s: {rate:.0} events/s end to end (Kafka → counted)",
        elapsed.as_secs_f64()
    );
    println!(
        "consumer lag while ingesting (sampled every 0.5 s, {} samples): p50 {:.0} msgs, max {:.0} msgs (≈ {:.1} s at {rate:.0}/s)",
        lags.len(),
        pick(0.5),
        pick(1.0),
        pick(1.0) / rate.max(1.0),
    );
    println!(
        "RESULT events={} links={} counted={done:.0} seconds={:.1} events_per_s={rate:.0} produced_per_s={:.0} lag_max={:.0}",
        a.events,
        a.slugs,
        elapsed.as_secs_f64(),
        a.events as f64 / produced_s,
        pick(1.0)
    );
    anyhow::ensure!(
        done >= a.events as f64,
        "only {done} of {} counted within {} s",
        a.events,
        a.max_seconds
    );
    Ok(())
}
