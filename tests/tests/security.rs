//! Abuse resistance through the real API (SYSTEM.md invariant 13): every destination in the
//! bad-destination corpus (tests/corpus/bad-destinations.txt, every class the policy refuses)
//! gets a 422 JSON error with a stable code and stores nothing; the operator's deny list is
//! re-read while the primary runs; the allow list admits an internal host on purpose.

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
