//! `shoal secret FILE`: make a new random cluster secret and write it (hex, readable by its
//! owner only) to FILE, for a cluster file's `secret_file` (docs/cluster.md, Security). The
//! secret is never printed and an existing file is never overwritten.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(clap::Args)]
pub struct Args {
    /// Where to write the secret (refused if the file exists)
    pub file: PathBuf,
}

pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    let hex = shoal_engine::new_secret_hex()
        .map_err(|e| anyhow::anyhow!("no random source for a secret: {e}"))?;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&a.file)
        .map_err(|e| {
            anyhow::anyhow!(
                "{}: {e} (a secret is never overwritten: remove the old file first)",
                a.file.display()
            )
        })?;
    writeln!(f, "{hex}").map_err(|e| anyhow::anyhow!("{}: {e}", a.file.display()))?;
    f.sync_all()
        .map_err(|e| anyhow::anyhow!("{}: {e}", a.file.display()))?;
    println!(
        "wrote a new cluster secret ({} bytes) to {} (readable by its owner only); name it in \
         the cluster file with secret_file = \"{}\" and copy it to every host",
        shoal_engine::SECRET_BYTES,
        a.file.display(),
        a.file.display()
    );
    Ok(ExitCode::SUCCESS)
}
