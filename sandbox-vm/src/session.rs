//! One run in one VM: start (boot or restore) it, drive the agent over its channel
//! ([`sandbox_agent::driver`]), switch it off on every path.

use std::time::Instant;

use sandbox_core::{Result, RunContext};

pub use sandbox_agent::driver::{
    exit_status, plain_argv, wait_ready, AgentRun, Archive, ArchiveTarget, Ending, Greeting,
    RunPlan, ARCHIVE_TIMEOUT, WALL_GRACE,
};

use crate::vmm::{VmConfig, VmInstance, Vmm};

/// What came back from a VM run (the agent run's name before the driver was shared).
pub type VmRun = AgentRun;

/// How the VM comes to life.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Boot {
    /// A cold boot: wait for the agent's `ready`, then say hello.
    Cold,
    /// Restored from a snapshot saved after `ready`: wait until the VM runs, then say hello
    /// at once.
    Restored,
}

impl Boot {
    /// How the agent is greeted after this boot.
    pub fn greeting(self) -> Greeting {
        match self {
            Boot::Cold => Greeting::AwaitReady,
            Boot::Restored => Greeting::HelloNow,
        }
    }
}

/// Starts `config` on `vmm` (`boot`: how it comes to life), runs the plan, returns what
/// happened. The VM is shut down and reaped on every path (the instance's drop kills it on
/// panic).
///
/// # Errors
/// As [`sandbox_agent::driver::drive`], and the VMM's start and restore errors.
pub fn run(
    vmm: &dyn Vmm,
    config: &VmConfig,
    boot: Boot,
    plan: RunPlan<'_>,
    ctx: &RunContext,
) -> Result<AgentRun> {
    let started = Instant::now();
    let mut vm = vmm.start(config)?;
    let result = drive(vm.as_mut(), started, boot, plan, ctx);
    vm.teardown();
    result
}

/// Runs the plan on `vm`, a VM already running (a pooled one, restored earlier and waiting
/// for its hello), then shuts it down.
///
/// # Errors
/// As [`run`].
pub fn run_on(
    mut vm: Box<dyn VmInstance>,
    boot: Boot,
    plan: RunPlan<'_>,
    ctx: &RunContext,
) -> Result<AgentRun> {
    let result = drive(vm.as_mut(), Instant::now(), boot, plan, ctx);
    vm.teardown();
    result
}

fn drive(
    vm: &mut dyn VmInstance,
    started: Instant,
    boot: Boot,
    plan: RunPlan<'_>,
    ctx: &RunContext,
) -> Result<AgentRun> {
    if boot == Boot::Restored {
        vm.wait_running(started + plan.ready_timeout)?;
    }
    sandbox_agent::driver::drive(vm, started, plan, ctx)
}
