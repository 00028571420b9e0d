//! Strata's main job in twenty lines: run model-written Python in a sandbox that may read
//! one directory and nothing else, then show what happened and what was enforced.
//!
//! `cargo run --release --example quickstart` (after `cargo build --release --bins`, so the
//! `strata-helper` binary sits next to the example).

use std::time::Duration;

use strata::{Caps, Sandbox, Tool};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let data = tempfile::tempdir()?;
    std::fs::write(data.path().join("notes.txt"), "the agent may read this\n")?;
    // A "model-written" tool: read the granted file, then try to read a host secret.
    let code = format!(
        r#"
print(open("{notes}").read().strip())
try:
    open("/etc/shadow").read()
    print("LEAKED /etc/shadow")
except OSError as e:
    print("denied:", e.strerror, "/etc/shadow")
"#,
        notes = data.path().join("notes.txt").display()
    );
    let helper = std::env::current_exe()?
        .parent()
        .and_then(|examples| examples.parent())
        .map(|dir| dir.join("strata-helper"))
        .ok_or("cannot locate target directory")?;
    let sandbox = Sandbox::builder().helper(helper).build()?;
    let caps = Caps::new()
        .read_only(data.path())
        .timeout(Duration::from_secs(10));
    let out = sandbox.run(&Tool::command(["/usr/bin/python3", "-c", &code]), &caps)?;
    print!("{}", String::from_utf8_lossy(&out.stdout));
    eprint!("{}", String::from_utf8_lossy(&out.stderr));
    println!(
        "status: {} in {:.1} ms",
        out.status,
        out.duration.as_secs_f64() * 1000.0
    );
    println!("{}", out.receipt);
    Ok(())
}
