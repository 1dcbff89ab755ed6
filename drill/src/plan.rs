//! What the drill breaks, in which order: scenarios (a fault kind on a tier, or the rung ladder)
//! turned into phases, each with the actions that start it.

use anyhow::{bail, Context};
use std::collections::BTreeMap;

/// How a component is broken. `Flap` is not a hook kind of its own: the drill toggles
/// [`FLAP_WITH`] on and off during the phase.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    Kill,
    Hang,
    Slow,
    Blackhole,
    Flap,
    /// A network link taken down (the network-namespace mode's `wan` or `site-s3`).
    Cut,
    /// A graceful stop and a start, waiting until ready (nginx: a reload): one step of a
    /// rolling restart. Nothing to restore.
    Restart,
    /// A link's S3 page deleted behind the system's back (a signed DELETE straight to S3);
    /// repaired by the replicator's S3 audit, which the restore waits for. Only the canary
    /// page's.
    Delete,
    /// A link's S3 page overwritten with bytes the replicator never writes; repaired the same
    /// way. Only the canary page's.
    Corrupt,
    /// S3's anonymous read grant (what the last-resort hosts' nginx reads pages with)
    /// withdrawn, as a changed bucket policy would; restored by the restore (a permission is
    /// a person's decision, not a repair). Only S3.
    Deny,
    /// The click spools of the lastresort processes put on a small filesystem of their own and
    /// filled (as root), each process restarted on it; restored by freeing the space and moving
    /// the spool back. Only the lastresorts: their spools take clicks only while rung 2 serves,
    /// so the drill's clicks stay exact (tests/lastresort.rs counts refused clicks on a full
    /// disk exactly).
    Full,
}

/// What a flapping component does while it is "down".
pub const FLAP_WITH: Kind = Kind::Hang;

impl Kind {
    pub const ALL: [Kind; 5] = [
        Kind::Kill,
        Kind::Hang,
        Kind::Slow,
        Kind::Blackhole,
        Kind::Flap,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Kind::Kill => "kill",
            Kind::Hang => "hang",
            Kind::Slow => "slow",
            Kind::Blackhole => "blackhole",
            Kind::Flap => "flap",
            Kind::Cut => "cut",
            Kind::Restart => "restart",
            Kind::Delete => "delete",
            Kind::Corrupt => "corrupt",
            Kind::Deny => "deny",
            Kind::Full => "full",
        }
    }

    pub fn parse(s: &str) -> anyhow::Result<Kind> {
        Kind::ALL
            .into_iter()
            .chain([
                Kind::Cut,
                Kind::Restart,
                Kind::Delete,
                Kind::Corrupt,
                Kind::Deny,
                Kind::Full,
            ])
            .find(|k| k.name() == s)
            .with_context(|| {
                format!(
                    "unknown fault kind {s:?} (kill, hang, slow, blackhole, flap, cut, restart, \
                     delete, corrupt, deny, full)"
                )
            })
    }

    /// Needs a fault proxy in front of the component (Toxiproxy).
    pub fn needs_proxy(self) -> bool {
        matches!(self, Kind::Slow | Kind::Blackhole)
    }
}

/// One hook call: break or restore `component` with `kind`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    Break(Kind, String),
    Restore(Kind, String),
}

#[derive(Clone, Debug)]
pub struct Phase {
    pub name: String,
    /// The scenario the phase belongs to (`baseline`, `ladder-hang`, `hang:store`).
    pub scenario: String,
    /// Run (in order) when the phase starts; requests sent meanwhile belong to the phase.
    pub actions: Vec<Action>,
    /// Components toggled with [`FLAP_WITH`] throughout the phase (restored at its end).
    pub flap: Vec<String>,
    /// At most one tier is broken: the latency targets apply (a two-tier ladder phase is only
    /// held to right answers and exact clicks).
    pub single_tier: bool,
    /// The write path (primaries, store, Kafka, replicator, S3) is whole once the phase's
    /// actions are done: a link created then must reach every rung within ε.
    pub writes_whole: bool,
    /// Alerts that must fire during the phase (deploy/prometheus/rules), when the drill reads
    /// Alertmanager and phases are long enough for the rules' windows.
    pub alerts_fire: Vec<&'static str>,
    /// Alerts that must be resolved by the end of the phase (under the same conditions).
    pub alerts_resolve: Vec<&'static str>,
    /// One replica of a replicated engine is broken (one store node, one broker) or the
    /// components are restarted one at a time: users must not see it. Every create is answered
    /// 201, at least [`RUNG1_SHARE`] of redirects are served by rung 1, and creates go on while
    /// the actions run.
    pub invisible: bool,
}

/// The share of redirects rung 1 must serve in a phase whose fault must be invisible.
pub const RUNG1_SHARE: f64 = 0.99;

/// What the ladder's alerts say: rung 2 serving, no primary up and rung 1's canary failing;
/// rung 3 serving, no lastresort up and rung 2's canary failing.
const RUNG2_ALERTS: [&str; 3] = [
    "ZlinkRung2Serving",
    "ZlinkPrimariesDown",
    "ZlinkRung1CanaryFailing",
];
const RUNG3_ALERTS: [&str; 3] = [
    "ZlinkRung3Serving",
    "ZlinkLastresortDown",
    "ZlinkRung2CanaryFailing",
];

/// The alerts a broken tier must raise (killed or hung: it stops answering its scrape), and
/// that must be resolved once it is back.
fn tier_alerts(kind: Kind, tier: &str) -> Vec<&'static str> {
    match (kind, tier) {
        (Kind::Kill | Kind::Hang, "primaries") => RUNG2_ALERTS.to_vec(),
        (Kind::Kill | Kind::Hang, "lastresorts") => vec!["ZlinkLastresortDown"],
        (Kind::Kill | Kind::Hang, "replicator") => vec!["ZlinkReplicatorDown"],
        // Rung 3 reads S3 anonymously: its canary probe gets the 404 page.
        (Kind::Deny, _) => vec!["ZlinkRung3CanaryFailing"],
        // The spool's filesystem almost full (no click is refused: none arrives there).
        (Kind::Full, _) => vec!["ZlinkSpoolDiskLow"],
        _ => vec![],
    }
}

/// (must fire while broken, must fire by the end of the phase after, must be resolved by then)
type PhaseAlerts = (Vec<&'static str>, Vec<&'static str>, Vec<&'static str>);

/// What a fault's two phases expect of the alerts. A canary page deleted or corrupted behind
/// the system's back is repaired by the replicator's S3 audit, with no heal step doing it:
/// the repair raises `ZlinkS3DriftRepaired` (by the end of the phase after, when the heal has
/// seen the page right again), and rung 3's canary alert, which fires if the page stayed
/// broken two probes long (the audit may be quicker), is resolved by then.
fn phase_alerts(kind: Kind, tier: &str) -> PhaseAlerts {
    match (kind, tier) {
        (Kind::Delete | Kind::Corrupt, CANARY_PAGE) => (
            vec![],
            vec!["ZlinkS3DriftRepaired"],
            vec!["ZlinkRung3CanaryFailing"],
        ),
        _ => {
            let a = tier_alerts(kind, tier);
            (a.clone(), vec![], a)
        }
    }
}

/// Tiers whose fault stops or delays creates or their replication (ε is not held there); the
/// last-resort site without its S3 link cannot serve a new link either.
const WRITE_PATH: [&str; 6] = ["primaries", "store", "kafka", "replicator", "s3", "site-s3"];

/// The links of the network-namespace mode: a `cut` applies to these and only these.
pub const LINKS: [&str; 2] = ["wan", "site-s3"];

/// The S3 page of the rung-3 canary link (zlink_wire::canary): what `delete` and `corrupt`
/// break, and only they.
pub const CANARY_PAGE: &str = "canary-page";

/// A scenario as given on the command line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Scenario {
    /// Primaries broken, then the lastresort processes too, then back in reverse order.
    Ladder(Kind),
    /// One tier broken, then restored.
    Tier(Kind, String),
    /// Every component of the `rolling` tier restarted (`restart`), one at a time, in order,
    /// under load: what an upgrade does.
    Rolling,
}

impl Scenario {
    /// `ladder:KIND`, `KIND:TIER` or `rolling`.
    pub fn parse(s: &str) -> anyhow::Result<Scenario> {
        if s == "rolling" {
            return Ok(Scenario::Rolling);
        }
        let (a, b) = s
            .split_once(':')
            .with_context(|| format!("{s:?}: expected KIND:TIER, ladder:KIND or rolling"))?;
        if a == "ladder" {
            let k = Kind::parse(b)?;
            if k == Kind::Flap {
                bail!("ladder:flap is not a scenario; use flap:primaries or flap:lastresorts");
            }
            return Ok(Scenario::Ladder(k));
        }
        Ok(Scenario::Tier(Kind::parse(a)?, b.to_string()))
    }
}

/// The tiers the drill knows by default, in the order the matrix walks them.
pub const TIERS: [&str; 7] = [
    "primaries",
    "lastresorts",
    "store",
    "memcached",
    "kafka",
    "replicator",
    "s3",
];

/// Every kind on every tier (slow and blackhole only where a fault proxy sits), both ladders.
pub fn matrix(proxied: &[String]) -> Vec<Scenario> {
    let mut v = vec![Scenario::Ladder(Kind::Kill), Scenario::Ladder(Kind::Hang)];
    for tier in TIERS {
        for k in Kind::ALL {
            if !k.needs_proxy() || proxied.iter().any(|p| p == tier) {
                v.push(Scenario::Tier(k, tier.to_string()));
            }
        }
    }
    v
}

/// The network-cut set: the datacenters cut apart (each side keeps its S3), then the primary
/// site's own way to S3 blackholed (the last-resort site keeps its own). (`cut:site-s3` — the
/// site without S3 — is not in it: the site cannot serve a link it has never read then.)
pub fn netcut() -> Vec<Scenario> {
    vec![
        Scenario::Tier(Kind::Cut, "wan".into()),
        Scenario::Tier(Kind::Blackhole, "s3".into()),
    ]
}

/// The fast set CI runs: both ladders (primaries and lastresorts killed and hung) and a kill
/// and a hang of every other tier.
pub fn fast() -> Vec<Scenario> {
    let mut v = vec![Scenario::Ladder(Kind::Kill), Scenario::Ladder(Kind::Hang)];
    for tier in &TIERS[2..] {
        v.push(Scenario::Tier(Kind::Kill, tier.to_string()));
        v.push(Scenario::Tier(Kind::Hang, tier.to_string()));
    }
    v
}

/// The clustered set: each replica tier (one store node, one broker) killed and hung, and
/// slowed and blackholed where a fault proxy is in front of it, then the rolling restart.
pub fn cluster(replicas: &[String], proxied: &[String]) -> Vec<Scenario> {
    let mut v = Vec::new();
    for r in replicas {
        for k in [Kind::Kill, Kind::Hang, Kind::Slow, Kind::Blackhole] {
            if !k.needs_proxy() || proxied.contains(r) {
                v.push(Scenario::Tier(k, r.clone()));
            }
        }
    }
    v.push(Scenario::Rolling);
    v
}

/// The phases of a run: one baseline, then each scenario's phases. `replicas`: tiers that are
/// one replica of a replicated engine (their faults must be invisible).
pub fn phases(
    scenarios: &[Scenario],
    tiers: &BTreeMap<String, Vec<String>>,
    proxied: &[String],
    replicas: &[String],
) -> anyhow::Result<Vec<Phase>> {
    let comps = |tier: &str| -> anyhow::Result<Vec<String>> {
        tiers
            .get(tier)
            .cloned()
            .with_context(|| format!("unknown tier {tier:?} (known: {:?})", tiers.keys()))
    };
    let each = |f: fn(Kind, String) -> Action, k: Kind, cs: &[String]| -> Vec<Action> {
        cs.iter().map(|c| f(k, c.clone())).collect()
    };
    let mut out = vec![Phase {
        name: "baseline".into(),
        scenario: "baseline".into(),
        actions: vec![],
        flap: vec![],
        single_tier: true,
        writes_whole: true,
        alerts_fire: vec![],
        alerts_resolve: vec![],
        invisible: false,
    }];
    for s in scenarios {
        match s {
            Scenario::Ladder(k) => {
                let (p, l) = (comps("primaries")?, comps("lastresorts")?);
                let sc = format!("ladder:{}", k.name());
                let phase = |name: String,
                             actions,
                             single_tier,
                             writes_whole,
                             fire: &[&'static str],
                             resolve: &[&'static str]| Phase {
                    name,
                    scenario: sc.clone(),
                    actions,
                    flap: vec![],
                    single_tier,
                    writes_whole,
                    alerts_fire: fire.to_vec(),
                    alerts_resolve: resolve.to_vec(),
                    invisible: false,
                };
                let k_name = k.name();
                out.push(phase(
                    format!("primaries-{k_name}"),
                    each(Action::Break, *k, &p),
                    true,
                    false,
                    &RUNG2_ALERTS,
                    &[],
                ));
                out.push(phase(
                    format!("lastresorts-{k_name}"),
                    each(Action::Break, *k, &l),
                    false,
                    false,
                    &RUNG3_ALERTS,
                    &[],
                ));
                out.push(phase(
                    "lastresorts-back".into(),
                    each(Action::Restore, *k, &l),
                    false,
                    false,
                    &[],
                    &RUNG3_ALERTS,
                ));
                out.push(phase(
                    "primaries-back".into(),
                    each(Action::Restore, *k, &p),
                    true,
                    true,
                    &[],
                    &RUNG2_ALERTS,
                ));
            }
            Scenario::Tier(k, tier) => {
                if (*k == Kind::Cut) != LINKS.contains(&tier.as_str()) {
                    bail!(
                        "{}:{tier}: cut applies to the links {LINKS:?}, and only cut does",
                        k.name()
                    );
                }
                let page_fault = matches!(k, Kind::Delete | Kind::Corrupt);
                if page_fault != (tier == CANARY_PAGE) {
                    bail!(
                        "{}:{tier}: delete and corrupt apply to {CANARY_PAGE}, and only they do",
                        k.name()
                    );
                }
                if *k == Kind::Deny && tier != "s3" {
                    bail!("deny:{tier}: deny applies to s3 only");
                }
                if *k == Kind::Full && tier != "lastresorts" {
                    bail!("full:{tier}: full applies to lastresorts only");
                }
                if k.needs_proxy() && !proxied.iter().any(|p| p == tier) {
                    bail!(
                        "{}:{tier}: no fault proxy in front of {tier} (proxied: {proxied:?})",
                        k.name()
                    );
                }
                let cs = comps(tier)?;
                let sc = format!("{}:{tier}", k.name());
                let (actions, flap) = if *k == Kind::Flap {
                    (vec![], cs.clone())
                } else {
                    (each(Action::Break, *k, &cs), vec![])
                };
                let (fire, back_fire, back_resolve) = phase_alerts(*k, tier);
                // One replica of three lost: the write path is still whole.
                let replica = replicas.contains(tier);
                out.push(Phase {
                    name: format!("{tier}-{}", k.name()),
                    scenario: sc.clone(),
                    actions,
                    flap,
                    single_tier: true,
                    // (Deny too: the replicator still writes, but rung 3 cannot read a new
                    // link, so it does not reach every rung.)
                    writes_whole: replica || !WRITE_PATH.contains(&tier.as_str()),
                    alerts_fire: fire,
                    alerts_resolve: vec![],
                    invisible: replica,
                });
                let restore = if *k == Kind::Flap {
                    vec![]
                } else {
                    each(Action::Restore, *k, &cs)
                };
                out.push(Phase {
                    name: format!("{tier}-back"),
                    scenario: sc,
                    actions: restore,
                    flap: vec![],
                    single_tier: true,
                    writes_whole: true,
                    alerts_fire: back_fire,
                    alerts_resolve: back_resolve,
                    invisible: replica,
                });
            }
            Scenario::Rolling => {
                let cs = comps("rolling")?;
                out.push(Phase {
                    name: "rolling-restart".into(),
                    scenario: "rolling".into(),
                    actions: each(Action::Break, Kind::Restart, &cs),
                    flap: vec![],
                    single_tier: true,
                    writes_whole: true,
                    alerts_fire: vec![],
                    alerts_resolve: vec![],
                    invisible: true,
                });
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests;
