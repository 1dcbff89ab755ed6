//! Clicks from any tier that redirects: one event per redirect, built from the request,
//! appended to the local [`spool`](crate::spool) before the response leaves (never waiting on
//! Kafka), and shipped to the `clicks` topic by a replayer task whenever Kafka is reachable.
//!
//! The replayer reads a batch, produces its events (per partition their slugs hash to, as few
//! messages as hold them, one event JSON per line; a click alone keyed by its slug), waits for
//! all acknowledgements, and only then commits the spool position. A failure or crash before
//! the commit sends the batch again: duplicates carry the same event id and reach the same
//! partition, and the counter deduplicates on it; nothing is ever skipped.

use crate::kafka::HealingProducer;
use crate::now_ms;
use crate::spool::{AppendError, Spool, SpoolConfig};
use crate::trace::TraceContext;
use http::{header, HeaderMap};
use prometheus::{IntCounter, IntCounterVec, IntGauge, Opts, Registry};
use sha2::{Digest, Sha256};
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;
use zlink_wire::events::{ClickEvent, ClickRef, Tier, CLICK_EVENT_SCHEMA};

const MAX_REFERRER: usize = 1024;
const MAX_USER_AGENT: usize = 512;
/// The most clicks the replayer reads and sends as one batch, and the most bytes (a batch of
/// half as many bytes counts as full too: the next is read at once). Sized so that one
/// round ([`DEFAULT_LINGER_MS`]) holds every click of a hot tier (4,096 a round is 80,000 a second): a
/// full batch goes back to back with the next, and every batch costs Kafka requests,
/// compression contexts, acknowledgements and a commit whatever it holds (at 1,000 a batch,
/// 35-40 batches a second at a pinned tier's rate).
const BATCH_RECORDS: usize = 4096;
const BATCH_BYTES: usize = 2 << 20;
/// The replayer's round by default (`--clicks-linger-ms`): after a batch that was not full it
/// waits until this long after that batch was read (and after the spool ran empty, this long
/// once clicks arrive), so while clicks flow each process sends Kafka at most one produce
/// request per round and per partition, with as many clicks as arrived meanwhile. Much of the
/// broker's CPU per click is per request: with every little batch sent at once, back to back,
/// Kafka spent 4.0-5.2 µs of CPU per click of a hot primary or lastresort run; paced, 2.1-3.7
/// µs (2026-11-25, same topology, wrk -t2 -c16 over 1,000 links). The tier's own CPU per click
/// is largely per round too (a read, a produce request per partition with its compression
/// context, acknowledgements, wake-ups of the replayer's and librdkafka's threads): see
/// docs/performance-notebook.md, 2026-12-05. Clicks reach Kafka up to one round later, which
/// nothing downstream notices; the spool's fsync, not the round, bounds what a crash loses.
pub const DEFAULT_LINGER_MS: u64 = 200;
/// How often, at most, the replayer writes its spool position while clicks keep coming (two
/// fsyncs each: at 100 ms they were 1.5% of a pinned primary's CPU at 42k redirects/s; a crash
/// re-sends at most this much more, same ids, counted once).
const POSITION_INTERVAL: Duration = Duration::from_secs(1);
/// After shutdown starts, how long the replayer may keep draining before it stops.
const DRAIN_GRACE: Duration = Duration::from_secs(3);

/// Spool and replay settings, shared by every tier's command line.
#[derive(Debug, Clone, clap::Args)]
pub struct ClickArgs {
    /// Directory of this instance's click spool (one process per directory). Required wherever
    /// clicks are recorded.
    #[arg(long, env = "ZLINK_SPOOL_DIR")]
    pub spool_dir: Option<PathBuf>,
    /// Disk cap of the spool; when reached, new clicks are refused (counted), old ones kept.
    #[arg(long, env = "ZLINK_SPOOL_MAX_BYTES", default_value_t = 1024 * 1024 * 1024)]
    pub spool_max_bytes: u64,
    #[arg(long, env = "ZLINK_SPOOL_SEGMENT_BYTES", default_value_t = 8 * 1024 * 1024)]
    pub spool_segment_bytes: u64,
    /// fsync the spool after this many clicks...
    #[arg(long, env = "ZLINK_SPOOL_FSYNC_RECORDS", default_value_t = 1024)]
    pub spool_fsync_records: usize,
    /// ...or this many milliseconds after the first unsynced one.
    #[arg(long, env = "ZLINK_SPOOL_FSYNC_MS", default_value_t = 20)]
    pub spool_fsync_ms: u64,
    /// The spool's staging ring (a file in the spool directory, mapped): a click is copied
    /// into it and moved into a segment in batches. At most half a segment is used; 0: no
    /// ring, a `write(2)` per click.
    #[arg(long, env = "ZLINK_SPOOL_RING_BYTES", default_value_t = crate::spool::DEFAULT_RING_BYTES)]
    pub spool_ring_bytes: u64,
    #[arg(long, env = "ZLINK_CLICKS_TOPIC", default_value = "clicks")]
    pub clicks_topic: String,
    /// Most bytes of click events in one Kafka message (their JSON, one per line: a replay
    /// batch's clicks of one partition share messages). 0: one click per message, keyed by its
    /// slug, the form from before batching: for a change-over while some consumer of `clicks`
    /// still reads one event per message.
    #[arg(long, env = "ZLINK_CLICKS_MESSAGE_BYTES", default_value_t = 256 * 1024)]
    pub clicks_message_bytes: usize,
    /// How long the replayer's producer retries one batch before backing off, milliseconds.
    #[arg(long, env = "ZLINK_CLICKS_TIMEOUT_MS", default_value_t = 10_000)]
    pub clicks_timeout_ms: u64,
    /// The replayer's round, milliseconds: while clicks trickle in, at most one batch is sent
    /// per round (see [`DEFAULT_LINGER_MS`]); a full batch goes at once.
    #[arg(long, env = "ZLINK_CLICKS_LINGER_MS", default_value_t = DEFAULT_LINGER_MS)]
    pub clicks_linger_ms: u64,
    /// Salt for hashing client IPs in click events: one secret for every tier, so the same
    /// visitor hashes the same on primary and lastresort.
    #[arg(
        long,
        env = "ZLINK_IP_HASH_SALT",
        hide_env_values = true,
        default_value = ""
    )]
    pub ip_hash_salt: crate::Secret,
    /// Proxies (CIDRs, comma-separated) whose X-Forwarded-For, X-Request-Id and
    /// X-Request-Start are believed: the click's client, id and time as the outermost hop saw
    /// them. Empty: trust nobody (ids and times minted here, the TCP peer is the client).
    #[arg(long, env = "ZLINK_TRUSTED_PROXIES", default_value = DEFAULT_TRUSTED_PROXIES)]
    pub trusted_proxies: TrustedProxies,
    /// MaxMind-format database (GeoLite2/GeoIP2 City or Country) for each click's country and
    /// city; re-read when the file changes. None, missing or unreadable: places are unknown,
    /// redirects and clicks unaffected.
    #[arg(long, env = "ZLINK_GEOIP_DB")]
    pub geoip_db: Option<std::path::PathBuf>,
    /// TLS on the replayer's way to Kafka.
    #[command(flatten)]
    pub kafka_tls: crate::kafka::KafkaTlsArgs,
}

/// How often a click may `stat` the GeoIP database for a newer file.
pub const GEOIP_CHECK: Duration = Duration::from_secs(10);

/// The shortest IP-hash salt a process starts with.
pub const MIN_SALT_BYTES: usize = 16;

impl ClickArgs {
    pub fn spool_config(&self) -> SpoolConfig {
        SpoolConfig {
            dir: self.spool_dir.clone().unwrap_or_default(),
            segment_bytes: self.spool_segment_bytes,
            max_bytes: self.spool_max_bytes,
            fsync_records: self.spool_fsync_records,
            fsync_interval: Duration::from_millis(self.spool_fsync_ms),
            ring_bytes: self.spool_ring_bytes,
        }
    }

    pub fn validate(&self) -> Result<(), String> {
        if self
            .spool_dir
            .as_deref()
            .is_none_or(|d| d.as_os_str().is_empty())
        {
            return Err("--spool-dir is required to record clicks".into());
        }
        self.spool_config().validate()?;
        if self.clicks_topic.is_empty() {
            return Err("--clicks-topic must not be empty".into());
        }
        // An empty or short salt makes IP hashes reversible by enumerating addresses.
        if self.ip_hash_salt.0.len() < MIN_SALT_BYTES {
            return Err(format!(
                "--ip-hash-salt (ZLINK_IP_HASH_SALT) must be a secret of at least {MIN_SALT_BYTES} bytes, the same on every tier"
            ));
        }
        // Below librdkafka's and the broker's default largest message (about 1 MB).
        if self.clicks_message_bytes > 900_000 {
            return Err("--clicks-message-bytes must be at most 900000".into());
        }
        if !(100..=300_000).contains(&self.clicks_timeout_ms) {
            return Err("--clicks-timeout-ms must be between 100 and 300000".into());
        }
        if !(1..=5_000).contains(&self.clicks_linger_ms) {
            return Err("--clicks-linger-ms must be between 1 and 5000".into());
        }
        self.kafka_tls.validate()
    }
}

/// Text of a header, cut to `max` bytes on a character boundary.
pub fn header_text(headers: &HeaderMap, name: header::HeaderName, max: usize) -> Option<String> {
    header_str(headers, name, max).map(str::to_owned)
}

/// [`header_text`], borrowed from the request.
pub fn header_str(headers: &HeaderMap, name: header::HeaderName, max: usize) -> Option<&str> {
    Some(cut(headers.get(name)?.to_str().ok()?, max))
}

/// `v` cut to `max` bytes on a character boundary.
fn cut(v: &str, max: usize) -> &str {
    let mut end = v.len().min(max);
    while !v.is_char_boundary(end) {
        end -= 1;
    }
    &v[..end]
}

/// The proxies whose forwarding headers are believed (`--trusted-proxies`): `X-Forwarded-For`
/// (the client), `X-Request-Id` (the click id) and `X-Request-Start` (the click time). From
/// anyone else these headers are ignored, so a client can neither forge another visitor's
/// address nor choose its click's id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TrustedProxies(Vec<(IpAddr, u8)>);

impl std::str::FromStr for TrustedProxies {
    type Err = String;
    /// Comma-separated CIDRs (`127.0.0.0/8,::1/128`) or addresses; empty = trust nobody.
    fn from_str(s: &str) -> Result<Self, String> {
        let mut nets = Vec::new();
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (addr, bits) = match part.split_once('/') {
                Some((a, b)) => (a, Some(b)),
                None => (part, None),
            };
            let addr: IpAddr = addr
                .parse()
                .map_err(|_| format!("{part:?} is not an IP address or CIDR"))?;
            let max = if addr.is_ipv4() { 32 } else { 128 };
            let bits = match bits {
                None => max,
                Some(b) => b
                    .parse::<u8>()
                    .ok()
                    .filter(|b| *b <= max)
                    .ok_or_else(|| format!("{part:?} has a bad prefix length"))?,
            };
            nets.push((addr, bits));
        }
        Ok(TrustedProxies(nets))
    }
}

impl TrustedProxies {
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = ip.to_canonical();
        self.0.iter().any(|&(net, bits)| match (net, ip) {
            (IpAddr::V4(n), IpAddr::V4(a)) => {
                let mask = u32::MAX.checked_shl(32 - u32::from(bits)).unwrap_or(0);
                u32::from(n) & mask == u32::from(a) & mask
            }
            (IpAddr::V6(n), IpAddr::V6(a)) => {
                let mask = u128::MAX.checked_shl(128 - u32::from(bits)).unwrap_or(0);
                u128::from(n) & mask == u128::from(a) & mask
            }
            _ => false,
        })
    }

    /// Who made the request and when, as the outermost hop saw it: from a trusted proxy, its
    /// `X-Request-Id` (a UUID or nginx's 32 hex digits), `X-Request-Start` (`t=<secs>.<ms>` or
    /// `<secs>.<ms>`, within a day before now) and the last `X-Forwarded-For` entry; otherwise
    /// (or where a header is absent or malformed) a fresh UUIDv7, `now_ms` and the TCP peer.
    /// One request therefore has one click id and one click time on whichever tier answers it,
    /// including a tier that finishes it late after the proxy already failed over.
    pub fn origin(&self, peer: IpAddr, headers: &HeaderMap, now_ms: i64) -> Origin {
        let mut o = Origin {
            id: click_id(now_ms),
            at_ms: now_ms,
            client: peer,
        };
        if !self.contains(peer) {
            return o;
        }
        let text = |name: &header::HeaderName| headers.get(name).and_then(|v| v.to_str().ok());
        if let Some(id) = text(&X_REQUEST_ID)
            .and_then(|v| Uuid::try_parse(v.trim()).ok())
            .filter(|id| !id.is_nil())
        {
            o.id = id;
        }
        if let Some(at) = text(&X_REQUEST_START)
            .and_then(|v| msec_to_ms(v.trim().trim_start_matches("t=")))
            .filter(|at| (now_ms - 86_400_000..=now_ms + 60_000).contains(at))
        {
            o.at_ms = at;
        }
        o.client = self.client(peer, headers);
        o
    }

    /// The client's address: from a trusted proxy the last `X-Forwarded-For` entry (the only
    /// one our proxy wrote; anything left of it is client-supplied), else the TCP peer.
    pub fn client(&self, peer: IpAddr, headers: &HeaderMap) -> IpAddr {
        if !self.contains(peer) {
            return peer;
        }
        headers
            .get_all(X_FORWARDED_FOR)
            .iter()
            .next_back()
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.rsplit(',').next())
            .and_then(|s| s.trim().parse::<IpAddr>().ok())
            .unwrap_or(peer)
    }
}

/// Loopback only: the local topology's nginx tiers.
pub const DEFAULT_TRUSTED_PROXIES: &str = "127.0.0.0/8,::1/128";

/// A fresh click id: a UUIDv7 (RFC 9562) of `now_ms`, the time the redirect already read, and
/// 74 random bits from the thread's generator. `Uuid::now_v7` read the clock again and went
/// through a process-wide context for a sub-millisecond counter (0.07 µs of a redirect, perf
/// 2026-12-05); nothing orders clicks by id within a millisecond (the counter deduplicates on
/// the whole id), and 74 random bits keep a collision within one millisecond out of reach.
pub fn click_id(now_ms: i64) -> Uuid {
    let random: [u8; 10] = rand::random();
    uuid::Builder::from_unix_timestamp_millis(u64::try_from(now_ms).unwrap_or(0), &random)
        .into_uuid()
}

/// A click's identity, time and client (see [`TrustedProxies::origin`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Origin {
    pub id: Uuid,
    pub at_ms: i64,
    pub client: IpAddr,
}

/// nginx's `$msec` ("1795328181.123") in milliseconds, without going through floats.
pub fn msec_to_ms(msec: &str) -> Option<i64> {
    let (secs, frac) = msec.split_once('.').unwrap_or((msec, "0"));
    if secs.is_empty()
        || secs.len() > 12
        || !secs.bytes().all(|b| b.is_ascii_digit())
        || frac.len() > 3
        || !frac.bytes().all(|b| b.is_ascii_digit())
    {
        return None;
    }
    let secs: i64 = secs.parse().ok()?;
    // The fraction's digits padded to three ("1" is 100 ms), without a string per click.
    let ms = frac
        .bytes()
        .chain(std::iter::repeat(b'0'))
        .take(3)
        .fold(0i64, |ms, d| ms * 10 + i64::from(d - b'0'));
    secs.checked_mul(1000)?.checked_add(ms)
}

/// Hex SHA-256 of the deployment salt and the IP: countable, not reversible without the salt.
pub fn ip_hash(salt: &str, ip: IpAddr) -> String {
    IpHash::of(salt, ip).as_str().to_owned()
}

/// [`ip_hash`] on the stack (one per redirect: no allocation).
#[derive(Clone, Copy)]
pub struct IpHash([u8; 64]);

impl IpHash {
    pub fn of(salt: &str, ip: IpAddr) -> IpHash {
        let mut h = Sha256::new();
        h.update(salt.as_bytes());
        // The address's text, as `to_string` writes it. An IPv4 address (nearly every click)
        // is written here digit by digit: through `core::fmt` it was a formatter call per
        // octet, a visible share of a redirect's copies (issue 37). The longest IPv6 text is
        // 45 bytes (`ffff:…:255.255.255.255`).
        let mut text = [0u8; 48];
        let n = match ip {
            IpAddr::V4(v4) => v4_text(v4, &mut text),
            IpAddr::V6(v6) => {
                use std::io::Write;
                let mut cur = std::io::Cursor::new(&mut text[..]);
                match write!(cur, "{v6}") {
                    Ok(()) => cur.position() as usize,
                    Err(_) => 0,
                }
            }
        };
        if n == 0 {
            h.update(ip.to_string().as_bytes());
        } else {
            h.update(&text[..n]);
        }
        let mut out = [0u8; 64];
        hex::encode_to_slice(h.finalize(), &mut out).expect("32 bytes are 64 hex digits");
        IpHash(out)
    }

    pub fn as_str(&self) -> &str {
        std::str::from_utf8(&self.0).expect("hex digits are ASCII")
    }
}

/// `ip`'s dotted-decimal text into `buf`; its length.
fn v4_text(ip: std::net::Ipv4Addr, buf: &mut [u8; 48]) -> usize {
    let mut n = 0;
    for (i, o) in ip.octets().into_iter().enumerate() {
        if i > 0 {
            buf[n] = b'.';
            n += 1;
        }
        if o >= 100 {
            buf[n] = b'0' + o / 100;
            n += 1;
        }
        if o >= 10 {
            buf[n] = b'0' + o / 10 % 10;
            n += 1;
        }
        buf[n] = b'0' + o % 10;
        n += 1;
    }
    n
}

/// Response header carrying the id of the redirect's click event.
pub const CLICK_ID_HEADER: &str = "x-zlink-click-id";

/// [`CLICK_ID_HEADER`] as a header name: inserting the `&str` built a new name (an
/// allocation) on every redirect.
pub const CLICK_ID: http::HeaderName = http::HeaderName::from_static(CLICK_ID_HEADER);

/// Set by the frontend nginx on a request it failed over to a last-resort host (and passed on
/// by that host's nginx when it came from a trusted proxy): lastresort counts such requests as
/// `via="failover"` (rung 2 serving), everything else — rung-4 DNS traffic, probes — as
/// `via="direct"`.
pub const FAILOVER_HEADER: &str = "x-zlink-failover";

/// [`FAILOVER_HEADER`] as a header name.
pub const FAILOVER: http::HeaderName = http::HeaderName::from_static(FAILOVER_HEADER);

// The trusted proxy's headers a click reads, as names built once: a lookup by `&str` parses
// and checks the name on every call (five lookups a redirect, about 1 % of a pinned tier's
// CPU in `parse_hdr` and `find`, perf 2026-12-04).
const X_REQUEST_ID: http::HeaderName = http::HeaderName::from_static("x-request-id");
const X_REQUEST_START: http::HeaderName = http::HeaderName::from_static("x-request-start");
const X_FORWARDED_FOR: http::HeaderName = http::HeaderName::from_static("x-forwarded-for");

/// The [`CLICK_ID_HEADER`] value of a click id.
pub fn click_id_value(id: Uuid) -> http::HeaderValue {
    let mut buf = Uuid::encode_buffer();
    http::HeaderValue::from_str(id.hyphenated().encode_lower(&mut buf))
        .expect("a hyphenated UUID is a valid header value")
}

/// Whether a request is a click: a browser following the link (GET). HEAD (link checkers,
/// monitoring) gets the same answer but is not counted.
pub fn is_click(method: &http::Method) -> bool {
    method == http::Method::GET
}

/// The click event of one redirect: who (hashed), from where (country and city of the client
/// address, looked up here; the address itself goes no further), with what. Owned: for callers
/// that keep it; a redirect uses [`with_event`].
pub fn event(
    tier: Tier,
    salt: &str,
    geo: &std::sync::Arc<crate::geo::Geo>,
    slug: &str,
    origin: &Origin,
    headers: &HeaderMap,
) -> ClickEvent {
    with_event(tier, salt, geo, slug, origin, headers, |ev| ev.to_event())
}

/// Calls `f` with the click event of one redirect ([`event`]), borrowing the slug and the
/// request's headers: a redirect's click copies nothing but into its spool record.
pub fn with_event<R>(
    tier: Tier,
    salt: &str,
    geo: &std::sync::Arc<crate::geo::Geo>,
    slug: &str,
    origin: &Origin,
    headers: &HeaderMap,
    f: impl FnOnce(&ClickRef<'_>) -> R,
) -> R {
    let user_agent = headers
        .get(header::USER_AGENT)
        .and_then(|v| v.to_str().ok());
    let (country, city) = geo.locate(origin.client);
    // Classified on the whole header; the event carries it cut.
    let (agent, device) = zlink_wire::events::classify(user_agent);
    let user_agent = user_agent.map(|ua| cut(ua, MAX_USER_AGENT));
    let hash = IpHash::of(salt, origin.client);
    f(&ClickRef {
        schema: CLICK_EVENT_SCHEMA,
        id: origin.id,
        key: slug,
        at_ms: origin.at_ms,
        tier,
        referrer: header_str(headers, header::REFERER, MAX_REFERRER),
        user_agent,
        agent,
        ip_hash: hash.as_str(),
        device,
        country: country.as_deref(),
        city: city.as_deref(),
    })
}

/// First byte of a current spool record. Records written before traces travelled start with
/// the slug's length (at most 64), so both kinds are told apart and both are replayed.
const FRAME_V2: u8 = 0xFE;

/// A spool record: `[0xFE][click time ms, i64 BE][traceparent length u8][traceparent]
/// [slug length u8][slug][event JSON]`, so the replayer has the Kafka key, the trace header
/// and the backlog's age without parsing the event. (Older records: `[slug length][slug]
/// [event JSON]`.)
pub fn frame(ev: &ClickRef<'_>, trace: Option<&TraceContext>) -> Vec<u8> {
    let mut out = Vec::with_capacity(512);
    frame_into(&mut out, ev, trace);
    out
}

/// [`frame`] appended to `out` (a redirect's click reuses one buffer: no allocation per click).
pub fn frame_into(out: &mut Vec<u8>, ev: &ClickRef<'_>, trace: Option<&TraceContext>) {
    let key = &ev.key.as_bytes()[..ev.key.len().min(255)];
    let tp = trace.map(TraceContext::header).unwrap_or_default();
    out.reserve(12 + tp.len() + key.len() + 256);
    out.push(FRAME_V2);
    out.extend_from_slice(&ev.at_ms.to_be_bytes());
    out.push(tp.len() as u8);
    out.extend_from_slice(tp.as_bytes());
    out.push(key.len() as u8);
    out.extend_from_slice(key);
    // serde_json's very bytes, written by hand (ClickRef::write_json): cannot fail.
    ev.write_json(out);
}

/// A spool record's parts (see [`frame`]).
#[derive(Debug, PartialEq, Eq)]
pub struct Framed<'a> {
    pub key: &'a [u8],
    pub value: &'a [u8],
    /// The click's time (absent in records from before traces travelled).
    pub at_ms: Option<i64>,
    pub traceparent: Option<&'a str>,
}

/// Splits a spool record; `None` if it is not one of ours.
pub fn unframe(rec: &[u8]) -> Option<Framed<'_>> {
    fn take(b: &[u8], n: usize) -> Option<(&[u8], &[u8])> {
        (b.len() >= n).then(|| b.split_at(n))
    }
    let (&first, rest) = rec.split_first()?;
    let (at_ms, traceparent, rest) = if first == FRAME_V2 {
        let (at, rest) = take(rest, 8)?;
        let (&n, rest) = rest.split_first()?;
        let (tp, rest) = take(rest, usize::from(n))?;
        let tp = std::str::from_utf8(tp).ok().filter(|t| !t.is_empty());
        (Some(i64::from_be_bytes(at.try_into().ok()?)), tp, rest)
    } else {
        (None, None, rec)
    };
    let (&n, rest) = rest.split_first()?;
    let n = usize::from(n);
    (rest.len() > n).then(|| {
        let (key, value) = rest.split_at(n);
        Framed {
            key,
            value,
            at_ms,
            traceparent,
        }
    })
}

mod pipeline;
pub use pipeline::{partition_of, ClickMetrics, Clicks};

#[cfg(test)]
mod tests;
