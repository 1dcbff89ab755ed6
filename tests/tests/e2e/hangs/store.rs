//! A blackholed store behind a real fault proxy: a few budgets, then the circuit opens and
//! redirects fail over at once.

use super::*;

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
    let fe = frontend(&[hostport(&p.base)], &host).await;
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
