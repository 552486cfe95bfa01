//! `shoal-echo-peer PARENT_ADDR`: node 1 of a 2-node tcp cluster whose node 0 listens at
//! `PARENT_ADDR`, serving the tests' echo and page protocol until it is killed. It prints
//! `PEER_ADDR <addr>` once it listens. Used by messaging/tests/tcp.rs as a peer process to kill
//! (a separate binary, so no test-harness entry has to double as a child process).

#[path = "../../tests/common.rs"]
mod common;

use shoal_messaging::{Layout, Mailboxes, WaitMode};
use shoal_messaging::{TcpConfig, TcpTransport};
use std::io::Write;
use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

/// Must match the tests' `CLUSTER` in messaging/tests/tcp.rs.
const CLUSTER: u64 = 0x5EA1;

fn main() {
    if let Err(e) = run() {
        eprintln!("shoal-echo-peer: {e}");
        std::process::exit(2);
    }
}

fn run() -> Result<(), String> {
    let parent: SocketAddr = std::env::args()
        .nth(1)
        .ok_or("usage: shoal-echo-peer PARENT_ADDR")?
        .parse()
        .map_err(|e| format!("PARENT_ADDR: {e}"))?;
    let layout = Layout {
        nodes: 2,
        workers: 2,
        handlers: 2,
        frames: 2,
    };
    let l = TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
    let me = l.local_addr().map_err(|e| e.to_string())?;
    println!("PEER_ADDR {me}");
    std::io::stdout().flush().map_err(|e| e.to_string())?;
    let mut cfg = TcpConfig::new(1, CLUSTER, vec![parent, me]);
    cfg.connect_timeout = Duration::from_secs(10);
    let region = Arc::new(layout.region().map_err(|e| e.to_string())?);
    let t = TcpTransport::start(cfg, l, region).map_err(|e| e.to_string())?;
    let mb = Mailboxes::new(t, layout, WaitMode::Park).map_err(|e| e.to_string())?;
    let stop = AtomicBool::new(false);
    mb.run_handler(0, &stop, |env, r| common::serve(1, env, r)); // until killed
    Ok(())
}
