//! Alertmanager, polled: which alerts start and stop firing during the drill.

use crate::*;

/// Polls Alertmanager's active alerts every second until `stop`, recording every change of
/// the set of firing alert names (the first poll records what already fires).
pub(crate) async fn watch_alerts(
    client: reqwest::Client,
    am: String,
    t0: Instant,
    stop: Arc<tokio::sync::Notify>,
) -> Vec<AlertChange> {
    let url = format!(
        "{}/api/v2/alerts?active=true&silenced=false&inhibited=false",
        am.trim_end_matches('/')
    );
    let mut firing = std::collections::BTreeSet::<String>::new();
    let mut changes = Vec::new();
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    // Bounded: a day of polls at most.
    for _ in 0..86_400 {
        tokio::select! {
            _ = stop.notified() => break,
            _ = tick.tick() => {}
        }
        let Ok(r) = client.get(&url).send().await else {
            continue;
        };
        let Ok(list) = r.json::<Vec<serde_json::Value>>().await else {
            continue;
        };
        let now: std::collections::BTreeSet<String> = list
            .iter()
            .filter_map(|a| a["labels"]["alertname"].as_str().map(str::to_string))
            .collect();
        let at_ms = t0.elapsed().as_millis() as u64;
        for a in now.difference(&firing) {
            changes.push(AlertChange {
                at_ms,
                alert: a.clone(),
                firing: true,
            });
        }
        for a in firing.difference(&now) {
            changes.push(AlertChange {
                at_ms,
                alert: a.clone(),
                firing: false,
            });
        }
        firing = now;
    }
    changes
}
