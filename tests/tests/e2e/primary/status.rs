//! The status state machine end to end (invariant 4): disable, enable, delete, expiry, on
//! every instance.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn disable_gives_410_enable_restores_and_invalid_transitions_are_refused() {
    let infra = Infra::from_env();
    let ks = fresh_keyspace(&infra).await;
    let a = spawn_primary(&infra, &ks, &["--memcached", &infra.memcached], None).await;
    let b = spawn_primary(
        &infra,
        &ks,
        &[
            "--memcached",
            &infra.memcached,
            "--local-cache-ttl-ms",
            "200",
        ],
        None,
    )
    .await;
    let alice = create_key(&a.state, "alice", false).await;
    let mallory = create_key(&a.state, "mallory", false).await;
    let admin = create_key(&a.state, "ops", true).await;

    let r = create(
        &a.base,
        &alice,
        json!({"url": "https://example.com/d", "slug": "to-disable"}),
    )
    .await;
    assert_eq!(r.status(), StatusCode::CREATED);
    // Warm both instances' caches and memcached.
    assert_eq!(get(&a.url("/to-disable")).await.status(), StatusCode::FOUND);
    assert_eq!(get(&b.url("/to-disable")).await.status(), StatusCode::FOUND);

    assert_eq!(
        patch_status(&a.base, &mallory, "to-disable", "DISABLED")
            .await
            .status(),
        StatusCode::FORBIDDEN
    );
    let r = patch_status(&a.base, &alice, "to-disable", "DISABLED").await;
    assert_eq!(r.status(), StatusCode::OK);
    let body: Value = r.json().await.unwrap();
    assert_eq!(
        (body["status"].as_str(), body["version"].as_i64()),
        (Some("DISABLED"), Some(2))
    );

    let r = get(&a.url("/to-disable")).await;
    assert_eq!(r.status(), StatusCode::GONE);
    assert_eq!(r.headers()["content-type"], "application/json");
    assert_eq!(location(&r), None);
    // The other instance drops its local copy within its TTL; memcached was invalidated.
    let b_url = b.url("/to-disable");
    assert!(
        eventually(Duration::from_secs(5), || {
            let u = b_url.clone();
            async move { get(&u).await.status() == StatusCode::GONE }
        })
        .await
    );

    // DISABLED → DISABLED is not a transition; EXPIRED is never set through the API.
    let r = patch_status(&a.base, &alice, "to-disable", "DISABLED").await;
    assert_eq!(r.status(), StatusCode::CONFLICT);
    assert_eq!(
        r.json::<Value>().await.unwrap()["error"]["code"],
        "invalid_transition"
    );
    assert_eq!(
        patch_status(&a.base, &alice, "to-disable", "EXPIRED")
            .await
            .status(),
        StatusCode::UNPROCESSABLE_ENTITY
    );
    assert_eq!(
        patch_status(&a.base, &alice, "to-disable", "active")
            .await
            .status(),
        StatusCode::UNPROCESSABLE_ENTITY
    );

    // An admin may re-enable someone else's link.
    let r = patch_status(&a.base, &admin, "to-disable", "ACTIVE").await;
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(get(&a.url("/to-disable")).await.status(), StatusCode::FOUND);

    let kinds: Vec<_> = a
        .events
        .links
        .lock()
        .unwrap()
        .iter()
        .map(|e| (e.kind, e.version))
        .collect();
    assert_eq!(
        kinds,
        vec![
            (LinkEventKind::Created, 1),
            (LinkEventKind::Disabled, 2),
            (LinkEventKind::Enabled, 3)
        ]
    );
    assert_eq!(
        patch_status(&a.base, &alice, "nope-404", "DISABLED")
            .await
            .status(),
        StatusCode::NOT_FOUND
    );
    a.stop().await;
    b.stop().await;
}

/// DELETE: owner or admin only, from any state (a takedown included), final, idempotent; the
/// slug stays taken; 410 on every instance; listed only when asked for.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn delete_is_final_idempotent_and_gives_410_on_every_instance() {
    let infra = Infra::from_env();
    let ks = fresh_keyspace(&infra).await;
    let a = spawn_primary(&infra, &ks, &["--memcached", &infra.memcached], None).await;
    let b = spawn_primary(
        &infra,
        &ks,
        &[
            "--memcached",
            &infra.memcached,
            "--local-cache-ttl-ms",
            "200",
        ],
        None,
    )
    .await;
    let alice = create_key(&a.state, "alice", false).await;
    let mallory = create_key(&a.state, "mallory", false).await;
    let admin = create_key(&a.state, "ops", true).await;
    for slug in ["to-delete", "taken-down"] {
        let r = create(
            &a.base,
            &alice,
            json!({"url": "https://example.com/d", "slug": slug}),
        )
        .await;
        assert_eq!(r.status(), StatusCode::CREATED);
        assert_eq!(
            get(&a.url(&format!("/{slug}"))).await.status(),
            StatusCode::FOUND
        );
        assert_eq!(
            get(&b.url(&format!("/{slug}"))).await.status(),
            StatusCode::FOUND
        );
    }

    assert_eq!(
        delete_link(&a.base, &mallory, "to-delete").await.status(),
        StatusCode::FORBIDDEN
    );
    assert_eq!(
        delete_link(&a.base, &alice, "never-made").await.status(),
        StatusCode::NOT_FOUND
    );
    let r = delete_link(&a.base, &alice, "to-delete").await;
    assert_eq!(r.status(), StatusCode::OK);
    let body: Value = r.json().await.unwrap();
    assert_eq!(
        (body["status"].as_str(), body["version"].as_i64()),
        (Some("DELETED"), Some(2))
    );
    assert_eq!(get(&a.url("/to-delete")).await.status(), StatusCode::GONE);
    assert_eq!(get(&a.url("/to-delete+")).await.status(), StatusCode::GONE);
    let b_url = b.url("/to-delete");
    assert!(
        eventually(Duration::from_secs(5), || {
            let u = b_url.clone();
            async move { get(&u).await.status() == StatusCode::GONE }
        })
        .await
    );
    // Again: the same answer, nothing changes.
    let again: Value = delete_link(&a.base, &alice, "to-delete")
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(again["version"], 2);
    // Final: no way back, the slug stays taken.
    for status in ["ACTIVE", "DISABLED"] {
        let r = patch_status(&a.base, &admin, "to-delete", status).await;
        assert_eq!(r.status(), StatusCode::CONFLICT, "{status}");
    }
    assert_eq!(
        patch_status(&a.base, &alice, "to-delete", "DELETED")
            .await
            .status(),
        StatusCode::UNPROCESSABLE_ENTITY,
        "deleting goes through DELETE"
    );
    let r = create(
        &a.base,
        &alice,
        json!({"url": "https://example.com/new", "slug": "to-delete"}),
    )
    .await;
    assert_eq!(r.status(), StatusCode::CONFLICT);

    // An owner may delete a link an admin took down.
    set_status(&a.base, &admin, "taken-down", "DISABLED").await;
    let r = delete_link(&a.base, &alice, "taken-down").await;
    assert_eq!(r.status(), StatusCode::OK);
    let body: Value = r.json().await.unwrap();
    assert_eq!(
        (body["status"].as_str(), body["disabled_by"].as_str()),
        (Some("DELETED"), Some("admin"))
    );

    let listed = client()
        .get(format!("{}/api/v1/links", a.base))
        .bearer_auth(&alice)
        .send()
        .await
        .unwrap()
        .json::<Value>()
        .await
        .unwrap();
    assert_eq!(listed["links"].as_array().unwrap().len(), 0, "{listed}");
    let deleted = client()
        .get(format!("{}/api/v1/links?status=DELETED", a.base))
        .bearer_auth(&alice)
        .send()
        .await
        .unwrap()
        .json::<Value>()
        .await
        .unwrap();
    assert_eq!(deleted["links"].as_array().unwrap().len(), 2, "{deleted}");

    let kinds: Vec<_> = a
        .events
        .links
        .lock()
        .unwrap()
        .iter()
        .filter(|e| e.key == "to-delete")
        .map(|e| (e.kind, e.version))
        .collect();
    assert_eq!(
        kinds,
        vec![(LinkEventKind::Created, 1), (LinkEventKind::Deleted, 2)]
    );
    a.stop().await;
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn expired_link_gives_410_and_cannot_be_changed() {
    let infra = Infra::from_env();
    let ks = fresh_keyspace(&infra).await;
    let clock = Arc::new(ManualClock::new(chrono::Utc::now().timestamp_millis()));
    let p = spawn_primary(&infra, &ks, &[], Some(clock.clone())).await;
    let key = create_key(&p.state, "alice", false).await;
    let expires = chrono::DateTime::from_timestamp_millis(clock.now_ms() + 60_000)
        .unwrap()
        .to_rfc3339();

    let r = create(
        &p.base,
        &key,
        json!({"url": "https://example.com/e", "slug": "short-lived", "expires_at": expires}),
    )
    .await;
    assert_eq!(r.status(), StatusCode::CREATED);
    assert_eq!(
        get(&p.url("/short-lived")).await.status(),
        StatusCode::FOUND
    );

    clock.advance_ms(60_001);
    assert_eq!(get(&p.url("/short-lived")).await.status(), StatusCode::GONE);
    let meta: Value = get_json(&p.url("/api/v1/links/short-lived"), &key).await;
    assert_eq!(meta["status"], "EXPIRED");
    assert_eq!(
        patch_status(&p.base, &key, "short-lived", "DISABLED")
            .await
            .status(),
        StatusCode::CONFLICT
    );
    p.stop().await;
}
