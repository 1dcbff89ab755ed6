//! `zlink-xtask COMMAND ...`: see the crate documentation; `deploy/local/*` call it.

use anyhow::Result;
use clap::{Parser, Subcommand};
use std::net::IpAddr;
use std::path::PathBuf;
use zlink_xtask::{
    alerts, bench, benchcores, benchrun, docker, layers, manifests, nginx, probes, tls, topology,
};

#[derive(Parser)]
#[command(name = "zlink-xtask", about = "zlink tooling")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum TopologyCmd {
    /// prometheus.yml: every listener with a scrape job, the rules, the local Alertmanager.
    Prometheus {
        #[arg(long)]
        root: PathBuf,
        #[arg(long)]
        base: u16,
        #[arg(long, default_value = "5s")]
        interval: String,
        /// The `tls` job's file of targets (file service discovery).
        #[arg(long)]
        tls_targets: Option<PathBuf>,
    },
    /// alertmanager.yml: every alert to the local receiver.
    Alertmanager {
        #[arg(long)]
        root: PathBuf,
        #[arg(long)]
        base: u16,
    },
    /// blackbox.yml: one module per rung, checking what it must answer for its canary.
    Blackbox {
        #[arg(long)]
        dns_name: String,
        /// The CA the `tls_cert` module verifies certificates against.
        #[arg(long)]
        ca_file: String,
    },
    /// Toxiproxy's proxy list (JSON) from NAME LISTEN UPSTREAM lines on stdin.
    Proxies,
}

#[derive(Subcommand)]
enum TlsCmd {
    /// Make DIR/ca.crt and DIR/ca.key unless both are there.
    Ca {
        #[arg(long)]
        dir: PathBuf,
    },
    /// Issue a server certificate for NAMES (DNS names, IP addresses; the first is its common
    /// name) signed by the CA in --ca-dir: certificate and key in one PEM file, OUT.
    Issue {
        #[arg(long)]
        ca_dir: PathBuf,
        #[arg(long)]
        out: PathBuf,
        #[arg(long, default_value_t = 90)]
        days: i64,
        /// A group (id) that may read the file too: nginx's workers'.
        #[arg(long)]
        group: Option<u32>,
        #[arg(required = true)]
        names: Vec<String>,
    },
}

#[derive(Subcommand)]
enum Cmd {
    /// Render an nginx template: every {{NAME}} from the .budgets file and NAME=VALUE arguments.
    RenderNginx {
        template: PathBuf,
        out: PathBuf,
        values: Vec<String>,
    },
    /// Print a file the local topology's servers read, rendered from
    /// deploy/local/topology.tsv (see xtask/src/topology.rs).
    #[command(subcommand)]
    Topology(TopologyCmd),
    /// Check crate dependencies and module import cycles; print each crate's layers.
    CheckLayers {
        #[arg(default_value = ".")]
        root: PathBuf,
    },
    /// Check deploy/docker/Dockerfile statically (binaries, --locked, USER, HEALTHCHECK).
    CheckDockerfiles {
        #[arg(default_value = ".")]
        root: PathBuf,
    },
    /// Write the deployment manifests' generated files (nginx configs, PrometheusRule);
    /// with --check, write nothing and fail if one is stale.
    Manifests {
        #[arg(long)]
        check: bool,
        #[arg(default_value = ".")]
        root: PathBuf,
    },
    /// Create N links on $ZLINK_PRIMARY_1, write their slugs to OUT.
    Create { n: usize, out: String },
    /// GET each slug of FILE once on BASE_URL; p50/p99/max in ms. One at a time, or with
    /// --rate, open loop at that many requests a second (latency from each request's
    /// scheduled start, so a stall counts for every request it delays).
    Cold {
        base: String,
        file: String,
        #[arg(long)]
        rate: Option<u32>,
    },
    /// GET the slugs of FILE round and round on BASE, open loop at --rate a second for --secs
    /// (background redirect load); counts answers by status.
    Pace {
        base: String,
        file: String,
        #[arg(long)]
        rate: u32,
        #[arg(long)]
        secs: u32,
        /// Clients with a loopback source address each (127.0.1.1 and on), taking turns.
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u8).range(1..=200))]
        sources: u8,
    },
    /// Wait (at most 120 s) until every slug of FILE is readable in S3.
    WaitS3 { file: String },
    /// N creates paced over SECONDS with a new owner key, from SOURCE_IP.
    Flood {
        base: String,
        n: usize,
        seconds: f64,
        source: IpAddr,
    },
    /// Create N links and time create → visible in S3: CONCURRENCY at a time or, with
    /// --rate, open loop at that many a second (CONCURRENCY then bounds creates awaiting an
    /// answer); every --sample-th link is polled in S3.
    Replication {
        #[arg(default_value_t = 500)]
        n: usize,
        #[arg(default_value_t = 16)]
        concurrency: usize,
        #[arg(long)]
        rate: Option<u32>,
        #[arg(long, default_value_t = 1)]
        sample: usize,
    },
    /// The Alertmanager webhook receiver: append alerts to FILE as JSON lines.
    AlertReceiver { port: u16, file: PathBuf },
    /// The local certificate authority (xtask/src/tls.rs).
    #[command(subcommand)]
    Tls(TlsCmd),
    /// wrk against URL over the slugs of SLUGS while sampling the CPU time of --procs
    /// (NAME=PID,...; descendants included): one RESULT line with CPU µs per request each.
    Load {
        #[arg(long)]
        step: String,
        url: String,
        slugs: PathBuf,
        #[arg(long, default_value = "deploy/local/bench/slugs.lua")]
        script: PathBuf,
        #[arg(long, default_value_t = 10)]
        secs: u32,
        #[arg(long, default_value_t = 16)]
        conns: u32,
        #[arg(long, default_value_t = 2)]
        threads: u32,
        #[arg(long, default_value = "")]
        procs: String,
    },
    /// Turn a run's RESULT lines into the table (stdout), JSON (--json) and a dated row
    /// appended to --markdown.
    BenchReport {
        results: PathBuf,
        #[arg(long)]
        json: PathBuf,
        #[arg(long)]
        markdown: Option<PathBuf>,
        #[arg(long, default_value = "")]
        commit: String,
    },
    /// deploy/local/bench-cores' table from its RESULT lines (stdout and --table), and its
    /// dated row added to the "Pinned cores" table of --append.
    BenchCoresReport {
        #[arg(long)]
        results: PathBuf,
        #[arg(long)]
        date: String,
        #[arg(long)]
        commit: String,
        #[arg(long)]
        server_cpus: String,
        #[arg(long)]
        load_cpus: String,
        #[arg(long)]
        table: PathBuf,
        #[arg(long)]
        append: Option<PathBuf>,
    },
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    let rt = || {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
    };
    match cli.cmd {
        Cmd::RenderNginx {
            template,
            out,
            values,
        } => nginx::render_to(&template, &out, &nginx::parse_values(&values)?),
        Cmd::Topology(t) => {
            let out = match t {
                TopologyCmd::Prometheus {
                    root,
                    base,
                    interval,
                    tls_targets,
                } => topology::prometheus_yml(
                    &topology::Topology::load(&root)?,
                    &topology::PrometheusSettings {
                        base,
                        interval: &interval,
                        root: &root,
                        tls_targets: tls_targets.as_deref(),
                    },
                )?,
                TopologyCmd::Alertmanager { root, base } => {
                    topology::alertmanager_yml(&topology::Topology::load(&root)?, base)?
                }
                TopologyCmd::Blackbox { dns_name, ca_file } => {
                    probes::blackbox_yml(&dns_name, &ca_file)?
                }
                TopologyCmd::Proxies => {
                    topology::proxies_json(&std::io::read_to_string(std::io::stdin())?)?
                }
            };
            print!("{out}");
            Ok(())
        }
        Cmd::CheckLayers { root } => {
            print!("{}", layers::check(&root)?);
            Ok(())
        }
        Cmd::CheckDockerfiles { root } => {
            println!("images: {}", docker::check(&root)?.join(" "));
            Ok(())
        }
        Cmd::Manifests { check: true, root } => {
            let stale = manifests::stale(&root)?;
            for p in &stale {
                eprintln!(
                    "stale: {} (run `zlink-xtask manifests` and commit it)",
                    p.display()
                );
            }
            anyhow::ensure!(stale.is_empty(), "{} generated file(s) stale", stale.len());
            Ok(())
        }
        Cmd::Manifests { check: false, root } => {
            for p in manifests::write(&root)? {
                println!("wrote {}", p.display());
            }
            Ok(())
        }
        Cmd::Create { n, out } => rt()?.block_on(bench::create(n, &out)),
        Cmd::Cold { base, file, rate } => rt()?.block_on(bench::cold(&base, &file, rate)),
        Cmd::Pace {
            base,
            file,
            rate,
            secs,
            sources,
        } => rt()?.block_on(bench::pace(&base, &file, rate, secs, sources)),
        Cmd::WaitS3 { file } => rt()?.block_on(bench::wait_s3(&file)),
        Cmd::Flood {
            base,
            n,
            seconds,
            source,
        } => rt()?.block_on(bench::flood(&base, n, seconds, source)),
        Cmd::Replication {
            n,
            concurrency,
            rate,
            sample,
        } => rt()?.block_on(bench::replication(n, concurrency, rate, sample)),
        Cmd::AlertReceiver { port, file } => rt()?.block_on(alerts::serve(port, file)),
        Cmd::Tls(TlsCmd::Ca { dir }) => tls::ensure_ca(&dir).map(|_| ()),
        Cmd::Tls(TlsCmd::Issue {
            ca_dir,
            out,
            days,
            group,
            names,
        }) => {
            let readers = group.map_or(tls::Readers::Owner, tls::Readers::Group);
            tls::issue(&ca_dir, &out, &names, days, readers)
        }
        Cmd::Load {
            step,
            url,
            slugs,
            script,
            secs,
            conns,
            threads,
            procs,
        } => benchrun::load(&benchrun::Load {
            step: &step,
            url: &url,
            script: &script,
            slugs: &slugs,
            secs,
            conns,
            threads,
            procs: benchrun::parse_procs(&procs)?,
        }),
        Cmd::BenchReport {
            results,
            json,
            markdown,
            commit,
        } => {
            let date = chrono::Utc::now().format("%Y-%m-%d %H:%M").to_string();
            let r = benchrun::report(&benchrun::read_results(&results)?, &date, &commit);
            print!("{}", r.table);
            std::fs::write(&json, serde_json::to_string_pretty(&r.json)? + "\n")?;
            println!("json: {}", json.display());
            if let Some(md) = markdown {
                let text = std::fs::read_to_string(&md)
                    .unwrap_or_else(|_| benchrun::MD_HEADER.to_string());
                let header = benchrun::MD_HEADER
                    .lines()
                    .find(|l| l.starts_with("| date"))
                    .unwrap_or_default();
                std::fs::write(&md, benchcores::insert_row(&text, "", header, &r.row))?;
                println!("row appended to {}", md.display());
            }
            Ok(())
        }
        Cmd::BenchCoresReport {
            results,
            date,
            commit,
            server_cpus,
            load_cpus,
            table,
            append,
        } => {
            let lines = std::fs::read_to_string(&results)?;
            let cpus = format!("{server_cpus} / {load_cpus}");
            let (t, row) = benchcores::report(&lines, &date, &commit, &cpus);
            print!("{t}");
            std::fs::write(&table, format!("{t}\n{}", lines))?;
            println!("table: {}", table.display());
            if let Some(md) = append {
                let text = std::fs::read_to_string(&md)?;
                let text = benchcores::insert_row(
                    &text,
                    benchcores::MD_SECTION,
                    benchcores::MD_HEADER,
                    &row,
                );
                std::fs::write(&md, text)?;
                println!("row added to {}", md.display());
            }
            Ok(())
        }
    }
}
