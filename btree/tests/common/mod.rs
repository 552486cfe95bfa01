//! What the kill -9 tests share: this test binary started again as a child process (the test
//! named, with the environment given), and killed with SIGKILL after a while, its output kept.
#![allow(dead_code)] // each test binary uses its part

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A number from the environment, or `default`.
pub fn env_num<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

/// Run the test `test` of this binary again, as a child with `env` set; its stdout piped.
pub fn respawn(test: &str, env: &[(&str, String)]) -> Child {
    Command::new(std::env::current_exe().unwrap())
        .args(["--exact", test, "--nocapture", "--test-threads=1"])
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

/// Let `child` run for `after`, then kill it with SIGKILL (what `Child::kill` sends on Unix),
/// as a crash would; returns every line it printed. Panics if it ended by itself first.
pub fn kill_after(mut child: Child, after: Duration, round: impl std::fmt::Display) -> Vec<String> {
    let stdout = child.stdout.take().unwrap();
    // read on a thread (the pipe must not fill); kill from here
    let reader = std::thread::spawn(move || {
        BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
            .collect::<Vec<_>>()
    });
    let t0 = Instant::now();
    while t0.elapsed() < after {
        if let Some(st) = child.try_wait().unwrap() {
            panic!("round {round}: the child ended by itself ({st})");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    child.kill().unwrap();
    let _ = child.wait();
    reader.join().unwrap()
}
