//! Pieces every `shoal` driver shares: the run's data directory and the load progress bar.

use std::path::{Path, PathBuf};

/// The run's data directory: `dir` (created if missing), or a temporary directory named
/// `shoal-<what>-…` that is removed when the returned guard drops.
pub fn data_dir(
    dir: Option<&Path>,
    what: &str,
) -> Result<(PathBuf, Option<tempfile::TempDir>), String> {
    match dir {
        Some(d) => {
            std::fs::create_dir_all(d).map_err(|e| format!("--data-dir {}: {e}", d.display()))?;
            Ok((d.to_path_buf(), None))
        }
        None => {
            let t = tempfile::Builder::new()
                .prefix(&format!("shoal-{what}-"))
                .tempdir()
                .map_err(|e| format!("cannot create a temporary data directory: {e}"))?;
            Ok((t.path().to_path_buf(), Some(t)))
        }
    }
}

/// A progress bar over `len` `unit`s (hidden with `quiet`).
pub fn progress(len: u64, unit: &str, quiet: bool) -> indicatif::ProgressBar {
    if quiet {
        return indicatif::ProgressBar::hidden();
    }
    let b = indicatif::ProgressBar::new(len);
    b.set_style(
        indicatif::ProgressStyle::with_template(&format!(
            "load {{bar:40}} {{pos}}/{{len}} {unit} ({{per_sec}}, eta {{eta}})"
        ))
        .expect("template"),
    );
    b
}
