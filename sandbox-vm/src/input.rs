//! The input disk's contents on the host: the image or wasm module an inner run needs,
//! mounted in the guest at [`sandbox_agent::inner::INPUT_DIR`].

use std::path::{Path, PathBuf};

use sandbox_core::{Error, Result, SetupStage};

/// The input disk's contents: `host` itself when it is a directory, else a directory under
/// `scratch` holding a link to (or a copy of) the file.
///
/// # Errors
/// When the file cannot be linked or copied.
pub fn input_dir(host: &Path, scratch: &Path) -> Result<PathBuf> {
    if host.is_dir() {
        return Ok(host.to_path_buf());
    }
    let failed = |e| Error::setup(SetupStage::Host, "microvm: input disk", e);
    let dir = scratch.join("input");
    std::fs::create_dir_all(&dir).map_err(failed)?;
    let name = host.file_name().unwrap_or_default();
    let to = dir.join(name);
    if std::fs::hard_link(host, &to).is_err() {
        std::fs::copy(host, &to).map_err(failed)?;
    }
    Ok(dir)
}
