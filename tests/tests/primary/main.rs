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
mod input;
mod listing;
mod openapi;
mod qr;

async fn get(url: &str) -> reqwest::Response {
    client().get(url).send().await.expect("request")
}

fn location(r: &reqwest::Response) -> Option<String> {
    r.headers()
        .get("location")
        .map(|v| v.to_str().unwrap().to_string())
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
        .filter(|e| e.slug == "to-delete")
        .map(|e| (e.kind, e.version))
        .collect();
    assert_eq!(
        kinds,
        vec![(LinkEventKind::Created, 1), (LinkEventKind::Deleted, 2)]
    );
    a.stop().await;
    b.stop().await;
}

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
    let body: Value = client()
        .get(format!("{}/api/v1/links/move-me", a.base))
        .bearer_auth(&alice)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
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
    let body: Value = client()
        .get(format!("{}/api/v1/links/move-me", a.base))
        .bearer_auth(&alice)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
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
    let meta: Value = client()
        .get(p.url("/api/v1/links/short-lived"))
        .bearer_auth(&key)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(meta["status"], "EXPIRED");
    assert_eq!(
        patch_status(&p.base, &key, "short-lived", "DISABLED")
            .await
            .status(),
        StatusCode::CONFLICT
    );
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
        slug: "brand.example/twice".into(),
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
        links.get_serial(&link.slug).await.unwrap().as_ref(),
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
        links.get_serial(&link.slug).await.unwrap().as_ref(),
        Some(&other)
    );
    p.stop().await;
}
