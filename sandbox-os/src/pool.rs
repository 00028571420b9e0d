//! The warm pool: sandboxes built ahead of time, one shape at a time.
//!
//! A run whose [`Spec`] (mounts, limits, network, identity mode, ...) equals a pooled
//! sandbox's takes it and only pays for sending the command, `fork` and `exec`; namespaces,
//! the root file system, landlock, seccomp and the cgroup were done before. Each pooled
//! sandbox is used once, so nothing carries over between runs.
//!
//! Sizing ([`PoolSize`]): by default the pool is *adaptive*. A shape is only pooled once it
//! has run; after each run the pool builds, on background threads, as many sandboxes as
//! the shape recently had runs in flight at once (at least one, at most
//! [`PoolSize::Adaptive::per_shape`]). Idle sandboxes are two sleeping processes each: they
//! use no CPU, are killed after [`PoolSize::Adaptive::idle_ttl`] without use, and at most
//! [`PoolSize::Adaptive::total`] are kept across shapes (the oldest goes first). Dropping
//! the pool kills every idle sandbox (their helpers see the control socket close).

use sandbox_core::SetupStage;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use sandbox_core::Result;

use crate::cgroup::{Layout, RunCgroup};
use crate::identity::Registry;
use crate::protocol::Spec;
use crate::supervise::{self, Prepared};

/// How many sandboxes a pool keeps built ahead of time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PoolSize {
    /// No pool: every run builds its sandbox.
    Off,
    /// Up to this many idle sandboxes per shape, always (no expiry).
    Fixed(usize),
    /// Sized by recent demand (the default; see the module docs).
    Adaptive {
        /// Most idle sandboxes kept for one shape.
        per_shape: usize,
        /// Most idle sandboxes kept across all shapes.
        total: usize,
        /// An idle sandbox unused this long is killed.
        idle_ttl: Duration,
    },
}

impl Default for PoolSize {
    /// Adaptive: at most 4 per shape and 8 in all, killed after 30 s idle.
    fn default() -> Self {
        PoolSize::Adaptive {
            per_shape: 4,
            total: 8,
            idle_ttl: Duration::from_secs(30),
        }
    }
}

impl PoolSize {
    /// `0` is [`PoolSize::Off`], anything else [`PoolSize::Fixed`].
    pub fn fixed(per_shape: usize) -> Self {
        if per_shape == 0 {
            PoolSize::Off
        } else {
            PoolSize::Fixed(per_shape)
        }
    }

    fn per_shape(self) -> usize {
        match self {
            PoolSize::Off => 0,
            PoolSize::Fixed(n) => n,
            PoolSize::Adaptive { per_shape, .. } => per_shape,
        }
    }

    fn total(self) -> usize {
        match self {
            PoolSize::Adaptive { total, .. } => total,
            other => other.per_shape().saturating_mul(64),
        }
    }

    fn idle_ttl(self) -> Option<Duration> {
        match self {
            PoolSize::Adaptive { idle_ttl, .. } => Some(idle_ttl),
            _ => None,
        }
    }
}

/// A sandbox built ahead of time, with its cgroup.
#[derive(Debug)]
pub struct Warm {
    /// The helper, waiting for its command.
    pub prepared: Prepared,
    /// The run's cgroup (removed when dropped).
    pub cgroup: Option<RunCgroup>,
}

/// Builds a sandbox for `spec`: creates its cgroup with the spec's limits, spawns the
/// helper, sends the spec. With [`Spec::fresh_ids`], the sandbox's tool gets host ids no
/// other sandbox has, from `registry`.
pub fn build(
    helper: &std::path::Path,
    spec: &Spec,
    layout: Option<&Layout>,
    registry: Option<&Registry>,
) -> Result<Warm> {
    let mut spec = spec.clone();
    if spec.fresh_ids {
        let registry = registry.ok_or_else(|| {
            sandbox_core::Error::internal(
                "allocate a fresh host identity",
                std::io::Error::other("no id registry"),
            )
        })?;
        let ids = registry.fresh().map_err(|e| {
            sandbox_core::Error::setup(SetupStage::Identity, "allocate a fresh host identity", e)
        })?;
        spec.host_ids = Some(ids);
    }
    let cgroup = layout
        .map(|layout| RunCgroup::create(layout, &spec.run.limits, spec.live))
        .transpose()
        .map_err(|e| sandbox_core::Error::setup(SetupStage::Cgroup, "create run cgroup", e))?;
    if let Some(cg) = &cgroup {
        spec.cgroup_procs = cg.procs_files();
    }
    let prepared = supervise::prepare(helper, &spec)?;
    Ok(Warm { prepared, cgroup })
}

/// How long a run waits for a sandbox of its shape that is being built before it builds its
/// own: 2 s (a build takes milliseconds; this bounds a build that hangs).
pub const BUILD_WAIT: Duration = Duration::from_secs(2);

/// What a refill needs to build sandboxes on its own thread.
#[derive(Clone, Debug)]
pub struct Recipe {
    /// Helper binary.
    pub helper: PathBuf,
    /// The shape.
    pub spec: Spec,
    /// Where cgroups go, if anywhere.
    pub layout: Option<Layout>,
    /// Where fresh host ids come from, when the spec asks for them.
    pub registry: Option<Arc<Registry>>,
}

struct Idle {
    warm: Warm,
    since: Instant,
}

#[derive(Default)]
struct Shape {
    idle: Vec<Idle>,
    building: usize,
    /// Runs waiting for one of the sandboxes being built.
    waiting: usize,
    /// Runs of this shape in flight now.
    in_flight: usize,
    /// Most runs in flight at once recently, and when that was last seen.
    peak: usize,
    peak_at: Option<Instant>,
}

#[derive(Default)]
struct State {
    shapes: HashMap<String, Shape>,
    reaper: bool,
    closed: bool,
    stats: PoolStats,
}

/// Counters of a pool since it was created.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PoolStats {
    /// Runs that took a pre-built sandbox.
    pub warm_runs: u64,
    /// Runs that built their own.
    pub cold_runs: u64,
    /// Sandboxes built ahead of time.
    pub built: u64,
    /// Idle sandboxes killed after their time to live.
    pub expired: u64,
    /// Idle sandboxes killed to stay within the total.
    pub evicted: u64,
}

/// Pre-started sandboxes keyed by shape ([`Spec::pool_key`]).
pub struct Pool {
    size: PoolSize,
    state: Mutex<State>,
    wake: Condvar,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool")
            .field("size", &self.size)
            .field("idle", &self.idle())
            .finish()
    }
}

/// A run of a pooled shape in flight; ends the run's share of the shape's demand on drop.
pub struct Lease {
    pool: Arc<Pool>,
    key: String,
}

impl Drop for Lease {
    fn drop(&mut self) {
        let mut state = lock(&self.pool.state);
        if let Some(shape) = state.shapes.get_mut(&self.key) {
            shape.in_flight = shape.in_flight.saturating_sub(1);
        }
    }
}

impl Pool {
    /// A pool of this size.
    pub fn new(size: PoolSize) -> Self {
        Pool {
            size,
            state: Mutex::new(State::default()),
            wake: Condvar::new(),
        }
    }

    /// Whether pooling is on.
    pub fn enabled(&self) -> bool {
        self.size.per_shape() > 0
    }

    /// Counters since the pool was created.
    pub fn stats(&self) -> PoolStats {
        lock(&self.state).stats
    }

    /// Number of idle sandboxes across all shapes.
    pub fn idle(&self) -> usize {
        lock(&self.state)
            .shapes
            .values()
            .map(|s| s.idle.len())
            .sum()
    }

    /// Registers a run of shape `key` and takes an idle sandbox of that shape, if one is
    /// ready or being built (waiting for it up to [`BUILD_WAIT`]). The lease counts the run
    /// as in flight (the demand the pool sizes itself by) until dropped.
    pub fn take(self: &Arc<Self>, key: &str) -> (Option<Warm>, Lease) {
        let lease = Lease {
            pool: Arc::clone(self),
            key: key.to_string(),
        };
        let mut state = lock(&self.state);
        let shape = state.shapes.entry(key.to_string()).or_default();
        shape.in_flight += 1;
        let now = Instant::now();
        let stale = match (self.size.idle_ttl(), shape.peak_at) {
            (Some(ttl), Some(at)) => now.duration_since(at) > ttl,
            _ => false,
        };
        if stale || shape.in_flight >= shape.peak {
            shape.peak = shape.in_flight;
            shape.peak_at = Some(now);
        }
        // Most recently built first: the oldest idle sandboxes are the ones to expire.
        let mut warm = shape.idle.pop().map(|idle| idle.warm);
        // None idle but one being built (back-to-back runs outpace the refill that the
        // previous run started): waiting costs the rest of that build, where building
        // another costs a whole one that competes with it for the CPU, the slow path of a
        // loaded host. One waiter per build in progress; a failed build wakes its waiter,
        // which then builds its own.
        let deadline = now + BUILD_WAIT;
        while warm.is_none() {
            if state.closed {
                break;
            }
            let Some(shape) = state.shapes.get_mut(key) else {
                break;
            };
            if shape.building <= shape.waiting {
                break;
            }
            let Some(left) = deadline.checked_duration_since(Instant::now()) else {
                break;
            };
            shape.waiting += 1;
            state = match self.wake.wait_timeout(state, left) {
                Ok((guard, _)) => guard,
                Err(poisoned) => poisoned.into_inner().0,
            };
            let Some(shape) = state.shapes.get_mut(key) else {
                break;
            };
            shape.waiting -= 1;
            warm = shape.idle.pop().map(|idle| idle.warm);
        }
        match warm {
            Some(_) => state.stats.warm_runs += 1,
            None => state.stats.cold_runs += 1,
        }
        (warm, lease)
    }

    /// How many sandboxes shape `key` should have idle or being built.
    fn target(&self, shape: &Shape) -> usize {
        match self.size {
            PoolSize::Off => 0,
            PoolSize::Fixed(n) => n,
            PoolSize::Adaptive { per_shape, .. } => shape.peak.clamp(1, per_shape.max(1)),
        }
    }

    /// Starts building sandboxes of this shape in the background until the shape has its
    /// target idle or being built (and the pool its total).
    pub fn refill(self: &Arc<Self>, key: String, recipe: Recipe) {
        if !self.enabled() {
            return;
        }
        let missing = {
            let mut state = lock(&self.state);
            if state.closed {
                return;
            }
            // A shape in use gets its sandboxes even when the pool is full: the oldest idle
            // ones (of other shapes) make room when these are filed.
            let total = self.size.total();
            let shape = state.shapes.entry(key.clone()).or_default();
            let target = self.target(shape).min(total);
            let missing = target.saturating_sub(shape.idle.len() + shape.building);
            shape.building += missing;
            missing
        };
        for _ in 0..missing {
            let pool = Arc::clone(self);
            let thread_key = key.clone();
            let recipe = recipe.clone();
            let spawned = std::thread::Builder::new()
                .name("strata-pool".into())
                .spawn(move || {
                    let built = build(
                        &recipe.helper,
                        &recipe.spec,
                        recipe.layout.as_ref(),
                        recipe.registry.as_deref(),
                    );
                    pool.built(&thread_key, built);
                });
            if spawned.is_err() {
                let mut state = lock(&self.state);
                if let Some(shape) = state.shapes.get_mut(&key) {
                    shape.building = shape.building.saturating_sub(1);
                }
            }
        }
    }

    /// Files a sandbox a refill built (or kills it if the pool closed meanwhile). The
    /// build counts as in progress until then, so [`Pool::clear`] waits for the kill.
    fn built(self: &Arc<Self>, key: &str, built: Result<Warm>) {
        let done = |state: &mut State| {
            if let Some(shape) = state.shapes.get_mut(key) {
                shape.building = shape.building.saturating_sub(1);
            }
            self.wake.notify_all();
        };
        let mut state = lock(&self.state);
        let warm = match built {
            Ok(warm) if !state.closed => warm,
            other => {
                drop(state);
                if let Err(e) = &other {
                    tracing::debug!(error = %e, "warm sandbox not built");
                }
                drop(other); // kills a sandbox built for a closed pool
                done(&mut lock(&self.state));
                return;
            }
        };
        done(&mut state);
        state.stats.built += 1;
        state
            .shapes
            .entry(key.to_string())
            .or_default()
            .idle
            .push(Idle {
                warm,
                since: Instant::now(),
            });
        let evicted = evict_over_total(&mut state, self.size.total());
        state.stats.evicted += evicted.len() as u64;
        let start_reaper = self.size.idle_ttl().is_some() && !state.reaper;
        if start_reaper {
            state.reaper = true;
        }
        drop(state);
        drop(evicted);
        if start_reaper {
            let pool = Arc::clone(self);
            let spawned = std::thread::Builder::new()
                .name("strata-pool-reaper".into())
                .spawn(move || pool.reap());
            if spawned.is_err() {
                lock(&self.state).reaper = false;
            }
        }
    }

    /// Kills idle sandboxes past their time to live; sleeps until the next one is due and
    /// ends when none is idle (so an idle pool has no thread awake).
    fn reap(self: Arc<Self>) {
        let Some(ttl) = self.size.idle_ttl() else {
            return;
        };
        let mut state = lock(&self.state);
        loop {
            let now = Instant::now();
            let mut expired = Vec::new();
            for shape in state.shapes.values_mut() {
                let (old, young): (Vec<Idle>, Vec<Idle>) = std::mem::take(&mut shape.idle)
                    .into_iter()
                    .partition(|idle| now.duration_since(idle.since) >= ttl);
                shape.idle = young;
                expired.extend(old);
            }
            state
                .shapes
                .retain(|_, s| !s.idle.is_empty() || s.building > 0 || s.in_flight > 0);
            let next = state
                .shapes
                .values()
                .flat_map(|s| s.idle.iter().map(|idle| idle.since + ttl))
                .min();
            if !expired.is_empty() {
                state.stats.expired += expired.len() as u64;
                drop(state);
                drop(expired); // kills them, outside the lock
                state = lock(&self.state);
                continue;
            }
            match next {
                Some(due) if !state.closed => {
                    let wait = due.saturating_duration_since(Instant::now());
                    state = match self.wake.wait_timeout(state, wait) {
                        Ok((guard, _)) => guard,
                        Err(poisoned) => poisoned.into_inner().0,
                    };
                }
                _ => {
                    state.reaper = false;
                    return;
                }
            }
        }
    }

    /// Closes the pool: kills every idle sandbox, and waits (at most `wait`) for those
    /// being built, which are killed as soon as they are done.
    pub fn clear(&self, wait: Duration) {
        let mut state = lock(&self.state);
        state.closed = true;
        let idle: Vec<Idle> = state
            .shapes
            .values_mut()
            .flat_map(|s| std::mem::take(&mut s.idle))
            .collect();
        self.wake.notify_all();
        let building = |state: &mut State| state.shapes.values().any(|s| s.building > 0);
        let state = match self.wake.wait_timeout_while(state, wait, |s| building(s)) {
            Ok((guard, _)) => guard,
            Err(poisoned) => poisoned.into_inner().0,
        };
        drop(state);
        drop(idle);
    }
}

/// Removes the oldest idle sandboxes while more than `total` are idle; returns them so the
/// caller kills them outside the lock.
fn evict_over_total(state: &mut State, total: usize) -> Vec<Idle> {
    let mut evicted = Vec::new();
    loop {
        let idle: usize = state.shapes.values().map(|s| s.idle.len()).sum();
        if idle <= total {
            return evicted;
        }
        let oldest = state
            .shapes
            .values_mut()
            .filter(|s| !s.idle.is_empty())
            .min_by_key(|s| s.idle.first().map(|i| i.since));
        match oldest {
            Some(shape) => evicted.push(shape.idle.remove(0)),
            None => return evicted,
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    match m.lock() {
        Ok(g) => g,
        Err(poisoned) => poisoned.into_inner(),
    }
}
