//! The last-resort tier against real S3 (and, for parity, the real primary → Kafka →
//! replicator pipeline): SYSTEM.md invariants 7 (same answers as primary) and 8 (S3 only).

use reqwest::StatusCode;
use serde_json::{json, Value};
use std::collections::HashSet;
use std::time::Duration;
use zlink_e2e::*;
use zlink_wire::blob::Blob;
use zlink_wire::events::Tier;

async fn get(url: &str) -> reqwest::Response {
    client().get(url).send().await.expect("request")
}

fn answer(r: &reqwest::Response) -> (StatusCode, Option<String>, Option<String>) {
    let h = |n: &str| r.headers().get(n).map(|v| v.to_str().unwrap().to_string());
    (
        r.status(),
        h("location"),
        h("cache-control").filter(|_| r.status().is_redirection()),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn lastresort_answers_like_primary_for_the_same_links() {
    let infra = Infra::from_env();
    let ks = fresh_keyspace(&infra).await;
    let n = names(&ks);
    let p = primary_publishing_links(&infra, &ks).await;
    let r = spawn_replicator(&infra, &ks, &infra.kafka).await;
    let lr = spawn_lastresort(&infra, &infra.s3_tls_endpoint, &n.s3_prefix, &[]).await;
    let key = create_key(&p.state, "alice", false).await;

    let soon =
        chrono::DateTime::from_timestamp_millis(chrono::Utc::now().timestamp_millis() + 3000)
            .unwrap()
            .to_rfc3339();
    let bodies = [
        json!({"url": "https://example.com/plain"}),
        json!({"url": "https://example.com/moved?a=1&b=\"2\"", "slug": "moved-perm", "redirect_code": 301}),
        json!({"url": "https://bücher.example/straße", "slug": "idn-link", "redirect_code": 308}),
        json!({"url": "https://example.com/soon", "slug": "expires-soon", "expires_at": soon}),
        json!({"url": "https://example.com/off", "slug": "disabled-one"}),
        json!({"url": "https://example.com/del", "slug": "deleted-one"}),
    ];
    let mut slugs = Vec::new();
    for b in bodies {
        let c = create(&p.base, &key, b).await;
        assert_eq!(c.status(), StatusCode::CREATED);
        slugs.push(
            c.json::<Value>().await.unwrap()["slug"]
                .as_str()
                .unwrap()
                .to_string(),
        );
    }
    for s in &slugs {
        let u = infra.blob_url(&n.s3_prefix, s);
        assert!(
            eventually(Duration::from_secs(5), || {
                let u = u.clone();
                async move { get(&u).await.status() == StatusCode::OK }
            })
            .await,
            "{s} replicated"
        );
    }

    // Disabled after replication: the blob goes, a tombstone stays, both tiers say 410.
    set_status(&p.base, &key, "disabled-one", "DISABLED").await;
    let u = infra.blob_url(&n.s3_prefix, "disabled-one");
    assert!(
        eventually(Duration::from_secs(5), || {
            let u = u.clone();
            async move { get(&u).await.status() == StatusCode::NOT_FOUND }
        })
        .await,
        "disabled link's blob deleted"
    );
    assert_eq!(
        get(&lr.url("/disabled-one")).await.status(),
        StatusCode::GONE
    );
    // Deleted likewise (a DELETED tombstone).
    assert_eq!(
        delete_link(&p.base, &key, "deleted-one").await.status(),
        StatusCode::OK
    );
    let u = infra.blob_url(&n.s3_prefix, "deleted-one");
    assert!(
        eventually(Duration::from_secs(5), || {
            let u = u.clone();
            async move { get(&u).await.status() == StatusCode::NOT_FOUND }
        })
        .await,
        "deleted link's blob deleted"
    );
    assert_eq!(
        get(&lr.url("/deleted-one")).await.status(),
        StatusCode::GONE
    );

    let mut paths: Vec<String> = slugs.iter().map(|s| format!("/{s}")).collect();
    paths.extend(["/never-created", "/abcDEF1", "/a", "/x%00y", "/a/b"].map(String::from));
    for path in &paths {
        let (a, b) = (get(&p.url(path)).await, get(&lr.url(path)).await);
        assert_eq!(answer(&a), answer(&b), "{path}");
        assert_eq!(
            b.headers().get("x-zlink-tier").map(|v| v.to_str().unwrap()),
            a.status().is_redirection().then_some("lastresort")
        );
    }

    // After expiry both tiers say 410 (lastresort from the blob's own expiry, before any delete).
    let (pu, lu) = (p.url("/expires-soon"), lr.url("/expires-soon"));
    assert!(
        eventually(Duration::from_secs(10), || {
            let (pu, lu) = (pu.clone(), lu.clone());
            async move {
                get(&pu).await.status() == StatusCode::GONE
                    && get(&lu).await.status() == StatusCode::GONE
            }
        })
        .await,
        "both tiers answer 410 once the link expired"
    );

    let stats: Value = get(&lr.url("/stats")).await.json().await.unwrap();
    assert!(stats["redirects_total"].as_u64().unwrap() >= 3, "{stats}");
    lr.stop().await;
    r.stop().await;
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_object_bigger_than_any_blob_is_not_buffered_and_counts_as_missing() {
    let infra = Infra::from_env();
    let prefix = format!("lr-huge-{}/", uuid::Uuid::new_v4().simple());
    let writer = replicator::s3::S3Store::new(&infra.s3_config(&prefix)).expect("S3 client");
    let huge = zlink_clients::s3::MAX_OBJECT_BYTES + 1;
    writer.put_raw("huge", vec![b'<'; huge]).await.unwrap();
    let b = Blob {
        url: "https://example.com/fine".into(),
        code: 302,
        version: 1,
        expires_at_ms: None,
    };
    writer.put("fine", &b).await.unwrap();
    let lr = spawn_lastresort(&infra, &infra.s3_tls_endpoint, &prefix, &[]).await;
    let r = get(&lr.url("/huge")).await;
    assert_eq!(
        r.status(),
        StatusCode::NOT_FOUND,
        "not a blob of ours: missing"
    );
    assert_eq!(
        metric(
            &lr.url("/metrics"),
            "zlink_lastresort_malformed_blobs_total"
        )
        .await,
        1.0
    );
    let r = get(&lr.url("/fine")).await;
    assert_eq!(r.status(), StatusCode::FOUND, "the process is fine");
    assert_eq!(r.headers()["location"], "https://example.com/fine");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_s3_stopped_cached_slugs_still_redirect_and_uncached_ones_get_a_fast_503() {
    let infra = Infra::from_env();
    let s3 = OwnS3::start(27000).await;
    let prefix = "lr-outage/";
    let mut cfg = infra.s3_config(prefix);
    cfg.s3_endpoint = s3.endpoint.clone();
    let writer = replicator::s3::S3Store::new(&cfg).expect("S3 client");
    for (slug, code) in [("warm-a", 302u16), ("warm-b", 307), ("cold-c", 302)] {
        let b = Blob {
            url: format!("https://example.com/{slug}"),
            code,
            version: 1,
            expires_at_ms: None,
        };
        writer.put(slug, &b).await.unwrap();
    }
    writer
        .put(
            "broken",
            &Blob {
                url: "https://example.com/".into(),
                code: 302,
                version: 1,
                expires_at_ms: None,
            },
        )
        .await
        .unwrap();
    // A fresh TTL of 1 ms and no journal: every request goes back to S3, so the stale copy is
    // what saves it.
    let lr = spawn_lastresort(
        &infra,
        &s3.endpoint,
        prefix,
        &[
            "--fresh-ttl-ms",
            "1",
            "--journal-ttl-ms",
            "0",
            "--s3-budget-ms",
            "200",
        ],
    )
    .await;
    for slug in ["warm-a", "warm-b"] {
        assert!(get(&lr.url(&format!("/{slug}")))
            .await
            .status()
            .is_redirection());
    }
    let ready = lr.url("/readyz");
    assert!(
        eventually(Duration::from_secs(10), || {
            let u = ready.clone();
            async move { get(&u).await.status() == StatusCode::OK }
        })
        .await
    );

    s3.stop().await;
    for slug in ["warm-a", "warm-b"] {
        let r = get(&lr.url(&format!("/{slug}"))).await;
        assert!(
            r.status().is_redirection(),
            "{slug} with S3 down: {}",
            r.status()
        );
        assert_eq!(
            r.headers()["location"],
            format!("https://example.com/{slug}").as_str()
        );
    }
    let started = std::time::Instant::now();
    let r = get(&lr.url("/cold-c")).await;
    assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        r.json::<Value>().await.unwrap()["error"]["code"],
        "unavailable"
    );
    // Bounded by the S3 budget (200 ms), with generous slack for a loaded 2-core box.
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "503 took {:?}",
        started.elapsed()
    );
    assert!(
        eventually(Duration::from_secs(10), || {
            let u = ready.clone();
            async move { get(&u).await.status() == StatusCode::SERVICE_UNAVAILABLE }
        })
        .await
    );
    assert!(
        lr.state
            .metrics
            .cache
            .lookups
            .with_label_values(&["stale"])
            .get()
            >= 2
    );

    // S3 back: the uncached slug resolves.
    s3.up().await;
    let cold = lr.url("/cold-c");
    assert!(
        eventually(Duration::from_secs(10), || {
            let u = cold.clone();
            async move { get(&u).await.status() == StatusCode::FOUND }
        })
        .await
    );
    lr.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigkilled_after_1000_redirects_with_kafka_down_it_loses_no_click_and_cuts_a_torn_tail() {
    let infra = Infra::from_env();
    let kafka = OwnKafka::start(26200).await;
    let tag = uuid::Uuid::new_v4().simple().to_string();
    let topic = format!("clicks-{tag}");
    create_topics(&kafka.brokers, &[(&topic, 3)]).await;
    let prefix = format!("lr-clicks-{tag}/");
    let writer = replicator::s3::S3Store::new(&infra.s3_config(&prefix)).expect("S3 client");
    for slug in ["clk-a", "clk-b"] {
        let b = Blob {
            url: format!("https://example.com/{slug}"),
            code: 302,
            version: 1,
            expires_at_ms: None,
        };
        writer.put(slug, &b).await.unwrap();
    }
    kafka.stop().await;

    let spool = TempDir::new("lr-kill-spool");
    let spool_dir = spool.path().display().to_string();
    let flags = [
        "--kafka",
        &kafka.brokers,
        "--clicks-topic",
        &topic,
        "--spool-dir",
        &spool_dir,
        "--clicks-timeout-ms",
        "2000",
    ];
    let lr = ServiceProcess::lastresort(&infra, &infra.s3_endpoint, &prefix, &flags).await;
    let mut ids = HashSet::new();
    for i in 0..1000 {
        let slug = if i % 3 == 0 { "clk-b" } else { "clk-a" };
        let r = client()
            .get(lr.url(&format!("/{slug}")))
            .header("user-agent", format!("zlink-test/{i}"))
            .header("referer", "https://referrer.example/")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::FOUND);
        let id = r.headers()["x-zlink-click-id"]
            .to_str()
            .unwrap()
            .parse()
            .unwrap();
        ids.insert(id);
    }
    assert_eq!(ids.len(), 1000, "one unique click id per redirect");
    lr.kill().await;

    // The crash also left half a record behind (a move from the staging ring into the segment
    // cut short), right after the last whole one, which must be cut off; what the ring still
    // held is moved into a segment at the restart.
    let newest = std::fs::read_dir(spool.path())
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "seg"))
        .max()
        .unwrap();
    let bytes = std::fs::read(&newest).unwrap();
    let mut end = 8; // the segment's magic
    while let Ok(Some((_, size))) = zlink_clients::spool::decode(&bytes[end..]) {
        end += size;
    }
    let torn = zlink_clients::spool::encode(b"{\"half\":\"a record\"}");
    let torn = &torn[..torn.len() / 2];
    std::os::unix::fs::FileExt::write_all_at(
        &std::fs::OpenOptions::new()
            .write(true)
            .open(&newest)
            .unwrap(),
        torn,
        end as u64,
    )
    .unwrap();

    kafka.up().await;
    let lr = ServiceProcess::lastresort(&infra, &infra.s3_endpoint, &prefix, &flags).await;
    assert_eq!(
        metric(
            &lr.url("/metrics"),
            "zlink_lastresort_spool_cut_bytes_total"
        )
        .await,
        torn.len() as f64
    );
    let (seen, events) = clicks_in_kafka(&kafka.brokers, &topic, &ids).await;
    assert_eq!(seen, ids, "exactly the 1,000 clicks, no more, no fewer");
    for ev in &events {
        assert_eq!(ev.tier, Tier::Lastresort);
        assert_eq!(ev.agent, zlink_wire::events::AgentClass::Browser);
        assert!(ev.key == "clk-a" || ev.key == "clk-b");
        assert_eq!(ev.referrer.as_deref(), Some("https://referrer.example/"));
        assert!(ev.user_agent.as_deref().unwrap().starts_with("zlink-test/"));
        assert_eq!(ev.ip_hash.len(), 64);
    }
    let pending = lr.url("/metrics");
    assert!(
        eventually(Duration::from_secs(10), || {
            let u = pending.clone();
            async move { metric(&u, "zlink_lastresort_spool_pending_records").await == 0.0 }
        })
        .await,
        "spool drained"
    );

    // Graceful shutdown flushes: clicks made just before SIGTERM reach Kafka.
    let mut last = HashSet::new();
    for _ in 0..20 {
        let r = get(&lr.url("/clk-a")).await;
        last.insert(
            r.headers()["x-zlink-click-id"]
                .to_str()
                .unwrap()
                .parse()
                .unwrap(),
        );
    }
    assert!(lr.terminate().await.success());
    let (seen, _) = clicks_in_kafka(&kafka.brokers, &topic, &last).await;
    assert!(last.is_subset(&seen));
}

/// The change journal lets lastresort keep what S3 said for long and still take a link down
/// within seconds: with answers from S3 kept for 10 minutes, a hot link is not read from S3
/// again while nothing changes, and a link disabled through primary answers 410 on lastresort
/// within 5 s (only the journal can tell it so soon), then 302 again once re-enabled.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_takedown_reaches_lastresort_through_the_journal_while_hot_links_stay_in_memory() {
    let infra = Infra::from_env();
    let ks = fresh_keyspace(&infra).await;
    let n = names(&ks);
    let p = primary_publishing_links(&infra, &ks).await;
    let r = spawn_replicator(&infra, &ks, &infra.kafka).await;
    let key = create_key(&p.state, "alice", false).await;
    let slugs = ["hot-one", "taken-down"];
    for slug in slugs {
        let c = create(
            &p.base,
            &key,
            json!({"url": format!("https://example.com/{slug}"), "slug": slug}),
        )
        .await;
        assert_eq!(c.status(), StatusCode::CREATED);
        assert!(
            eventually_ok(&infra.blob_url(&n.s3_prefix, slug), Duration::from_secs(10)).await,
            "{slug} replicated"
        );
    }
    let lr = spawn_lastresort(
        &infra,
        &infra.s3_endpoint,
        &n.s3_prefix,
        &[
            "--fresh-ttl-ms",
            "200",
            "--journal-ttl-ms",
            "600000",
            "--journal-poll-ms",
            "500",
        ],
    )
    .await;
    let m = lr.state.metrics.clone();
    // Trusted, and past the forgets of the creates' own journal objects (3 polls).
    assert!(
        eventually(Duration::from_secs(10), || {
            let m = m.clone();
            async move {
                m.journal_trusted.get() == 1
                    && m.journal_polls.with_label_values(&["ok"]).get() >= 4
            }
        })
        .await,
        "the journal is read"
    );
    for slug in slugs {
        assert_eq!(
            get(&lr.url(&format!("/{slug}"))).await.status(),
            StatusCode::FOUND
        );
    }
    let s3_reads = || m.cache.lookups.with_label_values(&["s3"]).get();
    let before = s3_reads();
    // Five times --fresh-ttl-ms: without the journal every answer would have been read again.
    tokio::time::sleep(Duration::from_millis(1000)).await;
    for _ in 0..10 {
        for slug in slugs {
            assert_eq!(
                get(&lr.url(&format!("/{slug}"))).await.status(),
                StatusCode::FOUND
            );
        }
    }
    assert_eq!(
        s3_reads(),
        before,
        "hot links stay in memory while nothing changes"
    );

    set_status(&p.base, &key, "taken-down", "DISABLED").await;
    let down = lr.url("/taken-down");
    assert!(
        eventually(Duration::from_secs(5), || {
            let u = down.clone();
            async move { get(&u).await.status() == StatusCode::GONE }
        })
        .await,
        "the takedown reaches lastresort within 5 s"
    );
    assert!(m.journal_forgets.get() >= 1);
    assert_eq!(get(&lr.url("/hot-one")).await.status(), StatusCode::FOUND);
    set_status(&p.base, &key, "taken-down", "ACTIVE").await;
    assert!(
        eventually(Duration::from_secs(5), || {
            let u = down.clone();
            async move { get(&u).await.status() == StatusCode::FOUND }
        })
        .await,
        "and so does its return"
    );
    lr.stop().await;
    r.stop().await;
    p.stop().await;
}

/// When the journal cannot be read (S3 down) lastresort stops relying on it: every answer kept
/// for long is forgotten (served from the stale copy meanwhile), and trust returns with S3.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn without_a_readable_journal_lastresort_stops_keeping_answers_for_long() {
    let infra = Infra::from_env();
    let s3 = OwnS3::start(27200).await;
    let prefix = "lr-journal/";
    let mut cfg = infra.s3_config(prefix);
    cfg.s3_endpoint = s3.endpoint.clone();
    let writer = replicator::s3::S3Store::new(&cfg).expect("S3 client");
    let b = Blob {
        url: "https://example.com/warm".into(),
        code: 302,
        version: 1,
        expires_at_ms: None,
    };
    writer.put("warm", &b).await.unwrap();
    writer.put_journal("test", &["warm".into()]).await.unwrap();
    let lr = spawn_lastresort(
        &infra,
        &s3.endpoint,
        prefix,
        &["--journal-poll-ms", "200", "--s3-budget-ms", "200"],
    )
    .await;
    let m = lr.state.metrics.clone();
    let trusted = |want: i64| {
        let m = m.clone();
        move || {
            let m = m.clone();
            async move { m.journal_trusted.get() == want }
        }
    };
    assert!(eventually(Duration::from_secs(10), trusted(1)).await);
    // Past the three forgets of the journal object above.
    assert!(
        eventually(Duration::from_secs(10), || {
            let m = m.clone();
            async move { m.journal_polls.with_label_values(&["ok"]).get() >= 4 }
        })
        .await
    );
    assert_eq!(get(&lr.url("/warm")).await.status(), StatusCode::FOUND);
    let stale = || m.cache.lookups.with_label_values(&["stale"]).get();
    assert_eq!(stale(), 0);

    s3.stop().await;
    assert!(
        eventually(Duration::from_secs(10), trusted(0)).await,
        "3 failed polls: the journal is not trusted"
    );
    let r = get(&lr.url("/warm")).await;
    assert_eq!(r.status(), StatusCode::FOUND);
    assert_eq!(r.headers()["location"], "https://example.com/warm");
    assert!(
        stale() >= 1,
        "the long-lived answer was forgotten: the stale copy answered"
    );

    s3.up().await;
    assert!(
        eventually(Duration::from_secs(30), trusted(1)).await,
        "trusted again once S3 is back"
    );
    lr.stop().await;
}

/// A full disk under the spool (issue 39; docs/runbook.md, "A disk is full"): the spool on a
/// 1 MiB filesystem of its own, filled while lastresort runs. Redirects are all answered, each
/// click that does not fit is refused and counted (`reason="io"`: spooled + refused is exactly
/// the redirects), the spool's filesystem gauges say it is full, and when space returns the
/// same process spools again. Needs root (a tmpfs is mounted); skipped, loudly, without it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn on_a_full_disk_redirects_go_on_refused_clicks_are_counted_and_spooling_resumes() {
    let infra = Infra::from_env();
    let tag = uuid::Uuid::new_v4().simple().to_string();
    let prefix = format!("lr-full-{tag}/");
    let writer = replicator::s3::S3Store::new(&infra.s3_config(&prefix)).expect("S3 client");
    let b = Blob {
        url: "https://example.com/full".into(),
        code: 302,
        version: 1,
        expires_at_ms: None,
    };
    writer.put("full-a", &b).await.unwrap();

    let spool = TempDir::new("lr-full-spool");
    let dir = spool.path().display().to_string();
    let mounted = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=1m", "zlink-test-full", &dir])
        .status()
        .is_ok_and(|s| s.success());
    if !mounted {
        eprintln!("SKIPPED: mounting a tmpfs needs root (the full-disk test did not run)");
        return;
    }
    struct Unmount(String);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = std::process::Command::new("umount")
                .args(["-l", &self.0])
                .status();
        }
    }
    let _unmount = Unmount(dir.clone());
    // Kafka unreachable: everything spooled stays in the spool (nothing frees space meanwhile).
    let flags = [
        "--kafka",
        "127.0.0.1:1",
        "--spool-dir",
        &dir,
        "--clicks-timeout-ms",
        "1000",
    ];
    let lr = ServiceProcess::lastresort(&infra, &infra.s3_endpoint, &prefix, &flags).await;
    let pid = lr.pid();
    let metrics = lr.url("/metrics");
    let refused = || {
        metric_sum(
            &metrics,
            "zlink_lastresort_clicks_refused_total{reason=\"io\"}",
        )
    };
    let spooled = || metric_sum(&metrics, "zlink_lastresort_clicks_spooled_total");
    assert_eq!(
        refused().await,
        0.0,
        "the io reason is there from the start, at 0"
    );
    let size = metric_sum(&metrics, "zlink_lastresort_spool_filesystem_size_bytes").await;
    assert_eq!(
        size,
        1024.0 * 1024.0,
        "the spool's filesystem is the 1 MiB one"
    );

    // Fill it but for nothing: the segment is written with write(2) (an 8 MiB segment could
    // not be preallocated on 1 MiB), so the next click meets the full disk.
    let filler = spool.path().join("filler");
    let _ = std::process::Command::new("dd")
        .args(["if=/dev/zero", &format!("of={}", filler.display()), "bs=4k"])
        .stderr(std::process::Stdio::null())
        .status();
    let free = metric_sum(&metrics, "zlink_lastresort_spool_filesystem_free_bytes").await;
    assert!(free < 8192.0, "the filesystem is full: {free} bytes free");
    let (s0, r0) = (spooled().await, refused().await);
    const N: usize = 300;
    for _ in 0..N {
        let r = get(&lr.url("/full-a")).await;
        assert_eq!(
            r.status(),
            StatusCode::FOUND,
            "redirects go on with a full disk"
        );
    }
    let (s1, r1) = (spooled().await, refused().await);
    assert!(r1 - r0 > 0.0, "clicks were refused for lack of space");
    assert_eq!(
        (s1 - s0) + (r1 - r0),
        N as f64,
        "every click is spooled or counted as refused, exactly once"
    );
    let ready = get(&lr.url("/readyz")).await;
    assert_eq!(
        ready.status(),
        StatusCode::OK,
        "still ready: redirects are its job"
    );

    // Space returns: the same process spools again, no restart.
    std::fs::remove_file(&filler).unwrap();
    for _ in 0..N {
        assert_eq!(get(&lr.url("/full-a")).await.status(), StatusCode::FOUND);
    }
    let (s2, r2) = (spooled().await, refused().await);
    assert_eq!(r2, r1, "nothing refused once there is room");
    assert_eq!(s2 - s1, N as f64, "every click spooled again");
    assert_eq!(lr.pid(), pid, "no restart");
    assert!(lr.terminate().await.success());
}

/// S3 over HTTPS (issue 42, part 3): the last-resort host's S3 client verifies S3's certificate.
/// Trusting the test servers' CA it reads and serves; trusting only the system's roots, or
/// another CA, it reads nothing: no redirect is ever served from an unverified S3.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn s3_over_https_is_read_only_with_its_certificate_verified() {
    let infra = Infra::from_env();
    let prefix = format!("lr-tls-{}/", uuid::Uuid::new_v4().simple());
    let writer = replicator::s3::S3Store::new(&infra.s3_tls_config(&prefix)).expect("S3 client");
    let b = Blob {
        url: "https://example.com/over-tls".into(),
        code: 302,
        version: 1,
        expires_at_ms: None,
    };
    writer
        .put("tls-a", &b)
        .await
        .expect("PUT over verified HTTPS");
    let got = writer.get("tls-a").await.expect("GET over verified HTTPS");
    assert!(got.is_some(), "the page written over HTTPS is there");

    // The system's roots only: S3's certificate is not trusted, and the error says why.
    let untrusted = replicator::s3::S3Config {
        s3_ca_file: None,
        ..infra.s3_tls_config(&prefix)
    };
    let e = replicator::s3::S3Store::new(&untrusted)
        .expect("S3 client")
        .get("tls-a")
        .await
        .err()
        .expect("no read from an unverified S3");
    assert!(
        format!("{e:?}").to_lowercase().contains("certificate"),
        "{e:?}"
    );

    let lr = spawn_lastresort(&infra, &infra.s3_tls_endpoint, &prefix, &[]).await;
    let r = get(&lr.url("/tls-a")).await;
    assert_eq!(r.status(), StatusCode::FOUND);
    assert_eq!(r.headers()["location"], "https://example.com/over-tls");
    lr.stop().await;

    // Another CA (the tests' nginx CA): the lastresort process is not ready and serves no
    // redirect from S3 (503, which its host nginx answers from S3 itself, also verified).
    let other_ca = test_ca_cert().display().to_string();
    let lr = spawn_lastresort(
        &infra,
        &infra.s3_tls_endpoint,
        &prefix,
        &["--s3-ca-file", &other_ca],
    )
    .await;
    let r = get(&lr.url("/tls-a")).await;
    assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(r.headers().get("location").is_none());
    let ready = get(&lr.url("/readyz")).await;
    assert_eq!(ready.status(), StatusCode::SERVICE_UNAVAILABLE);
    lr.stop().await;

    // A file that is not a CA certificate is refused at start-up, with a clear error.
    let bad = TempDir::new("bad-ca");
    let bad_file = bad.path().join("ca.pem");
    std::fs::write(&bad_file, "not a certificate\n").unwrap();
    let bad_cfg = replicator::s3::S3Config {
        s3_ca_file: Some(bad_file.clone()),
        ..infra.s3_tls_config(&prefix)
    };
    let e = bad_cfg.validate().expect_err("refused");
    assert!(e.contains("--s3-ca-file"), "{e}");
}
