use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_api_issues_a_key_once_and_revocation_holds_on_every_primary() {
    let infra = Infra::from_env();
    let ks = fresh_keyspace(&infra).await;
    let a = spawn_primary(&infra, &ks, &[], None).await;
    let b = spawn_primary(&infra, &ks, &[], None).await;
    let admin = create_key(&a.state, "ops", true).await;
    let r = post_json(
        &a.url("/api/v1/keys"),
        &admin,
        json!({"owner": "carol"}),
        None,
    )
    .await;
    assert_eq!(r.status(), StatusCode::CREATED);
    let issued: Value = r.json().await.unwrap();
    let key = issued["key"].as_str().unwrap().to_string();
    let id = issued["id"].as_str().unwrap().to_string();
    assert_eq!(issued["owner"], "carol");
    assert_eq!(issued["role"], "owner");
    assert!(key.starts_with(&format!("zl_{id}_")));
    // Only its hash is stored.
    let session = scylla::client::session_builder::SessionBuilder::new()
        .known_node(&infra.cql)
        .build()
        .await
        .unwrap();
    let rows = session
        .query_unpaged(format!("SELECT key_hash, key_id FROM {ks}.api_keys"), &[])
        .await
        .unwrap()
        .into_rows_result()
        .unwrap();
    let stored: Vec<(String, String)> = rows
        .rows::<(String, String)>()
        .unwrap()
        .map(|r| r.unwrap())
        .collect();
    assert!(stored
        .iter()
        .any(|(h, i)| *i == id && *h == primary::auth::hash_key(&key)));

    // The key works on both primaries.
    for p in [&a, &b] {
        let r = create(&p.base, &key, json!({"url": "https://example.com/carol"})).await;
        assert_eq!(r.status(), StatusCode::CREATED);
    }
    // Only admins manage keys; bad input is 4xx JSON.
    let r = post_json(
        &a.url("/api/v1/keys"),
        &key,
        json!({"owner": "mallory", "admin": true}),
        None,
    )
    .await;
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    assert_eq!(
        r.json::<Value>().await.unwrap()["error"]["code"],
        "admin_only"
    );
    for bad in [
        json!({"owner": "a b"}),
        json!({"owner": ""}),
        json!({"owner": "x", "role": "admin"}),
        json!({}),
    ] {
        let r = post_json(&a.url("/api/v1/keys"), &admin, bad.clone(), None).await;
        assert_eq!(r.status(), StatusCode::UNPROCESSABLE_ENTITY, "{bad}");
    }
    let del = |base: String, who: String, id: String| async move {
        client()
            .delete(format!("{base}/api/v1/keys/{id}"))
            .bearer_auth(who)
            .send()
            .await
            .unwrap()
    };
    assert_eq!(
        del(a.base.clone(), key.clone(), id.clone()).await.status(),
        StatusCode::FORBIDDEN
    );
    assert_eq!(
        del(a.base.clone(), admin.clone(), "0123456789abcdef".into())
            .await
            .status(),
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        del(a.base.clone(), admin.clone(), "../x".into())
            .await
            .status(),
        StatusCode::NOT_FOUND
    );

    // Revoked: at once on the primary that revoked it, within the key cache TTL on the other.
    let r = del(a.base.clone(), admin.clone(), id.clone()).await;
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(r.json::<Value>().await.unwrap()["revoked"], true);
    let r = create(&a.base, &key, json!({"url": "https://example.com/after"})).await;
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    let b_base = b.base.clone();
    let k = key.clone();
    assert!(
        eventually(
            primary::auth::KEY_CACHE_TTL + Duration::from_secs(2),
            || {
                let (b, k) = (b_base.clone(), k.clone());
                async move {
                    create(&b, &k, json!({"url": "https://example.com/after"}))
                        .await
                        .status()
                        == StatusCode::UNAUTHORIZED
                }
            }
        )
        .await,
        "revoked on the other primary within the key cache TTL"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_random_slug_scan_never_reaches_the_store() {
    let infra = Infra::from_env();
    let ks = fresh_keyspace(&infra).await;
    let p = spawn_primary(&infra, &ks, &[], None).await;
    let key = create_key(&p.state, "alice", false).await;
    let mut made = Vec::new();
    for i in 0..5 {
        let r = create(
            &p.base,
            &key,
            json!({"url": format!("https://example.com/{i}")}),
        )
        .await;
        assert_eq!(r.status(), StatusCode::CREATED);
        made.push(
            r.json::<Value>().await.unwrap()["slug"]
                .as_str()
                .unwrap()
                .to_string(),
        );
    }
    let metrics = p.url("/metrics");
    let reads = || metric_sum(&metrics, "zlink_primary_store_link_reads_total");
    let before = reads().await;
    // 500 random auto-shaped slugs: 404, and no link read reaches the store.
    let alphabet = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
    let (mut not_found, mut unavailable) = (0, 0);
    for i in 0..500u64 {
        let slug: String = (0..7)
            .map(|j| alphabet[((i * 7919 + j * 104_729 + i * i * 31) % 62) as usize] as char)
            .collect();
        if made.contains(&slug) {
            continue;
        }
        let r = client()
            .get(p.url(&format!("/{slug}")))
            .send()
            .await
            .unwrap();
        // 404; or, when the store is slow to tell this primary how far IDs were handed out
        // (a counter read above the known mark, under the redirect's deadline), a fast 503
        // that the frontend fails over to the next rung. Never a redirect, never a link read.
        match r.status() {
            StatusCode::NOT_FOUND => not_found += 1,
            StatusCode::SERVICE_UNAVAILABLE => unavailable += 1,
            other => panic!("{slug}: {other}"),
        }
    }
    assert!(
        not_found >= 450,
        "{not_found} × 404, {unavailable} × 503 from a slow store"
    );
    assert_eq!(reads().await, before, "the scan cost no link read");
    assert!(metric_sum(&metrics, "zlink_primary_cache_lookups_total").await >= 500.0);
    // Real links still redirect, including one created on another primary just now.
    let other = spawn_primary(&infra, &ks, &["--id-block-size", "1"], None).await;
    let r = create(&other.base, &key, json!({"url": "https://example.com/new"})).await;
    let fresh = r.json::<Value>().await.unwrap()["slug"]
        .as_str()
        .unwrap()
        .to_string();
    for slug in made.iter().chain([&fresh]) {
        let r = client()
            .get(p.url(&format!("/{slug}")))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::FOUND, "{slug}");
    }
}
