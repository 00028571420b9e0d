//! The wasmtime engine: one per backend, configured for hostile modules.

use wasmtime::{Config, Engine, InstanceAllocationStrategy, PoolingAllocationConfig};

use crate::config::WasmConfig;

/// Largest linear memory a module may reach (the 32-bit address space). The per-run
/// memory limit is enforced below it by the resource limiter.
pub(crate) const MAX_MEMORY_BYTES: usize = 4 << 30;
/// Wasm stack budget; deeper recursion traps with a stack overflow.
pub(crate) const MAX_WASM_STACK: usize = 1 << 20;
/// Native stack of the fiber a run executes on; must exceed [`MAX_WASM_STACK`] plus the
/// host functions' own needs.
const ASYNC_STACK: usize = 4 << 20;
/// Elements a single table may hold (CPython's function table is about 20k).
pub(crate) const MAX_TABLE_ELEMENTS: usize = 200_000;
/// Core instances, memories and tables a component may create.
const MAX_CORE_INSTANCES_PER_COMPONENT: u32 = 64;
const MAX_MEMORIES_PER_COMPONENT: u32 = 8;
const MAX_TABLES_PER_COMPONENT: u32 = 64;

/// Builds the engine for `config`. The settings shared by every engine (so a precompiled
/// artifact made by one loads in another, e.g. inside the process sandbox) are in
/// [`base_config`]; only the allocator differs.
pub(crate) fn build(config: &WasmConfig, pooling: bool) -> wasmtime::Result<Engine> {
    let mut c = base_config(config);
    if pooling {
        c.allocation_strategy(InstanceAllocationStrategy::Pooling(pool(
            config.max_concurrent_runs.max(1),
        )));
    }
    Engine::new(&c)
}

fn base_config(config: &WasmConfig) -> Config {
    let mut c = Config::new();
    c.epoch_interruption(true);
    c.consume_fuel(config.fuel.is_some());
    c.cranelift_nan_canonicalization(config.fuel.is_some());
    c.max_wasm_stack(MAX_WASM_STACK);
    c.async_stack_size(ASYNC_STACK);
    // No proposals that widen the host surface: shared memory off (threads and GC are not
    // compiled in).
    c.shared_memory(false);
    c.concurrency_support(false);
    // Backtrace details would be read from the host environment; keep them off.
    c.wasm_backtrace_details(wasmtime::WasmBacktraceDetails::Disable);
    c.memory_init_cow(true);
    c.parallel_compilation(true);
    c
}

fn pool(runs: u32) -> PoolingAllocationConfig {
    let mut p = PoolingAllocationConfig::new();
    // Components hold several core instances, memories and tables (the Python
    // interpreter: libc, libpython and adapters); the slots are address space only
    // until used.
    p.total_component_instances(runs)
        .total_core_instances(runs * 16)
        .total_memories(runs * 4)
        .total_tables(runs * 16)
        .total_stacks(runs)
        .max_core_instances_per_component(MAX_CORE_INSTANCES_PER_COMPONENT)
        .max_memories_per_component(MAX_MEMORIES_PER_COMPONENT)
        .max_tables_per_component(MAX_TABLES_PER_COMPONENT)
        .max_memories_per_module(2)
        .max_tables_per_module(8)
        .table_elements(MAX_TABLE_ELEMENTS)
        .max_memory_size(MAX_MEMORY_BYTES)
        .max_core_instance_size(4 << 20)
        .max_component_instance_size(4 << 20)
        // Reset memories and tables with madvise (one syscall; untouched pages cost
        // nothing) rather than memset: without the kernel's PAGEMAP_SCAN a resident
        // window is cleared in full on every run.
        .linear_memory_keep_resident(4096)
        .table_keep_resident(0)
        .max_unused_warm_slots(runs);
    p
}
