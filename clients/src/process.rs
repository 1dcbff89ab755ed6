//! Process plumbing every zlink binary shares: logging and shutdown signals.

use tokio_util::sync::CancellationToken;

/// `tracing` to stderr (stdout carries command output, e.g. a created API key), filtered by
/// `RUST_LOG` (default info), JSON when `ZLINK_LOG_FORMAT=json`, colours only on a terminal.
pub fn init_tracing() {
    let filter =
        tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into());
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

/// A token cancelled on the first SIGTERM or SIGINT.
pub fn shutdown_on_signals() -> CancellationToken {
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
