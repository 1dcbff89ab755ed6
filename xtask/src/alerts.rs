//! The Alertmanager webhook receiver of the local topology: appends every notification's
//! alerts to a JSON Lines file (one line per alert: received_at, status, alertname, labels,
//! startsAt, endsAt), so tests, the drill and an operator can read which alerts fired and
//! resolved, and when. Binds 127.0.0.1 only; `POST /` with Alertmanager's webhook JSON (at most
//! 1 MiB); `GET /` is its readiness probe.

use anyhow::Result;
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use tokio::sync::Mutex;

const MAX_BODY: usize = 1 << 20;

/// The lines a webhook payload becomes, or `None` if it is not one.
pub fn lines(payload: &[u8], received_at: &str) -> Option<Vec<String>> {
    let v: serde_json::Value = serde_json::from_slice(payload).ok()?;
    let alerts = v.get("alerts")?.as_array()?;
    Some(
        alerts
            .iter()
            .map(|a| {
                let labels = a
                    .get("labels")
                    .cloned()
                    .unwrap_or_else(|| serde_json::json!({}));
                serde_json::json!({
                    "received_at": received_at,
                    "status": a.get("status"),
                    "alertname": labels.get("alertname"),
                    "labels": labels,
                    "startsAt": a.get("startsAt"),
                    "endsAt": a.get("endsAt"),
                })
                .to_string()
            })
            .collect(),
    )
}

fn status(code: StatusCode, body: &'static str) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from_static(body.as_bytes())));
    *r.status_mut() = code;
    r
}

async fn handle(out: Arc<Mutex<PathBuf>>, req: Request<Incoming>) -> Response<Full<Bytes>> {
    match *req.method() {
        Method::GET => status(StatusCode::OK, r#"{"status":"ok"}"#),
        Method::POST => {
            let Ok(body) = Limited::new(req.into_body(), MAX_BODY).collect().await else {
                return status(StatusCode::PAYLOAD_TOO_LARGE, "");
            };
            let now = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
            let Some(lines) = lines(&body.to_bytes(), &now) else {
                return status(StatusCode::BAD_REQUEST, "");
            };
            if lines.is_empty() {
                return status(StatusCode::OK, "");
            }
            let path = out.lock().await;
            let written = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&*path)
                .and_then(|mut f| f.write_all((lines.join("\n") + "\n").as_bytes()));
            match written {
                Ok(()) => status(StatusCode::OK, ""),
                Err(e) => {
                    eprintln!("alert-receiver: writing {}: {e}", path.display());
                    status(StatusCode::INTERNAL_SERVER_ERROR, "")
                }
            }
        }
        _ => status(StatusCode::METHOD_NOT_ALLOWED, ""),
    }
}

/// Serves until killed.
pub async fn serve(port: u16, out: PathBuf) -> Result<()> {
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
    let out = Arc::new(Mutex::new(out));
    loop {
        let (stream, _) = listener.accept().await?;
        let out = out.clone();
        tokio::spawn(async move {
            let svc = hyper::service::service_fn(move |req| {
                let out = out.clone();
                async move { Ok::<_, std::convert::Infallible>(handle(out, req).await) }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), svc)
                .await;
        });
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn one_line_per_alert_and_garbage_refused() {
        let p = br#"{"alerts":[{"status":"firing","labels":{"alertname":"A","x":"1"},"startsAt":"s","endsAt":"e"},{"status":"resolved","labels":{"alertname":"B"}}]}"#;
        let l = super::lines(p, "now").unwrap();
        assert_eq!(l.len(), 2);
        let a: serde_json::Value = serde_json::from_str(&l[0]).unwrap();
        assert_eq!(a["alertname"], "A");
        assert_eq!(a["labels"]["x"], "1");
        assert_eq!(a["received_at"], "now");
        assert_eq!(a["endsAt"], "e");
        assert!(super::lines(b"not json", "now").is_none());
        assert!(super::lines(br#"{"alerts": 3}"#, "now").is_none());
    }
}
