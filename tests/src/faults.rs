//! Faults other than a clean death, for the tests: a Toxiproxy of the test's own (the real fault
//! proxy `deploy/local/install` builds) between a component and a dependency, so a test can
//! make the dependency slow, blackholed (connection accepted, data swallowed) or refuse
//! connections, and freezing a process (`SIGSTOP`: the kernel still accepts its connections,
//! nothing answers).

use crate::TempDir;
use serde_json::{json, Value};
use std::time::Duration;

/// The toxiproxy `server` binary `deploy/local/install` built (its version is pinned in lib.sh).
pub fn toxiproxy_bin() -> std::path::PathBuf {
    if let Ok(p) = std::env::var("ZLINK_TEST_TOXIPROXY") {
        return p.into();
    }
    let cache = std::env::var("ZLINK_CACHE")
        .unwrap_or_else(|_| format!("{}/.cache/zlink", std::env::var("HOME").unwrap_or_default()));
    std::path::PathBuf::from(cache).join("toxiproxy-2.12.0/bin/server")
}

/// A Toxiproxy server on a free loopback port, stopped when dropped.
pub struct OwnToxiproxy {
    api: String,
    child: std::process::Child,
    http: reqwest::Client,
    _dir: TempDir,
}

/// How a proxied link misbehaves.
#[derive(Debug, Clone, Copy)]
pub enum Fault {
    /// Every byte towards the client waits this long.
    Slow(Duration),
    /// Connections are accepted and data is swallowed; nothing ever answers.
    Blackhole,
}

impl OwnToxiproxy {
    pub async fn start() -> OwnToxiproxy {
        let dir = TempDir::new("toxiproxy");
        let port = crate::free_port();
        let log = std::fs::File::create(dir.path().join("toxiproxy.log")).expect("log file");
        let child = std::process::Command::new(toxiproxy_bin())
            .args(["-host", "127.0.0.1", "-port", &port.to_string()])
            .stdin(std::process::Stdio::null())
            .stdout(log.try_clone().expect("log file"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", toxiproxy_bin().display()));
        let api = format!("http://127.0.0.1:{port}");
        assert!(
            crate::eventually_ok(&format!("{api}/version"), Duration::from_secs(10)).await,
            "toxiproxy up"
        );
        OwnToxiproxy {
            api,
            child,
            http: reqwest::Client::new(),
            _dir: dir,
        }
    }

    async fn call(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Value {
        let mut req = self.http.request(method, format!("{}{path}", self.api));
        if let Some(b) = body {
            req = req.json(&b);
        }
        let r = req.send().await.expect("toxiproxy API");
        let status = r.status();
        let text = r.text().await.unwrap_or_default();
        assert!(status.is_success(), "toxiproxy {path}: {status} {text}");
        serde_json::from_str(&text).unwrap_or(Value::Null)
    }

    /// A proxy to `upstream` (host:port); returns the host:port to connect to instead.
    pub async fn proxy(&self, name: &str, upstream: &str) -> String {
        let port = crate::free_port();
        let listen = format!("127.0.0.1:{port}");
        let p = self
            .call(
                reqwest::Method::POST,
                "/proxies",
                Some(
                    json!({"name": name, "listen": listen, "upstream": upstream, "enabled": true}),
                ),
            )
            .await;
        p["listen"].as_str().unwrap_or(&listen).to_string()
    }

    /// Starts a fault on the proxy `name` (downstream: what the client receives).
    pub async fn inject(&self, name: &str, fault: Fault) {
        let toxic = match fault {
            Fault::Slow(d) => json!({"name": "fault", "type": "latency", "stream": "downstream",
                "toxicity": 1.0, "attributes": {"latency": d.as_millis() as u64, "jitter": 0}}),
            Fault::Blackhole => json!({"name": "fault", "type": "timeout", "stream": "downstream",
                "toxicity": 1.0, "attributes": {"timeout": 0}}),
        };
        self.call(
            reqwest::Method::POST,
            &format!("/proxies/{name}/toxics"),
            Some(toxic),
        )
        .await;
    }

    /// Ends the fault on `name` (a blackhole's held connections are closed).
    pub async fn heal(&self, name: &str) {
        self.call(
            reqwest::Method::DELETE,
            &format!("/proxies/{name}/toxics/fault"),
            None,
        )
        .await;
    }
}

impl Drop for OwnToxiproxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Freezes (`SIGSTOP`) or thaws (`SIGCONT`) a process: frozen, its listening socket still
/// completes TCP handshakes (the kernel does that) and nothing is ever answered.
pub fn freeze(pid: u32, frozen: bool) {
    let sig = if frozen { "-STOP" } else { "-CONT" };
    let ok = std::process::Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "kill {sig} {pid}");
}
