//! The cluster file: a TOML description of a multi-process (or multi-host) cluster, and
//! [`join`], which starts one node of it in this process over the `tcp` transport.
//!
//! ```toml
//! # every node is started with the same file and its own --id
//! cluster_id = 1              # optional (default 1): nodes of other clusters are refused
//! cache = "256MiB"            # optional default cache per node
//! remote_timeout_ms = 10000   # optional: how long a worker waits for a remote page
//! connect_timeout_ms = 60000  # optional: how long start-up waits for every peer
//! secret_file = "cluster.secret"  # the cluster secret (make one with `shoal secret FILE`);
//!                             # or `secret = "<hex>"` in the file itself. Without one, only
//!                             # loopback addresses are allowed unless `allow_insecure = true`
//! encrypt = true              # optional (default false): seal every frame (AES-256-GCM,
//!                             # keys from the secret and each handshake); needs the secret
//! one_pool = false            # optional (default true): EngineConfig::one_pool
//! durability = "commit"       # optional (default "none"): "none", "commit" or
//!                             # "flush-every-ms=N", for every node (docs/durability.md,
//!                             # "Clusters"); with a log, every node's recovery reads every
//!                             # node's log, so every data_dir must be reachable from every host
//! wal_size = "64MiB"          # optional: the size of each node's log (with a log)
//! checkpoint_past_dead_peers = false # optional (default true):
//!                             # EngineConfig::checkpoint_past_dead_peers
//!
//! [[node]]
//! id = 0
//! address = "10.0.0.1:7400"   # where this node listens; peers dial it
//! data_dir = "/nvme/shoal"    # relative paths are relative to this file's folder
//!
//! [[node]]
//! id = 1
//! address = "10.0.0.2:7400"
//! data_dir = "/nvme/shoal"
//! cache = "1GiB"              # optional, overrides the default
//! devices = 2                 # optional, device files to stripe over (default 1)
//! ```
//!
//! Ids must be 0..n-1, each once; addresses must be distinct. Everything is checked before any
//! network traffic, with errors naming the file and the field.

use crate::config::{parse_bytes, EngineConfig};
use crate::engine::Engine;
use crate::error::EngineError;
use crate::node::Membership;
use crate::pid::MAX_NODES;
use serde::Deserialize;
use shoal_messaging::{ChannelLayout, Transport, WaitMode};
use shoal_messaging::{TcpConfig, TcpTransport};
use std::net::{SocketAddr, TcpListener, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    #[serde(default = "default_cluster_id")]
    cluster_id: u64,
    cache: Option<String>,
    remote_timeout_ms: Option<u64>,
    connect_timeout_ms: Option<u64>,
    secret: Option<String>,
    secret_file: Option<PathBuf>,
    #[serde(default)]
    allow_insecure: bool,
    #[serde(default)]
    encrypt: bool,
    #[serde(default = "default_one_pool")]
    one_pool: bool,
    durability: Option<String>,
    wal_size: Option<String>,
    #[serde(default = "default_checkpoint_past_dead_peers")]
    checkpoint_past_dead_peers: bool,
    #[serde(default)]
    node: Vec<RawNode>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawNode {
    id: u64,
    address: String,
    data_dir: PathBuf,
    cache: Option<String>,
    devices: Option<usize>,
}

fn default_cluster_id() -> u64 {
    1
}

fn default_one_pool() -> bool {
    true
}

fn default_checkpoint_past_dead_peers() -> bool {
    EngineConfig::default().checkpoint_past_dead_peers
}

/// Default cache per node when the file names none.
pub const DEFAULT_CACHE: &str = "256MiB";

/// One node of a cluster file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeEntry {
    pub id: u8,
    pub address: SocketAddr,
    pub data_dir: PathBuf,
    pub cache_bytes: usize,
    pub devices: usize,
}

/// A parsed and checked cluster file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterFile {
    pub cluster_id: u64,
    pub nodes: Vec<NodeEntry>,
    pub remote_timeout: Duration,
    pub connect_timeout: Duration,
    /// The secret every connection proves (empty: none; see [`Secret`]).
    pub secret: Secret,
    /// Seal every frame between nodes (needs the secret).
    pub encrypt: bool,
    /// `EngineConfig::one_pool` of every node.
    pub one_pool: bool,
    /// `EngineConfig::checkpoint_past_dead_peers` of every node.
    pub checkpoint_past_dead_peers: bool,
    /// `EngineConfig::durability` of every node (`None`: the file names none, and a node gets
    /// durability none unless its command line says otherwise).
    pub durability: Option<crate::Durability>,
    /// `EngineConfig::wal_bytes` of every node (with a log).
    pub wal_bytes: u64,
}

/// A cluster secret: bytes both ends of every tcp connection prove they know (the transport's
/// handshake, HMAC-SHA256 over fresh nonces). Never printed.
#[derive(Clone, PartialEq, Eq, Default)]
pub struct Secret(pub Vec<u8>);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.0.is_empty() {
            f.write_str("Secret(none)")
        } else {
            write!(f, "Secret({} bytes)", self.0.len())
        }
    }
}

/// Bytes of a secret made by [`new_secret_hex`]; a secret given by hand must have at least 16.
pub const SECRET_BYTES: usize = 32;
const MIN_SECRET_BYTES: usize = 16;

/// A new random cluster secret, as hex (from the operating system's random source).
pub fn new_secret_hex() -> std::io::Result<String> {
    use std::io::Read;
    let mut b = [0u8; SECRET_BYTES];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut b)?;
    Ok(b.iter().map(|x| format!("{x:02x}")).collect())
}

fn parse_secret_hex(text: &str, what: &str) -> Result<Vec<u8>, String> {
    let t = text.trim();
    if !t.len().is_multiple_of(2) || !t.bytes().all(|c| c.is_ascii_hexdigit()) {
        return Err(format!(
            "{what}: the secret must be hex digits (an even number of them)"
        ));
    }
    let b: Vec<u8> = (0..t.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&t[i..i + 2], 16).expect("hex checked"))
        .collect();
    if b.len() < MIN_SECRET_BYTES {
        return Err(format!(
            "{what}: the secret has {} bytes, at least {MIN_SECRET_BYTES} are needed (`shoal secret FILE` makes one of {SECRET_BYTES})",
            b.len()
        ));
    }
    Ok(b)
}

impl ClusterFile {
    /// Read and check `path`.
    pub fn load(path: &Path) -> Result<ClusterFile, EngineError> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            EngineError::Config(format!(
                "cluster file {}: cannot read it: {e}",
                path.display()
            ))
        })?;
        let base = path.parent().unwrap_or(Path::new("."));
        ClusterFile::parse(&text, base)
            .map_err(|e| EngineError::Config(format!("cluster file {}: {e}", path.display())))
    }

    /// Parse and check the text of a cluster file; relative data directories are taken
    /// relative to `base`.
    pub fn parse(text: &str, base: &Path) -> Result<ClusterFile, String> {
        let raw: RawFile = toml::from_str(text).map_err(|e| e.to_string())?;
        let n = raw.node.len();
        if n == 0 || n > MAX_NODES {
            return Err(format!("needs 1 to {MAX_NODES} [[node]] tables, found {n}"));
        }
        let default_cache = raw.cache.as_deref().unwrap_or(DEFAULT_CACHE);
        let mut nodes: Vec<Option<NodeEntry>> = vec![None; n];
        for r in raw.node {
            let at = format!("node {}", r.id);
            let id = usize::try_from(r.id)
                .ok()
                .filter(|&i| i < n)
                .ok_or_else(|| format!("{at}: ids must be 0..{} (one per [[node]])", n - 1))?;
            if nodes[id].is_some() {
                return Err(format!("{at}: the id appears twice"));
            }
            let address = r
                .address
                .to_socket_addrs()
                .map_err(|e| format!("{at}: address '{}': {e}", r.address))?
                .next()
                .ok_or_else(|| format!("{at}: address '{}' resolves to nothing", r.address))?;
            let cache = r.cache.as_deref().unwrap_or(default_cache);
            let cache_bytes =
                parse_bytes(cache).map_err(|e| format!("{at}: cache '{cache}': {e}"))? as usize;
            let devices = r.devices.unwrap_or(1);
            if devices == 0 {
                return Err(format!("{at}: devices must be at least 1"));
            }
            let data_dir = if r.data_dir.is_absolute() {
                r.data_dir
            } else {
                base.join(r.data_dir)
            };
            nodes[id] = Some(NodeEntry {
                id: id as u8,
                address,
                data_dir,
                cache_bytes,
                devices,
            });
        }
        let nodes: Vec<NodeEntry> = nodes
            .into_iter()
            .map(|e| e.expect("every id seen"))
            .collect();
        for (i, a) in nodes.iter().enumerate() {
            if let Some(b) = nodes[..i].iter().find(|b| b.address == a.address) {
                return Err(format!(
                    "nodes {} and {} both listen on {}",
                    b.id, a.id, a.address
                ));
            }
        }
        let secret = match (raw.secret, raw.secret_file) {
            (Some(_), Some(_)) => {
                return Err("give either secret or secret_file, not both".into());
            }
            (Some(h), None) => parse_secret_hex(&h, "secret")?,
            (None, Some(f)) => {
                let f = if f.is_absolute() { f } else { base.join(f) };
                let what = format!("secret_file {}", f.display());
                let text = std::fs::read_to_string(&f)
                    .map_err(|e| format!("{what}: cannot read it: {e}"))?;
                parse_secret_hex(&text, &what)?
            }
            (None, None) => Vec::new(),
        };
        if secret.is_empty() && !raw.allow_insecure {
            if let Some(e) = nodes.iter().find(|e| !e.address.ip().is_loopback()) {
                return Err(format!(
                    "node {} listens on {}, which is not a loopback address, and the file has \
                     no secret: any process that reaches that port could join as a node. Add \
                     `secret_file = \"cluster.secret\"` (make the file with `shoal secret \
                     cluster.secret` and copy it to every host), or set `allow_insecure = true` \
                     on a network you trust",
                    e.id, e.address
                ));
            }
        }
        if raw.encrypt && secret.is_empty() {
            return Err(
                "encrypt = true needs a cluster secret (the frame keys are derived from \
                 it): add `secret_file = \"cluster.secret\"` and make the file with `shoal \
                 secret cluster.secret`"
                    .into(),
            );
        }
        let ms = |v: Option<u64>, d: u64, what: &str| match v.unwrap_or(d) {
            0 => Err(format!("{what} must be at least 1 ms")),
            v => Ok(Duration::from_millis(v)),
        };
        let durability = match raw.durability.as_deref() {
            None => None,
            Some(d) => Some(crate::Durability::parse(d).map_err(|e| format!("durability: {e}"))?),
        };
        let wal_bytes = match raw.wal_size.as_deref() {
            None => EngineConfig::default().wal_bytes,
            Some(w) => parse_bytes(w).map_err(|e| format!("wal_size '{w}': {e}"))?,
        };
        Ok(ClusterFile {
            durability,
            wal_bytes,
            cluster_id: raw.cluster_id,
            remote_timeout: ms(raw.remote_timeout_ms, 10_000, "remote_timeout_ms")?,
            connect_timeout: ms(raw.connect_timeout_ms, 60_000, "connect_timeout_ms")?,
            nodes,
            secret: Secret(secret),
            encrypt: raw.encrypt,
            one_pool: raw.one_pool,
            checkpoint_past_dead_peers: raw.checkpoint_past_dead_peers,
        })
    }

    /// The text of a file for nodes listening on `addrs` (node i on `addrs[i]`), with data
    /// directories `dir/node<i>` (what `shoal ycsb --transport tcp` writes for its processes).
    /// `secret`: hex, or `None` (a loopback-only file without one works, with a warning);
    /// `encrypt`: seal every frame (needs the secret).
    pub fn local_text(
        addrs: &[SocketAddr],
        dir: &Path,
        cache: &str,
        secret: Option<&str>,
        encrypt: bool,
    ) -> String {
        // `cache` is one size for every node, or one per node separated by commas
        let caches: Vec<&str> = cache.split(',').map(str::trim).collect();
        let mut s = format!(
            "cluster_id = {}\ncache = \"{}\"\n",
            std::process::id(),
            caches[0]
        );
        if let Some(h) = secret {
            s += &format!("secret = \"{h}\"\n");
        }
        if encrypt {
            s += "encrypt = true\n";
        }
        for (i, a) in addrs.iter().enumerate() {
            s += &format!(
                "\n[[node]]\nid = {i}\naddress = \"{a}\"\ndata_dir = \"{}\"\n",
                dir.join(format!("node{i}")).display()
            );
            if caches.len() > 1 {
                s += &format!("cache = \"{}\"\n", caches.get(i).unwrap_or(&caches[0]));
            }
        }
        s
    }

    /// The engine configuration of node `id` (its data directory, cache, devices, ids).
    pub fn engine_config(&self, id: u8) -> Result<EngineConfig, EngineError> {
        let e = self.node(id)?;
        let mut cfg = EngineConfig::for_cluster_node(&e.data_dir, e.cache_bytes);
        cfg.devices = e.devices;
        cfg.node_id = id;
        cfg.cluster_id = self.cluster_id;
        cfg.one_pool = self.one_pool;
        cfg.durability = self.durability.unwrap_or(crate::Durability::None);
        cfg.wal_bytes = self.wal_bytes;
        cfg.checkpoint_past_dead_peers = self.checkpoint_past_dead_peers;
        // every node's recovery reads the others' logs (docs/durability.md, "Clusters"); the
        // durability is the cluster's, so with a log every node has one, and each must be
        // readable (a missing one is an error, never skipped)
        cfg.peer_logs = self
            .nodes
            .iter()
            .filter(|n| n.id != id)
            .filter_map(|n| {
                let mut c = EngineConfig::for_cluster_node(&n.data_dir, n.cache_bytes);
                c.devices = n.devices;
                c.node_id = n.id;
                c.durability = cfg.durability;
                c.wal_config().map(|w| w.path)
            })
            .collect();
        Ok(cfg)
    }

    fn node(&self, id: u8) -> Result<&NodeEntry, EngineError> {
        self.nodes.get(id as usize).ok_or_else(|| {
            EngineError::Config(format!(
                "--id {id}: the cluster file has nodes 0..{}",
                self.nodes.len() - 1
            ))
        })
    }
}

/// Start node `id` of `file` in this process: listen on its address, connect to every peer
/// (waiting up to the file's connect timeout for them to start), and open its engine with
/// `cfg` (from [`ClusterFile::engine_config`], possibly adjusted). Leave with
/// [`Engine::leave`].
pub fn join(file: &ClusterFile, id: u8, cfg: EngineConfig) -> Result<Engine, EngineError> {
    let me = file.node(id)?;
    if cfg.node_id != id || cfg.cluster_id != file.cluster_id {
        return Err(EngineError::Config(format!(
            "the engine configuration is node {} of cluster {}, not node {id} of cluster {}",
            cfg.node_id, cfg.cluster_id, file.cluster_id
        )));
    }
    cfg.validate()?;
    if file.secret.0.is_empty() {
        log::warn!(
            "node {id}: the cluster file has no secret: any local process that reaches a node's \
             port could join as a node (loopback addresses only; see docs/cluster.md, Security)"
        );
    }
    let listener = TcpListener::bind(me.address).map_err(|e| {
        EngineError::Config(format!("node {id}: cannot listen on {}: {e}", me.address))
    })?;
    let mut tcp_cfg = TcpConfig::new(
        id,
        file.cluster_id,
        file.nodes.iter().map(|n| n.address).collect(),
    );
    tcp_cfg.connect_timeout = file.connect_timeout;
    tcp_cfg.secret = file.secret.0.clone();
    tcp_cfg.encrypt = file.encrypt;
    let transport = start_tcp(tcp_cfg, listener)?;
    Engine::open_member(
        cfg,
        Membership {
            transport,
            mode: WaitMode::Park,
            remote_timeout: file.remote_timeout,
            // (every node of this cluster joined in one process shares it; apart from the
            // counter's identities, which never reach the top bit)
            database: (1 << 63) | file.cluster_id,
        },
    )
}

/// Start the tcp transport of node `cfg.node` on `listener` with this engine's message
/// version and a region of the cluster's layout: blocks until every peer is connected.
pub(crate) fn start_tcp(
    mut cfg: TcpConfig,
    listener: TcpListener,
) -> Result<Arc<dyn Transport>, EngineError> {
    let node = cfg.node;
    cfg.messages_version = crate::coherence::wire::WIRE_VERSION;
    let region = ChannelLayout::new(cfg.addrs.len() as u8)
        .region()
        .map_err(|e| EngineError::Config(format!("cluster messaging: {e}")))?;
    TcpTransport::start(cfg, listener, Arc::new(region))
        .map(|t| t as Arc<dyn Transport>)
        .map_err(|e| EngineError::Join {
            node,
            why: e.to_string(),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
cluster_id = 9
cache = "64MiB"
[[node]]
id = 1
address = "127.0.0.1:7501"
data_dir = "n1"
cache = "128MiB"
devices = 2
[[node]]
id = 0
address = "127.0.0.1:7500"
data_dir = "/abs/n0"
"#;

    #[test]
    fn a_good_file_parses_with_defaults_and_relative_paths() {
        let f = ClusterFile::parse(GOOD, Path::new("/etc/shoal")).unwrap();
        assert_eq!(f.cluster_id, 9);
        assert_eq!(f.nodes.len(), 2);
        assert_eq!(f.nodes[0].data_dir, PathBuf::from("/abs/n0"));
        assert_eq!(f.nodes[0].cache_bytes, 64 << 20);
        assert_eq!(f.nodes[1].data_dir, PathBuf::from("/etc/shoal/n1"));
        assert_eq!(f.nodes[1].cache_bytes, 128 << 20);
        assert_eq!(f.nodes[1].devices, 2);
        assert_eq!(f.remote_timeout, Duration::from_secs(10));
        let c = f.engine_config(1).unwrap();
        assert_eq!((c.node_id, c.cluster_id, c.devices), (1, 9, 2));
        assert!(
            c.checkpoint_past_dead_peers,
            "on unless the file says otherwise"
        );
        assert!(f.engine_config(2).unwrap_err().to_string().contains("0..1"));
        let off = format!("checkpoint_past_dead_peers = false\n{GOOD}");
        let f = ClusterFile::parse(&off, Path::new("/etc/shoal")).unwrap();
        assert!(!f.engine_config(0).unwrap().checkpoint_past_dead_peers);
    }

    #[test]
    fn bad_files_name_what_is_wrong() {
        let err = |t: &str| ClusterFile::parse(t, Path::new("/")).unwrap_err();
        let node = |id: u32, port: u32| {
            format!("[[node]]\nid = {id}\naddress = \"127.0.0.1:{port}\"\ndata_dir = \"d{id}\"\n")
        };
        assert!(err("").contains("[[node]]"));
        assert!(err(&(node(0, 1) + &node(0, 2))).contains("twice"));
        assert!(err(&(node(0, 1) + &node(2, 2))).contains("ids must be"));
        assert!(err(&(node(0, 1) + &node(1, 1))).contains("both listen"));
        assert!(err(&node(0, 99999)).contains("address"));
        assert!(err(&format!("cache = \"lots\"\n{}", node(0, 1))).contains("cache"));
        assert!(err(&format!("colour = 3\n{}", node(0, 1))).contains("colour"));
        assert!(err(&format!("remote_timeout_ms = 0\n{}", node(0, 1))).contains("remote_timeout"));
        assert!(err("[[node]]\nid = 0\n").contains("address"));
    }

    #[test]
    fn secrets_come_from_the_file_or_a_file_it_names_and_other_hosts_need_one() {
        let dir = tempfile::tempdir().unwrap();
        let node = |id: u32, host: &str| {
            format!(
                "[[node]]\nid = {id}\naddress = \"{host}:{}\"\ndata_dir = \"d{id}\"\n",
                7700 + id
            )
        };
        let two = |host: &str| format!("{}{}", node(0, host), node(1, host));
        let hex = new_secret_hex().unwrap();
        std::fs::write(dir.path().join("c.secret"), format!("{hex}\n")).unwrap();
        let parse = |head: &str, host: &str| {
            ClusterFile::parse(&format!("{head}\n{}", two(host)), dir.path())
        };
        let f = parse(&format!("secret = \"{hex}\""), "10.1.2.3").unwrap();
        assert_eq!(f.secret.0.len(), SECRET_BYTES);
        let g = parse("secret_file = \"c.secret\"", "10.1.2.3").unwrap();
        assert_eq!(
            g.secret, f.secret,
            "a secret file relative to the cluster file's folder"
        );
        // no secret: loopback only, unless allowed
        assert!(parse("", "127.0.0.1").unwrap().secret.0.is_empty());
        let e = parse("", "10.1.2.3").unwrap_err();
        assert!(
            e.contains("not a loopback address") && e.contains("shoal secret"),
            "{e}"
        );
        assert!(parse("allow_insecure = true", "10.1.2.3").is_ok());
        // bad secrets
        let e = parse("secret = \"abcd\"", "127.0.0.1").unwrap_err();
        assert!(e.contains("at least 16"), "{e}");
        let e = parse("secret = \"not hex at all!\"", "127.0.0.1").unwrap_err();
        assert!(e.contains("hex"), "{e}");
        let e = parse(
            &format!("secret = \"{hex}\"\nsecret_file = \"c.secret\""),
            "127.0.0.1",
        )
        .unwrap_err();
        assert!(e.contains("not both"), "{e}");
        let e = parse("secret_file = \"missing\"", "127.0.0.1").unwrap_err();
        assert!(e.contains("cannot read"), "{e}");
    }

    #[test]
    fn the_local_file_round_trips() {
        let addrs: Vec<SocketAddr> = (0..3)
            .map(|i| format!("127.0.0.1:{}", 7600 + i).parse().unwrap())
            .collect();
        let t = ClusterFile::local_text(&addrs, Path::new("/tmp/x"), "32MiB", None, false);
        let f = ClusterFile::parse(&t, Path::new("/")).unwrap();
        assert!(f.secret.0.is_empty());
        let h = new_secret_hex().unwrap();
        let t = ClusterFile::local_text(&addrs, Path::new("/tmp/x"), "32MiB", Some(&h), true);
        let g = ClusterFile::parse(&t, Path::new("/")).unwrap();
        assert_eq!(g.secret.0.len(), SECRET_BYTES);
        assert!(g.encrypt && !f.encrypt);
        // encryption needs the secret
        let t = ClusterFile::local_text(&addrs, Path::new("/tmp/x"), "32MiB", None, true);
        let e = ClusterFile::parse(&t, Path::new("/")).unwrap_err();
        assert!(e.contains("encrypt = true needs a cluster secret"), "{e}");
        assert!(
            !format!("{g:?}").contains(&h[..8]),
            "the secret is never printed"
        );
        assert_eq!(f.nodes.len(), 3);
        assert_eq!(f.nodes[2].address, "127.0.0.1:7602".parse().unwrap());
        assert_eq!(f.nodes[2].data_dir, PathBuf::from("/tmp/x/node2"));
        assert_eq!(f.nodes[2].cache_bytes, 32 << 20);
    }
}
