//! Primary tier end to end, against the real Cassandra and memcached started by deploy/local/test.
//! Covers SYSTEM.md invariants 1 (slug uniqueness), 2 (idempotency), 3 (404/410 semantics),
//! 4 (state machine) and 9 (bad input), plus the cache layers and memcached failure.

use reqwest::StatusCode;
use serde_json::{json, Value};
use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;
use zlink_clients::clock::{Clock, ManualClock};
use zlink_e2e::*;
use zlink_wire::events::LinkEventKind;

mod bulk;
mod cache;
mod canary;
mod input;
mod listing;
mod openapi;
mod qr;
mod retarget;
mod status;

async fn get(url: &str) -> reqwest::Response {
    client().get(url).send().await.expect("request")
}

fn location(r: &reqwest::Response) -> Option<String> {
    r.headers()
        .get("location")
        .map(|v| v.to_str().unwrap().to_string())
}

/// Issue 40: the short URL is the public base every primary behind one frontend shares, not the
/// answering process's address: created on one, read on the other, listed and in bulk, the
/// same URL, and the QR code and the info page carry it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_primary_hands_out_the_same_short_url_under_the_public_base() {
    let infra = Infra::from_env();
    let ks = fresh_keyspace(&infra).await;
    let public = ["--public-base-url", "https://go.zlink.example"];
    let a = spawn_primary(&infra, &ks, &public, None).await;
    let b = spawn_primary(&infra, &ks, &public, None).await;
    let key = create_key(&a.state, "alice", false).await;
    let r = create(&a.base, &key, json!({"url": "https://example.com/shared"})).await;
    assert_eq!(r.status(), StatusCode::CREATED);
    let made: Value = r.json().await.unwrap();
    let slug = made["slug"].as_str().unwrap();
    let want = format!("https://go.zlink.example/{slug}");
    assert_eq!(made["short_url"], want.as_str());
    for p in [&a, &b] {
        let got: Value = get_json(&p.url(&format!("/api/v1/links/{slug}")), &key).await;
        assert_eq!(got["short_url"], want.as_str(), "read on {}", p.base);
        let list: Value = get_json(&p.url("/api/v1/links"), &key).await;
        assert_eq!(list["links"][0]["short_url"], want.as_str());
        let info = get(&p.url(&format!("/{slug}+")))
            .await
            .text()
            .await
            .unwrap();
        assert!(info.contains(&want), "info page on {}", p.base);
        assert!(!info.contains(&a.base) && !info.contains(&b.base));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn created_link_redirects_on_both_instances() {
    let infra = Infra::from_env();
    let ks = fresh_keyspace(&infra).await;
    let a = spawn_primary(&infra, &ks, &["--memcached", &infra.memcached], None).await;
    let b = spawn_primary(&infra, &ks, &["--memcached", &infra.memcached], None).await;
    let key = create_key(&a.state, "alice", false).await;

    let r = create(&a.base, &key, json!({"url": "https://example.com/a?b=1"})).await;
    assert_eq!(r.status(), StatusCode::CREATED);
    let body: Value = r.json().await.unwrap();
    let slug = body["slug"].as_str().unwrap().to_string();
    assert_eq!(slug.len(), 7);
    assert_eq!(body["url"], "https://example.com/a?b=1");
    assert_eq!(body["status"], "ACTIVE");
    assert_eq!(body["short_url"], format!("{}/{slug}", a.base));
    assert!(body["created_at"].as_str().unwrap().ends_with('Z'));
    assert_eq!(body["expires_at"], Value::Null);

    for inst in [&a, &b] {
        let r = get(&inst.url(&format!("/{slug}"))).await;
        assert_eq!(r.status(), StatusCode::FOUND);
        assert_eq!(location(&r).as_deref(), Some("https://example.com/a?b=1"));
        assert_eq!(r.headers()["cache-control"], "private, max-age=90");
        let head = client()
            .head(inst.url(&format!("/{slug}")))
            .send()
            .await
            .unwrap();
        assert_eq!(head.status(), StatusCode::FOUND);
        assert_eq!(
            location(&head).as_deref(),
            Some("https://example.com/a?b=1")
        );
    }
    // The create event carries version 1; the GET on each instance is a click, the HEAD is not.
    let links = a.events.links.lock().unwrap().clone();
    assert_eq!(links.len(), 1);
    assert_eq!(
        (links[0].kind, links[0].version),
        (LinkEventKind::Created, 1)
    );
    assert_eq!(a.events.clicks.lock().unwrap().len(), 1);
    a.stop().await;
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fifty_concurrent_claims_of_one_custom_slug_give_exactly_one_201() {
    let infra = Infra::from_env();
    let ks = fresh_keyspace(&infra).await;
    let a = spawn_primary(&infra, &ks, &[], None).await;
    let b = spawn_primary(&infra, &ks, &[], None).await;
    let key = create_key(&a.state, "alice", false).await;

    let mut tasks = Vec::new();
    for i in 0..50 {
        let base = if i % 2 == 0 {
            a.base.clone()
        } else {
            b.base.clone()
        };
        let key = key.clone();
        tasks.push(tokio::spawn(async move {
            let r = create(
                &base,
                &key,
                json!({"url": format!("https://example.com/{i}"), "slug": "launch-day"}),
            )
            .await;
            (r.status(), i)
        }));
    }
    let mut winners = Vec::new();
    for t in tasks {
        let (status, i) = t.await.unwrap();
        match status {
            StatusCode::CREATED => winners.push(i),
            StatusCode::CONFLICT => {}
            other => panic!("unexpected status {other}"),
        }
    }
    assert_eq!(winners.len(), 1, "exactly one claim wins");
    let r = get(&a.url("/launch-day")).await;
    assert_eq!(
        location(&r),
        Some(format!("https://example.com/{}", winners[0]))
    );
    assert_eq!(count_rows(&infra, &ks, "links").await, 1);
    a.stop().await;
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn custom_slug_twice_gives_201_then_409() {
    let infra = Infra::from_env();
    let ks = fresh_keyspace(&infra).await;
    let p = spawn_primary(&infra, &ks, &[], None).await;
    let key = create_key(&p.state, "alice", false).await;
    let r = create(
        &p.base,
        &key,
        json!({"url": "https://example.com/", "slug": "my_link"}),
    )
    .await;
    assert_eq!(r.status(), StatusCode::CREATED);
    let r = create(
        &p.base,
        &key,
        json!({"url": "https://example.com/", "slug": "my_link"}),
    )
    .await;
    assert_eq!(r.status(), StatusCode::CONFLICT);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["error"]["code"], "slug_taken");
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn auto_slugs_from_two_instances_never_collide() {
    let infra = Infra::from_env();
    let ks = fresh_keyspace(&infra).await;
    // Tiny ID blocks so the instances lease (and contend for) the counter many times.
    let a = spawn_primary(&infra, &ks, &["--id-block-size", "7"], None).await;
    let b = spawn_primary(&infra, &ks, &["--id-block-size", "7"], None).await;
    let key = create_key(&a.state, "alice", false).await;
    let mut tasks = Vec::new();
    for i in 0..120 {
        let base = if i % 2 == 0 {
            a.base.clone()
        } else {
            b.base.clone()
        };
        let key = key.clone();
        tasks.push(tokio::spawn(async move {
            let r = create(
                &base,
                &key,
                json!({"url": format!("https://example.com/{i}")}),
            )
            .await;
            assert_eq!(r.status(), StatusCode::CREATED);
            r.json::<Value>().await.unwrap()["slug"]
                .as_str()
                .unwrap()
                .to_string()
        }));
    }
    let mut slugs = HashSet::new();
    for t in tasks {
        let slug = t.await.unwrap();
        assert!(zlink_wire::slug::is_auto_shape(&slug), "{slug}");
        assert!(slugs.insert(slug.clone()), "duplicate slug {slug}");
    }
    assert_eq!(count_rows(&infra, &ks, "links").await, 120);
    a.stop().await;
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn idempotency_key_retry_returns_the_same_link() {
    let infra = Infra::from_env();
    let ks = fresh_keyspace(&infra).await;
    let p = spawn_primary(&infra, &ks, &[], None).await;
    let alice = create_key(&p.state, "alice", false).await;
    let bob = create_key(&p.state, "bob", false).await;
    let send = |key: String, idem: &'static str, url: &'static str| {
        let base = p.base.clone();
        async move {
            client()
                .post(format!("{base}/api/v1/links"))
                .bearer_auth(key)
                .header("Idempotency-Key", idem)
                .json(&json!({"url": url}))
                .send()
                .await
                .unwrap()
        }
    };

    let first = send(alice.clone(), "order-1", "https://example.com/x").await;
    assert_eq!(first.status(), StatusCode::CREATED);
    let slug = first.json::<Value>().await.unwrap()["slug"]
        .as_str()
        .unwrap()
        .to_string();
    let retry = send(alice.clone(), "order-1", "https://example.com/x").await;
    assert_eq!(retry.status(), StatusCode::CREATED);
    assert_eq!(retry.headers()["idempotent-replayed"], "true");
    assert_eq!(retry.json::<Value>().await.unwrap()["slug"], slug.as_str());

    // Concurrent retries of a new key converge on one link.
    let mut tasks = Vec::new();
    for _ in 0..20 {
        tasks.push(tokio::spawn(send(
            alice.clone(),
            "order-2",
            "https://example.com/y",
        )));
    }
    let mut seen = HashSet::new();
    for t in tasks {
        let r = t.await.unwrap();
        assert_eq!(r.status(), StatusCode::CREATED);
        seen.insert(
            r.json::<Value>().await.unwrap()["slug"]
                .as_str()
                .unwrap()
                .to_string(),
        );
    }
    assert_eq!(seen.len(), 1, "one link for one key: {seen:?}");

    // Same key, different request: refused. Same key, other owner: a separate link.
    let reused = send(alice.clone(), "order-1", "https://example.com/other").await;
    assert_eq!(reused.status(), StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(
        reused.json::<Value>().await.unwrap()["error"]["code"],
        "idempotency_key_reused"
    );
    let bobs = send(bob, "order-1", "https://example.com/x").await;
    assert_eq!(bobs.status(), StatusCode::CREATED);
    assert_ne!(bobs.json::<Value>().await.unwrap()["slug"], slug.as_str());

    assert_eq!(count_rows(&infra, &ks, "links").await, 3);
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn unknown_slugs_get_404_json() {
    let infra = Infra::from_env();
    let ks = fresh_keyspace(&infra).await;
    let p = spawn_primary(&infra, &ks, &[], None).await;
    for path in [
        "/nothere",
        "/abcDEF1",
        "/a",
        "/x%00y",
        "/..%2F..",
        "/api/v1/nothing",
        "/a/b",
    ] {
        let r = get(&p.url(path)).await;
        assert_eq!(r.status(), StatusCode::NOT_FOUND, "{path}");
        assert_eq!(r.headers()["content-type"], "application/json", "{path}");
        let body: Value = r.json().await.unwrap();
        assert_eq!(body["error"]["code"], "not_found");
    }
    let r = client().post(p.url("/nothere")).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::METHOD_NOT_ALLOWED);
    p.stop().await;
}

/// The store may send a create's slug claim twice (speculative execution, when a node is slow
/// to answer); the copy that loses must find exactly the link it was writing, which the create
/// then takes as its own (`api::create`). So every field must come back from the store as it
/// was written.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_slug_claim_sent_twice_finds_exactly_its_own_link() {
    let infra = Infra::from_env();
    let ks = fresh_keyspace(&infra).await;
    let p = spawn_primary(&infra, &ks, &[], None).await;
    let links = &p.state.store.links;
    let link = zlink_store::Link {
        key: "brand.example/twice".into(),
        url: "https://example.com/twice?a=1&b=<2>".into(),
        owner: "alice".into(),
        status: zlink_wire::LinkStatus::Active,
        redirect_code: 307,
        created_at_ms: 1_795_000_000_123,
        expires_at_ms: Some(1_895_000_000_456),
        version: 1,
        idem: Some("c0ffee".into()),
        disabled_by: None,
        alias: Some("twice, again".into()),
    };
    assert!(
        links.insert_if_absent(&link).await.unwrap(),
        "the first copy applies"
    );
    assert!(
        !links.insert_if_absent(&link).await.unwrap(),
        "the second copy does not"
    );
    assert_eq!(
        links.get_serial(&link.key).await.unwrap().as_ref(),
        Some(&link),
        "and finds the very link it was writing"
    );
    // A different link under the same slug is not taken for it.
    let other = zlink_store::Link {
        url: "https://example.com/other".into(),
        ..link.clone()
    };
    assert!(!links.insert_if_absent(&other).await.unwrap());
    assert_ne!(
        links.get_serial(&link.key).await.unwrap().as_ref(),
        Some(&other)
    );
    p.stop().await;
}
