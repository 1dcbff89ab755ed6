//! zlink's tooling in Rust (`zlink-xtask`), so that shell scripts only supervise processes:
//!
//! - [`nginx`]: renders the nginx templates of `nginx/` (used by `lib.sh` and the tests);
//! - [`layers`]: which crate may depend on which, and no import cycle in any crate (lint step);
//! - [`bench`]: benchmark drivers against the running topology (creates, cold reads, S3
//!   visibility, a create flood, replication latency);
//! - [`benchrun`]: the one-run benchmark's load step (wrk + CPU per request per process from
//!   `/proc`) and its report (table, JSON, the dated row of `docs/benchmarks.md`);
//! - [`topology`]: the local topology as data (`deploy/local/topology.tsv`) and the files
//!   rendered from it (Prometheus and Alertmanager configuration, Toxiproxy proxy lists);
//! - [`probes`]: Prometheus's probe jobs (canaries, certificates) and the blackbox exporter's
//!   modules;
//! - [`alerts`]: the local Alertmanager webhook receiver;
//! - [`docker`]: static checks of the container images' Dockerfile;
//! - [`manifests`]: the generated files of the Kubernetes and Compose manifests;
//! - [`tls`]: the local certificate authority and the certificates it issues.

pub mod alerts;
pub mod bench;
pub mod benchcores;
pub mod benchrun;
pub mod docker;
pub mod layers;
pub mod manifests;
pub mod nginx;
pub mod probes;
pub mod tls;
pub mod topology;

/// The workspace the tests run in. Read at run time (cargo sets `CARGO_MANIFEST_DIR` for the
/// test process), not compiled in: a test binary reused from a build of the same commit in
/// another checkout (a shared `CARGO_TARGET_DIR`) would otherwise check that checkout.
#[cfg(test)]
pub(crate) fn workspace_root() -> std::path::PathBuf {
    let dir = std::env::var_os("CARGO_MANIFEST_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| env!("CARGO_MANIFEST_DIR").into());
    dir.parent()
        .expect("xtask/ is inside the workspace")
        .to_path_buf()
}
