//! Test harness for end-to-end tests against the real servers that `deploy/local/test` starts.
//!
//! One set of infrastructure per test run (addresses in `ZLINK_TEST_*`); isolation per test:
//! every test gets its own keyspace (and so its own memcached key prefix). Services run
//! in-process through the same `run` entry point the binaries use, on port 0.

use primary::app::AppState;
use primary::clock::{Clock, SystemClock};
use primary::config::{Cli, Command, StoreConfig};
use primary::events::EventSink;
use primary::metrics::Metrics;
use primary::store::{self, Store};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use zlink_wire::events::{ClickEvent, LinkEvent};

/// Addresses of the shared servers.
pub struct Infra {
    pub cql: String,
    pub memcached: String,
}

impl Infra {
    pub fn from_env() -> Infra {
        let get = |k: &str| {
            std::env::var(k).unwrap_or_else(|_| {
                panic!("{k} is not set: run the tests with deploy/local/test, which starts the real servers")
            })
        };
        Infra {
            cql: get("ZLINK_TEST_CQL"),
            memcached: get("ZLINK_TEST_MEMCACHED"),
        }
    }

    pub fn store_config(&self, keyspace: &str) -> StoreConfig {
        StoreConfig {
            cql_nodes: vec![self.cql.clone()],
            keyspace: keyspace.to_string(),
            cql_timeout_ms: 5000,
        }
    }
}

/// A keyspace that no other test uses, with the schema applied.
pub async fn fresh_keyspace(infra: &Infra) -> String {
    let ks = format!("t_{}", uuid::Uuid::new_v4().simple());
    store::migrate(&infra.store_config(&ks), 1)
        .await
        .expect("schema applied");
    ks
}

/// Records every event handed to it.
#[derive(Default)]
pub struct RecordingSink {
    pub links: Mutex<Vec<LinkEvent>>,
    pub clicks: Mutex<Vec<ClickEvent>>,
}

impl EventSink for RecordingSink {
    fn link_changed(&self, ev: LinkEvent) {
        self.links.lock().unwrap().push(ev);
    }
    fn clicked(&self, ev: ClickEvent) {
        self.clicks.lock().unwrap().push(ev);
    }
}

pub struct PrimaryHandle {
    pub base: String,
    pub keyspace: String,
    pub state: Arc<AppState>,
    pub events: Arc<RecordingSink>,
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl PrimaryHandle {
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// Graceful stop: waits for the server task to drain and return.
    pub async fn stop(self) {
        self.shutdown.cancel();
        let _ = self.task.await;
    }
}

/// Starts a primary on 127.0.0.1:0 over `keyspace`. `extra` are `primary serve` flags, parsed by
/// the real CLI parser and validated like the binary does.
pub async fn spawn_primary(
    infra: &Infra,
    keyspace: &str,
    extra: &[&str],
    clock: Option<Arc<dyn Clock>>,
) -> PrimaryHandle {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let base = format!("http://{}", listener.local_addr().expect("addr"));
    let mut argv = vec![
        "primary".to_string(),
        "serve".into(),
        "--cql-nodes".into(),
        infra.cql.clone(),
        "--keyspace".into(),
        keyspace.into(),
        "--slug-key".into(),
        format!("test-slug-key-{keyspace}"),
        "--public-base-url".into(),
        base.clone(),
    ];
    argv.extend(extra.iter().map(|s| s.to_string()));
    let cfg = match clap::Parser::try_parse_from(argv).expect("valid flags") {
        Cli {
            command: Command::Serve(cfg),
        } => cfg,
        _ => unreachable!(),
    };
    cfg.validate().expect("valid config");
    let store = Arc::new(Store::connect(&cfg.store).await.expect("store reachable"));
    let events = Arc::new(RecordingSink::default());
    let state = AppState::new(
        &cfg,
        store,
        events.clone(),
        Arc::new(Metrics::new()),
        clock.unwrap_or_else(|| Arc::new(SystemClock)),
    )
    .expect("state");
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(primary::run(
        listener,
        state.clone(),
        shutdown.clone(),
        Duration::from_secs(5),
    ));
    PrimaryHandle {
        base,
        keyspace: keyspace.to_string(),
        state,
        events,
        shutdown,
        task,
    }
}

/// Creates an API key directly in the store and returns it.
pub async fn create_key(state: &AppState, owner: &str, admin: bool) -> String {
    let (key, key_id) = primary::auth::generate_key();
    state
        .store
        .insert_api_key(
            &primary::auth::hash_key(&key),
            &key_id,
            owner,
            admin,
            SystemClock.now_ms(),
        )
        .await
        .expect("key stored");
    key
}

/// An HTTP client that never follows redirects (we assert on them).
pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(Duration::from_secs(20))
        .build()
        .expect("client")
}

/// Polls `check` every 20 ms until it returns true or `within` passes.
pub async fn eventually<F, Fut>(within: Duration, mut check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + within;
    loop {
        if check().await {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A memcached server of the test's own (so a test can stop it without touching others).
pub struct OwnMemcached {
    pub addr: String,
    child: std::process::Child,
}

impl OwnMemcached {
    pub async fn start() -> OwnMemcached {
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").expect("free port");
            l.local_addr().expect("addr").port()
        };
        let mut cmd = std::process::Command::new("memcached");
        cmd.args([
            "-l",
            "127.0.0.1",
            "-p",
            &port.to_string(),
            "-U",
            "0",
            "-m",
            "16",
        ]);
        // memcached refuses to run as root without -u.
        if is_root() {
            cmd.args(["-u", "root"]);
        }
        let child = cmd
            .spawn()
            .expect("memcached binary (installed by deploy/local/install)");
        let addr = format!("127.0.0.1:{port}");
        let a = addr.clone();
        assert!(
            eventually(Duration::from_secs(10), || {
                let a = a.clone();
                async move { tokio::net::TcpStream::connect(a).await.is_ok() }
            })
            .await,
            "memcached did not start"
        );
        OwnMemcached { addr, child }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn signal(&self, sig: &str) {
        let ok = std::process::Command::new("kill")
            .args([&format!("-{sig}"), &self.pid().to_string()])
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        assert!(ok, "kill -{sig} memcached");
    }

    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for OwnMemcached {
    fn drop(&mut self) {
        // SIGKILL works on a SIGSTOPped process too.
        self.kill();
    }
}

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .map(|l| l.split_whitespace().nth(1) == Some("0"))
        })
        .unwrap_or(false)
}

/// Counts rows of a table in a test keyspace (to prove bad input stored nothing).
pub async fn count_rows(infra: &Infra, keyspace: &str, table: &str) -> i64 {
    let session = scylla::client::session_builder::SessionBuilder::new()
        .known_node(&infra.cql)
        .build()
        .await
        .expect("session");
    // Both names come from the test itself ([a-z0-9_]).
    let rows = session
        .query_unpaged(format!("SELECT COUNT(*) FROM {keyspace}.{table}"), &[])
        .await
        .expect("count")
        .into_rows_result()
        .expect("rows");
    rows.first_row::<(i64,)>().expect("one row").0
}
