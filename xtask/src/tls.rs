//! The local certificate authority and the certificates it issues: what ACME (cert-manager,
//! or the runbook's ACME client) does in production, for the local topology and the tests.
//!
//! - [`ensure_ca`] makes `<dir>/ca.crt` and `<dir>/ca.key` once (ECDSA P-256, ten years) and
//!   keeps them: every certificate issued later chains to the same CA, which the tests and the
//!   browser trust (`ca.crt` is the file the endpoints name).
//! - [`issue`] signs a server certificate for a list of names (DNS names and IP addresses) and
//!   writes it, its key after it, as one PEM file, atomically (a temporary file renamed over the
//!   old one): nginx reads a certificate named by a variable at each handshake, so a renewed
//!   file is served from the next handshake on, with no reload and never a certificate beside
//!   the wrong key.

use anyhow::{bail, Context, Result};
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SerialNumber,
};
use std::path::{Path, PathBuf};
use time::{Duration, OffsetDateTime};

/// The CA's subject; [`issuer`] rebuilds the CA from it and the key alone.
const CA_NAME: &str = "zlink local CA";

fn ca_params() -> CertificateParams {
    let mut p = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::OrganizationName, "zlink");
    dn.push(DnType::CommonName, CA_NAME);
    p.distinguished_name = dn;
    p.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    p.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    p
}

pub fn ca_cert(dir: &Path) -> PathBuf {
    dir.join("ca.crt")
}

fn ca_key(dir: &Path) -> PathBuf {
    dir.join("ca.key")
}

/// Who may read a secret file besides its owner.
#[derive(Clone, Copy, Debug, Default)]
pub enum Readers {
    /// Its owner only (mode 0600).
    #[default]
    Owner,
    /// Its owner and this group (mode 0640): the group nginx's workers run in, which read a
    /// certificate named by a variable at each handshake (as root, nginx's workers are
    /// `nobody`, not root).
    Group(u32),
}

/// Writes `data` to `path` through a temporary file in the same directory (mode 0600 or 0640
/// for a secret, 0644 otherwise), renamed over `path`: a reader sees the old file or the new
/// one, never part of one, and never the new one before its mode and group are set.
fn write_atomic(path: &Path, data: &str, secret: Option<Readers>) -> Result<()> {
    use std::io::Write;
    let dir = path.parent().context("a file in a directory")?;
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let tmp = dir.join(format!(
        ".{}.tmp",
        path.file_name().context("a file name")?.to_string_lossy()
    ));
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create(true).truncate(true);
    #[cfg(unix)]
    if secret.is_some() {
        use std::os::unix::fs::OpenOptionsExt;
        opts.mode(0o600);
    }
    let _ = std::fs::remove_file(&tmp);
    let mut f = opts
        .open(&tmp)
        .with_context(|| format!("writing {}", tmp.display()))?;
    #[cfg(unix)]
    if let Some(Readers::Group(gid)) = secret {
        use std::os::unix::fs::PermissionsExt;
        std::os::unix::fs::fchown(&f, None, Some(gid))
            .with_context(|| format!("giving {} to group {gid}", tmp.display()))?;
        f.set_permissions(std::fs::Permissions::from_mode(0o640))?;
    }
    f.write_all(data.as_bytes())?;
    f.sync_all()?;
    std::fs::rename(&tmp, path).with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

fn serial() -> SerialNumber {
    let mut b: [u8; 16] = rand::random();
    b[0] &= 0x7f; // a positive INTEGER
    SerialNumber::from_slice(&b)
}

/// Makes the CA in `dir` unless it is there (both files). Returns whether it made one.
pub fn ensure_ca(dir: &Path) -> Result<bool> {
    match (ca_cert(dir).exists(), ca_key(dir).exists()) {
        (true, true) => return Ok(false),
        (false, false) => {}
        _ => bail!(
            "{}: ca.crt and ca.key must both be there or both be missing",
            dir.display()
        ),
    }
    let key = KeyPair::generate()?;
    let mut p = ca_params();
    let now = OffsetDateTime::now_utc();
    p.not_before = now - Duration::hours(1);
    p.not_after = now + Duration::days(3650);
    p.serial_number = Some(serial());
    let cert = p.self_signed(&key)?;
    write_atomic(&ca_key(dir), &key.serialize_pem(), Some(Readers::Owner))?;
    write_atomic(&ca_cert(dir), &cert.pem(), None)?;
    Ok(true)
}

fn issuer(dir: &Path) -> Result<Issuer<'static, KeyPair>> {
    let pem = std::fs::read_to_string(ca_key(dir))
        .with_context(|| format!("reading {} (run `tls ca` first)", ca_key(dir).display()))?;
    Ok(Issuer::new(ca_params(), KeyPair::from_pem(&pem)?))
}

/// A server certificate for `names` (the first is its common name), valid from an hour ago
/// for `days`, signed by the CA in `ca_dir`: the certificate, then its key, in one PEM file
/// at `out`, readable by `readers`.
pub fn issue(
    ca_dir: &Path,
    out: &Path,
    names: &[String],
    days: i64,
    readers: Readers,
) -> Result<()> {
    let Some(first) = names.first() else {
        bail!("a certificate needs at least one name");
    };
    if days < 1 {
        bail!("--days must be at least 1");
    }
    let issuer = issuer(ca_dir)?;
    let key = KeyPair::generate()?;
    let mut p =
        CertificateParams::new(names.to_vec()).with_context(|| format!("names {names:?}"))?;
    p.distinguished_name = DistinguishedName::new();
    p.distinguished_name
        .push(DnType::CommonName, first.as_str());
    p.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    p.use_authority_key_identifier_extension = true;
    let now = OffsetDateTime::now_utc();
    p.not_before = now - Duration::hours(1);
    p.not_after = now + Duration::days(days);
    p.serial_number = Some(serial());
    let cert = p.signed_by(&key, &issuer)?;
    let pem = format!("{}{}", cert.pem(), key.serialize_pem());
    write_atomic(out, &pem, Some(readers))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ca_is_made_once_and_signs_certificates_for_dns_names_and_addresses() {
        let dir = tempfile::tempdir().unwrap();
        assert!(ensure_ca(dir.path()).unwrap());
        let ca = std::fs::read_to_string(ca_cert(dir.path())).unwrap();
        assert!(!ensure_ca(dir.path()).unwrap(), "kept");
        assert_eq!(std::fs::read_to_string(ca_cert(dir.path())).unwrap(), ca);

        let out = dir.path().join("certs/go.zlink.test.pem");
        let names = ["go.zlink.test".to_string(), "127.0.0.1".to_string()];
        issue(dir.path(), &out, &names, 30, Readers::Owner).unwrap();
        let pem = std::fs::read_to_string(&out).unwrap();
        assert!(pem.starts_with("-----BEGIN CERTIFICATE-----"));
        assert!(pem.contains("-----BEGIN PRIVATE KEY-----"));
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&out).unwrap().permissions().mode();
            assert_eq!(mode & 0o077, 0, "the key is readable by its owner only");
        }
        assert!(issue(dir.path(), &out, &[], 30, Readers::Owner).is_err());
        std::fs::remove_file(ca_cert(dir.path())).unwrap();
        assert!(ensure_ca(dir.path()).is_err(), "half a CA is refused");
    }
}
