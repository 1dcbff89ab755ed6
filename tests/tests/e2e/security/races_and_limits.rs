use super::*;

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
