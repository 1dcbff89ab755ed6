//! Every mapping reaches S3 (SYSTEM.md invariant 5), against the real Kafka, S3 and Cassandra:
//! link events through the outbox and Kafka, the replicator, reconcile, crashes and outages.

use reqwest::StatusCode;
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::Duration;
use zlink_clients::clock::{Clock, ManualClock};
use zlink_e2e::*;
use zlink_wire::blob::{self, Blob};

mod audit;
mod outages;
mod reconcile;

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

    // A new destination and an expiry: version 4, re-rendered in S3.
    let r_new = client()
        .patch(format!("{}/api/v1/links/{slug}", p.base))
        .bearer_auth(&key)
        .json(&json!({"url": "https://example.org/moved", "expires_at": "2099-01-01T00:00:00Z"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r_new.status(), StatusCode::OK);
    assert!(
        eventually(Duration::from_secs(5), || {
            let url = url.clone();
            async move {
                let Ok(r) = client().get(&url).send().await else {
                    return false;
                };
                let text = r.text().await.unwrap_or_default();
                blob::parse(text.as_bytes()).is_ok_and(|b| {
                    b.version == 4
                        && b.url == "https://example.org/moved"
                        && b.expires_at_ms == Some(4_070_908_800_000)
                })
            }
        })
        .await,
        "the new destination and expiry reach S3"
    );

    // Deleted: the page goes for good, a DELETED tombstone stays.
    let r_del = delete_link(&p.base, &key, &slug).await;
    assert_eq!(r_del.status(), StatusCode::OK);
    assert!(
        wait_blob(&url, StatusCode::NOT_FOUND, Duration::from_secs(5)).await,
        "deleted link's blob deleted"
    );
    assert_eq!(
        r.s3.get_tombstone(&slug)
            .await
            .unwrap()
            .map(|t| (t.reason, t.version)),
        Some((blob::GoneReason::Deleted, 5))
    );

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
