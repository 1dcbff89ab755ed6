//! Real nginx from the `nginx/` templates (both tiers), rendered for a test's upstreams.

use super::*;

/// nginx `server` lines for an upstream block: one per address, each with `extra` parameters.
pub fn upstream_servers(addrs: &[String], extra: &str) -> String {
    addrs
        .iter()
        .map(|a| format!("        server {a} {extra};"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Upstream lines for a port nothing listens on: a last-resort host whose processes are all
/// down (rung 3), or a frontend's last-resort host that is not there.
pub fn dead_server() -> String {
    upstream_servers(
        &[format!("127.0.0.1:{}", free_port())],
        "max_fails=1 fail_timeout=5s",
    )
}

/// `host:port` of a `http://host:port` or `https://host:port` base URL.
pub fn hostport(base: &str) -> String {
    base.trim_start_matches("http://")
        .trim_start_matches("https://")
        .to_string()
}

/// Placeholder values of nginx/lastresort.conf for a last-resort host in front of
/// `lastresort_servers` (upstream lines), reading S3 under `prefix`, logging rung-3 clicks to
/// `click_log`. Timeouts come from nginx/lastresort.budgets.
pub fn lastresort_host_values(
    lastresort_servers: String,
    infra: &Infra,
    prefix: &str,
    click_log: &str,
) -> Vec<(&'static str, String)> {
    vec![
        ("LASTRESORT_SERVERS", lastresort_servers),
        ("TRUSTED_PROXIES", "127.0.0.0/8".into()),
        // S3 over HTTPS, verified against the test servers' CA (S3's certificate names
        // localhost: nginx matches DNS names, not addresses).
        ("S3_SCHEME", "https".into()),
        ("S3_HOSTPORT", hostport(&infra.s3_tls_endpoint)),
        ("S3_CA", infra.s3_ca_file.clone()),
        ("S3_TLS_NAME", "localhost".into()),
        ("S3_BUCKET", infra.s3_bucket.clone()),
        ("S3_PREFIX", prefix.to_string()),
        (
            "STATIC",
            repo_root().join("nginx/static").display().to_string(),
        ),
        ("CLICK_LOG", click_log.to_string()),
        // The default domain's names beyond IP literals and localhost (see `default_hosts`).
        ("DEFAULT_HOSTS", String::new()),
    ]
}

/// A last-resort host of a test's own: one lastresort process (clicks spooled, its nginx's
/// rung-3 click log ingested, `short_domains` the default domain's names) behind that host's
/// nginx, serving S3 under `prefix`. [`LastResortHost::start`] also returns the process, which
/// a test kills to reach rung 3; [`LastResortHost::lastresort`] starts another one with the same
/// spool and click log.
pub struct LastResortHost {
    pub nginx: OwnNginx,
    /// The host nginx's rung-3 click log.
    pub click_log: String,
    prefix: String,
    flags: Vec<String>,
    _spool: TempDir,
    _click_dir: TempDir,
}

impl LastResortHost {
    pub async fn start(
        infra: &Infra,
        prefix: &str,
        clicks_topic: &str,
        short_domains: &[&str],
    ) -> (LastResortHost, ServiceProcess) {
        let spool = TempDir::new("lr-host-spool");
        let click_dir = TempDir::new("lr-host-clicklog");
        let click_log = click_dir.path().join("clicks.json").display().to_string();
        let mut flags = vec![
            "--clicks-topic".to_string(),
            clicks_topic.to_string(),
            "--spool-dir".into(),
            spool.path().display().to_string(),
            "--nginx-click-log".into(),
            click_log.clone(),
        ];
        if !short_domains.is_empty() {
            flags.extend(["--short-domains".to_string(), short_domains.join(",")]);
        }
        let lr = Self::spawn(infra, prefix, &flags).await;
        let mut values = lastresort_host_values(
            upstream_servers(&[hostport(&lr.base)], "max_fails=1 fail_timeout=5s"),
            infra,
            prefix,
            &click_log,
        );
        values.push(("DEFAULT_HOSTS", default_hosts(short_domains)));
        let nginx = OwnNginx::start("lastresort.conf", &values).await;
        let host = LastResortHost {
            nginx,
            click_log,
            prefix: prefix.to_string(),
            flags,
            _spool: spool,
            _click_dir: click_dir,
        };
        (host, lr)
    }

    /// Another lastresort process on this host's spool and click log (the host nginx's
    /// upstream keeps the first one's address).
    pub async fn lastresort(&self, infra: &Infra) -> ServiceProcess {
        Self::spawn(infra, &self.prefix, &self.flags).await
    }

    async fn spawn(infra: &Infra, prefix: &str, flags: &[String]) -> ServiceProcess {
        let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
        ServiceProcess::lastresort(infra, &infra.s3_tls_endpoint, prefix, &flags).await
    }
}

/// `DEFAULT_HOSTS` of nginx/lastresort.conf for these names (what `up` renders from
/// ZLINK_SHORT_DOMAINS).
pub fn default_hosts(names: &[&str]) -> String {
    names
        .iter()
        .map(|n| format!("        \"{n}\" \"\";"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// An nginx of the test's own, from a template in `nginx/` rendered by `zlink_xtask::nginx`
/// (the same renderer `up` uses) and checked with `nginx -t` before it starts.
pub struct OwnNginx {
    pub base: String,
    /// Its HTTPS listener's port on 127.0.0.1: the same server over TLS (the test CA's
    /// certificate).
    pub tls_port: u16,
    pub dir: TempDir,
    child: std::process::Child,
}

pub fn nginx_bin() -> String {
    ["/usr/sbin/nginx", "/usr/local/sbin/nginx"]
        .into_iter()
        .find(|p| std::path::Path::new(p).exists())
        .unwrap_or("nginx")
        .to_string()
}

/// The tests' certificate authority (`zlink_xtask::tls`, as `up`'s): one per test process,
/// its `ca.crt` the one root the tests' HTTPS clients and the browser trust.
pub fn test_ca() -> &'static std::path::Path {
    static CA: std::sync::OnceLock<TempDir> = std::sync::OnceLock::new();
    CA.get_or_init(|| {
        let dir = TempDir::new("ca");
        zlink_xtask::tls::ensure_ca(dir.path()).expect("test CA");
        dir
    })
    .path()
}

/// The CA's certificate file.
pub fn test_ca_cert() -> std::path::PathBuf {
    zlink_xtask::tls::ca_cert(test_ca())
}

/// Who reads a certificate besides its owner: nginx's workers, `nobody` when the tests run as
/// root (as in CI), else the owner itself.
fn nginx_readers() -> zlink_xtask::tls::Readers {
    static READERS: std::sync::OnceLock<zlink_xtask::tls::Readers> = std::sync::OnceLock::new();
    *READERS.get_or_init(find_nginx_readers)
}

fn find_nginx_readers() -> zlink_xtask::tls::Readers {
    let id = |args: &[&str]| {
        std::process::Command::new("id")
            .args(args)
            .output()
            .ok()
            .and_then(|o| String::from_utf8(o.stdout).ok())
            .and_then(|s| s.trim().parse::<u32>().ok())
    };
    match (id(&["-u"]), id(&["-g", "nobody"])) {
        (Some(0), Some(gid)) => zlink_xtask::tls::Readers::Group(gid),
        _ => zlink_xtask::tls::Readers::Owner,
    }
}

/// Issues a certificate from the test CA for `names` into `tls_dir`: the default domain's
/// (`tls-combined.pem`) when `domain` is None, else `<domain>/tls-combined.pem`.
pub fn issue_cert(tls_dir: &std::path::Path, domain: Option<&str>, names: &[&str], days: i64) {
    let out = match domain {
        Some(d) => tls_dir.join(d).join("tls-combined.pem"),
        None => tls_dir.join("tls-combined.pem"),
    };
    let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
    zlink_xtask::tls::issue(test_ca(), &out, &names, days, nginx_readers())
        .unwrap_or_else(|e| panic!("issuing {names:?}: {e:#}"));
}

/// The names on every test nginx's default certificate.
pub const DEFAULT_CERT_NAMES: [&str; 3] = ["localhost", "127.0.0.1", "go.zlink.test"];

/// Renders `template` (a file of `nginx/`) into `dir` with `values` plus RUN, LOGS, LISTEN and
/// HTTPS (TLS_LISTEN on `tls_port`, the default certificate from the test CA in `dir/tls`), and
/// runs `nginx -t` on it. Returns the config path.
pub fn render_nginx(
    template: &str,
    dir: &std::path::Path,
    port: u16,
    tls_port: u16,
    values: &[(&str, String)],
) -> std::path::PathBuf {
    let logs = dir.join("logs");
    std::fs::create_dir_all(&logs).unwrap();
    for t in ["nginx-frontend-tmp", "nginx-lastresort-tmp"] {
        std::fs::create_dir_all(dir.join(t)).unwrap();
    }
    let out = dir.join(template);
    let mut all = vec![
        ("RUN".to_string(), dir.display().to_string()),
        ("LOGS".to_string(), logs.display().to_string()),
        ("LISTEN".to_string(), format!("127.0.0.1:{port}")),
    ];
    // 127.0.0.1 is the exempt load generator, as in the local topology, unless the test says.
    if !values.iter().any(|(k, _)| *k == "RATE_LIMIT_EXEMPT") {
        all.push(("RATE_LIMIT_EXEMPT".into(), "127.0.0.1".into()));
    }
    // The connection guard's stream module: a dynamic module on Debian (as `up` loads it).
    let stream = "/usr/lib/nginx/modules/ngx_stream_module.so";
    if std::path::Path::new(stream).exists() {
        all.push(("MODULES".into(), format!("load_module {stream};")));
    }
    if !values.iter().any(|(k, _)| *k == "STATUS_LISTEN") {
        all.push(("STATUS_LISTEN".into(), format!("127.0.0.1:{}", free_port())));
    }
    let tls_dir = dir.join("tls");
    issue_cert(&tls_dir, None, &DEFAULT_CERT_NAMES, 30);
    let given = |k: &str| values.iter().any(|(n, _)| *n == k);
    all.push(("TLS_LISTEN".into(), format!("127.0.0.1:{tls_port}")));
    all.push(("TLS_DIR".into(), tls_dir.display().to_string()));
    all.push((
        "HTTPS_PORTS".into(),
        format!("        {port} \":{tls_port}\";"),
    ));
    if !given("HTTPS_ONLY") {
        all.push(("HTTPS_ONLY".into(), "off".into()));
    }
    if template == "frontend.conf" {
        all.push(("TLS_CA".into(), test_ca_cert().display().to_string()));
        all.push(("LASTRESORT_TLS_NAME".into(), "localhost".into()));
        if !given("DEFAULT_HOSTS") {
            all.push(("DEFAULT_HOSTS".into(), String::new()));
        }
    }
    all.extend(values.iter().map(|(k, v)| (k.to_string(), v.clone())));
    zlink_xtask::nginx::render_to(&repo_root().join("nginx").join(template), &out, &all)
        .unwrap_or_else(|e| panic!("rendering {template}: {e:#}"));
    let t = std::process::Command::new(nginx_bin())
        .args(["-t", "-q", "-p"])
        .arg(dir)
        .arg("-c")
        .arg(&out)
        .arg("-e")
        .arg(logs.join("error.log"))
        .output()
        .expect("nginx -t");
    assert!(
        t.status.success(),
        "nginx -t {template}: {}",
        String::from_utf8_lossy(&t.stderr)
    );
    out
}

impl OwnNginx {
    pub async fn start(template: &str, values: &[(&str, String)]) -> OwnNginx {
        let dir = TempDir::new("nginx");
        let port = free_port();
        let tls_port = free_port();
        let conf = render_nginx(template, dir.path(), port, tls_port, values);
        let child = std::process::Command::new(nginx_bin())
            .arg("-p")
            .arg(dir.path())
            .arg("-c")
            .arg(&conf)
            .arg("-e")
            .arg(dir.path().join("logs/error.log"))
            .args(["-g", "daemon off;"])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("nginx");
        let base = format!("http://127.0.0.1:{port}");
        assert!(
            eventually_ok(&format!("{base}/nginx-health"), Duration::from_secs(10)).await,
            "nginx {template} up"
        );
        OwnNginx {
            base,
            tls_port,
            dir,
            child,
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// `https://127.0.0.1:<tls port>`.
    pub fn https_base(&self) -> String {
        format!("https://{}", self.tls_hostport())
    }

    /// `host:port` of its HTTPS listener (an upstream for a frontend's failover hop).
    pub fn tls_hostport(&self) -> String {
        format!("127.0.0.1:{}", self.tls_port)
    }

    /// Its certificate directory: a test places a branded domain's certificate here.
    pub fn tls_dir(&self) -> std::path::PathBuf {
        self.dir.path().join("tls")
    }

    /// A log file of this nginx (under its `logs/`).
    pub fn log(&self, name: &str) -> std::path::PathBuf {
        self.dir.path().join("logs").join(name)
    }

    /// Its JSON access log so far, one value per line (nginx flushes the buffer each second,
    /// so this polls until at least `min` lines are there).
    pub async fn access_log(&self, name: &str, min: usize) -> Vec<serde_json::Value> {
        let path = self.log(name);
        let mut lines = Vec::new();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while tokio::time::Instant::now() < deadline {
            lines = std::fs::read_to_string(&path)
                .unwrap_or_default()
                .lines()
                .map(|l| serde_json::from_str(l).expect("JSON log line"))
                .collect();
            if lines.len() >= min {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        lines
    }
}

impl Drop for OwnNginx {
    /// SIGTERM: the master stops its workers (SIGKILL would orphan them).
    fn drop(&mut self) {
        let _ = std::process::Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let _ = self.child.wait();
    }
}
