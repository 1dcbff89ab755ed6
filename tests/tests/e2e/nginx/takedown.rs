use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_admin_takedown_reaches_every_rung_within_5_s_and_rung_3_answers_410() {
    let infra = Infra::from_env();
    let (ks, n, topic) = pipeline_keyspace(&infra).await;
    let flags = kafka_flags(&infra, &n, &topic);
    let p = spawn_primary(&infra, &ks, &flags, None).await;
    let replicator = spawn_replicator(&infra, &ks, &infra.kafka).await;
    let owner = create_key(&p.state, "alice", false).await;
    let admin = create_key(&p.state, "ops", true).await;
    let url = "https://example.com/phish?x=1";
    let c = create(&p.base, &owner, json!({"url": url, "slug": "gone-1"})).await;
    assert_eq!(c.status(), StatusCode::CREATED);
    assert!(
        eventually_ok(
            &infra.blob_url(&n.s3_prefix, "gone-1"),
            Duration::from_secs(10)
        )
        .await
    );

    let spool = TempDir::new("takedown-spool");
    let click_dir = TempDir::new("takedown-clicklog");
    let click_log = click_dir.path().join("clicks.json").display().to_string();
    let spool_dir = spool.path().display().to_string();
    let lr = ServiceProcess::lastresort(
        &infra,
        &infra.s3_endpoint,
        &n.s3_prefix,
        &[
            "--clicks-topic",
            &topic,
            "--spool-dir",
            &spool_dir,
            "--nginx-click-log",
            &click_log,
        ],
    )
    .await;
    let rung2 = OwnNginx::start(
        "lastresort.conf",
        &lastresort_host_values(
            upstream_servers(&[hostport(&lr.base)], "max_fails=1 fail_timeout=5s"),
            &infra,
            &n.s3_prefix,
            &click_log,
        ),
    )
    .await;
    let rung3 = OwnNginx::start(
        "lastresort.conf",
        &lastresort_host_values(dead_server(), &infra, &n.s3_prefix, &click_log),
    )
    .await;
    let mut fe_values = common();
    fe_values.extend([
        (
            "PRIMARY_SERVERS",
            upstream_servers(&[hostport(&p.base)], "max_fails=1 fail_timeout=5s"),
        ),
        (
            "LASTRESORT_HOST_SERVERS",
            upstream_servers(&[rung2.tls_hostport()], "max_fails=1 fail_timeout=5s"),
        ),
    ]);
    let fe = OwnNginx::start("frontend.conf", &fe_values).await;

    // Every rung serves the link (and has it cached).
    let rungs = [
        ("rung 1 (frontend → primary)", fe.url("/gone-1"), "primary"),
        ("rung 2 (lastresort)", lr.url("/gone-1"), "lastresort"),
        (
            "rung 2 (host nginx → lastresort)",
            rung2.url("/gone-1"),
            "lastresort",
        ),
        (
            "rung 3 (host nginx → S3)",
            rung3.url("/gone-1"),
            "lastresort-nginx",
        ),
    ];
    for (name, u, tier) in &rungs {
        let r = get(u, "Mozilla/5.0").await;
        assert!(
            [StatusCode::FOUND, StatusCode::OK].contains(&r.status()),
            "{name}: {}",
            r.status()
        );
        assert_eq!(r.headers()["x-zlink-tier"], *tier, "{name}");
    }

    // The takedown, through the public API.
    let r = client()
        .patch(fe.url("/api/v1/links/gone-1"))
        .bearer_auth(&admin)
        .json(&json!({"status": "DISABLED"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let t0 = std::time::Instant::now();
    let r = get(&fe.url("/gone-1"), "Mozilla/5.0").await;
    assert_eq!(r.status(), StatusCode::GONE, "rung 1 at once");
    let r = client()
        .patch(fe.url("/api/v1/links/gone-1"))
        .bearer_auth(&owner)
        .json(&json!({"status": "ACTIVE"}))
        .send()
        .await
        .unwrap();
    assert_eq!(
        r.status(),
        StatusCode::FORBIDDEN,
        "the owner cannot undo it"
    );
    let all_gone = eventually(Duration::from_secs(5), || {
        let urls: Vec<String> = rungs.iter().map(|(_, u, _)| u.clone()).collect();
        async move {
            for u in urls {
                if get(&u, "Mozilla/5.0").await.status() != StatusCode::GONE {
                    return false;
                }
            }
            true
        }
    })
    .await;
    let took = t0.elapsed();
    println!("takedown on every rung after {took:?}");
    assert!(all_gone, "every rung answers 410 within 5 s of the PATCH");

    // Rung 3's 410 is zlink's own page; an unknown slug there is still its 404 page.
    let r = get(&rung3.url("/gone-1"), "Mozilla/5.0").await;
    assert_eq!(r.status(), StatusCode::GONE);
    assert_eq!(r.headers()["x-zlink-tier"], "lastresort-nginx");
    assert!(r.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/html"));
    assert!(r.text().await.unwrap().contains("Link disabled"));
    let r = get(&rung3.url("/never-was"), "Mozilla/5.0").await;
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
    assert!(r.text().await.unwrap().contains("Link not found"));
    // No click for a 410 on rung 3.
    let clicks = std::fs::read_to_string(&click_log).unwrap_or_default();
    assert_eq!(clicks.lines().count(), 1, "only the 200 page was a click");
    replicator.stop().await;
}
