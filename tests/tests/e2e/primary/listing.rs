//! `GET /api/v1/links`: an owner's links newest first across months, a page at a time, with
//! status filter, admin access to any owner, and index entries the list must skip.

use super::*;

async fn list(base: &str, key: &str, query: &str) -> (StatusCode, Value) {
    let r = client()
        .get(format!("{base}/api/v1/links?{query}"))
        .bearer_auth(key)
        .send()
        .await
        .expect("request");
    (r.status(), r.json().await.expect("JSON body"))
}

/// Every page of a list, following `next_cursor`: the slugs in order.
pub(super) async fn list_all(base: &str, key: &str, query: &str) -> Vec<String> {
    let mut slugs = Vec::new();
    let mut cursor: Option<String> = None;
    for _ in 0..100 {
        let q = match &cursor {
            Some(c) => format!("{query}&cursor={c}"),
            None => query.to_string(),
        };
        let (status, body) = list(base, key, &q).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        for l in body["links"].as_array().unwrap() {
            slugs.push(l["slug"].as_str().unwrap().to_string());
        }
        match body["next_cursor"].as_str() {
            Some(c) => cursor = Some(c.to_string()),
            None => return slugs,
        }
    }
    panic!("more than 100 pages");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_owner_lists_its_links_newest_first_across_months_page_by_page() {
    let infra = Infra::from_env();
    let ks = fresh_keyspace(&infra).await;
    // Three months ago, so the links span four months of the owner index.
    let start = chrono::Utc::now().timestamp_millis() - 90 * 86_400_000;
    let clock = Arc::new(ManualClock::new(start));
    let p = spawn_primary(&infra, &ks, &[], Some(clock.clone())).await;
    let alice = create_key(&p.state, "alice", false).await;
    let bob = create_key(&p.state, "bob", false).await;
    let admin = create_key(&p.state, "ops", true).await;

    let mut made: Vec<String> = Vec::new();
    for i in 0..26 {
        let r = create(
            &p.base,
            &alice,
            json!({
                "url": format!("https://example.com/{i}"),
                "slug": format!("list-{i:02}"),
                "alias": format!("{} campaign {i}", if i % 5 == 0 { "Spring" } else { "Autumn" }),
            }),
        )
        .await;
        assert_eq!(r.status(), StatusCode::CREATED);
        made.push(format!("list-{i:02}"));
        if i % 3 == 0 {
            // Bob's links are interleaved with Alice's and never in her list.
            let r = create(&p.base, &bob, json!({"url": "https://example.com/b"})).await;
            assert_eq!(r.status(), StatusCode::CREATED);
        }
        clock.advance_ms(4 * 86_400_000);
    }
    // Two links made in the same millisecond: ordered by slug.
    for slug in ["same-a", "same-b"] {
        let r = create(
            &p.base,
            &alice,
            json!({"url": "https://example.com/s", "slug": slug}),
        )
        .await;
        assert_eq!(r.status(), StatusCode::CREATED);
        made.push(slug.to_string());
    }
    clock.advance_ms(1);
    // A retried idempotent create later on: its second index entry (another time) is skipped.
    let idem = |body: Value| {
        client()
            .post(format!("{}/api/v1/links", p.base))
            .bearer_auth(&alice)
            .header("idempotency-key", "retry-1")
            .json(&body)
            .send()
    };
    let first = idem(json!({"url": "https://example.com/idem"}))
        .await
        .unwrap();
    assert_eq!(first.status(), StatusCode::CREATED);
    let idem_slug = first.json::<Value>().await.unwrap()["slug"]
        .as_str()
        .unwrap()
        .to_string();
    made.push(idem_slug.clone());
    clock.advance_ms(1000);
    let again = idem(json!({"url": "https://example.com/idem"}))
        .await
        .unwrap();
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    // An entry whose link was never created (a create that died between the two writes) and
    // one of Alice's slugs claimed by Bob first (an entry for a link that is not hers).
    let ghost = zlink_store::Link {
        key: "ghost".into(),
        url: "https://example.com/ghost".into(),
        owner: "alice".into(),
        status: zlink_wire::LinkStatus::Active,
        redirect_code: 302,
        created_at_ms: clock.now_ms(),
        expires_at_ms: None,
        version: 1,
        idem: None,
        disabled_by: None,
        alias: None,
    };
    p.state.store.links.index(&ghost).await.unwrap();
    let r = create(
        &p.base,
        &bob,
        json!({"url": "https://example.com/b", "slug": "contested"}),
    )
    .await;
    assert_eq!(r.status(), StatusCode::CREATED);
    let r = create(
        &p.base,
        &alice,
        json!({"url": "https://example.com/a", "slug": "contested"}),
    )
    .await;
    assert_eq!(r.status(), StatusCode::CONFLICT);

    // Creation order reversed; same-b before same-a (same millisecond: slug descending).
    let newest_first: Vec<String> = made.iter().rev().cloned().collect();
    for limit in [1, 7, 20, 100] {
        assert_eq!(
            list_all(&p.base, &alice, &format!("limit={limit}")).await,
            newest_first,
            "limit {limit}"
        );
    }
    let (status, page) = list(&p.base, &alice, "limit=3").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(page["links"][0]["slug"], idem_slug.as_str());
    assert_eq!(page["links"][0]["owner"], "alice");
    assert_eq!(page["links"].as_array().unwrap().len(), 3);

    // Status filter: effective status, so an expired link is EXPIRED.
    for slug in ["list-03", "list-17"] {
        set_status(&p.base, &alice, slug, "DISABLED").await;
    }
    let expires = chrono::DateTime::from_timestamp_millis(clock.now_ms() + 60_000)
        .unwrap()
        .to_rfc3339();
    let r = create(
        &p.base,
        &alice,
        json!({"url": "https://example.com/e", "slug": "soon-gone", "expires_at": expires}),
    )
    .await;
    assert_eq!(r.status(), StatusCode::CREATED);
    clock.advance_ms(120_000);
    assert_eq!(
        list_all(&p.base, &alice, "status=DISABLED&limit=1").await,
        vec!["list-17", "list-03"]
    );
    assert_eq!(
        list_all(&p.base, &alice, "status=EXPIRED").await,
        vec!["soon-gone"]
    );
    assert_eq!(
        list_all(&p.base, &alice, "status=ACTIVE&limit=50")
            .await
            .len(),
        made.len() - 2
    );

    // Search: alias or slug, any case.
    assert_eq!(
        list_all(&p.base, &alice, "q=SPRING&limit=2").await,
        vec!["list-25", "list-20", "list-15", "list-10", "list-05", "list-00"]
    );
    assert_eq!(
        list_all(&p.base, &alice, "q=same-").await,
        vec!["same-b", "same-a"]
    );
    assert_eq!(
        list_all(&p.base, &alice, "q=spring&status=DISABLED").await,
        Vec::<String>::new()
    );
    let (_, page) = list(&p.base, &alice, "q=campaign%2025").await;
    assert_eq!(page["links"][0]["alias"], "Spring campaign 25");

    // Bob sees only his; he may not list Alice's; an admin may.
    assert_eq!(list_all(&p.base, &bob, "limit=100").await.len(), 10);
    let (status, body) = list(&p.base, &bob, "owner=alice").await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert_eq!(
        list_all(&p.base, &admin, "owner=alice&status=DISABLED").await,
        vec!["list-17", "list-03"]
    );
    assert!(list_all(&p.base, &admin, "owner=nobody").await.is_empty());

    // Bad queries: 4xx JSON, never a 5xx.
    for q in [
        "limit=0",
        "limit=1000",
        "status=gone",
        "cursor=not-a-cursor",
        "cursor=%3Cscript%3Ealert(1)%3C%2Fscript%3E",
        "owner=a%20b",
        "order=asc",
        "limit=5&limit=6",
    ] {
        let (status, body) = list(&p.base, &alice, q).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{q}: {body}");
        assert!(body["error"]["code"].is_string(), "{q}: {body}");
    }
    let r = client()
        .get(format!("{}/api/v1/links", p.base))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    p.stop().await;
}
