//! One probe of a link through the frontend, and the ε writer: creates a link every so often
//! and times it until every rung serves it.

use crate::*;

/// Checks one answer: the right redirect (rungs 1, 2) or the right meta-refresh page (rung 3).
/// `host`: the branded domain the link is on (sent as `Host`); `None`: the default domain.
pub(crate) async fn probe(
    client: &reqwest::Client,
    base: &str,
    slug: &str,
    url: &str,
    host: Option<&str>,
) -> Sample {
    let started = Instant::now();
    let mut s = Sample {
        phase: 0,
        rung: None,
        outcome: Outcome::Failed,
        status: 0,
        start_ms: 0,
        micros: 0,
        link: 0,
        click: None,
    };
    let mut req = client.get(format!("{base}/{slug}"));
    if let Some(h) = host {
        req = req.header(reqwest::header::HOST, h);
    }
    let Ok(r) = req.send().await else {
        s.micros = started.elapsed().as_micros() as u64;
        return s;
    };
    s.status = r.status().as_u16();
    let header = |name: &str| {
        r.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    };
    s.rung = match header("x-zlink-tier").as_deref() {
        Some("primary") => Some(1),
        Some("lastresort") => Some(2),
        Some("lastresort-nginx") => Some(3),
        _ => None,
    };
    s.click = header("x-zlink-click-id").and_then(|id| uuid::Uuid::parse_str(&id).ok());
    let location = header("location");
    let right = match (s.status, s.rung) {
        (301 | 302 | 307 | 308, Some(1 | 2)) => location.as_deref() == Some(url),
        (200, Some(3)) => r.text().await.is_ok_and(|body| {
            body.contains("http-equiv=\"refresh\"")
                && body.contains(&zlink_wire::blob::escape_html(url))
        }),
        _ => false,
    };
    s.outcome = if right {
        Outcome::Right
    } else if s.status >= 500 {
        Outcome::Failed
    } else {
        Outcome::Wrong
    };
    s.micros = started.elapsed().as_micros() as u64;
    s
}

/// Until every rung serves `slug` right (S3 has the page, the last-resort host answers it), at
/// most 60 s: the time taken, or None. Both are polled from the create on, so a "missing"
/// answer the last-resort tier cached before the page reached S3 counts against ε too.
async fn until_on_every_rung(
    client: &reqwest::Client,
    blob: &str,
    lastresort_host: Option<&str>,
    slug: &str,
    url: &str,
) -> Option<f64> {
    let started = Instant::now();
    let (mut in_s3, mut served) = (false, lastresort_host.is_none());
    while started.elapsed() < Duration::from_secs(60) {
        if !in_s3 {
            in_s3 = client
                .get(blob)
                .send()
                .await
                .is_ok_and(|r| r.status().as_u16() == 200);
        }
        if let (false, Some(h)) = (served, lastresort_host) {
            served = probe(client, h, slug, url, None).await.outcome == Outcome::Right;
        }
        if in_s3 && served {
            return Some(started.elapsed().as_secs_f64() * 1000.0);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    None
}

/// Creates a link every `every` (not while a phase's actions run; each in its own task, so a
/// slow or retried create does not delay the next) and times each until every rung serves it,
/// until `stop`.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn writer(
    client: reqwest::Client,
    base: String,
    admin_key: String,
    blob_prefix: String,
    lastresort_host: Option<String>,
    run: String,
    every: Duration,
    phase: Arc<AtomicUsize>,
    acting: Arc<AtomicBool>,
    t0: Instant,
    stop: Arc<tokio::sync::Notify>,
) -> Vec<Write> {
    let mut watchers = tokio::task::JoinSet::new();
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    // Bounded: at most a day of creates.
    for n in 0..(86_400_000 / every.as_millis().max(1) as u64) {
        tokio::select! {
            _ = stop.notified() => break,
            _ = tick.tick() => {}
        }
        if acting.load(Ordering::Relaxed) {
            continue;
        }
        let p = phase.load(Ordering::Relaxed);
        let slug = format!("drill-{}-w{n}", &run[..10]);
        let url = writer_url(&run, n);
        let (client, base, admin_key, blob, host) = (
            client.clone(),
            base.clone(),
            admin_key.clone(),
            format!("{blob_prefix}{slug}"),
            lastresort_host.clone(),
        );
        // The create in its own task: one that waits or is retried does not hold up the
        // next one.
        watchers.spawn(async move {
            let (status, refused) = create(&client, &base, &admin_key, &slug, &url).await;
            let at_ms = t0.elapsed().as_millis() as u64;
            let to_rungs_ms = if status == 201 {
                until_on_every_rung(&client, &blob, host.as_deref(), &slug, &url).await
            } else {
                None
            };
            Write {
                phase: p,
                at_ms,
                status,
                to_rungs_ms,
                slug,
                found: None,
                refused,
            }
        });
    }
    let mut out = Vec::new();
    while let Some(w) = watchers.join_next().await {
        out.extend(w.ok());
    }
    out
}

/// How many times the writer retries a create that got a 5xx or no answer, and how long it
/// waits first: the API's 503 says "retry later", and the primary's store circuit stays open
/// for a second.
pub(crate) const CREATE_RETRIES: usize = 2;
pub(crate) const CREATE_RETRY_AFTER: Duration = Duration::from_secs(1);

/// One create as a careful API client makes it: with an Idempotency-Key (the slug; a retry of
/// a create that did land is answered with that link), retried after a 5xx or no answer at
/// most [`CREATE_RETRIES`] times. The last status, and what each attempt that did not get 201
/// got (`503 unavailable`: the status and the error body's code; `no answer`).
async fn create(
    client: &reqwest::Client,
    base: &str,
    admin_key: &str,
    slug: &str,
    url: &str,
) -> (u16, Vec<String>) {
    let (mut status, mut refused) = (0, Vec::new());
    for attempt in 0..=CREATE_RETRIES {
        if attempt > 0 {
            tokio::time::sleep(CREATE_RETRY_AFTER).await;
        }
        let body = serde_json::json!({"url": url, "slug": slug});
        let Ok(r) = create_request(client, base, admin_key, slug, &body)
            .send()
            .await
        else {
            status = 0;
            refused.push("no answer".to_string());
            continue;
        };
        status = r.status().as_u16();
        if status == 201 {
            break;
        }
        let body: serde_json::Value = r.json().await.unwrap_or_default();
        let code = body["error"]["code"].as_str().unwrap_or("-");
        refused.push(format!("{status} {code}"));
        if status < 500 {
            break;
        }
    }
    (status, refused)
}

/// `POST /api/v1/links` with `body`, under the Idempotency-Key `key` (a retry of a create
/// that did land gets that link, not a 409): the drill's setup and its writer.
pub(crate) fn create_request(
    client: &reqwest::Client,
    base: &str,
    admin_key: &str,
    key: &str,
    body: &serde_json::Value,
) -> reqwest::RequestBuilder {
    client
        .post(format!("{base}/api/v1/links"))
        .bearer_auth(admin_key)
        .header("idempotency-key", key)
        .json(body)
}

fn writer_url(run: &str, n: u64) -> String {
    format!("https://example.com/drill/{run}/w/{n}")
}

/// The history check (as Jepsen's): every create that was acknowledged (201) is read back
/// through the API once the drill is over and must be there with its destination. A read that
/// gets no answer is retried for up to 30 s (an answer is needed, not a quick one).
pub(crate) async fn verify(
    client: &reqwest::Client,
    base: &str,
    admin_key: &str,
    run: &str,
    writes: &mut [Write],
) {
    for w in writes.iter_mut().filter(|w| w.status == 201) {
        let n: u64 = w
            .slug
            .rsplit_once("-w")
            .and_then(|(_, n)| n.parse().ok())
            .unwrap_or(u64::MAX);
        let want = writer_url(run, n);
        let started = Instant::now();
        let found = loop {
            let got = client
                .get(format!("{base}/api/v1/links/{}", w.slug))
                .bearer_auth(admin_key)
                .send()
                .await;
            match got {
                Ok(r) if r.status().as_u16() == 200 => {
                    let v: serde_json::Value = r.json().await.unwrap_or_default();
                    break v["url"].as_str() == Some(want.as_str());
                }
                Ok(r) if r.status().as_u16() == 404 => break false,
                _ if started.elapsed() > Duration::from_secs(30) => break false,
                _ => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        };
        w.found = Some(found);
    }
}
