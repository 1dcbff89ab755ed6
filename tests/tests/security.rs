//! Abuse resistance through the real API (SYSTEM.md invariant 13): every destination in the
//! bad-destination corpus (tests/corpus/bad-destinations.txt, every class the policy refuses)
//! gets a 422 JSON error with a stable code and stores nothing; the operator's deny list is
//! re-read while the primary runs; the allow list admits an internal host on purpose. Bad
//! slugs, takedowns that stick (and the cache-fill race they must win), rate limits, the keys
//! API and random-slug scans.

use reqwest::StatusCode;
use serde_json::{json, Value};
use std::time::Duration;
use zlink_e2e::*;

const CORPUS: &str = include_str!("../corpus/bad-destinations.txt");

fn corpus() -> Vec<&'static str> {
    CORPUS
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_destinations_get_422_json_and_store_nothing_and_the_deny_list_is_reread() {
    // Arrange: the policy the corpus is written for.
    let infra = Infra::from_env();
    let ks = fresh_keyspace(&infra).await;
    let dir = TempDir::new("policy");
    let deny = dir.path().join("deny.txt");
    let allow = dir.path().join("allow.txt");
    std::fs::write(&deny, "# operator deny list\nevil.example\n203.0.113.7\n").unwrap();
    std::fs::write(&allow, "wiki.corp\n10.1.2.3\n").unwrap();
    let (deny_s, allow_s) = (deny.display().to_string(), allow.display().to_string());
    let p = spawn_primary(
        &infra,
        &ks,
        &[
            "--short-domains",
            "zl.example,go.example.org",
            "--deny-hosts-file",
            &deny_s,
            "--allow-hosts-file",
            &allow_s,
        ],
        None,
    )
    .await;
    let key = create_key(&p.state, "mallory", false).await;
    let create = |url: String, slug: Option<String>| {
        let mut body = json!({ "url": url });
        if let Some(s) = slug {
            body["slug"] = json!(s);
        }
        client()
            .post(p.url("/api/v1/links"))
            .bearer_auth(&key)
            .json(&body)
            .send()
    };

    // Act + assert: every bad destination, as an auto and as a custom slug.
    let bad = corpus();
    assert!(bad.len() >= 60, "the corpus covers every class");
    for (i, url) in bad.iter().enumerate() {
        for slug in [None, Some(format!("bad-{i}"))] {
            let r = create(url.to_string(), slug).await.unwrap();
            assert_eq!(r.status(), StatusCode::UNPROCESSABLE_ENTITY, "{url}");
            let body: Value = r.json().await.unwrap();
            let code = body["error"]["code"].as_str().unwrap_or("");
            assert!(
                code.starts_with("destination_") || code == "invalid_url",
                "{url}: a stable code, got {body}"
            );
            assert!(body["error"]["message"].is_string(), "{url}");
        }
    }
    assert_eq!(count_rows(&infra, &ks, "links").await, 0, "nothing stored");
    assert_eq!(
        count_rows(&infra, &ks, "outbox").await,
        0,
        "nothing to replicate"
    );

    // The allow list admits an internal host on purpose; public hosts pass.
    for url in [
        "https://wiki.corp/runbook",
        "http://10.1.2.3/",
        "https://example.com/",
    ] {
        let r = create(url.to_string(), None).await.unwrap();
        assert_eq!(r.status(), StatusCode::CREATED, "{url}");
    }

    // The operator changes the deny list: the running primary follows within seconds (the
    // probe uses a custom slug, so the polls before the reload leave one link at most).
    std::fs::write(&deny, "example.com\n").unwrap();
    let refused = eventually(Duration::from_secs(10), || async {
        let s = create(
            "https://www.example.com/x".into(),
            Some("deny-probe".into()),
        )
        .await
        .unwrap()
        .status();
        s == StatusCode::UNPROCESSABLE_ENTITY
    })
    .await;
    assert!(
        refused,
        "a host added to the deny list is refused without a restart"
    );
    let r = create("https://evil.example/".into(), None).await.unwrap();
    assert_eq!(
        r.status(),
        StatusCode::CREATED,
        "a host removed from it is allowed"
    );
    let n = count_rows(&infra, &ks, "links").await;
    assert!((4..=5).contains(&n), "only the allowed creates stored: {n}");
}

/// Slugs that must never be created: wrong length, characters outside `[A-Za-z0-9_-]`,
/// reserved words (any case), the auto-slug shape, encodings and traversal attempts.
const BAD_SLUGS: &[&str] = &[
    "",
    "ab",
    "a",
    "x-64-chars-is-the-limit-so-this-one-with-sixty-five-characters-xx",
    "has space",
    "semi;colon",
    "sl/ash",
    "back\\slash",
    "..",
    "../etc",
    "%2e%2e",
    "dot.dot",
    "tab\there",
    "new\nline",
    "nul\0byte",
    "émoji😀",
    "ｆｕｌｌｗｉｄｔｈ",
    "<script>",
    "quote\"d",
    "api",
    "API",
    "metrics",
    "Healthz",
    "readyz",
    "stats",
    "Abc1234",
    "abcdefg",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_slugs_get_422_json_store_nothing_and_never_crash_a_redirect() {
    let infra = Infra::from_env();
    let ks = fresh_keyspace(&infra).await;
    let p = spawn_primary(&infra, &ks, &[], None).await;
    let key = create_key(&p.state, "mallory", false).await;
    for slug in BAD_SLUGS {
        let r = create(
            &p.base,
            &key,
            json!({"url": "https://example.com/", "slug": slug}),
        )
        .await;
        assert_eq!(r.status(), StatusCode::UNPROCESSABLE_ENTITY, "{slug:?}");
        let body: Value = r.json().await.unwrap();
        assert_eq!(body["error"]["code"], "invalid_slug", "{slug:?}: {body}");
    }
    assert_eq!(count_rows(&infra, &ks, "links").await, 0, "nothing stored");
    // As a path, each is a 404 (or 405/400 for what HTTP itself refuses), JSON, never a crash.
    for path in [
        "/..%2f..%2fetc%2fpasswd",
        "/%00",
        "/%E2%80%AE",
        "/a%20b",
        "/abc%2F",
        "/ab",
        "/api",
        "/metrics+",
        &format!("/{}", "x".repeat(4000)),
    ] {
        let r = client().get(p.url(path)).send().await.unwrap();
        assert!(r.status().is_client_error(), "{path}: {}", r.status());
        if r.status() == StatusCode::NOT_FOUND {
            let body: Value = r.json().await.unwrap();
            assert_eq!(body["error"]["code"], "not_found", "{path}");
        }
    }
    let r = client().get(p.url("/healthz")).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::OK, "still alive");
}

async fn status_of(base: &str, key: &str, slug: &str, status: &str) -> (StatusCode, Value) {
    let r = patch_status(base, key, slug, status).await;
    let s = r.status();
    (s, r.json().await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admin_takedown_sticks_the_owner_cannot_undo_it() {
    let infra = Infra::from_env();
    let ks = fresh_keyspace(&infra).await;
    let p = spawn_primary(&infra, &ks, &["--memcached", &infra.memcached], None).await;
    let owner = create_key(&p.state, "alice", false).await;
    let admin = create_key(&p.state, "ops", true).await;
    let c = create(
        &p.base,
        &owner,
        json!({"url": "https://example.com/t", "slug": "take-me"}),
    )
    .await;
    assert_eq!(c.status(), StatusCode::CREATED);

    // The owner's own disable is theirs to undo.
    let (s, body) = status_of(&p.base, &owner, "take-me", "DISABLED").await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(body["disabled_by"], "owner");
    let (s, body) = status_of(&p.base, &owner, "take-me", "ACTIVE").await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(body["disabled_by"], Value::Null);

    // An admin's disable is a takedown.
    let (s, body) = status_of(&p.base, &admin, "take-me", "DISABLED").await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(body["disabled_by"], "admin");
    let r = client().get(p.url("/take-me")).send().await.unwrap();
    assert_eq!(
        r.status(),
        StatusCode::GONE,
        "410 as soon as the PATCH answered"
    );
    let (s, body) = status_of(&p.base, &owner, "take-me", "ACTIVE").await;
    assert_eq!(s, StatusCode::FORBIDDEN, "{body}");
    assert_eq!(body["error"]["code"], "taken_down");
    let r = client().get(p.url("/take-me")).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::GONE, "still gone");
    let got: Value = client()
        .get(p.url("/api/v1/links/take-me"))
        .bearer_auth(&owner)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(got["status"], "DISABLED");
    assert_eq!(got["disabled_by"], "admin", "the owner sees why");
    // Only an admin lifts it.
    let (s, _) = status_of(&p.base, &admin, "take-me", "ACTIVE").await;
    assert_eq!(s, StatusCode::OK);
    let r = client().get(p.url("/take-me")).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::FOUND);
}

/// The race a takedown must win: another primary keeps filling memcached from the store while
/// the PATCH runs. Fills use `add`, the change uses `set`: when the PATCH answers, memcached
/// holds the new state, and a fill that read the old row cannot put it back.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cache_fill_racing_a_status_change_never_restores_the_old_answer() {
    use zlink_clients::breaker::{Breaker, BreakerConfig};
    use zlink_clients::memcache::Memcache;
    let infra = Infra::from_env();
    let ks = fresh_keyspace(&infra).await;
    let mc_flags = ["--memcached", &infra.memcached];
    let a = spawn_primary(&infra, &ks, &mc_flags, None).await;
    // b forgets its in-process entry after 1 ms, so nearly every request goes to memcached and,
    // on a miss, to the store and back into memcached: fills all the time.
    let b = spawn_primary(
        &infra,
        &ks,
        &["--memcached", &infra.memcached, "--local-cache-ttl-ms", "1"],
        None,
    )
    .await;
    let admin = create_key(&a.state, "ops", true).await;
    let c = create(
        &a.base,
        &admin,
        json!({"url": "https://example.com/race", "slug": "race-me"}),
    )
    .await;
    assert_eq!(c.status(), StatusCode::CREATED);
    let mc = std::sync::Arc::new(Memcache::new(
        infra.memcached.clone(),
        1,
        Duration::from_secs(1),
        Breaker::new(
            "memcached",
            BreakerConfig {
                failures_to_open: 100,
                open_for: Duration::from_millis(10),
            },
            None,
        ),
    ));
    let mc_key = format!("zl:{ks}:race-me");
    let cached = || {
        let (mc, k) = (mc.clone(), mc_key.clone());
        async move {
            let v: Value = mc.get_json(&k).await.unwrap().expect("an entry");
            (
                v["status"].as_str().unwrap().to_string(),
                v["ver"].as_i64().unwrap(),
            )
        }
    };

    let stop = tokio_util::sync::CancellationToken::new();
    let mut hammer = tokio::task::JoinSet::new();
    for _ in 0..4 {
        let (u, stop) = (b.url("/race-me"), stop.clone());
        hammer.spawn(async move {
            let mut n = 0u64;
            while !stop.is_cancelled() && n < 200_000 {
                let r = client().get(&u).send().await.unwrap();
                assert!(
                    [StatusCode::FOUND, StatusCode::GONE].contains(&r.status()),
                    "{}",
                    r.status()
                );
                n += 1;
            }
            n
        });
    }
    for round in 0..20 {
        let to = if round % 2 == 0 { "DISABLED" } else { "ACTIVE" };
        let (s, body) = status_of(&a.base, &admin, "race-me", to).await;
        assert_eq!(s, StatusCode::OK, "{body}");
        let version = body["version"].as_i64().unwrap();
        // Right after the PATCH, and again after fills kept racing for a while.
        for _ in 0..2 {
            assert_eq!(
                cached().await,
                (to.to_string(), version),
                "round {round}: memcached holds the new state"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    stop.cancel();
    let mut redirects = 0;
    while let Some(n) = hammer.join_next().await {
        redirects += n.unwrap();
    }
    assert!(redirects > 100, "the fills really raced: {redirects}");
    // The last round left it ACTIVE (round 19). A fill carrying an older version loses too.
    let (status, version) = cached().await;
    assert_eq!(status, "ACTIVE");
    let stale = json!({"url": "https://example.com/race", "status": "DISABLED", "code": 302, "exp": null, "ver": version - 1});
    assert!(!mc
        .add(&mc_key, stale.to_string().as_bytes(), 60)
        .await
        .unwrap());
    assert_eq!(cached().await, (status, version));
    let r = client().get(b.url("/race-me")).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::FOUND);
}

async fn post_json(url: &str, key: &str, body: Value, xff: Option<&str>) -> reqwest::Response {
    let mut r = client().post(url).bearer_auth(key).json(&body);
    if let Some(ip) = xff {
        r = r.header("x-forwarded-for", ip);
    }
    r.send().await.unwrap()
}

fn assert_limited(r: &reqwest::Response) {
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    let after: u64 = r.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=60).contains(&after), "Retry-After {after}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rate_limits_per_key_and_per_address_answer_429_with_retry_after() {
    let infra = Infra::from_env();
    let ks = fresh_keyspace(&infra).await;
    let p = spawn_primary(
        &infra,
        &ks,
        &[
            "--limit-writes-per-key",
            "10/s:50",
            "--limit-writes-per-ip",
            "5/s:5",
            "--limit-unknown-keys-per-ip",
            "1/s:3",
            "--limit-info-per-ip",
            "1/s:3",
        ],
        None,
    )
    .await;
    let owner = create_key(&p.state, "bulk", false).await;
    let admin = create_key(&p.state, "ops", true).await;
    let links = p.url("/api/v1/links");

    // 1,000 creates from one key as fast as one client sends them (from the exempt address,
    // so only the per-key limit applies): the burst and the sustained rate get 201, the
    // excess 429 with Retry-After and a JSON error, and only what got 201 is stored.
    let started = std::time::Instant::now();
    let (mut created, mut limited) = (0u64, 0u64);
    for i in 0..1000 {
        let r = post_json(
            &links,
            &owner,
            json!({"url": format!("https://example.com/{i}")}),
            None,
        )
        .await;
        match r.status() {
            StatusCode::CREATED => created += 1,
            StatusCode::TOO_MANY_REQUESTS => {
                assert_limited(&r);
                let body: Value = r.json().await.unwrap();
                assert_eq!(body["error"]["code"], "rate_limited");
                limited += 1;
            }
            s => panic!("create {i}: {s}"),
        }
    }
    let secs = started.elapsed().as_secs_f64();
    println!("1000 creates from one key in {secs:.1} s: {created} created, {limited} limited");
    assert_eq!(created + limited, 1000);
    let allowed = 50.0 + 10.0 * secs;
    assert!(
        created >= 50 && (created as f64) <= allowed + 1.0,
        "{created} created in {secs:.1} s"
    );
    assert_eq!(count_rows(&infra, &ks, "links").await, created as i64);
    // Admin keys are not limited per key.
    let r = post_json(
        &links,
        &admin,
        json!({"url": "https://example.com/admin"}),
        None,
    )
    .await;
    assert_eq!(r.status(), StatusCode::CREATED);

    // Per client address (as the trusted proxy reports it), whatever the key: 5 then 429.
    let codes: Vec<StatusCode> = {
        let mut v = Vec::new();
        for _ in 0..8 {
            // The admin key: its writes are not limited per key, only per address.
            let r = post_json(
                &links,
                &admin,
                json!({"url": "https://example.com/ip"}),
                Some("203.0.113.9"),
            )
            .await;
            if r.status() == StatusCode::TOO_MANY_REQUESTS {
                assert_limited(&r);
            }
            v.push(r.status());
        }
        v
    };
    assert!(
        codes[..5]
            .iter()
            .all(|s| *s != StatusCode::TOO_MANY_REQUESTS),
        "{codes:?}"
    );
    assert!(
        codes[5..]
            .iter()
            .all(|s| *s == StatusCode::TOO_MANY_REQUESTS),
        "{codes:?}"
    );

    // Unknown bearer tokens, per address, before any store read: 401 × 3, then 429.
    let mut codes = Vec::new();
    for i in 0..6 {
        let token = format!("zl_{:016x}_{}", i, "0".repeat(64));
        let r = post_json(
            &links,
            &token,
            json!({"url": "https://example.com/"}),
            Some("198.51.100.1"),
        )
        .await;
        codes.push(r.status());
    }
    assert_eq!(&codes[..3], &[StatusCode::UNAUTHORIZED; 3], "{codes:?}");
    assert_eq!(
        &codes[3..],
        &[StatusCode::TOO_MANY_REQUESTS; 3],
        "{codes:?}"
    );
    // A key this primary already knows is not subject to the unknown-token limit.
    let r = client()
        .get(p.url("/api/v1/links/nope"))
        .bearer_auth(&owner)
        .header("x-forwarded-for", "198.51.100.77")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NOT_FOUND);

    // Info pages per address.
    let r = post_json(
        &links,
        &admin,
        json!({"url": "https://example.com/info", "slug": "info-me"}),
        None,
    )
    .await;
    assert_eq!(r.status(), StatusCode::CREATED);
    let mut codes = Vec::new();
    for _ in 0..5 {
        let r = client()
            .get(p.url("/info-me+"))
            .header("x-forwarded-for", "192.0.2.44")
            .send()
            .await
            .unwrap();
        codes.push(r.status());
    }
    assert_eq!(&codes[..3], &[StatusCode::OK; 3], "{codes:?}");
    assert_eq!(
        &codes[3..],
        &[StatusCode::TOO_MANY_REQUESTS; 2],
        "{codes:?}"
    );
    // Redirects are not limited here (nginx limits them per address, generously).
    for _ in 0..50 {
        let r = client()
            .get(p.url("/info-me"))
            .header("x-forwarded-for", "192.0.2.44")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::FOUND);
    }
    let m = metric_sum(&p.url("/metrics"), "zlink_primary_rate_limited_total").await;
    assert_eq!(m, (limited + 3 + 3 + 2) as f64, "every 429 counted");
}

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
        assert_eq!(r.status(), StatusCode::NOT_FOUND, "{slug}");
    }
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
