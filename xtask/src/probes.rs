//! The probes Prometheus runs through the blackbox exporter: the `canary` job (each rung's
//! canary link, from `deploy/local/probes.tsv`), the `tls` job (every certificate name on
//! every site, docs/design/tls.md), and the exporter's modules those jobs name, rendered from
//! `zlink_wire::canary` so each checks what its rung must answer. `crate::topology` parses the
//! probe table and puts these jobs into `prometheus.yml`.

use anyhow::{bail, Context, Result};
use std::path::Path;

/// How often Prometheus probes each canary (the 15–30 s; alerts after two failures).
pub const PROBE_INTERVAL: &str = "15s";

/// One canary probe: `module` of the blackbox exporter against `listener` (and `path`, for
/// HTTP), for rung `rung`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Probe {
    pub rung: u8,
    pub name: String,
    pub module: String,
    pub listener: String,
    pub path: Option<String>,
}

/// The blackbox modules [`blackbox_yml`] writes, by rung.
pub(crate) const MODULES: [&str; 4] = ["rung1", "rung2", "rung3", "rung4"];

/// The `tls` job (docs/design/tls.md): every certificate name on every site, fetched over
/// HTTPS by the blackbox exporter's `tls_cert` module with that name as the TLS server name
/// (`hostname`): `probe_success` (the site presents a valid certificate for it) and
/// `probe_ssl_earliest_cert_expiry` per `site` and `domain`, the labels of each target.
/// `blackbox` is the exporter's port.
pub(crate) fn tls_job(blackbox: u16, targets: &Path) -> Result<String> {
    let file = serde_json::to_string(targets.to_str().context("path is not UTF-8")?)?;
    Ok(format!(
        "  - job_name: tls\n    scrape_interval: 30s\n    scrape_timeout: 5s\n    \
         metrics_path: /probe\n    params: {{module: [tls_cert]}}\n    \
         file_sd_configs: [{{files: [{file}]}}]\n    relabel_configs:\n      \
         - {{source_labels: [domain], target_label: __param_hostname}}\n      \
         - {{source_labels: [__address__], target_label: __param_target}}\n      \
         - {{source_labels: [__address__], target_label: instance}}\n      \
         - {{target_label: __address__, replacement: '127.0.0.1:{blackbox}'}}\n"
    ))
}

/// The `canary` job: Prometheus asks the blackbox exporter to run each probe's module against
/// its target every [`PROBE_INTERVAL`]; the series carry `rung` and `probe`. `port` gives a
/// listener's port (the topology's table).
pub(crate) fn canary_job(probes: &[Probe], port: impl Fn(&str) -> Result<u16>) -> Result<String> {
    let mut out = format!(
        "  - job_name: canary\n    scrape_interval: {PROBE_INTERVAL}\n    scrape_timeout: 5s\n    \
         metrics_path: /probe\n    static_configs:\n"
    );
    for p in probes {
        let at = format!("127.0.0.1:{}", port(&p.listener)?);
        // An HTTPS listener (`*-tls`) is probed over HTTPS, its certificate verified.
        let scheme = if p.listener.ends_with("-tls") {
            "https"
        } else {
            "http"
        };
        let target = match &p.path {
            Some(path) => format!("{scheme}://{at}{path}"),
            None => at,
        };
        out += &format!(
            "      - targets: ['{target}']\n        labels: {{rung: '{}', probe: {}, module: {}}}\n",
            p.rung, p.name, p.module
        );
    }
    out += &format!(
        "    relabel_configs:\n      \
         - {{source_labels: [module], target_label: __param_module}}\n      \
         - {{source_labels: [__address__], target_label: __param_target}}\n      \
         - {{source_labels: [__address__], target_label: instance}}\n      \
         - {{target_label: __address__, replacement: '127.0.0.1:{}'}}\n",
        port("blackbox")?
    );
    Ok(out)
}

/// The blackbox exporter's modules, one per rung, each checking what that rung must answer
/// for its canary (`zlink_wire::canary`): rung 1 a 302 to canary 1 from `primary`; rung 2 a
/// 302 to canary 2 from `lastresort`; rung 3 the S3 page (200, a meta refresh to canary 3)
/// from `lastresort-nginx`; rung 4 an A record for the service's DNS name.
pub fn blackbox_yml(dns_name: &str, ca_file: &str) -> Result<String> {
    use zlink_wire::{blob, canary};
    if !zlink_wire::domain::is_domain(dns_name) {
        bail!("{dns_name:?} is not a DNS name");
    }
    if !ca_file.starts_with('/')
        || !ca_file
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"/._-+".contains(&b))
    {
        bail!("{ca_file:?} is not an absolute path of letters, digits and /._-+");
    }
    let location = |n: u8| format!("^{}$", regex::escape(&canary::url(n)));
    let redirect = |n: u8, tier: &str| {
        format!(
            "  rung{n}:\n    prober: http\n    timeout: 3s\n    http:\n      method: GET\n      \
             follow_redirects: false\n      preferred_ip_protocol: ip4\n      \
             tls_config: {{ca_file: '{ca_file}'}}\n      \
             valid_status_codes: [302]\n      fail_if_header_not_matches:\n        \
             - {{header: Location, regexp: '{}'}}\n        \
             - {{header: X-Zlink-Tier, regexp: '^{tier}$'}}\n",
            location(n)
        )
    };
    let page = format!(
        "content=\"0; url={}\"",
        regex::escape(&blob::escape_html(&canary::url(3)))
    );
    Ok(format!(
        "# Rendered by `zlink-xtask topology blackbox` from zlink_wire::canary; do not edit.\n\
         modules:\n{}{}  rung3:\n    prober: http\n    timeout: 3s\n    http:\n      \
         method: GET\n      follow_redirects: false\n      preferred_ip_protocol: ip4\n      \
         valid_status_codes: [200]\n      fail_if_body_not_matches_regexp: ['{page}']\n      \
         fail_if_header_not_matches:\n        \
         - {{header: X-Zlink-Tier, regexp: '^lastresort-nginx$'}}\n  \
         rung4:\n    prober: dns\n    timeout: 3s\n    dns:\n      query_name: {dns_name}\n      \
         query_type: A\n      transport_protocol: udp\n      preferred_ip_protocol: ip4\n      \
         valid_rcodes: [NOERROR]\n      validate_answer_rrs:\n        \
         fail_if_not_matches_regexp: ['^{}\\.\\s+\\d+\\s+IN\\s+A\\s+[0-9.]+$']\n  \
         tls_cert:\n    prober: http\n    timeout: 3s\n    http:\n      method: GET\n      \
         follow_redirects: false\n      preferred_ip_protocol: ip4\n      \
         valid_status_codes: [200]\n      fail_if_not_ssl: true\n      \
         tls_config: {{ca_file: '{ca_file}'}}\n",
        redirect(1, "primary"),
        redirect(2, "lastresort"),
        regex::escape(dns_name),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blackbox_modules_check_status_destination_and_tier_of_each_rung() {
        let yml = blackbox_yml("go.zlink.test", "/run/ca.crt").unwrap();
        for rung in ["rung1", "rung2", "rung3", "rung4"] {
            assert!(yml.contains(&format!("\n  {rung}:\n")), "{rung}");
        }
        assert!(
            yml.contains("- {header: Location, regexp: '^https://canary\\.zlink\\.invalid/1$'}")
        );
        assert!(yml.contains("- {header: X-Zlink-Tier, regexp: '^lastresort$'}"));
        assert!(yml.contains(
            "fail_if_body_not_matches_regexp: ['content=\"0; url=https://canary\\.zlink\\.invalid/3\"']"
        ));
        assert!(yml.contains("query_name: go.zlink.test\n"));
        assert!(yml.contains("\n  tls_cert:\n"));
        assert!(yml.contains("tls_config: {ca_file: '/run/ca.crt'}\n"));
        assert!(blackbox_yml("go zlink", "/c").is_err());
        assert!(blackbox_yml("x'.example", "/c").is_err());
        assert!(blackbox_yml("go.zlink.test", "/c'").is_err());
        assert!(blackbox_yml("go.zlink.test", "c").is_err());
    }
}
