//! Kafka frozen and thawed under traffic, and a consumer fenced by its own instance id: the
//! clients heal without a restart and count and replicate everything once.

use super::*;

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
    if !eventually_ok(
        &infra.blob_url(&n.s3_prefix, "after-thaw"),
        Duration::from_secs(60),
    )
    .await
    {
        // Where the event stopped: published by primary's relay, consumed by the replicator?
        let pick = |text: &str, words: &[&str]| {
            text.lines()
                .filter(|l| !l.starts_with('#') && words.iter().any(|w| l.contains(w)))
                .collect::<Vec<_>>()
                .join("\n")
        };
        let rep = String::from_utf8_lossy(&replicator.metrics.render()).to_string();
        let prim = client()
            .get(p.url("/metrics"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        panic!(
            "a link created after the thaw reaches S3\nreplicator:\n{}\nprimary:\n{}",
            pick(&rep, &["events_total", "consumer", "kafka"]),
            pick(&prim, &["links", "outbox", "publish", "producer"])
        );
    }
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
    use rdkafka::consumer::Consumer;
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
            .create_with_context(zlink_clients::kafka::Quiet::default())
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
