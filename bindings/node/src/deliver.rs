//! Handing a run's events back to JavaScript: one threadsafe function per JavaScript
//! thread, shared by every run started there.
//!
//! An event reaches its run's callback with one thread hop: the thread that waited for the
//! sandbox queues it on the threadsafe function (`uv_async_send`), and the JavaScript
//! thread calls the callback when its event loop wakes. Sharing the threadsafe function
//! saves every run creating a libuv handle and an async resource on the JavaScript thread,
//! and closing them afterwards. It keeps the event loop alive only while runs are in flight,
//! like the per-run handle it replaces.

use std::cell::{Cell, RefCell};
use std::sync::Arc;
use std::time::{Duration, Instant};

use napi::bindgen_prelude::{Buffer, FnArgs, Function, FunctionRef, JsValuesTupleIntoVec};
use napi::threadsafe_function::{
    ThreadsafeCallContext, ThreadsafeFunction, ThreadsafeFunctionCallMode,
};
use napi::JsValue;
use napi::{sys, Env, Status};
use strata::Stream;

use crate::convert::{DoneArgs, Finished};

/// Event kinds as the callback receives them (its first argument).
const STDOUT: u32 = 0;
const STDERR: u32 = 1;
const DONE: u32 = 2;
const PROBE: u32 = 3;

/// What a run reports to its callback, in order: output chunks (when asked for), then one
/// final event.
pub(crate) enum Event {
    /// A chunk of output.
    Chunk(Stream, Vec<u8>),
    /// The run ended (final).
    Done(Box<Finished>),
    /// A benchmark probe ended (final): the latency of the hop to the run thread, and how
    /// long that thread then slept.
    Probe { hop_a: Duration, slept: Duration },
}

/// The arguments of a run's callback for one event: `(0 | 1, chunk: Buffer)` for output,
/// `(2, ...)` when the run ended (see [`DoneArgs`]), `(3, hopAUs, hopBUs, sleptUs)` for a
/// probe.
pub struct EventArgs(Args);

enum Args {
    Chunk(FnArgs<(u32, Buffer)>),
    Done(DoneArgs),
    Probe(FnArgs<(u32, f64, f64, f64)>),
}

impl JsValuesTupleIntoVec for EventArgs {
    fn into_vec(self, env: sys::napi_env) -> napi::Result<Vec<sys::napi_value>> {
        match self.0 {
            Args::Chunk(args) => args.into_vec(env),
            Args::Done(args) => args.into_vec(env),
            Args::Probe(args) => args.into_vec(env),
        }
    }
}

impl Event {
    /// The callback's arguments, on the JavaScript thread; `hop_back` is how long the event
    /// took to get here.
    fn into_args(self, hop_back: Duration) -> EventArgs {
        EventArgs(match self {
            Event::Chunk(Stream::Stdout, chunk) => {
                Args::Chunk(FnArgs::from((STDOUT, Buffer::from(chunk))))
            }
            Event::Chunk(Stream::Stderr, chunk) => {
                Args::Chunk(FnArgs::from((STDERR, Buffer::from(chunk))))
            }
            Event::Done(finished) => Args::Done(finished.into_args(DONE)),
            Event::Probe { hop_a, slept } => Args::Probe(FnArgs::from((
                PROBE,
                micros(hop_a),
                micros(hop_back),
                micros(slept),
            ))),
        })
    }

    fn is_final(&self) -> bool {
        !matches!(self, Event::Chunk(..))
    }
}

fn micros(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// A run's callback, as the run thread holds it.
type Callback = Arc<FunctionRef<EventArgs, ()>>;

/// The arguments of the shared JavaScript function: the run's callback, then the event's
/// arguments for it.
pub struct CallArgs {
    callback: Callback,
    args: EventArgs,
}

impl JsValuesTupleIntoVec for CallArgs {
    fn into_vec(self, env: sys::napi_env) -> napi::Result<Vec<sys::napi_value>> {
        let callback = self.callback.borrow_back(&Env::from_raw(env))?.raw();
        let mut values = vec![callback];
        values.extend(self.args.into_vec(env)?);
        Ok(values)
    }
}

/// One event on its way to its run's callback.
struct Delivery {
    callback: Callback,
    event: Event,
    /// When it was queued: how long the hop back took is kept for the benchmark.
    queued: Instant,
}

/// The threadsafe function every run of a JavaScript thread reports through. Weak: it
/// keeps the event loop alive only while [`Shared::in_flight`] runs are.
type Tsfn = ThreadsafeFunction<Delivery, (), CallArgs, Status, false, true>;

/// The threadsafe function of this JavaScript thread and its runs in flight.
struct Shared {
    /// The environment that owns `tsfn` (a thread has one at a time).
    env: sys::napi_env,
    tsfn: Arc<Tsfn>,
    /// Runs started and not yet ended; the event loop is kept alive while non-zero.
    in_flight: usize,
}

thread_local! {
    /// Touched only on JavaScript threads: by [`Reply::open`] and by deliveries.
    static SHARED: RefCell<Option<Shared>> = const { RefCell::new(None) };
    /// How long the last final event of this thread took from being queued to its callback
    /// being called (see [`last_hop`]).
    static LAST_HOP: Cell<Duration> = const { Cell::new(Duration::ZERO) };
}

/// How long the hop back to this JavaScript thread took for the last run that ended here:
/// from the run thread queuing its final event to the callback being called.
pub(crate) fn last_hop() -> Duration {
    LAST_HOP.with(Cell::get)
}

/// Where a run's events go: its callback, through its thread's shared threadsafe function.
/// Cloned to whatever thread reports them; the final event must be sent exactly once.
#[derive(Clone)]
pub(crate) struct Reply {
    tsfn: Arc<Tsfn>,
    callback: Callback,
}

impl Reply {
    /// Starts a run's reply on the JavaScript thread: keeps `callback` alive, and the event
    /// loop too until the run's final event is delivered.
    pub(crate) fn open(env: &Env, callback: &Function<'_, EventArgs, ()>) -> napi::Result<Reply> {
        let callback = Arc::new(callback.create_ref()?);
        let tsfn = SHARED.with(|cell| -> napi::Result<Arc<Tsfn>> {
            let mut cell = cell.borrow_mut();
            let current = cell
                .as_ref()
                .is_some_and(|s| s.env == env.raw() && !s.tsfn.aborted());
            if !current {
                *cell = Some(Shared {
                    env: env.raw(),
                    tsfn: Arc::new(create(env)?),
                    in_flight: 0,
                });
            }
            let shared = cell
                .as_mut()
                .ok_or_else(|| napi::Error::from_reason("no threadsafe function"))?;
            if shared.in_flight == 0 {
                keep_alive(env, &shared.tsfn, true)?;
            }
            shared.in_flight += 1;
            Ok(Arc::clone(&shared.tsfn))
        })?;
        Ok(Reply { tsfn, callback })
    }

    /// Queues `event` for the JavaScript thread without blocking. Events of one run arrive
    /// in the order they were sent. Once the environment is shutting down they are dropped.
    pub(crate) fn send(&self, event: Event) {
        self.tsfn.call(
            Delivery {
                callback: Arc::clone(&self.callback),
                event,
                queued: Instant::now(),
            },
            ThreadsafeFunctionCallMode::NonBlocking,
        );
    }
}

/// The shared threadsafe function of `env`. Its JavaScript function calls the run's
/// callback (its first argument) with the rest: an exception thrown there is reported by
/// Node as uncaught, as for any callback of a threadsafe function.
fn create(env: &Env) -> napi::Result<Tsfn> {
    env.run_script::<_, Function<'_, CallArgs, ()>>("(callback, ...args) => callback(...args)")?
        .build_threadsafe_function::<Delivery>()
        .callee_handled::<false>()
        .weak::<true>()
        .build_callback(deliver)
}

/// The call of the run's callback for `delivery`'s event, on the JavaScript thread.
fn deliver(ctx: ThreadsafeCallContext<Delivery>) -> napi::Result<CallArgs> {
    let Delivery {
        callback,
        event,
        queued,
    } = ctx.value;
    let hop_back = queued.elapsed();
    if event.is_final() {
        LAST_HOP.with(|hop| hop.set(hop_back));
        // Before the callback runs: it may start the next run.
        finished(&ctx.env);
    }
    Ok(CallArgs {
        callback,
        args: event.into_args(hop_back),
    })
}

/// A run of this thread ended: when it was the last in flight, the event loop no longer
/// waits for the threadsafe function. (Should that fail, the loop keeps waiting for it:
/// never a reason not to deliver the run's end.)
fn finished(env: &Env) {
    SHARED.with(|cell| {
        if let Some(shared) = cell.borrow_mut().as_mut() {
            if shared.env == env.raw() && shared.in_flight > 0 {
                shared.in_flight -= 1;
                if shared.in_flight == 0 {
                    let _ = keep_alive(env, &shared.tsfn, false);
                }
            }
        }
    });
}

/// Makes the event loop wait for `tsfn` (`on`) or not.
fn keep_alive(env: &Env, tsfn: &Tsfn, on: bool) -> napi::Result<()> {
    if tsfn.aborted() {
        return Ok(());
    }
    // SAFETY: called on the JavaScript thread of `env`, which created `tsfn`. It is not
    // aborted, so Node has not finalized it: that happens when `env` is torn down, on this
    // same thread, and marks it aborted.
    let status = unsafe {
        if on {
            sys::napi_ref_threadsafe_function(env.raw(), tsfn.raw())
        } else {
            sys::napi_unref_threadsafe_function(env.raw(), tsfn.raw())
        }
    };
    if status == sys::Status::napi_ok {
        Ok(())
    } else {
        Err(napi::Error::new(
            Status::from(status),
            "cannot (un)reference the run events' threadsafe function",
        ))
    }
}
