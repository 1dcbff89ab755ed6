//! Rung-3 clicks. While every lastresort process of a host is down, the host's nginx serves
//! the meta-refresh page from S3 itself and writes one JSON line per page to its click log
//! (`zlink_click` in nginx/lastresort.conf). This module tails that log into the click spool
//! (tier `lastresort-nginx`), so those clicks reach Kafka like any other.
//!
//! Exactly once: the event id is nginx's `$request_id` (128 random bits), not a fresh one, so
//! a line ingested twice — a crash between spooling and saving the position, or two lastresort
//! processes on the host both tailing the log — is the same event twice, and the counter counts
//! it once. The position (file identity + byte offset) is saved only after the spooled events
//! are fsynced, so a line is never skipped. A rotated (new inode) or truncated log is read from
//! its start.

use crate::metrics::Metrics;
use http::{HeaderMap, HeaderValue};
use serde::Deserialize;
use std::io::{Read, Seek, SeekFrom};
use std::net::IpAddr;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;
use zlink_clients::clicks::{self, Clicks};
use zlink_wire::events::{ClickEvent, Tier};

/// Most bytes read per pass (the rest waits for the next pass).
const MAX_PASS_BYTES: u64 = 4 << 20;
/// Longest line accepted; a longer one is skipped as malformed.
const MAX_LINE: usize = 16 << 10;
const POLL: Duration = Duration::from_secs(1);

#[derive(Deserialize)]
struct Line {
    v: u32,
    id: String,
    msec: String,
    slug: String,
    remote_addr: String,
    #[serde(default)]
    referer: String,
    #[serde(default)]
    user_agent: String,
}

/// One log line as the click event it records, or why it cannot be one.
pub fn parse_line(
    line: &str,
    salt: &str,
    geo: &Arc<zlink_clients::geo::Geo>,
) -> Result<ClickEvent, &'static str> {
    if line.len() > MAX_LINE {
        return Err("too long");
    }
    let l: Line = serde_json::from_str(line).map_err(|_| "json")?;
    if l.v != 1 {
        return Err("version");
    }
    // $request_id is 32 hex digits: exactly a UUID's 128 bits.
    if l.id.len() != 32 || !l.id.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err("id");
    }
    let id = Uuid::parse_str(&l.id).map_err(|_| "id")?;
    if !zlink_wire::domain::is_valid_key(&l.slug) {
        return Err("slug");
    }
    let at_ms = clicks::msec_to_ms(&l.msec).ok_or("time")?;
    let ip: IpAddr = l.remote_addr.parse().map_err(|_| "ip")?;
    let mut headers = HeaderMap::new();
    for (name, value) in [("referer", &l.referer), ("user-agent", &l.user_agent)] {
        if let Ok(v) = HeaderValue::from_bytes(value.as_bytes()) {
            if !value.is_empty() {
                headers.insert(name, v);
            }
        }
    }
    // nginx resolved the client already (real_ip from trusted proxies), and chose the id and
    // time: the frontend's, when a trusted frontend sent them (nginx/lastresort.conf).
    let origin = clicks::Origin {
        id,
        at_ms,
        client: ip,
    };
    Ok(clicks::event(
        Tier::LastresortNginx,
        salt,
        geo,
        &l.slug,
        &origin,
        &headers,
    ))
}

/// Where the tail stands: which file (device, inode) and how far into it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
struct Position {
    dev: u64,
    ino: u64,
    offset: u64,
}

fn load(path: &Path) -> Position {
    let Ok(text) = std::fs::read_to_string(path) else {
        return Position::default();
    };
    let n: Vec<u64> = text
        .split_whitespace()
        .filter_map(|x| x.parse().ok())
        .collect();
    match n[..] {
        [dev, ino, offset] => Position { dev, ino, offset },
        _ => Position::default(),
    }
}

fn save(path: &Path, p: Position) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    {
        let mut f = std::fs::File::create(&tmp)?;
        std::io::Write::write_all(
            &mut f,
            format!("{} {} {}\n", p.dev, p.ino, p.offset).as_bytes(),
        )?;
        f.sync_all()?;
    }
    std::fs::rename(&tmp, path)?;
    if let Some(dir) = path.parent() {
        std::fs::File::open(dir)?.sync_all()?;
    }
    Ok(())
}

pub struct Tailer {
    pub log: PathBuf,
    pub position_file: PathBuf,
    pub salt: String,
    pub geo: Arc<zlink_clients::geo::Geo>,
    pub clicks: Arc<Clicks>,
    pub metrics: Arc<Metrics>,
}

impl Tailer {
    /// Ingests what the log has beyond the saved position, complete lines only. Returns the
    /// number of events spooled.
    pub fn pass(&self) -> std::io::Result<usize> {
        let mut file = match std::fs::File::open(&self.log) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
            Err(e) => return Err(e),
        };
        let meta = file.metadata()?;
        let mut pos = load(&self.position_file);
        if (pos.dev, pos.ino) != (meta.dev(), meta.ino()) || pos.offset > meta.len() {
            pos = Position {
                dev: meta.dev(),
                ino: meta.ino(),
                offset: 0,
            };
        }
        if meta.len() == pos.offset {
            return Ok(0);
        }
        let want = (meta.len() - pos.offset).min(MAX_PASS_BYTES);
        file.seek(SeekFrom::Start(pos.offset))?;
        let mut buf = Vec::with_capacity(want as usize);
        file.take(want).read_to_end(&mut buf)?;
        // Only complete lines; a line nginx is still writing waits for the next pass. A single
        // line longer than a whole pass is skipped whole.
        let end = match buf.iter().rposition(|b| *b == b'\n') {
            Some(i) => i + 1,
            None if want == MAX_PASS_BYTES => buf.len(),
            None => return Ok(0),
        };
        let mut events = Vec::new();
        for line in buf[..end].split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
            match std::str::from_utf8(line)
                .map_err(|_| "utf-8")
                .and_then(|l| parse_line(l, &self.salt, &self.geo))
            {
                // The rung-3 canary probe's redirects are not clicks (zlink_wire::canary).
                Ok(ev) if zlink_wire::canary::is_canary(&ev.key) => {}
                Ok(ev) => events.push(ev),
                Err(reason) => {
                    self.metrics.nginx_clicks_malformed.inc();
                    tracing::warn!(reason, log = %self.log.display(), "skipping a malformed nginx click line");
                }
            }
        }
        let durable = self.clicks.spool_durably(&events);
        if durable < events.len() {
            // The spool refused some (full or failing): keep the position, offer them again.
            return Ok(0);
        }
        self.metrics.nginx_clicks_ingested.inc_by(durable as u64);
        pos.offset += end as u64;
        save(&self.position_file, pos)?;
        Ok(durable)
    }

    /// Tails the log every second until `shutdown`.
    pub async fn run(self: Arc<Self>, shutdown: CancellationToken) {
        loop {
            let this = self.clone();
            match tokio::task::spawn_blocking(move || this.pass()).await {
                Ok(Ok(n)) if n > 0 => {
                    tracing::info!(clicks = n, log = %self.log.display(), "ingested rung-3 clicks from the nginx log");
                    continue; // there may be more right away
                }
                Ok(Ok(_)) => {}
                Ok(Err(e)) => {
                    tracing::warn!(error = %e, log = %self.log.display(), "reading the nginx click log")
                }
                Err(e) => tracing::error!(error = %e, "nginx click log task"),
            }
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(POLL) => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LINE: &str = r#"{"v":1,"id":"0123456789abcdef0123456789abcdef","msec":"1795328181.120","slug":"abc","remote_addr":"198.51.100.7","referer":"https://t.co/x","user_agent":"Twitterbot/1.0"}"#;

    #[test]
    fn a_log_line_is_the_click_it_records() {
        let geo = zlink_clients::geo::Geo::none();
        let ev = parse_line(LINE, "salt", &geo).unwrap();
        assert_eq!(
            ev.id.simple().to_string(),
            "0123456789abcdef0123456789abcdef"
        );
        assert_eq!(ev.at_ms, 1_795_328_181_120);
        assert_eq!(ev.tier, Tier::LastresortNginx);
        assert_eq!(ev.key, "abc");
        assert_eq!(ev.referrer.as_deref(), Some("https://t.co/x"));
        assert_eq!(ev.agent, zlink_wire::events::AgentClass::Preview);
        assert_eq!(
            ev.ip_hash,
            clicks::ip_hash("salt", "198.51.100.7".parse().unwrap())
        );
        // The same line twice is the same event (the counter dedups on the id).
        assert_eq!(parse_line(LINE, "salt", &geo).unwrap().id, ev.id);
    }

    #[test]
    fn malformed_lines_are_refused() {
        for (from, to, why) in [
            ("\"v\":1", "\"v\":2", "version"),
            ("0123456789abcdef0123456789abcdef", "xyz", "id"),
            ("\"slug\":\"abc\"", "\"slug\":\"a/b\"", "slug"),
            ("1795328181.120", "soon", "time"),
            ("198.51.100.7", "nobody", "ip"),
        ] {
            let geo = zlink_clients::geo::Geo::none();
            assert_eq!(
                parse_line(&LINE.replace(from, to), "s", &geo).unwrap_err(),
                why
            );
        }
        assert_eq!(
            parse_line("{", "s", &zlink_clients::geo::Geo::none()).unwrap_err(),
            "json"
        );
    }
}
