//! Deadlines and circuit breaking for one dependency (a store, a cache, S3): the helper every tier
//! puts in front of every remote call on the redirect path.
//!
//! A call gets a budget; not answering within it is a failure exactly like a refused
//! connection. After `failures_to_open` consecutive failures the breaker opens: calls fail at
//! once (no I/O) for `open_for`. Then one call is let through as a probe (half-open); every other
//! call keeps failing fast while it runs. The probe's success closes the breaker, its failure
//! (or its cancellation: a caller that gave up did not get an answer) opens it for another
//! `open_for`. So a hung dependency costs `failures_to_open` budgets once, then at most one
//! budget per `open_for` window per process, never one per request.
//!
//! Which errors count is the caller's decision (`is_failure`): "not found" or a malformed row is
//! an answer, not a sick dependency.

use prometheus::{IntCounterVec, IntGaugeVec, Opts, Registry};
use std::future::Future;
use std::sync::Mutex;
use std::time::Duration;
use tokio::time::Instant;

/// Breaker settings; every tier exposes them as flags.
#[derive(Debug, Clone, Copy)]
pub struct BreakerConfig {
    /// Consecutive failures (errors or blown budgets) that open the breaker.
    pub failures_to_open: u32,
    /// How long an open breaker fails calls without trying, before one probe.
    pub open_for: Duration,
}

impl BreakerConfig {
    pub fn validate(&self, flag: &str) -> Result<(), String> {
        if !(1..=1000).contains(&self.failures_to_open) {
            return Err(format!("{flag}-failures must be between 1 and 1000"));
        }
        if !(Duration::from_millis(10)..=Duration::from_secs(600)).contains(&self.open_for) {
            return Err(format!("{flag}-open-ms must be between 10 and 600000"));
        }
        Ok(())
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    Closed,
    Open,
    HalfOpen,
}

impl State {
    fn label(self) -> &'static str {
        match self {
            State::Closed => "closed",
            State::Open => "open",
            State::HalfOpen => "half_open",
        }
    }
    /// The gauge value: 0 closed, 1 open, 2 half-open.
    fn gauge(self) -> i64 {
        match self {
            State::Closed => 0,
            State::Open => 1,
            State::HalfOpen => 2,
        }
    }
}

/// Why a call through the breaker did not return the dependency's answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CallError<E> {
    /// The breaker is open (or a probe is already running): nothing was sent.
    #[error("circuit open: {0} failed recently")]
    Open(&'static str),
    /// The dependency did not answer within the budget.
    #[error("{0} did not answer within {1:?}")]
    Timeout(&'static str, Duration),
    /// The dependency answered with an error.
    #[error("{0}")]
    Failed(E),
}

impl<E> CallError<E> {
    /// Label for error metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            CallError::Open(_) => "circuit_open",
            CallError::Timeout(..) => "timeout",
            CallError::Failed(_) => "error",
        }
    }
}

/// Metrics of every breaker of a process, labelled by dependency.
#[derive(Clone)]
pub struct BreakerMetrics {
    state: IntGaugeVec,
    transitions: IntCounterVec,
    rejected: IntCounterVec,
    timeouts: IntCounterVec,
}

impl BreakerMetrics {
    /// Registers `breaker_state`, `breaker_transitions_total`, `breaker_rejected_total` and
    /// `dependency_timeouts_total`, labelled `dependency`, under the registry's prefix.
    pub fn register(registry: &Registry) -> Result<Self, prometheus::Error> {
        let state = IntGaugeVec::new(
            Opts::new(
                "breaker_state",
                "Circuit breaker per dependency: 0 closed, 1 open (failing fast), 2 half-open (one probe)",
            ),
            &["dependency"],
        )?;
        let transitions = IntCounterVec::new(
            Opts::new(
                "breaker_transitions_total",
                "Circuit breaker state changes, by the state entered",
            ),
            &["dependency", "to"],
        )?;
        let rejected = IntCounterVec::new(
            Opts::new(
                "breaker_rejected_total",
                "Calls failed fast by an open circuit breaker (no request sent)",
            ),
            &["dependency"],
        )?;
        let timeouts = IntCounterVec::new(
            Opts::new(
                "dependency_timeouts_total",
                "Calls to a dependency that did not answer within their budget",
            ),
            &["dependency"],
        )?;
        registry.register(Box::new(state.clone()))?;
        registry.register(Box::new(transitions.clone()))?;
        registry.register(Box::new(rejected.clone()))?;
        registry.register(Box::new(timeouts.clone()))?;
        Ok(BreakerMetrics {
            state,
            transitions,
            rejected,
            timeouts,
        })
    }
}

struct Inner {
    state: State,
    failures: u32,
    /// When an open breaker lets its next probe through.
    retry_at: Instant,
}

pub struct Breaker {
    name: &'static str,
    cfg: BreakerConfig,
    inner: Mutex<Inner>,
    metrics: Option<BreakerMetrics>,
    /// The clock of its windows and budgets: `Instant::now`, a test's own clock in its tests
    /// (the budgets' timers are tokio's either way).
    now: fn() -> Instant,
}

/// Admission of one call; must be settled with [`Attempt::done`]. Dropped unsettled (the caller
/// was cancelled, e.g. by its own deadline), it counts as a failure: no answer came. (Through
/// [`Breaker::call`], only once the call's budget has run out: a call its caller abandons
/// earlier is no evidence either way.)
pub struct Attempt<'a> {
    breaker: &'a Breaker,
    probe: bool,
    settled: bool,
}

impl Attempt<'_> {
    /// Records the outcome: `true` = the dependency answered.
    pub fn done(mut self, healthy: bool) {
        self.settled = true;
        self.breaker.settle(self.probe, healthy);
    }

    /// The caller gave up before the call's budget ran out (a client that went away, a bulk
    /// request's own deadline): that says nothing about the dependency, so it is no failure. A
    /// probe given up this way leaves the breaker open with the next probe due at once.
    fn abandon(mut self) {
        self.settled = true;
        if self.probe {
            let mut inner = self.breaker.lock();
            if inner.state == State::HalfOpen {
                inner.retry_at = (self.breaker.now)();
                self.breaker.enter(&mut inner, State::Open);
            }
        }
    }
}

/// An attempt made by [`Breaker::call`]: dropped before its budget ran out it is abandoned,
/// dropped later (the budget's own timeout did not get to run) it is a failure.
struct Budgeted<'a> {
    attempt: Option<Attempt<'a>>,
    give_up_at: Instant,
}

impl Budgeted<'_> {
    fn done(mut self, healthy: bool) {
        if let Some(a) = self.attempt.take() {
            a.done(healthy);
        }
    }
}

impl Drop for Budgeted<'_> {
    fn drop(&mut self) {
        if let Some(a) = self.attempt.take() {
            if (a.breaker.now)() < self.give_up_at {
                a.abandon();
            }
        }
    }
}

impl Drop for Attempt<'_> {
    fn drop(&mut self) {
        if !self.settled {
            self.breaker.settle(self.probe, false);
        }
    }
}

impl Breaker {
    pub fn new(name: &'static str, cfg: BreakerConfig, metrics: Option<BreakerMetrics>) -> Self {
        Self::with_clock(name, cfg, metrics, Instant::now)
    }

    fn with_clock(
        name: &'static str,
        cfg: BreakerConfig,
        metrics: Option<BreakerMetrics>,
        now: fn() -> Instant,
    ) -> Self {
        if let Some(m) = &metrics {
            m.state.with_label_values(&[name]).set(0);
        }
        Breaker {
            name,
            cfg,
            inner: Mutex::new(Inner {
                state: State::Closed,
                failures: 0,
                retry_at: now(),
            }),
            metrics,
            now,
        }
    }

    pub fn name(&self) -> &'static str {
        self.name
    }

    pub fn state(&self) -> State {
        self.lock().state
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A panic while holding this lock cannot leave Inner inconsistent (plain field stores).
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn enter(&self, inner: &mut Inner, to: State) {
        if inner.state == to {
            return;
        }
        inner.state = to;
        if let Some(m) = &self.metrics {
            m.state.with_label_values(&[self.name]).set(to.gauge());
            m.transitions
                .with_label_values(&[self.name, to.label()])
                .inc();
        }
        match to {
            State::Open => tracing::warn!(dependency = self.name, "circuit opened"),
            State::Closed => tracing::info!(dependency = self.name, "circuit closed"),
            State::HalfOpen => {
                tracing::debug!(dependency = self.name, "circuit half-open: probing")
            }
        }
    }

    /// Admits a call, or refuses it (open, or half-open with its probe already running).
    pub fn try_acquire(&self) -> Result<Attempt<'_>, CallError<std::convert::Infallible>> {
        let mut inner = self.lock();
        let probe = match inner.state {
            State::Closed => false,
            State::Open if (self.now)() >= inner.retry_at => {
                self.enter(&mut inner, State::HalfOpen);
                true
            }
            State::Open | State::HalfOpen => {
                if let Some(m) = &self.metrics {
                    m.rejected.with_label_values(&[self.name]).inc();
                }
                return Err(CallError::Open(self.name));
            }
        };
        Ok(Attempt {
            breaker: self,
            probe,
            settled: false,
        })
    }

    fn settle(&self, probe: bool, healthy: bool) {
        let mut inner = self.lock();
        if healthy {
            inner.failures = 0;
            // A late success of a call admitted before the breaker opened closes it too: the
            // dependency answers again.
            self.enter(&mut inner, State::Closed);
            return;
        }
        inner.failures = inner.failures.saturating_add(1);
        let trip =
            probe || (inner.state == State::Closed && inner.failures >= self.cfg.failures_to_open);
        if trip {
            inner.retry_at = (self.now)() + self.cfg.open_for;
            self.enter(&mut inner, State::Open);
        }
    }

    /// Runs `call` within `budget` through the breaker. `is_failure` tells which of the
    /// dependency's errors mean it is unhealthy (others are answers and keep the circuit closed).
    pub async fn call<T, E, F>(
        &self,
        budget: Duration,
        is_failure: impl FnOnce(&E) -> bool,
        call: F,
    ) -> Result<T, CallError<E>>
    where
        F: Future<Output = Result<T, E>>,
    {
        let attempt = Budgeted {
            attempt: Some(self.try_acquire().map_err(|_| CallError::Open(self.name))?),
            give_up_at: (self.now)() + budget,
        };
        match tokio::time::timeout(budget, call).await {
            Ok(Ok(v)) => {
                attempt.done(true);
                Ok(v)
            }
            Ok(Err(e)) => {
                attempt.done(!is_failure(&e));
                Err(CallError::Failed(e))
            }
            Err(_) => {
                if let Some(m) = &self.metrics {
                    m.timeouts.with_label_values(&[self.name]).inc();
                }
                attempt.done(false);
                Err(CallError::Timeout(self.name, budget))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;
    use std::sync::atomic::{AtomicU32, Ordering};

    // The breakers' windows run on a clock each test moves by hand (`advance`; it stands still
    // otherwise, one per test thread), so no window depends on how fast the machine is. The
    // budgets are tokio timers in real time: a hung call costs its (short) budget for real, and
    // a caller that gives up does so long before the budget it abandons.
    thread_local! {
        static EPOCH: Instant = Instant::now();
        static MOVED: Cell<Duration> = const { Cell::new(Duration::ZERO) };
    }

    fn test_now() -> Instant {
        EPOCH.with(|e| *e) + MOVED.with(Cell::get)
    }

    fn advance(by: Duration) {
        MOVED.with(|m| m.set(m.get() + by));
    }

    fn breaker(n: u32, open_ms: u64) -> Breaker {
        Breaker::with_clock(
            "dep",
            BreakerConfig {
                failures_to_open: n,
                open_for: Duration::from_millis(open_ms),
            },
            None,
            test_now,
        )
    }

    async fn hang() -> Result<(), ()> {
        std::future::pending().await
    }

    #[tokio::test]
    async fn a_hung_dependency_costs_n_budgets_then_one_probe_per_window() {
        let b = breaker(3, 1000);
        let budget = Duration::from_millis(20);
        let calls = AtomicU32::new(0);
        // Counts the calls that reach the dependency (are polled), not the futures made.
        let counted = || async {
            calls.fetch_add(1, Ordering::Relaxed);
            hang().await
        };
        for _ in 0..3 {
            assert_eq!(
                b.call(budget, |_| true, counted()).await,
                Err(CallError::Timeout("dep", budget))
            );
        }
        assert_eq!(b.state(), State::Open);
        // 100 more calls within the window: none reaches the dependency, none waits for its
        // budget (each is refused as open, not timed out).
        for _ in 0..100 {
            assert_eq!(
                b.call(budget, |_| true, counted()).await,
                Err(CallError::Open("dep"))
            );
        }
        assert_eq!(calls.load(Ordering::Relaxed), 3);
        // After the window exactly one probe goes through; while it runs, others fail fast.
        advance(Duration::from_millis(999));
        assert!(b.try_acquire().is_err(), "still within the window");
        advance(Duration::from_millis(1));
        let probe = b.try_acquire().expect("the probe");
        assert_eq!(b.state(), State::HalfOpen);
        assert!(b.try_acquire().is_err());
        probe.done(false);
        assert_eq!(b.state(), State::Open);
        assert!(b.try_acquire().is_err());
        // Next window: the probe succeeds and the circuit closes.
        advance(Duration::from_millis(1000));
        assert_eq!(
            b.call(budget, |_: &()| true, async { Ok::<_, ()>(7) })
                .await,
            Ok(7)
        );
        assert_eq!(b.state(), State::Closed);
    }

    #[tokio::test]
    async fn answers_that_are_not_failures_keep_it_closed_and_a_success_resets_the_count() {
        let b = breaker(2, 1000);
        let d = Duration::from_millis(50);
        for _ in 0..10 {
            let r = b.call(d, |e: &&str| *e != "not found", async {
                Err::<(), _>("not found")
            });
            assert!(matches!(r.await, Err(CallError::Failed("not found"))));
        }
        assert_eq!(b.state(), State::Closed);
        let _ = b.call(d, |_| true, async { Err::<(), _>("down") }).await;
        let _ = b.call(d, |_| true, async { Ok::<_, &str>(()) }).await;
        let _ = b.call(d, |_| true, async { Err::<(), _>("down") }).await;
        assert_eq!(b.state(), State::Closed, "not consecutive");
        let _ = b.call(d, |_| true, async { Err::<(), _>("down") }).await;
        assert_eq!(b.state(), State::Open);
    }

    #[tokio::test]
    async fn callers_that_give_up_within_the_budget_are_no_evidence() {
        // A client that goes away, a bulk request's own deadline: the dependency did not fail.
        let b = breaker(2, 1000);
        for _ in 0..10 {
            let call = b.call(Duration::from_secs(30), |_| true, hang());
            assert!(tokio::time::timeout(Duration::from_millis(1), call)
                .await
                .is_err());
        }
        assert_eq!(b.state(), State::Closed);
        // Its own budget running out still is.
        for _ in 0..2 {
            let _ = b.call(Duration::from_millis(5), |_| true, hang()).await;
        }
        assert_eq!(b.state(), State::Open);
    }

    #[tokio::test]
    async fn a_cancelled_probe_reopens_instead_of_wedging_half_open() {
        let b = breaker(1, 500);
        let _ = b.call(Duration::from_millis(5), |_| true, hang()).await;
        assert_eq!(b.state(), State::Open);
        advance(Duration::from_millis(500));
        {
            let probe = b.call(Duration::from_secs(30), |_| true, hang());
            // The caller gives up (its own deadline) before the probe's budget.
            let _ = tokio::time::timeout(Duration::from_millis(1), probe).await;
        }
        assert_eq!(b.state(), State::Open);
        // The abandoned probe said nothing about the dependency: the next one is due at once.
        assert!(
            b.try_acquire().is_ok(),
            "a new probe without another window"
        );
    }
}
