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

/// Invariant 9: a corpus of bad requests, each answered 4xx with a JSON error; nothing stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bad_input_gets_4xx_json_and_stores_nothing() {
    let infra = Infra::from_env();
    let ks = fresh_keyspace(&infra).await;
    let p = spawn_primary(&infra, &ks, &[], None).await;
    let key = create_key(&p.state, "alice", false).await;
    let links = p.url("/api/v1/links");
    let c = client();
    let json_post = |body: String| {
        c.post(&links)
            .bearer_auth(&key)
            .header("content-type", "application/json")
            .body(body)
    };

    let mut cases: Vec<(&str, reqwest::RequestBuilder, u16)> = Vec::new();
    for url in [
        "javascript:alert(1)",
        "ftp://example.com/",
        "data:text/html,<script>alert(1)</script>",
        "//example.com",
        "example.com",
        "https://",
        "https://exa mple.com/",
        "https://example.com/\r\nSet-Cookie: x=1",
        "https://example.com/\u{0}",
        "https://example.com/\u{202E}exe.pdf",
        "https://user:pass@example.com/",
        "",
    ] {
        cases.push(("bad url", json_post(json!({"url": url}).to_string()), 422));
    }
    cases.push((
        "url too long",
        json_post(json!({"url": format!("https://e.com/{}", "a".repeat(8200))}).to_string()),
        422,
    ));
    for slug in [
        "ab",
        "has space",
        "../../etc",
        "<script>",
        "semi;colon",
        "api",
        "HEALTHZ",
        "abcDEF1",
        "é-slug",
        &"x".repeat(65),
    ] {
        cases.push((
            "bad slug",
            json_post(json!({"url": "https://e.com/", "slug": slug}).to_string()),
            422,
        ));
    }
    for exp in ["yesterday", "2001-01-01T00:00:00Z", "3000-01-01T00:00:00Z"] {
        cases.push((
            "bad expiry",
            json_post(json!({"url": "https://e.com/", "expires_at": exp}).to_string()),
            422,
        ));
    }
    cases.push((
        "bad code",
        json_post(json!({"url": "https://e.com/", "redirect_code": 200}).to_string()),
        422,
    ));
    cases.push((
        "unknown field",
        json_post(json!({"url": "https://e.com/", "owner": "root"}).to_string()),
        422,
    ));
    cases.push((
        "url not a string",
        json_post(json!({"url": 5}).to_string()),
        422,
    ));
    cases.push(("missing url", json_post("{}".into()), 422));
    cases.push(("not json", json_post("{\"url\":".into()), 400));
    cases.push((
        "binary",
        json_post(String::from_utf8_lossy(&[0xff, 0xfe, 0x00]).into_owned()),
        400,
    ));
    cases.push((
        "too large",
        json_post(format!(
            "{{\"url\":\"https://e.com/{}\"}}",
            "a".repeat(20_000)
        )),
        413,
    ));
    cases.push((
        "wrong content type",
        c.post(&links)
            .bearer_auth(&key)
            .header("content-type", "text/plain")
            .body("{}"),
        415,
    ));
    cases.push((
        "no auth",
        c.post(&links).json(&json!({"url": "https://e.com/"})),
        401,
    ));
    cases.push((
        "unknown key",
        c.post(&links)
            .bearer_auth("zl_0000_0000")
            .json(&json!({"url": "https://e.com/"})),
        401,
    ));
    cases.push((
        "not bearer",
        c.post(&links)
            .header("authorization", format!("Basic {key}"))
            .json(&json!({"url": "https://e.com/"})),
        401,
    ));
    cases.push((
        "bad idempotency key",
        c.post(&links)
            .bearer_auth(&key)
            .header("idempotency-key", "a".repeat(300))
            .json(&json!({"url": "https://e.com/"})),
        422,
    ));
    cases.push((
        "wrong method",
        c.put(&links)
            .bearer_auth(&key)
            .json(&json!({"url": "https://e.com/"})),
        405,
    ));

    for (what, req, want) in cases {
        let r = req.send().await.unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_eq!(r.status().as_u16(), want, "{what}");
        assert_eq!(r.headers()["content-type"], "application/json", "{what}");
        let body: Value = r
            .json()
            .await
            .unwrap_or_else(|e| panic!("{what}: body is not JSON: {e}"));
        assert!(
            body["error"]["code"].is_string() && body["error"]["message"].is_string(),
            "{what}: {body}"
        );
    }
    assert_eq!(count_rows(&infra, &ks, "links").await, 0);
    assert_eq!(count_rows(&infra, &ks, "idempotency").await, 0);
    // The process is still serving.
    assert_eq!(get(&p.url("/healthz")).await.status(), StatusCode::OK);
    p.stop().await;
}

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
}
