use anyhow::{bail, Context};
use clap::{Parser, Subcommand};
use primary::clock::{Clock, SystemClock};
use primary::config::StoreConfig;
use primary::store::Store;
use replicator::apply::Applier;
use replicator::consumer::{KafkaConfig, Pipeline};
use replicator::metrics::Metrics;
use replicator::reconcile::{reconcile, ReconcileArgs};
use replicator::s3::{S3Config, S3Store};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

#[derive(Parser)]
#[command(
    name = "replicator",
    version,
    about = "zlink replicator: link events → S3 blobs; reconcile ScyllaDB against S3"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Consume link events and keep S3 in step.
    Run {
        /// Address of /healthz, /readyz and /metrics.
        #[arg(long, env = "ZLINK_LISTEN", default_value = "127.0.0.1:8085")]
        listen: SocketAddr,
        #[command(flatten)]
        kafka: KafkaConfig,
        #[command(flatten)]
        s3: S3Config,
        #[command(flatten)]
        store: StoreConfig,
    },
    /// Compare every link with S3 and repair the drift (or only report it with --dry-run).
    Reconcile {
        #[command(flatten)]
        args: ReconcileArgs,
        #[command(flatten)]
        s3: S3Config,
        #[command(flatten)]
        store: StoreConfig,
    },
}

fn init_tracing() {
    let filter =
        tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into());
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_target(false)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
}

async fn connect_store(cfg: &StoreConfig, within: Duration) -> anyhow::Result<Store> {
    let deadline = Instant::now() + within;
    loop {
        match Store::connect(cfg).await {
            Ok(s) => return Ok(s),
            Err(e) if Instant::now() < deadline => {
                tracing::warn!(error = %e, "store not reachable yet; retrying");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(e) => return Err(e).context("connecting to the store"),
        }
    }
}

fn shutdown_on_signals() -> CancellationToken {
    let token = CancellationToken::new();
    let t = token.clone();
    tokio::spawn(async move {
        use tokio::signal::unix::{signal, SignalKind};
        let (Ok(mut term), Ok(mut int)) = (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        ) else {
            return;
        };
        tokio::select! { _ = term.recv() => {}, _ = int.recv() => {} }
        tracing::info!("shutdown signal received");
        t.cancel();
    });
    token
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    init_tracing();
    match Cli::parse().command {
        Command::Run {
            listen,
            kafka,
            s3,
            store,
        } => {
            for check in [kafka.validate(), s3.validate(), store.validate()] {
                if let Err(e) = check {
                    bail!("invalid configuration: {e}");
                }
            }
            let shutdown = shutdown_on_signals();
            let metrics = Arc::new(Metrics::new());
            let applier = Arc::new(Applier {
                s3: Arc::new(S3Store::new(&s3)),
                store: Arc::new(connect_store(&store, Duration::from_secs(60)).await?),
                metrics: metrics.clone(),
                clock: Arc::new(SystemClock),
            });
            let pipeline = Pipeline::new(&kafka, applier.clone(), metrics)
                .context("creating the Kafka consumer")?;
            let listener = tokio::net::TcpListener::bind(listen)
                .await
                .with_context(|| format!("binding {listen}"))?;
            tracing::info!(listen = %listen, topic = %kafka.links_topic, group = %kafka.group_id, "replicator running");
            replicator::run(listener, pipeline, applier, shutdown).await;
            Ok(())
        }
        Command::Reconcile { args, s3, store } => {
            for check in [s3.validate(), store.validate()] {
                if let Err(e) = check {
                    bail!("invalid configuration: {e}");
                }
            }
            let store = Arc::new(connect_store(&store, Duration::from_secs(30)).await?);
            let s3 = Arc::new(S3Store::new(&s3));
            let report = reconcile(store, s3, &args, SystemClock.now_ms(), |line| {
                println!("{line}")
            })
            .await?;
            println!(
                "links={} objects={} missing={} stale={} orphans={} repaired={} changed_during_run={} drift={}",
                report.links, report.objects, report.missing, report.stale, report.orphans, report.repaired,
                report.changed, report.drift()
            );
            if args.dry_run && report.drift() > 0 {
                std::process::exit(1);
            }
            Ok(())
        }
    }
}
