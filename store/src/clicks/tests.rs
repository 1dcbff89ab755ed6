//! The counting rules and the read model (no store).

use super::*;
use std::collections::BTreeMap;
use uuid::Uuid;
use zlink_wire::events::{AgentClass, ClickEvent, Device, Tier};

fn ev(tier: Tier, agent: AgentClass, referrer: Option<&str>) -> ClickEvent {
    ClickEvent {
        schema: 1,
        id: Uuid::new_v4(),
        key: "abc".into(),
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

/// What `referrer_host` gave before its fast path: `url`'s host of the trimmed referrer.
fn host_by_url_only(referrer: &str) -> String {
    match Some(referrer.trim()).filter(|r| !r.is_empty()) {
        None => DIRECT.into(),
        Some(r) => rules::host_by_url(r),
    }
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(20_000))]
    /// The fast path for plain hosts gives exactly what `url` gives, for referrers shaped like
    /// URLs (schemes in any case, hosts of letters, digits, hyphens, dots, ports, user info,
    /// percent signs, IP-like and IDNA-like labels, odd separators and whitespace) and for
    /// anything at all.
    #[test]
    fn the_plain_host_fast_path_agrees_with_url(
        scheme in "(https?|HTTPS?|Http|ftp|android-app)(://|:/|:)?",
        host in "(www\\.|WWW\\.|xn--|0x|[a-zA-Z0-9-]{0,12}|[0-9]{1,3}|[.@:%_\\\\\t ]){0,6}",
        rest in "(/|\\?|#|:[0-9]{0,6}|\\\\|\\s)?[ -~]{0,12}",
        any in "\\PC{0,40}",
    ) {
        let url = format!("{scheme}{host}{rest}");
        proptest::prop_assert_eq!(referrer_host(Some(&url)), host_by_url_only(&url), "{:?}", url);
        proptest::prop_assert_eq!(referrer_host(Some(&any)), host_by_url_only(&any), "{:?}", any);
    }
}

#[test]
fn plain_hosts_take_the_fast_path_and_the_rest_url() {
    for (r, want) in [
        ("https://WWW.Example.com/a?b=<script>", "example.com"),
        ("http://a-b.example.co.uk#x", "a-b.example.co.uk"),
        ("https://www.example.com:443/", "example.com"),
        ("http://user@example.com/", "example.com"),
        ("http://0x7f.1/", "127.0.0.1"),
        ("http://10.0.0.1/", "10.0.0.1"),
        ("http://EXAMPLE.com./", "example.com."),
        ("http:\\\\example.com\\a", "example.com"),
        ("HTTP://example.com", "example.com"),
        ("http://ex%41mple.com/", "example.com"),
        ("http:///", UNKNOWN),
        ("http://-a.com/", "-a.com"),
    ] {
        assert_eq!(referrer_host(Some(r)), host_by_url(r), "{r}");
        assert_eq!(referrer_host(Some(r)), want, "{r}");
    }
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
    let cities = s.top_cities(10);
    assert_eq!(cities.len(), 10);
    assert_eq!(cities[0].0, OTHER);
    assert_eq!(
        s.top_countries(2),
        vec![("DE", MAX_CITIES_PER_DAY as i64 + 3), (UNKNOWN, 1)]
    );
}

#[test]
fn months_are_utc_calendar_months() {
    assert_eq!(month_of_day(0), 0);
    assert_eq!(month_of_day(30), 0, "1970-01-31");
    assert_eq!(month_of_day(31), 1, "1970-02-01");
    assert_eq!(month_of_day(-1), -1, "1969-12-31");
    assert_eq!(first_day_of_month(1), 31);
    assert_eq!(first_day_of_month(-1), -31);
    // 2024-02 has 29 days: 2024-03-01 is day 19783.
    let feb_2024 = (2024 - 1970) * 12 + 1;
    assert_eq!(
        first_day_of_month(feb_2024 + 1) - first_day_of_month(feb_2024),
        29
    );
    assert_eq!(first_day_of_month(feb_2024 + 1), 19_783);
    for day in 19_000..21_000 {
        let m = month_of_day(day);
        assert!(first_day_of_month(m) <= day && day < first_day_of_month(m + 1));
    }
}

/// The roll-up rule's safety: every day of a month the reader may roll up is late to a counter
/// whose clock is up to a day behind (or any amount ahead), so the counter deletes the roll-up
/// whenever it counts a click of that month afterwards.
#[test]
fn every_click_of_a_month_that_may_be_rolled_up_is_late_to_the_counter() {
    for today in 19_700..19_800 {
        for month in month_of_day(today) - 3..=month_of_day(today) {
            if !month_closed(month, today) {
                continue;
            }
            for day in first_day_of_month(month)..first_day_of_month(month + 1) {
                for counter_today in [today - 1, today, today + 40] {
                    assert!(is_late(day, counter_today), "{day} {counter_today}");
                }
            }
        }
        assert!(
            !month_closed(month_of_day(today), today),
            "never the current month"
        );
    }
    // 2026-11 closes on 2026-12-03 (its last day three days old).
    let nov = (2026 - 1970) * 12 + 10;
    let dec_1 = first_day_of_month(nov + 1);
    assert!(!month_closed(nov, dec_1 + 1));
    assert!(month_closed(nov, dec_1 + 2));
}

#[test]
fn a_rollup_gives_the_stats_its_days_give() {
    let mut days: Vec<(i32, DayCounts)> = Vec::new();
    for (day, clicks) in [(100, 3), (101, 0), (105, 7)] {
        let mut d = DayCounts::default();
        let events: Vec<ClickEvent> = (0..clicks)
            .map(|i| {
                ev(
                    [Tier::Primary, Tier::Lastresort][i % 2],
                    AgentClass::Browser,
                    Some(&format!("https://r{i}.example/")),
                )
            })
            .collect();
        d.add(&events.iter().collect::<Vec<_>>());
        days.push((day, d));
    }
    let mut by_day = LinkStats::default();
    for (day, d) in &days {
        by_day.merge_day(*day, &d.rows);
    }
    let rolled = rollup(days.iter().map(|(day, d)| (*day, &d.rows)));
    let mut by_month = LinkStats::default();
    by_month.merge_rollup(&rolled);
    assert_eq!(by_month, by_day);
    assert_eq!(by_month.per_day, BTreeMap::from([(100, 3), (105, 7)]));
    // Its cells survive the trip through the table's map.
    let back: BTreeMap<RowKey, i64> = rolled
        .iter()
        .map(|(r, n)| (parse_cell(&cell_name(r)).unwrap(), *n))
        .collect();
    assert_eq!(back, rolled);
}

#[test]
fn a_rollup_keeps_the_most_clicked_referrers_and_sums_the_rest() {
    let mut days = Vec::new();
    for day in 0..10 {
        let mut d = DayCounts::default();
        // 100 referrers a day, 1,000 distinct in all; r<day>-0 is clicked most.
        let events: Vec<ClickEvent> = (0..100)
            .flat_map(|i| {
                let n = if i == 0 { 5 } else { 1 };
                (0..n).map(move |_| {
                    ev(
                        Tier::Primary,
                        AgentClass::Browser,
                        Some(&format!("https://r{day}-{i}.example/")),
                    )
                })
            })
            .collect();
        d.add(&events.iter().collect::<Vec<_>>());
        days.push((day, d));
    }
    let rolled = rollup(days.iter().map(|(day, d)| (*day, &d.rows)));
    let referrers: BTreeMap<&str, i64> = rolled
        .iter()
        .filter(|((k, _), _)| k == "r")
        .map(|((_, key), n)| (key.as_str(), *n))
        .collect();
    assert_eq!(referrers.len(), MAX_KEYS_PER_MONTH + 1);
    assert_eq!(referrers.values().sum::<i64>(), 1040, "no click lost");
    assert_eq!(referrers[OTHER], 1000 - MAX_KEYS_PER_MONTH as i64);
    for day in 0..10 {
        assert_eq!(referrers[format!("r{day}-0.example").as_str()], 5);
    }
}

#[test]
fn a_rows_blob_decodes_to_its_counts_and_a_cut_one_to_its_whole_records() {
    let mut d = DayCounts::default();
    d.add(&[
        &ev(
            Tier::Primary,
            AgentClass::Browser,
            Some("https://[::1]:8/x"),
        ),
        &ev(Tier::Lastresort, AgentClass::Bot, None),
    ]);
    let blob = d.encode();
    assert_eq!(DayCounts::decode(&blob), d);
    assert_eq!(DayCounts::decode(&[]), DayCounts::default());
    // Cut inside the last record: every record before it, nothing invented.
    let cut = DayCounts::decode(&blob[..blob.len() - 3]);
    assert_eq!(cut.rows.len(), d.rows.len() - 1);
    assert!(cut.rows.iter().all(|(k, n)| d.rows.get(k) == Some(n)));
    // A length running past the end, and a name no rule writes.
    assert_eq!(DayCounts::decode(&[0xff, 0xff, b'c']), DayCounts::default());
    let mut odd = vec![0, 3];
    odd.extend_from_slice(b"x:y");
    odd.extend_from_slice(&7i64.to_be_bytes());
    assert_eq!(DayCounts::decode(&odd), DayCounts::default());
}

#[test]
fn buckets_are_stable_and_in_range() {
    // FNV-1a 32 of "" is 0x811c9dc5, of "a" 0xe40c292c: fixed forever (rows are found by it).
    assert_eq!(bucket_of(""), (0x811c_9dc5u32 % BUCKETS as u32) as i32);
    assert_eq!(bucket_of("a"), (0xe40c_292cu32 % BUCKETS as u32) as i32);
    for s in ["abc", "brand.example/x", "ZZZZZZZZ"] {
        assert!((0..BUCKETS).contains(&bucket_of(s)));
    }
}

#[test]
fn the_first_click_day_is_2020_01_01() {
    assert_eq!(FIRST_CLICK_MS, 1_577_836_800_000);
    assert_eq!(day_of(FIRST_CLICK_MS), FIRST_CLICK_DAY);
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(300))]
    /// The counter's in-memory rows ([`Tally`]) are [`DayCounts`]' rows: over runs of clicks
    /// with few or many distinct referrers, countries and cities (past both caps, `(other)`
    /// included), from a fresh day or from rows a blob held, they encode to the same blob and
    /// read back as the same rows.
    #[test]
    fn a_tally_counts_as_day_counts_do(
        clicks in proptest::collection::vec(
            (
                0usize..3,
                0usize..3,
                0usize..4,
                proptest::option::of(proptest::prop_oneof![
                    "https://[a-c]{1,2}\\.example/x",
                    proptest::strategy::Strategy::prop_map(0u32..300, |i| format!("https://r{i}.example/")),
                    "[ -~]{0,10}",
                    proptest::strategy::Just("(other)".to_string()),
                ]),
                proptest::option::of("[A-C]{2}|\\PC{0,3}"),
                proptest::option::of(proptest::prop_oneof![
                    proptest::strategy::Strategy::prop_map(0u32..300, |i| format!("City {i}")),
                    "\\PC{0,6}",
                ]),
            ),
            0..400,
        ),
        from_blob in proptest::bool::ANY,
        split in 0usize..400,
    ) {
        let events: Vec<ClickEvent> = clicks
            .into_iter()
            .map(|(tier, agent, device, referrer, country, city)| ClickEvent {
                tier: Tier::ALL[tier],
                agent: AgentClass::ALL[agent],
                device: Device::ALL[device],
                country,
                city,
                ..ev(Tier::Primary, AgentClass::Browser, referrer.as_deref())
            })
            .collect();
        let split = split.min(events.len());
        let mut want = DayCounts::default();
        want.add(&events[..split].iter().collect::<Vec<_>>());
        let mut got = if from_blob {
            Tally::decode(&want.encode())
        } else {
            let mut t = Tally::default();
            for e in &events[..split] {
                t.count(&Click::from(e));
            }
            t
        };
        want.add(&events[split..].iter().collect::<Vec<_>>());
        for e in &events[split..] {
            got.count(&Click::from(e));
        }
        proptest::prop_assert_eq!(got.encode(), want.encode());
        proptest::prop_assert_eq!(got.to_counts(), want);
    }
}

#[test]
fn groups_are_stable_in_range_and_independent_of_the_bucket() {
    // The bits above the bucket's: FNV-1a 32 of "a" is 0xe40c292c.
    assert_eq!(
        bucket_and_group("a"),
        (
            bucket_of("a"),
            ((0xe40c_292cu32 / BUCKETS as u32) % GROUPS as u32) as i32
        )
    );
    let mut seen = std::collections::BTreeSet::new();
    for i in 0..4096 {
        let s = format!("link-{i}");
        let (b, g) = bucket_and_group(&s);
        assert_eq!(b, bucket_of(&s));
        assert!((0..GROUPS).contains(&g));
        seen.insert((b, g));
    }
    // 4,096 links over the 1,024 (bucket, group) pairs: nearly every pair used.
    assert!(seen.len() > 950, "{}", seen.len());
}

#[test]
fn a_group_blob_decodes_to_its_members_and_a_cut_one_to_its_whole_members() {
    let mut a = DayCounts::default();
    a.add(&[&ev(
        Tier::Primary,
        AgentClass::Browser,
        Some("https://x.example/"),
    )]);
    let mut b = DayCounts::default();
    b.add(&[&ev(Tier::Lastresort, AgentClass::Bot, None)]);
    let blob = encode_group([("a", a.encode()), ("bé", b.encode()), ("c", Vec::new())]);
    let members = decode_group(&blob);
    assert_eq!(members.len(), 3);
    assert_eq!(members[0].0, "a");
    assert_eq!(DayCounts::decode(members[0].1), a);
    assert_eq!(members[1].0, "bé");
    assert_eq!(DayCounts::decode(members[1].1), b);
    assert_eq!((members[2].0, members[2].1.len()), ("c", 0));
    // Cut anywhere: the members before the cut, whole, and nothing else.
    for cut in 0..blob.len() {
        let got = decode_group(&blob[..cut]);
        assert!(got.len() < 3 || cut == blob.len(), "cut {cut}");
        for (i, (slug, counts)) in got.iter().enumerate() {
            assert_eq!((*slug, *counts), members[i], "cut {cut}");
        }
    }
    assert!(decode_group(&[0xff, 0xff, 1]).is_empty());
}
