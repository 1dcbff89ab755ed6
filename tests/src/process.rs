//! The service binaries as child processes (what the kill/freeze tests need), metrics
//! scraping, temporary directories, free ports.

use super::*;

/// A service binary as its own process (for SIGKILL and crash tests), listening on a free
/// loopback port given with `--listen`.
pub struct ServiceProcess {
    pub base: String,
    child: tokio::process::Child,
    _spool: Option<TempDir>,
}

impl ServiceProcess {
    /// Starts `bin argv --listen 127.0.0.1:<free port>`; does not wait for readiness.
    pub fn start(bin_name: &str, argv: &[String], spool: Option<TempDir>) -> Self {
        Self::start_with(bin_name, argv, spool, None)
    }

    /// Like [`start`](Self::start); with `json_log`, the process logs at info level as JSON
    /// lines into that file (else warnings only, to the test's stderr).
    pub fn start_with(
        bin_name: &str,
        argv: &[String],
        spool: Option<TempDir>,
        json_log: Option<&std::path::Path>,
    ) -> Self {
        let port = free_port();
        let mut cmd = tokio::process::Command::new(bin(bin_name));
        cmd.args(argv)
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .env("RUST_LOG", "warn")
            .kill_on_drop(true);
        if let Some(path) = json_log {
            let file = std::fs::File::create(path).expect("log file");
            cmd.env("RUST_LOG", "info")
                .env("ZLINK_LOG_FORMAT", "json")
                .stderr(file);
        }
        let child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("{bin_name} binary: {e}"));
        ServiceProcess {
            base: format!("http://127.0.0.1:{port}"),
            child,
            _spool: spool,
        }
    }

    /// Waits until `/readyz` answers 2xx (at most 30 s); fails at once, with its exit status,
    /// if the process ended first.
    pub async fn ready(mut self) -> Self {
        let url = format!("{}/readyz", self.base);
        let mut exited = None;
        let ready = eventually(Duration::from_secs(30), || {
            if let Ok(Some(status)) = self.child.try_wait() {
                exited = Some(status);
            }
            let (u, done) = (url.clone(), exited.is_some());
            async move {
                done || client()
                    .get(&u)
                    .send()
                    .await
                    .is_ok_and(|r| r.status().is_success())
            }
        })
        .await;
        if let Some(status) = exited {
            panic!("{} exited before it was ready: {status}", self.base);
        }
        assert!(ready, "{} ready", self.base);
        self
    }

    /// The lastresort binary, ready.
    pub async fn lastresort(infra: &Infra, endpoint: &str, prefix: &str, extra: &[&str]) -> Self {
        let (argv, spool) = lastresort_argv(infra, endpoint, prefix, extra);
        Self::start("lastresort", &argv, spool).ready().await
    }

    /// `primary serve` over `keyspace` as its own process (so a test can freeze it), clicks
    /// spooled from a fresh directory and replayed to `brokers`; not yet ready.
    pub fn primary(infra: &Infra, keyspace: &str, brokers: &str, extra: &[&str]) -> Self {
        let (argv, spool) = Self::primary_argv(infra, keyspace, brokers, extra);
        Self::start("primary", &argv, Some(spool))
    }

    /// The command line [`primary`](Self::primary) runs, and its spool directory.
    pub fn primary_argv(
        infra: &Infra,
        keyspace: &str,
        brokers: &str,
        extra: &[&str],
    ) -> (Vec<String>, TempDir) {
        let spool = TempDir::new("primary-proc-spool");
        let mut argv: Vec<String> = [
            "serve",
            "--cql-nodes",
            &infra.cql,
            "--keyspace",
            keyspace,
            "--slug-key",
            &format!("test-slug-key-{keyspace}"),
            "--kafka",
            brokers,
            "--spool-dir",
            &spool.path().display().to_string(),
            "--ip-hash-salt",
            "test-salt-16-bytes-min",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        if !extra.contains(&"--drain-ms") {
            argv.extend(["--drain-ms".to_string(), "0".into()]);
        }
        // Where a test does not say, short URLs on a frontend that is not there.
        if !extra.contains(&"--public-base-url") {
            argv.extend(["--public-base-url".to_string(), "http://127.0.0.1:9".into()]);
        }
        argv.extend(["--local-deployment".to_string()]);
        argv.extend(extra.iter().map(|s| s.to_string()));
        (argv, spool)
    }

    /// `counter run` over `keyspace`, consuming `topic` as consumer group `group`.
    pub fn counter(
        infra: &Infra,
        brokers: &str,
        keyspace: &str,
        topic: &str,
        group: &str,
        extra: &[&str],
    ) -> Self {
        let mut argv: Vec<String> = [
            "run",
            "--kafka",
            brokers,
            "--clicks-topic",
            topic,
            "--group-id",
            group,
            "--cql-nodes",
            &infra.cql,
            "--keyspace",
            keyspace,
            "--batch-wait-ms",
            "20",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        // Windows of half a second unless a test names its own: the tests wait on counts.
        if !extra.contains(&"--flush-ms") {
            argv.extend(["--flush-ms".to_string(), "500".into()]);
        }
        argv.extend(extra.iter().map(|s| s.to_string()));
        Self::start("counter", &argv, None)
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    pub fn pid(&self) -> u32 {
        self.child.id().expect("running")
    }

    /// SIGKILL, and wait until it is gone.
    pub async fn kill(mut self) {
        self.child.kill().await.expect("SIGKILL");
    }

    /// Waits (at most `within`) for the process to exit on its own.
    pub async fn exited(mut self, within: Duration) -> std::process::ExitStatus {
        tokio::time::timeout(within, self.child.wait())
            .await
            .expect("exited in time")
            .expect("exit status")
    }

    /// SIGTERM (graceful shutdown), and wait for the exit status.
    pub async fn terminate(self) -> std::process::ExitStatus {
        let pid = self.pid().to_string();
        std::process::Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .expect("kill");
        self.exited(Duration::from_secs(20)).await
    }
}

/// A Prometheus text page (`/metrics`), whole.
async fn metrics_page(url: &str) -> String {
    client()
        .get(url)
        .send()
        .await
        .expect("metrics")
        .text()
        .await
        .expect("metrics body")
}

/// The value of the one unlabelled series `name` on a Prometheus text page; panics when the page
/// has no such series.
pub async fn metric(url: &str, name: &str) -> f64 {
    metrics_page(url)
        .await
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("{name} not in /metrics"))
}

/// A metric's value from a Prometheus text page: the sum over every series of `name`
/// (`name` may include a label set to pick one series).
pub async fn metric_sum(url: &str, name: &str) -> f64 {
    metrics_page(url)
        .await
        .lines()
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with(' ') || rest.starts_with('{'))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// The release binaries `deploy/local/test` built.
pub fn bin(name: &str) -> std::path::PathBuf {
    let dir =
        std::env::var("ZLINK_TEST_BIN_DIR").expect("ZLINK_TEST_BIN_DIR (set by deploy/local/test)");
    std::path::Path::new(&dir).join(name)
}

/// The repository root (for deploy/local scripts).
pub fn repo_root() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
        .to_path_buf()
}

/// A directory under the system temp dir, removed on drop.
pub struct TempDir(std::path::PathBuf);

impl TempDir {
    pub fn new(what: &str) -> TempDir {
        let dir =
            std::env::temp_dir().join(format!("zlink-{what}-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        TempDir(dir)
    }
    pub fn path(&self) -> &std::path::Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A loopback port that was free a moment ago (for servers that cannot listen on port 0).
///
/// Taken from 30000-32767: below the kernel's ephemeral range (32768+), where an outgoing
/// connection could take it between this check and the server's bind (a counter process died
/// on `Address already in use` that way in CI on 2026-11-25), and above every fixed port base
/// the scripts and tests use (21000, 23000, 26000-27200, 29000, each + at most 492). One cursor
/// per process, starting at a place that depends on the pid, so parallel tests and test
/// binaries do not hand out the same port.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    const FIRST: u32 = 30000;
    const COUNT: u32 = 32768 - FIRST;
    static NEXT: AtomicU32 = AtomicU32::new(u32::MAX);
    let _ = NEXT.compare_exchange(
        u32::MAX,
        std::process::id().wrapping_mul(7919) % COUNT,
        Ordering::Relaxed,
        Ordering::Relaxed,
    );
    for _ in 0..COUNT {
        let port = (FIRST + NEXT.fetch_add(1, Ordering::Relaxed) % COUNT) as u16;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free loopback port in {FIRST}-32767");
}

pub(crate) fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .map(|l| l.split_whitespace().nth(1) == Some("0"))
        })
        .unwrap_or(false)
}
