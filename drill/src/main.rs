//! The failover drill. Against a running topology: creates a set of links, then keeps a steady,
//! bounded redirect load on the frontend while it walks the degradation ladder —
//! baseline → primaries killed → lastresort processes killed (rung 3) → lastresort back →
//! primaries back — and checks every answer (the right redirect, or on rung 3 the right
//! meta-refresh page). Afterwards it checks the mappings (a reconcile command) and the clicks:
//! every click the drill made must be counted exactly once, per tier, in the stats API.
//! Prints a table, writes a JSON report, exits non-zero on any wrong answer, lost or extra
//! click, or drift.
//!
//! How a tier is broken and restored is a command template (`{component}` is replaced), so the
//! same drill runs against local processes (`deploy/local/ctl kill|start`) or a real
//! deployment's hooks.

use anyhow::{bail, Context};
use clap::Parser;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[derive(Parser, Debug)]
#[command(name = "drill", about = "zlink failover drill")]
struct Args {
    /// The frontend nginx (redirects and the API go through it).
    #[arg(long, env = "ZLINK_FRONTEND")]
    frontend: String,
    /// URL prefix of the blobs in S3 (bucket and key prefix): `<prefix><slug>` is read to know
    /// a link reached S3 before the drill starts.
    #[arg(long, env = "ZLINK_DRILL_BLOB_URL_PREFIX")]
    blob_url_prefix: String,
    /// An admin API key (creates the drill's links, reads their stats).
    #[arg(long, env = "ZLINK_ADMIN_KEY", hide_env_values = true)]
    admin_key: String,
    /// Components that are the primaries (comma-separated names for the hooks).
    #[arg(long, value_delimiter = ',', default_value = "primary-1,primary-2")]
    primaries: Vec<String>,
    /// Components that are the lastresort processes.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "lastresort-1,lastresort-2"
    )]
    lastresorts: Vec<String>,
    /// Breaks one component; `{component}` is replaced by its name.
    #[arg(long, default_value = "deploy/local/ctl kill {component}")]
    break_cmd: String,
    /// Restores one component and returns once it is ready.
    #[arg(long, default_value = "deploy/local/ctl start {component}")]
    restore_cmd: String,
    /// Checks the mappings after the drill; exit status 0 = no drift.
    #[arg(long, default_value = "deploy/local/ctl reconcile --dry-run")]
    reconcile_cmd: String,
    /// Links the drill creates and requests.
    #[arg(long, default_value_t = 20)]
    links: usize,
    /// Redirects per second through the frontend.
    #[arg(long, default_value_t = 100)]
    rate: u32,
    /// Seconds of load per phase.
    #[arg(long, default_value_t = 10)]
    phase_seconds: u64,
    /// How long to wait for every click to be counted after the last phase, seconds.
    #[arg(long, default_value_t = 180)]
    clicks_within_s: u64,
    /// Where the JSON report goes.
    #[arg(long, default_value = "drill-report.json")]
    report: String,
}

const PHASES: [&str; 5] = [
    "baseline",
    "primaries-down",
    "lastresort-down",
    "lastresort-back",
    "primaries-back",
];

#[derive(Clone, Debug)]
struct Sample {
    phase: usize,
    rung: Option<u8>,
    ok: bool,
    status: u16,
    micros: u64,
    slug: usize,
    click: Option<uuid::Uuid>,
}

fn run_hook(template: &str, component: &str) -> anyhow::Result<()> {
    let cmd = template.replace("{component}", component);
    let status = std::process::Command::new("bash")
        .arg("-c")
        .arg(&cmd)
        .stdout(std::process::Stdio::null())
        .status()
        .with_context(|| format!("running {cmd:?}"))?;
    if !status.success() {
        bail!("{cmd:?} failed: {status}");
    }
    Ok(())
}

/// Checks one answer: the right redirect (rungs 1, 2) or the right meta-refresh page (rung 3).
async fn probe(client: &reqwest::Client, base: &str, slug: &str, url: &str) -> Sample {
    let started = Instant::now();
    let mut s = Sample {
        phase: 0,
        rung: None,
        ok: false,
        status: 0,
        micros: 0,
        slug: 0,
        click: None,
    };
    let Ok(r) = client.get(format!("{base}/{slug}")).send().await else {
        s.micros = started.elapsed().as_micros() as u64;
        return s;
    };
    s.status = r.status().as_u16();
    let header = |name: &str| {
        r.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    };
    s.rung = match header("x-zlink-tier").as_deref() {
        Some("primary") => Some(1),
        Some("lastresort") => Some(2),
        Some("lastresort-nginx") => Some(3),
        _ => None,
    };
    s.click = header("x-zlink-click-id").and_then(|id| uuid::Uuid::parse_str(&id).ok());
    let location = header("location");
    s.ok = match (s.status, s.rung) {
        (301 | 302 | 307 | 308, Some(1 | 2)) => location.as_deref() == Some(url),
        (200, Some(3)) => r.text().await.is_ok_and(|body| {
            body.contains("http-equiv=\"refresh\"")
                && body.contains(&zlink_wire::blob::escape_html(url))
        }),
        _ => false,
    };
    s.micros = started.elapsed().as_micros() as u64;
    s
}

fn pct(sorted: &[u64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    sorted[((sorted.len() as f64 - 1.0) * q).round() as usize] as f64 / 1000.0
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let a = Args::parse();
    anyhow::ensure!((1..=1000).contains(&a.links), "--links 1..=1000");
    anyhow::ensure!((1..=5000).contains(&a.rate), "--rate 1..=5000");
    anyhow::ensure!(
        (1..=600).contains(&a.phase_seconds),
        "--phase-seconds 1..=600"
    );
    let base = a.frontend.trim_end_matches('/').to_string();
    let client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(Duration::from_secs(5))
        .pool_max_idle_per_host(64)
        .build()?;

    // The drill's own links, so their stats are exactly the drill's clicks.
    let run = uuid::Uuid::new_v4().simple().to_string();
    let mut links = Vec::new();
    for i in 0..a.links {
        let slug = format!("drill-{}-{i}", &run[..10]);
        let url = format!("https://example.com/drill/{run}/{i}?q=a&r=b");
        let r = client
            .post(format!("{base}/api/v1/links"))
            .bearer_auth(&a.admin_key)
            .json(&serde_json::json!({"url": url, "slug": slug}))
            .send()
            .await
            .context("creating a drill link")?;
        anyhow::ensure!(
            r.status().as_u16() == 201,
            "creating {slug}: {}",
            r.status()
        );
        links.push((slug, url));
    }
    // Wait until S3 has them: rung 3 must be able to serve every one. (Read straight from the
    // bucket, so the check itself makes no click.)
    eprintln!(
        "drill: {} links created; waiting until S3 has them",
        links.len()
    );
    let s3_ready = Instant::now();
    for (slug, _) in &links {
        let blob = format!("{}{slug}", a.blob_url_prefix);
        while client
            .get(&blob)
            .send()
            .await
            .map(|r| r.status().as_u16())
            .ok()
            != Some(200)
        {
            anyhow::ensure!(
                s3_ready.elapsed() < Duration::from_secs(60),
                "{slug} not in S3 within 60 s ({blob})"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    let phase = Arc::new(AtomicUsize::new(0));
    let samples: Arc<Mutex<Vec<Sample>>> = Arc::default();
    let links = Arc::new(links);
    let stop = Arc::new(tokio::sync::Notify::new());
    let load = {
        let (phase, samples, links, client, base, stop) = (
            phase.clone(),
            samples.clone(),
            links.clone(),
            client.clone(),
            base.clone(),
            stop.clone(),
        );
        let max = u64::from(a.rate) * a.phase_seconds * (PHASES.len() as u64 + 2);
        let every = Duration::from_secs_f64(1.0 / f64::from(a.rate));
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
            let mut inflight = tokio::task::JoinSet::new();
            for i in 0..max {
                tokio::select! {
                    _ = stop.notified() => break,
                    _ = tick.tick() => {}
                }
                let k = (i as usize) % links.len();
                let (links, client, base, samples) =
                    (links.clone(), client.clone(), base.clone(), samples.clone());
                let p = phase.load(Ordering::Relaxed);
                inflight.spawn(async move {
                    let (slug, url) = &links[k];
                    let mut s = probe(&client, &base, slug, url).await;
                    s.phase = p;
                    s.slug = k;
                    samples.lock().unwrap().push(s);
                });
                while inflight.len() > 256 {
                    inflight.join_next().await;
                }
            }
            while inflight.join_next().await.is_some() {}
        })
    };

    let mut actions = Vec::new();
    for (i, name) in PHASES.iter().enumerate() {
        // Requests made while the action runs belong to the new phase: the transition is
        // what the drill is about.
        phase.store(i, Ordering::Relaxed);
        let act_started = Instant::now();
        let result = match i {
            1 => a
                .primaries
                .iter()
                .try_for_each(|c| run_hook(&a.break_cmd, c)),
            2 => a
                .lastresorts
                .iter()
                .try_for_each(|c| run_hook(&a.break_cmd, c)),
            3 => a
                .lastresorts
                .iter()
                .try_for_each(|c| run_hook(&a.restore_cmd, c)),
            4 => a
                .primaries
                .iter()
                .try_for_each(|c| run_hook(&a.restore_cmd, c)),
            _ => Ok(()),
        };
        eprintln!(
            "drill: phase {name} (action took {:.1} s)",
            act_started.elapsed().as_secs_f64()
        );
        if let Err(e) = &result {
            eprintln!("drill: action for {name} failed: {e:#}");
        }
        actions.push(result.map_err(|e| format!("{e:#}")));
        tokio::time::sleep(Duration::from_secs(a.phase_seconds)).await;
    }
    stop.notify_one();
    load.await?;
    let samples = samples.lock().unwrap().clone();

    // Per phase and per rung.
    let mut table = Vec::new();
    let mut wrong_total = 0;
    let mut by_rung: BTreeMap<u8, Vec<u64>> = BTreeMap::new();
    println!(
        "{:<16} {:>8} {:>6} {:>8} {:>8} {:>8}  rungs (requests)",
        "phase", "requests", "wrong", "p50 ms", "p99 ms", "max ms"
    );
    for (i, name) in PHASES.iter().enumerate() {
        let ph: Vec<&Sample> = samples.iter().filter(|s| s.phase == i).collect();
        let mut lat: Vec<u64> = ph.iter().map(|s| s.micros).collect();
        lat.sort_unstable();
        let wrong = ph.iter().filter(|s| !s.ok).count();
        wrong_total += wrong;
        let mut rungs: BTreeMap<String, usize> = BTreeMap::new();
        for s in &ph {
            let r = s.rung.map_or("none".to_string(), |r| r.to_string());
            *rungs.entry(r).or_default() += 1;
            if let (true, Some(r)) = (s.ok, s.rung) {
                by_rung.entry(r).or_default().push(s.micros);
            }
        }
        let mut statuses: BTreeMap<u16, usize> = BTreeMap::new();
        for s in ph.iter().filter(|s| !s.ok) {
            *statuses.entry(s.status).or_default() += 1;
        }
        println!(
            "{:<16} {:>8} {:>6} {:>8.2} {:>8.2} {:>8.2}  {}",
            name,
            ph.len(),
            wrong,
            pct(&lat, 0.5),
            pct(&lat, 0.99),
            pct(&lat, 1.0),
            rungs
                .iter()
                .map(|(r, n)| format!("{r}:{n}"))
                .collect::<Vec<_>>()
                .join(" ")
        );
        table.push(serde_json::json!({
            "phase": name, "requests": ph.len(), "wrong": wrong,
            "wrong_statuses": statuses, "rungs": rungs,
            "p50_ms": pct(&lat, 0.5), "p99_ms": pct(&lat, 0.99), "max_ms": pct(&lat, 1.0),
            "action": actions[i].as_ref().err(),
        }));
    }
    let mut rung_json = BTreeMap::new();
    let base_p99 = by_rung.get_mut(&1).map(|v| {
        v.sort_unstable();
        pct(v, 0.99)
    });
    for (r, v) in by_rung.iter_mut() {
        v.sort_unstable();
        let p99 = pct(v, 0.99);
        let added = base_p99.map(|b| p99 - b);
        println!(
            "rung {r}: {} answers, p50 {:.2} ms, p99 {:.2} ms{}",
            v.len(),
            pct(v, 0.5),
            p99,
            added.map_or(String::new(), |d| format!(" ({d:+.2} ms p99 vs rung 1)"))
        );
        rung_json.insert(
            r.to_string(),
            serde_json::json!({"answers": v.len(), "p50_ms": pct(v, 0.5), "p99_ms": p99, "p99_added_ms": added}),
        );
    }

    // Mappings.
    let reconcile_ok = std::process::Command::new("bash")
        .arg("-c")
        .arg(&a.reconcile_cmd)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    println!(
        "mappings: {} ({})",
        if reconcile_ok { "no drift" } else { "DRIFT" },
        a.reconcile_cmd
    );

    // Clicks: every correct answer carried a click id; each must be counted once, per tier.
    let mut want: HashMap<usize, BTreeMap<&'static str, i64>> = HashMap::new();
    let mut without_id = 0;
    for s in samples.iter().filter(|s| s.ok) {
        if s.click.is_none() {
            without_id += 1;
            continue;
        }
        let tier = match s.rung {
            Some(1) => "primary",
            Some(2) => "lastresort",
            _ => "lastresort-nginx",
        };
        *want.entry(s.slug).or_default().entry(tier).or_default() += 1;
    }
    let deadline = Instant::now() + Duration::from_secs(a.clicks_within_s);
    let (mut lost, mut extra);
    let started = Instant::now();
    loop {
        (lost, extra) = (0i64, 0i64);
        for (k, (slug, _)) in links.iter().enumerate() {
            let got: serde_json::Value = client
                .get(format!("{base}/api/v1/links/{slug}/stats"))
                .bearer_auth(&a.admin_key)
                .send()
                .await?
                .json()
                .await?;
            for tier in ["primary", "lastresort", "lastresort-nginx"] {
                let w = want.get(&k).and_then(|m| m.get(tier)).copied().unwrap_or(0);
                let g = got["by_tier"][tier].as_i64().unwrap_or(0);
                lost += (w - g).max(0);
                extra += (g - w).max(0);
            }
        }
        if (lost == 0 && extra == 0) || Instant::now() >= deadline {
            break;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let made: i64 = want.values().flat_map(|m| m.values()).sum();
    println!(
        "clicks: {made} made, {lost} not counted, {extra} counted too often, {without_id} answers without a click id (checked for {:.0} s)",
        started.elapsed().as_secs_f64()
    );

    let failed = wrong_total > 0
        || lost > 0
        || extra > 0
        || without_id > 0
        || !reconcile_ok
        || actions.iter().any(Result::is_err);
    let report = serde_json::json!({
        "at": chrono::Utc::now().to_rfc3339(),
        "frontend": base, "links": links.len(), "rate": a.rate, "phase_seconds": a.phase_seconds,
        "phases": table, "rungs": rung_json,
        "mappings_ok": reconcile_ok,
        "clicks": {"made": made, "lost": lost, "extra": extra, "without_id": without_id},
        "passed": !failed,
    });
    std::fs::write(&a.report, serde_json::to_vec_pretty(&report)?)
        .with_context(|| format!("writing {}", a.report))?;
    println!(
        "report: {}  →  {}",
        a.report,
        if failed { "FAILED" } else { "PASSED" }
    );
    if failed {
        std::process::exit(1);
    }
    Ok(())
}
