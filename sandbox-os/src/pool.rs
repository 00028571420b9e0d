//! The warm pool: sandboxes built ahead of time, one shape at a time.
//!
//! A run whose [`Spec`] (mounts, limits, network, ...) matches a pooled sandbox takes it and
//! only pays for sending the command, `fork` and `exec`; namespaces, the root filesystem,
//! landlock, seccomp and the cgroup were done before. Each pooled sandbox is used once, so
//! nothing carries over between runs. After each run of a shape, the pool starts building
//! replacements in the background, up to `per_shape`. Dropping the pool kills every idle
//! sandbox (their helpers see the control socket close, and are killed and reaped).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use sandbox_core::Result;

use crate::cgroup::{self, Layout, RunCgroup};
use crate::identity::Registry;
use crate::protocol::Spec;
use crate::supervise::{self, Prepared};

/// A sandbox built ahead of time, with its cgroup.
#[derive(Debug)]
pub struct Warm {
    /// The helper, waiting for its command.
    pub prepared: Prepared,
    /// The run's cgroup (removed when dropped).
    pub cgroup: Option<RunCgroup>,
}

/// Builds a sandbox for `spec`: creates its cgroup, spawns the helper, sends the spec.
/// With `fresh_ids`, the sandbox's tool gets host ids no other sandbox has
/// ([`Registry::fresh`]); otherwise those of `spec`.
pub fn build(
    helper: &std::path::Path,
    spec: &Spec,
    layout: Option<&Layout>,
    limits: cgroup::Limits,
    fresh_ids: Option<&Registry>,
) -> Result<Warm> {
    let mut spec = spec.clone();
    if let Some(registry) = fresh_ids {
        let ids = registry
            .fresh()
            .map_err(|e| sandbox_core::Error::setup("allocate a fresh host identity", e))?;
        spec.host_ids = Some(ids);
    }
    let cgroup = layout
        .map(|layout| RunCgroup::create(layout, limits))
        .transpose()
        .map_err(|e| sandbox_core::Error::setup("create run cgroup", e))?;
    if let Some(cg) = &cgroup {
        spec.cgroup_procs = cg.procs_files();
    }
    let prepared = supervise::prepare(helper, &spec)?;
    Ok(Warm { prepared, cgroup })
}

/// Pre-started sandboxes keyed by shape.
#[derive(Debug, Default)]
pub struct Pool {
    per_shape: usize,
    idle: Mutex<HashMap<String, Vec<Warm>>>,
    building: Mutex<HashMap<String, usize>>,
}

/// What a refill needs to build sandboxes on its own thread.
#[derive(Clone, Debug)]
pub struct Recipe {
    /// Helper binary.
    pub helper: PathBuf,
    /// The shape.
    pub spec: Spec,
    /// Where cgroups go, if anywhere.
    pub layout: Option<Layout>,
    /// Cgroup limits.
    pub limits: cgroup::Limits,
    /// Give each sandbox fresh host ids from this registry.
    pub fresh_ids: Option<Arc<Registry>>,
}

impl Pool {
    /// A pool keeping up to `per_shape` idle sandboxes for each shape seen (0 disables it).
    pub fn new(per_shape: usize) -> Self {
        Pool {
            per_shape,
            ..Default::default()
        }
    }

    /// Whether pooling is on.
    pub fn enabled(&self) -> bool {
        self.per_shape > 0
    }

    /// Number of idle sandboxes across all shapes.
    pub fn idle(&self) -> usize {
        lock(&self.idle).values().map(Vec::len).sum()
    }

    /// The key of a shape: the spec, every cgroup limit, and whether each sandbox gets
    /// fresh host ids.
    pub fn key(spec: &Spec, limits: cgroup::Limits, fresh_ids: bool) -> String {
        format!(
            "{}|{:?}|fresh_ids={fresh_ids}",
            serde_json::to_string(spec).unwrap_or_default(),
            limits,
        )
    }

    /// Takes an idle sandbox of this shape, if one is ready.
    pub fn take(&self, key: &str) -> Option<Warm> {
        lock(&self.idle).get_mut(key).and_then(Vec::pop)
    }

    /// Starts building sandboxes of this shape in the background until `per_shape` are
    /// idle or being built.
    pub fn refill(self: &Arc<Self>, key: String, recipe: Recipe) {
        if !self.enabled() {
            return;
        }
        let have = lock(&self.idle).get(&key).map_or(0, Vec::len);
        let missing = {
            let mut building = lock(&self.building);
            let in_flight = building.entry(key.clone()).or_insert(0);
            let missing = self.per_shape.saturating_sub(have + *in_flight);
            *in_flight += missing;
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
                        recipe.limits,
                        recipe.fresh_ids.as_deref(),
                    );
                    if let Some(n) = lock(&pool.building).get_mut(&thread_key) {
                        *n = n.saturating_sub(1);
                    }
                    match built {
                        Ok(warm) => lock(&pool.idle).entry(thread_key).or_default().push(warm),
                        Err(e) => tracing::debug!(error = %e, "warm sandbox not built"),
                    }
                });
            if spawned.is_err() {
                if let Some(n) = lock(&self.building).get_mut(&key) {
                    *n = n.saturating_sub(1);
                }
            }
        }
    }

    /// Kills every idle sandbox.
    pub fn clear(&self) {
        lock(&self.idle).clear();
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    match m.lock() {
        Ok(g) => g,
        Err(poisoned) => poisoned.into_inner(),
    }
}
