//! The local topology as data. `deploy/local/topology.tsv` names every listener of the local
//! topology with its port offset and, for a process Prometheus scrapes, its job, tier and
//! component label; `deploy/local/probes.tsv` names the canary probes of every rung;
//! `deploy/local/lib.sh` reads the ports from the first. This module renders, from those
//! tables, the files the servers read: Prometheus's scrape configuration (its probe jobs and
//! the blackbox exporter's modules are [`crate::probes`]'), Alertmanager's route, and
//! Toxiproxy's proxy lists (the fault proxies and the network-cut gateways), so no
//! script builds YAML or JSON by hand.

use crate::probes::{Probe, MODULES};
use anyhow::{bail, Context, Result};
use std::collections::BTreeSet;
use std::path::Path;

/// Where the table lives in the repository.
pub const TABLE: &str = "deploy/local/topology.tsv";
/// Where the canary probes are listed.
pub const PROBES: &str = "deploy/local/probes.tsv";

/// One listener: `name` on `ZLINK_PORT_BASE + offset`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listener {
    pub name: String,
    pub offset: u16,
    pub scrape: Option<Scrape>,
}

/// How Prometheus knows a scraped listener: `job`, and the labels `tier` and `component`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scrape {
    pub job: String,
    pub tier: String,
    pub component: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Topology {
    pub listeners: Vec<Listener>,
    pub probes: Vec<Probe>,
}

/// Names and labels end up unquoted in YAML and in shell words: keep them to one safe shape.
fn check_word(what: &str, w: &str, line: usize) -> Result<String> {
    let ok = !w.is_empty()
        && w.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_');
    if !ok {
        bail!("{TABLE}:{line}: {what} {w:?} must be lower-case letters, digits, '-' or '_'");
    }
    Ok(w.to_string())
}

impl Topology {
    /// Parses the table: `name offset [job tier component]`, `#` comments, `-` for none.
    pub fn parse(text: &str) -> Result<Topology> {
        let mut listeners = Vec::new();
        let mut names = BTreeSet::new();
        let mut offsets = BTreeSet::new();
        for (i, raw) in text.lines().enumerate() {
            let line = i + 1;
            let cols: Vec<&str> = raw.split_whitespace().collect();
            if cols.is_empty() || cols[0].starts_with('#') {
                continue;
            }
            let name = check_word("name", cols[0], line)?;
            let offset: u16 = cols
                .get(1)
                .and_then(|o| o.parse().ok())
                .filter(|o| *o < 1000)
                .with_context(|| format!("{TABLE}:{line}: {name}: offset must be 0..999"))?;
            let scrape = match cols.get(2..) {
                None | Some([]) | Some(["-", "-", "-"]) => None,
                Some([job, tier, component]) => Some(Scrape {
                    job: check_word("job", job, line)?,
                    tier: check_word("tier", tier, line)?,
                    component: check_word("component", component, line)?,
                }),
                Some(_) => bail!("{TABLE}:{line}: {name}: want job, tier and component (or - - -)"),
            };
            if !names.insert(name.clone()) {
                bail!("{TABLE}:{line}: {name} is listed twice");
            }
            if !offsets.insert(offset) {
                bail!("{TABLE}:{line}: {name}: offset {offset} is taken");
            }
            listeners.push(Listener {
                name,
                offset,
                scrape,
            });
        }
        Ok(Topology {
            listeners,
            probes: Vec::new(),
        })
    }

    /// Adds the probes of `text`: `rung probe module listener path` (`-`: no path).
    pub fn with_probes(mut self, text: &str) -> Result<Topology> {
        for (i, raw) in text.lines().enumerate() {
            let line = i + 1;
            let cols: Vec<&str> = raw.split_whitespace().collect();
            if cols.is_empty() || cols[0].starts_with('#') {
                continue;
            }
            let [rung, name, module, listener, path] = cols[..] else {
                bail!("{PROBES}:{line}: want rung, probe, module, listener and path");
            };
            let rung: u8 = rung
                .parse()
                .ok()
                .filter(|r| (1..=4).contains(r))
                .with_context(|| format!("{PROBES}:{line}: rung must be 1 to 4"))?;
            if !MODULES.contains(&module) {
                bail!("{PROBES}:{line}: module {module:?} is not one of {MODULES:?}");
            }
            if !self.listeners.iter().any(|l| l.name == listener) {
                bail!("{PROBES}:{line}: {listener} is not in {TABLE}");
            }
            let path = match path {
                "-" => None,
                p if p.starts_with('/')
                    && p.bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b"/_-".contains(&b)) =>
                {
                    Some(p.to_string())
                }
                p => bail!("{PROBES}:{line}: path {p:?} must be /letters-digits_- or -"),
            };
            self.probes.push(Probe {
                rung,
                name: check_word("probe", name, line)?,
                module: module.to_string(),
                listener: listener.to_string(),
                path,
            });
        }
        Ok(self)
    }

    pub fn load(root: &Path) -> Result<Topology> {
        let read = |rel: &str| {
            let path = root.join(rel);
            std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))
        };
        Topology::parse(&read(TABLE)?)?.with_probes(&read(PROBES)?)
    }

    /// The port of `name` in the topology on `base`.
    pub fn port(&self, base: u16, name: &str) -> Result<u16> {
        let l = self
            .listeners
            .iter()
            .find(|l| l.name == name)
            .with_context(|| format!("{name} is not in {TABLE}"))?;
        base.checked_add(l.offset)
            .with_context(|| format!("port base {base} + {} overflows", l.offset))
    }

    /// The scrape jobs in the order the table first names them, each with its listeners.
    fn jobs(&self) -> Vec<(&str, Vec<(&Listener, &Scrape)>)> {
        let mut jobs: Vec<(&str, Vec<(&Listener, &Scrape)>)> = Vec::new();
        for l in &self.listeners {
            let Some(s) = &l.scrape else { continue };
            match jobs.iter_mut().find(|(j, _)| *j == s.job) {
                Some((_, targets)) => targets.push((l, s)),
                None => jobs.push((&s.job, vec![(l, s)])),
            }
        }
        jobs
    }
}

/// What `prometheus.yml` needs besides the table.
pub struct PrometheusSettings<'a> {
    pub base: u16,
    /// Scrape and evaluation interval, e.g. `5s`.
    pub interval: &'a str,
    /// The repository: rules are read from `deploy/prometheus/rules/`.
    pub root: &'a Path,
    /// The `tls` job's targets (file service discovery: one per site and certificate name,
    /// rewritten whenever a certificate is issued), if any.
    pub tls_targets: Option<&'a Path>,
}

/// Prometheus's configuration: every scraped listener on 127.0.0.1 (the ops network, never
/// through a public nginx), the repository's rules, the local Alertmanager.
pub fn prometheus_yml(t: &Topology, s: &PrometheusSettings) -> Result<String> {
    let interval = s.interval;
    if !interval.bytes().all(|b| b.is_ascii_alphanumeric()) || interval.is_empty() {
        bail!("scrape interval {interval:?} is not a duration like 5s");
    }
    let rules = s.root.join("deploy/prometheus/rules/*.yml");
    let rules = rules.to_str().context("repository path is not UTF-8")?;
    let mut out = format!(
        "global:\n  scrape_interval: {interval}\n  evaluation_interval: {interval}\n  \
         scrape_timeout: 4s\n  external_labels: {{site: local}}\nrule_files:\n  - {}\n\
         alerting:\n  alertmanagers:\n    - static_configs: [{{targets: ['127.0.0.1:{}']}}]\n\
         scrape_configs:\n",
        serde_json::to_string(rules)?,
        t.port(s.base, "alertmanager")?
    );
    for (job, targets) in t.jobs() {
        out += &format!("  - job_name: {job}\n    static_configs:\n");
        for (l, sc) in targets {
            out += &format!(
                "      - targets: ['127.0.0.1:{}']\n        labels: {{component: {}, tier: {}}}\n",
                t.port(s.base, &l.name)?,
                sc.component,
                sc.tier
            );
        }
    }
    if !t.probes.is_empty() {
        out += &crate::probes::canary_job(&t.probes, |name| t.port(s.base, name))?;
    }
    if let Some(targets) = s.tls_targets {
        out += &crate::probes::tls_job(t.port(s.base, "blackbox")?, targets)?;
    }
    Ok(out)
}

/// Alertmanager's configuration: one route, every alert to the local receiver (the
/// topology's `alert-receiver`), grouped by name, sent at once, resolved ones too.
pub fn alertmanager_yml(t: &Topology, base: u16) -> Result<String> {
    Ok(format!(
        "route:\n  receiver: local-file\n  group_by: [alertname]\n  group_wait: 1s\n  \
         group_interval: 5s\n  repeat_interval: 4h\nreceivers:\n  - name: local-file\n    \
         webhook_configs:\n      - url: http://127.0.0.1:{}/\n        send_resolved: true\n",
        t.port(base, "alert-receiver")?
    ))
}

/// Toxiproxy's proxy list from `NAME LISTEN UPSTREAM` lines (blank lines and `#` comments
/// skipped): every proxy enabled, no toxics.
pub fn proxies_json(routes: &str) -> Result<String> {
    let mut proxies = Vec::new();
    for (i, raw) in routes.lines().enumerate() {
        let cols: Vec<&str> = raw.split_whitespace().collect();
        match cols.as_slice() {
            [] => continue,
            [c, ..] if c.starts_with('#') => continue,
            [name, listen, upstream] => proxies.push(serde_json::json!({
                "name": name, "listen": listen, "upstream": upstream, "enabled": true,
            })),
            _ => bail!(
                "route line {}: want NAME LISTEN UPSTREAM, got {raw:?}",
                i + 1
            ),
        }
    }
    Ok(serde_json::to_string_pretty(&proxies)? + "\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    const TABLE_TEXT: &str = "# c\ncql 42 - - -\nprimary-1 81 primary primary primary-1\n\
        alertmanager 161 alertmanager monitoring alertmanager\nalert-receiver 162\n\
        nginx-exporter-frontend 163 nginx frontend nginx-frontend\nblackbox 165\n";

    /// The repository's prometheus.yml on port base 21000.
    fn repo_prometheus_yml(t: &Topology) -> String {
        let settings = PrometheusSettings {
            base: 21000,
            interval: "5s",
            root: &crate::workspace_root(),
            tls_targets: None,
        };
        prometheus_yml(t, &settings).unwrap()
    }

    #[test]
    fn the_repository_table_parses_and_names_what_the_scripts_use() {
        let t = Topology::load(&crate::workspace_root()).unwrap();
        for name in [
            "cql",
            "kafka",
            "s3",
            "primary-1",
            "lastresort-1",
            "site",
            "prometheus",
        ] {
            assert!(t.port(21000, name).is_ok(), "{name}");
        }
        let yml = repo_prometheus_yml(&t);
        for job in ["primary", "lastresort", "replicator", "clicks", "nginx"] {
            assert!(yml.contains(&format!("job_name: {job}\n")), "{job}");
        }
    }

    #[test]
    fn scrape_targets_carry_job_component_and_tier() {
        let t = Topology::parse(TABLE_TEXT).unwrap();
        assert_eq!(t.port(1000, "primary-1").unwrap(), 1081);
        let yml = prometheus_yml(
            &t,
            &PrometheusSettings {
                base: 1000,
                interval: "5s",
                root: Path::new("/r"),
                tls_targets: Some(Path::new("/run/tls-targets.json")),
            },
        )
        .unwrap();
        assert!(yml.contains("rule_files:\n  - \"/r/deploy/prometheus/rules/*.yml\"\n"));
        assert!(yml.contains(
            "  - job_name: tls\n    scrape_interval: 30s\n    scrape_timeout: 5s\n    \
             metrics_path: /probe\n    params: {module: [tls_cert]}\n    \
             file_sd_configs: [{files: [\"/run/tls-targets.json\"]}]\n"
        ));
        assert!(yml.contains("- {source_labels: [domain], target_label: __param_hostname}\n"));
        assert!(yml.contains("replacement: '127.0.0.1:1165'}\n"));
        assert!(yml.contains("targets: ['127.0.0.1:1161']}]\n"));
        assert!(yml.contains(
            "  - job_name: nginx\n    static_configs:\n      - targets: ['127.0.0.1:1163']\n        \
             labels: {component: nginx-frontend, tier: frontend}\n"
        ));
        assert!(!yml.contains("cql"));
        assert!(alertmanager_yml(&t, 1000)
            .unwrap()
            .contains("url: http://127.0.0.1:1162/\n"));
    }

    #[test]
    fn bad_tables_are_refused_with_the_line() {
        for bad in [
            "cql 42\ncql 43\n",
            "a 42\nb 42\n",
            "a 1000\n",
            "a x\n",
            "A 1\n",
            "a 1 job tier\n",
            "a 1 j t 'c'\n",
        ] {
            assert!(Topology::parse(bad).is_err(), "{bad:?}");
        }
        assert!(prometheus_yml(
            &Topology::parse(TABLE_TEXT).unwrap(),
            &PrometheusSettings {
                base: 1000,
                interval: "5s\n- x",
                root: Path::new("/r"),
                tls_targets: None,
            }
        )
        .is_err());
    }

    #[test]
    fn every_probe_is_a_canary_job_target_through_the_blackbox_exporter() {
        let t = Topology::load(&crate::workspace_root()).unwrap();
        let rungs: BTreeSet<u8> = t.probes.iter().map(|p| p.rung).collect();
        assert_eq!(rungs, [1, 2, 3, 4].into(), "every rung is probed");
        let yml = repo_prometheus_yml(&t);
        let job = &yml[yml.find("  - job_name: canary\n").expect("canary job")..];
        assert!(job.contains("    metrics_path: /probe\n"));
        assert!(job.contains(
            "      - targets: ['https://127.0.0.1:21184/zlink-canary-1']\n        \
             labels: {rung: '1', probe: frontend, module: rung1}\n"
        ));
        assert!(job.contains("      - targets: ['127.0.0.1:21053']\n"));
        assert!(job.contains("replacement: '127.0.0.1:21165'}"));
        let bad = |probes: &str| Topology::parse(TABLE_TEXT).unwrap().with_probes(probes);
        assert!(bad("1 p rung1 cql /x\n").is_ok());
        for b in [
            "5 p rung1 cql /x\n",
            "1 p rung9 cql /x\n",
            "1 p rung1 nowhere /x\n",
            "1 p rung1 cql x\n",
            "1 p rung1 cql /a?b\n",
            "1 p rung1 cql\n",
        ] {
            assert!(bad(b).is_err(), "{b:?}");
        }
    }

    #[test]
    fn proxy_lists_come_from_route_lines() {
        let json = proxies_json("# gw\nkafka 127.0.0.1:1 10.0.0.1:2\n\ns3 a:1 b:2\n").unwrap();
        let v: serde_json::Value = serde_json::from_str(&json).unwrap();
        assert_eq!(v[0]["name"], "kafka");
        assert_eq!(v[0]["upstream"], "10.0.0.1:2");
        assert_eq!(v[1]["listen"], "a:1");
        assert_eq!(v[1]["enabled"], true);
        assert!(proxies_json("only two\n").is_err());
    }
}
