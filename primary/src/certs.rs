//! Whether each site serves a branded domain's certificate (docs/design/tls.md): the domain
//! API's `https` field. A domain is servable over HTTPS on every rung only once every site
//! (the frontend and each last-resort site, `--tls-sites`) presents a valid certificate for
//! it, so the check is what a browser does: a TLS handshake to the site's HTTPS listener with
//! the domain as server name, the chain verified against the system's roots (and
//! `--tls-ca-file`). Results are kept `--tls-check-cache-secs`, so a listing costs at most one
//! handshake per domain and site in that window; each handshake has a deadline.

use futures_util::future::join_all;
use rustls::pki_types::ServerName;
use serde::Serialize;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use utoipa::ToSchema;

/// One site's answer for one domain.
#[derive(Debug, Clone, Serialize, ToSchema, PartialEq, Eq)]
pub struct SiteCertificate {
    /// The site's name (`--tls-sites`).
    pub site: String,
    /// `valid`: a certificate for the domain that verifies; `missing`: the site refused the
    /// handshake for this name (it holds no certificate for it); `invalid`: a certificate that
    /// does not verify (another name, expired, unknown issuer); `unreachable`: no TLS answer
    /// within the deadline.
    pub state: &'static str,
    /// The certificate's expiry (RFC 3339), when valid.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub not_after: Option<String>,
    /// Why it is not valid, as the TLS library says it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

/// A domain's HTTPS state on every site.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct DomainHttps {
    /// Every site serves a valid certificate for the domain.
    pub servable: bool,
    pub sites: Vec<SiteCertificate>,
}

/// The sites to check and how.
pub struct CertChecks {
    sites: Vec<(String, String)>,
    /// Per site, until when (ms since the epoch) it counts as unreachable without a new try:
    /// a site that did not answer costs one deadline per window, not one per domain.
    down_until: Vec<AtomicU64>,
    connector: TlsConnector,
    deadline: Duration,
    /// None with a zero `--tls-check-cache-secs`: every look is a new check.
    cache: Option<moka::future::Cache<String, Arc<DomainHttps>>>,
}

/// `NAME=HOST:PORT` items of `--tls-sites`.
pub fn parse_sites(items: &[String]) -> Result<Vec<(String, String)>, String> {
    items
        .iter()
        .map(|item| {
            let (name, addr) = item
                .split_once('=')
                .ok_or_else(|| format!("--tls-sites: {item:?} is not NAME=HOST:PORT"))?;
            let name_ok = !name.is_empty()
                && name.len() <= 64
                && name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
            let port_ok = addr
                .rsplit_once(':')
                .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok());
            if !name_ok || !port_ok {
                return Err(format!("--tls-sites: {item:?} is not NAME=HOST:PORT"));
            }
            Ok((name.to_string(), addr.to_string()))
        })
        .collect()
}

impl CertChecks {
    /// `None` without sites (the API then shows no `https` field).
    pub fn new(
        sites: Vec<(String, String)>,
        ca_file: Option<&std::path::Path>,
        deadline: Duration,
        cache_for: Duration,
    ) -> Result<Option<Self>, String> {
        if sites.is_empty() {
            return Ok(None);
        }
        let mut roots = rustls::RootCertStore::empty();
        // The system's roots (a public ACME CA's chain verifies against them).
        let native = rustls_native_certs::load_native_certs();
        roots.add_parsable_certificates(native.certs);
        if let Some(path) = ca_file {
            zlink_clients::tls::read_ca_file("--tls-ca-file", path, &mut roots)?;
        }
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("TLS client: {e}"))?
            .with_root_certificates(roots)
            .with_no_client_auth();
        Ok(Some(CertChecks {
            down_until: sites.iter().map(|_| AtomicU64::new(0)).collect(),
            sites,
            connector: TlsConnector::from(Arc::new(config)),
            deadline,
            cache: (!cache_for.is_zero()).then(|| {
                moka::future::Cache::builder()
                    .max_capacity(10_000)
                    .time_to_live(cache_for)
                    .build()
            }),
        }))
    }

    /// `domain`'s state on every site (a normalised domain name), from the cache when fresh.
    pub async fn of(&self, domain: &str) -> Arc<DomainHttps> {
        match &self.cache {
            Some(c) => c.get_with(domain.to_string(), self.check_all(domain)).await,
            None => self.check_all(domain).await,
        }
    }

    async fn check_all(&self, domain: &str) -> Arc<DomainHttps> {
        // All sites at once (a handful), each within the deadline.
        let sites: Vec<SiteCertificate> = join_all(
            self.sites
                .iter()
                .enumerate()
                .map(|(i, (site, addr))| self.check(i, site, addr, domain)),
        )
        .await;
        Arc::new(DomainHttps {
            servable: sites.iter().all(|s| s.state == "valid"),
            sites,
        })
    }

    /// Forget `domain`'s state (a registration wants a fresh look).
    pub async fn invalidate(&self, domain: &str) {
        if let Some(c) = &self.cache {
            c.invalidate(domain).await;
        }
    }

    async fn check(&self, i: usize, site: &str, addr: &str, domain: &str) -> SiteCertificate {
        let answer = |state, not_after, detail| SiteCertificate {
            site: site.to_string(),
            state,
            not_after,
            detail,
        };
        let now = now_ms();
        if self.down_until[i].load(Ordering::Relaxed) > now {
            let why = "no TLS answer at the last try; tried again within 30 s";
            return answer("unreachable", None, Some(why.into()));
        }
        let unreachable = |detail: String| {
            self.down_until[i].store(now_ms() + DOWN_FOR_MS, Ordering::Relaxed);
            answer("unreachable", None, Some(detail))
        };
        let Ok(name) = ServerName::try_from(domain.to_string()) else {
            return answer("invalid", None, Some("not a TLS server name".into()));
        };
        let handshake = async {
            let tcp = TcpStream::connect(addr).await.map_err(Failure::Connect)?;
            self.connector
                .connect(name, tcp)
                .await
                .map_err(Failure::Handshake)
        };
        match tokio::time::timeout(self.deadline, handshake).await {
            Err(_) => unreachable("no TLS answer in time".into()),
            Ok(Err(Failure::Connect(e))) => unreachable(e.to_string()),
            Ok(Err(Failure::Handshake(e))) => {
                let state = match e
                    .get_ref()
                    .and_then(|inner| inner.downcast_ref::<rustls::Error>())
                {
                    Some(rustls::Error::InvalidCertificate(_)) => "invalid",
                    // The site closed or refused the handshake for this name: it has no
                    // certificate for it (nginx fails a handshake whose certificate file is
                    // missing; it never falls back to another domain's).
                    Some(rustls::Error::AlertReceived(_)) => "missing",
                    None if e.kind() == std::io::ErrorKind::UnexpectedEof => "missing",
                    _ => "invalid",
                };
                answer(state, None, Some(e.to_string()))
            }
            Ok(Ok(tls)) => {
                let not_after = tls
                    .get_ref()
                    .1
                    .peer_certificates()
                    .and_then(|chain| chain.first())
                    .and_then(|leaf| not_after(leaf.as_ref()));
                answer("valid", not_after, None)
            }
        }
    }
}

/// How long a site that did not answer counts as unreachable without a new try.
const DOWN_FOR_MS: u64 = 30_000;

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

enum Failure {
    Connect(std::io::Error),
    Handshake(std::io::Error),
}

/// The expiry of a DER certificate, RFC 3339: `tbsCertificate.validity.notAfter` (RFC 5280),
/// read by walking the DER to it. Twenty lines of ours instead of an X.509 parser and its
/// dependency tree, for one field of a certificate the handshake has already verified.
fn not_after(der: &[u8]) -> Option<String> {
    let (0x30, cert, _) = tlv(der)? else {
        return None;
    };
    let (0x30, tbs, _) = tlv(cert)? else {
        return None;
    };
    // [0] version (absent for v1), then serialNumber, signature and issuer before validity.
    let (tag, _, after_version) = tlv(tbs)?;
    let mut rest = if tag == 0xa0 { after_version } else { tbs };
    for _ in 0..3 {
        rest = tlv(rest)?.2;
    }
    let (0x30, validity, _) = tlv(rest)? else {
        return None;
    };
    let (tag, time, _) = tlv(tlv(validity)?.2)?;
    let text = std::str::from_utf8(time).ok()?;
    let full = match tag {
        // UTCTime YYMMDDHHMMSSZ: years 50-99 are 19xx (RFC 5280 4.1.2.5.1).
        0x17 => {
            let yy: u32 = text.get(..2)?.parse().ok()?;
            format!(
                "{}{}",
                if yy >= 50 { 1900 + yy } else { 2000 + yy },
                text.get(2..)?
            )
        }
        // GeneralizedTime YYYYMMDDHHMMSSZ.
        0x18 => text.to_string(),
        _ => return None,
    };
    let t = chrono::NaiveDateTime::parse_from_str(&full, "%Y%m%d%H%M%SZ").ok()?;
    Some(t.and_utc().to_rfc3339())
}

/// The DER element at the start of `b`: (tag, contents, what follows).
fn tlv(b: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, rest) = b.split_first()?;
    let (&first, rest) = rest.split_first()?;
    let (len, rest) = if first < 0x80 {
        (usize::from(first), rest)
    } else {
        let n = usize::from(first & 0x7f);
        if n == 0 || n > 4 || rest.len() < n {
            return None;
        }
        let len = rest[..n]
            .iter()
            .fold(0usize, |acc, &b| (acc << 8) | usize::from(b));
        (len, &rest[n..])
    };
    (rest.len() >= len).then(|| (tag, &rest[..len], &rest[len..]))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An openssl-made certificate (`openssl req -x509 -days 30`, notAfter as UTCTime).
    const CERT: &str = "MIIBfjCCASOgAwIBAgIUZGRHZTxkxBqzPgqA7iSDVIrV8CYwCgYIKoZIzj0EAwIw\
        FDESMBAGA1UEAwwJdC5leGFtcGxlMB4XDTI2MTEyNzE4MjIxNFoXDTI2MTIyNzE4\
        MjIxNFowFDESMBAGA1UEAwwJdC5leGFtcGxlMFkwEwYHKoZIzj0CAQYIKoZIzj0D\
        AQcDQgAE6vwjefdfjCEpyetrxY+RGtG+5JUJyJuEOsJecb1cSviju5ziLt4bH1FE\
        1D/jJrA49icSVCbkG8+GQ+wthuO5OaNTMFEwHQYDVR0OBBYEFFMe0RX8PpyFOinn\
        yXqnw0+Kk5fkMB8GA1UdIwQYMBaAFFMe0RX8PpyFOinnyXqnw0+Kk5fkMA8GA1Ud\
        EwEB/wQFMAMBAf8wCgYIKoZIzj0EAwIDSQAwRgIhAN7Qv3KGJBU6CXZzvV5ANcnL\
        BfsQYGb3wiGWzcuudIVoAiEA9AS/l9TsKPnNoi+CMH+Ai1mA6ILZ1SfzGeb2BEMx\
        Wl4=";

    fn der_of(tag: u8, parts: &[&[u8]]) -> Vec<u8> {
        let body: Vec<u8> = parts.concat();
        let mut out = vec![tag];
        if body.len() < 0x80 {
            out.push(body.len() as u8);
        } else {
            out.extend([0x82, (body.len() >> 8) as u8, body.len() as u8]);
        }
        out.extend(body);
        out
    }

    #[test]
    fn the_expiry_is_read_from_the_certificate() {
        use base64::Engine;
        let der = base64::engine::general_purpose::STANDARD
            .decode(CERT)
            .unwrap();
        assert_eq!(
            not_after(&der).as_deref(),
            Some("2026-12-27T18:22:14+00:00")
        );
        // A v1 certificate (no version field) with GeneralizedTime past 2049.
        let gen = |t: &str| der_of(0x18, &[t.as_bytes()]);
        let validity = der_of(0x30, &[&gen("20500101000000Z"), &gen("20600102030405Z")]);
        let tbs = der_of(
            0x30,
            &[
                &der_of(0x02, &[&[1]]),
                &der_of(0x30, &[]),
                &der_of(0x30, &[]),
                &validity,
            ],
        );
        let cert = der_of(0x30, &[&tbs]);
        assert_eq!(
            not_after(&cert).as_deref(),
            Some("2060-01-02T03:04:05+00:00")
        );
        // Truncated or not a certificate: none, never a panic.
        for n in 0..der.len() {
            let _ = not_after(&der[..n]);
        }
        assert_eq!(not_after(b"not DER"), None);
    }

    #[test]
    fn sites_are_name_equals_host_port() {
        let ok = parse_sites(&[
            "frontend=127.0.0.1:8443".into(),
            "lr-1=lr.example:443".into(),
        ])
        .unwrap();
        assert_eq!(ok[1], ("lr-1".to_string(), "lr.example:443".to_string()));
        for bad in [
            "frontend",
            "=1.2.3.4:443",
            "a=host",
            "a=:443",
            "a b=h:1",
            "a=h:99999",
        ] {
            assert!(parse_sites(&[bad.into()]).is_err(), "{bad}");
        }
    }

    /// A site that does not answer is unreachable, and costs one try per window: the next
    /// domain's check does not connect again.
    #[tokio::test]
    async fn an_unreachable_site_is_tried_once_per_window() {
        // A port nobody listens on: bound, then released.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let sites = vec![("gone".to_string(), format!("127.0.0.1:{port}"))];
        let checks = CertChecks::new(sites, None, Duration::from_secs(2), Duration::ZERO)
            .unwrap()
            .expect("one site");
        let first = checks.of("a.example").await;
        assert!(!first.servable);
        assert_eq!(first.sites[0].state, "unreachable");
        assert!(!first.sites[0].detail.as_ref().unwrap().contains("last try"));
        let second = checks.of("b.example").await;
        assert_eq!(second.sites[0].state, "unreachable");
        assert!(second.sites[0]
            .detail
            .as_ref()
            .unwrap()
            .contains("last try"));
    }
}
