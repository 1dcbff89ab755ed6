use super::*;

fn client_from(ip: &str) -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .local_address(ip.parse::<std::net::IpAddr>().ok())
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap()
}

/// Statuses of `n` GETs of `url` from `ip`, one after the other.
async fn statuses(ip: &str, url: &str, n: usize) -> Vec<u16> {
    let c = client_from(ip);
    let mut out = Vec::new();
    for _ in 0..n {
        let r = c.get(url).send().await.unwrap();
        out.push(r.status().as_u16());
        if r.status() == StatusCode::TOO_MANY_REQUESTS {
            assert_eq!(r.headers()["retry-after"], "1");
            let body: Value = r.json().await.unwrap();
            assert_eq!(body["error"]["code"], "rate_limited");
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nginx_limits_each_address_and_exempts_the_load_generator() {
    let infra = Infra::from_env();
    let ks = fresh_keyspace(&infra).await;
    let p = spawn_primary(&infra, &ks, &[], None).await;
    let key = create_key(&p.state, "alice", false).await;
    let c = create(
        &p.base,
        &key,
        json!({"url": "https://example.com/l", "slug": "lim-1"}),
    )
    .await;
    assert_eq!(c.status(), StatusCode::CREATED);
    // Small limits so a test can pass them: 1 request/s with a burst of 5 (API: 2).
    let limits = [
        ("LIMIT_REDIRECT_RATE", "1r/s".to_string()),
        ("LIMIT_REDIRECT_BURST", "5".into()),
        ("RATE_LIMIT_EXEMPT", "127.0.0.1".into()),
    ];
    let mut fe_values = common();
    fe_values.extend(limits.iter().cloned());
    fe_values.extend([
        ("LIMIT_API_RATE", "1r/s".to_string()),
        ("LIMIT_API_BURST", "2".into()),
        (
            "PRIMARY_SERVERS",
            upstream_servers(&[hostport(&p.base)], "max_fails=1 fail_timeout=5s"),
        ),
        ("LASTRESORT_HOST_SERVERS", dead_server()),
    ]);
    let fe = OwnNginx::start("frontend.conf", &fe_values).await;

    // Any other address: the burst, then 429 JSON with Retry-After.
    let s = statuses("127.0.0.2", &fe.url("/lim-1"), 10).await;
    assert!(s[..5].iter().all(|c| *c == 302), "{s:?}");
    assert!(s[7..].iter().all(|c| *c == 429), "{s:?}");
    let s = statuses("127.0.0.3", &fe.url("/api/v1/links/lim-1"), 6).await;
    assert!(s[..2].iter().all(|c| *c == 401), "{s:?}");
    assert!(s[4..].iter().all(|c| *c == 429), "{s:?}");
    // The load generator is never limited.
    let s = statuses("127.0.0.1", &fe.url("/lim-1"), 40).await;
    assert!(s.iter().all(|c| *c == 302), "{s:?}");

    // The last-resort host limits the client the frontend reports, and browsers straight to
    // it (rung 4), the same way.
    let click_dir = TempDir::new("limit-clicklog");
    let click_log = click_dir.path().join("clicks.json").display().to_string();
    let mut lr_values =
        lastresort_host_values(dead_server(), &infra, "no-such-prefix/", &click_log);
    lr_values.extend(limits.iter().cloned());
    let host = OwnNginx::start("lastresort.conf", &lr_values).await;
    let s = statuses("127.0.0.2", &host.url("/lim-1"), 10).await;
    assert!(s[..5].iter().all(|c| *c == 404), "{s:?}");
    assert!(s[7..].iter().all(|c| *c == 429), "{s:?}");
    let s = statuses("127.0.0.1", &host.url("/lim-1"), 40).await;
    assert!(s.iter().all(|c| *c == 404), "{s:?}");
}
