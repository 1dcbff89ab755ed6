//! `zlink-xtask bench-cores-report`: the table of `deploy/local/bench-cores` (servers pinned to
//! their own cores, the floor in the same run) from its `RESULT step=ROW round=N ...` lines:
//! the median of each row's rounds, ratios against the bare hyper floor and nginx `return 302`
//! (and of the proxy rows against nginx proxying to the floor), CPU per request of the server
//! processes, system calls and context switches per request.

use crate::benchrun::parse_result;
use std::collections::BTreeMap;

/// The rows, in table order: name, what it is, and the row it is compared with as its floor.
pub const ROWS: [(&str, &str, &str); 12] = [
    ("nginx-302", "nginx `return 302`, 1 worker", "floor-bare"),
    (
        "floor-bare",
        "bare hyper 302 (zlink-floor bare)",
        "floor-bare",
    ),
    (
        "floor-kit",
        "tiers' accept loop, fixed 302 (zlink-floor kit)",
        "floor-bare",
    ),
    (
        "primary",
        "primary-1 (hot, click emission on)",
        "floor-bare",
    ),
    ("lastresort", "lastresort-1 (hot, spool on)", "floor-bare"),
    ("proxy-floor", "frontend nginx → floor", "proxy-floor"),
    ("frontend", "frontend nginx → primaries", "proxy-floor"),
    (
        "lr-proxy-floor",
        "lastresort host nginx → floor",
        "lr-proxy-floor",
    ),
    (
        "lastresort-host",
        "lastresort host nginx → lastresorts",
        "lr-proxy-floor",
    ),
    (
        "nginx-302-tls",
        "nginx `return 302` over TLS, 1 worker",
        "floor-bare",
    ),
    (
        "proxy-floor-tls",
        "frontend nginx → floor, over TLS",
        "proxy-floor-tls",
    ),
    (
        "frontend-tls",
        "frontend nginx → primaries, over TLS",
        "proxy-floor-tls",
    ),
];

/// The nginx `return 302` yardstick a row is read against: over TLS for the TLS rows.
fn yardstick(row: &str) -> &'static str {
    if row.ends_with("-tls") {
        "nginx-302-tls"
    } else {
        "nginx-302"
    }
}

/// The heading and table header of the section in docs/benchmarks.md.
pub const MD_SECTION: &str = "## Pinned cores (`deploy/local/bench-cores`)\n\nServers under test pinned to their own core(s), wrk (1 thread, 16 connections, 300 hot links) and the rest of the topology on the other(s); medians of the run's rounds. Ratios are req/s over the bare hyper floor (`zlink-floor bare`) of the same run; the proxy rows over the same nginx config proxying to that floor. CPU is the server processes' own µs per request. On 2 cores the floor rows end with wrk's core ~99% busy (the floor's req/s is the load generator's ceiling): the CPU per request is the comparison to read (the run's table has it as CPU/fl).\n\n";
pub const MD_HEADER: &str = "| date (UTC) | commit | server / load CPUs | nginx 302 req/s | floor req/s | floor CPU µs | nginx 302 / floor | kit / floor | primary / floor | primary CPU µs | lastresort / floor | lastresort CPU µs | frontend / proxy-floor | lr-host / lr-proxy-floor | frontend TLS / nginx 302 TLS | proxy-floor TLS / nginx 302 TLS | frontend TLS / proxy-floor TLS |";

/// Median of the values (None when empty).
fn median(mut v: Vec<f64>) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    Some(if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    })
}

/// A row's medians: rps, p99_ms, cpu_us (sum of the server processes'), syscalls_per_req,
/// cs_per_req, errors, rounds.
pub fn medians(lines: &str) -> BTreeMap<String, BTreeMap<&'static str, f64>> {
    let mut by_row: BTreeMap<String, Vec<BTreeMap<String, String>>> = BTreeMap::new();
    for l in lines.lines().filter(|l| l.starts_with("RESULT step=")) {
        let r = parse_result(l);
        if let Some(step) = r.get("step") {
            by_row.entry(step.clone()).or_default().push(r);
        }
    }
    let num = |r: &BTreeMap<String, String>, k: &str| r.get(k).and_then(|v| v.parse::<f64>().ok());
    by_row
        .into_iter()
        .map(|(row, runs)| {
            let mut m = BTreeMap::new();
            let col = |f: &dyn Fn(&BTreeMap<String, String>) -> Option<f64>| {
                median(runs.iter().filter_map(f).collect())
            };
            let cpu = |r: &BTreeMap<String, String>| {
                let v: Vec<f64> = r
                    .iter()
                    .filter(|(k, _)| k.starts_with("cpu_us_"))
                    .filter_map(|(_, v)| v.parse().ok())
                    .collect();
                (!v.is_empty()).then(|| v.iter().sum())
            };
            for (k, v) in [
                ("rps", col(&|r| num(r, "rps"))),
                ("p99_ms", col(&|r| num(r, "p99_ms"))),
                ("cpu_us", col(&cpu)),
                ("syscalls_per_req", col(&|r| num(r, "syscalls_per_req"))),
                ("cs_per_req", col(&|r| num(r, "cs_per_req"))),
                ("errors", col(&|r| num(r, "errors"))),
                ("server_busy_pct", col(&|r| num(r, "server_busy_pct"))),
                ("load_busy_pct", col(&|r| num(r, "load_busy_pct"))),
            ] {
                if let Some(v) = v {
                    m.insert(k, v);
                }
            }
            m.insert("rounds", runs.len() as f64);
            (row, m)
        })
        .collect()
}

fn f(v: Option<f64>, digits: usize) -> String {
    v.map_or("-".into(), |v| format!("{v:.digits$}"))
}

/// The printed table and the dated markdown row.
pub fn report(lines: &str, date: &str, commit: &str, cpus: &str) -> (String, String) {
    let m = medians(lines);
    let get = |row: &str, k: &str| m.get(row).and_then(|r| r.get(k)).copied();
    let ratio = |row: &str, base: &str| match (get(row, "rps"), get(base, "rps")) {
        (Some(a), Some(b)) if b > 0.0 => Some(a / b),
        _ => None,
    };
    // The base's CPU per request over the row's: the same ratio measured in CPU, not in
    // req/s (which the load generator can cap).
    let cpu_ratio = |row: &str, base: &str| match (get(row, "cpu_us"), get(base, "cpu_us")) {
        (Some(a), Some(b)) if a > 0.0 => Some(b / a),
        _ => None,
    };
    let mut table =
        format!(
        "bench-cores {date} {commit}, server / load CPUs {cpus}, medians of each row's rounds\n\
         {:<48} {:>8} {:>8} {:>8} {:>7} {:>8} {:>8} {:>8} {:>6} {:>6} {:>6} {:>6}\n",
        "row", "req/s", "/ floor", "/ nginx", "p99 ms", "CPU µs", "sys/req", "cs/req", "errors",
        "srv %", "load %", "CPU/fl"
    );
    for (row, label, base) in ROWS {
        if !m.contains_key(row) {
            continue;
        }
        table.push_str(&format!(
            "{:<48} {:>8} {:>8} {:>8} {:>7} {:>8} {:>8} {:>8} {:>6} {:>6} {:>6} {:>6}\n",
            format!("{row}: {label}"),
            f(get(row, "rps"), 0),
            f(ratio(row, base), 2),
            f(ratio(row, yardstick(row)), 2),
            f(get(row, "p99_ms"), 2),
            f(get(row, "cpu_us"), 1),
            f(get(row, "syscalls_per_req"), 2),
            f(get(row, "cs_per_req"), 3),
            f(get(row, "errors"), 0),
            f(get(row, "server_busy_pct"), 0),
            f(get(row, "load_busy_pct"), 0),
            f(cpu_ratio(row, base), 2),
        ));
    }
    let row = format!(
        "| {date} | {commit} | {cpus} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
        f(get("nginx-302", "rps"), 0),
        f(get("floor-bare", "rps"), 0),
        f(get("floor-bare", "cpu_us"), 1),
        f(ratio("nginx-302", "floor-bare"), 2),
        f(ratio("floor-kit", "floor-bare"), 2),
        f(ratio("primary", "floor-bare"), 2),
        f(get("primary", "cpu_us"), 1),
        f(ratio("lastresort", "floor-bare"), 2),
        f(get("lastresort", "cpu_us"), 1),
        f(ratio("frontend", "proxy-floor"), 2),
        f(ratio("lastresort-host", "lr-proxy-floor"), 2),
        f(ratio("frontend-tls", "nginx-302-tls"), 2),
        f(ratio("proxy-floor-tls", "nginx-302-tls"), 2),
        f(ratio("frontend-tls", "proxy-floor-tls"), 2),
    );
    (table, row)
}

/// `text` (docs/benchmarks.md) with `row` added at the end of the table whose header line is
/// `header`; the section (heading, `header` and its separator) appended first if missing.
pub fn insert_row(text: &str, section: &str, header: &str, row: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    let Some(h) = lines.iter().position(|l| *l == header) else {
        let cols = header.matches('|').count() - 1;
        let mut out = text.trim_end().to_string();
        out.push_str("\n\n");
        out.push_str(section);
        out.push_str(header);
        out.push('\n');
        out.push_str(&"|---".repeat(cols));
        out.push_str("|\n");
        out.push_str(row);
        out.push('\n');
        return out;
    };
    let mut end = h + 1;
    while end < lines.len() && lines[end].starts_with('|') {
        end += 1;
    }
    let mut out: Vec<&str> = lines[..end].to_vec();
    out.push(row);
    out.extend_from_slice(&lines[end..]);
    let mut s = out.join("\n");
    s.push('\n');
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    const RUN: &str = "\
RESULT step=floor-bare requests=900 rps=90000 p99_ms=0.4 errors=0 cpu_us_floor=10.0 rss_mib_floor=3 syscalls_per_req=1.10 cs_per_req=0.010 round=1
RESULT step=floor-bare requests=1000 rps=100000 p99_ms=0.3 errors=0 cpu_us_floor=9.0 rss_mib_floor=3 round=2
RESULT step=floor-bare requests=950 rps=95000 p99_ms=0.5 errors=0 cpu_us_floor=9.5 rss_mib_floor=3 round=3
RESULT step=primary requests=500 rps=50000 p99_ms=1.0 errors=0 cpu_us_primary_1=18.0 round=1
RESULT step=proxy-floor requests=300 rps=30000 p99_ms=1 errors=0 cpu_us_nginx=20.0 cpu_us_floor=10.0 round=1
RESULT step=frontend requests=240 rps=24000 p99_ms=1 errors=0 cpu_us_nginx=21.0 cpu_us_primary_1=15.0 cpu_us_primary_2=0.5 round=1
RESULT step=nginx-302-tls requests=800 rps=80000 p99_ms=1 errors=0 cpu_us_nginx=9.0 round=1
RESULT step=proxy-floor-tls requests=280 rps=28000 p99_ms=1 errors=0 cpu_us_nginx=25.0 cpu_us_floor=10.0 round=1
RESULT step=frontend-tls requests=200 rps=20000 p99_ms=1 errors=0 cpu_us_nginx=26.0 cpu_us_primary_1=15.0 round=1
";

    #[test]
    fn medians_of_rounds_and_cpu_summed_over_the_server_processes() {
        let m = medians(RUN);
        assert_eq!(m["floor-bare"]["rps"], 95000.0);
        assert_eq!(m["floor-bare"]["cpu_us"], 9.5);
        assert_eq!(m["floor-bare"]["rounds"], 3.0);
        assert_eq!(m["floor-bare"]["syscalls_per_req"], 1.1);
        assert_eq!(m["frontend"]["cpu_us"], 36.5);
    }

    #[test]
    fn ratios_are_against_the_floor_of_the_same_run() {
        let (table, row) = report(RUN, "2026-11-27 00:00", "abc", "0 / 1");
        assert!(table.contains("primary: primary-1"), "{table}");
        // primary 50,000 over the floor's median 95,000; frontend over its proxy floor.
        assert!(row.contains("| 0.53 | 18.0 |"), "{row}");
        assert!(row.contains("| 0.80 | - |"), "{row}");
        assert!(row.starts_with("| 2026-11-27 00:00 | abc | 0 / 1 | - | 95000 | 9.5 | - |"));
        // Over TLS: the frontend and the proxy floor against the TLS yardstick, and each other.
        assert!(row.ends_with("| 0.25 | 0.35 | 0.71 |"), "{row}");
        assert!(
            table.contains("frontend-tls: frontend nginx → primaries, over TLS")
                && table.lines().any(|l| l.starts_with("frontend-tls")
                    && l.split_whitespace().any(|w| w == "0.71")
                    && l.split_whitespace().any(|w| w == "0.25")),
            "{table}"
        );
    }

    #[test]
    fn a_row_goes_to_the_end_of_its_own_table() {
        let text = "# B\n\n| a | b |\n|---|---|\n| 1 | 2 |\n\n## Other\n\ntext\n";
        let once = insert_row(text, "## S\n\n", "| x | y |", "| 3 | 4 |");
        assert!(
            once.ends_with("## S\n\n| x | y |\n|---|---|\n| 3 | 4 |\n"),
            "{once}"
        );
        let twice = insert_row(&once, "## S\n\n", "| x | y |", "| 5 | 6 |");
        assert!(twice.ends_with("| 3 | 4 |\n| 5 | 6 |\n"), "{twice}");
        let first = insert_row(&twice, "", "| a | b |", "| 7 | 8 |");
        assert!(
            first.contains("| 1 | 2 |\n| 7 | 8 |\n\n## Other"),
            "{first}"
        );
    }
}
