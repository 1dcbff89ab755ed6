//! memcache-compare MEMCACHED_ADDR: the redirect path's memcached get, two clients.
//!
//! - `ours`: `zlink_clients::memcache::Memcache` (async, 8 pipelined-free connections, 20 ms
//!   budget per op, circuit breaker), as primary and lastresort use it;
//! - `crate`: the `memcache` crate 0.19 (blocking, its own r2d2 pool of 8 connections, 20 ms
//!   read/write timeouts), called through `tokio::task::spawn_blocking` so it cannot block the
//!   runtime's workers.
//!
//! Both run on a 2-worker multi-thread runtime (a primary's shape on this box) with C concurrent
//! tasks doing N gets in all over 1,000 keys holding a 120-byte JSON value. Printed per
//! client and concurrency: gets/s, p50/p99/max latency, process CPU µs per get (getrusage).
//! Then the frozen case: the same gets against a memcached that accepts and never answers
//! (`kill -STOP`), where what matters is how long a redirect waits.

use std::sync::Arc;
use std::time::{Duration, Instant};
use zlink_clients::breaker::{Breaker, BreakerConfig};
use zlink_clients::memcache::Memcache;

const KEYS: usize = 1_000;
const BUDGET: Duration = Duration::from_millis(20);

fn cpu_us() -> u64 {
    let mut u: libc_rusage = unsafe { std::mem::zeroed() };
    unsafe { getrusage(0, &mut u) };
    let t = |s: i64, us: i64| (s as u64) * 1_000_000 + us as u64;
    t(u.ru_utime.sec, u.ru_utime.usec) + t(u.ru_stime.sec, u.ru_stime.usec)
}

#[repr(C)]
struct Timeval {
    sec: i64,
    usec: i64,
}

#[repr(C)]
#[allow(non_camel_case_types)]
struct libc_rusage {
    ru_utime: Timeval,
    ru_stime: Timeval,
    _rest: [i64; 14],
}

extern "C" {
    fn getrusage(who: i32, usage: *mut libc_rusage) -> i32;
}

fn ours(addr: &str) -> Arc<Memcache> {
    let breaker = Breaker::new(
        "memcached",
        BreakerConfig {
            failures_to_open: 3,
            open_for: Duration::from_secs(1),
        },
        None,
    );
    Arc::new(Memcache::new(addr, 8, BUDGET, breaker))
}

fn theirs(addr: &str) -> Result<Arc<memcache::Client>, memcache::MemcacheError> {
    let url = format!("memcache://{addr}?protocol=ascii&timeout=0.02");
    let c = memcache::Client::with_pool_size(url.as_str(), 8)?;
    c.set_read_timeout(Some(BUDGET))?;
    c.set_write_timeout(Some(BUDGET))?;
    Ok(Arc::new(c))
}

#[derive(Clone, Copy)]
enum Which {
    Ours,
    Crate,
}

struct Run {
    per_s: f64,
    p50: Duration,
    p99: Duration,
    max: Duration,
    cpu_us_per_get: f64,
    errors: usize,
}

async fn run(which: Which, addr: &str, concurrency: usize, total: usize) -> Result<Run, String> {
    let o = ours(addr);
    let c = match which {
        Which::Ours => None,
        Which::Crate => Some(theirs(addr).map_err(|e| e.to_string())?),
    };
    let per_task = total / concurrency;
    let cpu0 = cpu_us();
    let started = Instant::now();
    let mut tasks = Vec::new();
    for t in 0..concurrency {
        let (o, c) = (o.clone(), c.clone());
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::with_capacity(per_task);
            let mut errors = 0;
            for i in 0..per_task {
                let key = format!("mcbench:{}", (t * per_task + i) % KEYS);
                let t0 = Instant::now();
                let ok = match which {
                    Which::Ours => o.get(&key).await.is_ok_and(|v| v.is_some()),
                    Which::Crate => {
                        let c = c.clone().expect("built for this run");
                        tokio::task::spawn_blocking(move || c.get::<Vec<u8>>(&key))
                            .await
                            .is_ok_and(|r| r.is_ok_and(|v| v.is_some()))
                    }
                };
                lat.push(t0.elapsed());
                errors += usize::from(!ok);
            }
            (lat, errors)
        }));
    }
    let mut lat = Vec::with_capacity(total);
    let mut errors = 0;
    for t in tasks {
        let (l, e) = t.await.expect("task");
        lat.extend(l);
        errors += e;
    }
    let wall = started.elapsed();
    let cpu = cpu_us() - cpu0;
    lat.sort();
    let q = |p: f64| lat[((lat.len() as f64 * p) as usize).min(lat.len() - 1)];
    Ok(Run {
        per_s: lat.len() as f64 / wall.as_secs_f64(),
        p50: q(0.5),
        p99: q(0.99),
        max: *lat.last().unwrap(),
        cpu_us_per_get: cpu as f64 / lat.len() as f64,
        errors,
    })
}

fn main() {
    let mut args = std::env::args().skip(1);
    let addr = args.next().expect("usage: memcache-compare ADDR [FROZEN_ADDR]");
    let frozen = args.next();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let value = br#"{"url":"https://example.com/some/landing/page?utm_source=zlink&utm_medium=short","status":"active","code":302,"exp":null,"ver":1}"#;
        let o = ours(&addr);
        for k in 0..KEYS {
            o.set(&format!("mcbench:{k}"), value, 600).await.expect("prefill");
        }
        println!("| client | concurrency | gets/s | p50 µs | p99 µs | max µs | CPU µs/get | errors |");
        println!("|---|---|---|---|---|---|---|---|");
        for concurrency in [1, 16, 64] {
            for (name, which) in [("ours", Which::Ours), ("memcache crate", Which::Crate)] {
                // Warm-up, then the measured run.
                run(which, &addr, concurrency, 2_000).await.expect("warm-up");
                let r = run(which, &addr, concurrency, 100_000).await.expect("run");
                println!(
                    "| {name} | {concurrency} | {:.0} | {} | {} | {} | {:.1} | {} |",
                    r.per_s,
                    r.p50.as_micros(),
                    r.p99.as_micros(),
                    r.max.as_micros(),
                    r.cpu_us_per_get,
                    r.errors
                );
            }
        }
        if let Some(frozen) = frozen {
            println!();
            println!("frozen memcached at {frozen} (accepts, never answers), 64 tasks × 50 gets:");
            println!("| client | wall ms | p50 µs | p99 µs | max µs |");
            println!("|---|---|---|---|---|");
            for (name, which) in [("ours", Which::Ours), ("memcache crate", Which::Crate)] {
                let started = Instant::now();
                let r = match run(which, &frozen, 64, 3_200).await {
                    Ok(r) => r,
                    Err(e) => {
                        println!(
                            "| {name} | {} | client not created: {e} | | |",
                            started.elapsed().as_millis()
                        );
                        continue;
                    }
                };
                println!(
                    "| {name} | {} | {} | {} | {} |",
                    started.elapsed().as_millis(),
                    r.p50.as_micros(),
                    r.p99.as_micros(),
                    r.max.as_micros()
                );
            }
        }
    });
}
