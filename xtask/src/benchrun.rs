//! The one-run benchmark's pieces (`deploy/local/bench-all`): [`load`] runs wrk against one
//! target while it samples the CPU time of every topology process from `/proc`, and [`report`]
//! turns the run's `RESULT` lines into the table, a JSON document and a dated row of
//! `docs/benchmarks.md`.
//!
//! Every result is one line `RESULT step=NAME key=value ...` (the other drivers' lines get
//! their `step=` from the wrapper), so the report needs no knowledge of who printed what.

use anyhow::{bail, Context, Result};
use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

/// CPU time (user + system, all threads) of `pid` and every descendant, in clock ticks.
fn cpu_ticks(pid: u32, children: &BTreeMap<u32, Vec<u32>>) -> u64 {
    let own = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| stat_ticks(&s))
        .unwrap_or(0);
    own + children
        .get(&pid)
        .map_or(0, |c| c.iter().map(|&k| cpu_ticks(k, children)).sum())
}

/// utime + stime of a `/proc/PID/stat` line (fields 14 and 15, after the `(comm)`, which may
/// itself contain spaces and parentheses).
fn stat_ticks(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // rest starts at field 3 (state): utime is field 14 → index 11.
    Some(f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?)
}

fn stat_ppid(stat: &str) -> Option<u32> {
    let rest = &stat[stat.rfind(')')? + 2..];
    rest.split_whitespace().nth(1)?.parse().ok()
}

/// Parent → children over every process (nginx masters' workers, a shell's child).
fn process_tree() -> BTreeMap<u32, Vec<u32>> {
    let mut tree: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return tree;
    };
    for e in dir.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        if let Some(pp) = std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|s| stat_ppid(&s))
        {
            tree.entry(pp).or_default().push(pid);
        }
    }
    tree
}

fn rss_mib(pid: u32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kb: u64 = s
        .lines()
        .find(|l| l.starts_with("VmRSS:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()?;
    Some(kb / 1024)
}

/// `name=pid,name=pid` (a name may repeat: its pids are summed).
pub fn parse_procs(spec: &str) -> Result<Vec<(String, u32)>> {
    spec.split(',')
        .filter(|s| !s.is_empty())
        .map(|p| {
            let (n, pid) = p
                .split_once('=')
                .with_context(|| format!("process {p:?} is not NAME=PID"))?;
            let ok = !n.is_empty()
                && n.chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
            anyhow::ensure!(ok, "process name {n:?}: letters, digits, - and _ only");
            Ok((n.to_string(), pid.parse().context("pid")?))
        })
        .collect()
}

/// The `RESULT` line wrk's script (`deploy/local/bench/slugs.lua`) printed, as key → value.
pub fn parse_result(line: &str) -> BTreeMap<String, String> {
    line.trim()
        .strip_prefix("RESULT")
        .unwrap_or("")
        .split_whitespace()
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

pub struct Load<'a> {
    pub step: &'a str,
    pub url: &'a str,
    pub script: &'a Path,
    pub slugs: &'a Path,
    pub secs: u32,
    pub conns: u32,
    pub threads: u32,
    pub procs: Vec<(String, u32)>,
}

/// Runs wrk for `secs` (bounded: wrk's own duration, 2 s request timeout) against a 127/8
/// target and prints `RESULT step=... requests rps p50_ms p99_ms max_ms errors` plus
/// `cpu_us_NAME` (CPU per request of each process group) and `rss_mib_NAME` after the load.
pub fn load(l: &Load) -> Result<()> {
    let host = l
        .url
        .strip_prefix("http://")
        .or_else(|| l.url.strip_prefix("https://"))
        .context("target must be http:// or https://")?
        .split(['/', ':'])
        .next()
        .unwrap_or("");
    let ip: std::net::IpAddr = host.parse().context("target must be an IP address")?;
    let local = match ip {
        std::net::IpAddr::V4(v4) => v4.is_loopback() || v4.octets()[..2] == [10, 231],
        std::net::IpAddr::V6(v6) => v6.is_loopback(),
    };
    anyhow::ensure!(
        local,
        "load only targets 127.0.0.0/8 or the topology's namespaces (10.231/16)"
    );
    anyhow::ensure!(l.secs > 0 && l.secs <= 600, "--secs 1..=600");
    let tree = process_tree();
    let groups: Vec<(String, Vec<u32>)> = {
        let mut m: BTreeMap<String, Vec<u32>> = BTreeMap::new();
        for (n, pid) in &l.procs {
            m.entry(n.clone()).or_default().push(*pid);
        }
        m.into_iter().collect()
    };
    let sample = || -> Vec<u64> {
        groups
            .iter()
            .map(|(_, pids)| pids.iter().map(|&p| cpu_ticks(p, &tree)).sum())
            .collect()
    };
    let before = sample();
    let out = Command::new("wrk")
        .args([
            &format!("-t{}", l.threads),
            &format!("-c{}", l.conns),
            &format!("-d{}s", l.secs),
            "--timeout",
            "2s",
            "-s",
        ])
        .arg(l.script)
        .arg(l.url)
        .env("SLUGS_FILE", l.slugs)
        .output()
        .context("running wrk (deploy/local/install installs it)")?;
    let after = sample();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let Some(line) = stdout.lines().find(|l| l.starts_with("RESULT")) else {
        bail!(
            "wrk printed no RESULT line: {}{}",
            stdout,
            String::from_utf8_lossy(&out.stderr)
        );
    };
    let r = parse_result(line);
    let requests: f64 = r
        .get("requests")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0);
    let tck = clock_ticks_per_s();
    let mut fields = format!(
        "RESULT step={} {}",
        l.step,
        line.trim()["RESULT ".len()..].trim()
    );
    for (((name, pids), b), a) in groups.iter().zip(&before).zip(&after) {
        let us = if requests > 0.0 {
            (a.saturating_sub(*b)) as f64 / tck * 1e6 / requests
        } else {
            0.0
        };
        fields.push_str(&format!(" cpu_us_{}={us:.1}", name.replace('-', "_")));
        let rss: u64 = pids.iter().filter_map(|&p| rss_mib(p)).sum();
        fields.push_str(&format!(" rss_mib_{}={rss}", name.replace('-', "_")));
    }
    println!("{fields}");
    Ok(())
}

fn clock_ticks_per_s() -> f64 {
    // Linux reports utime/stime in USER_HZ, which is 100 on every architecture Rust targets
    // here; `getconf CLK_TCK` confirms it when available.
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
        .unwrap_or(100.0)
}

/// One run's results: every `RESULT step=...` line of `results`, in order.
pub fn read_results(results: &Path) -> Result<Vec<BTreeMap<String, String>>> {
    let text = std::fs::read_to_string(results)
        .with_context(|| format!("reading {}", results.display()))?;
    Ok(text
        .lines()
        .filter(|l| l.starts_with("RESULT step="))
        .map(parse_result)
        .collect())
}

fn num(r: &BTreeMap<String, String>, k: &str) -> Option<f64> {
    r.get(k)?.parse().ok()
}

/// The hot-path steps, in table order, with the label the table shows.
pub const HOT: [(&str, &str); 7] = [
    ("hot-nginx-302", "nginx `return 302` (yardstick)"),
    ("hot-primary", "primary (memcached + click spool → Kafka)"),
    ("hot-lastresort", "lastresort (local cache + spool)"),
    ("hot-frontend", "frontend nginx → primaries"),
    ("hot-lastresort-host", "lastresort-host nginx → lastresorts"),
    ("hot-rung3", "lastresort-host nginx → S3 (rung 3)"),
    ("hot-primary-counter", "primary, click counter running"),
];

/// The table the benchmark prints, the JSON document, and the dated markdown row.
pub struct Report {
    pub table: String,
    pub json: serde_json::Value,
    pub row: String,
}

pub fn report(results: &[BTreeMap<String, String>], date: &str, commit: &str) -> Report {
    let by_step = |s: &str| {
        results
            .iter()
            .find(|r| r.get("step").map(String::as_str) == Some(s))
    };
    let yard = by_step("hot-nginx-302").and_then(|r| num(r, "rps"));
    let mut table = String::from(
        "target                                        req/s  ratio  p50 ms  p99 ms  max ms  errors  CPU µs/req (processes ≥ 0.5)\n",
    );
    let mut ratios = BTreeMap::new();
    for (step, label) in HOT {
        let Some(r) = by_step(step) else { continue };
        let rps = num(r, "rps").unwrap_or(0.0);
        let ratio = yard.filter(|y| *y > 0.0).map(|y| rps / y);
        if let Some(x) = ratio {
            ratios.insert(step, x);
        }
        let mut cpu: Vec<(String, f64)> = r
            .iter()
            .filter_map(|(k, v)| Some((k.strip_prefix("cpu_us_")?.to_string(), v.parse().ok()?)))
            .filter(|(_, v): &(String, f64)| *v >= 0.5)
            .collect();
        cpu.sort_by(|a, b| b.1.total_cmp(&a.1));
        let cpu: Vec<String> = cpu.iter().map(|(n, v)| format!("{n} {v:.1}")).collect();
        table.push_str(&format!(
            "{label:<44} {rps:>6.0}  {}  {:>6.2}  {:>6.2}  {:>6.1}  {:>6}  {}\n",
            ratio.map_or("   - ".into(), |x| format!("{x:>5.2}")),
            num(r, "p50_ms").unwrap_or(0.0),
            num(r, "p99_ms").unwrap_or(0.0),
            num(r, "max_ms").unwrap_or(0.0),
            r.get("errors").map_or("-", String::as_str),
            cpu.join(", ")
        ));
    }
    let others: Vec<String> = results
        .iter()
        .filter(|r| {
            !HOT.iter()
                .any(|(s, _)| r.get("step").map(String::as_str) == Some(*s))
        })
        .map(|r| {
            let kv: Vec<String> = r
                .iter()
                .filter(|(k, _)| k.as_str() != "step")
                .map(|(k, v)| format!("{k}={v}"))
                .collect();
            format!(
                "{:<24} {}",
                r.get("step").map_or("", String::as_str),
                kv.join(" ")
            )
        })
        .collect();
    if !others.is_empty() {
        table.push('\n');
        table.push_str(&others.join("\n"));
        table.push('\n');
    }
    let get = |s: &str, k: &str| by_step(s).and_then(|r| num(r, k));
    let f = |v: Option<f64>, prec: usize| v.map_or("-".to_string(), |x| format!("{x:.prec$}"));
    let ratio = |s: &str| f(ratios.get(s).copied(), 2);
    // p99 of a cold run, and how many of its answers were not a 302.
    let cold = |s: &str| match get(s, "errors") {
        Some(e) if e > 0.0 => format!("{} ({e:.0} not 302)", f(get(s, "p99_ms"), 1)),
        _ => f(get(s, "p99_ms"), 1),
    };
    let row = format!(
        "| {date} | {commit} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} / {} |",
        f(yard, 0),
        ratio("hot-primary"),
        ratio("hot-lastresort"),
        ratio("hot-frontend"),
        ratio("hot-lastresort-host"),
        ratio("hot-rung3"),
        ratio("hot-primary-counter"),
        cold("cold-primary"),
        cold("cold-lastresort"),
        f(get("replication", "visible_p99_ms"), 0),
        f(get("clicks-100", "events_per_s"), 0),
        f(get("clicks-1000", "events_per_s"), 0),
        f(get("clicks-100000", "events_per_s"), 0),
        memory_cell(results),
        f(get("clicks-1000-redirects", "events_per_s"), 0),
        f(get("clicks-100000-redirects", "events_per_s"), 0),
    );
    let json = serde_json::json!({
        "date": date,
        "commit": commit,
        "ratios": ratios,
        "steps": results,
    });
    Report { table, json, row }
}

/// `primary 80 MiB, lastresort 40 MiB` after the distinct-links step.
fn memory_cell(results: &[BTreeMap<String, String>]) -> String {
    let cells: Vec<String> = results
        .iter()
        .filter(|r| r.get("step").is_some_and(|s| s.starts_with("distinct-")))
        .filter_map(|r| {
            let step = r.get("step")?;
            let tier = step.strip_prefix("distinct-")?;
            let rss = r.get(&format!("rss_mib_{}", tier.replace('-', "_")))?;
            Some(format!("{tier} {rss} MiB / {} links", r.get("requests")?))
        })
        .collect();
    if cells.is_empty() {
        "-".into()
    } else {
        cells.join(", ")
    }
}

/// The header `docs/benchmarks.md` starts with (written when the file is new).
pub const MD_HEADER: &str = "# Benchmarks\n\nOne row per run of `deploy/local/bench-all` on the running local topology (2 cores; wrk\n-t2 -c16 over 1,000 hot links; click counter stopped unless the column says otherwise).\nRatios are req/s over nginx `return 302` measured in the same run. The run's full table and\nJSON are in `docs/bench/`.\n\n| date (UTC) | commit | nginx 302 req/s | primary | lastresort | frontend→primary | lr-host→lastresort | lr-host→S3 | primary, counter on | cold store p99 ms | cold S3 p99 ms | create→S3 p99 ms | clicks/s 100 links | clicks/s 1k links | clicks/s 100k links | RSS after distinct links | clicks/s 1k / 100k links, 4k redirects/s |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_survive_spaces_and_parens_in_the_name() {
        let s = "123 (nginx: worker (x)) S 100 123 123 0 -1 4194368 5 0 0 0 250 75 0 0 20 0 1 0";
        assert_eq!(stat_ppid(s), Some(100));
        assert_eq!(stat_ticks(s), Some(325));
    }

    #[test]
    fn procs_parse_and_refuse_odd_names() {
        let p = parse_procs("primary-1=10,nginx=11,nginx=12").unwrap();
        assert_eq!(p.len(), 3);
        assert!(parse_procs("a b=1").is_err());
        assert!(parse_procs("x").is_err());
    }

    #[test]
    fn report_ratios_are_over_the_yardstick_of_the_same_run() {
        let lines = [
            "RESULT step=hot-nginx-302 requests=800 rps=100000 p50_ms=0.1 p99_ms=1 max_ms=3 errors=0 cpu_us_bench_nginx=6.0",
            "RESULT step=hot-primary requests=400 rps=50000 p50_ms=0.3 p99_ms=2 max_ms=9 errors=0 cpu_us_primary_1=16.2 cpu_us_kafka=0.2",
            "RESULT step=cold-primary cold_requests=500 p50_ms=4.4 p99_ms=12.5 max_ms=40",
            "RESULT step=distinct-primary requests=200000 rps=9000 rss_mib_primary=80",
        ];
        let rs: Vec<_> = lines.iter().map(|l| parse_result(l)).collect();
        let r = report(&rs, "2026-11-24 07:00", "abc1234");
        assert!(r.table.contains(" 0.50 "), "{}", r.table);
        assert!(r.table.contains("primary_1 16.2"), "{}", r.table);
        assert!(!r.table.contains("kafka 0.2"), "{}", r.table);
        assert!(r.row.contains("| 100000 | 0.50 |"), "{}", r.row);
        assert!(r.row.contains("| 12.5 |"), "{}", r.row);
        assert!(r.row.contains("primary 80 MiB / 200000 links"), "{}", r.row);
        assert_eq!(r.json["ratios"]["hot-primary"], 0.5);
    }
}
