//! A real browser for tests that look like a person: Debian's headless Chromium driven through
//! ChromeDriver's W3C WebDriver protocol (plain HTTP + JSON, so no client crate), with host
//! names mapped to loopback ports (`--host-resolver-rules`) the way DNS would send a browser.
//! Screenshots go under `.zlink/browser/` for people to look at.

use super::*;
use serde_json::{json, Value};
use std::time::Instant;

/// The element reference key of the W3C protocol.
const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

/// Where the browser tests keep their screenshots (kept after the run).
pub fn screenshot_dir() -> std::path::PathBuf {
    let d = repo_root().join(".zlink/browser");
    std::fs::create_dir_all(&d).expect("screenshot dir");
    d
}

/// How a browser starts.
#[derive(Clone, Default)]
pub struct BrowserOptions {
    /// `(host, "127.0.0.1:port")`: the browser resolves `host` to that address and port.
    pub hosts: Vec<(String, String)>,
    /// JavaScript off (a browser or reader that does not run scripts).
    pub no_javascript: bool,
}

/// One Chromium session behind its own ChromeDriver; both end on drop.
pub struct Browser {
    driver: std::process::Child,
    base: String,
    http: reqwest::Client,
    _profile: TempDir,
    _home: TempDir,
}

/// A home directory whose NSS database (`.pki/nssdb`, where Chromium on Linux reads the user's
/// trust anchors) trusts the test CA for servers, as a person's machine trusts a company CA:
/// the browser then verifies the test nginx's certificates like any other.
fn home_trusting_test_ca() -> TempDir {
    let home = TempDir::new("chromium-home");
    let db = home.path().join(".pki/nssdb");
    std::fs::create_dir_all(&db).unwrap();
    let db = format!("sql:{}", db.display());
    let certutil = |args: &[&str]| {
        let out = std::process::Command::new("certutil")
            .args(args)
            .output()
            .expect("certutil (deploy/local/install installs libnss3-tools)");
        assert!(
            out.status.success(),
            "certutil {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    certutil(&["-N", "--empty-password", "-d", &db]);
    let ca = test_ca_cert().display().to_string();
    certutil(&[
        "-A",
        "-n",
        "zlink test CA",
        "-t",
        "C,,",
        "-i",
        &ca,
        "-d",
        &db,
    ]);
    home
}

impl Browser {
    pub async fn start(opts: BrowserOptions) -> Browser {
        let port = free_port();
        let home = home_trusting_test_ca();
        let driver = std::process::Command::new(chromedriver_bin())
            .env("HOME", home.path())
            .arg(format!("--port={port}"))
            .arg("--allowed-ips=127.0.0.1")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("chromedriver (deploy/local/install installs chromium-driver)");
        let base = format!("http://127.0.0.1:{port}");
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(60))
            .build()
            .unwrap();
        let up = eventually(Duration::from_secs(20), || {
            let (http, u) = (http.clone(), format!("{base}/status"));
            async move { http.get(&u).send().await.is_ok() }
        })
        .await;
        assert!(up, "chromedriver answers on {base}");
        let profile = TempDir::new("chromium-profile");
        let mut args = vec![
            "--headless=new".to_string(),
            "--no-sandbox".into(),
            "--disable-gpu".into(),
            "--disable-dev-shm-usage".into(),
            "--no-first-run".into(),
            "--disable-background-networking".into(),
            "--window-size=1280,1000".into(),
            format!("--user-data-dir={}", profile.path().display()),
        ];
        if !opts.hosts.is_empty() {
            // Every other name fails to resolve: nothing leaves loopback.
            let mut rules: Vec<String> = opts
                .hosts
                .iter()
                .map(|(h, to)| format!("MAP {h} {to}"))
                .collect();
            rules.push("EXCLUDE 127.0.0.1".into());
            rules.push("MAP * ~NOTFOUND".into());
            args.push(format!("--host-resolver-rules={}", rules.join(",")));
        }
        let mut chrome = json!({"binary": chromium_bin(), "args": args});
        if opts.no_javascript {
            chrome["prefs"] = json!({"profile.managed_default_content_settings.javascript": 2});
        }
        let mut b = Browser {
            driver,
            base,
            http,
            _profile: profile,
            _home: home,
        };
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "pageLoadStrategy": "normal",
            "goog:chromeOptions": chrome,
        }}});
        let v = b.call("POST", "/session", Some(caps)).await;
        let id = v["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("new session: {v}"))
            .to_string();
        b.base = format!("{}/session/{id}", b.base);
        b
    }

    async fn call(&self, method: &str, path: &str, body: Option<Value>) -> Value {
        let url = format!("{}{path}", self.base);
        let req = match method {
            "GET" => self.http.get(&url),
            "DELETE" => self.http.delete(&url),
            _ => self.http.post(&url).json(&body.unwrap_or(json!({}))),
        };
        let r = req
            .send()
            .await
            .unwrap_or_else(|e| panic!("{method} {path}: {e}"));
        let v: Value = r.json().await.expect("WebDriver JSON");
        v.get("value").cloned().unwrap_or(v)
    }

    async fn ok(&self, method: &str, path: &str, body: Option<Value>) -> Value {
        let v = self.call(method, path, body).await;
        if let Some(e) = v.get("error") {
            panic!("WebDriver {method} {path}: {e} {}", v["message"]);
        }
        v
    }

    /// Navigates and waits for the page (and any redirects before it) to load.
    pub async fn goto(&self, url: &str) {
        self.ok("POST", "/url", Some(json!({ "url": url }))).await;
    }

    pub async fn url(&self) -> String {
        self.ok("GET", "/url", None)
            .await
            .as_str()
            .unwrap_or_default()
            .to_string()
    }

    /// Waits until the current URL satisfies `f` (meta refreshes navigate after the load).
    pub async fn wait_url(&self, within: Duration, f: impl Fn(&str) -> bool) -> String {
        let end = Instant::now() + within;
        loop {
            let u = self.url().await;
            if f(&u) || Instant::now() > end {
                return u;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Runs a script in the page and returns its value.
    pub async fn eval(&self, script: &str) -> Value {
        self.ok(
            "POST",
            "/execute/sync",
            Some(json!({"script": script, "args": []})),
        )
        .await
    }

    /// The first element matching `css`, waiting up to `within` for it to exist.
    pub async fn find(&self, css: &str, within: Duration) -> Element {
        let end = Instant::now() + within;
        loop {
            let v = self
                .call(
                    "POST",
                    "/element",
                    Some(json!({"using": "css selector", "value": css})),
                )
                .await;
            if let Some(id) = v.get(ELEMENT).and_then(Value::as_str) {
                return Element(id.to_string());
            }
            assert!(Instant::now() < end, "no element {css}: {v}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Like [`find`](Self::find), and waits until the element is displayed too.
    pub async fn find_visible(&self, css: &str, within: Duration) -> Element {
        let end = Instant::now() + within;
        loop {
            let e = self.find(css, within).await;
            let shown = self
                .ok("GET", &format!("/element/{}/displayed", e.0), None)
                .await;
            if shown == Value::Bool(true) {
                return e;
            }
            assert!(Instant::now() < end, "{css} never displayed");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Empties an input.
    pub async fn clear(&self, e: &Element) {
        self.ok("POST", &format!("/element/{}/clear", e.0), None)
            .await;
    }

    pub async fn click(&self, e: &Element) {
        self.ok("POST", &format!("/element/{}/click", e.0), None)
            .await;
    }

    pub async fn type_into(&self, e: &Element, text: &str) {
        self.ok(
            "POST",
            &format!("/element/{}/value", e.0),
            Some(json!({ "text": text })),
        )
        .await;
    }

    pub async fn text(&self, e: &Element) -> String {
        self.ok("GET", &format!("/element/{}/text", e.0), None)
            .await
            .as_str()
            .unwrap_or_default()
            .to_string()
    }

    pub async fn attr(&self, e: &Element, name: &str) -> Option<String> {
        self.ok("GET", &format!("/element/{}/attribute/{name}", e.0), None)
            .await
            .as_str()
            .map(str::to_string)
    }

    /// The page's text, waiting up to `within` until it contains `needle`.
    pub async fn wait_text(&self, css: &str, needle: &str, within: Duration) -> String {
        let end = Instant::now() + within;
        loop {
            // The element may be replaced between finding and reading it (a list redrawn).
            let e = self.find(css, within).await;
            let v = self
                .call("GET", &format!("/element/{}/text", e.0), None)
                .await;
            let t = v.as_str().unwrap_or_default().to_string();
            if t.contains(needle) || Instant::now() > end {
                return t;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Resizes the window (a phone's: 390 × 844).
    pub async fn resize(&self, width: u32, height: u32) {
        self.ok(
            "POST",
            "/window/rect",
            Some(json!({"width": width, "height": height})),
        )
        .await;
    }

    /// A PNG of the window, written to `.zlink/browser/<name>.png`.
    pub async fn screenshot(&self, name: &str) -> std::path::PathBuf {
        use base64::Engine;
        let v = self.ok("GET", "/screenshot", None).await;
        let png = base64::engine::general_purpose::STANDARD
            .decode(v.as_str().expect("base64 PNG"))
            .expect("base64");
        let path = screenshot_dir().join(format!("{name}.png"));
        std::fs::write(&path, png).expect("write screenshot");
        path
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        // Ends Chromium (the session) and then its driver.
        let (http, url) = (self.http.clone(), self.base.clone());
        let _ = std::thread::spawn(move || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .ok()
                .map(|rt| rt.block_on(async { http.delete(&url).send().await }))
        })
        .join();
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

/// A WebDriver element reference.
pub struct Element(String);

fn chromium_bin() -> String {
    std::env::var("ZLINK_CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".into())
}

fn chromedriver_bin() -> String {
    std::env::var("ZLINK_CHROMEDRIVER").unwrap_or_else(|_| "/usr/bin/chromedriver".into())
}

/// A destination site for links to lead to: answers every GET with a small HTML page naming the
/// path, and records each request's path and User-Agent.
pub struct Destination {
    pub port: u16,
    pub hits: std::sync::Arc<std::sync::Mutex<Vec<(String, String)>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Destination {
    pub async fn start() -> Destination {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = l.local_addr().unwrap().port();
        let hits = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let h = hits.clone();
        let task = tokio::spawn(async move {
            while let Ok((mut s, _)) = l.accept().await {
                let h = h.clone();
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    let mut chunk = [0u8; 4096];
                    while !buf.windows(4).any(|w| w == b"\r\n\r\n") && buf.len() < 65536 {
                        match s.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    }
                    let head = String::from_utf8_lossy(&buf).to_string();
                    let path = head.split(' ').nth(1).unwrap_or("").to_string();
                    let ua = head
                        .lines()
                        .find_map(|l| {
                            l.strip_prefix("User-Agent: ")
                                .or(l.strip_prefix("user-agent: "))
                        })
                        .unwrap_or("")
                        .to_string();
                    h.lock().unwrap().push((path.clone(), ua));
                    let body = format!(
                        "<!doctype html><title>Destination</title><h1 id=\"landed\">landed on {}</h1>",
                        path.replace('&', "&amp;").replace('<', "&lt;")
                    );
                    let resp = format!(
                        "HTTP/1.1 200 OK\r\ncontent-type: text/html; charset=utf-8\r\n\
                         content-length: {}\r\nconnection: close\r\n\r\n{body}",
                        body.len()
                    );
                    let _ = s.write_all(resp.as_bytes()).await;
                });
            }
        });
        Destination { port, hits, task }
    }

    /// Paths requested by a browser (HeadlessChrome) so far.
    pub fn browser_paths(&self) -> Vec<String> {
        self.hits
            .lock()
            .unwrap()
            .iter()
            .filter(|(_, ua)| ua.contains("Chrome"))
            .map(|(p, _)| p.clone())
            .collect()
    }
}

impl Drop for Destination {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The text of the one QR code in a grayscale PNG (what a phone's camera would read).
pub fn read_qr(png_bytes: &[u8]) -> String {
    let decoder = png::Decoder::new(std::io::Cursor::new(png_bytes));
    let mut reader = decoder.read_info().expect("a PNG");
    let mut buf = vec![0; reader.output_buffer_size()];
    let info = reader.next_frame(&mut buf).expect("a frame");
    assert_eq!(info.color_type, png::ColorType::Grayscale);
    read_qr_pixels(info.width as usize, info.height as usize, &buf)
}

/// The text of the one QR code in `w` × `h` grayscale pixels, row by row.
pub fn read_qr_pixels(w: usize, h: usize, gray: &[u8]) -> String {
    let mut img = rqrr::PreparedImage::prepare_from_greyscale(w, h, |x, y| gray[y * w + x]);
    let grids = img.detect_grids();
    assert_eq!(grids.len(), 1, "one QR code in the image");
    grids[0].decode().expect("decodes").1
}
