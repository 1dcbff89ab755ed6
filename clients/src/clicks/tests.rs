use super::*;
use http::HeaderValue;

fn trusted() -> TrustedProxies {
    DEFAULT_TRUSTED_PROXIES.parse().unwrap()
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

#[test]
fn trusted_proxies_parse_and_match_cidrs() {
    let t: TrustedProxies = "10.0.0.0/8, 192.0.2.7,::1/128".parse().unwrap();
    assert!(t.contains(ip("10.200.0.1")));
    assert!(t.contains(ip("192.0.2.7")));
    assert!(!t.contains(ip("192.0.2.8")));
    assert!(t.contains(ip("::1")));
    assert!(t.contains(ip("::ffff:10.1.2.3")), "IPv4-mapped");
    assert!(!t.contains(ip("11.0.0.1")));
    let all: TrustedProxies = "0.0.0.0/0".parse().unwrap();
    assert!(all.contains(ip("203.0.113.1")));
    let none: TrustedProxies = "".parse().unwrap();
    assert!(!none.contains(ip("127.0.0.1")));
    for bad in ["10.0.0.0/33", "x", "10.0.0.0/", "::1/129"] {
        assert!(bad.parse::<TrustedProxies>().is_err(), "{bad}");
    }
}

#[test]
fn origin_comes_from_a_trusted_proxy_only() {
    let mut h = HeaderMap::new();
    h.insert(
        "x-forwarded-for",
        HeaderValue::from_static("1.1.1.1, 203.0.113.9"),
    );
    h.insert(
        "x-request-id",
        HeaderValue::from_static("0123456789abcdef0123456789abcdef"),
    );
    h.insert(
        "x-request-start",
        HeaderValue::from_static("t=1795328181.123"),
    );
    let now = 1_795_328_182_000;
    let o = trusted().origin(ip("127.0.0.1"), &h, now);
    assert_eq!(o.client, ip("203.0.113.9"));
    assert_eq!(
        o.id.simple().to_string(),
        "0123456789abcdef0123456789abcdef"
    );
    assert_eq!(o.at_ms, 1_795_328_181_123);
    // The same request seen by another tier: the same id and time.
    assert_eq!(trusted().origin(ip("127.0.0.2"), &h, now + 30_000), o);
    // From anyone else: nothing believed.
    let o = trusted().origin(ip("198.51.100.1"), &h, now);
    assert_eq!(o.client, ip("198.51.100.1"));
    assert_ne!(
        o.id.simple().to_string(),
        "0123456789abcdef0123456789abcdef"
    );
    assert_eq!(o.at_ms, now);
    // Malformed or implausible values are replaced, never trusted half-way.
    let mut bad = HeaderMap::new();
    bad.insert("x-request-id", HeaderValue::from_static("not-an-id"));
    bad.insert("x-request-start", HeaderValue::from_static("t=17.9.5"));
    let o = trusted().origin(ip("127.0.0.1"), &bad, now);
    assert_eq!((o.at_ms, o.client), (now, ip("127.0.0.1")));
    bad.insert(
        "x-request-id",
        HeaderValue::from_static("00000000000000000000000000000000"),
    );
    bad.insert("x-request-start", HeaderValue::from_static("1000.000"));
    let o = trusted().origin(ip("127.0.0.1"), &bad, now);
    assert!(!o.id.is_nil());
    assert_eq!(o.at_ms, now, "a start older than a day is not believed");
}

#[test]
fn a_minted_click_id_is_a_v7_uuid_of_the_redirects_time() {
    let now = 1_795_328_182_123;
    let ids: Vec<Uuid> = (0..1000).map(|_| click_id(now)).collect();
    for id in &ids {
        assert_eq!(id.get_version(), Some(uuid::Version::SortRand));
        assert_eq!(id.get_variant(), uuid::Variant::RFC4122);
        let (secs, nanos) = id.get_timestamp().expect("a v7 id has a time").to_unix();
        assert_eq!(secs * 1000 + u64::from(nanos) / 1_000_000, now as u64);
    }
    let distinct: std::collections::HashSet<_> = ids.iter().collect();
    assert_eq!(distinct.len(), ids.len(), "ids of one millisecond differ");
    // The id a redirect mints without a trusted proxy is this kind.
    let o = trusted().origin(ip("198.51.100.1"), &HeaderMap::new(), now);
    assert_eq!(o.id.get_version(), Some(uuid::Version::SortRand));
    assert_eq!(o.id.get_timestamp().unwrap().to_unix().0, 1_795_328_182);
}

#[test]
fn head_is_not_a_click() {
    assert!(is_click(&http::Method::GET));
    assert!(!is_click(&http::Method::HEAD));
}

#[test]
fn msec_parses_without_floats() {
    assert_eq!(msec_to_ms("1795328181.123"), Some(1_795_328_181_123));
    assert_eq!(msec_to_ms("1795328181.1"), Some(1_795_328_181_100));
    assert_eq!(msec_to_ms("1795328181"), Some(1_795_328_181_000));
    assert_eq!(msec_to_ms("1795328181.05"), Some(1_795_328_181_050));
    assert_eq!(msec_to_ms("1795328181."), Some(1_795_328_181_000));
    for bad in [
        "",
        ".5",
        "1.2345",
        "-1.000",
        "1.-2",
        "a.000",
        "99999999999999.000",
    ] {
        assert_eq!(msec_to_ms(bad), None, "{bad:?}");
    }
}

#[test]
fn header_text_truncates_on_char_boundaries() {
    let mut h = HeaderMap::new();
    h.insert(header::USER_AGENT, HeaderValue::from_static("abcdef"));
    assert_eq!(
        header_text(&h, header::USER_AGENT, 3).as_deref(),
        Some("abc")
    );
}

#[test]
fn a_framed_event_unframes_to_its_slug_and_json() {
    let mut h = HeaderMap::new();
    h.insert(
        header::REFERER,
        HeaderValue::from_static("https://r.example/"),
    );
    h.insert(
        header::USER_AGENT,
        HeaderValue::from_static("Mozilla/5.0 (iPhone; CPU iPhone OS 17_0 like Mac OS X)"),
    );
    let origin = Origin {
        id: Uuid::now_v7(),
        at_ms: 7,
        client: ip("203.0.113.5"),
    };
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("city.mmdb");
    crate::geo::write_test_db(&db, &[("203.0.113.0/24", "DE", Some("Berlin"))]).unwrap();
    let geo = crate::geo::Geo::open(Some(db), Duration::from_secs(60), None);
    let ev = event(Tier::Lastresort, "salt", &geo, "abc-1", &origin, &h);
    assert_eq!(
        (ev.country.as_deref(), ev.city.as_deref(), ev.device),
        (
            Some("DE"),
            Some("Berlin"),
            zlink_wire::events::Device::Mobile
        )
    );
    let unknown = Origin {
        client: ip("198.51.100.1"),
        ..origin
    };
    let far = event(Tier::Lastresort, "salt", &geo, "abc-1", &unknown, &h);
    assert_eq!((far.country, far.city), (None, None));
    let trace = TraceContext::root();
    let rec = frame(&ev.borrowed(), Some(&trace));
    let f = unframe(&rec).unwrap();
    assert_eq!(f.key, b"abc-1");
    assert_eq!(serde_json::from_slice::<ClickEvent>(f.value).unwrap(), ev);
    assert_eq!(f.at_ms, Some(7));
    assert_eq!(f.traceparent, Some(trace.header().as_str()));
    assert_eq!(ev.ip_hash, ip_hash("salt", "203.0.113.5".parse().unwrap()));
    let untraced = frame(&ev.borrowed(), None);
    assert_eq!(unframe(&untraced).unwrap().traceparent, None);
    // A record spooled by the previous release: [slug length][slug][json].
    let mut old = vec![5u8];
    old.extend_from_slice(b"abc-1");
    old.extend_from_slice(f.value);
    let o = unframe(&old).unwrap();
    assert_eq!(
        (o.key, o.value, o.at_ms, o.traceparent),
        (&b"abc-1"[..], f.value, None, None)
    );
    assert!(unframe(&[5, b'a']).is_none());
    assert!(unframe(&[]).is_none());
    assert!(unframe(&[FRAME_V2, 1, 2]).is_none());
    assert!(unframe(&[FRAME_V2, 0, 0, 0, 0, 0, 0, 0, 0, 60, b'x']).is_none());
}

#[test]
fn the_ip_hash_is_the_salted_sha256_of_the_address_text_for_every_length_of_address() {
    for ip in [
        "1.2.3.4",
        "203.0.113.255",
        "::1",
        "2001:db8::1",
        "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff",
        "::ffff:255.255.255.255",
    ] {
        let ip: IpAddr = ip.parse().unwrap();
        let mut h = Sha256::new();
        h.update(b"salt");
        h.update(ip.to_string().as_bytes());
        assert_eq!(ip_hash("salt", ip), hex::encode(h.finalize()), "{ip}");
    }
}

#[test]
fn ipv4_text_is_what_to_string_writes_for_every_octet_value() {
    let mut buf = [0u8; 48];
    for a in 0..=255u8 {
        for ip in [
            [a, 0, 9, 10],
            [99, a, 100, 255],
            [1, 10, a, 199],
            [0, 0, 0, a],
        ] {
            let ip = std::net::Ipv4Addr::from(ip);
            let n = v4_text(ip, &mut buf);
            assert_eq!(std::str::from_utf8(&buf[..n]).unwrap(), ip.to_string());
        }
    }
}

#[test]
fn a_redirects_borrowed_event_frames_as_the_owned_event_did() {
    let mut h = HeaderMap::new();
    h.insert(
        header::USER_AGENT,
        "Mozilla/5.0 (Android 14) Mobile".parse().unwrap(),
    );
    h.insert(header::REFERER, "https://a.example/\"q\"".parse().unwrap());
    let origin = Origin {
        id: Uuid::now_v7(),
        at_ms: 9,
        client: "2001:db8::7".parse().unwrap(),
    };
    let geo = crate::geo::Geo::none();
    let owned = event(Tier::Primary, "salt", &geo, "k-1", &origin, &h);
    let trace = TraceContext::root();
    let borrowed = with_event(Tier::Primary, "salt", &geo, "k-1", &origin, &h, |ev| {
        frame(ev, Some(&trace))
    });
    assert_eq!(borrowed, frame(&owned.borrowed(), Some(&trace)));
    let f = unframe(&borrowed).unwrap();
    assert_eq!(
        serde_json::from_slice::<ClickEvent>(f.value).unwrap(),
        owned
    );
    assert_eq!(owned.ip_hash, ip_hash("salt", origin.client));
}
