//! HTTPS on every rung (docs/design/tls.md): both nginx tiers terminate TLS with the
//! certificate of the name the client asked for (the default domain's, or a branded domain's),
//! the frontend's failover hop to the last-resort host is HTTPS too, and a verifying client
//! (rustls, trusting only the test CA) gets the right answer on rungs 1, 2, 3 and at the
//! last-resort host by the service's name (rung 4). Plain HTTP answers 308 to HTTPS where
//! HTTPS_ONLY is on, without reaching a primary.

use reqwest::StatusCode;
use serde_json::{json, Value};
use std::time::Duration;
use zlink_e2e::*;

const BRAND: &str = "go.brand.example";
/// The default domain: a name on every test nginx's default certificate.
const SHORT: &str = "go.zlink.test";

/// A verifying client (the test CA only) that sends BRAND and SHORT to 127.0.0.1 and reports
/// the server's certificate; a new one makes a full handshake (no session kept).
fn verifying() -> reqwest::Client {
    let pem = std::fs::read(test_ca_cert()).unwrap();
    reqwest::Client::builder()
        .tls_built_in_root_certs(false)
        .add_root_certificate(reqwest::Certificate::from_pem(&pem).unwrap())
        .https_only(true)
        .tls_info(true)
        .resolve(BRAND, "127.0.0.1:0".parse().unwrap())
        .resolve(SHORT, "127.0.0.1:0".parse().unwrap())
        .resolve("unknown.example", "127.0.0.1:0".parse().unwrap())
        .redirect(reqwest::redirect::Policy::none())
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap()
}

/// `https://NAME:PORT` of a test nginx's HTTPS listener.
fn on(nginx: &OwnNginx, name: &str) -> String {
    format!("https://{name}:{}", nginx.tls_port)
}

/// The DER of the leaf certificate the server presented.
fn peer_cert(r: &reqwest::Response) -> Vec<u8> {
    r.extensions()
        .get::<reqwest::tls::TlsInfo>()
        .and_then(|t| t.peer_certificate())
        .expect("the peer's certificate")
        .to_vec()
}

/// GET `base/slug` with a fresh verifying client: (status, tier, Location, HSTS, certificate).
async fn ask(base: &str, slug: &str) -> (StatusCode, String, String, String, Vec<u8>) {
    let r = verifying()
        .get(format!("{base}/{slug}"))
        .send()
        .await
        .unwrap_or_else(|e| panic!("{base}/{slug}: {e:?}"));
    let h = |n: &str| {
        r.headers()
            .get(n)
            .map(|v| v.to_str().unwrap().to_string())
            .unwrap_or_default()
    };
    let got = (
        r.status(),
        h("x-zlink-tier"),
        h("location"),
        h("strict-transport-security"),
    );
    let cert = peer_cert(&r);
    let body = r.text().await.unwrap();
    (got.0, got.1, got.2 + &meta_refresh(&body), got.3, cert)
}

/// The destination of a rung-3 page (its meta refresh), or "" for any other body.
fn meta_refresh(body: &str) -> String {
    body.split("url=")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .map(|u| u.replace("&amp;", "&"))
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_rung_answers_https_with_the_certificate_of_the_default_or_branded_domain() {
    // Arrange: a primary and the replicator; a default-domain link and a branded one, in S3.
    let infra = Infra::from_env();
    let (ks, n, topic) = pipeline_keyspace(&infra).await;
    let mut flags: Vec<&str> = kafka_flags(&infra, &n, &topic).to_vec();
    flags.extend(["--short-domains", SHORT]);
    let p = spawn_primary(&infra, &ks, &flags, None).await;
    let replicator = spawn_replicator(&infra, &ks, &infra.kafka).await;
    let admin = create_key(&p.state, "ops", true).await;
    let (s, d) =
        super::domains::post(&p.base, "/api/v1/domains", &admin, json!({"domain": BRAND})).await;
    assert_eq!(s, StatusCode::CREATED, "{d}");
    let (plain, branded) = ("https://example.com/plain", "https://example.com/brand");
    for body in [
        json!({"url": plain, "slug": "tls-promo"}),
        json!({"url": branded, "slug": "tls-promo", "domain": BRAND}),
    ] {
        let r = create(&p.base, &admin, body).await;
        assert_eq!(r.status(), StatusCode::CREATED);
    }
    for key in ["tls-promo", "go.brand.example/tls-promo"] {
        assert!(
            eventually_ok(&infra.blob_url(&n.s3_prefix, key), Duration::from_secs(10)).await,
            "{key} in S3"
        );
    }
    let (lr_host, lr) = LastResortHost::start(&infra, &n.s3_prefix, &topic, &[SHORT]).await;
    let lr_nginx = &lr_host.nginx;
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
            ("DEFAULT_HOSTS", default_hosts(&[SHORT])),
        ],
    )
    .await;
    // The branded domain's certificate on both sites (what `ctl tls issue` does locally).
    for site in [fe.tls_dir(), lr_nginx.tls_dir()] {
        issue_cert(&site, Some(BRAND), &[BRAND], 30);
    }
    let default_cert = std::fs::read_to_string(fe.tls_dir().join("tls-combined.pem")).unwrap();
    let (mut primary, mut lastresort) = (Some(p), Some(lr));

    // Act/Assert: each rung, by the default name, by an IP literal and by the branded name.
    let mut brand_certs = Vec::new();
    for (rung, tier) in [(1, "primary"), (2, "lastresort"), (3, "lastresort-nginx")] {
        match rung {
            2 => primary.take().expect("once").stop().await,
            3 => lastresort.take().expect("once").kill().await,
            _ => {}
        }
        let want = |s: StatusCode| {
            if rung == 3 {
                assert_eq!(s, StatusCode::OK, "rung 3 serves the page");
            } else {
                assert_eq!(s, StatusCode::FOUND);
            }
        };
        for base in [on(&fe, SHORT), fe.https_base()] {
            let (s, t, to, hsts, cert) = ask(&base, "tls-promo").await;
            want(s);
            assert_eq!(
                (t.as_str(), to.as_str()),
                (tier, plain),
                "rung {rung} {base}"
            );
            assert_eq!(hsts, "max-age=31536000", "HSTS on the default domain");
            assert!(
                default_cert.contains(&pem_body(&cert)),
                "the default certificate"
            );
        }
        let (s, t, to, hsts, cert) = ask(&on(&fe, BRAND), "tls-promo").await;
        want(s);
        assert_eq!((t.as_str(), to.as_str()), (tier, branded), "rung {rung}");
        assert_eq!(hsts, "", "no HSTS on a branded domain: its owner decides");
        assert!(!default_cert.contains(&pem_body(&cert)), "the branded one");
        brand_certs.push(cert);
    }
    assert!(brand_certs.windows(2).all(|w| w[0] == w[1]));
    // Rung 4: browsers sent to the last-resort host by the service's name (DNS moved there).
    let (s, t, to, _, _) = ask(&on(lr_nginx, SHORT), "tls-promo").await;
    assert_eq!(
        (s, t.as_str(), to.as_str()),
        (StatusCode::OK, "lastresort-nginx", plain)
    );
    let (s, t, to, _, _) = ask(&on(lr_nginx, BRAND), "tls-promo").await;
    assert_eq!(
        (s, t.as_str(), to.as_str()),
        (StatusCode::OK, "lastresort-nginx", branded)
    );

    // A name with no certificate gets no TLS session (never another domain's certificate).
    let e = verifying()
        .get(format!("{}/tls-promo", on(&fe, "unknown.example")))
        .send()
        .await
        .expect_err("no certificate for unknown.example");
    assert!(e.is_connect(), "{e:?}");

    // Renewal without a reload: a new certificate file is served from the next handshake on.
    issue_cert(&fe.tls_dir(), Some(BRAND), &[BRAND], 60);
    let (_, _, _, _, renewed) = ask(&on(&fe, BRAND), "tls-promo").await;
    assert_ne!(
        renewed, brand_certs[0],
        "the renewed certificate, with no reload"
    );
    let now = std::fs::read_to_string(fe.tls_dir().join(BRAND).join("tls-combined.pem")).unwrap();
    assert!(now.contains(&pem_body(&renewed)));
    replicator.stop().await;
}

/// A DER certificate's PEM body lines (base64, 64 columns), to find it in a PEM file.
fn pem_body(der: &[u8]) -> String {
    use base64::Engine;
    let b64 = base64::engine::general_purpose::STANDARD.encode(der);
    b64.as_bytes()
        .chunks(64)
        .map(|c| std::str::from_utf8(c).unwrap())
        .collect::<Vec<_>>()
        .join("\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_only_answers_plain_http_with_a_permanent_redirect_that_reaches_no_primary() {
    let infra = Infra::from_env();
    let ks = fresh_keyspace(&infra).await;
    let p = spawn_primary(&infra, &ks, &["--short-domains", SHORT], None).await;
    let admin = create_key(&p.state, "ops", true).await;
    let r = create(
        &p.base,
        &admin,
        json!({"url": "https://example.com/only", "slug": "tls-only"}),
    )
    .await;
    assert_eq!(r.status(), StatusCode::CREATED);
    let fe = OwnNginx::start(
        "frontend.conf",
        &[
            (
                "PRIMARY_SERVERS",
                upstream_servers(&[hostport(&p.base)], "max_fails=1 fail_timeout=5s"),
            ),
            ("LASTRESORT_HOST_SERVERS", dead_server()),
            ("DEFAULT_HOSTS", default_hosts(&[SHORT])),
            ("HTTPS_ONLY", "on".into()),
        ],
    )
    .await;
    let tls_port = fe.tls_port;

    // Plain HTTP: 308 to the same path and query on HTTPS, for a redirect and for the API.
    let r = client()
        .get(fe.url("/tls-only?utm=a%20b"))
        .header("host", SHORT)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::PERMANENT_REDIRECT);
    assert_eq!(
        r.headers()["location"],
        format!("https://{SHORT}:{tls_port}/tls-only?utm=a%20b").as_str()
    );
    assert!(r.headers().get("strict-transport-security").is_none());
    let r = client()
        .post(fe.url("/api/v1/links"))
        .bearer_auth(&admin)
        .json(&json!({"url": "https://example.com/never"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::PERMANENT_REDIRECT, "the API too");
    // The health check stays plain (probes and the load balancer).
    let r = client().get(fe.url("/nginx-health")).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);

    // HTTPS: the link itself, HSTS on.
    let (s, t, to, hsts, _) = ask(&on(&fe, SHORT), "tls-only").await;
    assert_eq!(
        (s, t.as_str(), to.as_str()),
        (StatusCode::FOUND, "primary", "https://example.com/only")
    );
    assert_eq!(hsts, "max-age=31536000");

    // The plain requests never reached the primary: no upstream in the access log, so no
    // click was counted for them (only the HTTPS request's).
    let log = fe.access_log("nginx-frontend.access.json", 4).await;
    let plain: Vec<&Value> = log.iter().filter(|l| l["status"] == "308").collect();
    assert_eq!(plain.len(), 2, "{log:?}");
    assert!(plain.iter().all(|l| l["upstream"] == ""), "{plain:?}");
    let served: Vec<&Value> = log.iter().filter(|l| l["status"] == "302").collect();
    assert_eq!(served.len(), 1, "{log:?}");
    assert_eq!(served[0]["rung"], "1");
}

/// The domain API shows each site's certificate for a branded domain (`https`): a verifying
/// TLS handshake to every site's HTTPS listener with the domain as server name. Servable only
/// once every site presents a valid one: missing, then on one site, then a certificate for
/// another name (invalid), then on both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_domain_api_shows_each_sites_certificate_and_servable_only_when_all_are_valid() {
    let infra = Infra::from_env();
    // Both sites' nginx, upstreams dead: the check is a handshake, no request goes through.
    let dead = upstream_servers(&["127.0.0.1:9".to_string()], "max_fails=1 fail_timeout=5s");
    let fe = OwnNginx::start(
        "frontend.conf",
        &[
            ("PRIMARY_SERVERS", dead.clone()),
            ("LASTRESORT_HOST_SERVERS", dead.clone()),
            ("DEFAULT_HOSTS", default_hosts(&[SHORT])),
        ],
    )
    .await;
    let click_dir = TempDir::new("certs-clicklog");
    let click_log = click_dir.path().join("clicks.json").display().to_string();
    let lr = OwnNginx::start(
        "lastresort.conf",
        &lastresort_host_values(dead, &infra, "no-such-prefix/", &click_log),
    )
    .await;
    let ks = fresh_keyspace(&infra).await;
    let sites = format!(
        "frontend={},lastresort={}",
        fe.tls_hostport(),
        lr.tls_hostport()
    );
    let ca = test_ca_cert().display().to_string();
    let p = spawn_primary(
        &infra,
        &ks,
        &[
            "--short-domains",
            SHORT,
            "--tls-sites",
            &sites,
            "--tls-ca-file",
            &ca,
            "--tls-check-cache-secs",
            "0",
        ],
        None,
    )
    .await;
    let admin = create_key(&p.state, "ops", true).await;
    let states = |d: &Value| -> Vec<(String, String)> {
        d["https"]["sites"]
            .as_array()
            .unwrap_or_else(|| panic!("{d}"))
            .iter()
            .map(|s| {
                (
                    s["site"].as_str().unwrap().into(),
                    s["state"].as_str().unwrap().into(),
                )
            })
            .collect()
    };
    let listed = || async {
        let r = client()
            .get(format!("{}/api/v1/domains", p.base))
            .bearer_auth(&admin)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::OK);
        let v: Value = r.json().await.unwrap();
        v["domains"][0].clone()
    };
    let pair = |a: &str, b: &str| {
        vec![
            ("frontend".to_string(), a.to_string()),
            ("lastresort".to_string(), b.to_string()),
        ]
    };

    let (s, d) =
        super::domains::post(&p.base, "/api/v1/domains", &admin, json!({"domain": BRAND})).await;
    assert_eq!(s, StatusCode::CREATED, "{d}");
    assert_eq!(states(&d), pair("missing", "missing"), "{d}");
    assert_eq!(d["https"]["servable"], false);

    issue_cert(&fe.tls_dir(), Some(BRAND), &[BRAND], 30);
    let d = listed().await;
    assert_eq!(states(&d), pair("valid", "missing"), "{d}");
    assert_eq!(d["https"]["servable"], false);
    let not_after = d["https"]["sites"][0]["not_after"]
        .as_str()
        .unwrap()
        .to_string();
    let days = (chrono::DateTime::parse_from_rfc3339(&not_after)
        .unwrap()
        .timestamp()
        - chrono::Utc::now().timestamp())
        / 86_400;
    assert!((28..=30).contains(&days), "{not_after}");

    // A certificate for another name in the branded domain's place: it does not verify.
    issue_cert(&lr.tls_dir(), Some(BRAND), &["other.example"], 30);
    let d = listed().await;
    assert_eq!(states(&d), pair("valid", "invalid"), "{d}");
    assert!(
        d["https"]["sites"][1]["detail"]
            .as_str()
            .unwrap()
            .contains("certificate"),
        "{d}"
    );

    issue_cert(&lr.tls_dir(), Some(BRAND), &[BRAND], 30);
    let d = listed().await;
    assert_eq!(states(&d), pair("valid", "valid"), "{d}");
    assert_eq!(d["https"]["servable"], true);
}
