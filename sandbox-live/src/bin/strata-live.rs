//! `strata-live`: the supervisor of one live sandbox (see `sandbox_live::supervisor`).

fn main() {
    std::process::exit(sandbox_live::supervisor::main());
}
