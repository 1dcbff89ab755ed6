//! The degradation ladder through real nginx (SYSTEM.md rungs 1–3): the frontend fails over per
//! request from primary to the last-resort host; that host's nginx serves the S3 page itself when
//! its lastresort processes are down, logs those clicks, and lastresort ingests them once.

use reqwest::StatusCode;
use serde_json::{json, Value};
use std::collections::HashSet;
use std::time::Duration;
use zlink_e2e::*;
use zlink_wire::events::Tier;

mod domains;
mod https;
mod limits;
mod takedown;
mod wan;

/// Timeouts come from nginx/*.budgets (the defaults `up` uses too); tests set only the rest.
fn common() -> Vec<(&'static str, String)> {
    Vec::new()
}

#[test]
fn the_configs_up_generates_pass_nginx_t() {
    let run = TempDir::new("nginx-render");
    let out = std::process::Command::new("bash")
        .arg("-c")
        .arg("source deploy/local/lib.sh && zl_render_nginx nginx-lastresort && zl_render_nginx nginx-frontend")
        .current_dir(repo_root())
        .env("ZLINK_RUN", run.path())
        .env("ZLINK_PORT_BASE", "29000")
        // (The plain topology: a network-namespace address cannot be bound here.)
        .env("ZLINK_NETNS", "0")
        .output()
        .expect("bash");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let confs = String::from_utf8(out.stdout).unwrap();
    let confs: Vec<&str> = confs.lines().collect();
    assert_eq!(confs.len(), 2);
    for conf in confs {
        let text = std::fs::read_to_string(conf).unwrap();
        assert!(!text.contains("{{"), "every placeholder filled: {conf}");
        let t = std::process::Command::new(nginx_bin())
            .args(["-t", "-q", "-p"])
            .arg(run.path())
            .args(["-c", conf, "-e"])
            .arg(run.path().join("logs/t.log"))
            .output()
            .unwrap();
        assert!(
            t.status.success(),
            "nginx -t {conf}: {}",
            String::from_utf8_lossy(&t.stderr)
        );
    }
}

async fn get(url: &str, ua: &str) -> reqwest::Response {
    client()
        .get(url)
        .header("user-agent", ua)
        .send()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_ladder_through_real_nginx_rungs_1_2_3_and_rung_3_clicks_counted_once() {
    let infra = Infra::from_env();
    let (ks, n, topic) = pipeline_keyspace(&infra).await;
    let flags = kafka_flags(&infra, &n, &topic);
    let p1 = spawn_primary(&infra, &ks, &flags, None).await;
    let p2 = spawn_primary(&infra, &ks, &flags, None).await;
    let replicator = spawn_replicator(&infra, &ks, &infra.kafka).await;
    let key = create_key(&p1.state, "alice", false).await;
    let mut links = Vec::new();
    for i in 0..3 {
        let slug = format!("ladder-{i}");
        let url = format!("https://example.com/ladder/{i}?a=1&b=2");
        let c = create(&p1.base, &key, json!({"url": url, "slug": slug})).await;
        assert_eq!(c.status(), StatusCode::CREATED);
        assert!(
            eventually_ok(
                &infra.blob_url(&n.s3_prefix, &slug),
                Duration::from_secs(10)
            )
            .await,
            "{slug} replicated"
        );
        links.push((slug, url));
    }

    // The last-resort host: one lastresort process behind its nginx.
    let (lr_host, lr) = LastResortHost::start(&infra, &n.s3_prefix, &topic, &[]).await;
    let (lr_nginx, click_log) = (&lr_host.nginx, &lr_host.click_log);
    let mut fe_values = common();
    fe_values.extend([
        (
            "PRIMARY_SERVERS",
            upstream_servers(
                &[hostport(&p1.base), hostport(&p2.base)],
                "max_fails=1 fail_timeout=5s",
            ),
        ),
        (
            "LASTRESORT_HOST_SERVERS",
            upstream_servers(&[lr_nginx.tls_hostport()], "max_fails=1 fail_timeout=5s"),
        ),
    ]);
    let fe = OwnNginx::start("frontend.conf", &fe_values).await;

    // Rung 1: primary answers through the frontend.
    for (slug, url) in &links {
        let r = get(&fe.url(&format!("/{slug}")), "Mozilla/5.0 rung1").await;
        assert_eq!(r.status(), StatusCode::FOUND);
        assert_eq!(r.headers()["location"], url.as_str());
        assert_eq!(r.headers()["x-zlink-tier"], "primary");
    }
    let log = fe.access_log("nginx-frontend.access.json", 3).await;
    assert!(
        log.iter()
            .all(|l| l["rung"] == "1" && l["failed_over"] == "false"),
        "{log:?}"
    );

    // Rung 2: both primaries gone; every redirect still right, from the last-resort host.
    p1.stop().await;
    p2.stop().await;
    let mut rung2_ids = HashSet::new();
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..300 {
        let (slug, url) = links[i % links.len()].clone();
        let u = fe.url(&format!("/{slug}"));
        tasks.spawn(async move {
            let r = get(&u, "Mozilla/5.0 rung2").await;
            assert_eq!(r.status(), StatusCode::FOUND, "redirect {i} during rung 2");
            assert_eq!(r.headers()["location"], url.as_str());
            assert_eq!(r.headers()["x-zlink-tier"], "lastresort");
            r.headers()["x-zlink-click-id"]
                .to_str()
                .unwrap()
                .to_string()
        });
        if tasks.len() >= 8 {
            rung2_ids.insert(tasks.join_next().await.unwrap().unwrap());
        }
    }
    while let Some(id) = tasks.join_next().await {
        rung2_ids.insert(id.unwrap());
    }
    assert_eq!(rung2_ids.len(), 300, "zero errors, one click each");
    let log = fe.access_log("nginx-frontend.access.json", 303).await;
    assert!(log[3..].iter().all(|l| l["rung"] == "2"));
    assert!(
        log[3..].iter().any(|l| l["failed_over"] == "true"),
        "the failover shows in the log"
    );
    // One trace per request, started at the frontend (its request id) and continued by the
    // lastresort host's nginx (which trusts the frontend's traceparent).
    assert!(log[3..].iter().all(|l| l["trace_id"] == l["request_id"]));
    let lr_traces: HashSet<String> = lr_nginx
        .access_log("nginx-lastresort.access.json", 300)
        .await
        .iter()
        .filter_map(|l| l["trace_id"].as_str().map(str::to_string))
        .collect();
    assert!(
        log[3..]
            .iter()
            .all(|l| lr_traces.contains(l["trace_id"].as_str().unwrap())),
        "the lastresort host continues the frontend's trace"
    );

    // The API is never sent to the last-resort host: with the primaries down a POST is a 503
    // JSON, and lastresort never sees it.
    let lr_metrics = lr.url("/metrics");
    let lr_requests = || metric_sum(&lr_metrics, "zlink_lastresort_requests_total");
    let before = lr_requests().await;
    let r = client()
        .post(fe.url("/api/v1/links"))
        .bearer_auth(&key)
        .json(&json!({"url": "https://example.com/while-down"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        r.json::<Value>().await.unwrap()["error"]["code"],
        "unavailable"
    );
    let r = client()
        .get(fe.url("/api/v1/links/ladder-0"))
        .bearer_auth(&key)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
    // (The one request more is the first /metrics scrape itself.)
    assert_eq!(
        lr_requests().await,
        before + 1.0,
        "no API request reached lastresort"
    );
    assert!(lr_nginx
        .access_log("nginx-lastresort.access.json", 0)
        .await
        .iter()
        .all(|l| l["method"] == "GET" && !l["uri"].as_str().unwrap().starts_with("/api")));

    // Rung 3: the lastresort process is gone too; nginx on its host serves the S3 page.
    lr.kill().await;
    let mut rung3_ids = HashSet::new();
    for (slug, url) in &links {
        let r = get(&fe.url(&format!("/{slug}?utm=x")), "Twitterbot/1.0").await;
        assert_eq!(r.status(), StatusCode::OK, "the meta-refresh page");
        let h = r.headers().clone();
        assert_eq!(h["x-zlink-tier"], "lastresort-nginx");
        assert_eq!(h["content-type"], "text/html; charset=utf-8");
        assert!(
            h.keys().all(|k| !k.as_str().contains("amz")),
            "no S3 headers reach the browser: {h:?}"
        );
        let id = h["x-zlink-click-id"].to_str().unwrap();
        rung3_ids.insert(uuid::Uuid::parse_str(id).unwrap());
        let body = r.text().await.unwrap();
        let escaped = url.replace('&', "&amp;");
        assert!(body.contains("http-equiv=\"refresh\""), "{body}");
        assert!(body.contains(&escaped), "{body}");
    }
    let r = client()
        .post(lr_nginx.url("/ladder-0"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(
        r.json::<Value>().await.unwrap()["error"]["code"],
        "method_not_allowed"
    );
    let r = get(&fe.url("/no-such-link"), "Mozilla/5.0").await;
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
    assert!(
        r.text().await.unwrap().contains("Link not found"),
        "zlink's own 404 page"
    );
    let log = fe.access_log("nginx-frontend.access.json", 307).await;
    // (By URI, not by position: each worker flushes its own log buffer, so lines of different
    // workers need not be in request order.)
    let rung3: HashSet<&str> = log
        .iter()
        .filter(|l| l["rung"] == "3")
        .map(|l| l["uri"].as_str().unwrap())
        .collect();
    for (slug, _) in &links {
        assert!(
            rung3.contains(format!("/{slug}").as_str()),
            "{slug}: {rung3:?}"
        );
    }

    // Lastresort back: it ingests the rung-3 clicks from the nginx log, with their ids.
    let lr = lr_host.lastresort(&infra).await;
    let ingested = lr.url("/metrics");
    assert!(
        eventually(Duration::from_secs(10), || {
            let u = ingested.clone();
            async move { metric_sum(&u, "zlink_lastresort_nginx_clicks_ingested_total").await == 3.0 }
        })
        .await,
        "the three rung-3 clicks ingested"
    );
    let mut want: HashSet<uuid::Uuid> = rung3_ids.clone();
    want.extend(rung2_ids.iter().map(|id| id.parse::<uuid::Uuid>().unwrap()));
    let (seen, events) = clicks_in_kafka(&infra.kafka, &topic, &want).await;
    assert!(
        want.is_subset(&seen),
        "every rung-2 and rung-3 click in Kafka"
    );
    for e in events.iter().filter(|e| rung3_ids.contains(&e.id)) {
        assert_eq!(e.tier, Tier::LastresortNginx);
        assert_eq!(e.agent, zlink_wire::events::AgentClass::Preview);
    }
    // Restarted again: nothing is ingested twice (the position is kept with the spool).
    assert!(lr.terminate().await.success());
    let lr = lr_host.lastresort(&infra).await;
    // One new line: the tail ingests exactly it, not the three before it.
    let line = format!(
        r#"{{"v":1,"id":"{}","msec":"{}.000","slug":"ladder-0","remote_addr":"127.0.0.1","referer":"","user_agent":"Mozilla/5.0"}}"#,
        uuid::Uuid::new_v4().simple(),
        chrono::Utc::now().timestamp()
    );
    std::fs::OpenOptions::new()
        .append(true)
        .open(click_log)
        .and_then(|mut f| std::io::Write::write_all(&mut f, format!("{line}\n").as_bytes()))
        .unwrap();
    let m = lr.url("/metrics");
    assert!(
        eventually(Duration::from_secs(10), || {
            let u = m.clone();
            async move { metric_sum(&u, "zlink_lastresort_nginx_clicks_ingested_total").await >= 1.0 }
        })
        .await
    );
    assert_eq!(
        metric_sum(&m, "zlink_lastresort_nginx_clicks_ingested_total").await,
        1.0,
        "the earlier lines were not ingested again"
    );

    // Operator endpoints answer on the processes themselves, never through a public nginx.
    for path in ["/metrics", "/readyz", "/healthz", "/stats", "/metrics/"] {
        for (tier, nginx) in [("frontend", &fe), ("lastresort host", lr_nginx)] {
            let r = client().get(nginx.url(path)).send().await.unwrap();
            assert_eq!(r.status(), StatusCode::NOT_FOUND, "{path} via the {tier}");
            let body: Value = r.json().await.unwrap();
            assert_eq!(body["error"]["code"], "not_found", "{path} via the {tier}");
        }
    }
    for url in [lr.url("/metrics"), lr.url("/readyz"), lr.url("/stats")] {
        let r = client().get(&url).send().await.unwrap();
        assert_eq!(r.status(), StatusCode::OK, "{url} on the ops address");
    }
    assert!(lr.terminate().await.success());
    replicator.stop().await;
}
