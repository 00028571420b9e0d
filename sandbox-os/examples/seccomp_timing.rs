//! Development aid: how long building and installing the seccomp filters takes.
#![allow(clippy::unwrap_used, clippy::undocumented_unsafe_blocks)]
fn main() {
    let t = std::time::Instant::now();
    let [a, d] = sandbox_os::backend_api::seccomp::build().unwrap();
    println!("build {:?} lens {} {}", t.elapsed(), a.len(), d.len());
    unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) };
    let t = std::time::Instant::now();
    seccompiler::apply_filter(&a).unwrap();
    println!("install allow {:?}", t.elapsed());
    let t = std::time::Instant::now();
    seccompiler::apply_filter(&d).unwrap();
    println!("install deny {:?}", t.elapsed());
}
