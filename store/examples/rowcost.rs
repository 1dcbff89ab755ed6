//! What the store's CPU follows when the counter writes a window of click counts: rows, or
//! bytes (issue 37). Writes `WINDOWS` windows over `LINKS` links into a keyspace of its own
//! (`zlink_rowcost`, dropped at the end), the way the counter writes `click_sums`: unlogged
//! single-partition batches of 128 rows, 32 partitions per day, 64 batches in flight, each row
//! written `USING TIMESTAMP` (`--batch`: other batch sizes; groups default to 128 / N rows). Prints the store process's CPU seconds over the writes and a
//! 10-s tail (its commit log, memtable flushes). Modes:
//!
//! - `rows`: one row per link, `BYTES` of counts each, 86 % of the links changed per window
//!   (what a 5-s window over 100,000 links at 40,000 clicks/s changes);
//! - `groups:N`: one row per N links (their names and `BYTES` of counts each, concatenated),
//!   every group written every window.
//!
//! ```text
//! cargo run --release -p zlink-store --example rowcost -- STORE_PID CQL_ADDR MODE LINKS WINDOWS BYTES \
//!   [--batch ROWS]
//! # e.g. on the local topology:
//! cargo run --release -p zlink-store --example rowcost -- \
//!   "$(pgrep -f CassandraDaemon | head -1)" 127.0.0.1:21042 groups:16 100000 20 120
//! ```
//! Load goes only to the address given (the local topology's store); bounded by its arguments.

use scylla::client::session::Session;
use scylla::client::session_builder::SessionBuilder;
use scylla::statement::batch::{Batch, BatchType};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::task::JoinSet;

type Row = (i64, i64, Vec<u8>, i32, i32, String, String);

/// CPU seconds (user + system) the process `pid` has spent.
fn cpu_of(pid: u32) -> anyhow::Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    let rest = &stat[stat.rfind(')').ok_or_else(|| anyhow::anyhow!("bad stat"))? + 2..];
    let f: Vec<&str> = rest.split(' ').collect();
    let ticks: f64 = f[11].parse::<f64>()? + f[12].parse::<f64>()?;
    Ok(ticks / 100.0)
}

/// A small deterministic generator: which links a window changes.
fn next(seed: &mut u64) -> u64 {
    *seed = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    *seed >> 33
}

/// One window's rows, by partition (bucket).
fn window(group: usize, links: usize, bytes: usize, ts: i64, seed: &mut u64) -> Vec<Vec<Row>> {
    let mut parts: Vec<Vec<Row>> = vec![Vec::new(); 32];
    let counts = vec![7u8; bytes];
    let row = |bucket: usize, key: String, n: Vec<u8>| {
        (ts, ts, n, 1, bucket as i32, key, "clicks:0".to_string())
    };
    if group == 1 {
        for l in 0..links {
            if next(seed) % 100 < 86 {
                parts[l % 32].push(row(l % 32, format!("s{l:07}"), counts.clone()));
            }
        }
    } else {
        for g in 0..links.div_ceil(group) {
            let mut n = Vec::with_capacity(group * (bytes + 8));
            for i in 0..group {
                n.extend_from_slice(format!("s{:07}", g * group + i).as_bytes());
                n.extend_from_slice(&counts);
            }
            parts[g % 32].push(row(g % 32, format!("g{:05}", g / 32), n));
        }
    }
    parts
}

async fn write(
    s: &Arc<Session>,
    stmt: &scylla::statement::prepared::PreparedStatement,
    parts: Vec<Vec<Row>>,
    per_batch: usize,
) -> anyhow::Result<usize> {
    let mut chunks = Vec::new();
    for p in parts {
        for c in p.chunks(per_batch) {
            chunks.push(c.to_vec());
        }
    }
    let rows = chunks.iter().map(Vec::len).sum();
    let mut running = JoinSet::new();
    let mut chunks = chunks.into_iter();
    loop {
        while running.len() < 64 {
            let Some(c) = chunks.next() else { break };
            let (s, stmt) = (s.clone(), stmt.clone());
            running.spawn(async move {
                let mut b = Batch::new(BatchType::Unlogged);
                for _ in 0..c.len() {
                    b.append_statement(stmt.clone());
                }
                s.batch(&b, c).await.map(drop)
            });
        }
        match running.join_next().await {
            None => return Ok(rows),
            Some(r) => r??,
        }
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (args, per_batch) = match args.as_slice() {
        [rest @ .., "--batch", n] => (rest, Some(n.parse::<usize>()?)),
        rest => (rest, None),
    };
    let [pid, cql, mode, links, windows, bytes] = args else {
        anyhow::bail!(
            "usage: rowcost STORE_PID CQL_ADDR rows|groups:N LINKS WINDOWS BYTES [--batch ROWS]"
        );
    };
    let pid: u32 = pid.parse()?;
    let (links, windows, bytes): (usize, usize, usize) =
        (links.parse()?, windows.parse()?, bytes.parse()?);
    let group: usize = match mode.strip_prefix("groups:") {
        Some(n) => n.parse()?,
        None if *mode == "rows" => 1,
        None => anyhow::bail!("MODE: rows or groups:N"),
    };
    anyhow::ensure!(
        (1..=1_000_000).contains(&links) && (1..=100).contains(&windows) && bytes <= 4096,
        "LINKS 1..1e6, WINDOWS 1..100, BYTES up to 4096"
    );
    let s = Arc::new(SessionBuilder::new().known_node(cql).build().await?);
    s.query_unpaged(
        "CREATE KEYSPACE IF NOT EXISTS zlink_rowcost WITH replication = \
         {'class': 'SimpleStrategy', 'replication_factor': 1}",
        (),
    )
    .await?;
    s.query_unpaged(
        "CREATE TABLE IF NOT EXISTS zlink_rowcost.sums (day int, bucket int, key text, \
         src text, upto bigint, n blob, PRIMARY KEY ((day, bucket), key, src))",
        (),
    )
    .await?;
    let stmt = s
        .prepare(
            "UPDATE zlink_rowcost.sums USING TIMESTAMP ? SET upto = ?, n = ? \
             WHERE day = ? AND bucket = ? AND key = ? AND src = ?",
        )
        .await?;
    let per_batch = per_batch.unwrap_or(if group == 1 {
        128
    } else {
        (128 / group).max(4)
    });
    anyhow::ensure!((1..=4096).contains(&per_batch), "--batch: 1..4096 rows");
    let (t0, c0) = (Instant::now(), cpu_of(pid)?);
    let mut rows = 0;
    let mut seed = 12345;
    for w in 0..windows {
        let parts = window(group, links, bytes, (w as i64 + 1) * 1000, &mut seed);
        rows += write(&s, &stmt, parts, per_batch).await?;
    }
    let (secs, c1) = (t0.elapsed().as_secs_f64(), cpu_of(pid)?);
    tokio::time::sleep(Duration::from_secs(10)).await;
    let c2 = cpu_of(pid)?;
    println!(
        "mode={mode} links={links} windows={windows} bytes={bytes} batch={per_batch} rows={rows} seconds={secs:.1} \
         store_cpu_s={:.2} with_tail_s={:.2}",
        c1 - c0,
        c2 - c0
    );
    s.query_unpaged("DROP KEYSPACE IF EXISTS zlink_rowcost", ())
        .await?;
    Ok(())
}
