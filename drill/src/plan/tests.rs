use super::*;

fn tiers() -> BTreeMap<String, Vec<String>> {
    TIERS
        .iter()
        .map(|t| (t.to_string(), vec![format!("{t}-1"), format!("{t}-2")]))
        .collect()
}

#[test]
fn scenarios_parse_and_reject_nonsense() {
    assert_eq!(
        Scenario::parse("hang:store").unwrap(),
        Scenario::Tier(Kind::Hang, "store".into())
    );
    assert_eq!(
        Scenario::parse("ladder:kill").unwrap(),
        Scenario::Ladder(Kind::Kill)
    );
    for bad in ["hang", "melt:store", "ladder:flap", "ladder:x", ""] {
        assert!(Scenario::parse(bad).is_err(), "{bad}");
    }
}

#[test]
fn every_fault_phase_is_followed_by_its_restore() {
    let proxied: Vec<String> = ["primaries", "store"].map(String::from).to_vec();
    let ph = phases(&matrix(&proxied), &tiers(), &proxied, &[]).unwrap();
    assert_eq!(ph[0].name, "baseline");
    let mut broken: Vec<(Kind, String)> = vec![];
    for p in &ph {
        for a in &p.actions {
            match a {
                Action::Break(k, c) => broken.push((*k, c.clone())),
                Action::Restore(k, c) => {
                    let i = broken
                        .iter()
                        .position(|b| b == &(*k, c.clone()))
                        .expect("restores only what it broke");
                    broken.remove(i);
                }
            }
        }
    }
    assert!(broken.is_empty(), "left broken: {broken:?}");
    // Slow and blackhole only where a proxy is.
    assert!(ph.iter().any(|p| p.name == "store-slow"));
    assert!(!ph.iter().any(|p| p.name == "kafka-slow"));
    assert!(phases(
        &[Scenario::Tier(Kind::Slow, "kafka".into())],
        &tiers(),
        &proxied,
        &[]
    )
    .is_err());
}

#[test]
fn cuts_apply_to_links_only_and_the_netcut_set_restores_them() {
    let mut t = tiers();
    for l in LINKS {
        t.insert(l.into(), vec![l.into()]);
    }
    let proxied: Vec<String> = vec!["s3".into()];
    let ph = phases(&netcut(), &t, &proxied, &[]).unwrap();
    let names: Vec<_> = ph.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(
        names,
        ["baseline", "wan-cut", "wan-back", "s3-blackhole", "s3-back"]
    );
    assert_eq!(ph[1].actions, [Action::Break(Kind::Cut, "wan".into())]);
    assert!(ph[1].writes_whole, "a WAN cut leaves each side its S3");
    assert!(phases(&[Scenario::parse("cut:store").unwrap()], &t, &proxied, &[]).is_err());
    assert!(phases(&[Scenario::parse("kill:wan").unwrap()], &t, &proxied, &[]).is_err());
    let site_s3 = phases(
        &[Scenario::parse("cut:site-s3").unwrap()],
        &t,
        &proxied,
        &[],
    )
    .unwrap();
    assert!(!site_s3[1].writes_whole);
}

#[test]
fn the_fast_set_kills_and_hangs_every_tier() {
    let ph = phases(&fast(), &tiers(), &[], &[]).unwrap();
    for tier in TIERS {
        for k in ["kill", "hang"] {
            assert!(
                ph.iter().any(|p| p.name == format!("{tier}-{k}")),
                "{tier}-{k}"
            );
        }
    }
}

#[test]
fn a_replica_fault_keeps_the_write_path_whole_and_must_be_invisible() {
    let mut t = tiers();
    t.insert("cassandra-2".into(), vec!["cassandra-2".into()]);
    t.insert("kafka-1".into(), vec!["kafka-1".into()]);
    t.insert(
        "rolling".into(),
        vec!["cassandra-1".into(), "primary-1".into()],
    );
    let replicas = ["cassandra-2".to_string(), "kafka-1".to_string()];
    // Only kafka-1 has a fault proxy: only it is slowed and blackholed.
    let proxied = ["kafka-1".to_string()];
    let ph = phases(&cluster(&replicas, &proxied), &t, &proxied, &replicas).unwrap();
    let by_name = |n: &str| ph.iter().find(|p| p.name == n).unwrap();
    for n in [
        "cassandra-2-hang",
        "cassandra-2-back",
        "kafka-1-kill",
        "kafka-1-back",
        "kafka-1-slow",
        "kafka-1-blackhole",
    ] {
        assert!(by_name(n).writes_whole && by_name(n).invisible, "{n}");
    }
    assert!(!ph.iter().any(|p| p.name == "cassandra-2-slow"));
    let rolling = by_name("rolling-restart");
    assert!(rolling.invisible && rolling.writes_whole);
    assert_eq!(
        rolling.actions,
        vec![
            Action::Break(Kind::Restart, "cassandra-1".into()),
            Action::Break(Kind::Restart, "primary-1".into())
        ]
    );
    // The whole store is still a write-path tier, and not invisible.
    let whole = phases(
        &[Scenario::parse("hang:store").unwrap()],
        &t,
        &[],
        &replicas,
    )
    .unwrap();
    assert!(!whole[1].writes_whole && !whole[1].invisible);
    // Rolling needs its tier.
    assert!(phases(&[Scenario::Rolling], &tiers(), &[], &[]).is_err());
    assert_eq!(Scenario::parse("rolling").unwrap(), Scenario::Rolling);
    assert_eq!(Kind::parse("restart").unwrap(), Kind::Restart);
}

#[test]
fn the_canary_page_is_deleted_or_corrupted_and_rung_3_alerts() {
    let tiers: BTreeMap<String, Vec<String>> =
        [(CANARY_PAGE.to_string(), vec!["zlink-canary-3".to_string()])].into();
    let sc = [
        Scenario::parse("delete:canary-page").unwrap(),
        Scenario::parse("corrupt:canary-page").unwrap(),
    ];
    let ph = phases(&sc, &tiers, &[], &[]).unwrap();
    assert_eq!(
        ph[1].actions,
        [Action::Break(Kind::Delete, "zlink-canary-3".into())]
    );
    // The audit may repair the page before rung 3's alert can fire: only its own alert, on
    // the repair, is certain; the canary alert must be resolved after it.
    assert!(ph[1].alerts_fire.is_empty());
    assert_eq!(
        ph[2].actions,
        [Action::Restore(Kind::Delete, "zlink-canary-3".into())]
    );
    assert_eq!(ph[2].alerts_fire, ["ZlinkS3DriftRepaired"]);
    assert_eq!(ph[2].alerts_resolve, ["ZlinkRung3CanaryFailing"]);
    assert_eq!(
        ph[3].actions,
        [Action::Break(Kind::Corrupt, "zlink-canary-3".into())]
    );
    // Only the canary page, and only by these two kinds.
    let tiers: BTreeMap<String, Vec<String>> = [
        (CANARY_PAGE.to_string(), vec!["zlink-canary-3".to_string()]),
        ("store".to_string(), vec!["cassandra".to_string()]),
    ]
    .into();
    for bad in ["delete:store", "kill:canary-page", "deny:store"] {
        let sc = [Scenario::parse(bad).unwrap()];
        assert!(phases(&sc, &tiers, &[], &[]).is_err(), "{bad}");
    }
}

#[test]
fn deny_withdraws_s3s_anonymous_read_and_rung_3s_canary_says_so() {
    let tiers: BTreeMap<String, Vec<String>> = [("s3".to_string(), vec!["s3".to_string()])].into();
    let ph = phases(&[Scenario::parse("deny:s3").unwrap()], &tiers, &[], &[]).unwrap();
    assert_eq!(ph[1].actions, [Action::Break(Kind::Deny, "s3".into())]);
    assert_eq!(ph[1].alerts_fire, ["ZlinkRung3CanaryFailing"]);
    assert!(
        !ph[1].writes_whole,
        "rung 3 cannot read a new link: ε is not held"
    );
    assert_eq!(ph[2].actions, [Action::Restore(Kind::Deny, "s3".into())]);
    assert_eq!(ph[2].alerts_resolve, ["ZlinkRung3CanaryFailing"]);
    // Kill and the rest still apply to s3.
    assert!(phases(&[Scenario::parse("kill:s3").unwrap()], &tiers, &[], &[]).is_ok());
}

#[test]
fn full_fills_the_lastresorts_spool_disks_and_their_alert_fires_and_resolves() {
    let tiers: BTreeMap<String, Vec<String>> = [
        (
            "lastresorts".to_string(),
            vec!["lastresort-1".to_string(), "lastresort-2".to_string()],
        ),
        ("primaries".to_string(), vec!["primary-1".to_string()]),
    ]
    .into();
    let ph = phases(
        &[Scenario::parse("full:lastresorts").unwrap()],
        &tiers,
        &[],
        &[],
    )
    .unwrap();
    assert_eq!(
        ph[1].actions,
        [
            Action::Break(Kind::Full, "lastresort-1".into()),
            Action::Break(Kind::Full, "lastresort-2".into())
        ]
    );
    assert_eq!(ph[1].alerts_fire, ["ZlinkSpoolDiskLow"]);
    assert_eq!(ph[2].alerts_resolve, ["ZlinkSpoolDiskLow"]);
    // A primary's spool takes every click: a full one would make the drill's clicks inexact.
    assert!(phases(
        &[Scenario::parse("full:primaries").unwrap()],
        &tiers,
        &[],
        &[]
    )
    .is_err());
}
