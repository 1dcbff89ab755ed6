//! Failover when components hang instead of dying (SYSTEM.md invariants 10, 11, 12), through real
//! nginx: frozen primaries and lastresort processes (SIGSTOP: connections accepted, nothing
//! answered), slow primaries and a blackholed store behind a real fault proxy (Toxiproxy). Every
//! redirect must still get the right answer from some rung; a known-bad dependency costs a
//! bounded number of timeouts, not one per request; a request that a slow or frozen tier
//! finishes late is still one click; the longest link the API accepts redirects on every rung.

use reqwest::StatusCode;
use serde_json::{json, Value};
use std::collections::{BTreeMap, HashSet};
use std::time::{Duration, Instant};
use zlink_e2e::faults::{freeze, Fault, OwnToxiproxy};
use zlink_e2e::*;

/// A last-resort host (its nginx) in front of `lr`, reading S3 under `prefix`.
async fn lastresort_host(infra: &Infra, lrs: &[String], prefix: &str, click_log: &str) -> OwnNginx {
    // A long window: within this test a frozen process is tried exactly once.
    let lr_servers = upstream_servers(lrs, "max_fails=1 fail_timeout=60s");
    OwnNginx::start(
        "lastresort.conf",
        &lastresort_host_values(lr_servers, infra, prefix, click_log),
    )
    .await
}

async fn frontend(primaries: &[String], lastresort_host: &str) -> OwnNginx {
    OwnNginx::start(
        "frontend.conf",
        &[
            (
                "PRIMARY_SERVERS",
                upstream_servers(primaries, "max_fails=1 fail_timeout=60s"),
            ),
            (
                "LASTRESORT_HOST_SERVERS",
                upstream_servers(&[hostport(lastresort_host)], "max_fails=1 fail_timeout=60s"),
            ),
        ],
    )
    .await
}

struct Answer {
    tier: String,
    click: Option<String>,
}

/// GET (or HEAD) through nginx and check the answer is right for `url`: the redirect on rungs
/// 1 and 2, the meta-refresh page on rung 3.
async fn right_answer(base: &str, slug: &str, url: &str, head: bool) -> Answer {
    let u = format!("{base}/{slug}");
    let req = if head {
        client().head(&u)
    } else {
        client().get(&u)
    };
    let r = req
        .header("user-agent", "Mozilla/5.0 hang-test")
        .send()
        .await
        .unwrap();
    let status = r.status();
    let h = r.headers().clone();
    let tier = h
        .get("x-zlink-tier")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    let click = h
        .get("x-zlink-click-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    match tier.as_str() {
        "primary" | "lastresort" => {
            assert_eq!(status, StatusCode::FOUND, "{slug} via {tier}");
            assert_eq!(h["location"], url, "{slug} via {tier}");
        }
        "lastresort-nginx" => {
            assert_eq!(status, StatusCode::OK, "{slug} via rung 3");
            if !head {
                let body = r.text().await.unwrap();
                assert!(body.contains("http-equiv=\"refresh\""));
                assert!(body.contains(&zlink_wire::blob::escape_html(url)));
            }
        }
        other => panic!("{slug}: no rung answered ({status}, tier {other:?})"),
    }
    Answer { tier, click }
}

/// Every event with click id `id` in `topic`, reading until `min` copies are there (≤ 60 s).
async fn copies_in_kafka(
    brokers: &str,
    topic: &str,
    id: uuid::Uuid,
    min: usize,
) -> Vec<zlink_wire::events::ClickEvent> {
    use rdkafka::Message;
    let consumer = topic_reader(brokers, topic, "copies");
    let mut copies = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while copies.len() < min && Instant::now() < deadline {
        if let Ok(Ok(m)) = tokio::time::timeout(Duration::from_secs(1), consumer.recv()).await {
            let ev: zlink_wire::events::ClickEvent =
                serde_json::from_slice(m.payload().unwrap()).unwrap();
            if ev.id == id {
                copies.push(ev);
            }
        }
    }
    copies
}

fn tried(log: &[Value], addr: &str) -> usize {
    log.iter()
        .filter(|l| l["upstream"].as_str().unwrap_or("").contains(addr))
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn hung_and_slow_tiers_cost_one_timeout_each_and_every_click_is_counted_once() {
    // Arrange: one primary process (to be frozen), the replicator, one lastresort process
    // behind its host nginx, the frontend, and the click counter.
    let infra = Infra::from_env();
    let (ks, n, topic) = pipeline_keyspace(&infra).await;
    let flags = kafka_flags(&infra, &n, &topic);
    // The API (links, keys, stats) goes to an in-process primary; redirects to the process.
    let api = spawn_primary(&infra, &ks, &flags, None).await;
    let key = create_key(&api.state, "hang", true).await;
    let replicator = spawn_replicator(&infra, &ks, &infra.kafka).await;
    // Two of each, as deployed: nginx never marks the only server of a group unavailable.
    let primary_flags = [
        "--links-topic",
        &n.links_topic,
        "--clicks-topic",
        &topic,
        "--public-base-url",
        "http://127.0.0.1:1",
    ];
    let primaries = [
        ServiceProcess::primary(&infra, &ks, &infra.kafka, &primary_flags)
            .ready()
            .await,
        ServiceProcess::primary(&infra, &ks, &infra.kafka, &primary_flags)
            .ready()
            .await,
    ];
    // The longest URL the API accepts must work on every rung (nginx buffers sized for it).
    let longest = format!(
        "https://example.com/{}",
        "a".repeat(zlink_wire::longurl::MAX_URL_BYTES - 20)
    );
    assert_eq!(longest.len(), zlink_wire::longurl::MAX_URL_BYTES);
    let mut links = vec![("hang-longest".to_string(), longest)];
    for i in 0..3 {
        links.push((
            format!("hang-{i}"),
            format!("https://example.com/hang/{i}?a=1&b=2"),
        ));
    }
    for (slug, url) in &links {
        let c = create(&api.base, &key, json!({"url": url, "slug": slug})).await;
        assert_eq!(c.status(), StatusCode::CREATED, "{slug}");
    }
    for (slug, _) in &links {
        assert!(
            eventually_ok(&infra.blob_url(&n.s3_prefix, slug), Duration::from_secs(10)).await,
            "{slug} in S3"
        );
    }
    let click_dir = TempDir::new("hang-clicklog");
    let click_log = click_dir.path().join("clicks.json").display().to_string();
    let lr_flags = ["--clicks-topic", &topic, "--nginx-click-log", &click_log];
    let lrs = [
        ServiceProcess::lastresort(&infra, &infra.s3_endpoint, &n.s3_prefix, &lr_flags).await,
        ServiceProcess::lastresort(&infra, &infra.s3_endpoint, &n.s3_prefix, &lr_flags).await,
    ];
    let lr_addrs: Vec<String> = lrs.iter().map(|l| hostport(&l.base)).collect();
    let host = lastresort_host(&infra, &lr_addrs, &n.s3_prefix, &click_log).await;
    let p_addrs: Vec<String> = primaries.iter().map(|p| hostport(&p.base)).collect();
    let fe = frontend(&p_addrs, &host.base).await;
    let counter = ServiceProcess::counter(
        &infra,
        &infra.kafka,
        &ks,
        &topic,
        &format!("counter-{ks}"),
        &[],
    );
    let mut clicks: BTreeMap<String, HashSet<String>> = BTreeMap::new();
    let mut record = |slug: &str, a: &Answer| {
        let id = a
            .click
            .clone()
            .expect("every GET answer carries its click id");
        assert!(
            clicks.entry(slug.to_string()).or_default().insert(id),
            "a click id is never reused by another request"
        );
    };

    // Rung 1, including the longest link; HEAD answers the same and is no click.
    for (slug, url) in &links {
        let a = right_answer(&fe.base, slug, url, false).await;
        assert_eq!(a.tier, "primary");
        record(slug, &a);
        let h = right_answer(&fe.base, slug, url, true).await;
        assert_eq!(h.tier, "primary");
        assert_eq!(h.click, None, "HEAD is not a click");
    }

    // Act 0: the primaries answer slowly (their responses held back by a fault proxy on the
    // way to a second frontend). Each primary has already recorded the click when nginx gives
    // up on it and asks lastresort: three copies of one click under the frontend's id and time,
    // which the counter must count once. Later requests skip the slow primaries.
    let toxi = OwnToxiproxy::start().await;
    let mut slow_addrs = Vec::new();
    for (i, p) in p_addrs.iter().enumerate() {
        slow_addrs.push(toxi.proxy(&format!("p{i}"), p).await);
    }
    let slow_fe = frontend(&slow_addrs, &host.base).await;
    for i in 0..slow_addrs.len() {
        toxi.inject(&format!("p{i}"), Fault::Slow(Duration::from_secs(2)))
            .await;
    }
    let mut slow_first = None;
    for i in 0..4 {
        let (slug, url) = &links[i % links.len()];
        let a = right_answer(&slow_fe.base, slug, url, false).await;
        assert_eq!(a.tier, "lastresort", "slow request {i}");
        slow_first.get_or_insert_with(|| a.click.clone().unwrap());
        record(slug, &a);
    }
    let slow_log = slow_fe.access_log("nginx-frontend.access.json", 4).await;
    for p in &slow_addrs {
        assert_eq!(tried(&slow_log, p), 1, "a slow primary costs one timeout");
    }
    let first: uuid::Uuid = slow_first.unwrap().parse().unwrap();
    let copies = copies_in_kafka(&infra.kafka, &topic, first, 3).await;
    let tiers: HashSet<_> = copies.iter().map(|e| format!("{:?}", e.tier)).collect();
    assert_eq!(
        (copies.len(), tiers.len()),
        (3, 2),
        "both slow primaries recorded the click lastresort answered: {copies:?}"
    );
    assert!(
        copies.windows(2).all(|w| w[0].at_ms == w[1].at_ms),
        "one click time: the frontend's"
    );

    // Act 1: both primaries freeze. Every redirect is still right (rung 2), and only the first
    // one waits for them (one timeout each): the rest skip them.
    for p in &primaries {
        freeze(p.pid(), true);
    }
    for i in 0..40 {
        let (slug, url) = &links[i % links.len()];
        let a = right_answer(&fe.base, slug, url, false).await;
        assert_eq!(a.tier, "lastresort", "request {i}");
        record(slug, &a);
    }
    let log = fe
        .access_log("nginx-frontend.access.json", links.len() * 2 + 40)
        .await;
    for p in &p_addrs {
        assert_eq!(
            tried(&log[links.len() * 2..], p),
            1,
            "a frozen primary costs one timeout per fail_timeout window, not one per request"
        );
    }

    // Act 2: the lastresort process freezes too: nginx on its host serves S3 directly (rung 3),
    // the longest link included; HEAD is no click there either.
    for l in &lrs {
        freeze(l.pid(), true);
    }
    for i in 0..12 {
        let (slug, url) = &links[i % links.len()];
        let a = right_answer(&fe.base, slug, url, false).await;
        assert_eq!(a.tier, "lastresort-nginx", "request {i}");
        record(slug, &a);
    }
    let h = right_answer(&fe.base, &links[1].0, &links[1].1, true).await;
    assert_eq!(h.tier, "lastresort-nginx");
    let host_log = host.access_log("nginx-lastresort.access.json", 57).await;
    for l in &lr_addrs {
        assert_eq!(
            tried(&host_log[44..], l),
            1,
            "a frozen lastresort process costs one timeout, then nginx goes straight to S3"
        );
    }

    // They thaw. A thawed process may still finish a request nginx gave up on (or find the
    // connection closed and drop it); either way its click carries the frontend's id and time,
    // so the counter sees a duplicate, never a new click.
    for pid in primaries
        .iter()
        .map(|p| p.pid())
        .chain(lrs.iter().map(|l| l.pid()))
    {
        freeze(pid, false);
    }

    // Assert: every click counted exactly once — the late copies are not counted again.
    for (slug, ids) in &clicks {
        let url = api.url(&format!("/api/v1/links/{slug}/stats"));
        let want = ids.len() as i64;
        let key = key.clone();
        let counted = eventually(Duration::from_secs(90), || {
            let (url, key) = (url.clone(), key.clone());
            async move {
                let r = client().get(&url).bearer_auth(&key).send().await.unwrap();
                r.json::<Value>().await.unwrap()["total"].as_i64() == Some(want)
            }
        })
        .await;
        assert!(counted, "{slug}: {want} clicks counted once each");
    }
    // And stays so once the counter has caught up with everything (nothing late is pending).
    assert!(
        caught_up(
            &infra.kafka,
            &format!("counter-{ks}"),
            &topic,
            Duration::from_secs(60)
        )
        .await
    );
    for (slug, ids) in &clicks {
        let r = client()
            .get(api.url(&format!("/api/v1/links/{slug}/stats")))
            .bearer_auth(&key)
            .send()
            .await
            .unwrap();
        assert_eq!(
            r.json::<Value>().await.unwrap()["total"].as_i64(),
            Some(ids.len() as i64),
            "{slug}"
        );
    }
    counter.kill().await;
    replicator.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_blackholed_store_costs_a_few_budgets_then_redirects_fail_over_at_once() {
    // Arrange: the primary reaches the store through a fault proxy; lastresort has S3.
    let infra = Infra::from_env();
    let (ks, n, topic) = pipeline_keyspace(&infra).await;
    let toxi = OwnToxiproxy::start().await;
    let store = toxi.proxy("store", &infra.cql).await;
    let p = spawn_primary(
        &infra,
        &ks,
        &[
            "--cql-nodes",
            &store,
            "--kafka",
            &infra.kafka,
            "--links-topic",
            &n.links_topic,
            "--clicks-topic",
            &topic,
            "--store-breaker-open-ms",
            "2000",
        ],
        None,
    )
    .await;
    let replicator = spawn_replicator(&infra, &ks, &infra.kafka).await;
    let key = create_key(&p.state, "hang", false).await;
    let mut links = Vec::new();
    for i in 0..30 {
        let (slug, url) = (format!("cold-{i}"), format!("https://example.com/cold/{i}"));
        let c = create(&p.base, &key, json!({"url": url, "slug": slug})).await;
        assert_eq!(c.status(), StatusCode::CREATED);
        links.push((slug, url));
    }
    for (slug, _) in &links {
        assert!(eventually_ok(&infra.blob_url(&n.s3_prefix, slug), Duration::from_secs(10)).await);
    }
    let click_dir = TempDir::new("store-hang-clicklog");
    let click_log = click_dir.path().join("clicks.json").display().to_string();
    let lr = ServiceProcess::lastresort(
        &infra,
        &infra.s3_endpoint,
        &n.s3_prefix,
        &["--clicks-topic", &topic, "--nginx-click-log", &click_log],
    )
    .await;
    let host = lastresort_host(&infra, &[hostport(&lr.base)], &n.s3_prefix, &click_log).await;
    let fe = frontend(&[hostport(&p.base)], &host.base).await;
    let metrics = p.url("/metrics");
    let timeouts = || {
        metric_sum(
            &metrics,
            r#"zlink_primary_dependency_timeouts_total{dependency="store"}"#,
        )
    };
    let rejected = || {
        metric_sum(
            &metrics,
            r#"zlink_primary_breaker_rejected_total{dependency="store"}"#,
        )
    };

    // Act: the store swallows every byte. Cold slugs straight at the primary: a 503 each
    // (never a 404: "store unreachable" is not "no such link"), and after three blown budgets
    // the circuit is open and the rest are refused without a request.
    toxi.inject("store", Fault::Blackhole).await;
    let started = Instant::now();
    for (slug, _) in &links[..20] {
        let r = client()
            .get(p.url(&format!("/{slug}")))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE, "{slug}");
        let body: Value = r.json().await.unwrap();
        assert!(body["error"]["code"].is_string(), "a JSON error: {body}");
    }
    // One probe per 2 s window may have gone out meanwhile (on a slow machine).
    let windows = (started.elapsed().as_millis() / 2000) as f64;
    let t = timeouts().await;
    assert!(
        (3.0..=3.0 + windows).contains(&t),
        "3 blown budgets open the circuit (plus one probe per window), got {t}"
    );
    assert!(rejected().await >= 17.0 - windows, "the rest failed fast");
    assert_eq!(
        metric_sum(
            &metrics,
            r#"zlink_primary_breaker_state{dependency="store"}"#
        )
        .await,
        1.0,
        "open"
    );
    // A create fails fast too: a 503 JSON, not a hang.
    let c = create(&p.base, &key, json!({"url": "https://example.com/x"})).await;
    assert_eq!(c.status(), StatusCode::SERVICE_UNAVAILABLE);

    // Through the frontend, every cold slug is answered right by the last-resort host.
    for (slug, url) in &links[20..] {
        let a = right_answer(&fe.base, slug, url, false).await;
        assert_eq!(a.tier, "lastresort", "{slug}");
    }

    // The store heals: within a window a probe closes the circuit and the primary answers.
    toxi.heal("store").await;
    let (slug, url) = links[0].clone();
    let direct = p.url(&format!("/{slug}"));
    assert!(
        eventually(Duration::from_secs(15), || {
            let direct = direct.clone();
            async move {
                let r = client().get(&direct).send().await.unwrap();
                r.status() == StatusCode::FOUND
            }
        })
        .await,
        "the primary serves again after the store heals"
    );
    let r = client().get(&direct).send().await.unwrap();
    assert_eq!(r.headers()["location"], url.as_str());
    assert_eq!(
        metric_sum(
            &metrics,
            r#"zlink_primary_breaker_state{dependency="store"}"#
        )
        .await,
        0.0,
        "closed"
    );
    replicator.stop().await;
}

/// Kafka frozen (SIGSTOP) while clicks flow, longer than the click producers' timeout and the
/// broker's own session timeout, then thawed: every tier's replayer ships its whole spool
/// without a restart (a drill once left a producer timing out every batch after the thaw), and
/// the consumers replaced while Kafka did not answer (a drill once left the replicator's
/// consumer idle after the thaw) count every click once and replicate a new link.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn click_spools_drain_after_kafka_is_frozen_and_thawed_under_traffic() {
    let infra = Infra::from_env();
    let ks = fresh_keyspace(&infra).await;
    let n = names(&ks);
    let kafka = OwnKafka::start(26600).await;
    let topic = format!("clicks-{ks}");
    let group = format!("counter-{ks}");
    create_topics(
        &kafka.brokers,
        &[(&n.links_topic, 3), (&n.dlq_topic, 1), (&topic, 6)],
    )
    .await;
    // Both consumers (the replicator's and the click counter's) are replaced after 5 s
    // without progress while Kafka does not answer: the freeze below is long enough for that
    // to happen, so the fresh consumers must take over after the thaw.
    let BothTiers {
        primary: p,
        replicator,
        lastresort: lr,
        key,
    } = both_tiers_with_a_link(
        &infra,
        &ks,
        &kafka.brokers,
        (&topic, &[], 5),
        "frozen-kafka",
        "https://example.com/frozen-kafka",
    )
    .await;
    let counter = ServiceProcess::counter(
        &infra,
        &kafka.brokers,
        &ks,
        &topic,
        &group,
        &["--consumer-stall-secs", "5"],
    )
    .ready()
    .await;

    // Clicks on both tiers all along: before, during and after the freeze (bounded: at most
    // 4,000 redirects per tier, one every 10 ms).
    let stop = tokio_util::sync::CancellationToken::new();
    let clickers: Vec<_> = [p.url("/frozen-kafka"), lr.url("/frozen-kafka")]
        .into_iter()
        .map(|url| {
            let stop = stop.clone();
            tokio::spawn(async move {
                let mut ids = HashSet::new();
                for _ in 0..4000 {
                    if stop.is_cancelled() {
                        break;
                    }
                    let r = client().get(&url).send().await.unwrap();
                    assert_eq!(r.status(), StatusCode::FOUND, "{url}");
                    let id = r.headers()["x-zlink-click-id"].to_str().unwrap();
                    ids.insert(id.parse::<uuid::Uuid>().unwrap());
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                ids
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_secs(2)).await;
    kafka.freeze(true).await;
    // Past the broker's session timeout (9 s): the thawed broker fences itself and comes back
    // leaderless for a moment, the case the producers must survive.
    tokio::time::sleep(Duration::from_secs(20)).await;
    kafka.freeze(false).await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    stop.cancel();
    let mut ids = HashSet::new();
    for c in clickers {
        ids.extend(c.await.unwrap());
    }

    let spooled = [
        (p.url("/metrics"), "zlink_primary_spool_pending_records"),
        (lr.url("/metrics"), "zlink_lastresort_spool_pending_records"),
    ];
    for (url, metric) in &spooled {
        assert!(
            eventually(Duration::from_secs(60), || async {
                metric_sum(url, metric).await == 0.0
            })
            .await,
            "{metric}: the spool drains after the thaw ({} pending)",
            metric_sum(url, metric).await
        );
    }
    let (seen, _) = clicks_in_kafka(&kafka.brokers, &topic, &ids).await;
    assert_eq!(
        ids.difference(&seen).count(),
        0,
        "every click reached Kafka"
    );

    // The consumers replaced during the freeze: the fresh ones count every click once and
    // replicate a link created after the thaw.
    let resets = metric_sum(
        &counter.url("/metrics"),
        "zlink_clicks_consumer_resets_total",
    )
    .await;
    assert!(
        resets >= 1.0,
        "the counter's consumer was replaced ({resets})"
    );
    assert!(
        replicator.metrics.consumer_resets.get() >= 1,
        "the replicator's consumer was replaced"
    );
    let stats_url = p.url("/api/v1/links/frozen-kafka/stats");
    let total = || {
        let (u, key) = (stats_url.clone(), key.clone());
        async move {
            let r = client().get(&u).bearer_auth(key).send().await.unwrap();
            r.json::<Value>().await.unwrap()["total"].as_u64()
        }
    };
    let want = ids.len() as u64;
    assert!(
        eventually(Duration::from_secs(60), || async {
            total().await == Some(want)
        })
        .await,
        "every click counted after the thaw: {:?} of {want}",
        total().await
    );
    let c = create(
        &p.base,
        &key,
        json!({"url": "https://example.com/after-thaw", "slug": "after-thaw"}),
    )
    .await;
    assert_eq!(c.status(), StatusCode::CREATED);
    assert!(
        eventually_ok(
            &infra.blob_url(&n.s3_prefix, "after-thaw"),
            Duration::from_secs(60)
        )
        .await,
        "a link created after the thaw reaches S3"
    );
    assert!(
        caught_up(&kafka.brokers, &group, &topic, Duration::from_secs(30)).await,
        "the counter's group committed everything"
    );
    assert_eq!(total().await, Some(want), "and counted once");
    assert!(counter.terminate().await.success());
    replicator.stop().await;
    assert!(lr.terminate().await.success());
}

/// A replicator whose consumer is fenced by another member with its static instance id (what a
/// stalled consumer coming back does to the one that replaced it) replaces it in-process, and
/// that replacement fences the intruder in turn: replication goes on, nothing exits.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_replicator_consumer_fenced_by_its_own_instance_id_is_replaced_and_replication_goes_on() {
    use rdkafka::consumer::{Consumer, StreamConsumer};
    let infra = Infra::from_env();
    let ks = fresh_keyspace(&infra).await;
    let n = names(&ks);
    let p = primary_publishing_links(&infra, &ks).await;
    let instance = format!("fenced-{ks}");
    // The stall watch out of the way: only the fatal error can replace the consumer here.
    let r = spawn_replicator_with(&infra, &ks, &infra.kafka, |k| {
        k.group_instance_id = instance.clone();
        k.consumer_stall_secs = 3600;
    })
    .await;
    let key = create_key(&p.state, "alice", false).await;
    let replicated = |slug: &'static str| {
        let (base, key, url) = (
            p.base.clone(),
            key.clone(),
            infra.blob_url(&n.s3_prefix, slug),
        );
        async move {
            let c = create(
                &base,
                &key,
                json!({"url": format!("https://example.com/{slug}"), "slug": slug}),
            )
            .await;
            assert_eq!(c.status(), StatusCode::CREATED);
            eventually_ok(&url, Duration::from_secs(60)).await
        }
    };
    assert!(replicated("before-fence").await, "replicating before");

    // An intruder joins the group under the replicator's instance id: the broker fences the
    // replicator's consumer (a fatal error for it).
    let intruder = zlink_clients::kafka::ClosingConsumer::new(
        zlink_clients::kafka::manual_store_consumer(&infra.kafka, &n.group, &instance, 500)
            .create::<StreamConsumer>()
            .unwrap(),
    );
    intruder.subscribe(&[&n.links_topic]).unwrap();
    let resets = r.metrics.consumer_resets.clone();
    let deadline = Instant::now() + Duration::from_secs(60);
    while resets.get() == 0 && Instant::now() < deadline {
        let _ = tokio::time::timeout(Duration::from_millis(200), intruder.recv()).await;
    }
    assert!(resets.get() >= 1, "the fenced consumer was replaced");
    // The replacement took the instance id back: the intruder is the fenced one now.
    assert!(
        replicated("after-fence").await,
        "the replacement replicates a link created after the fence"
    );
    drop(intruder);
    r.stop().await;
    p.stop().await;
}
