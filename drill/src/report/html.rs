//! The drill's self-contained HTML report: the per-second timeline and the phase table.

use super::*;

fn esc(s: &str) -> String {
    zlink_wire::blob::escape_html(s)
}

/// A self-contained HTML page: the per-second timeline (answers right/wrong/failed, p50/p99
/// on a log scale, phases shaded) and the phase table.
pub fn html(
    title: &str,
    phases: &[Phase],
    results: &[PhaseResult],
    tl: &[[f64; 5]],
    alerts: &[AlertChange],
) -> String {
    let (w, h1, h2, left) = (1200.0, 160.0, 160.0, 50.0);
    let secs = tl.len().max(1) as f64;
    let x = |s: f64| left + s / secs * (w - left - 10.0);
    let max_n = tl.iter().map(|b| b[0] + b[1] + b[2]).fold(1.0, f64::max);
    let (lo, hi) = (0.5f64.log10(), 5000f64.log10());
    let y_ms = |ms: f64| h1 + 20.0 + h2 - (ms.clamp(0.5, 5000.0).log10() - lo) / (hi - lo) * h2;
    let mut svg = String::new();
    let total_h = h1 + h2 + 60.0;
    let _ = write!(
        svg,
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{total_h}" font-family="sans-serif" font-size="10">"##
    );
    for (i, r) in results.iter().enumerate() {
        let (x0, x1) = (x(r.start_ms as f64 / 1000.0), x(r.end_ms as f64 / 1000.0));
        let fill = if !r.misses.is_empty() {
            "#fde2e2"
        } else if i % 2 == 0 {
            "#f0f0f0"
        } else {
            "#ffffff"
        };
        let _ = write!(
            svg,
            r##"<rect x="{x0:.1}" y="0" width="{:.1}" height="{total_h}" fill="{fill}"><title>{}</title></rect><text x="{:.1}" y="10" transform="rotate(0)">{}</text>"##,
            (x1 - x0).max(0.5),
            esc(&phases[i].name),
            x0 + 2.0,
            esc(&phases[i]
                .name
                .chars()
                .take(((x1 - x0) / 6.0) as usize)
                .collect::<String>())
        );
    }
    let bw = ((w - left - 10.0) / secs).max(1.0);
    for (s, b) in tl.iter().enumerate() {
        let mut y = h1 + 14.0;
        for (n, color) in [(b[0], "#3a3"), (b[1], "#f90"), (b[2], "#d22")] {
            let bh = n / max_n * (h1 - 10.0);
            y -= bh;
            if bh > 0.0 {
                let _ = write!(
                    svg,
                    r##"<rect x="{:.1}" y="{y:.1}" width="{:.1}" height="{bh:.1}" fill="{color}"/>"##,
                    x(s as f64),
                    bw * 0.9
                );
            }
        }
    }
    for (k, color) in [(3, "#36c"), (4, "#c3c")] {
        let pts: Vec<String> = tl
            .iter()
            .enumerate()
            .map(|(s, b)| format!("{:.1},{:.1}", x(s as f64 + 0.5), y_ms(b[k])))
            .collect();
        let _ = write!(
            svg,
            r##"<polyline fill="none" stroke="{color}" stroke-width="1.5" points="{}"/>"##,
            pts.join(" ")
        );
    }
    for ms in [1.0, 10.0, 100.0, 1000.0] {
        let _ = write!(
            svg,
            r##"<line x1="{left}" x2="{w}" y1="{y:.1}" y2="{y:.1}" stroke="#999" stroke-dasharray="2,3"/><text x="2" y="{y:.1}">{ms} ms</text>"##,
            y = y_ms(ms)
        );
    }
    let _ = write!(
        svg,
        r##"<text x="2" y="24">{max_n:.0}/s</text><text x="{left}" y="{:.0}">answers per second: right (green), wrong (orange), failed (red); latency: p50 (blue), p99 (purple), log scale; phases that missed a target in red</text></svg>"##,
        total_h - 4.0
    );
    // The alert timeline under the answers: one lane per alert, a bar while it fires.
    let names: std::collections::BTreeSet<&str> = alerts.iter().map(|c| c.alert.as_str()).collect();
    let lane = 14.0;
    let ah = lane * names.len() as f64 + 16.0;
    let mut asvg = String::new();
    if !names.is_empty() {
        let _ = write!(
            asvg,
            r##"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{ah}" font-family="sans-serif" font-size="10">"##
        );
        let end_s = secs;
        for (k, name) in names.iter().enumerate() {
            let y = 4.0 + lane * k as f64;
            let mut since: Option<f64> = None;
            let mut bars = Vec::new();
            for c in alerts.iter().filter(|c| c.alert == *name) {
                let t = c.at_ms as f64 / 1000.0;
                match (c.firing, since) {
                    (true, None) => since = Some(t),
                    (false, Some(t0)) => {
                        bars.push((t0, t));
                        since = None;
                    }
                    _ => {}
                }
            }
            if let Some(t0) = since {
                bars.push((t0, end_s));
            }
            for (a, b) in bars {
                let _ = write!(
                    asvg,
                    r##"<rect x="{:.1}" y="{y:.1}" width="{:.1}" height="{:.1}" fill="#d22"><title>{} {a:.0}-{b:.0} s</title></rect>"##,
                    x(a),
                    (x(b) - x(a)).max(1.0),
                    lane - 3.0,
                    esc(name)
                );
            }
            let _ = write!(
                asvg,
                r##"<text x="{:.1}" y="{:.1}">{}</text>"##,
                left + 4.0,
                y + lane - 5.0,
                esc(name)
            );
        }
        let _ = write!(
            asvg,
            r##"<text x="{left}" y="{:.0}">alerts from Alertmanager: red while firing (same time axis)</text></svg>"##,
            ah - 2.0
        );
    }
    let mut rows = String::new();
    for (p, r) in phases.iter().zip(results) {
        let _ = write!(
            rows,
            "<tr class=\"{}\"><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{:.1}</td><td>{:.1}</td><td>{:+.1}</td><td>{:.1}</td><td>{}/{}</td><td>{}/{}</td><td>{:.0}</td><td>{}</td><td>{}</td></tr>",
            if r.misses.is_empty() { "ok" } else { "miss" },
            esc(&p.name),
            esc(&p.scenario),
            r.requests,
            r.wrong,
            r.failed,
            r.p50_ms,
            r.p99_ms,
            r.added_p99_ms,
            r.max_ms,
            r.clicks_sent,
            r.clicks_counted,
            r.created,
            r.creates,
            r.to_rungs_max_ms,
            esc(&r.alerts.join(", ")),
            if r.misses.is_empty() {
                "ok".to_string()
            } else {
                esc(&r.misses.join("; "))
            }
        );
    }
    format!(
        "<!doctype html><html><head><meta charset=\"utf-8\"><title>{t}</title><style>\
body{{font-family:sans-serif;margin:1em}}table{{border-collapse:collapse}}\
td,th{{border:1px solid #ccc;padding:2px 6px;text-align:right}}td:first-child,td:nth-child(2),td:last-child{{text-align:left}}\
tr.miss{{background:#fde2e2}}</style></head><body><h1>{t}</h1>{svg}\
{asvg}<table><tr><th>phase</th><th>scenario</th><th>requests</th><th>wrong</th><th>failed</th><th>p50 ms</th>\
<th>p99 ms</th><th>added p99 ms</th><th>max ms</th><th>clicks sent/counted</th><th>created/creates</th><th>create→rungs max ms</th><th>alerts firing</th><th>verdict</th></tr>{rows}</table></body></html>",
        t = esc(title)
    )
}
