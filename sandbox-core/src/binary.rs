//! Finding Strata's own binaries (the process backend's helper, the wasm host, the guest
//! agent): one rule for every backend and binding.

use std::path::{Path, PathBuf};

/// Finds the binary `name`: `$env_var` when set (it must be an executable file), else next
/// to the running executable, else one directory up when that is a cargo test binary in
/// `target/*/deps`. `hint` ends the not-found message: what the caller can do about it.
///
/// # Errors
/// A message naming the variable or the directory searched, and the hint.
pub fn locate(name: &str, env_var: &str, hint: &str) -> Result<PathBuf, String> {
    if let Some(path) = std::env::var_os(env_var) {
        let path = PathBuf::from(path);
        return if is_executable_file(&path) {
            Ok(path)
        } else {
            Err(format!(
                "{env_var}={} is not an executable file",
                path.display()
            ))
        };
    }
    let exe = std::env::current_exe()
        .map_err(|e| format!("cannot locate the running executable: {e}"))?;
    let mut candidates = Vec::new();
    if let Some(dir) = exe.parent() {
        candidates.push(dir.join(name));
        if dir.file_name().is_some_and(|n| n == "deps") {
            if let Some(up) = dir.parent() {
                candidates.push(up.join(name));
            }
        }
    }
    candidates
        .into_iter()
        .find(|c| is_executable_file(c))
        .ok_or_else(|| format!("{name} not found next to {} ({hint})", exe.display()))
}

/// The copy of `name` a package ships (a wheel's or an npm package's own binary): `$env_var`
/// when set and not empty (returned as given: whoever runs it reports a bad path), else
/// `package_dir/name` when that is an executable file, else `None`. Unlike [`locate`], the
/// running executable's directory is not searched: in a binding it is the interpreter's.
pub fn packaged(name: &str, env_var: &str, package_dir: &Path) -> Option<PathBuf> {
    if let Some(path) = std::env::var_os(env_var).filter(|v| !v.is_empty()) {
        return Some(PathBuf::from(path));
    }
    Some(package_dir.join(name)).filter(|path| is_executable_file(path))
}

/// Whether `path` is a regular file (symlinks followed) with an execute bit set.
pub fn is_executable_file(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_variable_wins_and_must_name_an_executable_file() {
        let var = "STRATA_TEST_BINARY_LOCATE";
        std::env::set_var(var, "/bin/sh");
        assert_eq!(locate("nope", var, "hint"), Ok(PathBuf::from("/bin/sh")));
        let plain = std::env::temp_dir().join(format!("strata-locate-{}", std::process::id()));
        std::fs::write(&plain, "data").expect("write");
        std::env::set_var(var, &plain);
        let err = locate("nope", var, "hint").expect_err("not executable");
        let _ = std::fs::remove_file(&plain);
        assert!(err.contains("is not an executable file"), "{err}");
        std::env::remove_var(var);
        let err = locate("strata-no-such-binary", var, "build it").expect_err("absent");
        assert!(
            err.contains("strata-no-such-binary not found next to"),
            "{err}"
        );
        assert!(err.ends_with("(build it)"), "{err}");
    }
}
