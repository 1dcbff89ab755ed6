use anyhow::{bail, Context};
use clap::{Parser, Subcommand};
use replicator::audit::AuditArgs;
use replicator::consumer::KafkaConfig;
use replicator::reconcile::{reconcile, ReconcileArgs, ReconcileStore};
use replicator::s3::{S3Config, S3Store};
use replicator::App;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use zlink_clients::clock::{Clock, SystemClock};
use zlink_store::StoreConfig;

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

// Parsed once at start: the size of a variant costs nothing.
#[allow(clippy::large_enum_variant)]
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
        /// The continuous store ↔ S3 audit.
        #[command(flatten)]
        audit: AuditArgs,
        /// Traces: each event continues the trace in its `traceparent` header.
        #[command(flatten)]
        trace: zlink_clients::trace::TraceArgs,
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

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    zlink_clients::process::init_tracing();
    match Cli::parse().command {
        Command::Run {
            listen,
            kafka,
            s3,
            store,
            audit,
            trace,
        } => {
            for check in [kafka.validate(), s3.validate(), store.validate()] {
                if let Err(e) = check {
                    bail!("invalid configuration: {e}");
                }
            }
            zlink_clients::trace::init(&trace, "replicator").map_err(anyhow::Error::msg)?;
            let shutdown = zlink_clients::process::shutdown_on_signals();
            let db = zlink_store::connect::connect_store(&store, Duration::from_secs(60))
                .await
                .context("connecting to the store")?;
            let app = App::build(&kafka, &s3, &audit, db, Arc::new(SystemClock))
                .await
                .context("starting the replicator")?;
            let listener = tokio::net::TcpListener::bind(listen)
                .await
                .with_context(|| format!("binding {listen}"))?;
            tracing::info!(listen = %listen, topic = %kafka.links_topic, group = %kafka.group_id, "replicator running");
            app.run(listener, shutdown).await;
            zlink_clients::trace::flush();
            Ok(())
        }
        Command::Reconcile { args, s3, store } => {
            for check in [s3.validate(), store.validate()] {
                if let Err(e) = check {
                    bail!("invalid configuration: {e}");
                }
            }
            let db = Arc::new(
                zlink_store::connect::connect_store(&store, Duration::from_secs(30))
                    .await
                    .context("connecting to the store")?,
            );
            let store = Arc::new(
                ReconcileStore::prepare(db)
                    .await
                    .context("preparing statements")?,
            );
            let s3 = Arc::new(S3Store::new(&s3).map_err(anyhow::Error::msg)?);
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
