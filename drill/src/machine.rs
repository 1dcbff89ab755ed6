//! How starved the machine itself was during a phase, so a missed target can be told apart from
//! a box that had no CPU to give: the share of the CPUs busy, the share a hypervisor gave to
//! others (steal), and the share of the phase in which some runnable task waited for a CPU
//! (`/proc/pressure/cpu`, "some"). Read from `/proc` at each phase's start and end; on a kernel
//! without one of them that figure is absent, never made up.

use std::time::Instant;

// Fields of the `cpu` line.
const IDLE: usize = 3;
const IOWAIT: usize = 4;
const STEAL: usize = 7;

/// The counters at one moment.
#[derive(Clone, Debug)]
pub struct Snapshot {
    /// `/proc/stat`'s `cpu` line: user nice system idle iowait irq softirq steal (jiffies).
    cpu: Option<[u64; 8]>,
    /// `/proc/pressure/cpu`'s `some total` (µs).
    waiting_us: Option<u64>,
    at: Instant,
}

/// What the machine did between two snapshots, in % of the interval.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Load {
    /// Of all CPUs' time: running this machine's work (not idle, iowait or steal).
    pub busy_pct: Option<f64>,
    /// Of all CPUs' time: taken by the hypervisor for other guests.
    pub steal_pct: Option<f64>,
    /// Of wall time: some runnable task waited for a CPU.
    pub waiting_pct: Option<f64>,
}

pub fn snapshot() -> Snapshot {
    Snapshot {
        cpu: std::fs::read_to_string("/proc/stat")
            .ok()
            .and_then(|s| parse_stat(&s)),
        waiting_us: std::fs::read_to_string("/proc/pressure/cpu")
            .ok()
            .and_then(|s| parse_pressure(&s)),
        at: Instant::now(),
    }
}

fn parse_stat(s: &str) -> Option<[u64; 8]> {
    let line = s.lines().next()?.strip_prefix("cpu ")?;
    let mut out = [0u64; 8];
    let mut fields = line.split_whitespace();
    for v in &mut out {
        *v = fields.next()?.parse().ok()?;
    }
    Some(out)
}

fn parse_pressure(s: &str) -> Option<u64> {
    let line = s.lines().find(|l| l.starts_with("some "))?;
    line.split_whitespace()
        .find_map(|f| f.strip_prefix("total="))?
        .parse()
        .ok()
}

/// The load from `a` to `b` (`b` later).
pub fn between(a: &Snapshot, b: &Snapshot) -> Load {
    let (busy_pct, steal_pct) = match (a.cpu, b.cpu) {
        (Some(x), Some(y)) => {
            let d: Vec<u64> = x.iter().zip(y).map(|(x, y)| y.saturating_sub(*x)).collect();
            let total: u64 = d.iter().sum();
            if total == 0 {
                (None, None)
            } else {
                let idle = d[IDLE] + d[IOWAIT];
                let pct = |n: u64| Some(100.0 * n as f64 / total as f64);
                (pct(total - idle - d[STEAL]), pct(d[STEAL]))
            }
        }
        _ => (None, None),
    };
    let wall_us = b.at.duration_since(a.at).as_micros() as f64;
    let waiting_pct = match (a.waiting_us, b.waiting_us) {
        (Some(x), Some(y)) if wall_us > 0.0 => {
            Some((100.0 * y.saturating_sub(x) as f64 / wall_us).min(100.0))
        }
        _ => None,
    };
    Load {
        busy_pct,
        steal_pct,
        waiting_pct,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn reads_the_kernel_formats() {
        let stat =
            "cpu  596655 223788 163448 6041003 5595 0 12553 9875 0 0\ncpu0 1 2 3 4 5 6 7 8 0 0\n";
        assert_eq!(
            parse_stat(stat),
            Some([596655, 223788, 163448, 6041003, 5595, 0, 12553, 9875])
        );
        assert_eq!(parse_stat("cpu0 1 2 3\n"), None);
        assert_eq!(parse_stat("cpu  1 2 3\n"), None, "too few fields");
        let psi = "some avg10=1.05 avg60=3.79 avg300=11.93 total=2325682422\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n";
        assert_eq!(parse_pressure(psi), Some(2325682422));
        assert_eq!(parse_pressure("full total=3\n"), None);
    }

    #[test]
    fn shares_of_the_interval() {
        let at = Instant::now();
        let a = Snapshot {
            cpu: Some([100, 0, 100, 600, 100, 0, 0, 0]),
            waiting_us: Some(1_000_000),
            at,
        };
        // 1000 jiffies: 500 user+system, 300 idle, 100 iowait, 100 steal; 0.5 s of 2 s waiting.
        let b = Snapshot {
            cpu: Some([400, 0, 300, 900, 200, 0, 0, 100]),
            waiting_us: Some(1_500_000),
            at: at + Duration::from_secs(2),
        };
        let l = between(&a, &b);
        assert_eq!(l.busy_pct, Some(50.0), "user and system");
        assert_eq!(l.steal_pct, Some(10.0));
        assert_eq!(l.waiting_pct, Some(25.0));
        let none = Snapshot {
            cpu: None,
            waiting_us: None,
            at,
        };
        assert_eq!(between(&none, &b), Load::default(), "absent, not made up");
    }
}
