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

mod keys;
mod races_and_limits;

const CORPUS: &str = include_str!("../../../corpus/bad-destinations.txt");

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
    let got: Value = get_json(&p.url("/api/v1/links/take-me"), &owner).await;
    assert_eq!(got["status"], "DISABLED");
    assert_eq!(got["disabled_by"], "admin", "the owner sees why");
    // Only an admin lifts it.
    let (s, _) = status_of(&p.base, &admin, "take-me", "ACTIVE").await;
    assert_eq!(s, StatusCode::OK);
    let r = client().get(p.url("/take-me")).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::FOUND);
}

async fn post_json(url: &str, key: &str, body: Value, xff: Option<&str>) -> reqwest::Response {
    let mut r = client().post(url).bearer_auth(key).json(&body);
    if let Some(ip) = xff {
        r = r.header("x-forwarded-for", ip);
    }
    r.send().await.unwrap()
}
