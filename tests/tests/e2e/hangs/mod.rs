//! Failover when components hang instead of dying (SYSTEM.md invariants 10, 11, 12), through real
//! nginx: frozen primaries and lastresort processes (SIGSTOP: connections accepted, nothing
//! answered), slow primaries and a blackholed store behind a real fault proxy (Toxiproxy). Every
//! redirect must still get the right answer from some rung; a known-bad dependency costs a
//! bounded number of timeouts, not one per request; a request that a slow or frozen tier
//! finishes late is still one click; the longest link the API accepts redirects on every rung.

use reqwest::StatusCode;
use serde_json::{json, Value};
use std::collections::{BTreeMap, HashSet};
use std::time::{Duration, Instant};
use zlink_e2e::faults::{freeze, Fault, OwnToxiproxy};
use zlink_e2e::*;

mod kafka;
mod store;

/// A last-resort host (its nginx) in front of `lr`, reading S3 under `prefix`.
async fn lastresort_host(infra: &Infra, lrs: &[String], prefix: &str, click_log: &str) -> OwnNginx {
    // A long window: within this test a frozen process is tried exactly once.
    let lr_servers = upstream_servers(lrs, "max_fails=1 fail_timeout=60s");
    OwnNginx::start(
        "lastresort.conf",
        &lastresort_host_values(lr_servers, infra, prefix, click_log),
    )
    .await
}

/// A frontend in front of `primaries`, failing over to `lastresort_host` over HTTPS.
async fn frontend(primaries: &[String], lastresort_host: &OwnNginx) -> OwnNginx {
    OwnNginx::start(
        "frontend.conf",
        &[
            (
                "PRIMARY_SERVERS",
                upstream_servers(primaries, "max_fails=1 fail_timeout=60s"),
            ),
            (
                "LASTRESORT_HOST_SERVERS",
                upstream_servers(
                    &[lastresort_host.tls_hostport()],
                    "max_fails=1 fail_timeout=60s",
                ),
            ),
        ],
    )
    .await
}

struct Answer {
    tier: String,
    click: Option<String>,
}

/// GET (or HEAD) through nginx and check the answer is right for `url`: the redirect on rungs
/// 1 and 2, the meta-refresh page on rung 3.
async fn right_answer(base: &str, slug: &str, url: &str, head: bool) -> Answer {
    let u = format!("{base}/{slug}");
    let req = if head {
        client().head(&u)
    } else {
        client().get(&u)
    };
    let r = req
        .header("user-agent", "Mozilla/5.0 hang-test")
        .send()
        .await
        .unwrap();
    let status = r.status();
    let h = r.headers().clone();
    let tier = h
        .get("x-zlink-tier")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    let click = h
        .get("x-zlink-click-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    match tier.as_str() {
        "primary" | "lastresort" => {
            assert_eq!(status, StatusCode::FOUND, "{slug} via {tier}");
            assert_eq!(h["location"], url, "{slug} via {tier}");
        }
        "lastresort-nginx" => {
            assert_eq!(status, StatusCode::OK, "{slug} via rung 3");
            if !head {
                let body = r.text().await.unwrap();
                assert!(body.contains("http-equiv=\"refresh\""));
                assert!(body.contains(&zlink_wire::blob::escape_html(url)));
            }
        }
        other => panic!("{slug}: no rung answered ({status}, tier {other:?})"),
    }
    Answer { tier, click }
}

/// Every event with click id `id` in `topic`, reading until `min` copies are there (≤ 60 s).
async fn copies_in_kafka(
    brokers: &str,
    topic: &str,
    id: uuid::Uuid,
    min: usize,
) -> Vec<zlink_wire::events::ClickEvent> {
    let consumer = topic_reader(brokers, topic, "copies");
    let mut partitions = None;
    let mut copies = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while copies.len() < min && Instant::now() < deadline {
        if let Ok(Ok(m)) = tokio::time::timeout(Duration::from_secs(1), consumer.recv()).await {
            let n = *partitions.get_or_insert_with(|| partition_count(brokers, topic));
            copies.extend(clicks_of_message(&m, n).into_iter().filter(|e| e.id == id));
        }
    }
    copies
}

fn tried(log: &[Value], addr: &str) -> usize {
    log.iter()
        .filter(|l| l["upstream"].as_str().unwrap_or("").contains(addr))
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn hung_and_slow_tiers_cost_one_timeout_each_and_every_click_is_counted_once() {
    // Arrange: one primary process (to be frozen), the replicator, one lastresort process
    // behind its host nginx, the frontend, and the click counter.
    let infra = Infra::from_env();
    let (ks, n, topic) = pipeline_keyspace(&infra).await;
    let flags = kafka_flags(&infra, &n, &topic);
    // The API (links, keys, stats) goes to an in-process primary; redirects to the process.
    let api = spawn_primary(&infra, &ks, &flags, None).await;
    let key = create_key(&api.state, "hang", true).await;
    let replicator = spawn_replicator(&infra, &ks, &infra.kafka).await;
    // Two of each, as deployed: nginx never marks the only server of a group unavailable.
    let primary_flags = [
        "--links-topic",
        &n.links_topic,
        "--clicks-topic",
        &topic,
        "--public-base-url",
        "http://127.0.0.1:1",
    ];
    let primaries = [
        ServiceProcess::primary(&infra, &ks, &infra.kafka, &primary_flags)
            .ready()
            .await,
        ServiceProcess::primary(&infra, &ks, &infra.kafka, &primary_flags)
            .ready()
            .await,
    ];
    // The longest URL the API accepts must work on every rung (nginx buffers sized for it).
    let longest = format!(
        "https://example.com/{}",
        "a".repeat(zlink_wire::longurl::MAX_URL_BYTES - 20)
    );
    assert_eq!(longest.len(), zlink_wire::longurl::MAX_URL_BYTES);
    let mut links = vec![("hang-longest".to_string(), longest)];
    for i in 0..3 {
        links.push((
            format!("hang-{i}"),
            format!("https://example.com/hang/{i}?a=1&b=2"),
        ));
    }
    for (slug, url) in &links {
        let c = create(&api.base, &key, json!({"url": url, "slug": slug})).await;
        assert_eq!(c.status(), StatusCode::CREATED, "{slug}");
    }
    for (slug, _) in &links {
        assert!(
            eventually_ok(&infra.blob_url(&n.s3_prefix, slug), Duration::from_secs(10)).await,
            "{slug} in S3"
        );
    }
    let click_dir = TempDir::new("hang-clicklog");
    let click_log = click_dir.path().join("clicks.json").display().to_string();
    let lr_flags = ["--clicks-topic", &topic, "--nginx-click-log", &click_log];
    let lrs = [
        ServiceProcess::lastresort(&infra, &infra.s3_tls_endpoint, &n.s3_prefix, &lr_flags).await,
        ServiceProcess::lastresort(&infra, &infra.s3_tls_endpoint, &n.s3_prefix, &lr_flags).await,
    ];
    let lr_addrs: Vec<String> = lrs.iter().map(|l| hostport(&l.base)).collect();
    let host = lastresort_host(&infra, &lr_addrs, &n.s3_prefix, &click_log).await;
    let p_addrs: Vec<String> = primaries.iter().map(|p| hostport(&p.base)).collect();
    let fe = frontend(&p_addrs, &host).await;
    let counter = ServiceProcess::counter(
        &infra,
        &infra.kafka,
        &ks,
        &topic,
        &format!("counter-{ks}"),
        &[],
    );
    let mut clicks: BTreeMap<String, HashSet<String>> = BTreeMap::new();
    let mut record = |slug: &str, a: &Answer| {
        let id = a
            .click
            .clone()
            .expect("every GET answer carries its click id");
        assert!(
            clicks.entry(slug.to_string()).or_default().insert(id),
            "a click id is never reused by another request"
        );
    };

    // Rung 1, including the longest link; HEAD answers the same and is no click.
    for (slug, url) in &links {
        let a = right_answer(&fe.base, slug, url, false).await;
        assert_eq!(a.tier, "primary");
        record(slug, &a);
        let h = right_answer(&fe.base, slug, url, true).await;
        assert_eq!(h.tier, "primary");
        assert_eq!(h.click, None, "HEAD is not a click");
    }

    // Act 0: the primaries answer slowly (their responses held back by a fault proxy on the
    // way to a second frontend). Each primary has already recorded the click when nginx gives
    // up on it and asks lastresort: three copies of one click under the frontend's id and time,
    // which the counter must count once. Later requests skip the slow primaries.
    let toxi = OwnToxiproxy::start().await;
    let mut slow_addrs = Vec::new();
    for (i, p) in p_addrs.iter().enumerate() {
        slow_addrs.push(toxi.proxy(&format!("p{i}"), p).await);
    }
    let slow_fe = frontend(&slow_addrs, &host).await;
    for i in 0..slow_addrs.len() {
        toxi.inject(&format!("p{i}"), Fault::Slow(Duration::from_secs(2)))
            .await;
    }
    let mut slow_first = None;
    for i in 0..4 {
        let (slug, url) = &links[i % links.len()];
        let a = right_answer(&slow_fe.base, slug, url, false).await;
        assert_eq!(a.tier, "lastresort", "slow request {i}");
        slow_first.get_or_insert_with(|| a.click.clone().unwrap());
        record(slug, &a);
    }
    let slow_log = slow_fe.access_log("nginx-frontend.access.json", 4).await;
    for p in &slow_addrs {
        assert_eq!(tried(&slow_log, p), 1, "a slow primary costs one timeout");
    }
    let first: uuid::Uuid = slow_first.unwrap().parse().unwrap();
    let copies = copies_in_kafka(&infra.kafka, &topic, first, 3).await;
    let tiers: HashSet<_> = copies.iter().map(|e| format!("{:?}", e.tier)).collect();
    assert_eq!(
        (copies.len(), tiers.len()),
        (3, 2),
        "both slow primaries recorded the click lastresort answered: {copies:?}"
    );
    assert!(
        copies.windows(2).all(|w| w[0].at_ms == w[1].at_ms),
        "one click time: the frontend's"
    );

    // Act 1: both primaries freeze. Every redirect is still right (rung 2), and only the first
    // one waits for them (one timeout each): the rest skip them.
    for p in &primaries {
        freeze(p.pid(), true);
    }
    for i in 0..40 {
        let (slug, url) = &links[i % links.len()];
        let a = right_answer(&fe.base, slug, url, false).await;
        assert_eq!(a.tier, "lastresort", "request {i}");
        record(slug, &a);
    }
    let log = fe
        .access_log("nginx-frontend.access.json", links.len() * 2 + 40)
        .await;
    for p in &p_addrs {
        assert_eq!(
            tried(&log[links.len() * 2..], p),
            1,
            "a frozen primary costs one timeout per fail_timeout window, not one per request"
        );
    }

    // Act 2: the lastresort process freezes too: nginx on its host serves S3 directly (rung 3),
    // the longest link included; HEAD is no click there either.
    for l in &lrs {
        freeze(l.pid(), true);
    }
    for i in 0..12 {
        let (slug, url) = &links[i % links.len()];
        let a = right_answer(&fe.base, slug, url, false).await;
        assert_eq!(a.tier, "lastresort-nginx", "request {i}");
        record(slug, &a);
    }
    let h = right_answer(&fe.base, &links[1].0, &links[1].1, true).await;
    assert_eq!(h.tier, "lastresort-nginx");
    let host_log = host.access_log("nginx-lastresort.access.json", 57).await;
    for l in &lr_addrs {
        assert_eq!(
            tried(&host_log[44..], l),
            1,
            "a frozen lastresort process costs one timeout, then nginx goes straight to S3"
        );
    }

    // They thaw. A thawed process may still finish a request nginx gave up on (or find the
    // connection closed and drop it); either way its click carries the frontend's id and time,
    // so the counter sees a duplicate, never a new click.
    for pid in primaries
        .iter()
        .map(|p| p.pid())
        .chain(lrs.iter().map(|l| l.pid()))
    {
        freeze(pid, false);
    }

    // Assert: every click counted exactly once — the late copies are not counted again.
    for (slug, ids) in &clicks {
        let url = api.url(&format!("/api/v1/links/{slug}/stats"));
        let want = ids.len() as i64;
        let key = key.clone();
        let counted = eventually(Duration::from_secs(90), || {
            let (url, key) = (url.clone(), key.clone());
            async move {
                let r = client().get(&url).bearer_auth(&key).send().await.unwrap();
                r.json::<Value>().await.unwrap()["total"].as_i64() == Some(want)
            }
        })
        .await;
        assert!(counted, "{slug}: {want} clicks counted once each");
    }
    // And stays so once the counter has caught up with everything (nothing late is pending).
    assert!(
        caught_up(
            &infra.kafka,
            &format!("counter-{ks}"),
            &topic,
            Duration::from_secs(60)
        )
        .await
    );
    for (slug, ids) in &clicks {
        let r = client()
            .get(api.url(&format!("/api/v1/links/{slug}/stats")))
            .bearer_auth(&key)
            .send()
            .await
            .unwrap();
        assert_eq!(
            r.json::<Value>().await.unwrap()["total"].as_i64(),
            Some(ids.len() as i64),
            "{slug}"
        );
    }
    counter.kill().await;
    replicator.stop().await;
}
