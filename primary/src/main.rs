use anyhow::{bail, Context};
use clap::Parser;
use primary::app::AppState;
use primary::clock::{Clock, SystemClock};
use primary::config::{Cli, Command, ServeConfig, StoreConfig};
use primary::metrics::Metrics;
use primary::store::{self, Store};
use primary::{auth, run};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

fn init_tracing() {
    let filter =
        tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into());
    // Logs go to stderr: stdout carries command output (create-key prints the key there).
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_target(false)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    if std::env::var("ZLINK_LOG_FORMAT").as_deref() == Ok("json") {
        builder.json().init();
    } else {
        builder.init();
    }
}

/// The store may still be starting (or briefly unreachable): retry for a bounded time.
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
            tracing::error!("cannot install signal handlers");
            return;
        };
        tokio::select! { _ = term.recv() => {}, _ = int.recv() => {} }
        tracing::info!("shutdown signal received");
        t.cancel();
    });
    token
}

async fn serve(cfg: ServeConfig) -> anyhow::Result<()> {
    if let Err(e) = cfg.validate() {
        bail!("invalid configuration: {e}");
    }
    let shutdown = shutdown_on_signals();
    let store = Arc::new(connect_store(&cfg.store, Duration::from_secs(60)).await?);
    let metrics = Arc::new(Metrics::new());
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let mut background = tokio::task::JoinSet::new();
    let events = primary::event_sink(
        &cfg,
        store.clone(),
        metrics.clone(),
        clock.clone(),
        &shutdown,
        &mut background,
    )
    .context("creating the Kafka producer")?;
    let state = AppState::new(&cfg, store, events, metrics, clock).map_err(anyhow::Error::msg)?;
    let listener = tokio::net::TcpListener::bind(cfg.listen)
        .await
        .with_context(|| format!("binding {}", cfg.listen))?;
    tracing::info!(listen = %cfg.listen, instance = %cfg.instance, keyspace = %cfg.store.keyspace, "primary serving");
    run(
        listener,
        state,
        shutdown,
        Duration::from_secs(cfg.shutdown_grace_s),
    )
    .await;
    // The relay finishes its pass and flushes its producer on the way out.
    while background.join_next().await.is_some() {}
    tracing::info!("primary stopped");
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    init_tracing();
    match Cli::parse().command {
        Command::Serve(cfg) => serve(*cfg).await,
        Command::Migrate {
            store: cfg,
            replication_factor,
        } => {
            cfg.validate().map_err(anyhow::Error::msg)?;
            let deadline = Instant::now() + Duration::from_secs(60);
            loop {
                match store::migrate(&cfg, replication_factor).await {
                    Ok(()) => break,
                    Err(e) if Instant::now() < deadline => {
                        tracing::warn!(error = %e, "migration failed; retrying");
                        tokio::time::sleep(Duration::from_millis(500)).await;
                    }
                    Err(e) => return Err(e).context("applying the schema"),
                }
            }
            tracing::info!(keyspace = %cfg.keyspace, "schema applied");
            Ok(())
        }
        Command::CreateKey {
            store: cfg,
            owner,
            admin,
        } => {
            cfg.validate().map_err(anyhow::Error::msg)?;
            auth::validate_owner(&owner).map_err(anyhow::Error::msg)?;
            let store = connect_store(&cfg, Duration::from_secs(30)).await?;
            let (key, key_id) = auth::generate_key();
            store
                .insert_api_key(
                    &auth::hash_key(&key),
                    &key_id,
                    &owner,
                    admin,
                    SystemClock.now_ms(),
                )
                .await
                .context("storing the key")?;
            tracing::info!(key_id = %key_id, owner = %owner, admin, "API key created");
            // The key itself goes to stdout only, once.
            println!("{key}");
            Ok(())
        }
    }
}
