use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redirects_still_answer_when_memcached_stalls_or_dies() {
    let infra = Infra::from_env();
    let ks = fresh_keyspace(&infra).await;
    let mut mc = OwnMemcached::start().await;
    // A 1 ms local TTL forces every lookup through memcached.
    let p = spawn_primary(
        &infra,
        &ks,
        &["--memcached", &mc.addr, "--local-cache-ttl-ms", "1"],
        None,
    )
    .await;
    let key = create_key(&p.state, "alice", false).await;
    for slug in ["warm-one", "cold-one", "cold-two"] {
        let r = create(
            &p.base,
            &key,
            json!({"url": format!("https://example.com/{slug}"), "slug": slug}),
        )
        .await;
        assert_eq!(r.status(), StatusCode::CREATED);
    }
    let metrics = p.state.metrics.clone();
    // Fill memcached and see it answer.
    assert_eq!(get(&p.url("/warm-one")).await.status(), StatusCode::FOUND);
    let warm = p.url("/warm-one");
    assert!(
        eventually(Duration::from_secs(5), || {
            let (u, m) = (warm.clone(), metrics.clone());
            async move {
                get(&u).await.status() == StatusCode::FOUND
                    && m.cache.lookups.with_label_values(&["memcached"]).get() > 0
            }
        })
        .await,
        "memcached never answered"
    );

    // Stalled (SIGSTOP): bounded timeouts, then the store answers.
    mc.signal("STOP");
    for slug in ["warm-one", "cold-one"] {
        let r = get(&p.url(&format!("/{slug}"))).await;
        assert_eq!(
            r.status(),
            StatusCode::FOUND,
            "{slug} with memcached stalled"
        );
        assert_eq!(location(&r), Some(format!("https://example.com/{slug}")));
    }
    assert!(
        metrics
            .cache
            .memcached_errors
            .with_label_values(&["timeout"])
            .get()
            > 0
    );

    // Dead (SIGKILL).
    mc.signal("CONT");
    mc.kill();
    for slug in ["warm-one", "cold-one", "cold-two"] {
        for _ in 0..3 {
            let r = get(&p.url(&format!("/{slug}"))).await;
            assert_eq!(r.status(), StatusCode::FOUND, "{slug} with memcached dead");
        }
    }
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_misses_for_a_cold_slug_cause_one_store_read() {
    let infra = Infra::from_env();
    let ks = fresh_keyspace(&infra).await;
    let writer = spawn_primary(&infra, &ks, &[], None).await;
    let key = create_key(&writer.state, "alice", false).await;
    let r = create(
        &writer.base,
        &key,
        json!({"url": "https://example.com/hot", "slug": "hot-slug"}),
    )
    .await;
    assert_eq!(r.status(), StatusCode::CREATED);

    // A fresh instance without memcached: its only source is the store.
    let reader = spawn_primary(&infra, &ks, &[], None).await;
    let before = reader.state.metrics.store_reads.get();
    let mut tasks = Vec::new();
    for _ in 0..50 {
        let u = reader.url("/hot-slug");
        tasks.push(tokio::spawn(async move { get(&u).await.status() }));
    }
    for t in tasks {
        assert_eq!(t.await.unwrap(), StatusCode::FOUND);
    }
    assert_eq!(reader.state.metrics.store_reads.get() - before, 1);
    writer.stop().await;
    reader.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_new_links_first_redirect_on_another_instance_is_a_memcached_hit() {
    let infra = Infra::from_env();
    let ks = fresh_keyspace(&infra).await;
    let mc = OwnMemcached::start().await;
    let writer = spawn_primary(&infra, &ks, &["--memcached", &mc.addr], None).await;
    let key = create_key(&writer.state, "alice", false).await;
    let r = create(
        &writer.base,
        &key,
        json!({"url": "https://example.com/shared-at-once", "slug": "shared-at-once"}),
    )
    .await;
    assert_eq!(r.status(), StatusCode::CREATED);

    // Another instance sharing the memcached: the create filled it, so the store is not read.
    let reader = spawn_primary(&infra, &ks, &["--memcached", &mc.addr], None).await;
    let m = reader.state.metrics.clone();
    let r = get(&reader.url("/shared-at-once")).await;
    assert_eq!(r.status(), StatusCode::FOUND);
    assert_eq!(
        location(&r),
        Some("https://example.com/shared-at-once".to_string())
    );
    assert_eq!(m.cache.lookups.with_label_values(&["memcached"]).get(), 1);
    assert_eq!(m.store_reads.get(), 0, "the store was read for a new link");
    writer.stop().await;
    reader.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn health_readiness_and_metrics_are_served() {
    let infra = Infra::from_env();
    let ks = fresh_keyspace(&infra).await;
    let p = spawn_primary(&infra, &ks, &[], None).await;
    assert_eq!(get(&p.url("/healthz")).await.status(), StatusCode::OK);
    assert_eq!(get(&p.url("/readyz")).await.status(), StatusCode::OK);
    let _ = get(&p.url("/nothing-here")).await;
    let text = get(&p.url("/metrics")).await.text().await.unwrap();
    assert!(
        text.contains("zlink_primary_requests_total{route=\"redirect\",status=\"404\"} 1"),
        "{text}"
    );
    assert!(text.contains("zlink_primary_redirect_duration_seconds_bucket"));
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redirect_code_is_configurable_per_service_and_per_link() {
    let infra = Infra::from_env();
    let ks = fresh_keyspace(&infra).await;
    let p = spawn_primary(
        &infra,
        &ks,
        &[
            "--redirect-code",
            "307",
            "--redirect-cache-control",
            "public, max-age=60",
        ],
        None,
    )
    .await;
    let key = create_key(&p.state, "alice", false).await;
    let cases = [
        (None, 307u16),
        (Some(301u16), 301),
        (Some(302), 302),
        (Some(308), 308),
    ];
    for (i, (code, want)) in cases.into_iter().enumerate() {
        let mut body =
            json!({"url": format!("https://example.com/{i}"), "slug": format!("code-{i}")});
        if let Some(c) = code {
            body["redirect_code"] = json!(c);
        }
        let r = create(&p.base, &key, body).await;
        assert_eq!(r.status(), StatusCode::CREATED);
        assert_eq!(r.json::<Value>().await.unwrap()["redirect_code"], want);
        let r = get(&p.url(&format!("/code-{i}"))).await;
        assert_eq!(r.status().as_u16(), want);
        assert_eq!(location(&r), Some(format!("https://example.com/{i}")));
        assert_eq!(r.headers()["cache-control"], "public, max-age=60");
    }
    p.stop().await;
}

/// A keyspace an older release made (no `links.disabled_by`, no `api_key_ids`, a key issued
/// back then): `migrate` brings it up to date, twice in a row without error, and the old key
/// can be revoked by its id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_upgrades_a_keyspace_an_older_release_made() {
    let infra = Infra::from_env();
    let ks = format!("t_{}", uuid::Uuid::new_v4().simple());
    let session = scylla::client::session_builder::SessionBuilder::new()
        .known_node(&infra.cql)
        .build()
        .await
        .unwrap();
    for stmt in [
        format!("CREATE KEYSPACE {ks} WITH replication = {{'class': 'NetworkTopologyStrategy', 'replication_factor': 1}}"),
        format!("CREATE TABLE {ks}.links (slug text PRIMARY KEY, url text, owner text, status text, redirect_code int, created_at timestamp, expires_at timestamp, version bigint, idem text)"),
        format!("CREATE TABLE {ks}.api_keys (key_hash text PRIMARY KEY, key_id text, owner text, role text, created_at timestamp, revoked boolean)"),
        format!("INSERT INTO {ks}.api_keys (key_hash, key_id, owner, role, revoked) VALUES ('old-hash', '00000000000000aa', 'old', 'owner', false)"),
        format!("INSERT INTO {ks}.links (slug, url, owner, status, redirect_code, created_at, version) VALUES ('old-link', 'https://example.com/', 'old', 'ACTIVE', 302, 0, 1)"),
    ] {
        session.query_unpaged(stmt, &[]).await.unwrap();
    }
    for _ in 0..2 {
        zlink_store::schema::migrate(&infra.store_config(&ks), 1)
            .await
            .expect("migrate an old keyspace");
    }
    let db = zlink_store::Db::connect(&infra.store_config(&ks))
        .await
        .unwrap();
    let store = primary::store::Store::prepare(std::sync::Arc::new(db))
        .await
        .unwrap();
    let old = store.links.get("old-link").await.unwrap().unwrap();
    assert_eq!(old.disabled_by, None, "old rows read with the new column");
    assert!(store
        .links
        .transition(
            "old-link",
            zlink_wire::LinkStatus::Active,
            1,
            zlink_wire::LinkStatus::Disabled,
            Some(&zlink_store::DisabledBy {
                admin: true,
                key_id: "00000000000000ab".into(),
            }),
        )
        .await
        .unwrap());
    let now = store.links.get("old-link").await.unwrap().unwrap();
    assert_eq!(now.disabled_by.map(|d| d.admin), Some(true));
    let (hash, rec) = store
        .keys
        .revoke("00000000000000aa")
        .await
        .unwrap()
        .expect("the old key is found by its id");
    assert_eq!((hash.as_str(), rec.owner.as_str()), ("old-hash", "old"));
    assert!(store.keys.get("old-hash").await.unwrap().unwrap().revoked);
    // The link made before the owner index existed is in its owner's list.
    assert_eq!(store.links.owner_months("old").await.unwrap(), vec![0]);
    let page = store.links.owner_page("old", 0, None, 10).await.unwrap();
    assert_eq!(
        page.iter().map(|p| p.key.as_str()).collect::<Vec<_>>(),
        vec!["old-link"]
    );
}
