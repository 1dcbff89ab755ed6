//! CA files given on the command line (`--s3-ca-file`, primary's `--tls-ca-file`): read once at
//! start-up, each certificate checked as a trust anchor, with errors that name the flag.

use rustls::pki_types::{pem::PemObject, CertificateDer};

/// Adds the certificates of the PEM file `path` to `roots` and returns the file's bytes: at
/// least one certificate, each usable as a trust anchor, or an error naming `flag`.
pub fn read_ca_file(
    flag: &str,
    path: &std::path::Path,
    roots: &mut rustls::RootCertStore,
) -> Result<Vec<u8>, String> {
    let shown = path.display();
    let pem = std::fs::read(path).map_err(|e| format!("{flag} {shown}: {e}"))?;
    let ders = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("{flag} {shown}: not PEM certificates: {e:?}"))?;
    if ders.is_empty() {
        return Err(format!("{flag} {shown}: no certificate in it"));
    }
    for der in ders {
        roots
            .add(der)
            .map_err(|e| format!("{flag} {shown}: a certificate is not usable as a CA: {e}"))?;
    }
    Ok(pem)
}
