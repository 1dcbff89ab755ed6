use anyhow::{bail, Context};
use clap::Parser;
use lastresort::config::Config;
use lastresort::metrics::Metrics;
use lastresort::App;
use std::sync::Arc;

fn main() -> anyhow::Result<()> {
    zlink_clients::process::init_tracing();
    let cfg = Config::parse();
    if let Err(e) = cfg.validate() {
        bail!("invalid configuration: {e}");
    }
    zlink_clients::process::runtime(cfg.runtime.worker_threads)
        .context("starting the runtime")?
        .block_on(serve(cfg))
}

async fn serve(cfg: Config) -> anyhow::Result<()> {
    zlink_clients::trace::init(&cfg.trace, &cfg.instance).map_err(anyhow::Error::msg)?;
    let shutdown = zlink_clients::process::shutdown_on_signals();
    let app = App::build(&cfg, Arc::new(Metrics::new())).map_err(anyhow::Error::msg)?;
    let listener = zlink_redirect::serve::bind(cfg.listen)
        .with_context(|| format!("binding {}", cfg.listen))?;
    tracing::info!(listen = %cfg.listen, instance = %cfg.instance, bucket = %cfg.s3.s3_bucket, "lastresort serving");
    app.run(listener, shutdown).await;
    zlink_clients::trace::flush();
    Ok(())
}
