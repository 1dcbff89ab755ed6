//! Test harness for end-to-end tests against the real servers that `deploy/local/test` starts.
//!
//! One set of infrastructure per test run (addresses in `ZLINK_TEST_*`); isolation per test:
//! every test gets its own keyspace (and so its own memcached key prefix). Services run
//! in-process through the same `run` entry point the binaries use, on port 0.
//!
//! - [`faults`]: Toxiproxy of the test's own (slow, blackholed links) and frozen processes.

pub mod faults;

use primary::app::AppState;
use primary::config::{Cli, Command};
use primary::events::EventSink;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use zlink_clients::clock::{Clock, SystemClock};
use zlink_store::Db;
use zlink_store::StoreConfig;
use zlink_wire::events::{ClickEvent, LinkEvent};

/// Addresses of the shared servers.
pub struct Infra {
    pub cql: String,
    pub memcached: String,
    pub kafka: String,
    pub s3_endpoint: String,
    pub s3_bucket: String,
    pub s3_access_key: String,
    pub s3_secret_key: String,
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
            kafka: get("ZLINK_TEST_KAFKA"),
            s3_endpoint: get("ZLINK_TEST_S3_ENDPOINT"),
            s3_bucket: get("ZLINK_TEST_S3_BUCKET"),
            s3_access_key: get("ZLINK_TEST_S3_ACCESS_KEY"),
            s3_secret_key: get("ZLINK_TEST_S3_SECRET_KEY"),
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
    zlink_store::schema::migrate(&infra.store_config(&ks), 1)
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
    fn clicked(&self, ev: ClickEvent) -> bool {
        self.clicks.lock().unwrap().push(ev);
        false
    }
}

pub struct PrimaryHandle {
    pub base: String,
    pub keyspace: String,
    pub state: Arc<AppState>,
    /// Events seen, when the primary runs without Kafka.
    pub events: Arc<RecordingSink>,
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<()>,
    _spool: Option<TempDir>,
}

impl PrimaryHandle {
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// Graceful stop: the server drains, the event sink closes, the relay finishes.
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
    let mut argv = vec!["primary".to_string(), "serve".into()];
    // A test may route the store through a fault proxy of its own.
    if !extra.contains(&"--cql-nodes") {
        argv.extend(["--cql-nodes".into(), infra.cql.clone()]);
    }
    argv.extend([
        "--keyspace".into(),
        keyspace.into(),
        "--slug-key".into(),
        format!("test-slug-key-{keyspace}"),
        "--public-base-url".into(),
        base.clone(),
    ]);
    // With Kafka, clicks are spooled: a fresh spool directory unless the test names one.
    let spool = (extra.contains(&"--kafka") && !extra.contains(&"--spool-dir"))
        .then(|| TempDir::new("primary-spool"));
    if let Some(d) = &spool {
        argv.extend(["--spool-dir".to_string(), d.path().display().to_string()]);
    }
    if extra.contains(&"--kafka") && !extra.contains(&"--ip-hash-salt") {
        argv.extend(["--ip-hash-salt".into(), "test-salt-16-bytes-min".into()]);
    }
    // Tests send from 127.0.0.1 and create links in bursts: that address is the exempt load
    // generator and per-key limits are off, unless the test sets them (tests/security.rs).
    if !extra.contains(&"--rate-limit-exempt") {
        argv.extend(["--rate-limit-exempt".into(), "127.0.0.1".into()]);
    }
    if !extra.contains(&"--limit-writes-per-key") {
        argv.extend(["--limit-writes-per-key".into(), "off".into()]);
    }
    argv.extend(extra.iter().map(|s| s.to_string()));
    let cfg = match clap::Parser::try_parse_from(argv).expect("valid flags") {
        Cli {
            command: Command::Serve(cfg),
        } => cfg,
        _ => unreachable!(),
    };
    cfg.validate().expect("valid config");
    let db = Db::connect(&cfg.store).await.expect("store reachable");
    let recording = Arc::new(RecordingSink::default());
    let clock = clock.unwrap_or_else(|| Arc::new(SystemClock));
    let shutdown = CancellationToken::new();
    let app = primary::App::build(&cfg, db, clock, Some(recording.clone()), shutdown.clone())
        .await
        .expect("primary built");
    let state = app.state.clone();
    let task = tokio::spawn(app.run(listener));
    PrimaryHandle {
        base,
        keyspace: keyspace.to_string(),
        state,
        events: recording,
        shutdown,
        task,
        _spool: spool,
    }
}

/// Per-test names: topics, consumer group and S3 prefix derived from the keyspace.
pub struct Names {
    pub links_topic: String,
    pub dlq_topic: String,
    pub group: String,
    pub s3_prefix: String,
}

pub fn names(keyspace: &str) -> Names {
    Names {
        links_topic: format!("links-{keyspace}"),
        dlq_topic: format!("dlq-{keyspace}"),
        group: format!("g-{keyspace}"),
        s3_prefix: format!("{keyspace}/"),
    }
}

/// A fresh keyspace with its own topics created: links (3 partitions), dead letters (1) and
/// clicks (3). Returns the keyspace, its names and the clicks topic.
pub async fn pipeline_keyspace(infra: &Infra) -> (String, Names, String) {
    let ks = fresh_keyspace(infra).await;
    let n = names(&ks);
    let clicks_topic = format!("clicks-{ks}");
    create_topics(
        &infra.kafka,
        &[(&n.links_topic, 3), (&n.dlq_topic, 1), (&clicks_topic, 3)],
    )
    .await;
    (ks, n, clicks_topic)
}

/// The `primary serve` flags that publish link events and clicks to those topics.
pub fn kafka_flags<'a>(infra: &'a Infra, n: &'a Names, clicks_topic: &'a str) -> [&'a str; 6] {
    [
        "--kafka",
        &infra.kafka,
        "--links-topic",
        &n.links_topic,
        "--clicks-topic",
        clicks_topic,
    ]
}

/// Creates the test's own topics on `brokers`.
pub async fn create_topics(brokers: &str, topics: &[(&str, i32)]) {
    use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
    let admin: AdminClient<rdkafka::client::DefaultClientContext> =
        rdkafka::config::ClientConfig::new()
            .set("bootstrap.servers", brokers)
            .create()
            .expect("admin client");
    let new: Vec<_> = topics
        .iter()
        .map(|(t, p)| NewTopic::new(t, *p, TopicReplication::Fixed(1)))
        .collect();
    let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)));
    for r in admin
        .create_topics(&new, &opts)
        .await
        .expect("create topics")
    {
        match r {
            Ok(_) | Err((_, rdkafka::types::RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((t, e)) => panic!("creating topic {t}: {e}"),
        }
    }
}

impl Infra {
    pub fn s3_config(&self, prefix: &str) -> replicator::s3::S3Config {
        replicator::s3::S3Config {
            s3_endpoint: self.s3_endpoint.clone(),
            s3_bucket: self.s3_bucket.clone(),
            s3_prefix: prefix.to_string(),
            s3_region: "us-east-1".into(),
            s3_access_key: self.s3_access_key.clone(),
            s3_secret_key: zlink_clients::Secret(self.s3_secret_key.clone()),
            blob_cache_control: "public, max-age=300".into(),
            s3_timeout_ms: 5000,
        }
    }

    /// The unsigned URL of a slug's blob (what nginx and lastresort read).
    pub fn blob_url(&self, prefix: &str, slug: &str) -> String {
        format!("{}/{}/{prefix}{slug}", self.s3_endpoint, self.s3_bucket)
    }

    pub fn env_for_services(&self, keyspace: &str, brokers: &str) -> Vec<(String, String)> {
        let n = names(keyspace);
        [
            ("ZLINK_CQL_NODES", self.cql.as_str()),
            ("ZLINK_KEYSPACE", keyspace),
            ("ZLINK_KAFKA", brokers),
            ("ZLINK_LINKS_TOPIC", &n.links_topic),
            ("ZLINK_LINKS_DLQ_TOPIC", &n.dlq_topic),
            ("ZLINK_REPLICATOR_GROUP", &n.group),
            ("ZLINK_S3_ENDPOINT", &self.s3_endpoint),
            ("ZLINK_S3_BUCKET", &self.s3_bucket),
            ("ZLINK_S3_PREFIX", &n.s3_prefix),
            ("ZLINK_S3_ACCESS_KEY", &self.s3_access_key),
            ("ZLINK_S3_SECRET_KEY", &self.s3_secret_key),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
    }
}

/// A replicator running in-process over the test's topic, group, keyspace and prefix.
pub struct ReplicatorHandle {
    pub metrics: Arc<replicator::metrics::Metrics>,
    pub s3: Arc<replicator::s3::S3Store>,
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl ReplicatorHandle {
    pub async fn stop(self) {
        self.shutdown.cancel();
        let _ = self.task.await;
    }
}

pub async fn spawn_replicator(infra: &Infra, keyspace: &str, brokers: &str) -> ReplicatorHandle {
    let n = names(keyspace);
    let kafka = replicator::consumer::KafkaConfig {
        kafka: brokers.to_string(),
        group_id: n.group,
        group_instance_id: String::new(),
        links_topic: n.links_topic,
        dlq_topic: n.dlq_topic,
    };
    let db = Db::connect(&infra.store_config(keyspace))
        .await
        .expect("store");
    let app = replicator::App::build(
        &kafka,
        &infra.s3_config(&n.s3_prefix),
        db,
        Arc::new(SystemClock),
    )
    .await
    .expect("replicator built");
    let (s3, metrics, pipeline) = (
        app.applier.s3.clone(),
        app.applier.metrics.clone(),
        app.pipeline.clone(),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(app.run(listener, shutdown.clone()));
    // Latency assertions measure replication, not the consumer group's first join.
    let joined = eventually(Duration::from_secs(30), || {
        let p = pipeline.clone();
        async move {
            tokio::task::spawn_blocking(move || p.assigned_partitions() > 0)
                .await
                .unwrap_or(false)
        }
    })
    .await;
    assert!(joined, "replicator got no partitions within 30 s");
    ReplicatorHandle {
        metrics,
        s3,
        shutdown,
        task,
    }
}

/// A lastresort running in-process, reading `bucket`/`prefix` at `endpoint`.
pub struct LastresortHandle {
    pub base: String,
    pub state: Arc<lastresort::http::State>,
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<()>,
    _spool: Option<TempDir>,
}

impl LastresortHandle {
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }
    pub async fn stop(self) {
        self.shutdown.cancel();
        let _ = self.task.await;
    }
}

/// lastresort's command line for `endpoint`/`prefix`: `extra` flags win; unless given, clicks
/// are replayed to the shared Kafka from a fresh spool directory (returned, deleted on drop).
pub fn lastresort_argv(
    infra: &Infra,
    endpoint: &str,
    prefix: &str,
    extra: &[&str],
) -> (Vec<String>, Option<TempDir>) {
    let mut argv: Vec<String> = [
        "--s3-endpoint",
        endpoint,
        "--s3-bucket",
        &infra.s3_bucket,
        "--s3-prefix",
        prefix,
        "--s3-access-key",
        &infra.s3_access_key,
        "--s3-secret-key",
        &infra.s3_secret_key,
        "--ip-hash-salt",
        "test-salt-16-bytes-min",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    if !extra.contains(&"--kafka") {
        argv.extend(["--kafka".to_string(), infra.kafka.clone()]);
    }
    let spool = (!extra.contains(&"--spool-dir")).then(|| TempDir::new("lr-spool"));
    if let Some(d) = &spool {
        argv.extend(["--spool-dir".to_string(), d.path().display().to_string()]);
    }
    argv.extend(extra.iter().map(|s| s.to_string()));
    (argv, spool)
}

pub async fn spawn_lastresort(
    infra: &Infra,
    endpoint: &str,
    prefix: &str,
    extra: &[&str],
) -> LastresortHandle {
    let (mut argv, spool) = lastresort_argv(infra, endpoint, prefix, extra);
    argv.insert(0, "lastresort".into());
    let cfg =
        <lastresort::config::Config as clap::Parser>::try_parse_from(argv).expect("valid flags");
    cfg.validate().expect("valid config");
    let state =
        lastresort::state(&cfg, Arc::new(lastresort::metrics::Metrics::new())).expect("state");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let base = format!("http://{}", listener.local_addr().expect("addr"));
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(lastresort::run(listener, state.clone(), shutdown.clone()));
    LastresortHandle {
        base,
        state,
        shutdown,
        task,
        _spool: spool,
    }
}

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
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
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

    /// Waits until `/readyz` answers 2xx (at most 30 s).
    pub async fn ready(self) -> Self {
        assert!(
            eventually_ok(&format!("{}/readyz", self.base), Duration::from_secs(30)).await,
            "{} ready",
            self.base
        );
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
        argv.extend(extra.iter().map(|s| s.to_string()));
        (argv, spool)
    }

    /// `primary count-clicks` over `keyspace`, consuming `topic` as consumer group `group`.
    pub fn counter(
        infra: &Infra,
        brokers: &str,
        keyspace: &str,
        topic: &str,
        group: &str,
        extra: &[&str],
    ) -> Self {
        let mut argv: Vec<String> = [
            "count-clicks",
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
        argv.extend(extra.iter().map(|s| s.to_string()));
        Self::start("primary", &argv, None)
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

/// A metric's value from a Prometheus text page: the sum over every series of `name`
/// (`name` may include a label set to pick one series).
pub async fn metric_sum(url: &str, name: &str) -> f64 {
    let text = client()
        .get(url)
        .send()
        .await
        .expect("metrics")
        .text()
        .await
        .expect("metrics body");
    text.lines()
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

/// A server of the test's own (a lib.sh component: kafka, s3), started and stopped through
/// deploy/local/lib.sh, so a test can stop it without disturbing any other test.
pub struct OwnServer {
    component: &'static str,
    run_dir: TempDir,
    port_base: u16,
}

/// A Kafka broker of the test's own.
pub struct OwnKafka {
    pub brokers: String,
    server: OwnServer,
}

/// A SeaweedFS S3 of the test's own (bucket and credentials as in the shared one).
pub struct OwnS3 {
    pub endpoint: String,
    server: OwnServer,
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

impl OwnServer {
    fn lib(&self, action: &str) -> bool {
        std::process::Command::new("bash")
            .arg("-c")
            .arg(format!("source deploy/local/lib.sh && {action}"))
            .current_dir(repo_root())
            .env("ZLINK_RUN", &self.run_dir.0)
            .env("ZLINK_PORT_BASE", self.port_base.to_string())
            .status()
            .map(|s| s.success())
            .unwrap_or(false)
    }

    fn new(component: &'static str, port_base: u16) -> OwnServer {
        OwnServer {
            component,
            run_dir: TempDir::new(component),
            port_base,
        }
    }

    pub async fn up(&self) {
        let c = self.component;
        let ok =
            tokio::task::block_in_place(|| self.lib(&format!("zl_start {c} && zl_wait_ready {c}")));
        assert!(ok, "private {c} did not start");
    }

    pub async fn stop(&self) {
        let c = self.component;
        let ok = tokio::task::block_in_place(|| self.lib(&format!("zl_stop {c} 20")));
        assert!(ok, "private {c} did not stop");
    }
}

impl Drop for OwnServer {
    fn drop(&mut self) {
        self.lib(&format!("zl_kill {}", self.component));
    }
}

impl OwnKafka {
    pub async fn start(port_base: u16) -> OwnKafka {
        let k = OwnKafka {
            brokers: format!("127.0.0.1:{}", port_base + 92),
            server: OwnServer::new("kafka", port_base),
        };
        k.server.up().await;
        k
    }
    pub async fn up(&self) {
        self.server.up().await
    }
    pub async fn stop(&self) {
        self.server.stop().await
    }
}

impl OwnS3 {
    pub async fn start(port_base: u16) -> OwnS3 {
        let s = OwnS3 {
            endpoint: format!("http://127.0.0.1:{}", port_base + 33),
            server: OwnServer::new("s3", port_base),
        };
        s.server.up().await;
        s
    }
    pub async fn up(&self) {
        self.server.up().await
    }
    pub async fn stop(&self) {
        self.server.stop().await
    }
}

/// Creates an API key directly in the store and returns it.
pub async fn create_key(state: &AppState, owner: &str, admin: bool) -> String {
    let (key, key_id) = primary::auth::generate_key();
    state
        .store
        .keys
        .insert(
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

/// `POST /api/v1/links` with `body` as `key`.
pub async fn create(base: &str, key: &str, body: serde_json::Value) -> reqwest::Response {
    client()
        .post(format!("{base}/api/v1/links"))
        .bearer_auth(key)
        .json(&body)
        .send()
        .await
        .expect("request")
}

/// A consumer of `topic` from its first message, in a group of its own (`<label>-<uuid>`)
/// that commits nothing: reads what is there without disturbing anyone.
pub fn topic_reader(brokers: &str, topic: &str, label: &str) -> rdkafka::consumer::StreamConsumer {
    use rdkafka::consumer::{Consumer, StreamConsumer};
    let consumer: StreamConsumer = rdkafka::config::ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", format!("{label}-{}", uuid::Uuid::new_v4()))
        .set("auto.offset.reset", "earliest")
        .set("enable.auto.commit", "false")
        .create()
        .unwrap();
    consumer.subscribe(&[topic]).unwrap();
    consumer
}

/// Every click in Kafka `topic` (from the beginning), until `want` ids were all seen or 60 s.
pub async fn clicks_in_kafka(
    brokers: &str,
    topic: &str,
    want: &std::collections::HashSet<uuid::Uuid>,
) -> (std::collections::HashSet<uuid::Uuid>, Vec<ClickEvent>) {
    use rdkafka::Message;
    let consumer = topic_reader(brokers, topic, "clicks-reader");
    let (mut seen, mut events) = (std::collections::HashSet::new(), Vec::new());
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while !want.is_subset(&seen) && tokio::time::Instant::now() < deadline {
        if let Ok(Ok(m)) = tokio::time::timeout(Duration::from_secs(1), consumer.recv()).await {
            let ev: ClickEvent = serde_json::from_slice(m.payload().unwrap()).unwrap();
            assert_eq!(m.key(), Some(ev.slug.as_bytes()), "keyed by slug");
            seen.insert(ev.id);
            events.push(ev);
        }
    }
    (seen, events)
}

/// PATCHes a link's status through the API and asserts 200.
pub async fn set_status(base: &str, key: &str, slug: &str, status: &str) {
    let r = patch_status(base, key, slug, status).await;
    assert_eq!(r.status(), reqwest::StatusCode::OK, "PATCH {slug} {status}");
}

pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(Duration::from_secs(20))
        .build()
        .expect("client")
}

/// Polls `url` until a GET answers 2xx, or `within` passes.
pub async fn eventually_ok(url: &str, within: Duration) -> bool {
    let url = url.to_string();
    eventually(within, || {
        let u = url.clone();
        async move {
            client()
                .get(&u)
                .send()
                .await
                .is_ok_and(|r| r.status().is_success())
        }
    })
    .await
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
/// A loopback port that was free a moment ago (for servers that cannot listen on port 0).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

pub struct OwnMemcached {
    pub addr: String,
    child: std::process::Child,
}

impl OwnMemcached {
    pub async fn start() -> OwnMemcached {
        let port = free_port();
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

/// (partition, committed offset, high watermark) of every partition of `topic` for `group`.
pub fn group_offsets(brokers: &str, group: &str, topic: &str) -> Vec<(i32, Option<i64>, i64)> {
    let c: rdkafka::consumer::BaseConsumer = rdkafka::config::ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", group)
        .create()
        .unwrap();
    use rdkafka::consumer::Consumer;
    let md = c
        .fetch_metadata(Some(topic), Duration::from_secs(5))
        .unwrap();
    let mut tpl = rdkafka::TopicPartitionList::new();
    for p in md.topics()[0].partitions() {
        tpl.add_partition(topic, p.id());
    }
    let committed = c.committed_offsets(tpl, Duration::from_secs(5)).unwrap();
    committed
        .elements()
        .iter()
        .map(|e| {
            let high = c
                .fetch_watermarks(topic, e.partition(), Duration::from_secs(5))
                .map(|(_, h)| h)
                .unwrap_or(-1);
            (e.partition(), e.offset().to_raw(), high)
        })
        .collect()
}

/// True once consumer group `group` has committed the end of every partition of `topic`:
/// everything produced so far has been counted and acknowledged.
pub async fn caught_up(brokers: &str, group: &str, topic: &str, within: Duration) -> bool {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let (b, g, t) = (brokers.to_string(), group.to_string(), topic.to_string());
        let offsets = tokio::task::spawn_blocking(move || group_offsets(&b, &g, &t))
            .await
            .unwrap();
        // A partition nothing was ever written to has no committed offset.
        if offsets
            .iter()
            .all(|(_, c, h)| c.filter(|c| *c >= 0).unwrap_or(0) == *h)
        {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            eprintln!("group {group} not caught up on {topic}: {offsets:?}");
            return false;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// nginx `server` lines for an upstream block: one per address, each with `extra` parameters.
pub fn upstream_servers(addrs: &[String], extra: &str) -> String {
    addrs
        .iter()
        .map(|a| format!("        server {a} {extra};"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// `host:port` of a `http://host:port` base URL.
pub fn hostport(base: &str) -> String {
    base.trim_start_matches("http://").to_string()
}

/// Placeholder values of nginx/lastresort.conf for a last-resort host in front of
/// `lastresort_servers` (upstream lines), reading S3 under `prefix`, logging rung-3 clicks to
/// `click_log`. Timeouts come from nginx/lastresort.budgets.
pub fn lastresort_host_values(
    lastresort_servers: String,
    infra: &Infra,
    prefix: &str,
    click_log: &str,
) -> Vec<(&'static str, String)> {
    vec![
        ("LASTRESORT_SERVERS", lastresort_servers),
        ("TRUSTED_PROXIES", "127.0.0.0/8".into()),
        ("S3_HOSTPORT", hostport(&infra.s3_endpoint)),
        ("S3_BUCKET", infra.s3_bucket.clone()),
        ("S3_PREFIX", prefix.to_string()),
        (
            "STATIC",
            repo_root().join("nginx/static").display().to_string(),
        ),
        ("CLICK_LOG", click_log.to_string()),
    ]
}

/// `PATCH /api/v1/links/{slug}` with `{"status": status}` as `key`.
pub async fn patch_status(base: &str, key: &str, slug: &str, status: &str) -> reqwest::Response {
    client()
        .patch(format!("{base}/api/v1/links/{slug}"))
        .bearer_auth(key)
        .json(&serde_json::json!({ "status": status }))
        .send()
        .await
        .expect("request")
}

/// An nginx of the test's own, from a template in `nginx/` rendered by deploy/local/nginx-render
/// (the same renderer `up` uses) and checked with `nginx -t` before it starts.
pub struct OwnNginx {
    pub base: String,
    pub dir: TempDir,
    child: std::process::Child,
}

pub fn nginx_bin() -> String {
    ["/usr/sbin/nginx", "/usr/local/sbin/nginx"]
        .into_iter()
        .find(|p| std::path::Path::new(p).exists())
        .unwrap_or("nginx")
        .to_string()
}

/// Renders `template` (a file of `nginx/`) into `dir` with `values` plus RUN, LOGS and LISTEN,
/// and runs `nginx -t` on it. Returns the config path.
pub fn render_nginx(
    template: &str,
    dir: &std::path::Path,
    port: u16,
    values: &[(&str, String)],
) -> std::path::PathBuf {
    let logs = dir.join("logs");
    std::fs::create_dir_all(&logs).unwrap();
    for t in ["nginx-frontend-tmp", "nginx-lastresort-tmp"] {
        std::fs::create_dir_all(dir.join(t)).unwrap();
    }
    let out = dir.join(template);
    let mut args = vec![
        repo_root()
            .join("deploy/local/nginx-render")
            .display()
            .to_string(),
        repo_root()
            .join("nginx")
            .join(template)
            .display()
            .to_string(),
        out.display().to_string(),
        format!("RUN={}", dir.display()),
        format!("LOGS={}", logs.display()),
        format!("LISTEN=127.0.0.1:{port}"),
    ];
    // 127.0.0.1 is the exempt load generator, as in the local topology, unless the test says.
    if !values.iter().any(|(k, _)| *k == "RATE_LIMIT_EXEMPT") {
        args.push("RATE_LIMIT_EXEMPT=127.0.0.1".into());
    }
    if !values.iter().any(|(k, _)| *k == "STATUS_LISTEN") {
        args.push(format!("STATUS_LISTEN=127.0.0.1:{}", free_port()));
    }
    args.extend(values.iter().map(|(k, v)| format!("{k}={v}")));
    let ok = std::process::Command::new("python3")
        .args(&args)
        .status()
        .expect("python3");
    assert!(ok.success(), "rendering {template}");
    let t = std::process::Command::new(nginx_bin())
        .args(["-t", "-q", "-p"])
        .arg(dir)
        .arg("-c")
        .arg(&out)
        .arg("-e")
        .arg(logs.join("error.log"))
        .output()
        .expect("nginx -t");
    assert!(
        t.status.success(),
        "nginx -t {template}: {}",
        String::from_utf8_lossy(&t.stderr)
    );
    out
}

impl OwnNginx {
    pub async fn start(template: &str, values: &[(&str, String)]) -> OwnNginx {
        let dir = TempDir::new("nginx");
        let port = free_port();
        let conf = render_nginx(template, dir.path(), port, values);
        let child = std::process::Command::new(nginx_bin())
            .arg("-p")
            .arg(dir.path())
            .arg("-c")
            .arg(&conf)
            .arg("-e")
            .arg(dir.path().join("logs/error.log"))
            .args(["-g", "daemon off;"])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("nginx");
        let base = format!("http://127.0.0.1:{port}");
        assert!(
            eventually_ok(&format!("{base}/nginx-health"), Duration::from_secs(10)).await,
            "nginx {template} up"
        );
        OwnNginx { base, dir, child }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// A log file of this nginx (under its `logs/`).
    pub fn log(&self, name: &str) -> std::path::PathBuf {
        self.dir.path().join("logs").join(name)
    }

    /// Its JSON access log so far, one value per line (nginx flushes the buffer each second,
    /// so this polls until at least `min` lines are there).
    pub async fn access_log(&self, name: &str, min: usize) -> Vec<serde_json::Value> {
        let path = self.log(name);
        let mut lines = Vec::new();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while tokio::time::Instant::now() < deadline {
            lines = std::fs::read_to_string(&path)
                .unwrap_or_default()
                .lines()
                .map(|l| serde_json::from_str(l).expect("JSON log line"))
                .collect();
            if lines.len() >= min {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        lines
    }
}

impl Drop for OwnNginx {
    /// SIGTERM: the master stops its workers (SIGKILL would orphan them).
    fn drop(&mut self) {
        let _ = std::process::Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let _ = self.child.wait();
    }
}
