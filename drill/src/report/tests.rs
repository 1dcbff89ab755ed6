use super::*;
use crate::plan::{phases, Scenario};

fn sample(phase: usize, outcome: Outcome, start_ms: u64, ms: u64) -> Sample {
    Sample {
        phase,
        rung: Some(1),
        outcome,
        status: if outcome == Outcome::Right { 302 } else { 503 },
        start_ms,
        micros: ms * 1000,
        link: 0,
        click: None,
    }
}

#[test]
fn expected_alerts_must_fire_within_their_phase_and_resolve_by_its_end() {
    let tiers = [("primaries", "p"), ("lastresorts", "l")]
        .iter()
        .map(|(t, c)| (t.to_string(), vec![c.to_string()]))
        .collect();
    let ph = phases(&[Scenario::parse("ladder:kill").unwrap()], &tiers, &[], &[]).unwrap();
    let names: Vec<&str> = ph.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "baseline",
            "primaries-kill",
            "lastresorts-kill",
            "lastresorts-back",
            "primaries-back"
        ]
    );
    let mut r: Vec<PhaseResult> = (0..5)
        .map(|i| PhaseResult {
            start_ms: i * 1000,
            end_ms: i * 1000 + 1000,
            ..Default::default()
        })
        .collect();
    let c = |at_ms, alert: &str, firing| AlertChange {
        at_ms,
        alert: alert.into(),
        firing,
    };
    let changes = [
        c(1500, "ZlinkRung2Serving", true),
        c(1600, "ZlinkPrimariesDown", true),
        c(1700, "ZlinkRung1CanaryFailing", true),
        c(2500, "ZlinkLastresortDown", true),
        c(2600, "ZlinkRung2CanaryFailing", true),
        // Rung 3 never fires; rung 3's "down" resolves in time; rung 2 resolves too late.
        c(3500, "ZlinkLastresortDown", false),
        c(3600, "ZlinkRung2CanaryFailing", false),
        c(4500, "ZlinkPrimariesDown", false),
        c(4600, "ZlinkRung1CanaryFailing", false),
        c(5200, "ZlinkRung2Serving", false),
    ];
    add_alerts(&ph, &mut r, &changes, true);
    assert!(r[0].misses.is_empty() && r[0].alerts.is_empty());
    assert!(r[1].misses.is_empty(), "{:?}", r[1].misses);
    assert_eq!(
        r[1].alerts,
        [
            "ZlinkPrimariesDown",
            "ZlinkRung1CanaryFailing",
            "ZlinkRung2Serving"
        ]
    );
    assert_eq!(r[2].misses, ["alert ZlinkRung3Serving did not fire"]);
    assert!(r[3].misses.is_empty(), "{:?}", r[3].misses);
    assert_eq!(r[4].misses, ["alert ZlinkRung2Serving not resolved"]);
    // Not judged: recorded only.
    let mut r2: Vec<PhaseResult> = r
        .iter()
        .map(|x| PhaseResult {
            misses: vec![],
            ..x.clone()
        })
        .collect();
    add_alerts(&ph, &mut r2, &changes, false);
    assert!(r2.iter().all(|x| x.misses.is_empty()));
    assert_eq!(r2[2].alerts.len(), 5);
}

#[test]
fn a_phase_misses_on_failed_answers_slow_tails_and_lost_clicks() {
    let tiers = [("primaries", "p"), ("lastresorts", "l"), ("store", "s")]
        .iter()
        .map(|(t, c)| (t.to_string(), vec![c.to_string()]))
        .collect();
    let ph = phases(&[Scenario::parse("hang:store").unwrap()], &tiers, &[], &[]).unwrap();
    let t = Targets {
        added_p99_ms: 300.0,
        max_ms: 1000.0,
        settle_ms: 1000,
        eps_ms: 5000.0,
    };
    let mut s = vec![];
    for i in 0..100 {
        s.push(sample(0, Outcome::Right, i * 10, 2));
        // The first second of the fault phase may be slow; after that it may not.
        s.push(sample(
            1,
            Outcome::Right,
            1000 + i * 10,
            if i < 50 { 900 } else { 3 },
        ));
        s.push(sample(2, Outcome::Right, 2000 + i * 10, 2));
    }
    s.push(sample(2, Outcome::Failed, 2500, 1200));
    let bounds = [(0, 1000), (1000, 2000), (2000, 3000)];
    let mut r = phase_results(&ph, &s, &bounds, &t);
    r[1].clicks_sent = 100;
    r[1].clicks_counted = 100;
    r[2].clicks_sent = 100;
    r[2].clicks_counted = 99;
    let w = |phase, at_ms, status, ms| Write {
        phase,
        at_ms,
        status,
        to_rungs_ms: ms,
        slug: format!("w{at_ms}"),
        found: None,
        refused: Vec::new(),
    };
    // While the store hangs a create may wait for it; once it is back, ε holds again.
    // Creates made just before the store hangs are cut off by it, not held to ε.
    let writes = [
        w(0, 100, 201, Some(800.0)),
        w(0, 900, 201, Some(5500.0)),
        w(0, 950, 201, None),
        w(1, 1100, 201, None),
        w(1, 1200, 503, None),
        w(2, 2100, 201, Some(6000.0)),
    ];
    add_writes(&ph, &mut r, &writes, t.eps_ms);
    assert_eq!(
        (r[0].created, r[0].interrupted, r[0].not_replicated),
        (3, 2, 0)
    );
    assert_eq!(r[0].to_rungs_max_ms, 800.0);
    judge(&ph, &mut r, &t);
    assert!(r[0].misses.is_empty(), "{:?}", r[0].misses);
    assert_eq!((r[1].creates, r[1].created, r[1].not_replicated), (2, 1, 1));
    assert_eq!(
        r[2].interrupted, 0,
        "nothing breaks the write path after the last phase"
    );
    assert!(r[1].misses.is_empty(), "settled: {:?}", r[1].misses);
    assert_eq!(r[2].failed, 1);
    assert_eq!(
        r[2].misses.len(),
        4,
        "failed, max, ε, clicks: {:?}",
        r[2].misses
    );
    let tl = timeline(&s);
    assert_eq!(tl.len(), 3);
    assert_eq!(tl[2][2], 1.0, "the failed answer is in second 2");
    let page = html("drill <x>", &ph, &r, &tl, &[]);
    assert!(page.contains("drill &lt;x&gt;") && page.contains("<svg"));
}

#[test]
fn an_invisible_fault_is_held_to_every_create_rung_1_and_every_acknowledged_write() {
    let mut tiers = BTreeMap::new();
    tiers.insert("cassandra-2".to_string(), vec!["cassandra-2".to_string()]);
    let replicas = ["cassandra-2".to_string()];
    let ph = phases(
        &[Scenario::parse("hang:cassandra-2").unwrap()],
        &tiers,
        &[],
        &replicas,
    )
    .unwrap();
    let t = Targets {
        added_p99_ms: 300.0,
        max_ms: 1000.0,
        settle_ms: 0,
        eps_ms: 5000.0,
    };
    let mut s = Vec::new();
    // Phase 1 (the hang): 200 right answers, 3 of them from rung 2 (98.5% on rung 1).
    for i in 0..200u64 {
        let mut x = sample(1, Outcome::Right, 1000 + i, 5);
        x.rung = Some(if i < 3 { 2 } else { 1 });
        s.push(x);
    }
    // Phase 2 (back): all on rung 1.
    for i in 0..100u64 {
        let mut x = sample(2, Outcome::Right, 2000 + i, 5);
        x.rung = Some(1);
        s.push(x);
    }
    let bounds = [(0, 1000), (1000, 2000), (2000, 3000)];
    let mut r = phase_results(&ph, &s, &bounds, &t);
    let w = |phase, at_ms, status, found| Write {
        phase,
        at_ms,
        status,
        to_rungs_ms: (status == 201).then_some(100.0),
        slug: format!("w{at_ms}"),
        found,
        refused: Vec::new(),
    };
    let refused = |mut w: Write, got: &[&str]| {
        w.refused = got.iter().map(|g| g.to_string()).collect();
        w
    };
    let writes = [
        w(1, 1100, 201, Some(true)),
        w(1, 1200, 503, None),
        // Refused, then created on a retry: shown, not a miss.
        refused(w(1, 1300, 201, Some(true)), &["503 unavailable"]),
        // Refused on every attempt: a miss that says what each attempt got.
        refused(
            w(1, 1400, 503, None),
            &["503 timeout", "no answer", "503 unavailable"],
        ),
        w(2, 2100, 201, Some(false)),
    ];
    add_writes(&ph, &mut r, &writes, t.eps_ms);
    judge(&ph, &mut r, &t);
    let m1 = r[1].misses.join("; ");
    assert!(
        m1.contains(
            "2 of 4 creates not answered 201: w1200 (503), w1400 (503 timeout, no answer, 503 unavailable)"
        ),
        "{m1}"
    );
    assert_eq!(r[1].retried, ["w1300 (503 unavailable)"]);
    assert_eq!(creates_cell(&r[1]), "2/4 (1r)");
    assert!(m1.contains("rung 1 served 197 of 200"), "{m1}");
    assert_eq!(
        r[2].misses,
        ["1 acknowledged creates not found afterwards: w2100"]
    );
}
