//! Turning the drill's samples into per-phase verdicts, a per-second timeline, a terminal
//! table, a JSON report and a self-contained HTML page.

use crate::plan::{Phase, RUNG1_SHARE};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::fmt::Write as _;

/// What one redirect through the frontend got.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The right redirect (rungs 1, 2) or the right meta-refresh page (rung 3).
    Right,
    /// An answer, but not the right one (a 404, another location, another page).
    Wrong,
    /// No answer: connection error, timeout, 5xx.
    Failed,
}

#[derive(Clone, Debug)]
pub struct Sample {
    pub phase: usize,
    pub rung: Option<u8>,
    pub outcome: Outcome,
    pub status: u16,
    /// When it was sent, since the load started.
    pub start_ms: u64,
    pub micros: u64,
    pub link: usize,
    pub click: Option<uuid::Uuid>,
}

/// The targets every phase is held to (issue 12's).
#[derive(Clone, Copy, Debug)]
pub struct Targets {
    /// Settled p99 (after the first `settle_ms` of the phase) minus the baseline's, in a
    /// phase with at most one tier broken.
    pub added_p99_ms: f64,
    /// No single redirect slower than this in a phase with at most one tier broken.
    pub max_ms: f64,
    pub settle_ms: u64,
    /// A link created while the write path is whole is served by every rung within this (ε).
    pub eps_ms: f64,
}

/// One create the drill's writer made during a phase, and when every rung served it.
#[derive(Clone, Debug)]
pub struct Write {
    pub phase: usize,
    /// When the create was answered, ms since the load started.
    pub at_ms: u64,
    pub status: u16,
    /// Create answered → S3 has the page and the last-resort host serves it; None: not
    /// within the writer's patience (60 s), or the create failed.
    pub to_rungs_ms: Option<f64>,
    pub slug: String,
    /// After the last phase, an acknowledged (201) create read back through the API: found
    /// with its destination (true) or not (false: an acknowledged write lost). None: not
    /// acknowledged, or not checked.
    pub found: Option<bool>,
    /// What each attempt that did not get 201 got, in order (`503 unavailable`, `no answer`):
    /// the writer retries a 5xx or no answer as the API's 503 asks ("retry later").
    pub refused: Vec<String>,
}

impl Write {
    /// The slug and what its refused attempts got: `w49 (503 unavailable, 503 timeout)`.
    fn described(&self) -> String {
        match self.refused.is_empty() {
            true => format!("{} ({})", self.slug, self.status),
            false => format!("{} ({})", self.slug, self.refused.join(", ")),
        }
    }
}

#[derive(Clone, Debug, Default)]
pub struct PhaseResult {
    pub requests: usize,
    pub right: usize,
    pub wrong: usize,
    pub failed: usize,
    pub statuses: BTreeMap<u16, usize>,
    pub rungs: BTreeMap<String, usize>,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
    pub settled_p99_ms: f64,
    pub added_p99_ms: f64,
    pub clicks_sent: i64,
    pub clicks_counted: i64,
    pub creates: usize,
    pub created: usize,
    pub not_replicated: usize,
    /// Creates of a write-whole phase still on their way when a later phase broke the write
    /// path less than ε after them: not held to ε (a break can strand them anywhere).
    pub interrupted: usize,
    pub to_rungs_p99_ms: f64,
    pub to_rungs_max_ms: f64,
    /// Creates answered something else than 201: (status, slug and what each attempt got),
    /// 0 = no answer.
    pub not_created: Vec<(u16, String)>,
    /// Creates answered 201 only on a retry: the slug and what the refused attempts got.
    pub retried: Vec<String>,
    /// Acknowledged creates the read-back after the drill did not find.
    pub lost: Vec<String>,
    pub action_error: Option<String>,
    pub action_s: f64,
    pub start_ms: u64,
    pub end_ms: u64,
    /// Alerts firing at any time during the phase (when the drill reads Alertmanager).
    pub alerts: Vec<String>,
    pub misses: Vec<String>,
    /// How starved the machine was during the phase (not judged: it explains a miss).
    pub machine: crate::machine::Load,
}

/// An alert starting or stopping to fire, as Alertmanager showed it, since the load started.
#[derive(Clone, Debug, PartialEq)]
pub struct AlertChange {
    pub at_ms: u64,
    pub alert: String,
    pub firing: bool,
}

/// Whether `alert` fires at `t_ms`, given the changes in time order.
fn firing_at(changes: &[AlertChange], alert: &str, t_ms: u64) -> bool {
    changes
        .iter()
        .rfind(|c| c.alert == alert && c.at_ms <= t_ms)
        .is_some_and(|c| c.firing)
}

/// Fills each phase's alerts and, when `judged` (phases long enough for the rules' windows),
/// adds a miss for an expected alert that did not fire within the phase or was still firing
/// at its end.
pub fn add_alerts(
    phases: &[Phase],
    results: &mut [PhaseResult],
    changes: &[AlertChange],
    judged: bool,
) {
    let names: std::collections::BTreeSet<&str> =
        changes.iter().map(|c| c.alert.as_str()).collect();
    for (p, r) in phases.iter().zip(results.iter_mut()) {
        let fired_in = |a: &str| {
            firing_at(changes, a, r.start_ms)
                || changes
                    .iter()
                    .any(|c| c.alert == a && c.firing && (r.start_ms..=r.end_ms).contains(&c.at_ms))
        };
        r.alerts = names
            .iter()
            .filter(|a| fired_in(a))
            .map(|a| a.to_string())
            .collect();
        if !judged {
            continue;
        }
        for a in &p.alerts_fire {
            if !fired_in(a) {
                r.misses.push(format!("alert {a} did not fire"));
            }
        }
        for a in &p.alerts_resolve {
            if firing_at(changes, a, r.end_ms) {
                r.misses.push(format!("alert {a} not resolved"));
            }
        }
    }
}

pub fn pct(sorted: &[u64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    sorted[((sorted.len() as f64 - 1.0) * q).round() as usize] as f64 / 1000.0
}

/// Per-phase numbers (clicks are filled in later) and the verdict against `t`.
pub fn phase_results(
    phases: &[Phase],
    samples: &[Sample],
    bounds: &[(u64, u64)],
    t: &Targets,
) -> Vec<PhaseResult> {
    let mut out: Vec<PhaseResult> = Vec::new();
    for (i, _) in phases.iter().enumerate() {
        let ph: Vec<&Sample> = samples.iter().filter(|s| s.phase == i).collect();
        let mut r = PhaseResult {
            requests: ph.len(),
            start_ms: bounds[i].0,
            end_ms: bounds[i].1,
            ..Default::default()
        };
        let mut lat: Vec<u64> = ph.iter().map(|s| s.micros).collect();
        lat.sort_unstable();
        let mut settled: Vec<u64> = ph
            .iter()
            .filter(|s| s.start_ms >= r.start_ms + t.settle_ms)
            .map(|s| s.micros)
            .collect();
        settled.sort_unstable();
        for s in &ph {
            match s.outcome {
                Outcome::Right => r.right += 1,
                Outcome::Wrong => r.wrong += 1,
                Outcome::Failed => r.failed += 1,
            }
            if s.outcome != Outcome::Right {
                *r.statuses.entry(s.status).or_default() += 1;
            }
            let rung = s.rung.map_or("none".to_string(), |r| r.to_string());
            *r.rungs.entry(rung).or_default() += 1;
        }
        r.p50_ms = pct(&lat, 0.5);
        r.p99_ms = pct(&lat, 0.99);
        r.max_ms = pct(&lat, 1.0);
        r.settled_p99_ms = pct(&settled, 0.99);
        r.added_p99_ms = out
            .first()
            .map_or(0.0, |b| r.settled_p99_ms - b.settled_p99_ms);
        out.push(r);
    }
    out
}

/// Adds the writer's creates to their phases. In a phase whose write path is whole, a create
/// is held to ε only while it stays whole: one that had not reached every rung when a later
/// phase broke the write path, less than ε after it was made, is counted as interrupted, not as
/// a miss (a link created 50 ms before S3 is killed cannot reach the last-resort host until S3
/// is back, and says nothing about replication).
pub fn add_writes(phases: &[Phase], results: &mut [PhaseResult], writes: &[Write], eps_ms: f64) {
    for i in 0..results.len() {
        // The write path stays whole until the first later phase that breaks it starts.
        let whole_until = phases[i].writes_whole.then(|| {
            (i + 1..phases.len())
                .find(|&j| !phases[j].writes_whole)
                .map_or(f64::INFINITY, |j| results[j].start_ms as f64)
        });
        let w: Vec<&Write> = writes.iter().filter(|w| w.phase == i).collect();
        let r = &mut results[i];
        r.creates = w.len();
        r.created = w.iter().filter(|w| w.status == 201).count();
        r.not_created = w
            .iter()
            .filter(|w| w.status != 201)
            .map(|w| (w.status, w.described()))
            .collect();
        r.retried = w
            .iter()
            .filter(|w| w.status == 201 && !w.refused.is_empty())
            .map(|w| w.described())
            .collect();
        r.lost = w
            .iter()
            .filter(|w| w.found == Some(false))
            .map(|w| w.slug.clone())
            .collect();
        let (mut lat, mut interrupted) = (Vec::new(), 0);
        for w in w.iter().filter(|w| w.status == 201) {
            let cut = whole_until.is_some_and(|until| {
                let reached = w.to_rungs_ms.map(|ms| w.at_ms as f64 + ms);
                until - (w.at_ms as f64) < eps_ms && reached.is_none_or(|t| t > until)
            });
            if cut {
                interrupted += 1;
            } else if let Some(ms) = w.to_rungs_ms {
                lat.push((ms * 1000.0) as u64);
            }
        }
        lat.sort_unstable();
        r.interrupted = interrupted;
        r.not_replicated = r.created - interrupted - lat.len();
        r.to_rungs_p99_ms = pct(&lat, 0.99);
        r.to_rungs_max_ms = pct(&lat, 1.0);
    }
}

/// Fills `misses` of every phase: which target it missed.
pub fn judge(phases: &[Phase], results: &mut [PhaseResult], t: &Targets) {
    for (p, r) in phases.iter().zip(results.iter_mut()) {
        let mut m = Vec::new();
        if let Some(e) = &r.action_error {
            m.push(format!("action failed: {e}"));
        }
        if r.requests == 0 {
            m.push("no requests".into());
        }
        if r.wrong > 0 {
            m.push(format!("{} wrong answers", r.wrong));
        }
        if r.failed > 0 {
            m.push(format!("{} failed answers", r.failed));
        }
        if p.single_tier && r.added_p99_ms > t.added_p99_ms {
            m.push(format!(
                "added p99 {:.0} ms > {:.0} ms",
                r.added_p99_ms, t.added_p99_ms
            ));
        }
        if p.single_tier && r.max_ms > t.max_ms {
            m.push(format!("max {:.0} ms > {:.0} ms", r.max_ms, t.max_ms));
        }
        if !r.lost.is_empty() {
            m.push(format!(
                "{} acknowledged creates not found afterwards: {}",
                r.lost.len(),
                r.lost.join(", ")
            ));
        }
        if p.invisible && !r.not_created.is_empty() {
            let list: Vec<String> = r
                .not_created
                .iter()
                .map(|(_, described)| described.clone())
                .collect();
            m.push(format!(
                "{} of {} creates not answered 201: {}",
                r.not_created.len(),
                r.creates,
                list.join(", ")
            ));
        }
        let rung1 = r.rungs.get("1").copied().unwrap_or(0);
        if p.invisible && r.requests > 0 && (rung1 as f64) < RUNG1_SHARE * r.requests as f64 {
            m.push(format!(
                "rung 1 served {rung1} of {} redirects (< {:.0}%)",
                r.requests,
                RUNG1_SHARE * 100.0
            ));
        }
        if p.writes_whole && r.not_replicated > 0 {
            m.push(format!(
                "{} created links never reached every rung",
                r.not_replicated
            ));
        }
        if p.writes_whole && r.to_rungs_max_ms > t.eps_ms {
            m.push(format!(
                "create → every rung {:.0} ms > ε {:.0} ms",
                r.to_rungs_max_ms, t.eps_ms
            ));
        }
        if r.clicks_counted != r.clicks_sent {
            m.push(format!(
                "clicks: {} sent, {} counted",
                r.clicks_sent, r.clicks_counted
            ));
        }
        r.misses = m;
    }
}

/// The machine during each phase: a miss in a phase where tasks waited for a CPU most of the
/// time says the box was starved, not only that a tier was slow.
pub fn print_machine(phases: &[Phase], results: &[PhaseResult]) {
    let cell = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.0}"));
    println!(
        "machine, % per phase: CPUs busy / stolen by the hypervisor / time some task waited for a CPU"
    );
    let cells: Vec<String> = phases
        .iter()
        .zip(results)
        .map(|(p, r)| {
            let m = r.machine;
            format!(
                "{} {}/{}/{}",
                p.name,
                cell(m.busy_pct),
                cell(m.steal_pct),
                cell(m.waiting_pct)
            )
        })
        .collect();
    for line in cells.chunks(4) {
        println!("  {}", line.join(", "));
    }
}

pub fn print_table(phases: &[Phase], results: &[PhaseResult]) {
    println!(
        "{:<22} {:>6} {:>5} {:>6} {:>7} {:>7} {:>8} {:>7} {:>13} {:>9} {:>7}  {:<20} verdict",
        "phase",
        "reqs",
        "wrong",
        "failed",
        "p50 ms",
        "p99 ms",
        "+p99 ms",
        "max ms",
        "clicks s/c",
        "creates",
        "ε ms",
        "rungs"
    );
    for (p, r) in phases.iter().zip(results) {
        let rungs = r
            .rungs
            .iter()
            .map(|(k, n)| format!("{k}:{n}"))
            .collect::<Vec<_>>()
            .join(" ");
        println!(
            "{:<22} {:>6} {:>5} {:>6} {:>7.1} {:>7.1} {:>+8.1} {:>7.1} {:>13} {:>9} {:>7.0}  {:<20} {}",
            p.name,
            r.requests,
            r.wrong,
            r.failed,
            r.p50_ms,
            r.p99_ms,
            r.added_p99_ms,
            r.max_ms,
            format!("{}/{}", r.clicks_sent, r.clicks_counted),
            creates_cell(r),
            r.to_rungs_max_ms,
            rungs,
            if r.misses.is_empty() {
                "ok".to_string()
            } else {
                format!("MISS: {}", r.misses.join("; "))
            }
        );
    }
    if results.iter().any(|r| r.interrupted > 0) {
        println!(
            "(Ni): N creates were on their way when the next phase broke the write path, less than ε after them; not held to ε"
        );
    }
    if results.iter().any(|r| !r.retried.is_empty()) {
        println!(
            "(Nr): N creates were answered 201 only when retried (with their Idempotency-Key, {} s apart, at most {} retries) after a 5xx or no answer",
            crate::writer::CREATE_RETRY_AFTER.as_secs_f64(),
            crate::writer::CREATE_RETRIES
        );
    }
    for (p, r) in phases.iter().zip(results) {
        if !r.retried.is_empty() {
            println!("creates retried in {}: {}", p.name, r.retried.join(", "));
        }
    }
}

/// The creates column: created/made, with (Ni) interrupted and (Nr) retried.
fn creates_cell(r: &PhaseResult) -> String {
    let mut notes = Vec::new();
    if r.interrupted > 0 {
        notes.push(format!("{}i", r.interrupted));
    }
    if !r.retried.is_empty() {
        notes.push(format!("{}r", r.retried.len()));
    }
    match notes.is_empty() {
        true => format!("{}/{}", r.created, r.creates),
        false => format!("{}/{} ({})", r.created, r.creates, notes.join(" ")),
    }
}

/// Per second since the load started: right, wrong, failed, p50 and p99 ms.
pub fn timeline(samples: &[Sample]) -> Vec<[f64; 5]> {
    let secs = samples
        .iter()
        .map(|s| s.start_ms / 1000)
        .max()
        .map_or(0, |m| m + 1) as usize;
    let mut buckets: Vec<Vec<&Sample>> = vec![Vec::new(); secs];
    for s in samples {
        buckets[(s.start_ms / 1000) as usize].push(s);
    }
    buckets
        .iter()
        .map(|b| {
            let mut lat: Vec<u64> = b.iter().map(|s| s.micros).collect();
            lat.sort_unstable();
            let n = |o| b.iter().filter(|s| s.outcome == o).count() as f64;
            [
                n(Outcome::Right),
                n(Outcome::Wrong),
                n(Outcome::Failed),
                pct(&lat, 0.5),
                pct(&lat, 0.99),
            ]
        })
        .collect()
}

pub fn phase_json(p: &Phase, r: &PhaseResult) -> Value {
    let mut v = json!({
        "phase": p.name, "scenario": p.scenario, "single_tier": p.single_tier,
        "actions": p.actions.iter().map(|a| format!("{a:?}")).collect::<Vec<_>>(),
        "flap": p.flap,
        "requests": r.requests, "right": r.right, "wrong": r.wrong, "failed": r.failed,
        "not_right_statuses": r.statuses, "rungs": r.rungs,
        "p50_ms": r.p50_ms, "p99_ms": r.p99_ms, "max_ms": r.max_ms,
        "settled_p99_ms": r.settled_p99_ms, "added_p99_ms": r.added_p99_ms,
        "clicks_sent": r.clicks_sent, "clicks_counted": r.clicks_counted,
        "writes_whole": p.writes_whole, "creates": r.creates, "created": r.created,
        "creates_interrupted": r.interrupted,
        "not_replicated": r.not_replicated, "create_to_every_rung_p99_ms": r.to_rungs_p99_ms,
        "create_to_every_rung_max_ms": r.to_rungs_max_ms,
        "invisible": p.invisible,
        "creates_not_201": r.not_created.iter().map(|(st, slug)| json!({"slug": slug, "status": st})).collect::<Vec<_>>(),
        "creates_retried": r.retried,
        "acknowledged_not_found": r.lost,
        "action_error": r.action_error, "action_s": r.action_s,
        "start_ms": r.start_ms, "end_ms": r.end_ms,
        "alerts": r.alerts, "alerts_expected_to_fire": p.alerts_fire,
        "alerts_expected_to_resolve": p.alerts_resolve,
        "passed": r.misses.is_empty(), "misses": r.misses,
    });
    v["machine"] = json!({"cpu_busy_pct": r.machine.busy_pct,
        "cpu_steal_pct": r.machine.steal_pct, "cpu_waiting_pct": r.machine.waiting_pct});
    v
}

mod html;
pub use html::html;

#[cfg(test)]
mod tests;
