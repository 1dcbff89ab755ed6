use super::*;
use uuid::Uuid;
use zlink_wire::events::Device;

fn ev(tier: Tier, agent: AgentClass, referrer: Option<&str>) -> ClickEvent {
    ClickEvent {
        schema: 1,
        id: Uuid::new_v4(),
        slug: "abc".into(),
        at_ms: 1_700_000_000_000,
        tier,
        referrer: referrer.map(String::from),
        user_agent: None,
        agent,
        ip_hash: String::new(),
        device: Device::Mobile,
        country: Some("DE".into()),
        city: Some("Berlin".into()),
    }
}

#[test]
fn days_are_utc_and_floor_negative_times() {
    assert_eq!(day_of(0), 0);
    assert_eq!(day_of(DAY_MS - 1), 0);
    assert_eq!(day_of(DAY_MS), 1);
    assert_eq!(day_of(-1), -1);
}

#[test]
fn referrers_are_hosts() {
    assert_eq!(referrer_host(None), DIRECT);
    assert_eq!(referrer_host(Some("  ")), DIRECT);
    assert_eq!(
        referrer_host(Some("https://WWW.Example.com/a?b=<script>")),
        "example.com"
    );
    assert_eq!(
        referrer_host(Some("http://news.ycombinator.com")),
        "news.ycombinator.com"
    );
    assert_eq!(referrer_host(Some("android-app://com.x")), UNKNOWN);
    assert_eq!(referrer_host(Some("not a url")), UNKNOWN);
}

#[test]
fn one_click_changes_total_tier_agent_and_referrer() {
    let mut d = DayCounts::default();
    let a = ev(Tier::Lastresort, AgentClass::Bot, Some("https://t.co/x"));
    let changed = d.add(&[&a]);
    let want: BTreeMap<RowKey, i64> = [
        (("c", "total"), 1),
        (("c", "tier:lastresort"), 1),
        (("c", "agent:bot"), 1),
        (("c", "device:mobile"), 1),
        (("r", "t.co"), 1),
        (("g", "DE"), 1),
        (("t", "DE/Berlin"), 1),
    ]
    .into_iter()
    .map(|((k, v), n)| ((k.to_string(), v.to_string()), n))
    .collect();
    assert_eq!(changed, want);
    let b = ev(Tier::Primary, AgentClass::Browser, Some("https://t.co/y"));
    let changed = d.add(&[&b]);
    assert_eq!(changed[&("c".into(), "total".into())], 2);
    assert_eq!(changed[&("r".into(), "t.co".into())], 2);
    assert_eq!(changed.len(), 7);
}

#[test]
fn referrers_beyond_the_cap_count_as_other() {
    let mut d = DayCounts::default();
    let evs: Vec<ClickEvent> = (0..MAX_REFERRERS_PER_DAY + 5)
        .map(|i| {
            ev(
                Tier::Primary,
                AgentClass::Browser,
                Some(&format!("https://h{i}.com/")),
            )
        })
        .collect();
    d.add(&evs.iter().collect::<Vec<_>>());
    let refs = d.rows.keys().filter(|(k, _)| k == "r").count();
    assert_eq!(refs, MAX_REFERRERS_PER_DAY + 1);
    assert_eq!(d.rows[&("r".into(), OTHER.into())], 5);
    // A host already counted keeps its own row after the cap.
    let again = ev(Tier::Primary, AgentClass::Browser, Some("https://h3.com/"));
    d.add(&[&again]);
    assert_eq!(d.rows[&("r".into(), "h3.com".into())], 2);
}

#[test]
fn stats_sum_days_and_split_humans_from_bots() {
    let mut d1 = DayCounts::default();
    let mut d2 = DayCounts::default();
    let a = ev(Tier::Primary, AgentClass::Browser, Some("https://a.com"));
    let b = ev(Tier::Lastresort, AgentClass::Preview, None);
    let c = ev(
        Tier::LastresortNginx,
        AgentClass::Bot,
        Some("https://a.com"),
    );
    d1.add(&[&a, &b]);
    d2.add(&[&c]);
    let mut s = LinkStats::default();
    s.merge_day(10, &d1.rows);
    s.merge_day(12, &d2.rows);
    assert_eq!((s.total, s.humans(), s.bots()), (3, 1, 2));
    assert_eq!(s.per_day, [(10, 2), (12, 1)].into_iter().collect());
    assert_eq!(s.top_referrers(1), vec![("a.com", 2)]);
    let j = s.to_json("abc", 12, 3);
    assert_eq!(j["by_tier"]["lastresort-nginx"], 1);
    assert_eq!(j["by_agent"]["preview"], 1);
    let days: Vec<i64> = j["last_days"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["clicks"].as_i64().unwrap())
        .collect();
    assert_eq!(days, vec![2, 0, 1]);
    assert_eq!(j["last_days"][0]["date"], "1970-01-11");
}

#[test]
fn cell_names_round_trip_and_unknown_kinds_are_ignored() {
    for row in [
        ("c".to_string(), "tier:lastresort-nginx".to_string()),
        ("r".to_string(), "[2001:db8::1]".to_string()),
        ("r".to_string(), DIRECT.to_string()),
    ] {
        assert_eq!(parse_cell(&cell_name(&row)), Some(row));
    }
    assert_eq!(parse_cell("i:abc"), None);
    assert_eq!(parse_cell("nocolon"), None);
}

#[test]
fn places_and_devices_are_counted_and_cities_capped() {
    let mut d = DayCounts::default();
    let mut evs: Vec<ClickEvent> = (0..MAX_CITIES_PER_DAY + 3)
        .map(|i| {
            let mut e = ev(Tier::Primary, AgentClass::Browser, None);
            e.city = Some(format!("City {i}"));
            e
        })
        .collect();
    let mut unknown = ev(Tier::Primary, AgentClass::Browser, None);
    (unknown.country, unknown.city, unknown.device) = (None, None, Device::Desktop);
    evs.push(unknown);
    d.add(&evs.iter().collect::<Vec<_>>());
    let mut s = LinkStats::default();
    s.merge_day(1, &d.rows);
    assert_eq!(s.countries["DE"], MAX_CITIES_PER_DAY as i64 + 3);
    assert_eq!(s.countries[UNKNOWN], 1);
    assert_eq!(s.cities.len(), MAX_CITIES_PER_DAY + 1);
    assert_eq!(s.cities[OTHER], 3);
    assert_eq!(s.by_device["mobile"], MAX_CITIES_PER_DAY as i64 + 3);
    let j = s.to_json("abc", 1, 1);
    assert_eq!(j["by_device"]["desktop"], 1);
    assert_eq!(j["by_device"]["tablet"], 0);
    assert_eq!(j["top_countries"][0]["country"], "DE");
    assert_eq!(j["top_countries"][1]["country"], UNKNOWN);
    assert_eq!(j["top_cities"].as_array().unwrap().len(), 10);
    assert_eq!(j["top_cities"][0]["city"], OTHER);
    assert_eq!(j["top_cities"][1]["country"], "DE");
}
