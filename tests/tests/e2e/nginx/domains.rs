//! Branded short domains on every rung: the same slug on the default domain and on a branded
//! one leads to two destinations through the frontend (rung 1), the last-resort host (rung 2)
//! and that host's nginx straight from S3 (rung 3); an unregistered host gets 404 on every rung;
//! a disabled branded link is 410 on every rung; rung-3 clicks carry the branded key.

use reqwest::StatusCode;
use serde_json::{json, Value};
use std::collections::HashSet;
use std::time::Duration;
use zlink_e2e::*;

const BRAND: &str = "go.brand.example";
/// The default domain's name besides IP literals (`--short-domains`).
const SHORT: &str = "zl.test";

async fn get_on(url: &str, host: &str) -> reqwest::Response {
    client()
        .get(url)
        .header("host", host)
        .header("user-agent", "Mozilla/5.0 (X11; Linux x86_64) domains")
        .send()
        .await
        .unwrap()
}

pub(super) async fn post(base: &str, path: &str, key: &str, body: Value) -> (StatusCode, Value) {
    let r = client()
        .post(format!("{base}{path}"))
        .bearer_auth(key)
        .json(&body)
        .send()
        .await
        .unwrap();
    (r.status(), r.json().await.unwrap_or(Value::Null))
}

/// (host, path) → the answer every rung must give: a redirect to a URL, 404 or 410.
#[derive(Clone, Debug)]
enum Want {
    To(String),
    NotFound,
    Gone,
}

/// Checks each case through `base`; `rung3` when the answer is the S3 page (200, meta refresh).
async fn check_all(base: &str, cases: &[(&str, &str, Want)], rung3: bool, tier: &str) {
    for (host, slug, want) in cases {
        let r = get_on(&format!("{base}/{slug}"), host).await;
        let status = r.status();
        let h = r.headers().clone();
        let body = r.text().await.unwrap();
        let what = format!("{host}/{slug} on {tier}: {status} {h:?} {body}");
        match want {
            Want::To(url) if rung3 => {
                assert_eq!(status, StatusCode::OK, "{what}");
                assert!(body.contains("http-equiv=\"refresh\""), "{what}");
                assert!(body.contains(&url.replace('&', "&amp;")), "{what}");
            }
            Want::To(url) => {
                assert_eq!(status, StatusCode::FOUND, "{what}");
                assert_eq!(h["location"], url.as_str(), "{what}");
            }
            Want::NotFound => assert_eq!(status, StatusCode::NOT_FOUND, "{what}"),
            Want::Gone => assert_eq!(status, StatusCode::GONE, "{what}"),
        }
        if matches!(want, Want::To(_)) {
            assert_eq!(h["x-zlink-tier"], tier, "{what}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn branded_domain_links_answer_on_rungs_1_2_3_and_unknown_hosts_get_404() {
    // Arrange: a primary and the replicator; the admin registers BRAND (active at once), an
    // owner registers another name (pending until approved).
    let infra = Infra::from_env();
    let (ks, n, topic) = pipeline_keyspace(&infra).await;
    let mut flags: Vec<&str> = kafka_flags(&infra, &n, &topic).to_vec();
    flags.extend(["--short-domains", SHORT]);
    let p = spawn_primary(&infra, &ks, &flags, None).await;
    let replicator = spawn_replicator(&infra, &ks, &infra.kafka).await;
    let admin = create_key(&p.state, "ops", true).await;
    let alice = create_key(&p.state, "alice", false).await;
    let bob = create_key(&p.state, "bob", false).await;

    let (s, d) = post(
        &p.base,
        "/api/v1/domains",
        &admin,
        json!({"domain": "Go.Brand.Example."}),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED, "{d}");
    assert_eq!(
        (d["domain"].as_str(), d["status"].as_str()),
        (Some(BRAND), Some("ACTIVE"))
    );
    let (s, d) = post(&p.base, "/api/v1/domains", &admin, json!({"domain": BRAND})).await;
    assert_eq!(s, StatusCode::OK, "registering twice changes nothing: {d}");
    let (s, d) = post(&p.base, "/api/v1/domains", &alice, json!({"domain": BRAND})).await;
    assert_eq!(
        (s, d["error"]["code"].as_str()),
        (StatusCode::CONFLICT, Some("domain_taken"))
    );
    for bad in ["not a domain", "localhost", "10.0.0.1", SHORT, "x"] {
        let (s, d) = post(&p.base, "/api/v1/domains", &alice, json!({"domain": bad})).await;
        assert_eq!(
            (s, d["error"]["code"].as_str()),
            (StatusCode::UNPROCESSABLE_ENTITY, Some("invalid_domain")),
            "{bad}: {d}"
        );
    }
    let (s, d) = post(
        &p.base,
        "/api/v1/domains",
        &alice,
        json!({"domain": "links.alice.example"}),
    )
    .await;
    assert_eq!(
        (s, d["status"].as_str()),
        (StatusCode::CREATED, Some("PENDING")),
        "{d}"
    );
    let pending =
        json!({"url": "https://alice.example/x", "slug": "first", "domain": "links.alice.example"});
    let r = create(&p.base, &alice, pending.clone()).await;
    assert_eq!(r.status(), StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(
        r.json::<Value>().await.unwrap()["error"]["code"],
        "domain_pending"
    );
    let r = create(
        &p.base,
        &bob,
        json!({"url": "https://b.example/", "domain": "links.alice.example"}),
    )
    .await;
    assert_eq!(
        r.json::<Value>().await.unwrap()["error"]["code"],
        "unknown_domain",
        "not bob's"
    );
    let (s, _) = post(
        &p.base,
        "/api/v1/domains/links.alice.example/approve",
        &alice,
        json!({}),
    )
    .await;
    assert_eq!(s, StatusCode::FORBIDDEN, "only an admin approves");
    let (s, d) = post(
        &p.base,
        "/api/v1/domains/links.alice.example/approve",
        &admin,
        json!({}),
    )
    .await;
    assert_eq!(
        (s, d["status"].as_str()),
        (StatusCode::OK, Some("ACTIVE")),
        "{d}"
    );
    assert_eq!(
        create(&p.base, &alice, pending).await.status(),
        StatusCode::CREATED
    );
    let r = client()
        .get(p.url("/api/v1/domains"))
        .bearer_auth(&alice)
        .send()
        .await
        .unwrap();
    let listed: Value = r.json().await.unwrap();
    assert_eq!(
        listed["domains"][0]["domain"], "links.alice.example",
        "{listed}"
    );

    // The same slug on two domains: two links, two destinations. A link to a branded domain
    // is a link to a link: refused like one to the default domain.
    let (plain, branded) = (
        "https://example.com/plain?a=1&b=2",
        "https://example.com/brand?c=3",
    );
    let r = create(&p.base, &admin, json!({"url": plain, "slug": "promo"})).await;
    assert_eq!(r.status(), StatusCode::CREATED);
    let r = create(
        &p.base,
        &admin,
        json!({"url": branded, "slug": "promo", "domain": BRAND}),
    )
    .await;
    assert_eq!(r.status(), StatusCode::CREATED);
    let made: Value = r.json().await.unwrap();
    assert_eq!(
        (
            made["slug"].as_str(),
            made["domain"].as_str(),
            made["short_url"].as_str()
        ),
        (
            Some("promo"),
            Some(BRAND),
            Some("http://go.brand.example/promo")
        )
    );
    let r = create(
        &p.base,
        &admin,
        json!({"url": "https://example.com/x", "slug": "promo", "domain": BRAND}),
    )
    .await;
    assert_eq!(
        r.status(),
        StatusCode::CONFLICT,
        "unique per (domain, slug)"
    );
    let r = create(
        &p.base,
        &admin,
        json!({"url": "https://sub.go.brand.example/promo"}),
    )
    .await;
    assert_eq!(
        r.json::<Value>().await.unwrap()["error"]["code"],
        "destination_own_domain"
    );
    // A name near DNS's 253-character limit: its memcached keys are hashed (over 250 bytes).
    let long = format!(
        "{}.{}.{}.{}.example",
        "a".repeat(60),
        "b".repeat(60),
        "c".repeat(60),
        "d".repeat(50)
    );
    let (s, _) = post(&p.base, "/api/v1/domains", &admin, json!({"domain": long})).await;
    assert_eq!(s, StatusCode::CREATED);
    let long_url = "https://example.com/long";
    let r = create(
        &p.base,
        &admin,
        json!({"url": long_url, "slug": "promo", "domain": long}),
    )
    .await;
    assert_eq!(r.status(), StatusCode::CREATED);
    let r = create(
        &p.base,
        &admin,
        json!({"url": "https://example.com/gone", "slug": "gone", "domain": BRAND}),
    )
    .await;
    assert_eq!(r.status(), StatusCode::CREATED);
    let r = client()
        .patch(p.url(&format!("/api/v1/links/gone?domain={BRAND}")))
        .bearer_auth(&admin)
        .json(&json!({"status": "DISABLED"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let r = client()
        .get(p.url(&format!("/api/v1/links/promo?domain={BRAND}")))
        .bearer_auth(&admin)
        .send()
        .await
        .unwrap();
    assert_eq!(r.json::<Value>().await.unwrap()["url"], branded);
    let r = client()
        .get(p.url("/api/v1/links/promo"))
        .bearer_auth(&admin)
        .send()
        .await
        .unwrap();
    assert_eq!(r.json::<Value>().await.unwrap()["url"], plain);
    let r = client()
        .get(p.url(&format!("/api/v1/links?domain={BRAND}")))
        .bearer_auth(&admin)
        .send()
        .await
        .unwrap();
    let page: Value = r.json().await.unwrap();
    let slugs: HashSet<&str> = page["links"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["slug"].as_str().unwrap())
        .collect();
    assert_eq!(slugs, HashSet::from(["promo", "gone"]), "{page}");
    // S3 keys: `<prefix><slug>` and `<prefix><domain>/<slug>`; the disabled one's tombstone.
    let long_key = format!("{long}/promo");
    for key in [
        "promo",
        "go.brand.example/promo",
        ".gone/go.brand.example/gone",
        &long_key,
    ] {
        assert!(
            eventually_ok(&infra.blob_url(&n.s3_prefix, key), Duration::from_secs(10)).await,
            "{key} in S3"
        );
    }

    // The ladder: frontend → primary, then the last-resort host.
    let (lr_host, lr) = LastResortHost::start(&infra, &n.s3_prefix, &topic, &[SHORT]).await;
    let (lr_nginx, click_log) = (&lr_host.nginx, &lr_host.click_log);
    let fe = OwnNginx::start(
        "frontend.conf",
        &[
            (
                "PRIMARY_SERVERS",
                upstream_servers(&[hostport(&p.base)], "max_fails=1 fail_timeout=5s"),
            ),
            (
                "LASTRESORT_HOST_SERVERS",
                upstream_servers(&[lr_nginx.tls_hostport()], "max_fails=1 fail_timeout=5s"),
            ),
        ],
    )
    .await;
    let ip = hostport(&fe.base);
    let cases = [
        (ip.as_str(), "promo", Want::To(plain.into())),
        (SHORT, "promo", Want::To(plain.into())),
        ("localhost", "promo", Want::To(plain.into())),
        (BRAND, "promo", Want::To(branded.into())),
        ("GO.BRAND.EXAMPLE:80", "promo", Want::To(branded.into())),
        ("unknown.example", "promo", Want::NotFound),
        ("other.brand.example", "promo", Want::NotFound),
        (BRAND, "gone", Want::Gone),
        (long.as_str(), "promo", Want::To(long_url.into())),
        (ip.as_str(), "gone", Want::NotFound),
    ];

    // Act/Assert, rung 1: the primary answers per domain.
    check_all(&fe.base, &cases, false, "primary").await;
    let r = get_on(&fe.url("/promo+"), BRAND).await;
    assert!(
        r.text()
            .await
            .unwrap()
            .contains("http://go.brand.example/promo"),
        "the info page"
    );

    // Rung 2: the primary gone; the last-resort host gives the same answers.
    p.stop().await;
    check_all(&fe.base, &cases, false, "lastresort").await;

    // Rung 3: the lastresort process gone too; its host's nginx maps the Host to the S3 folder.
    lr.kill().await;
    check_all(&fe.base, &cases, true, "lastresort-nginx").await;
    // The rung-3 click of the branded link is logged under its key.
    let r = get_on(&fe.url("/promo"), BRAND).await;
    let id: uuid::Uuid = r.headers()["x-zlink-click-id"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    let lr = lr_host.lastresort(&infra).await;
    let (_, events) = clicks_in_kafka(&infra.kafka, &topic, &HashSet::from([id])).await;
    let ev = events
        .iter()
        .find(|e| e.id == id)
        .expect("the rung-3 click in Kafka");
    assert_eq!(ev.key, "go.brand.example/promo");

    // A lastresort host whose processes are all down from the start: rung 3 directly.
    let mut direct = lastresort_host_values(dead_server(), &infra, &n.s3_prefix, click_log);
    direct.push(("DEFAULT_HOSTS", default_hosts(&[SHORT])));
    let direct = OwnNginx::start("lastresort.conf", &direct).await;
    check_all(&direct.base, &cases[3..], true, "lastresort-nginx").await;
    assert!(lr.terminate().await.success());
    replicator.stop().await;
}
