//! # shoal: the command line
//!
//! This crate owns the `shoal` binary and its workload drivers: `shoal ycsb`, `shoal tpcc`,
//! `shoal node` (one node of a multi-process cluster, checking that no update is lost) and
//! `shoal inspect` and `shoal recover` (a data directory checked, or recovered, without
//! running a workload). `harness.rs` is the drivers' shared run phase (streams, warm-up,
//! measurement, the once-a-second supervisor); `cli.rs` what the commands share (data
//! directories, progress bars, local process clusters, cache sizes).
//!
//! It uses the public APIs of shoal-engine and shoal-btree, and of the two lower crates only
//! where no engine runs or the engine has nothing to say:
//! - shoal-storage: `shoal inspect` and `shoal recover` read a stopped store without an
//!   engine (`StoreReader`, the log's `survey` and `LogEnd`, `CopyState`, `default_log_path`,
//!   the `CREATING` suffix of files being created); `write_atomic` replaces the YCSB data set
//!   description durably, as the store replaces its own files.
//! - shoal-messaging: `free_loopback_addrs` picks the ports of a local process cluster before
//!   any engine exists.
//!
//! It must not reach into engine internals.

/// `println!` that never panics: a closed standard output (`shoal ycsb | head -1`) makes the
/// command stop as after Ctrl-C (workers stop, the store is closed clean) instead of panicking
/// with dirty pages in memory.
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        // (`--json -`: the JSON report takes standard output, so these lines go to stderr)
        let r = if $crate::report::human_to_stderr() {
            writeln!(std::io::stderr(), $($arg)*)
        } else {
            writeln!(std::io::stdout(), $($arg)*)
        };
        if r.is_err() {
            $crate::stop::request();
        }
    }};
}

mod acks;
mod cli;
mod harness;
mod inspect;
mod node;
mod plot;
mod recover;
mod report;
mod secret;
mod stop;
mod tpcc;
mod value;
mod workload;
mod ycsb;

use clap::{Parser, Subcommand};

use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "shoal",
    version,
    about = "Shoal: a buffer pool of DRAM and NVMe pages, with a B-link tree and workload drivers"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Load a YCSB table, then run a workload and report throughput and latency (or only
    /// load, or only run on a loaded table: `shoal ycsb load|run`).
    Ycsb(Box<ycsb::Args>),
    /// Run one node of a multi-process cluster (from a TOML cluster file) and check that the
    /// cluster loses no update: counters on every node's pages, incremented from every node.
    Node(node::Args),
    /// Load a TPC-C database and run the standard transaction mix (or only load, or only run
    /// on a loaded database: `shoal tpcc load|run`); `--check` verifies the consistency
    /// conditions afterwards.
    Tpcc(Box<tpcc::Args>),
    /// Check a data directory without starting an engine: superblocks, every page's checksum,
    /// and the structure of every B-tree in the catalog. Writes nothing.
    Inspect(inspect::Args),
    /// Recover the stores a crash left unclean (replay their logs) without running a workload,
    /// and report what was replayed.
    Recover(recover::Args),
    /// Make a new cluster secret in FILE (for a cluster file's `secret_file`).
    Secret(secret::Args),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell) to standard
    /// output, e.g. `shoal completions bash > /etc/bash_completion.d/shoal`.
    Completions {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Print a manual page (roff) to standard output, e.g. `shoal man | man -l -`: shoal(1),
    /// or a command's (`shoal man ycsb`: shoal-ycsb(1)); `--dir DIR` writes every page there
    /// (shoal.1, shoal-ycsb.1, ...), for `MANPATH`.
    Man {
        /// The command whose page to print (default: shoal's own).
        command: Option<String>,
        /// Write every page (shoal's and each command's) into this directory instead.
        #[arg(long, conflicts_with = "command")]
        dir: Option<std::path::PathBuf>,
    },
    /// Draw results as an SVG chart: `shoal ycsb --csv` files (throughput and p99 over time)
    /// or `--json` reports (latency by percentile), several runs on one chart.
    Plot(plot::Args),
}

fn main() -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    // Under a file-size limit (`ulimit -f`) growing a device file past it raises SIGXFSZ,
    // which would kill the process with dirty pages in memory. Ignored, the write or
    // fallocate fails with EFBIG instead, which the store reports as a full device: the
    // allocation is refused and the engine still shuts down cleanly.
    // SAFETY: called before any thread is started; SIG_IGN installs no handler code.
    unsafe {
        libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
    }
    // Ctrl-C and SIGTERM stop a command cleanly; a second one exits at once (stop.rs).
    stop::install();
    let matches = <Cli as clap::CommandFactory>::command()
        .get_matches_from(ycsb::ycsb_style(std::env::args_os().collect()));
    let cli =
        <Cli as clap::FromArgMatches>::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    let r = match cli.cmd {
        Cmd::Ycsb(mut a) => {
            // which flags were given (workload properties do not override those)
            a.explicit = given(&matches, "ycsb");
            ycsb::run(*a)
        }
        Cmd::Node(a) => node::run(a),
        Cmd::Tpcc(mut a) => {
            // (a run on a kept database takes its shape unless a flag says otherwise)
            a.explicit = given(&matches, "tpcc");
            tpcc::run(*a)
        }
        Cmd::Inspect(a) => inspect::run(a),
        Cmd::Recover(a) => recover::run(a),
        Cmd::Secret(a) => secret::run(a),
        Cmd::Plot(a) => plot::run(a),
        Cmd::Completions { shell } => {
            let mut cmd = <Cli as clap::CommandFactory>::command();
            clap_complete::generate(shell, &mut cmd, "shoal", &mut std::io::stdout());
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Man { command, dir } => man(command.as_deref(), dir.as_deref()),
    };
    match r {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            if stop::requested() {
                // stopped by a signal on the way (the error says where); stores were closed
                ExitCode::from(stop::STOPPED_EXIT)
            } else {
                // 1: the run started and failed; 2: it could not start as asked
                ExitCode::from(cli::exit_status(&e))
            }
        }
    }
}

/// `shoal man`: shoal(1) names a page per command (shoal-ycsb(1), ...); each one exists, printed
/// with `shoal man ycsb` or written with the rest by `--dir`.
fn man(command: Option<&str>, dir: Option<&std::path::Path>) -> anyhow::Result<ExitCode> {
    let mut cmd = <Cli as clap::CommandFactory>::command().disable_help_subcommand(true);
    cmd.build(); // (names each command's page shoal-<command>)
    if let Some(d) = dir {
        std::fs::create_dir_all(d).map_err(|e| anyhow::anyhow!("--dir {}: {e}", d.display()))?;
        clap_mangen::generate_to(cmd, d)
            .map_err(|e| anyhow::anyhow!("writing the manual pages to {}: {e}", d.display()))?;
        say!("manual pages written to {}", d.display());
        return Ok(ExitCode::SUCCESS);
    }
    let page = match command {
        None => cmd,
        Some(name) => {
            let names: Vec<String> = cmd
                .get_subcommands()
                .filter(|s| !s.is_hide_set())
                .map(|s| s.get_name().to_string())
                .collect();
            cmd.find_subcommand(name).cloned().ok_or_else(|| {
                cli::Usage(format!(
                    "no command '{name}' (one of: {})",
                    names.join(", ")
                ))
            })?
        }
    };
    clap_mangen::Man::new(page)
        .render(&mut std::io::stdout())
        .map(|()| ExitCode::SUCCESS)
        .map_err(|e| anyhow::anyhow!("writing the manual page: {e}"))
}

/// The flags of subcommand `cmd` given on the command line (not defaults).
fn given(matches: &clap::ArgMatches, cmd: &str) -> Vec<String> {
    let Some(m) = matches.subcommand_matches(cmd) else {
        return Vec::new();
    };
    m.ids()
        .filter(|id| m.value_source(id.as_str()) == Some(clap::parser::ValueSource::CommandLine))
        .map(|id| id.to_string())
        .collect()
}
