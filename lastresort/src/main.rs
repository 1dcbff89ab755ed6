use anyhow::{bail, Context};
use clap::Parser;
use lastresort::config::Config;
use lastresort::metrics::Metrics;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;
use zlink_clients::s3::S3Store;

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
        t.cancel();
    });
    token
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_target(false)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let cfg = Config::parse();
    if let Err(e) = cfg.validate() {
        bail!("invalid configuration: {e}");
    }
    let shutdown = shutdown_on_signals();
    let state = lastresort::state(&cfg, Arc::new(Metrics::new())).map_err(anyhow::Error::msg)?;
    let listener = tokio::net::TcpListener::bind(cfg.listen)
        .await
        .with_context(|| format!("binding {}", cfg.listen))?;
    tracing::info!(listen = %cfg.listen, instance = %cfg.instance, bucket = %cfg.s3.s3_bucket, "lastresort serving");
    lastresort::run(listener, state, Arc::new(S3Store::new(&cfg.s3)), shutdown).await;
    Ok(())
}
