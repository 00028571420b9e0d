//! The sandbox helper binary of the process backend. It is started by the Strata library
//! for each run; it is not meant to be run by hand.

fn main() {
    sandbox_os::helper_main()
}
