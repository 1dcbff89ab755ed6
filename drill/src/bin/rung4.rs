//! The rung-4 drill: the service's DNS name is moved from the frontend to the last-resort host
//! and back, and a browser's view is checked at each step — resolve the name through the DNS
//! server, follow a link on the address it gave:
//!
//! 1. a new link, created through the API;
//! 2. DNS → frontend: the link redirects from rung 1 (`x-zlink-tier: primary`);
//! 3. DNS → last-resort host (`--flip-cmd lastresort`): once the answer changes (within the
//!    record's TTL), the link is served there directly (`lastresort` or `lastresort-nginx`),
//!    with the same destination;
//! 4. the frontend is stopped (`--frontend-down-cmd`): the link is still served through the
//!    name, and the frontend's address no longer answers;
//! 5. the frontend back, DNS → frontend: rung 1 again.
//!
//! With `--tls-port` each step is checked over HTTPS too, as a browser following an `https://`
//! link would: the certificate the site presents for the name verified against `--ca-file`.
//!
//! Exit status 0 when every step gave the right answer. Only 127.0.0.0/8 (and the project's
//! own network namespaces' 10.231.0.0/16) is contacted.

use anyhow::{bail, ensure, Context, Result};
use clap::Parser;
use std::net::{Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};
use zlink_probe::dns;

#[derive(Parser, Debug)]
#[command(name = "rung4", about = "zlink rung-4 (DNS failover) drill")]
struct Args {
    /// The frontend's API (the link is created there).
    #[arg(long, env = "ZLINK_FRONTEND")]
    frontend: String,
    #[arg(long, env = "ZLINK_ADMIN_KEY", hide_env_values = true)]
    admin_key: String,
    /// The DNS server that answers for the name.
    #[arg(long)]
    dns: SocketAddr,
    /// The service's name.
    #[arg(long, default_value = "go.zlink.test")]
    name: String,
    /// The port both sites serve the name on.
    #[arg(long)]
    port: u16,
    /// The port both sites serve the name on over HTTPS (none: HTTP only).
    #[arg(long, requires = "ca_file")]
    tls_port: Option<u16>,
    /// The CA that issued the sites' certificates (PEM), the only one trusted.
    #[arg(long)]
    ca_file: Option<std::path::PathBuf>,
    /// The sites answer plain HTTP with a redirect to HTTPS: every step over HTTPS only.
    #[arg(long, requires = "tls_port")]
    https_only: bool,
    /// Points the name at a site; `{site}` is `frontend` or `lastresort`.
    #[arg(long, default_value = "deploy/local/ctl dns {site}")]
    flip_cmd: String,
    /// Stops the frontend tier (empty: step 4 is left out).
    #[arg(long, default_value = "deploy/local/ctl stop nginx-frontend")]
    frontend_down_cmd: String,
    /// Starts it again and returns once it is ready.
    #[arg(long, default_value = "deploy/local/ctl start nginx-frontend")]
    frontend_up_cmd: String,
}

fn run(cmd: &str) -> Result<()> {
    let status = std::process::Command::new("bash")
        .arg("-c")
        .arg(cmd)
        .stdout(std::process::Stdio::null())
        .status()
        .with_context(|| format!("running {cmd:?}"))?;
    ensure!(status.success(), "{cmd:?} failed: {status}");
    Ok(())
}

/// Only the machine itself: loopback, or the links of the project's own network namespaces
/// (10.231.0.0/16, deploy/local/lib.sh).
fn only_loopback(addr: Ipv4Addr) -> Result<Ipv4Addr> {
    let ours = addr.is_loopback() || addr.octets()[..2] == [10, 231];
    ensure!(
        ours,
        "{addr} is neither 127.0.0.0/8 nor 10.231.0.0/16: not contacting it"
    );
    Ok(addr)
}

/// What the name resolves to now, through the DNS server (in a blocking task: std UDP).
async fn resolve(a: &Args) -> Result<dns::A> {
    let (server, name) = (a.dns, a.name.clone());
    let answer =
        tokio::task::spawn_blocking(move || dns::resolve_a(server, &name, Duration::from_secs(2)))
            .await??;
    answer.with_context(|| format!("{} has no A record", a.name))
}

/// How a step is checked: plain HTTP on `--port`, or HTTPS on `--tls-port`.
#[derive(Clone, Copy, Debug)]
enum Scheme {
    Http,
    Https,
}

/// The schemes every step is checked in.
fn schemes(a: &Args) -> Vec<Scheme> {
    match (a.tls_port, a.https_only) {
        (Some(_), true) => vec![Scheme::Https],
        (Some(_), false) => vec![Scheme::Http, Scheme::Https],
        (None, _) => vec![Scheme::Http],
    }
}

/// One request as a browser on a fresh connection would make it: `GET /slug` on the address
/// the name resolved to, with the name as Host (and, over HTTPS, as the server name whose
/// certificate must verify). Returns (status, Location or refresh URL, tier).
async fn follow(
    a: &Args,
    scheme: Scheme,
    addr: Ipv4Addr,
    slug: &str,
) -> Result<(u16, String, String)> {
    let mut client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(Duration::from_secs(5));
    let (name, port) = match (scheme, a.tls_port, ca(a)?) {
        (Scheme::Https, Some(port), Some(ca)) => {
            client = client
                .tls_built_in_root_certs(false)
                .add_root_certificate(ca)
                .https_only(true);
            ("https", port)
        }
        (Scheme::Https, ..) => bail!("HTTPS needs --tls-port and --ca-file"),
        (Scheme::Http, ..) => ("http", a.port),
    };
    let client = client
        .resolve(&a.name, SocketAddr::from((only_loopback(addr)?, port)))
        .build()?;
    let r = client
        .get(format!("{name}://{}:{port}/{slug}", a.name))
        .send()
        .await?;
    let status = r.status().as_u16();
    let header = |n: &str| {
        r.headers()
            .get(n)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string()
    };
    let (location, tier) = (header("location"), header("x-zlink-tier"));
    let body = r.bytes().await.unwrap_or_default();
    // Rung 3 answers 200 with the meta-refresh page from S3: its target is the destination
    // (read strictly, as the replicator wrote it).
    let target = if location.is_empty() {
        zlink_wire::blob::parse(&body)
            .map(|b| b.url)
            .unwrap_or_default()
    } else {
        location
    };
    Ok((status, target, tier))
}

/// Polls (at most `within`) until the link on `addr` answers with `url` from one of `tiers`,
/// in every scheme checked.
async fn served(
    a: &Args,
    addr: Ipv4Addr,
    slug: &str,
    url: &str,
    tiers: &[&str],
    within: Duration,
) -> Result<String> {
    let mut got = Vec::new();
    for scheme in schemes(a) {
        let one = served_in(a, scheme, addr, slug, url, tiers, within).await?;
        got.push(format!("{scheme:?}: {one}"));
    }
    Ok(got.join("; "))
}

async fn served_in(
    a: &Args,
    scheme: Scheme,
    addr: Ipv4Addr,
    slug: &str,
    url: &str,
    tiers: &[&str],
    within: Duration,
) -> Result<String> {
    let since = Instant::now();
    loop {
        let last = match follow(a, scheme, addr, slug).await {
            Ok((status, target, tier)) => {
                let redirect = (300..400).contains(&status) || status == 200;
                if redirect && target == url && tiers.contains(&tier.as_str()) {
                    return Ok(format!(
                        "{status} from {tier} after {} ms",
                        since.elapsed().as_millis()
                    ));
                }
                format!("{status} tier={tier:?} target={target:?}")
            }
            Err(e) => format!("{e:#}"),
        };
        if since.elapsed() > within {
            bail!(
                "{addr} ({scheme:?}): /{slug} not served by {tiers:?} within {within:?}; last: {last}"
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Flips the name to `site` and waits (at most TTL + 5 s) until the DNS server answers
/// something other than `old` (or, for the first flip, anything).
async fn flip(a: &Args, site: &str, old: Option<Ipv4Addr>) -> Result<dns::A> {
    let since = Instant::now();
    run(&a.flip_cmd.replace("{site}", site))?;
    loop {
        let now = resolve(a).await?;
        if Some(now.addr) != old {
            println!(
                "rung4: {} -> {} ({site}), TTL {} s, {} ms after the flip",
                a.name,
                now.addr,
                now.ttl,
                since.elapsed().as_millis()
            );
            return Ok(now);
        }
        ensure!(
            since.elapsed() < Duration::from_secs(u64::from(now.ttl) + 5),
            "{} still answers {} after the flip to {site}",
            a.name,
            now.addr
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The CA of `--ca-file` as a root certificate.
fn ca(a: &Args) -> Result<Option<reqwest::Certificate>> {
    let Some(path) = &a.ca_file else {
        return Ok(None);
    };
    let pem = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    Ok(Some(reqwest::Certificate::from_pem(&pem)?))
}

async fn create(a: &Args, slug: &str, url: &str) -> Result<()> {
    let mut client = reqwest::Client::builder().timeout(Duration::from_secs(10));
    if let Some(ca) = ca(a)? {
        client = client.add_root_certificate(ca);
    }
    let client = client.build()?;
    let base = a.frontend.trim_end_matches('/');
    let since = Instant::now();
    loop {
        let r = client
            .post(format!("{base}/api/v1/links"))
            .bearer_auth(&a.admin_key)
            .header("idempotency-key", slug)
            .json(&serde_json::json!({"url": url, "slug": slug}))
            .send()
            .await
            .context("creating the rung-4 link")?;
        if r.status().as_u16() == 201 {
            return Ok(());
        }
        ensure!(
            r.status().is_server_error() && since.elapsed() < Duration::from_secs(30),
            "creating {slug}: {}",
            r.status()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<()> {
    let a = Args::parse();
    let run_id = uuid::Uuid::new_v4().simple().to_string();
    let slug = format!("rung4-{}", &run_id[..10]);
    let url = format!("https://example.com/rung4/{run_id}?a=1&b=2");
    create(&a, &slug, &url).await?;
    // ε (5 s) for the link to reach S3 and so the last-resort host, with room to spare.
    let eps = Duration::from_secs(30);

    let front = flip(&a, "frontend", None).await?;
    let got = served(&a, front.addr, &slug, &url, &["primary"], eps).await?;
    println!("rung4: via the frontend ({}): {got}", front.addr);

    let lr = flip(&a, "lastresort", Some(front.addr)).await?;
    let last_resort = ["lastresort", "lastresort-nginx"];
    let got = served(&a, lr.addr, &slug, &url, &last_resort, eps).await?;
    println!("rung4: via the last-resort host ({}): {got}", lr.addr);

    let result = async {
        if !a.frontend_down_cmd.is_empty() {
            run(&a.frontend_down_cmd)?;
            let gone = follow(&a, Scheme::Http, front.addr, &slug).await;
            ensure!(gone.is_err(), "the frontend still answers: {gone:?}");
            let now = resolve(&a).await?;
            let got = served(&a, now.addr, &slug, &url, &last_resort, eps).await?;
            println!("rung4: frontend down, via {} ({}): {got}", a.name, now.addr);
        }
        Ok(())
    }
    .await;
    // Whatever happened: the frontend back, the name back on it.
    if !a.frontend_down_cmd.is_empty() {
        run(&a.frontend_up_cmd)?;
    }
    let back = flip(&a, "frontend", Some(lr.addr)).await?;
    result?;
    let got = served(&a, back.addr, &slug, &url, &["primary"], eps).await?;
    println!("rung4: back on the frontend ({}): {got}", back.addr);
    println!("rung4: PASSED");
    Ok(())
}
