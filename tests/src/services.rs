//! The services in-process on port 0, built by their composition roots (`primary::App`,
//! `replicator::App`, lastresort's `state`) from parsed command-line flags.

use super::*;

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
    fn clicked(&self, ev: &ClickRef<'_>) -> bool {
        self.clicks.lock().unwrap().push(ev.to_event());
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

/// The keyspace's links and dead-letter topics on the shared Kafka, and a primary publishing its
/// link events there.
pub async fn primary_publishing_links(infra: &Infra, keyspace: &str) -> PrimaryHandle {
    let n = names(keyspace);
    create_topics(&infra.kafka, &[(&n.links_topic, 3), (&n.dlq_topic, 1)]).await;
    spawn_primary(
        infra,
        keyspace,
        &["--kafka", &infra.kafka, "--links-topic", &n.links_topic],
        None,
    )
    .await
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
        "--local-deployment".into(),
    ]);
    // Short URLs under this primary's own address unless the test names a frontend's.
    if !extra.contains(&"--public-base-url") {
        argv.extend(["--public-base-url".into(), base.clone()]);
    }
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
    // generator and per-key limits are off, unless the test sets them (tests/security/).
    if !extra.contains(&"--rate-limit-exempt") {
        argv.extend(["--rate-limit-exempt".into(), "127.0.0.1".into()]);
    }
    if !extra.contains(&"--limit-writes-per-key") {
        argv.extend(["--limit-writes-per-key".into(), "off".into()]);
    }
    // Tests stop services with connections of their own still pooled: no drain after shutdown
    // (redirect/src/serve.rs tests it), unless the test sets one.
    if !extra.contains(&"--drain-ms") {
        argv.extend(["--drain-ms".into(), "0".into()]);
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
    let app = primary::App::build(&cfg, db, clock, Some(recording.clone()))
        .await
        .expect("primary built");
    let state = app.state.clone();
    let task = tokio::spawn(app.run(listener, shutdown.clone()));
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
    spawn_replicator_with(infra, keyspace, brokers, |_| {}).await
}

/// A replicator with its Kafka settings changed by `tune` (e.g. `consumer_stall_secs`,
/// `group_instance_id`). Its S3 audit is off (tests that break S3 behind the replicator's
/// back would race it); [`spawn_replicator_audited`] turns it on.
pub async fn spawn_replicator_with(
    infra: &Infra,
    keyspace: &str,
    brokers: &str,
    tune: impl FnOnce(&mut replicator::consumer::KafkaConfig),
) -> ReplicatorHandle {
    let off = replicator::audit::AuditArgs {
        period_secs: 0,
        recheck_secs: 0,
        ..Default::default()
    };
    spawn_replicator_audited(infra, keyspace, brokers, tune, off).await
}

/// A replicator running the S3 audit with `audit`.
pub async fn spawn_replicator_audited(
    infra: &Infra,
    keyspace: &str,
    brokers: &str,
    tune: impl FnOnce(&mut replicator::consumer::KafkaConfig),
    audit: replicator::audit::AuditArgs,
) -> ReplicatorHandle {
    let n = names(keyspace);
    let mut kafka = replicator::consumer::KafkaConfig {
        kafka: brokers.to_string(),
        group_id: n.group,
        group_instance_id: String::new(),
        links_topic: n.links_topic,
        dlq_topic: n.dlq_topic,
        consumer_stall_secs: 45,
        journal_interval_ms: 200,
        lanes: 8,
    };
    tune(&mut kafka);
    let db = Db::connect(&infra.store_config(keyspace))
        .await
        .expect("store");
    let app = replicator::App::build(
        &kafka,
        &infra.s3_config(&n.s3_prefix),
        &audit,
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
/// are replayed to the shared Kafka over TLS (verified against the test servers' CA, as a
/// last-resort host replays across the WAN) from a fresh spool directory (returned, deleted on
/// drop).
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
        argv.extend(["--kafka".to_string(), infra.kafka_tls.clone()]);
        if !extra.contains(&"--kafka-ca-file") {
            argv.extend(["--kafka-ca-file".to_string(), infra.s3_ca_file.clone()]);
        }
    }
    // S3 over HTTPS: the certificate verified against the test servers' CA.
    if endpoint.starts_with("https://") && !extra.contains(&"--s3-ca-file") {
        argv.extend(["--s3-ca-file".to_string(), infra.s3_ca_file.clone()]);
    }
    // Tests stop services with connections of their own still pooled: no drain after shutdown
    // (redirect/src/serve.rs tests it), unless the test sets one.
    if !extra.contains(&"--drain-ms") {
        argv.extend(["--drain-ms".to_string(), "0".into()]);
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
    let app = lastresort::App::build(&cfg, Arc::new(lastresort::metrics::Metrics::new()))
        .expect("lastresort built");
    let state = app.state.clone();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let base = format!("http://{}", listener.local_addr().expect("addr"));
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(app.run(listener, shutdown.clone()));
    LastresortHandle {
        base,
        state,
        shutdown,
        task,
        _spool: spool,
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

/// Both redirect tiers on a Kafka of the test's own, with one link on both rungs.
pub struct BothTiers {
    /// Primary in-process, sending clicks to Kafka and link events to the keyspace's links topic.
    pub primary: PrimaryHandle,
    pub replicator: ReplicatorHandle,
    /// A lastresort process sending clicks to Kafka, reading the keyspace's S3 prefix.
    pub lastresort: ServiceProcess,
    /// alice's API key (she owns the link).
    pub key: String,
}

/// Starts primary and the replicator on `brokers`, creates `slug` → `url` as alice, waits
/// until it is in S3, then starts a lastresort. Both tiers send clicks to `clicks_topic` on
/// `brokers` (2 s send deadline) and get `extra` flags; the replicator replaces a stalled
/// consumer after `stall_secs`.
pub async fn both_tiers_with_a_link(
    infra: &Infra,
    keyspace: &str,
    brokers: &str,
    (clicks_topic, extra, stall_secs): (&str, &[&str], u64),
    slug: &str,
    url: &str,
) -> BothTiers {
    let n = names(keyspace);
    let mut kafka_flags = vec![
        "--kafka",
        brokers,
        "--clicks-topic",
        clicks_topic,
        "--clicks-timeout-ms",
        "2000",
    ];
    kafka_flags.extend(extra);
    let mut primary_flags = kafka_flags.clone();
    primary_flags.extend(["--links-topic", &n.links_topic]);
    let primary = spawn_primary(infra, keyspace, &primary_flags, None).await;
    let replicator = spawn_replicator_with(infra, keyspace, brokers, |k| {
        k.consumer_stall_secs = stall_secs
    })
    .await;
    let key = create_key(&primary.state, "alice", false).await;
    let c = create(
        &primary.base,
        &key,
        serde_json::json!({"url": url, "slug": slug}),
    )
    .await;
    assert_eq!(c.status(), reqwest::StatusCode::CREATED, "create {slug}");
    assert!(
        eventually_ok(&infra.blob_url(&n.s3_prefix, slug), Duration::from_secs(10)).await,
        "{slug} replicated"
    );
    let lastresort =
        ServiceProcess::lastresort(infra, &infra.s3_endpoint, &n.s3_prefix, &kafka_flags).await;
    BothTiers {
        primary,
        replicator,
        lastresort,
        key,
    }
}
