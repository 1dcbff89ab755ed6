//! A small async memcached client (text protocol: get, set, add, delete) built for the redirect
//! path.
//!
//! Why not the `memcache` crate: it is blocking, so every redirect would need a
//! `spawn_blocking` hop and its timeouts are per socket op, not per lookup. Here one budget
//! (`timeout`) covers waiting for a connection, connecting and the round trip; past it the
//! caller falls through to the store. Every operation goes through a [`Breaker`]: after
//! consecutive failures (refused, reset, timed out, garbled) memcached is skipped entirely for
//! the breaker's window, then one operation probes it, so a dead or stalled memcached costs one
//! budget per window, not one per request. A connection is taken out of its slot for the duration of an operation:
//! if the operation is cancelled halfway (timeout), the half-used connection is dropped, never
//! reused with unread bytes in it.

use crate::breaker::{Breaker, CallError};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use thiserror::Error;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufStream};
use tokio::net::TcpStream;
use tokio::sync::Mutex;

/// Largest value this client accepts back from the server.
const MAX_VALUE_BYTES: usize = 64 * 1024;

#[derive(Debug, Error)]
pub enum McError {
    #[error("memcached skipped: circuit open after failures")]
    BackingOff,
    #[error("memcached timed out")]
    Timeout,
    #[error("memcached i/o: {0}")]
    Io(#[from] std::io::Error),
    #[error("memcached protocol: {0}")]
    Protocol(String),
    #[error("memcached value does not decode")]
    Decode,
}

impl McError {
    /// Label for the errors metric.
    pub fn kind(&self) -> &'static str {
        match self {
            McError::BackingOff => "backoff",
            McError::Timeout => "timeout",
            McError::Io(_) => "io",
            McError::Protocol(_) => "protocol",
            McError::Decode => "decode",
        }
    }
}

enum Op<'a> {
    Get(&'a str),
    /// `set` (always) or `add` (only if absent): verb, key, value, TTL seconds.
    Store(&'static str, &'a str, &'a [u8], u32),
    Delete(&'a str),
}

enum Reply {
    Value(Option<Vec<u8>>),
    /// Whether a `set`/`add` stored the value.
    Stored(bool),
    Done,
}

pub struct Memcache {
    addr: String,
    slots: Vec<Mutex<Option<BufStream<TcpStream>>>>,
    next: AtomicUsize,
    timeout: Duration,
    /// Budget of `set` and `delete`: what a change writes, off the redirect path.
    write_timeout: Duration,
    breaker: Breaker,
}

/// Longest memcached key, bytes.
pub const MAX_KEY_BYTES: usize = 250;

/// memcached keys: 1..=250 bytes, no whitespace or control characters.
pub fn is_valid_key(key: &str) -> bool {
    !key.is_empty() && key.len() <= MAX_KEY_BYTES && key.bytes().all(|b| b.is_ascii_graphic())
}

impl Memcache {
    /// `timeout` is the budget of one operation; `breaker` (named e.g. "memcached") decides when
    /// memcached is skipped.
    pub fn new(addr: impl Into<String>, pool: usize, timeout: Duration, breaker: Breaker) -> Self {
        Self {
            addr: addr.into(),
            slots: (0..pool.max(1)).map(|_| Mutex::new(None)).collect(),
            next: AtomicUsize::new(0),
            timeout,
            write_timeout: timeout,
            breaker,
        }
    }

    /// A longer budget for `set` and `delete`: a link change waits for memcached to take the
    /// new value (a busy memcached answers a write in 30 ms as often as a get in 2), and the
    /// redirect path's short budget would turn a slow write into a stale read.
    pub fn with_write_timeout(mut self, write_timeout: Duration) -> Self {
        self.write_timeout = write_timeout;
        self
    }

    /// A `memcached.get` span of the current trace (`hit`; failed on error).
    pub async fn get(&self, key: &str) -> Result<Option<Vec<u8>>, McError> {
        let mut span = crate::trace::Span::in_current("memcached.get");
        let got = match self.exec(Op::Get(key), self.timeout).await {
            Ok(Reply::Value(v)) => Ok(v),
            Ok(_) => Err(McError::Protocol("unexpected reply to get".into())),
            Err(e) => Err(e),
        };
        span.set("hit", matches!(got, Ok(Some(_))));
        if let Err(e) = &got {
            span.fail(e);
        }
        got
    }

    pub async fn set(&self, key: &str, value: &[u8], ttl_s: u32) -> Result<(), McError> {
        self.exec(Op::Store("set", key, value, ttl_s), self.write_timeout)
            .await
            .map(|_| ())
    }

    /// Writes a JSON value now (`set`): what a change writes, see [`Memcache::add`].
    pub async fn set_json<T: serde::Serialize>(
        &self,
        key: &str,
        value: &T,
        ttl_s: u32,
    ) -> Result<(), McError> {
        let bytes = serde_json::to_vec(value).map_err(|_| McError::Decode)?;
        self.set(key, &bytes, ttl_s).await
    }

    /// Stores only if the key holds nothing; `Ok(false)` when it already did. Cache fills use
    /// this, changes use [`Memcache::set`]: a fill that read the store before a change and
    /// arrives after the change's write cannot put the old value back.
    pub async fn add(&self, key: &str, value: &[u8], ttl_s: u32) -> Result<bool, McError> {
        match self
            .exec(Op::Store("add", key, value, ttl_s), self.timeout)
            .await?
        {
            Reply::Stored(stored) => Ok(stored),
            _ => Err(McError::Protocol("unexpected reply to add".into())),
        }
    }

    pub async fn delete(&self, key: &str) -> Result<(), McError> {
        self.exec(Op::Delete(key), self.write_timeout)
            .await
            .map(|_| ())
    }

    /// A JSON value; one that does not decode is an error of kind `decode`.
    pub async fn get_json<T: serde::de::DeserializeOwned>(
        &self,
        key: &str,
    ) -> Result<Option<T>, McError> {
        match self.get(key).await? {
            Some(bytes) => serde_json::from_slice(&bytes)
                .map(Some)
                .map_err(|_| McError::Decode),
            None => Ok(None),
        }
    }

    /// Fills a JSON value in the background if the key holds nothing (`add`): a redirect never
    /// waits for a cache fill, and a fill never overwrites a newer value a change wrote.
    /// `on_error` sees the failure (for the caller's metrics).
    pub fn fill_json_in_background<T: serde::Serialize>(
        self: &std::sync::Arc<Self>,
        key: String,
        value: &T,
        ttl_s: u32,
        on_error: impl FnOnce(&McError) + Send + 'static,
    ) {
        let Ok(bytes) = serde_json::to_vec(value) else {
            return;
        };
        let mc = self.clone();
        tokio::spawn(async move {
            if let Err(e) = mc.add(&key, &bytes, ttl_s).await {
                on_error(&e);
            }
        });
    }

    async fn exec(&self, op: Op<'_>, budget: Duration) -> Result<Reply, McError> {
        let key = match &op {
            Op::Get(k) | Op::Store(_, k, ..) | Op::Delete(k) => *k,
        };
        if !is_valid_key(key) {
            return Err(McError::Protocol("invalid key".into()));
        }
        let slot = &self.slots[self.next.fetch_add(1, Ordering::Relaxed) % self.slots.len()];
        let attempt = async {
            let mut guard = slot.lock().await;
            let mut conn = match guard.take() {
                Some(c) => c,
                None => {
                    let s = TcpStream::connect(&self.addr).await?;
                    s.set_nodelay(true)?;
                    BufStream::new(s)
                }
            };
            let reply = roundtrip(&mut conn, &op).await?;
            *guard = Some(conn);
            Ok(reply)
        };
        // Every error here is memcached (or the way to it) misbehaving: all count.
        self.breaker
            .call(budget, |_: &McError| true, attempt)
            .await
            .map_err(|e| match e {
                CallError::Open(_) => McError::BackingOff,
                CallError::Timeout(..) => McError::Timeout,
                CallError::Failed(e) => e,
            })
    }
}

async fn read_line(conn: &mut BufStream<TcpStream>) -> Result<String, McError> {
    let mut line = String::new();
    // Bounded: a reply line is at most "VALUE <250-byte key> <flags> <bytes>".
    let n = (&mut *conn).take(512).read_line(&mut line).await?;
    if n == 0 {
        return Err(McError::Io(std::io::ErrorKind::UnexpectedEof.into()));
    }
    if !line.ends_with("\r\n") {
        return Err(McError::Protocol(
            "reply line too long or unterminated".into(),
        ));
    }
    line.truncate(line.len() - 2);
    Ok(line)
}

async fn roundtrip(conn: &mut BufStream<TcpStream>, op: &Op<'_>) -> Result<Reply, McError> {
    match op {
        Op::Get(key) => {
            conn.write_all(format!("get {key}\r\n").as_bytes()).await?;
            conn.flush().await?;
            let line = read_line(conn).await?;
            if line == "END" {
                return Ok(Reply::Value(None));
            }
            let mut parts = line.split(' ');
            let (Some("VALUE"), Some(k), Some(_flags), Some(len), None) = (
                parts.next(),
                parts.next(),
                parts.next(),
                parts.next(),
                parts.next(),
            ) else {
                return Err(McError::Protocol(format!("unexpected get reply {line:?}")));
            };
            if k != *key {
                return Err(McError::Protocol("reply for another key".into()));
            }
            let len: usize = len
                .parse()
                .map_err(|_| McError::Protocol("bad length".into()))?;
            if len > MAX_VALUE_BYTES {
                return Err(McError::Protocol("value too large".into()));
            }
            let mut buf = vec![0u8; len + 2];
            conn.read_exact(&mut buf).await?;
            if &buf[len..] != b"\r\n" {
                return Err(McError::Protocol("value not terminated".into()));
            }
            buf.truncate(len);
            if read_line(conn).await? != "END" {
                return Err(McError::Protocol("missing END".into()));
            }
            Ok(Reply::Value(Some(buf)))
        }
        Op::Store(verb, key, value, ttl) => {
            conn.write_all(format!("{verb} {key} 0 {ttl} {}\r\n", value.len()).as_bytes())
                .await?;
            conn.write_all(value).await?;
            conn.write_all(b"\r\n").await?;
            conn.flush().await?;
            match read_line(conn).await?.as_str() {
                "STORED" => Ok(Reply::Stored(true)),
                "NOT_STORED" => Ok(Reply::Stored(false)),
                other => Err(McError::Protocol(format!(
                    "unexpected {verb} reply {other:?}"
                ))),
            }
        }
        Op::Delete(key) => {
            conn.write_all(format!("delete {key}\r\n").as_bytes())
                .await?;
            conn.flush().await?;
            match read_line(conn).await?.as_str() {
                "DELETED" | "NOT_FOUND" => Ok(Reply::Done),
                other => Err(McError::Protocol(format!(
                    "unexpected delete reply {other:?}"
                ))),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_with_spaces_or_controls_are_invalid() {
        assert!(is_valid_key("zl:ks:abc"));
        assert!(!is_valid_key("a b"));
        assert!(!is_valid_key("a\r\nflush_all"));
        assert!(!is_valid_key(""));
        assert!(!is_valid_key(&"k".repeat(251)));
    }

    #[tokio::test]
    async fn unreachable_server_fails_fast_then_backs_off() {
        // Port 1 on loopback: connection refused.
        let breaker = Breaker::new(
            "memcached",
            crate::breaker::BreakerConfig {
                failures_to_open: 1,
                open_for: Duration::from_secs(5),
            },
            None,
        );
        let mc = Memcache::new("127.0.0.1:1", 2, Duration::from_millis(50), breaker);
        assert!(matches!(mc.get("k").await, Err(McError::Io(_))));
        assert!(matches!(mc.get("k").await, Err(McError::BackingOff)));
    }
}
