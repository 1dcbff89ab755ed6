//! The break/restore command hooks the phases run, and flapping a component.

use crate::*;

fn run_hook(template: &str, kind: Kind, component: &str) -> anyhow::Result<()> {
    let cmd = template
        .replace("{kind}", kind.name())
        .replace("{component}", component);
    let status = std::process::Command::new("bash")
        .arg("-c")
        .arg(&cmd)
        .stdout(std::process::Stdio::null())
        .status()
        .with_context(|| format!("running {cmd:?}"))?;
    if !status.success() {
        bail!("{cmd:?} failed: {status}");
    }
    Ok(())
}

pub(crate) async fn hook(template: String, kind: Kind, component: String) -> anyhow::Result<()> {
    tokio::task::spawn_blocking(move || run_hook(&template, kind, &component)).await?
}

/// Toggles `comps` between broken (`FLAP_WITH`) and restored every `every` until `stop`;
/// always ends restored. Returns the first hook error.
pub(crate) async fn flap(
    break_cmd: String,
    restore_cmd: String,
    comps: Vec<String>,
    every: Duration,
    stop: Arc<tokio::sync::Notify>,
) -> Option<String> {
    let mut err = None;
    loop {
        for c in &comps {
            if let Err(e) = hook(break_cmd.clone(), FLAP_WITH, c.clone()).await {
                err.get_or_insert(format!("{e:#}"));
            }
        }
        let stopped = tokio::select! {
            _ = stop.notified() => true,
            _ = tokio::time::sleep(every) => false,
        };
        for c in &comps {
            if let Err(e) = hook(restore_cmd.clone(), FLAP_WITH, c.clone()).await {
                err.get_or_insert(format!("{e:#}"));
            }
        }
        if stopped {
            return err;
        }
        tokio::select! {
            _ = stop.notified() => return err,
            _ = tokio::time::sleep(every) => {}
        }
    }
}
