//! Benchmark drivers against the running local topology (endpoints from `endpoints.env`,
//! exported by the `deploy/local/bench-*` wrappers). Every loop is bounded in count and time;
//! every result is one `RESULT key=value ...` line.

use anyhow::{bail, Context, Result};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::Semaphore;

fn env(name: &str) -> Result<String> {
    std::env::var(name).with_context(|| format!("${name} not set (run deploy/local/up first)"))
}

/// How long the benchmarks' client waits for a whole answer.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(10);

fn client(source: Option<IpAddr>) -> Result<reqwest::Client> {
    Ok(reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(CLIENT_TIMEOUT)
        .local_address(source)
        .build()?)
}

fn pick(sorted: &[f64], q: f64) -> f64 {
    sorted[((sorted.len() as f64 * q) as usize).min(sorted.len() - 1)]
}

fn unix_s() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

async fn create_one(c: &reqwest::Client, base: &str, key: &str, url: String) -> Result<String> {
    let r = c
        .post(format!("{base}/api/v1/links"))
        .bearer_auth(key)
        .json(&serde_json::json!({ "url": url }))
        .send()
        .await?;
    let status = r.status();
    let body = r.bytes().await?;
    if status.as_u16() != 201 {
        bail!(
            "create failed: {status} {}",
            String::from_utf8_lossy(&body[..body.len().min(200)])
        );
    }
    let v: serde_json::Value = serde_json::from_slice(&body)?;
    v["slug"]
        .as_str()
        .map(String::from)
        .context("no slug in the answer")
}

/// Creates `n` links on $ZLINK_PRIMARY_1 (16 at a time) and writes their slugs to `out`.
pub async fn create(n: usize, out: &str) -> Result<()> {
    let (base, key) = (env("ZLINK_PRIMARY_1")?, env("ZLINK_ADMIN_KEY")?);
    let c = client(None)?;
    let run = unix_s();
    let gate = Arc::new(Semaphore::new(16));
    let started = Instant::now();
    let mut tasks = Vec::with_capacity(n);
    for i in 0..n {
        let (c, base, key, gate) = (c.clone(), base.clone(), key.clone(), gate.clone());
        tasks.push(tokio::spawn(async move {
            let _permit = gate.acquire_owned().await?;
            let url = format!("https://example.com/bench/{run}/{i}?q={i}");
            create_one(&c, &base, &key, url).await
        }));
    }
    let mut slugs = Vec::with_capacity(n);
    for t in tasks {
        slugs.push(t.await??);
    }
    let took = started.elapsed().as_secs_f64();
    std::fs::write(out, slugs.join("\n") + "\n")?;
    println!(
        "RESULT created={n} seconds={took:.2} creates_per_s={:.0}",
        n as f64 / took
    );
    Ok(())
}

fn slugs_in(path: &str) -> Result<Vec<String>> {
    Ok(std::fs::read_to_string(path)?
        .split_whitespace()
        .map(String::from)
        .collect())
}

/// One GET of `url`: ms from `from` (its scheduled start) to the whole answer, and its status
/// (0: no answer).
async fn timed_get(c: reqwest::Client, url: String, from: Instant) -> (f64, u16) {
    let status = match c.get(&url).send().await {
        Ok(r) => {
            let s = r.status().as_u16();
            r.bytes().await.map_or(0, |_| s)
        }
        Err(_) => 0,
    };
    (from.elapsed().as_secs_f64() * 1000.0, status)
}

/// GETs `urls` open loop, request i at i / `rate` s from now (a stall counts for every request
/// it delays), and waits for every answer.
async fn open_loop(
    clients: &[reqwest::Client],
    urls: impl ExactSizeIterator<Item = String>,
    rate: u32,
) -> Result<Vec<(f64, u16)>> {
    let period = Duration::from_secs_f64(1.0 / f64::from(rate.max(1)));
    let start = Instant::now();
    let mut tasks = Vec::with_capacity(urls.len());
    for (i, url) in urls.enumerate() {
        let at = start + period * u32::try_from(i)?;
        tokio::time::sleep_until(at.into()).await;
        let c = clients[i % clients.len()].clone();
        tasks.push(tokio::spawn(timed_get(c, url, at)));
    }
    let mut answers = Vec::with_capacity(tasks.len());
    for t in tasks {
        answers.push(t.await?);
    }
    Ok(answers)
}

/// The answers of a run: latencies sorted, and how many answered each status.
struct Answers {
    lat: Vec<f64>,
    by_status: std::collections::BTreeMap<u16, usize>,
}

impl Answers {
    fn new(answers: &[(f64, u16)]) -> Self {
        let mut lat: Vec<f64> = answers.iter().map(|a| a.0).collect();
        lat.sort_by(f64::total_cmp);
        let mut by_status = std::collections::BTreeMap::new();
        for (_, status) in answers {
            *by_status.entry(*status).or_default() += 1;
        }
        Answers { lat, by_status }
    }

    fn count(&self, status: u16) -> usize {
        self.by_status.get(&status).copied().unwrap_or(0)
    }

    /// `status_503=3 status_0=1`: every answer that was not a 302.
    fn not_302(&self) -> String {
        self.by_status
            .iter()
            .filter(|(s, _)| **s != 302)
            .map(|(s, n)| format!("status_{s}={n}"))
            .collect::<Vec<_>>()
            .join(" ")
    }

    /// `p50_ms=... p99_ms=... max_ms=...`
    fn latency(&self) -> String {
        format!(
            "p50_ms={:.3} p99_ms={:.3} max_ms={:.3}",
            pick(&self.lat, 0.5),
            pick(&self.lat, 0.99),
            self.lat[self.lat.len() - 1]
        )
    }
}

/// GETs each slug of `file` once on `base`, one at a time or, with `rate`, open loop at that
/// many a second; prints p50/p99/max in ms over every answer, and how many were not a 302 (a
/// tier under load may answer 503 at its deadline; the frontend fails those over).
pub async fn cold(base: &str, file: &str, rate: Option<u32>) -> Result<()> {
    let c = client(None)?;
    let slugs = slugs_in(file)?;
    if slugs.is_empty() {
        bail!("no slugs in {file}");
    }
    let urls = slugs.iter().map(|s| format!("{base}/{s}"));
    let answers = match rate {
        None => {
            let mut answers = Vec::with_capacity(slugs.len());
            for url in urls {
                answers.push(timed_get(c.clone(), url, Instant::now()).await);
            }
            answers
        }
        // Bounded by the file's length.
        Some(rate) => open_loop(std::slice::from_ref(&c), urls, rate).await?,
    };
    let a = Answers::new(&answers);
    println!(
        "RESULT cold_requests={} rate={} errors={} {} {}",
        answers.len(),
        rate.map_or_else(|| "serial".into(), |r| r.to_string()),
        answers.len() - a.count(302),
        a.not_302(),
        a.latency()
    );
    Ok(())
}

/// GETs the slugs of `file` round and round on `base`, open loop at `rate` a second for `secs`
/// seconds (a bounded count: rate × secs), as background redirect load beside another
/// benchmark; prints how many answered 302, the other answers, and p50/p99/max in ms from each
/// request's scheduled start.
///
/// `sources` > 1: the requests take turns over that many clients, each with its own pool and
/// its own loopback source address (127.0.1.1, 127.0.1.2, …), as that many client machines
/// would. One address has some 28,000 ephemeral ports to one server port; a client that
/// opens connections by the ten thousand, while the server closes others, spends its core in
/// the kernel's search for a free port (`__inet_hash_connect`), and the run then measures
/// the load generator.
pub async fn pace(base: &str, file: &str, rate: u32, secs: u32, sources: u8) -> Result<()> {
    let clients = if sources <= 1 {
        vec![client(None)?]
    } else {
        (1..=sources)
            .map(|k| client(Some(IpAddr::V4(std::net::Ipv4Addr::new(127, 0, 1, k)))))
            .collect::<Result<Vec<_>>>()?
    };
    let slugs = slugs_in(file)?;
    if slugs.is_empty() {
        bail!("no slugs in {file}");
    }
    let n = rate.max(1) as usize * secs as usize;
    let urls = (0..n).map(|i| format!("{base}/{}", slugs[i % slugs.len()]));
    let start = Instant::now();
    let answers = open_loop(&clients, urls, rate).await?;
    // Without an answer (status 0): the client's timeout ran out (latencies are from the
    // scheduled time, so at least that), or the connection failed first (refused, reset,
    // closed unanswered). Answered at all within 1 s of its scheduled time.
    let timeout_ms = CLIENT_TIMEOUT.as_secs_f64() * 1000.0;
    let timed_out = answers
        .iter()
        .filter(|a| a.1 == 0 && a.0 >= timeout_ms)
        .count();
    let failed = answers.iter().filter(|a| a.1 == 0).count() - timed_out;
    let within_1s = answers
        .iter()
        .filter(|a| a.1 != 0 && a.0 <= 1_000.0)
        .count();
    let a = Answers::new(&answers);
    println!(
        "RESULT paced_requests={n} rate={rate} seconds={:.1} status_302={} {} timed_out={timed_out} failed={failed} within_1s={within_1s} {}",
        start.elapsed().as_secs_f64(),
        a.count(302),
        a.not_302(),
        a.latency()
    );
    Ok(())
}

/// Waits (at most 120 s) until every slug's blob is readable, unsigned, in S3.
pub async fn wait_s3(file: &str) -> Result<()> {
    let (s3, bucket) = (env("ZLINK_S3_ENDPOINT")?, env("ZLINK_S3_BUCKET")?);
    let prefix = std::env::var("ZLINK_S3_PREFIX").unwrap_or_default();
    let c = client(None)?;
    let deadline = Instant::now() + Duration::from_secs(120);
    let slugs = slugs_in(file)?;
    for s in &slugs {
        loop {
            let r = c.head(format!("{s3}/{bucket}/{prefix}{s}")).send().await?;
            if r.status().as_u16() == 200 {
                break;
            }
            if Instant::now() > deadline {
                bail!("blob of {s} not in S3 after 120 s (replicator running?)");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    println!("RESULT replicated={}", slugs.len());
    Ok(())
}

/// A new owner key, issued through the keys API with the admin key.
async fn owner_key(c: &reqwest::Client, owner: &str) -> Result<String> {
    let r = c
        .post(format!("{}/api/v1/keys", env("ZLINK_PRIMARY_1")?))
        .bearer_auth(env("ZLINK_ADMIN_KEY")?)
        .json(&serde_json::json!({ "owner": owner }))
        .send()
        .await?;
    let status = r.status().as_u16();
    let v: serde_json::Value = r.json().await?;
    if status != 201 {
        bail!("issuing a key failed: {status} {v}");
    }
    v["key"].as_str().map(String::from).context("no key")
}

/// `n` creates paced over `secs` with one new owner key, sent from `source` (not the exempt
/// load generator); prints the statuses.
pub async fn flood(base: &str, n: usize, secs: f64, source: IpAddr) -> Result<()> {
    let key = owner_key(&client(None)?, &format!("flood-{}", unix_s())).await?;
    let c = client(Some(source))?;
    let mut statuses = std::collections::BTreeMap::<u16, usize>::new();
    let mut retry_after = std::collections::BTreeSet::new();
    let started = Instant::now();
    for i in 0..n {
        // Paced: request i leaves at i * secs / n.
        let at = started + Duration::from_secs_f64(i as f64 * secs / n as f64);
        tokio::time::sleep_until(at.into()).await;
        let send = || {
            c.post(format!("{base}/api/v1/links"))
                .bearer_auth(&key)
                .json(&serde_json::json!({ "url": format!("https://example.com/flood/{i}") }))
                .send()
        };
        // A server may close a connection after refusing a request whose body it did not
        // read (a 429 answered before the body): the request is sent once more.
        let r = match send().await {
            Ok(r) => r,
            Err(_) => send().await?,
        };
        let status = r.status().as_u16();
        if status == 429 {
            if let Some(v) = r.headers().get("retry-after").and_then(|v| v.to_str().ok()) {
                retry_after.insert(v.to_string());
            }
        }
        r.bytes().await?;
        *statuses.entry(status).or_default() += 1;
    }
    let by_status: Vec<String> = statuses
        .iter()
        .map(|(s, n)| format!("status_{s}={n}"))
        .collect();
    println!(
        "RESULT flood_requests={n} seconds={:.1} {} retry_after={}",
        started.elapsed().as_secs_f64(),
        by_status.join(" "),
        retry_after.into_iter().collect::<Vec<_>>().join(",")
    );
    Ok(())
}

/// The replicator's `create_to_s3_seconds` histogram: (upper bound, cumulative count) per
/// bucket, `+Inf` last.
async fn replicator_histogram(c: &reqwest::Client) -> Result<Vec<(f64, u64)>> {
    let text = c
        .get(format!("{}/metrics", env("ZLINK_REPLICATOR")?))
        .send()
        .await?
        .text()
        .await?;
    let prefix = "zlink_replicator_create_to_s3_seconds_bucket{le=\"";
    let mut buckets = Vec::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix(prefix) else {
            continue;
        };
        let (le, count) = rest.split_once("\"} ").context("bucket line")?;
        let le = if le == "+Inf" {
            f64::INFINITY
        } else {
            le.parse()?
        };
        buckets.push((le, count.trim().parse()?));
    }
    if buckets.is_empty() {
        bail!("no create_to_s3_seconds histogram on the replicator");
    }
    Ok(buckets)
}

/// The smallest bucket bound (ms) under which at least `q` of the observations between two
/// readings of the histogram fall, and how many there were.
fn bucket_quantile_ms(before: &[(f64, u64)], after: &[(f64, u64)], q: f64) -> (f64, u64) {
    let delta = |i: usize| after[i].1 - before.get(i).map_or(0, |b| b.1);
    let total = delta(after.len() - 1);
    let bound = (0..after.len())
        .find(|&i| delta(i) as f64 >= q * total as f64)
        .map_or(f64::INFINITY, |i| after[i].0 * 1000.0);
    (bound, total)
}

/// Creates `n` links on primary-1 and times how long each takes to become readable, unsigned,
/// from S3 (polled every 10 ms from the 201 on, at most 30 s each).
///
/// Without `rate`, `concurrency` creates are in flight at a time (closed loop). With `rate`,
/// create i is sent at i / rate s (open loop; `concurrency` only bounds how many wait for an
/// answer at once, and a create held back by it counts from its scheduled start). Only every
/// `sample`-th link is polled, so the polls (S3 GETs) do not load the box the run measures;
/// the replicator's own histogram covers every create of the run.
pub async fn replication(
    n: usize,
    concurrency: usize,
    rate: Option<u32>,
    sample: usize,
) -> Result<()> {
    let (base, key) = (env("ZLINK_PRIMARY_1")?, env("ZLINK_ADMIN_KEY")?);
    let (s3, bucket) = (env("ZLINK_S3_ENDPOINT")?, env("ZLINK_S3_BUCKET")?);
    let prefix = std::env::var("ZLINK_S3_PREFIX").unwrap_or_default();
    let c = client(None)?;
    let run = unix_s();
    let sample = sample.max(1);
    let hist_before = replicator_histogram(&c).await?;
    let gate = Arc::new(Semaphore::new(concurrency.max(1)));
    let period = rate.map(|r| Duration::from_secs_f64(1.0 / f64::from(r.max(1))));
    let start = Instant::now();
    let mut tasks = Vec::with_capacity(n);
    for i in 0..n {
        let scheduled = match period {
            Some(p) => {
                let at = start + p * u32::try_from(i)?;
                tokio::time::sleep_until(at.into()).await;
                at
            }
            None => Instant::now(),
        };
        let (c, base, key) = (c.clone(), base.clone(), key.clone());
        // Closed loop: the next create waits for a free slot here; open loop: in its task.
        let held = match period {
            Some(_) => None,
            None => Some(gate.clone().acquire_owned().await?),
        };
        let (gate, object) = (gate.clone(), format!("{s3}/{bucket}/{prefix}"));
        tasks.push(tokio::spawn(async move {
            let permit = match held {
                Some(p) => p,
                None => gate.acquire_owned().await?,
            };
            let url = format!("https://example.com/repl/{run}/{i}");
            let slug = create_one(&c, &base, &key, url).await?;
            let created = Instant::now();
            drop(permit);
            let create_ms = created.duration_since(scheduled).as_secs_f64() * 1000.0;
            if i % sample != 0 {
                return Ok::<_, anyhow::Error>((created, create_ms, None));
            }
            while created.elapsed() < Duration::from_secs(30) {
                let r = c.get(format!("{object}{slug}")).send().await?;
                let ok = r.status().as_u16() == 200;
                r.bytes().await?;
                if ok {
                    let visible = created.elapsed().as_secs_f64() * 1000.0;
                    return Ok((created, create_ms, Some(visible)));
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            bail!("{slug} not visible in S3 after 30 s")
        }));
    }
    let mut results = Vec::with_capacity(n);
    for t in tasks {
        results.push(t.await??);
    }
    let end = start.elapsed().as_secs_f64();
    let last_create = results
        .iter()
        .map(|r| r.0.duration_since(start).as_secs_f64())
        .fold(0.0, f64::max);
    let mut create: Vec<f64> = results.iter().map(|r| r.1).collect();
    create.sort_by(f64::total_cmp);
    let mut lat: Vec<f64> = results.iter().filter_map(|r| r.2).collect();
    lat.sort_by(f64::total_cmp);
    // The replicator observes each create once its version is recorded; a create of another
    // client in the same seconds would count too (the bench topology has none).
    let (repl_p99, repl_n) =
        bucket_quantile_ms(&hist_before, &replicator_histogram(&c).await?, 0.99);
    println!(
        "RESULT links={n} rate={} concurrency={concurrency} creates_per_s={:.0} create_p50_ms={:.0} create_p99_ms={:.0} replicated_per_s={:.0} sampled={} visible_p50_ms={:.0} visible_p99_ms={:.0} visible_max_ms={:.0} replicator_observed={repl_n} replicator_p99_le_ms={repl_p99:.0}",
        rate.map_or_else(|| "closed".into(), |r| r.to_string()),
        n as f64 / last_create,
        pick(&create, 0.5),
        pick(&create, 0.99),
        n as f64 / end,
        lat.len(),
        pick(&lat, 0.5),
        pick(&lat, 0.99),
        lat[lat.len() - 1]
    );
    Ok(())
}
