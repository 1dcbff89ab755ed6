//! A blackholed store behind a real fault proxy: a few budgets, then the circuits open (the
//! redirect reads' and the other statements', each on its own evidence) and redirects fail over
//! at once.

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
    // The redirect's reads have a breaker of their own (`store_read`); creates and every other
    // statement go through `store`.
    let metric = |name: &'static str, dependency: &'static str| {
        let metrics = metrics.clone();
        async move {
            let series = format!(r#"zlink_primary_{name}{{dependency="{dependency}"}}"#);
            metric_sum(&metrics, &series).await
        }
    };
    let timeouts = |dependency| metric("dependency_timeouts_total", dependency);
    let rejected = |dependency| metric("breaker_rejected_total", dependency);
    let state = |dependency| metric("breaker_state", dependency);

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
    let t = timeouts("store_read").await;
    assert!(
        (3.0..=3.0 + windows).contains(&t),
        "3 blown budgets open the reads' circuit (plus one probe per window), got {t}"
    );
    assert!(
        rejected("store_read").await >= 17.0 - windows,
        "the rest failed fast"
    );
    assert_eq!(state("store_read").await, 1.0, "open");
    // Creates answer a JSON 503, never a hang: each fails within the statements' own 2 s
    // budget until that circuit has its three failures too (the primary's outbox relay may add
    // some), then they are refused without a request.
    let mut refused_fast = false;
    for i in 0..6 {
        let before = rejected("store").await;
        let c = create(
            &p.base,
            &key,
            json!({"url": format!("https://example.com/x/{i}")}),
        )
        .await;
        assert_eq!(c.status(), StatusCode::SERVICE_UNAVAILABLE);
        let body: Value = c.json().await.unwrap();
        assert_eq!(body["error"]["code"], "unavailable", "{body}");
        if rejected("store").await > before {
            refused_fast = true;
            break;
        }
    }
    // (Its failures are the driver's own 2 s request timeouts, which end the statement just
    // before the breaker's equal budget would: errors, not `dependency_timeouts_total`.)
    assert!(
        refused_fast,
        "the statements' circuit opened on its own failures"
    );

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
    assert_eq!(state("store_read").await, 0.0, "closed");
    // The statements' circuit closes on its next probe: a create goes through again.
    assert!(
        eventually(Duration::from_secs(15), || {
            let (base, key) = (p.base.clone(), key.clone());
            async move {
                let c = create(&base, &key, json!({"url": "https://example.com/healed"})).await;
                c.status() == StatusCode::CREATED
            }
        })
        .await,
        "creates succeed again after the store heals"
    );
    assert_eq!(state("store").await, 0.0, "closed");
    replicator.stop().await;
}
