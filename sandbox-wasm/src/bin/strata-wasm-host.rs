//! Hosts the wasm engine inside the process sandbox for layered runs of Strata's wasm
//! backend. Started by the library; not meant to be run by hand.

fn main() {
    std::process::exit(sandbox_wasm::host_main())
}
