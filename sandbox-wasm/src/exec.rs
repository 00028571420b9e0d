//! Executes one prepared program in a fresh store: limits installed, the entry point called
//! on a fiber, and the whole call raced against the wall-clock deadline and cancellation so
//! that blocking WASI calls are interrupted too.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use sandbox_core::receipt::{Denial, NetworkReceipt};
use sandbox_core::{CancelToken, Caps, Error, LimitKind, Result, RunContext, Stream, TrapKind};
use tokio::sync::Notify;
use wasmtime::{Engine, Store, UpdateDeadline};
use wasmtime_wasi::I32Exit;

use crate::cache::Prepared;
use crate::capture::{Capture, OutputLimitHit};
use crate::executor::Executor;
use crate::limiter::Limiter;
use crate::plan::Plan;
use crate::program::{Entry, Program};
use crate::quota::DiskMeter;
use crate::state::State;
use crate::ticker::Active;
use crate::wasi::Stdin;

/// Why the host stopped a run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Stop {
    Wall,
    Cpu,
    Cancelled,
}

impl fmt::Display for Stop {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Stop::Wall => "wall-clock limit reached",
            Stop::Cpu => "CPU-time limit reached",
            Stop::Cancelled => "run cancelled",
        })
    }
}

impl std::error::Error for Stop {}

/// How a run ended, before limits are attributed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum End {
    Exit(i32),
    Trap(TrapKind, String),
    Limit(LimitKind),
    Cancelled,
    /// The program could not be started as asked (no entry point).
    Refused(String),
    /// The engine's instance pool is full.
    Busy(String),
}

/// Everything a finished run produced.
pub(crate) struct Finished {
    pub end: End,
    pub stdout: (Vec<u8>, bool),
    pub stderr: (Vec<u8>, bool),
    pub duration: Duration,
    pub cpu: Duration,
    pub peak_memory: u64,
    pub memory_refused: Option<u64>,
    pub disk_refused: (bool, bool),
    /// Under a network allowlist: the receipt's `network` section and its denials.
    pub network: Option<(NetworkReceipt, Vec<Denial>)>,
}

/// CPU time of the calling thread (where the wasm fiber runs).
fn thread_cpu() -> Duration {
    let ts = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    Duration::new(
        ts.tv_sec.max(0) as u64,
        ts.tv_nsec.clamp(0, 999_999_999) as u32,
    )
}

fn internal(message: &str) -> Error {
    Error::Internal {
        message: message.to_string(),
        source: None,
    }
}

/// Per-run settings taken from the caps and the backend.
pub(crate) struct Exec<'a> {
    pub engine: &'a Engine,
    pub prepared: &'a Prepared,
    pub program: &'a Program,
    pub plan: &'a Plan,
    pub caps: &'a Caps,
    pub ctx: &'a RunContext,
    pub fuel: Option<u64>,
    /// The run's hold on the epoch ticker, which also fires its deadline alarm.
    pub active: &'a Active<'a>,
    /// Drives the run (and gives WASI its tokio context).
    pub executor: &'a Executor,
}

/// Runs the program and reports how it ended.
pub(crate) fn run(spec: Exec<'_>) -> Result<Finished> {
    let started = Instant::now();
    let limits = &spec.caps.limits;
    let stdout = Capture::new(Stream::Stdout, limits.output.bytes(), spec.ctx.sink.clone());
    let stderr = Capture::new(Stream::Stderr, limits.output.bytes(), spec.ctx.sink.clone());
    // Taken only now, so a request refused earlier leaves the stream to the caller.
    let stdin = match &spec.ctx.stdin {
        Some(source) => {
            let fd = source.take()?;
            let bytes = &spec.caps.stdin;
            Stdin::Stream(spec.executor.enter(|| crate::stdin::streamed(bytes, fd))?)
        }
        None => Stdin::Bytes(&spec.caps.stdin),
    };
    let egress = crate::egress::guard(spec.plan, limits)?;
    let wasi = crate::wasi::context(
        spec.plan,
        &spec.program.argv,
        stdin,
        &stdout,
        &stderr,
        limits.open_files,
        egress.as_ref(),
    )?;
    let meter = Arc::new(DiskMeter::new(
        limits.disk.bytes(),
        limits.file_size.bytes(),
    ));
    let mut store = Store::new(
        spec.engine,
        State {
            wasi,
            limiter: Limiter::new(spec.plan.memory),
            meter: Arc::clone(&meter),
            egress: egress.clone(),
        },
    );
    store.limiter(|s| &mut s.limiter);
    if let Some(fuel) = spec.fuel {
        store
            .set_fuel(fuel)
            .map_err(|e| internal(&format!("cannot set fuel: {e}")))?;
    }
    let deadline = started + limits.timeout;
    let cpu_start = thread_cpu();
    let cpu_limit = limits.cpu_time;
    let cancel: CancelToken = spec.ctx.cancel.clone();
    let watch_cancel = cancel.clone();
    store.set_epoch_deadline(1);
    store.epoch_deadline_callback(move |_| {
        if watch_cancel.is_cancelled() {
            return Err(wasmtime::Error::new(Stop::Cancelled));
        }
        if Instant::now() >= deadline {
            return Err(wasmtime::Error::new(Stop::Wall));
        }
        if thread_cpu().saturating_sub(cpu_start) >= cpu_limit {
            return Err(wasmtime::Error::new(Stop::Cpu));
        }
        Ok(UpdateDeadline::Continue(1))
    });
    let notify = Arc::new(Notify::new());
    let n = Arc::clone(&notify);
    let _registration = cancel.on_cancel(move || n.notify_one());

    let alarm = spec.active.alarm(deadline);
    let outcome: std::result::Result<i32, wasmtime::Error> = spec.executor.block_on(async {
        tokio::select! {
            biased;
            () = notify.notified() => Err(wasmtime::Error::new(Stop::Cancelled)),
            () = alarm => Err(wasmtime::Error::new(Stop::Wall)),
            r = enter(&mut store, spec.prepared, spec.program) => r,
        }
    });
    let cpu = thread_cpu().saturating_sub(cpu_start);
    let end = match outcome {
        Ok(code) => End::Exit(code),
        Err(e) => classify(&e),
    };
    let state = store.data();
    let (peak_memory, memory_refused) = (state.limiter.peak(), state.limiter.refused());
    // The store goes first, so lookups still in flight are aborted before the log is read.
    drop(store);
    Ok(Finished {
        end,
        stdout: stdout.take(),
        stderr: stderr.take(),
        duration: started.elapsed(),
        cpu,
        peak_memory,
        memory_refused,
        disk_refused: meter.refused(),
        network: egress.map(|guard| guard.finish()),
    })
}

/// Maps an error that ended the call.
fn classify(e: &wasmtime::Error) -> End {
    if let Some(exit) = e.downcast_ref::<I32Exit>() {
        return End::Exit(exit.0);
    }
    if let Some(stop) = e.downcast_ref::<Stop>() {
        return match stop {
            Stop::Wall => End::Limit(LimitKind::Wall),
            Stop::Cpu => End::Limit(LimitKind::Cpu),
            Stop::Cancelled => End::Cancelled,
        };
    }
    if e.downcast_ref::<OutputLimitHit>().is_some() {
        return End::Limit(LimitKind::Output);
    }
    if matches!(
        e.downcast_ref::<wasmtime::component::ResourceTableError>(),
        Some(wasmtime::component::ResourceTableError::Full)
    ) {
        return End::Limit(LimitKind::OpenFiles);
    }
    if let Some(full) = e.downcast_ref::<wasmtime::PoolConcurrencyLimitError>() {
        return End::Busy(format!(
            "the instance pool is full ({full}); raise max_concurrent_runs"
        ));
    }
    if let Some(refused) = e.downcast_ref::<Refused>() {
        return End::Refused(refused.0.clone());
    }
    if let Some(trap) = e.downcast_ref::<wasmtime::Trap>() {
        use wasmtime::Trap as T;
        let kind = match trap {
            T::OutOfFuel => return End::Limit(LimitKind::Fuel),
            T::StackOverflow => TrapKind::StackOverflow,
            T::MemoryOutOfBounds | T::HeapMisaligned => TrapKind::MemoryOutOfBounds,
            T::TableOutOfBounds => TrapKind::TableOutOfBounds,
            T::IndirectCallToNull | T::BadSignature => TrapKind::BadIndirectCall,
            T::IntegerOverflow | T::IntegerDivisionByZero | T::BadConversionToInteger => {
                TrapKind::Arithmetic
            }
            T::UnreachableCodeReached => TrapKind::Unreachable,
            _ => TrapKind::Other,
        };
        return End::Trap(kind, trap.to_string());
    }
    End::Trap(TrapKind::Other, format!("{e:#}"))
}

/// A program that cannot be started as asked (missing entry point, full pool).
#[derive(Debug)]
pub(crate) struct Refused(pub String);

impl fmt::Display for Refused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Refused {}

fn refused(msg: impl Into<String>) -> wasmtime::Error {
    wasmtime::Error::new(Refused(msg.into()))
}

/// Instantiates and calls the entry point; `Ok(exit code)`.
async fn enter(
    store: &mut Store<State>,
    prepared: &Prepared,
    program: &Program,
) -> wasmtime::Result<i32> {
    match (prepared, program.entry) {
        (Prepared::Component(pre), Entry::Command) => {
            let command = pre.instantiate_async(&mut *store).await?;
            let result = command.wasi_cli_run().call_run(&mut *store).await?;
            Ok(if result.is_ok() { 0 } else { 1 })
        }
        (Prepared::Module(pre, start), Entry::Command) => {
            let Some(start) = start else {
                return Err(refused(format!(
                    "{} exports no `_start` of type `() -> ()`: it is not a WASI command (reactor modules need a driver)",
                    program.module.display()
                )));
            };
            let instance = pre.instantiate_async(&mut *store).await?;
            let Some(func) = instance
                .get_module_export(&mut *store, start)
                .and_then(wasmtime::Extern::into_func)
            else {
                return Err(refused("`_start` disappeared after instantiation"));
            };
            func.call_async(&mut *store, &[], &mut []).await?;
            Ok(0)
        }
        (Prepared::Module(pre, _), Entry::QuickJs) => {
            let instance = pre.instantiate_async(&mut *store).await?;
            crate::script::drive_quickjs(store, &instance, &program.argv).await
        }
        (Prepared::Component(_), Entry::QuickJs) => Err(refused(
            "the QuickJS interpreter must be a core module, not a component",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classify_maps_exits_stops_and_traps() {
        assert_eq!(classify(&wasmtime::Error::new(I32Exit(3))), End::Exit(3));
        assert_eq!(
            classify(&wasmtime::Error::new(Stop::Cpu)),
            End::Limit(LimitKind::Cpu)
        );
        assert_eq!(
            classify(&wasmtime::Error::new(wasmtime::Trap::OutOfFuel)),
            End::Limit(LimitKind::Fuel)
        );
        assert!(matches!(
            classify(&wasmtime::Error::new(wasmtime::Trap::StackOverflow)),
            End::Trap(TrapKind::StackOverflow, _)
        ));
    }

    #[test]
    fn thread_cpu_advances() {
        let a = thread_cpu();
        let mut x = 0u64;
        for i in 0..2_000_000u64 {
            x = x.wrapping_mul(31).wrapping_add(i);
        }
        std::hint::black_box(x);
        assert!(thread_cpu() >= a);
    }
}
