//! The failover drill. Against a running topology: creates links, then keeps a steady, bounded
//! redirect load on the frontend while it breaks tiers and restores them, phase by phase, and
//! checks every answer (the right redirect, or on rung 3 the right meta-refresh page).
//!
//! Faults (`--fault KIND:TIER`, `--ladder`-style `ladder:KIND`, `--fast`, `--matrix`): `kill`,
//! `hang` (frozen: accepts, never answers), `slow` and `blackhole` (through a fault proxy), and
//! `flap` (hung and thawed every few seconds), on any tier: primaries, lastresorts, store,
//! memcached, kafka, replicator, s3. How a component is broken and restored is a command
//! template (`{kind}` and `{component}` are replaced), so the same drill runs against local
//! processes (`deploy/local/ctl fault|heal`) or a real deployment's hooks.
//!
//! Each phase uses its own links, so its clicks can be checked exactly: every answer's click
//! must be counted once in the stats API. Per phase: wrong and failed answers, p50/p99/max,
//! p99 added over the baseline once the phase has settled, clicks sent vs counted, and the
//! verdict against the targets. Prints a table, writes a JSON report and an HTML page with a
//! per-second timeline, checks the mappings (a reconcile command), and exits non-zero when any
//! phase misses a target.

mod alerts;
mod args;
mod hooks;
mod machine;
mod plan;
mod report;
mod writer;

use alerts::watch_alerts;
use anyhow::{bail, Context};
use args::Args;
use clap::Parser;
use hooks::{flap, hook};
use plan::{Action, Kind, Scenario, FLAP_WITH};
use report::{AlertChange, Outcome, Sample, Targets, Write};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use writer::{create_request, probe, verify, writer};

/// The tier → components map: defaults, the primaries/lastresorts flags, then `--tier`.
fn tier_map(a: &Args) -> anyhow::Result<BTreeMap<String, Vec<String>>> {
    let mut m: BTreeMap<String, Vec<String>> = [
        ("store", "cassandra"),
        ("memcached", "memcached"),
        ("kafka", "kafka"),
        ("replicator", "replicator"),
        ("s3", "s3"),
        ("wan", "wan"),
        ("site-s3", "site-s3"),
    ]
    .iter()
    .map(|(t, c)| (t.to_string(), vec![c.to_string()]))
    .collect();
    // The rung-3 canary's S3 page (what `delete` and `corrupt` break).
    m.insert(plan::CANARY_PAGE.into(), vec![zlink_wire::canary::slug(3)]);
    m.insert("primaries".into(), a.primaries.clone());
    m.insert("lastresorts".into(), a.lastresorts.clone());
    for r in &a.replicas {
        m.insert(r.clone(), vec![r.clone()]);
    }
    for t in &a.tiers {
        let (name, comps) = t
            .split_once('=')
            .with_context(|| format!("--tier {t:?}: expected TIER=comp,comp"))?;
        let comps: Vec<String> = comps
            .split(',')
            .filter(|c| !c.is_empty())
            .map(str::to_string)
            .collect();
        anyhow::ensure!(!comps.is_empty(), "--tier {t:?}: no components");
        m.insert(name.to_string(), comps);
    }
    Ok(m)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let a = Args::parse();
    anyhow::ensure!((1..=100).contains(&a.links), "--links 1..=100");
    anyhow::ensure!((1..=5000).contains(&a.rate), "--rate 1..=5000");
    anyhow::ensure!(
        (1..=600).contains(&a.phase_seconds),
        "--phase-seconds 1..=600"
    );
    anyhow::ensure!((1..=60).contains(&a.flap_seconds), "--flap-seconds 1..=60");
    let mut scenarios = Vec::new();
    if a.matrix {
        scenarios.extend(plan::matrix(&a.proxied));
    }
    if a.fast {
        scenarios.extend(plan::fast());
    }
    if a.netcut {
        scenarios.extend(plan::netcut());
    }
    if a.cluster {
        scenarios.extend(plan::cluster(&a.replicas, &a.proxied));
    }
    for f in &a.faults {
        scenarios.push(Scenario::parse(f)?);
    }
    if scenarios.is_empty() {
        scenarios.push(Scenario::Ladder(Kind::Kill));
    }
    let phases = plan::phases(&scenarios, &tier_map(&a)?, &a.proxied, &a.replicas)?;
    anyhow::ensure!(phases.len() <= 200, "at most 200 phases");
    let targets = Targets {
        added_p99_ms: a.max_added_p99_ms,
        max_ms: a.max_ms,
        settle_ms: a.settle_ms,
        eps_ms: a.eps_ms,
    };
    let base = a.frontend.trim_end_matches('/').to_string();
    // The last-resort site's users, if given: every other request goes there directly.
    let site = a.site.as_ref().map(|s| s.trim_end_matches('/').to_string());
    let mut client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(Duration::from_secs(5))
        .pool_max_idle_per_host(64)
        // Below nginx's keep-alive timeout (30 s): a connection nginx is closing as idle, reused
        // at that moment, fails with no answer. Browsers retry such a request; a client that
        // does not must not hold connections that long (counted once as a failed answer in a
        // fast drill, after a slow phase had opened many connections).
        .pool_idle_timeout(Duration::from_secs(20));
    if let Some(ca) = &a.ca_file {
        let pem = std::fs::read(ca).with_context(|| format!("reading {}", ca.display()))?;
        client = client.add_root_certificate(reqwest::Certificate::from_pem(&pem)?);
    }
    let client = client.build()?;

    // A branded domain of the drill's: the last link of each phase is on it.
    let brand = (!a.brand_domain.is_empty() && a.links >= 2).then(|| a.brand_domain.clone());
    if let Some(d) = &brand {
        let r = client
            .post(format!("{base}/api/v1/domains"))
            .bearer_auth(&a.admin_key)
            .json(&serde_json::json!({ "domain": d }))
            .send()
            .await
            .context("registering the drill's branded domain")?;
        anyhow::ensure!(r.status().is_success(), "registering {d}: {}", r.status());
    }
    // Each phase's own links, so their stats are exactly that phase's clicks.
    let run = uuid::Uuid::new_v4().simple().to_string();
    let mut links: Vec<(String, String, Option<String>)> = Vec::new();
    for p in 0..phases.len() {
        for i in 0..a.links {
            let slug = format!("drill-{}-{p}-{i}", &run[..10]);
            let url = format!("https://example.com/drill/{run}/{p}/{i}?q=a&r=b");
            let domain = brand.clone().filter(|_| i == a.links - 1);
            // The topology may still be settling (a store reconnecting): retry a 5xx for a while.
            let since = Instant::now();
            loop {
                let body = serde_json::json!({"url": url, "slug": slug, "domain": domain});
                let r = create_request(&client, &base, &a.admin_key, &slug, &body)
                    .send()
                    .await
                    .context("creating a drill link")?;
                let status = r.status().as_u16();
                if status == 201 {
                    break;
                }
                anyhow::ensure!(
                    status >= 500 && since.elapsed() < Duration::from_secs(30),
                    "creating {slug}: {}",
                    r.status()
                );
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            links.push((slug, url, domain));
        }
    }
    // Wait until S3 has them: rung 3 must be able to serve every one. (Read straight from the
    // bucket, so the check itself makes no click.)
    eprintln!(
        "drill: {} phases, {} links created; waiting until S3 has them",
        phases.len(),
        links.len()
    );
    let s3_ready = Instant::now();
    for (slug, _, domain) in &links {
        let key = zlink_wire::domain::key(domain.as_deref(), slug);
        let blob = format!("{}{key}", a.blob_url_prefix);
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
    let t0 = Instant::now();
    let per_phase = a.links;
    let load = {
        let (phase, samples, links, client, base, site, stop) = (
            phase.clone(),
            samples.clone(),
            links.clone(),
            client.clone(),
            base.clone(),
            site.clone(),
            stop.clone(),
        );
        // Bounded: at most the planned seconds plus an hour of actions at the given rate.
        let max = u64::from(a.rate) * (a.phase_seconds * phases.len() as u64 + 3600);
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
                let p = phase.load(Ordering::Relaxed);
                let k = p * per_phase + (i as usize) % per_phase;
                let target = match &site {
                    Some(site) if i % 2 == 1 => site.clone(),
                    _ => base.clone(),
                };
                let (links, client, base, samples) =
                    (links.clone(), client.clone(), target, samples.clone());
                inflight.spawn(async move {
                    let start_ms = t0.elapsed().as_millis() as u64;
                    let (slug, url, domain) = &links[k];
                    let mut s = probe(&client, &base, slug, url, domain.as_deref()).await;
                    s.phase = p;
                    s.link = k;
                    s.start_ms = start_ms;
                    samples.lock().unwrap().push(s);
                });
                while inflight.len() > 512 {
                    inflight.join_next().await;
                }
            }
            while inflight.join_next().await.is_some() {}
        })
    };

    let alerts_stop = Arc::new(tokio::sync::Notify::new());
    let alert_watch = a.alertmanager.as_ref().map(|am| {
        tokio::spawn(watch_alerts(
            client.clone(),
            am.clone(),
            t0,
            alerts_stop.clone(),
        ))
    });

    let acting = Arc::new(AtomicBool::new(false));
    let write_stop = Arc::new(tokio::sync::Notify::new());
    let writes = (a.create_every_ms > 0).then(|| {
        tokio::spawn(writer(
            client.clone(),
            base.clone(),
            a.admin_key.clone(),
            a.blob_url_prefix.clone(),
            a.lastresort_host
                .as_ref()
                .map(|h| h.trim_end_matches('/').to_string()),
            run.clone(),
            Duration::from_millis(a.create_every_ms),
            phase.clone(),
            acting.clone(),
            t0,
            write_stop.clone(),
        ))
    });

    let mut bounds = Vec::new();
    let mut action_results = Vec::new();
    let mut machine_load = Vec::new();
    // Each phase's end is the next one's start: one reading of /proc per boundary.
    let mut machine_at = machine::snapshot();
    for (i, p) in phases.iter().enumerate() {
        // Requests made while the actions run belong to the new phase: the transition is
        // what the drill is about.
        phase.store(i, Ordering::Relaxed);
        let start_ms = t0.elapsed().as_millis() as u64;
        let act_started = Instant::now();
        // (An invisible fault's creates go on meanwhile: they must all succeed.)
        acting.store(!p.invisible, Ordering::Relaxed);
        let mut err = None;
        for act in &p.actions {
            let (tpl, kind, comp) = match act {
                Action::Break(k, c) => (&a.break_cmd, *k, c),
                Action::Restore(k, c) => (&a.restore_cmd, *k, c),
            };
            if let Err(e) = hook(tpl.clone(), kind, comp.clone()).await {
                eprintln!("drill: {}: {e:#}", p.name);
                err.get_or_insert(format!("{e:#}"));
            }
        }
        acting.store(false, Ordering::Relaxed);
        let action_s = act_started.elapsed().as_secs_f64();
        eprintln!(
            "drill: phase {}/{} {} (actions took {action_s:.1} s)",
            i + 1,
            phases.len(),
            p.name
        );
        if p.flap.is_empty() {
            tokio::time::sleep(Duration::from_secs(a.phase_seconds)).await;
        } else {
            let stop_flap = Arc::new(tokio::sync::Notify::new());
            let f = tokio::spawn(flap(
                a.break_cmd.clone(),
                a.restore_cmd.clone(),
                p.flap.clone(),
                Duration::from_secs(a.flap_seconds),
                stop_flap.clone(),
            ));
            tokio::time::sleep(Duration::from_secs(a.phase_seconds)).await;
            stop_flap.notify_one();
            if let Some(e) = f.await? {
                err.get_or_insert(e);
            }
        }
        bounds.push((start_ms, t0.elapsed().as_millis() as u64));
        action_results.push((err, action_s));
        let now = machine::snapshot();
        machine_load.push(machine::between(&machine_at, &now));
        machine_at = now;
    }
    stop.notify_one();
    write_stop.notify_one();
    alerts_stop.notify_one();
    load.await?;
    let alerts = match alert_watch {
        Some(w) => w.await?,
        None => Vec::new(),
    };
    let samples = samples.lock().unwrap().clone();
    let mut results = report::phase_results(&phases, &samples, &bounds, &targets);
    for ((r, (err, s)), m) in results.iter_mut().zip(action_results).zip(machine_load) {
        r.action_error = err;
        r.action_s = s;
        r.machine = m;
    }
    if let Some(w) = writes {
        let mut w = w.await?;
        verify(&client, &base, &a.admin_key, &run, &mut w).await;
        report::add_writes(&phases, &mut results, &w, a.eps_ms);
    }

    // Mappings: ScyllaDB vs S3. A store that lost acknowledged objects (a killed S3 server can)
    // shows up here; the repair is the runbook's, and what it could not repair fails the drill.
    let shell_ok = |cmd: &str| {
        std::process::Command::new("bash")
            .arg("-c")
            .arg(cmd)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .map(|s| s.success())
            .unwrap_or(false)
    };
    let drift_found = !shell_ok(&a.reconcile_cmd);
    let reconcile_ok = if drift_found && !a.repair_cmd.is_empty() {
        shell_ok(&a.repair_cmd);
        shell_ok(&a.reconcile_cmd)
    } else {
        !drift_found
    };

    // Clicks: every right answer carried a click id, and each is counted once (whichever tier
    // the counter credits when a late copy arrives from another one: totals per phase).
    let mut sent = vec![0i64; phases.len()];
    let mut without_id = 0;
    for s in samples.iter().filter(|s| s.outcome == Outcome::Right) {
        if s.click.is_none() {
            without_id += 1;
        } else {
            sent[s.phase] += 1;
        }
    }
    let deadline = Instant::now() + Duration::from_secs(a.clicks_within_s);
    let started = Instant::now();
    let mut counted = vec![0i64; phases.len()];
    loop {
        counted.iter_mut().for_each(|c| *c = 0);
        for (k, (slug, _, domain)) in links.iter().enumerate() {
            let on = domain
                .as_deref()
                .map(|d| format!("?domain={d}"))
                .unwrap_or_default();
            let got: serde_json::Value = client
                .get(format!("{base}/api/v1/links/{slug}/stats{on}"))
                .bearer_auth(&a.admin_key)
                .send()
                .await?
                .json()
                .await?;
            counted[k / per_phase] += got["total"].as_i64().unwrap_or(0);
        }
        if counted == sent || Instant::now() >= deadline {
            break;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    for (i, r) in results.iter_mut().enumerate() {
        r.clicks_sent = sent[i];
        r.clicks_counted = counted[i];
    }
    report::judge(&phases, &mut results, &targets);
    let alerts_judged = a.alertmanager.is_some() && a.phase_seconds >= a.alert_window_s;
    report::add_alerts(&phases, &mut results, &alerts, alerts_judged);
    report::print_table(&phases, &results);
    report::print_machine(&phases, &results);
    if a.alertmanager.is_some() {
        for (p, r) in phases.iter().zip(&results) {
            if !r.alerts.is_empty() {
                println!("alerts during {}: {}", p.name, r.alerts.join(", "));
            }
        }
        if !alerts_judged {
            println!(
                "alerts recorded, not judged: phases of {} s are shorter than --alert-window-s {}",
                a.phase_seconds, a.alert_window_s
            );
        }
    }
    println!(
        "mappings: {} ({})",
        match (drift_found, reconcile_ok) {
            (false, _) => "no drift",
            (true, true) => "drift found (S3 lost objects it had acknowledged) and repaired",
            (true, false) => "DRIFT that the repair did not fix",
        },
        a.reconcile_cmd
    );
    println!(
        "clicks: {} sent, {} counted, {without_id} right answers without a click id (checked for {:.0} s)",
        sent.iter().sum::<i64>(),
        counted.iter().sum::<i64>(),
        started.elapsed().as_secs_f64()
    );

    let missed = results.iter().filter(|r| !r.misses.is_empty()).count();
    let failed = missed > 0 || without_id > 0 || !reconcile_ok;
    let tl = report::timeline(&samples);
    let report = serde_json::json!({
        "at": chrono::Utc::now().to_rfc3339(),
        "frontend": base, "links_per_phase": per_phase, "rate": a.rate,
        "brand_domain": brand,
        "phase_seconds": a.phase_seconds,
        "targets": {"added_p99_ms": targets.added_p99_ms, "max_ms": targets.max_ms,
                    "settle_ms": targets.settle_ms, "eps_ms": targets.eps_ms},
        "phases": phases.iter().zip(&results).map(|(p, r)| report::phase_json(p, r)).collect::<Vec<_>>(),
        "timeline": tl.iter().map(|b| serde_json::json!({
            "right": b[0], "wrong": b[1], "failed": b[2], "p50_ms": b[3], "p99_ms": b[4]})).collect::<Vec<_>>(),
        "mappings_ok": reconcile_ok, "drift_found_before_repair": drift_found,
        "alerts": alerts.iter().map(|c| serde_json::json!({
            "at_ms": c.at_ms, "alert": c.alert, "state": if c.firing { "firing" } else { "resolved" }})).collect::<Vec<_>>(),
        "alerts_judged": alerts_judged,
        "clicks_without_id": without_id,
        "passed": !failed,
    });
    std::fs::write(&a.report, serde_json::to_vec_pretty(&report)?)
        .with_context(|| format!("writing {}", a.report))?;
    let html_path = std::path::Path::new(&a.report).with_extension("html");
    let title = format!(
        "zlink drill {} — {}",
        chrono::Utc::now().format("%Y-%m-%d %H:%M UTC"),
        if failed { "FAILED" } else { "PASSED" }
    );
    std::fs::write(
        &html_path,
        report::html(&title, &phases, &results, &tl, &alerts),
    )
    .with_context(|| format!("writing {}", html_path.display()))?;
    println!(
        "report: {} and {}  →  {}",
        a.report,
        html_path.display(),
        if failed {
            format!(
                "FAILED ({missed} of {} phases missed a target)",
                phases.len()
            )
        } else {
            "PASSED".to_string()
        }
    );
    if failed {
        std::process::exit(1);
    }
    Ok(())
}
