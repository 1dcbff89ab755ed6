use super::*;

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
        assert_eq!(ev.key, "click-me");
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
