//! A new destination or expiry (PATCH `url` / `expires_at`): a new version every instance
//! serves.

use super::*;

async fn patch_json(base: &str, key: &str, slug: &str, body: Value) -> reqwest::Response {
    client()
        .patch(format!("{base}/api/v1/links/{slug}"))
        .bearer_auth(key)
        .json(&body)
        .send()
        .await
        .expect("request")
}

/// PATCH with a new `url` and/or `expires_at`: a new version every instance serves (memcached
/// at once, the other's local cache within its TTL); bad values change nothing; a deleted,
/// expired or taken-down link is not retargeted by its owner.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_new_destination_or_expiry_is_a_new_version_every_instance_serves() {
    let infra = Infra::from_env();
    let ks = fresh_keyspace(&infra).await;
    let clock = Arc::new(ManualClock::new(chrono::Utc::now().timestamp_millis()));
    let a = spawn_primary(
        &infra,
        &ks,
        &["--memcached", &infra.memcached],
        Some(clock.clone()),
    )
    .await;
    let b = spawn_primary(
        &infra,
        &ks,
        &[
            "--memcached",
            &infra.memcached,
            "--local-cache-ttl-ms",
            "200",
        ],
        Some(clock.clone()),
    )
    .await;
    let alice = create_key(&a.state, "alice", false).await;
    let mallory = create_key(&a.state, "mallory", false).await;
    let admin = create_key(&a.state, "ops", true).await;
    let r = create(
        &a.base,
        &alice,
        json!({"url": "https://example.com/old", "slug": "move-me"}),
    )
    .await;
    assert_eq!(r.status(), StatusCode::CREATED);
    for inst in [&a, &b] {
        let r = get(&inst.url("/move-me")).await;
        assert_eq!(location(&r).as_deref(), Some("https://example.com/old"));
    }

    let r = patch_json(
        &a.base,
        &alice,
        "move-me",
        json!({"url": "https://example.com/new"}),
    )
    .await;
    assert_eq!(r.status(), StatusCode::OK);
    let body: Value = r.json().await.unwrap();
    assert_eq!(
        (body["url"].as_str(), body["version"].as_i64()),
        (Some("https://example.com/new"), Some(2))
    );
    assert_eq!(
        location(&get(&a.url("/move-me")).await).as_deref(),
        Some("https://example.com/new")
    );
    let b_url = b.url("/move-me");
    assert!(
        eventually(Duration::from_secs(5), || {
            let u = b_url.clone();
            async move { location(&get(&u).await).as_deref() == Some("https://example.com/new") }
        })
        .await,
        "the other instance serves the new destination"
    );

    // An expiry, then none; the same values again change nothing.
    let soon = chrono::DateTime::from_timestamp_millis(clock.now_ms() + 60_000)
        .unwrap()
        .to_rfc3339();
    let body: Value = patch_json(&a.base, &alice, "move-me", json!({"expires_at": soon}))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(body["version"], 3);
    assert!(body["expires_at"].is_string());
    let body: Value = patch_json(&a.base, &alice, "move-me", json!({"expires_at": null}))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(
        (body["version"].as_i64(), body["expires_at"].is_null()),
        (Some(4), true)
    );
    let body: Value = patch_json(
        &a.base,
        &alice,
        "move-me",
        json!({"url": "https://example.com/new"}),
    )
    .await
    .json()
    .await
    .unwrap();
    assert_eq!(body["version"], 4, "nothing changed, no new version");
    clock.advance_ms(120_000);
    assert_eq!(
        get(&a.url("/move-me")).await.status(),
        StatusCode::FOUND,
        "the expiry was cleared"
    );

    // Bad values and bad requests change nothing.
    for (who, bad, status) in [
        (
            &alice,
            json!({"url": "javascript:alert(1)"}),
            StatusCode::UNPROCESSABLE_ENTITY,
        ),
        (
            &alice,
            json!({"expires_at": "yesterday"}),
            StatusCode::UNPROCESSABLE_ENTITY,
        ),
        (
            &alice,
            json!({"expires_at": "2001-01-01T00:00:00Z"}),
            StatusCode::UNPROCESSABLE_ENTITY,
        ),
        (
            &alice,
            json!({"status": "DISABLED", "url": "https://example.com/x"}),
            StatusCode::UNPROCESSABLE_ENTITY,
        ),
        (&alice, json!({}), StatusCode::UNPROCESSABLE_ENTITY),
        (
            &alice,
            json!({"slug": "other"}),
            StatusCode::UNPROCESSABLE_ENTITY,
        ),
        (
            &mallory,
            json!({"url": "https://evil.example/"}),
            StatusCode::FORBIDDEN,
        ),
    ] {
        let r = patch_json(&a.base, who, "move-me", bad.clone()).await;
        assert_eq!(r.status(), status, "{bad}");
    }
    let body: Value = get_json(&format!("{}/api/v1/links/move-me", a.base), &alice).await;
    assert_eq!(
        (body["url"].as_str(), body["version"].as_i64()),
        (Some("https://example.com/new"), Some(4))
    );

    // The alias: set, cleared, never a new version; a bad one (or a bad URL beside a good
    // alias) changes nothing.
    let body: Value = patch_json(
        &a.base,
        &alice,
        "move-me",
        json!({"alias": "  Q4 <b>launch</b> "}),
    )
    .await
    .json()
    .await
    .unwrap();
    assert_eq!(
        (body["alias"].as_str(), body["version"].as_i64()),
        (Some("Q4 <b>launch</b>"), Some(4))
    );
    for bad in [
        json!({"alias": ""}),
        json!({"alias": "x".repeat(101)}),
        json!({"alias": "tab\there"}),
        json!({"alias": "new", "url": "ftp://example.com/"}),
    ] {
        let r = patch_json(&a.base, &alice, "move-me", bad.clone()).await;
        assert_eq!(r.status(), StatusCode::UNPROCESSABLE_ENTITY, "{bad}");
    }
    let body: Value = get_json(&format!("{}/api/v1/links/move-me", a.base), &alice).await;
    assert_eq!(
        body["alias"], "Q4 <b>launch</b>",
        "unchanged by the refused requests"
    );
    let body: Value = patch_json(&a.base, &alice, "move-me", json!({"alias": null}))
        .await
        .json()
        .await
        .unwrap();
    assert!(body["alias"].is_null());

    // A takedown holds: the owner cannot point the link elsewhere; an admin can.
    set_status(&a.base, &admin, "move-me", "DISABLED").await;
    let r = patch_json(
        &a.base,
        &alice,
        "move-me",
        json!({"url": "https://example.com/sneaky"}),
    )
    .await;
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    let r = patch_json(
        &a.base,
        &admin,
        "move-me",
        json!({"url": "https://example.com/clean"}),
    )
    .await;
    assert_eq!(r.status(), StatusCode::OK);
    // Deleted: final.
    assert_eq!(
        delete_link(&a.base, &admin, "move-me").await.status(),
        StatusCode::OK
    );
    let r = patch_json(
        &a.base,
        &admin,
        "move-me",
        json!({"url": "https://example.com/again"}),
    )
    .await;
    assert_eq!(r.status(), StatusCode::CONFLICT);

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
            (LinkEventKind::Updated, 2),
            (LinkEventKind::Updated, 3),
            (LinkEventKind::Updated, 4),
            (LinkEventKind::Disabled, 5),
            (LinkEventKind::Updated, 6),
            (LinkEventKind::Deleted, 7),
        ]
    );
    a.stop().await;
    b.stop().await;
}
