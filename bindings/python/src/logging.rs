//! Rust `tracing` events forwarded to Python `logging` (logger `"strata"`).
//!
//! Emitting an event never waits for the GIL: the layer formats the event into a queue.
//! A run drains the queue into `logging` when it returns to Python (so the records of a
//! run are logged, in order, before `run()` returns); events fired on threads that are not
//! inside a run are delivered by a small forwarder thread. Levels below the `"strata"`
//! logger's effective level (read at the start of every run) are dropped before
//! formatting. Records carry `rust_target` (the Rust module) and `rust_fields` (a dict of
//! the event's and its spans' fields).

use std::cell::Cell;
use std::collections::VecDeque;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, Once, OnceLock, PoisonError};

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyDict;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record as SpanRecord};
use tracing::subscriber::Interest;
use tracing::{Event, Level, Metadata, Subscriber};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;

/// Records kept when nothing drains the queue; older ones are dropped beyond this.
const MAX_QUEUED: usize = 10_000;

/// Python's `logging.WARNING`, the default effective level.
const WARNING: u8 = 30;

static MIN_LEVEL: AtomicU8 = AtomicU8::new(WARNING);
static PENDING: AtomicUsize = AtomicUsize::new(0);
static QUEUE: Mutex<VecDeque<LogRecord>> = Mutex::new(VecDeque::new());
static LOGGER: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
/// The logger's `_cache` dict, which `logging` empties whenever any level changes; the
/// level read last is kept in it under [`LEVEL_KEY`], so a run reads it without calling
/// into `logging` until the configuration changes.
static LEVEL_CACHE: PyOnceLock<Py<PyDict>> = PyOnceLock::new();
const LEVEL_KEY: &str = "strata._min_level";
static FORWARDER: OnceLock<Forwarder> = OnceLock::new();

thread_local! {
    /// Whether this thread is inside a binding run, which drains the queue when it ends.
    static IN_CALL: Cell<bool> = const { Cell::new(false) };
}

struct LogRecord {
    level: u8,
    target: &'static str,
    message: String,
    fields: Vec<(String, String)>,
}

fn python_level(level: &Level) -> u8 {
    match *level {
        Level::ERROR => 40,
        Level::WARN => 30,
        Level::INFO => 20,
        Level::DEBUG => 10,
        _ => 5,
    }
}

/// Installs the layer as this module's global tracing subscriber (once per process).
pub fn install(py: Python<'_>) -> PyResult<()> {
    let logger = py
        .import("logging")?
        .call_method1("getLogger", ("strata",))?;
    if let Ok(cache) = logger.getattr("_cache") {
        if let Ok(cache) = cache.cast_into::<PyDict>() {
            let _ = LEVEL_CACHE.set(py, cache.unbind());
        }
    }
    let _ = LOGGER.set(py, logger.unbind());
    refresh_level(py);
    let subscriber = tracing_subscriber::registry().with(PyLogLayer);
    // Fails only if the module is initialised twice in one process; the first stays.
    let _ = tracing::subscriber::set_global_default(subscriber);
    Ok(())
}

/// Brings the level filter up to date with the `"strata"` logger's effective level.
pub fn refresh_level(py: Python<'_>) {
    let cache = LEVEL_CACHE.get(py).map(|c| c.bind(py));
    if let Some(cache) = cache {
        if let Ok(Some(_)) = cache.get_item(pyo3::intern!(py, LEVEL_KEY)) {
            return; // unchanged since it was last read
        }
    }
    let Some(logger) = LOGGER.get(py) else {
        return;
    };
    if let Ok(level) = logger
        .bind(py)
        .call_method0("getEffectiveLevel")
        .and_then(|l| l.extract::<i64>())
    {
        let level = u8::try_from(level.clamp(0, 255)).unwrap_or(WARNING);
        MIN_LEVEL.store(level, Ordering::Relaxed);
        if let Some(cache) = cache {
            let _ = cache.set_item(LEVEL_KEY, level);
        }
    }
}

/// Marks the current thread as inside a run until dropped (its events are drained by the
/// run's caller, not the forwarder).
pub struct CallScope {
    previous: bool,
}

impl CallScope {
    /// Enters the scope on this thread.
    pub fn enter() -> Self {
        CallScope {
            previous: IN_CALL.with(|c| c.replace(true)),
        }
    }
}

impl Drop for CallScope {
    fn drop(&mut self) {
        IN_CALL.with(|c| c.set(self.previous));
    }
}

/// Logs every queued record (call with the GIL held, e.g. when a run returns).
pub fn drain(py: Python<'_>) {
    while PENDING.load(Ordering::Acquire) > 0 {
        let record = {
            let mut queue = QUEUE.lock().unwrap_or_else(PoisonError::into_inner);
            let record = queue.pop_front();
            PENDING.store(queue.len(), Ordering::Release);
            record
        };
        match record {
            Some(record) => emit(py, record),
            None => break,
        }
    }
}

fn emit(py: Python<'_>, record: LogRecord) {
    let Some(logger) = LOGGER.get(py) else {
        return;
    };
    let logger = logger.bind(py);
    let result = (|| -> PyResult<()> {
        if !logger
            .call_method1("isEnabledFor", (record.level,))?
            .is_truthy()?
        {
            return Ok(());
        }
        let fields = PyDict::new(py);
        for (k, v) in &record.fields {
            fields.set_item(k, v)?;
        }
        let extra = PyDict::new(py);
        extra.set_item("rust_target", record.target)?;
        extra.set_item("rust_fields", fields)?;
        let kwargs = PyDict::new(py);
        kwargs.set_item("extra", extra)?;
        logger.call_method("log", (record.level, record.message), Some(&kwargs))?;
        Ok(())
    })();
    if let Err(e) = result {
        e.write_unraisable(py, Some(logger));
    }
}

struct Forwarder {
    wake: Mutex<bool>,
    cv: Condvar,
}

fn wake_forwarder() {
    static SPAWN: Once = Once::new();
    let forwarder = FORWARDER.get_or_init(|| Forwarder {
        wake: Mutex::new(false),
        cv: Condvar::new(),
    });
    SPAWN.call_once(|| {
        // Without the thread, records wait for the next run to drain them.
        let _ = std::thread::Builder::new()
            .name("strata-log".into())
            .spawn(move || forward_loop(forwarder));
    });
    *forwarder
        .wake
        .lock()
        .unwrap_or_else(PoisonError::into_inner) = true;
    forwarder.cv.notify_one();
}

fn forward_loop(forwarder: &'static Forwarder) {
    loop {
        {
            let mut woken = forwarder
                .wake
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            while !*woken {
                woken = forwarder
                    .cv
                    .wait(woken)
                    .unwrap_or_else(PoisonError::into_inner);
            }
            *woken = false;
        }
        if Python::try_attach(drain).is_none() {
            // The interpreter is gone or finalizing: nobody will log these.
            QUEUE.lock().unwrap_or_else(PoisonError::into_inner).clear();
            PENDING.store(0, Ordering::Release);
        }
    }
}

/// Formats an event's or span's fields.
#[derive(Default)]
struct Fields {
    message: Option<String>,
    fields: Vec<(String, String)>,
}

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.message = Some(value.to_owned());
        } else {
            self.fields
                .push((field.name().to_owned(), value.to_owned()));
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        let text = format!("{value:?}");
        if field.name() == "message" {
            self.message = Some(text);
        } else {
            self.fields.push((field.name().to_owned(), text));
        }
    }
}

/// A span's formatted fields, stored in the registry's span extensions.
struct SpanFields(Vec<(String, String)>);

struct PyLogLayer;

impl<S> Layer<S> for PyLogLayer
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn register_callsite(&self, _metadata: &'static Metadata<'static>) -> Interest {
        // The Python level can change at any time: decide per event in `enabled`.
        Interest::sometimes()
    }

    fn enabled(&self, metadata: &Metadata<'_>, _ctx: Context<'_, S>) -> bool {
        python_level(metadata.level()) >= MIN_LEVEL.load(Ordering::Relaxed)
    }

    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        if let Some(span) = ctx.span(id) {
            let mut fields = Fields::default();
            attrs.record(&mut fields);
            span.extensions_mut().insert(SpanFields(fields.fields));
        }
    }

    fn on_record(&self, id: &Id, values: &SpanRecord<'_>, ctx: Context<'_, S>) {
        if let Some(span) = ctx.span(id) {
            let mut fields = Fields::default();
            values.record(&mut fields);
            let mut extensions = span.extensions_mut();
            match extensions.get_mut::<SpanFields>() {
                Some(existing) => existing.0.extend(fields.fields),
                None => extensions.insert(SpanFields(fields.fields)),
            }
        }
    }

    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        let mut fields = Fields::default();
        event.record(&mut fields);
        let mut message = String::new();
        let mut all_fields = Vec::new();
        if let Some(scope) = ctx.event_scope(event) {
            for span in scope.from_root() {
                let _ = write!(message, "{}", span.name());
                if let Some(SpanFields(span_fields)) = span.extensions().get::<SpanFields>() {
                    message.push('{');
                    for (i, (k, v)) in span_fields.iter().enumerate() {
                        let sep = if i == 0 { "" } else { " " };
                        let _ = write!(message, "{sep}{k}={v}");
                    }
                    message.push('}');
                    all_fields.extend(span_fields.iter().cloned());
                }
                message.push_str(": ");
            }
        }
        message.push_str(fields.message.as_deref().unwrap_or(""));
        for (k, v) in &fields.fields {
            let _ = write!(message, " {k}={v}");
        }
        all_fields.extend(fields.fields);
        let metadata = event.metadata();
        let record = LogRecord {
            level: python_level(metadata.level()),
            target: metadata.target(),
            message,
            fields: all_fields,
        };
        {
            let mut queue = QUEUE.lock().unwrap_or_else(PoisonError::into_inner);
            if queue.len() >= MAX_QUEUED {
                queue.pop_front();
            }
            queue.push_back(record);
            PENDING.store(queue.len(), Ordering::Release);
        }
        if !IN_CALL.with(Cell::get) {
            wake_forwarder();
        }
    }
}
