//! Memory and table growth limits for one run (wasmtime's `ResourceLimiter`).

use wasmtime::ResourceLimiter;

/// Bytes charged per table element (wasmtime stores one pointer per element).
const TABLE_ELEMENT_BYTES: u64 = 8;
/// Instances, tables and memories one store may create (components have several).
const MAX_INSTANCES: usize = 256;
const MAX_TABLES: usize = 256;
const MAX_MEMORIES: usize = 16;

/// Charges every linear memory and table of the run against one byte budget.
#[derive(Debug)]
pub(crate) struct Limiter {
    budget: u64,
    used: u64,
    /// The largest total a refused growth asked for, if any was refused.
    refused: Option<u64>,
}

impl Limiter {
    pub(crate) fn new(budget: u64) -> Self {
        Limiter {
            budget,
            used: 0,
            refused: None,
        }
    }

    /// Whether a growth was refused (the module may have handled it, or died of it).
    pub(crate) fn refused(&self) -> Option<u64> {
        self.refused
    }

    /// Peak bytes of memories and tables.
    pub(crate) fn peak(&self) -> u64 {
        self.used
    }

    fn charge(&mut self, current: u64, desired: u64) -> bool {
        let delta = desired.saturating_sub(current);
        let total = self.used.saturating_add(delta);
        if total > self.budget {
            self.refused = Some(self.refused.unwrap_or(0).max(total));
            false
        } else {
            self.used = total;
            true
        }
    }
}

impl ResourceLimiter for Limiter {
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        Ok(self.charge(current as u64, desired as u64))
    }

    fn table_growing(
        &mut self,
        current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        Ok(self.charge(
            (current as u64).saturating_mul(TABLE_ELEMENT_BYTES),
            (desired as u64).saturating_mul(TABLE_ELEMENT_BYTES),
        ))
    }

    fn instances(&self) -> usize {
        MAX_INSTANCES
    }

    fn tables(&self) -> usize {
        MAX_TABLES
    }

    fn memories(&self) -> usize {
        MAX_MEMORIES
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_and_tables_share_one_budget() {
        let mut l = Limiter::new(1 << 20);
        assert!(l.memory_growing(0, 512 << 10, None).expect("ok"));
        assert!(l.table_growing(0, 1000, None).expect("ok"));
        assert!(!l.memory_growing(512 << 10, 1 << 20, None).expect("ok"));
        assert!(l.refused().is_some());
        assert_eq!(l.peak(), (512 << 10) + 8000);
    }
}
