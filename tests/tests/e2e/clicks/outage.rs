//! A Kafka outage while primary and lastresort both take clicks: every click counted once by
//! tier, place and device; the stats API and the info page.

use super::*;

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
