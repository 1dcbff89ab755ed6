//! Connection floods against both nginx tiers (issue 39, docs/design/abuse-limits.md): slow-header,
//! slow-body and idle keep-alive clients from other loopback addresses, one address and many,
//! while a normal client on its own address keeps asking. Its own test binary: the attack takes
//! a core for a while and no other test should share the box with it.
//!
//! The attack is `deploy/local/bench/slowclients.py` (the same tool `deploy/local/bench-flood`
//! runs at full size against the topology): every load bounded by its seconds and its count, to
//! 127.0.0.0/8 only.

use reqwest::StatusCode;
use serde_json::{json, Value};
use std::time::Duration;
use zlink_e2e::*;

/// How long each attack lasts (the probe asks every 50 ms meanwhile).
const SECS: &str = "12";

/// Runs the attack tool with `args` and returns its JSON summary.
async fn slowclients(target: &str, probe: &str, args: &[&str]) -> Value {
    let mut cmd = tokio::process::Command::new("python3");
    cmd.arg(repo_root().join("deploy/local/bench/slowclients.py"))
        .args(["--target", target, "--secs", SECS])
        .args(["--probe", probe, "--probe-from", "127.0.0.250"])
        .args(args);
    let out = cmd.output().await.expect("python3 slowclients.py");
    assert!(
        out.status.success(),
        "slowclients {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("slowclients JSON")
}

/// The normal client was answered every time, with `status`, and the attack really ran.
fn assert_unharmed(r: &Value, status: &str) {
    let probe = &r["probe"];
    assert_eq!(probe["failed"], 0, "the normal client failed: {r}");
    let sent = probe["sent"].as_u64().unwrap();
    assert!(sent > 50, "the probe ran: {r}");
    assert_eq!(probe["statuses"][status].as_u64(), Some(sent), "{r}");
    assert!(r["attack"]["opened"].as_u64().unwrap() > 0, "{r}");
}

/// The guard's log of refused connections: how many came from `addr`.
fn refused_from(nginx: &OwnNginx, log: &str, addr: &str) -> usize {
    std::fs::read_to_string(nginx.log(log))
        .unwrap_or_default()
        .lines()
        .filter(|l| l.split(' ').nth(1) == Some(addr))
        .count()
}

fn no_exhaustion(nginx: &OwnNginx, log: &str) {
    let errors = std::fs::read_to_string(nginx.log(log)).unwrap_or_default();
    assert!(
        !errors.contains("worker_connections are not enough"),
        "the connection budget held: {log}"
    );
}

async fn eventually_refused(nginx: &OwnNginx, log: &str, addr: &str) -> usize {
    // The guard's log is buffered (flushed every 5 s).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let n = refused_from(nginx, log, addr);
        if n > 0 || tokio::time::Instant::now() > deadline {
            return n;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_and_idle_clients_never_starve_a_normal_client() {
    let infra = Infra::from_env();
    let ks = fresh_keyspace(&infra).await;
    let p = spawn_primary(&infra, &ks, &[], None).await;
    let key = create_key(&p.state, "alice", false).await;
    let c = create(
        &p.base,
        &key,
        json!({"url": "https://example.com/flood", "slug": "flood-1"}),
    )
    .await;
    assert_eq!(c.status(), StatusCode::CREATED);
    let dead = upstream_servers(
        &[format!("127.0.0.1:{}", free_port())],
        "max_fails=1 fail_timeout=5s",
    );
    // Nobody exempt: the normal client (127.0.0.250, 20 requests/s) is limited like anyone and
    // stays under every limit.
    let fe = OwnNginx::start(
        "frontend.conf",
        &[
            ("RATE_LIMIT_EXEMPT", "192.0.2.1".to_string()),
            (
                "PRIMARY_SERVERS",
                upstream_servers(&[hostport(&p.base)], "max_fails=1 fail_timeout=5s"),
            ),
            ("LASTRESORT_HOST_SERVERS", dead.clone()),
        ],
    )
    .await;
    let target = hostport(&fe.base);
    let probe = fe.url("/flood-1");

    // 6,000 slow-header connections from one address: past the guard's limit each new one is
    // closed at accept (logged as refused), the rest time out; the normal client never fails.
    let r = slowclients(&target, &probe, &["--mode", "header", "--conns", "6000"]).await;
    assert_unharmed(&r, "302");
    assert!(r["attack"]["closed_early"].as_u64().unwrap() > 1000, "{r}");
    assert!(eventually_refused(&fe, "nginx-frontend.refused.log", "127.0.0.2").await > 1000);
    assert_eq!(
        refused_from(&fe, "nginx-frontend.refused.log", "127.0.0.250"),
        0
    );

    // 20,000 over 200 addresses (two attacking processes: a process may hold 20,000 files):
    // under each address's limit, so it is the connection budget that must hold.
    let r = slowclients(
        &target,
        &probe,
        &[
            "--mode",
            "header",
            "--conns",
            "20000",
            "--addrs",
            "127.0.0.2-127.0.0.201",
            "--procs",
            "2",
        ],
    )
    .await;
    assert_unharmed(&r, "302");

    // Slow bodies and idle keep-alive hoarders from one address.
    for mode in ["body", "idle"] {
        let r = slowclients(
            &target,
            &probe,
            &["--mode", mode, "--conns", "3000", "--addrs", "127.0.0.3"],
        )
        .await;
        assert_unharmed(&r, "302");
        assert!(
            r["attack"]["closed_early"].as_u64().unwrap() > 100,
            "{mode}: {r}"
        );
    }
    no_exhaustion(&fe, "nginx-frontend.error.log");

    // The last-resort host (rung 4 sends browsers straight to it): the same flood from one
    // address; the normal client gets the host's answer (404: no page under this prefix).
    let click_dir = TempDir::new("flood-clicklog");
    let click_log = click_dir.path().join("clicks.json").display().to_string();
    let mut values = lastresort_host_values(dead, &infra, "no-such-prefix/", &click_log);
    values.push(("RATE_LIMIT_EXEMPT", "192.0.2.1".to_string()));
    let host = OwnNginx::start("lastresort.conf", &values).await;
    let r = slowclients(
        &hostport(&host.base),
        &host.url("/flood-1"),
        &[
            "--mode",
            "header",
            "--conns",
            "6000",
            "--addrs",
            "127.0.0.4",
        ],
    )
    .await;
    assert_unharmed(&r, "404");
    assert!(eventually_refused(&host, "nginx-lastresort.refused.log", "127.0.0.4").await > 1000);
    no_exhaustion(&host, "nginx-lastresort.error.log");
}
