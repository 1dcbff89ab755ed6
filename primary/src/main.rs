use anyhow::{bail, Context};
use clap::Parser;
use primary::config::{Cli, Command, ServeConfig};
use primary::{auth, App};
use std::sync::Arc;
use std::time::Duration;
use zlink_clients::clock::{Clock, SystemClock};
use zlink_clients::process::{init_tracing, shutdown_on_signals};
use zlink_store::connect::{connect_store, retry_for};

async fn serve(cfg: ServeConfig) -> anyhow::Result<()> {
    if let Err(e) = cfg.validate() {
        bail!("invalid configuration: {e}");
    }
    zlink_clients::trace::init(&cfg.trace, &cfg.instance).map_err(anyhow::Error::msg)?;
    let shutdown = shutdown_on_signals();
    let db = connect_store(&cfg.store, Duration::from_secs(60))
        .await
        .context("connecting to the store")?;
    let app = App::build(&cfg, db, Arc::new(SystemClock), None)
        .await
        .map_err(anyhow::Error::msg)?;
    let listener = zlink_redirect::serve::bind(cfg.listen)
        .with_context(|| format!("binding {}", cfg.listen))?;
    tracing::info!(listen = %cfg.listen, instance = %cfg.instance, keyspace = %cfg.store.keyspace, "primary serving");
    app.run(listener, shutdown).await;
    zlink_clients::trace::flush();
    tracing::info!("primary stopped");
    Ok(())
}

fn main() -> anyhow::Result<()> {
    init_tracing();
    let command = Cli::parse().command;
    let workers = match &command {
        Command::Serve(cfg) => cfg.runtime.worker_threads,
        _ => 0,
    };
    zlink_clients::process::runtime(workers)
        .context("starting the runtime")?
        .block_on(run(command))
}

async fn run(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Serve(cfg) => serve(*cfg).await,
        Command::Migrate {
            store: cfg,
            replication_factor,
        } => {
            cfg.validate().map_err(anyhow::Error::msg)?;
            retry_for("schema migration", Duration::from_secs(60), || {
                zlink_store::schema::migrate(&cfg, replication_factor)
            })
            .await
            .context("applying the schema")?;
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
            let db = connect_store(&cfg, Duration::from_secs(30))
                .await
                .context("connecting to the store")?;
            let keys = zlink_store::keys::Keys::prepare(Arc::new(db))
                .await
                .context("preparing statements")?;
            let (key, key_id) = auth::generate_key();
            keys.insert(
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
