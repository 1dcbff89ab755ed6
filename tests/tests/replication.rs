//! Every mapping reaches S3 (SYSTEM.md invariant 5), against the real Kafka, S3 and Cassandra:
//! link events through the outbox and Kafka, the replicator, reconcile, crashes and outages.

use reqwest::StatusCode;
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::Duration;
use zlink_clients::clock::{Clock, ManualClock};
use zlink_e2e::*;
use zlink_wire::blob::{self, Blob};

/// Unsigned GET of the blob, as nginx would do it.
async fn blob_status(url: &str) -> StatusCode {
    client()
        .get(url)
        .send()
        .await
        .map(|r| r.status())
        .unwrap_or(StatusCode::SERVICE_UNAVAILABLE)
}

async fn wait_blob(url: &str, want: StatusCode, within: Duration) -> bool {
    let url = url.to_string();
    eventually(within, || {
        let u = url.clone();
        async move { blob_status(&u).await == want }
    })
    .await
}

struct Setup {
    infra: Infra,
    ks: String,
    n: Names,
}

async fn setup() -> Setup {
    let infra = Infra::from_env();
    let ks = fresh_keyspace(&infra).await;
    let n = names(&ks);
    create_topics(&infra.kafka, &[(&n.links_topic, 3), (&n.dlq_topic, 1)]).await;
    Setup { infra, ks, n }
}

fn kafka_flags<'a>(brokers: &'a str, n: &'a Names) -> Vec<&'a str> {
    vec!["--kafka", brokers, "--links-topic", &n.links_topic]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn created_link_is_in_s3_as_the_specified_blob_disable_removes_it_enable_restores_it() {
    let Setup { infra, ks, n } = setup().await;
    let p = spawn_primary(&infra, &ks, &kafka_flags(&infra.kafka, &n), None).await;
    let r = spawn_replicator(&infra, &ks, &infra.kafka).await;
    let key = create_key(&p.state, "alice", false).await;

    let created = create(
        &p.base,
        &key,
        json!({"url": "https://example.com/a?b=1&c=\"2\"", "redirect_code": 301}),
    )
    .await;
    assert_eq!(created.status(), StatusCode::CREATED);
    let body: Value = created.json().await.unwrap();
    let slug = body["slug"].as_str().unwrap().to_string();
    let url = infra.blob_url(&n.s3_prefix, &slug);

    assert!(
        wait_blob(&url, StatusCode::OK, Duration::from_secs(5)).await,
        "blob visible within 5 s"
    );
    let resp = client().get(&url).send().await.unwrap();
    assert_eq!(resp.headers()["content-type"], blob::CONTENT_TYPE);
    assert_eq!(resp.headers()["cache-control"], "public, max-age=300");
    assert_eq!(resp.headers()["x-amz-meta-zlink-code"], "301");
    assert_eq!(resp.headers()["x-amz-meta-zlink-version"], "1");
    let stored_url = body["url"].as_str().unwrap().to_string();
    assert_eq!(resp.headers()["x-amz-meta-zlink-url"], stored_url.as_str());
    let text = resp.text().await.unwrap();
    let want = Blob {
        url: stored_url.clone(),
        code: 301,
        version: 1,
        expires_at_ms: None,
    };
    assert_eq!(text, blob::render(&want));
    assert_eq!(blob::parse(text.as_bytes()), Ok(want));

    // Unsigned writes and listings are refused: anonymous may only read objects.
    let put = client()
        .put(&url)
        .body("<html>defaced</html>")
        .send()
        .await
        .unwrap();
    assert!(
        put.status() == StatusCode::FORBIDDEN || put.status() == StatusCode::UNAUTHORIZED,
        "{}",
        put.status()
    );
    let list = client()
        .get(format!(
            "{}/{}?list-type=2",
            infra.s3_endpoint, infra.s3_bucket
        ))
        .send()
        .await
        .unwrap();
    assert!(!list.status().is_success(), "anonymous listing allowed");

    set_status(&p.base, &key, &slug, "DISABLED").await;
    assert!(
        wait_blob(&url, StatusCode::NOT_FOUND, Duration::from_secs(5)).await,
        "disabled link's blob deleted"
    );
    let gone = r.s3.get_tombstone(&slug).await.unwrap();
    assert_eq!(
        gone.map(|t| (t.reason, t.version)),
        Some((blob::GoneReason::Disabled, 2)),
        "the tombstone is written before the blob is deleted"
    );
    set_status(&p.base, &key, &slug, "ACTIVE").await;
    assert!(
        wait_blob(&url, StatusCode::OK, Duration::from_secs(5)).await,
        "re-enabled link's blob back"
    );
    assert!(
        eventually(Duration::from_secs(5), || {
            let (s3, slug) = (r.s3.clone(), slug.clone());
            async move { s3.get_tombstone(&slug).await.unwrap().is_none() }
        })
        .await,
        "re-enabled link's tombstone removed"
    );
    let text = client()
        .get(&url)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(blob::parse(text.as_bytes()).unwrap().version, 3);

    assert!(r.metrics.create_to_s3_seconds.get_sample_count() >= 1);
    r.stop().await;
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn expired_link_is_moved_to_expired_and_its_blob_deleted() {
    let Setup { infra, ks, n } = setup().await;
    let clock = Arc::new(ManualClock::new(chrono::Utc::now().timestamp_millis()));
    let p = spawn_primary(
        &infra,
        &ks,
        &kafka_flags(&infra.kafka, &n),
        Some(clock.clone()),
    )
    .await;
    let r = spawn_replicator(&infra, &ks, &infra.kafka).await;
    let key = create_key(&p.state, "alice", false).await;
    let expires = chrono::DateTime::from_timestamp_millis(clock.now_ms() + 60_000)
        .unwrap()
        .to_rfc3339();
    let created = create(
        &p.base,
        &key,
        json!({"url": "https://example.com/soon", "slug": "soon-gone", "expires_at": expires}),
    )
    .await;
    assert_eq!(created.status(), StatusCode::CREATED);
    let url = infra.blob_url(&n.s3_prefix, "soon-gone");
    assert!(wait_blob(&url, StatusCode::OK, Duration::from_secs(5)).await);
    let text = client()
        .get(&url)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(blob::parse(text.as_bytes())
        .unwrap()
        .expires_at_ms
        .is_some());

    clock.advance_ms(61_000);
    let store = p.state.store.clone();
    assert!(
        eventually(Duration::from_secs(10), || {
            let s = store.clone();
            async move {
                s.links.get("soon-gone").await.unwrap().unwrap().status
                    == zlink_wire::LinkStatus::Expired
            }
        })
        .await,
        "the scheduler moved the link to EXPIRED"
    );
    assert!(
        wait_blob(&url, StatusCode::NOT_FOUND, Duration::from_secs(5)).await,
        "expired link's blob deleted"
    );
    r.stop().await;
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn unapplicable_event_goes_to_the_dead_letter_topic_and_the_pipeline_keeps_moving() {
    use rdkafka::consumer::{Consumer, StreamConsumer};
    use rdkafka::producer::{FutureProducer, FutureRecord};
    use rdkafka::Message;
    let Setup { infra, ks, n } = setup().await;
    let r = spawn_replicator(&infra, &ks, &infra.kafka).await;
    let producer: FutureProducer = rdkafka::config::ClientConfig::new()
        .set("bootstrap.servers", &infra.kafka)
        .create()
        .unwrap();
    producer
        .send(
            FutureRecord::to(&n.links_topic)
                .key("evil")
                .payload("{\"not\": \"an event\"}"),
            Duration::from_secs(5),
        )
        .await
        .unwrap();
    let p = spawn_primary(&infra, &ks, &kafka_flags(&infra.kafka, &n), None).await;
    let key = create_key(&p.state, "alice", false).await;
    let created = create(
        &p.base,
        &key,
        json!({"url": "https://example.com/after", "slug": "after-dlq"}),
    )
    .await;
    assert_eq!(created.status(), StatusCode::CREATED);
    // Same key as the bad message is not required: partitions keep moving independently, and
    // the bad message's own partition moves on too.
    assert!(
        wait_blob(
            &infra.blob_url(&n.s3_prefix, "after-dlq"),
            StatusCode::OK,
            Duration::from_secs(10)
        )
        .await
    );

    let consumer: StreamConsumer = rdkafka::config::ClientConfig::new()
        .set("bootstrap.servers", &infra.kafka)
        .set("group.id", format!("dlq-reader-{ks}"))
        .set("auto.offset.reset", "earliest")
        .create()
        .unwrap();
    consumer.subscribe(&[&n.dlq_topic]).unwrap();
    let msg = tokio::time::timeout(Duration::from_secs(20), consumer.recv())
        .await
        .expect("a DLQ message")
        .unwrap();
    assert_eq!(msg.payload(), Some(&b"{\"not\": \"an event\"}"[..]));
    let reason = msg.headers().and_then(|h| {
        use rdkafka::message::Headers;
        h.iter()
            .find(|h| h.key == "zlink-error")
            .and_then(|h| h.value.map(|v| String::from_utf8_lossy(v).into_owned()))
    });
    assert!(reason.unwrap_or_default().contains("not a link event"));
    assert_eq!(r.metrics.events.with_label_values(&["dlq"]).get(), 1);
    r.stop().await;
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn reconcile_reports_and_repairs_missing_tampered_and_orphaned_objects() {
    use replicator::reconcile::{reconcile, ReconcileArgs, ReconcileStore};
    let Setup { infra, ks, n } = setup().await;
    let p = spawn_primary(&infra, &ks, &kafka_flags(&infra.kafka, &n), None).await;
    let r = spawn_replicator(&infra, &ks, &infra.kafka).await;
    let key = create_key(&p.state, "alice", false).await;
    for slug in ["rec-ok", "rec-deleted", "rec-tampered", "rec-disabled"] {
        let c = create(
            &p.base,
            &key,
            json!({"url": format!("https://example.com/{slug}"), "slug": slug}),
        )
        .await;
        assert_eq!(c.status(), StatusCode::CREATED);
    }
    for slug in ["rec-ok", "rec-deleted", "rec-tampered", "rec-disabled"] {
        assert!(
            wait_blob(
                &infra.blob_url(&n.s3_prefix, slug),
                StatusCode::OK,
                Duration::from_secs(5)
            )
            .await
        );
    }
    let s3 = r.s3.clone();
    r.stop().await; // nothing repairs behind reconcile's back from here on
    let store = Arc::new(
        ReconcileStore::prepare(p.state.store.db.clone())
            .await
            .unwrap(),
    );
    let args = |dry_run| ReconcileArgs {
        dry_run,
        splits: 8,
        concurrency: 4,
    };
    let run = |dry_run| {
        let (store, s3) = (store.clone(), s3.clone());
        async move {
            let mut lines = Vec::new();
            let report = reconcile(
                store,
                s3,
                &args(dry_run),
                chrono::Utc::now().timestamp_millis(),
                |l| lines.push(l.to_string()),
            )
            .await
            .unwrap();
            (report, lines)
        }
    };
    let (healthy, _) = run(true).await;
    assert_eq!((healthy.links, healthy.drift()), (4, 0), "{healthy:?}");

    // Break S3 in each way: delete, tamper (admin PUT of another body), orphan (a disabled
    // link's object put back, and an object with no link at all).
    s3.delete("rec-deleted").await.unwrap();
    let evil = Blob {
        url: "https://evil.example/".into(),
        code: 302,
        version: 1,
        expires_at_ms: None,
    };
    s3.put("rec-tampered", &evil).await.unwrap();
    let gone = Blob {
        url: "https://example.com/rec-disabled".into(),
        code: 302,
        version: 1,
        expires_at_ms: None,
    };
    p.state
        .store
        .links
        .transition(
            "rec-disabled",
            zlink_wire::LinkStatus::Active,
            1,
            zlink_wire::LinkStatus::Disabled,
            None,
        )
        .await
        .unwrap();
    s3.put("rec-disabled", &gone).await.unwrap();
    s3.put("no-such-link", &gone).await.unwrap();
    // A tombstone of a live link would make lastresort answer 410 for it.
    let tomb = blob::Tombstone {
        reason: blob::GoneReason::Disabled,
        version: 1,
    };
    s3.put_tombstone("rec-ok", &tomb).await.unwrap();

    let (dry, lines) = run(true).await;
    assert_eq!(
        (dry.missing, dry.stale, dry.orphans, dry.repaired),
        (1, 1, 3, 0),
        "{dry:?} {lines:?}"
    );
    assert!(
        lines.iter().any(|l| l.starts_with("missing\trec-deleted")),
        "{lines:?}"
    );
    assert!(
        lines.iter().any(|l| l.starts_with("stale\trec-tampered")),
        "{lines:?}"
    );
    // An object with no link at all is reported by its full key.
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with(&format!("orphan\t{}no-such-link\t", n.s3_prefix))),
        "{lines:?}"
    );

    assert!(
        lines
            .iter()
            .any(|l| l.starts_with(&format!("orphan\t{}.gone/rec-ok\t", n.s3_prefix))),
        "{lines:?}"
    );

    let (fixed, _) = run(false).await;
    assert_eq!(fixed.repaired, 5, "{fixed:?}");
    assert!(s3.get_tombstone("rec-ok").await.unwrap().is_none());
    assert_eq!(
        s3.get_tombstone("rec-disabled").await.unwrap(),
        Some(blob::Tombstone {
            reason: blob::GoneReason::Disabled,
            version: 2
        })
    );
    let (after, lines) = run(true).await;
    assert_eq!(after.drift(), 0, "{after:?} {lines:?}");
    let text = client()
        .get(infra.blob_url(&n.s3_prefix, "rec-tampered"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(
        blob::parse(text.as_bytes()).unwrap().url,
        "https://example.com/rec-tampered"
    );
    assert_eq!(
        blob_status(&infra.blob_url(&n.s3_prefix, "rec-disabled")).await,
        StatusCode::NOT_FOUND
    );
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn replicator_sigkilled_mid_stream_loses_no_object() {
    let Setup { infra, ks, n } = setup().await;
    let p = spawn_primary(&infra, &ks, &kafka_flags(&infra.kafka, &n), None).await;
    let key = create_key(&p.state, "alice", false).await;
    // As deployed: a stable instance id (static group membership), so the restarted process
    // takes its partitions back at once instead of waiting out the killed one's 30 s session.
    let instance = format!("replicator-{ks}");
    let spawn = || {
        let mut cmd = tokio::process::Command::new(bin("replicator"));
        cmd.arg("run")
            .arg("--listen")
            .arg("127.0.0.1:0")
            .envs(infra.env_for_services(&ks, &infra.kafka))
            .env("ZLINK_GROUP_INSTANCE_ID", &instance);
        cmd.env("RUST_LOG", "warn")
            .kill_on_drop(true)
            .spawn()
            .expect("replicator binary")
    };
    let mut child = spawn();

    let mut tasks = Vec::new();
    for i in 0..150 {
        let (base, key) = (p.base.clone(), key.clone());
        tasks.push(tokio::spawn(async move {
            let r = create(
                &base,
                &key,
                json!({"url": format!("https://example.com/k/{i}")}),
            )
            .await;
            assert_eq!(r.status(), StatusCode::CREATED);
            r.json::<Value>().await.unwrap()["slug"]
                .as_str()
                .unwrap()
                .to_string()
        }));
    }
    let mut slugs = Vec::new();
    for t in tasks {
        slugs.push(t.await.unwrap());
    }
    // Mid-stream: once some objects are written and others are still to come, SIGKILL.
    let first = infra.blob_url(&n.s3_prefix, &slugs[0]);
    assert!(
        wait_blob(&first, StatusCode::OK, Duration::from_secs(20)).await,
        "replication started"
    );
    child.kill().await.expect("SIGKILL");
    let mut child = spawn();
    for slug in &slugs {
        assert!(
            wait_blob(
                &infra.blob_url(&n.s3_prefix, slug),
                StatusCode::OK,
                Duration::from_secs(30)
            )
            .await,
            "{slug} missing after the replicator restarted"
        );
    }
    // The group commits the next offset to read: exactly the end of each partition. (It once
    // committed one past it, which skips an event after every restart.)
    assert!(
        caught_up(
            &infra.kafka,
            &n.group,
            &n.links_topic,
            Duration::from_secs(30)
        )
        .await,
        "committed offsets end at the high watermark"
    );
    child.kill().await.ok();
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn creates_succeed_while_kafka_is_down_and_every_object_arrives_after_it_returns() {
    let infra = Infra::from_env();
    let ks = fresh_keyspace(&infra).await;
    let n = names(&ks);
    // A broker of this test's own, so stopping it disturbs no other test.
    let kafka = OwnKafka::start(26000).await;
    create_topics(&kafka.brokers, &[(&n.links_topic, 3), (&n.dlq_topic, 1)]).await;
    let p = spawn_primary(
        &infra,
        &ks,
        &[
            "--kafka",
            &kafka.brokers,
            "--links-topic",
            &n.links_topic,
            "--kafka-message-timeout-ms",
            "3000",
        ],
        None,
    )
    .await;
    let r = spawn_replicator(&infra, &ks, &kafka.brokers).await;
    let key = create_key(&p.state, "alice", false).await;

    kafka.stop().await;
    let mut slugs = Vec::new();
    for i in 0..100 {
        let c = create(
            &p.base,
            &key,
            json!({"url": format!("https://example.com/outage/{i}")}),
        )
        .await;
        assert_eq!(
            c.status(),
            StatusCode::CREATED,
            "create {i} during the outage"
        );
        slugs.push(
            c.json::<Value>().await.unwrap()["slug"]
                .as_str()
                .unwrap()
                .to_string(),
        );
    }
    assert_eq!(
        blob_status(&infra.blob_url(&n.s3_prefix, &slugs[0])).await,
        StatusCode::NOT_FOUND
    );

    kafka.up().await;
    for slug in &slugs {
        assert!(
            wait_blob(
                &infra.blob_url(&n.s3_prefix, slug),
                StatusCode::OK,
                Duration::from_secs(60)
            )
            .await,
            "{slug} never reached S3 after Kafka returned"
        );
    }
    r.stop().await;
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn primary_redirects_reach_the_clicks_topic_through_the_spool() {
    let Setup { infra, ks, n } = setup().await;
    let topic = format!("clicks-{ks}");
    create_topics(&infra.kafka, &[(&topic, 3)]).await;
    let mut flags = kafka_flags(&infra.kafka, &n);
    flags.extend([
        "--clicks-topic",
        &topic,
        "--ip-hash-salt",
        "test-salt-16-bytes-min",
    ]);
    let p = spawn_primary(&infra, &ks, &flags, None).await;
    let key = create_key(&p.state, "alice", false).await;
    let c = create(
        &p.base,
        &key,
        json!({"url": "https://example.com/c", "slug": "click-me"}),
    )
    .await;
    assert_eq!(c.status(), StatusCode::CREATED);
    let mut ids = std::collections::HashSet::new();
    for i in 0..50 {
        let r = client()
            .get(p.url("/click-me"))
            .header(
                "user-agent",
                if i % 5 == 0 {
                    "Twitterbot/1.0".to_string()
                } else {
                    format!("Mozilla/5.0 zlink-test/{i}")
                },
            )
            .header("x-forwarded-for", "198.51.100.7")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::FOUND);
        ids.insert(
            r.headers()["x-zlink-click-id"]
                .to_str()
                .unwrap()
                .parse()
                .unwrap(),
        );
    }
    assert_eq!(ids.len(), 50);
    let (seen, events) = clicks_in_kafka(&infra.kafka, &topic, &ids).await;
    assert_eq!(seen, ids);
    let want_hash =
        zlink_clients::clicks::ip_hash("test-salt-16-bytes-min", "198.51.100.7".parse().unwrap());
    let previews = events
        .iter()
        .filter(|e| e.agent == zlink_wire::events::AgentClass::Preview)
        .map(|e| e.id)
        .collect::<std::collections::HashSet<_>>();
    assert_eq!(previews.len(), 10, "link-preview fetches are told apart");
    for ev in events {
        assert_eq!(ev.tier, zlink_wire::events::Tier::Primary);
        assert_eq!(ev.slug, "click-me");
        assert_eq!(
            ev.ip_hash, want_hash,
            "client IP from the loopback proxy's X-Forwarded-For"
        );
    }
    // A 404 is not a click.
    assert_eq!(p.state.metrics.clicks.spooled.get(), 50);
    assert_eq!(
        get_status(&p.url("/no-such-link")).await,
        StatusCode::NOT_FOUND
    );
    assert_eq!(p.state.metrics.clicks.spooled.get(), 50);
    p.stop().await;
}

async fn get_status(url: &str) -> StatusCode {
    client().get(url).send().await.unwrap().status()
}
