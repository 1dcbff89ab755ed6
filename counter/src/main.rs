use anyhow::{bail, Context};
use clap::{Parser, Subcommand};
use counter::{App, CountConfig};
use std::sync::Arc;
use std::time::Duration;
use zlink_clients::process::{init_tracing, shutdown_on_signals};
use zlink_store::connect::connect_store;

#[derive(Parser)]
#[command(
    name = "counter",
    version,
    about = "zlink click counter: the clicks topic → exactly-once per-link aggregates"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Consume the clicks topic and keep the aggregates the stats API reads.
    Run(Box<CountConfig>),
}

async fn run(cfg: CountConfig) -> anyhow::Result<()> {
    if let Err(e) = cfg.validate() {
        bail!("invalid configuration: {e}");
    }
    let shutdown = shutdown_on_signals();
    let db = connect_store(&cfg.store, Duration::from_secs(60))
        .await
        .context("connecting to the store")?;
    let app = App::build(&cfg, Arc::new(db))
        .await
        .context("starting the click counter")?;
    let listener = tokio::net::TcpListener::bind(cfg.listen)
        .await
        .with_context(|| format!("binding {}", cfg.listen))?;
    tracing::info!(listen = %cfg.listen, topic = %cfg.clicks_topic, group = %cfg.group_id, "click counter running");
    app.run(listener, shutdown).await;
    Ok(())
}

fn main() -> anyhow::Result<()> {
    init_tracing();
    let Command::Run(cfg) = Cli::parse().command;
    zlink_clients::process::runtime(0)
        .context("starting the runtime")?
        .block_on(run(*cfg))
}
