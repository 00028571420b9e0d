//! Development aid: p50/p90/p99 of cold and warm process-backend runs of /bin/true.
#![allow(clippy::unwrap_used)]
use std::time::{Duration, Instant};

use strata::{BackendChoice, BackendKind, Caps, Sandbox, Tool};

fn main() {
    let helper = std::env::current_exe()
        .unwrap()
        .parent()
        .unwrap()
        .parent()
        .unwrap()
        .join("strata-helper");
    for warm in [0usize, 1] {
        let sb = Sandbox::builder()
            .backend(BackendChoice::Only(BackendKind::Process))
            .helper(&helper)
            .warm_pool(warm)
            .build()
            .unwrap();
        let caps = Caps::new();
        let tool = Tool::command(["/bin/true"]);
        sb.run(&tool, &caps).unwrap();
        let mut v = vec![];
        let n: usize = std::env::var("STRATA_N")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(200);
        for _ in 0..n {
            if warm > 0 {
                std::thread::sleep(Duration::from_millis(15)); // let the pool refill
            }
            let t = Instant::now();
            let o = sb.run(&tool, &caps).unwrap();
            assert!(o.success());
            v.push(t.elapsed().as_secs_f64() * 1e3);
        }
        v.sort_by(|a, b| a.partial_cmp(b).unwrap());
        println!(
            "warm_pool={warm}: p50 {:.3} ms p90 {:.3} p99 {:.3}",
            v[n / 2],
            v[n * 9 / 10],
            v[(n * 99 / 100).min(n - 1)]
        );
    }
}
