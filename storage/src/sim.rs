//! A simulated device for crash tests: it records every change the store makes to its files
//! and rebuilds, from the record, what a crash or a power loss at any point would have left on
//! a device that loses what was not synced (feature `crash-sim`; the recording hooks in
//! [`crate::fs`] cost one relaxed load without it).
//!
//! **The model** (as strict as POSIX allows, like LazyFS and ALICE): a write is volatile until
//! an `fdatasync`/`fsync` of its file that *began* after the write completed; a file's creation,
//! rename or removal is volatile until an `fsync` of its directory that began after it. At a
//! crash every volatile change may be lost; which ones survive is chosen by [`Crash`]:
//! none, an ordered prefix, any subset, or any subset with writes torn at 512-byte sectors.
//! Durable data can then be damaged ([`Damage`]): a bit flipped, a range zeroed, or a log write
//! sent to the wrong place.
//!
//! **Use**: [`start`] before the workload (the files it creates must be new), [`mark`] what the
//! workload acknowledges, [`stop`] for the [`Trace`]; then [`Trace::materialize`] the state at
//! any event into a directory and open it as recovery would. Everything after [`start`] is
//! deterministic from the trace, the event index and a seed: a failure replays from those three
//! ([`Trace::save`], [`Trace::load`]).

use std::collections::{BTreeMap, HashMap};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
#[cfg(feature = "crash-sim")]
use std::sync::atomic::{AtomicBool, Ordering};
#[cfg(feature = "crash-sim")]
use std::sync::Mutex;

/// One change to the files, in the order the store made them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// A file opened with create and truncate: new and empty, or cut to 0 bytes.
    Create {
        path: PathBuf,
    },
    Write {
        path: PathBuf,
        off: u64,
        data: Vec<u8>,
    },
    /// The file's size set (room reserved, or cut).
    SetLen {
        path: PathBuf,
        len: u64,
    },
    /// A sync of the file's data and size that began when the trace had `begun` events.
    Sync {
        path: PathBuf,
        begun: usize,
    },
    Rename {
        from: PathBuf,
        to: PathBuf,
    },
    Remove {
        path: PathBuf,
    },
    /// A sync of a directory's entries that began when the trace had `begun` events.
    SyncDir {
        dir: PathBuf,
        begun: usize,
    },
    /// A point the workload named (what it acknowledged by then).
    Mark {
        tag: u64,
    },
}

#[cfg(feature = "crash-sim")]
static ON: AtomicBool = AtomicBool::new(false);
#[cfg(feature = "crash-sim")]
static EVENTS: Mutex<Vec<Event>> = Mutex::new(Vec::new());

/// Whether changes are being recorded.
#[cfg(feature = "crash-sim")]
#[inline]
fn recording() -> bool {
    ON.load(Ordering::Relaxed)
}

/// Files whose `fdatasync` fails from now on (by the end of their path), as a device that
/// reports a write error at the sync would ([`fail_syncs_of`]).
#[cfg(feature = "crash-sim")]
static FAILING_SYNCS: Mutex<Option<String>> = Mutex::new(None);

/// From now on every `fdatasync` of a file whose path ends with `suffix` fails with an I/O
/// error, before syncing anything (`None`: none fails). For tests of what a failed sync does:
/// the whole process is affected, so such a test runs in a binary of its own.
#[cfg(feature = "crash-sim")]
pub fn fail_syncs_of(suffix: Option<&str>) {
    *FAILING_SYNCS.lock().unwrap_or_else(|p| p.into_inner()) = suffix.map(str::to_string);
}

/// An injected failure of the sync of `path` ([`fail_syncs_of`]), if one is due.
pub(crate) fn sync_fails(path: &Path) -> io::Result<()> {
    #[cfg(feature = "crash-sim")]
    if let Some(s) = FAILING_SYNCS
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .as_deref()
    {
        if path.to_string_lossy().ends_with(s) {
            return Err(io::Error::other(format!(
                "fdatasync of {} failed (injected by the crash simulator)",
                path.display()
            )));
        }
    }
    let _ = path;
    Ok(())
}

/// Record an event (made only while recording).
#[inline]
pub(crate) fn record(make: impl FnOnce() -> Event) {
    #[cfg(feature = "crash-sim")]
    if recording() {
        let e = make();
        EVENTS.lock().unwrap_or_else(|p| p.into_inner()).push(e);
    }
    #[cfg(not(feature = "crash-sim"))]
    let _ = make;
}

/// The number of events so far (where a sync that begins now starts covering).
pub(crate) fn now() -> usize {
    #[cfg(feature = "crash-sim")]
    if recording() {
        return EVENTS.lock().unwrap_or_else(|p| p.into_inner()).len();
    }
    0
}

/// Begin recording (clears what an earlier recording left).
#[cfg(feature = "crash-sim")]
pub fn start() {
    EVENTS.lock().unwrap_or_else(|p| p.into_inner()).clear();
    ON.store(true, Ordering::SeqCst);
}

/// Name a point of the workload (for example, the number of commits acknowledged so far).
#[cfg(feature = "crash-sim")]
pub fn mark(tag: u64) {
    record(|| Event::Mark { tag });
}

/// Stop recording; the trace of everything since [`start`].
#[cfg(feature = "crash-sim")]
pub fn stop() -> Trace {
    ON.store(false, Ordering::SeqCst);
    Trace {
        events: std::mem::take(&mut *EVENTS.lock().unwrap_or_else(|p| p.into_inner())),
    }
}

/// What survives a crash of the volatile changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Crash {
    /// Nothing that was not synced.
    DropUnsynced,
    /// The volatile changes of each file and directory up to a random one, in order.
    KeepPrefix,
    /// Any subset of them.
    KeepSome,
    /// Any subset, and each kept write of several sectors keeps only some of its sectors.
    Tear,
}

/// Damage done to durable data after the crash.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Damage {
    None,
    /// One bit of a written byte of a file whose name ends in `suffix`.
    FlipBit {
        suffix: &'static str,
    },
    /// A range of 512 B to 64 KiB zeroed inside the written part of a file (name ends in
    /// `suffix`).
    Zero {
        suffix: &'static str,
    },
    /// One write of a file (name ends in `suffix`) lands a whole number of blocks away from
    /// where it was sent, and not where it was sent.
    Misdirect {
        suffix: &'static str,
    },
}

/// A recorded run.
#[derive(Debug, Clone, Default)]
pub struct Trace {
    pub events: Vec<Event>,
}

/// A file's bytes, sparse in 4 KiB blocks (missing blocks read as zeros).
#[derive(Debug, Clone, Default)]
struct Content {
    len: u64,
    blocks: BTreeMap<u64, Box<[u8; 4096]>>,
}

impl Content {
    fn write(&mut self, off: u64, data: &[u8]) {
        let mut at = off;
        let mut rest = data;
        while !rest.is_empty() {
            let b = at / 4096;
            let within = (at % 4096) as usize;
            let n = rest.len().min(4096 - within);
            let block = self.blocks.entry(b).or_insert_with(|| Box::new([0; 4096]));
            block[within..within + n].copy_from_slice(&rest[..n]);
            rest = &rest[n..];
            at += n as u64;
        }
        self.len = self.len.max(off + data.len() as u64);
    }

    fn set_len(&mut self, len: u64) {
        if len < self.len {
            let first_gone = len.div_ceil(4096);
            self.blocks.split_off(&first_gone);
            if !len.is_multiple_of(4096) {
                if let Some(b) = self.blocks.get_mut(&(len / 4096)) {
                    b[(len % 4096) as usize..].fill(0);
                }
            }
        }
        self.len = len;
    }

    fn to_file(&self, path: &Path) -> io::Result<()> {
        use std::os::unix::fs::FileExt;
        let f = std::fs::File::create(path)?;
        for (b, data) in &self.blocks {
            let at = b * 4096;
            if at >= self.len {
                break;
            }
            let n = (self.len - at).min(4096) as usize;
            f.write_all_at(&data[..n], at)?;
        }
        f.set_len(self.len)
    }
}

/// A change to a file's content that a sync has not covered yet.
#[derive(Debug, Clone)]
enum Pending {
    Write { at: usize, off: u64, data: Vec<u8> },
    SetLen { at: usize, len: u64 },
}

impl Pending {
    fn at(&self) -> usize {
        match self {
            Pending::Write { at, .. } | Pending::SetLen { at, .. } => *at,
        }
    }
}

#[derive(Debug, Clone, Default)]
struct Inode {
    durable: Content,
    pending: Vec<Pending>,
}

/// A change to a directory's entries not yet covered by a sync of the directory.
#[derive(Debug, Clone)]
enum DirOp {
    Link {
        at: usize,
        name: PathBuf,
        ino: usize,
    },
    Unlink {
        at: usize,
        name: PathBuf,
    },
}

/// The simulated file system at one event of a trace.
#[derive(Debug, Default)]
struct World {
    inodes: Vec<Inode>,
    /// What a process sees: name -> inode.
    live: HashMap<PathBuf, usize>,
    /// What a crash keeps for sure, per directory: name -> inode.
    durable: HashMap<PathBuf, usize>,
    /// Per directory, changes of entries not synced, in order.
    dir_ops: HashMap<PathBuf, Vec<DirOp>>,
}

fn parent(p: &Path) -> PathBuf {
    p.parent().map(Path::to_path_buf).unwrap_or_default()
}

impl World {
    fn apply(&mut self, i: usize, e: &Event) {
        match e {
            Event::Create { path } => match self.live.get(path) {
                Some(&ino) => self.inodes[ino]
                    .pending
                    .push(Pending::SetLen { at: i, len: 0 }),
                None => {
                    self.inodes.push(Inode::default());
                    let ino = self.inodes.len() - 1;
                    self.live.insert(path.clone(), ino);
                    self.dir_ops
                        .entry(parent(path))
                        .or_default()
                        .push(DirOp::Link {
                            at: i,
                            name: path.clone(),
                            ino,
                        });
                }
            },
            Event::Write { path, off, data } => {
                if let Some(&ino) = self.live.get(path) {
                    self.inodes[ino].pending.push(Pending::Write {
                        at: i,
                        off: *off,
                        data: data.clone(),
                    });
                }
            }
            Event::SetLen { path, len } => {
                if let Some(&ino) = self.live.get(path) {
                    self.inodes[ino]
                        .pending
                        .push(Pending::SetLen { at: i, len: *len });
                }
            }
            Event::Sync { path, begun } => {
                if let Some(&ino) = self.live.get(path) {
                    let node = &mut self.inodes[ino];
                    let (done, keep): (Vec<Pending>, Vec<Pending>) =
                        node.pending.drain(..).partition(|p| p.at() < *begun);
                    for p in done {
                        apply_pending(&mut node.durable, &p);
                    }
                    node.pending = keep;
                }
            }
            Event::Rename { from, to } => {
                if let Some(ino) = self.live.remove(from) {
                    self.live.insert(to.clone(), ino);
                    for (dir, op) in [
                        (
                            parent(from),
                            DirOp::Unlink {
                                at: i,
                                name: from.clone(),
                            },
                        ),
                        (
                            parent(to),
                            DirOp::Link {
                                at: i,
                                name: to.clone(),
                                ino,
                            },
                        ),
                    ] {
                        self.dir_ops.entry(dir).or_default().push(op);
                    }
                }
            }
            Event::Remove { path } => {
                if self.live.remove(path).is_some() {
                    self.dir_ops
                        .entry(parent(path))
                        .or_default()
                        .push(DirOp::Unlink {
                            at: i,
                            name: path.clone(),
                        });
                }
            }
            Event::SyncDir { dir, begun } => {
                if let Some(ops) = self.dir_ops.get_mut(dir) {
                    let (done, keep): (Vec<DirOp>, Vec<DirOp>) =
                        ops.drain(..).partition(|o| match o {
                            DirOp::Link { at, .. } | DirOp::Unlink { at, .. } => *at < *begun,
                        });
                    *ops = keep;
                    for o in done {
                        apply_dir(&mut self.durable, &o);
                    }
                }
            }
            Event::Mark { .. } => {}
        }
    }
}

fn apply_pending(c: &mut Content, p: &Pending) {
    match p {
        Pending::Write { off, data, .. } => c.write(*off, data),
        Pending::SetLen { len, .. } => c.set_len(*len),
    }
}

fn apply_dir(names: &mut HashMap<PathBuf, usize>, o: &DirOp) {
    match o {
        DirOp::Link { name, ino, .. } => {
            names.insert(name.clone(), *ino);
        }
        DirOp::Unlink { name, .. } => {
            names.remove(name);
        }
    }
}

/// A small deterministic generator (SplitMix64): the choices of one materialisation.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next() % n
        }
    }

    fn coin(&mut self) -> bool {
        self.next() & 1 == 1
    }
}

/// Which volatile changes of a list survive a crash of kind `crash`.
fn survivors(rng: &mut Rng, crash: Crash, n: usize) -> Vec<bool> {
    match crash {
        Crash::DropUnsynced => vec![false; n],
        Crash::KeepPrefix => {
            let k = rng.below(n as u64 + 1) as usize;
            (0..n).map(|i| i < k).collect()
        }
        Crash::KeepSome | Crash::Tear => (0..n).map(|_| rng.coin()).collect(),
    }
}

/// What [`Trace::materialize`] did, for the report of a failure.
#[derive(Debug, Clone, Default)]
pub struct Materialized {
    /// Volatile changes kept and lost.
    pub kept: usize,
    pub lost: usize,
    /// The damage done, in words (empty for none).
    pub damage: String,
    /// The event whose write was misdirected ([`Damage::Misdirect`]).
    pub misdirected: Option<usize>,
}

impl Trace {
    /// Events so far.
    pub fn len(&self) -> usize {
        self.events.len()
    }

    pub fn is_empty(&self) -> bool {
        self.events.is_empty()
    }

    /// The latest mark among the first `upto` events.
    pub fn last_mark(&self, upto: usize) -> Option<u64> {
        self.events[..upto].iter().rev().find_map(|e| match e {
            Event::Mark { tag } => Some(*tag),
            _ => None,
        })
    }

    /// Write into `to` the files a crash right after the first `upto` events would have left
    /// under `from` (the directory the workload ran in), as `crash` and `damage` choose with
    /// `seed`. `to` must exist and be empty.
    pub fn materialize(
        &self,
        upto: usize,
        crash: Crash,
        damage: Damage,
        seed: u64,
        from: &Path,
        to: &Path,
    ) -> io::Result<Materialized> {
        let mut rng = Rng(seed ^ (upto as u64).wrapping_mul(0x2545_f491_4f6c_dd1d));
        let mut report = Materialized::default();
        // a misdirected write: which one, and by how much
        let misdirected = match damage {
            Damage::Misdirect { suffix } => {
                let cands: Vec<usize> = self.events[..upto]
                    .iter()
                    .enumerate()
                    .filter(|(_, e)| {
                        matches!(e, Event::Write { path, data, .. }
                        if path.to_string_lossy().ends_with(suffix) && data.len() >= 512)
                    })
                    .map(|(i, _)| i)
                    .collect();
                (!cands.is_empty()).then(|| {
                    let i = cands[rng.below(cands.len() as u64) as usize];
                    let blocks = 1 + rng.below(64);
                    (i, blocks * 4096)
                })
            }
            _ => None,
        };
        let mut w = World::default();
        for (i, e) in self.events[..upto].iter().enumerate() {
            match (e, misdirected) {
                (Event::Write { path, off, data }, Some((m, by))) if m == i => {
                    let to_off = if *off >= by { off - by } else { off + by };
                    report.misdirected = Some(i);
                    report.damage = format!(
                        "the write of {} bytes to {} at {off} went to {to_off}",
                        data.len(),
                        path.display()
                    );
                    w.apply(
                        i,
                        &Event::Write {
                            path: path.clone(),
                            off: to_off,
                            data: data.clone(),
                        },
                    );
                }
                _ => w.apply(i, e),
            }
        }
        // the crash: directories first (which names survive), then contents
        let mut names = w.durable.clone();
        let mut dirs: Vec<&PathBuf> = w.dir_ops.keys().collect();
        dirs.sort();
        for d in dirs {
            let ops = &w.dir_ops[d];
            // entries change in order (a journal): a prefix survives
            let k = match crash {
                Crash::DropUnsynced => 0,
                _ => rng.below(ops.len() as u64 + 1) as usize,
            };
            for o in &ops[..k] {
                apply_dir(&mut names, o);
            }
            report.kept += k;
            report.lost += ops.len() - k;
        }
        // only what lies under `from` (a recording can catch other threads' files too)
        let mut files: Vec<(&PathBuf, &usize)> =
            names.iter().filter(|(n, _)| n.starts_with(from)).collect();
        files.sort();
        let mut out: Vec<(PathBuf, Content)> = Vec::new();
        for (name, &ino) in files {
            let node = &w.inodes[ino];
            let mut c = node.durable.clone();
            let keep = survivors(&mut rng, crash, node.pending.len());
            for (p, k) in node.pending.iter().zip(keep) {
                if !k {
                    report.lost += 1;
                    continue;
                }
                report.kept += 1;
                match (p, crash) {
                    (Pending::Write { off, data, .. }, Crash::Tear) if data.len() > 512 => {
                        for (j, sector) in data.chunks(512).enumerate() {
                            if rng.coin() {
                                c.write(off + 512 * j as u64, sector);
                            }
                        }
                    }
                    _ => apply_pending(&mut c, p),
                }
            }
            let rel = name.strip_prefix(from).expect("filtered above");
            out.push((to.join(rel), c));
        }
        let pick = |rng: &mut Rng, out: &[(PathBuf, Content)], suffix: &str| {
            let cands: Vec<usize> = (0..out.len())
                .filter(|&i| {
                    out[i].0.to_string_lossy().ends_with(suffix) && !out[i].1.blocks.is_empty()
                })
                .collect();
            (!cands.is_empty()).then(|| cands[rng.below(cands.len() as u64) as usize])
        };
        match damage {
            Damage::FlipBit { suffix } => {
                if let Some(f) = pick(&mut rng, &out, suffix) {
                    let c = &mut out[f].1;
                    let blocks: Vec<u64> = c.blocks.keys().copied().collect();
                    let b = blocks[rng.below(blocks.len() as u64) as usize];
                    let at = rng.below(4096) as usize;
                    let bit = rng.below(8);
                    if let Some(block) = c.blocks.get_mut(&b) {
                        block[at] ^= 1 << bit;
                    }
                    report.damage = format!(
                        "bit {bit} of byte {} of {} flipped",
                        b * 4096 + at as u64,
                        out[f].0.display()
                    );
                }
            }
            Damage::Zero { suffix } => {
                if let Some(f) = pick(&mut rng, &out, suffix) {
                    let c = &mut out[f].1;
                    let blocks: Vec<u64> = c.blocks.keys().copied().collect();
                    let b = blocks[rng.below(blocks.len() as u64) as usize];
                    let at = b * 4096 + rng.below(8) * 512;
                    let n = 512 * (1 + rng.below(128));
                    let end = (at + n).min(c.len);
                    if end > at {
                        c.write(at, &vec![0u8; (end - at) as usize]);
                    }
                    report.damage = format!(
                        "{} bytes of {} zeroed at {at}",
                        end.saturating_sub(at),
                        out[f].0.display()
                    );
                }
            }
            Damage::None | Damage::Misdirect { .. } => {}
        }
        for (path, c) in &out {
            if let Some(d) = path.parent() {
                std::fs::create_dir_all(d)?;
            }
            c.to_file(path)?;
        }
        Ok(report)
    }

    /// Write the trace to `path` (to replay a failure).
    pub fn save(&self, path: &Path) -> io::Result<()> {
        let mut f = io::BufWriter::new(std::fs::File::create(path)?);
        let p = |f: &mut io::BufWriter<std::fs::File>, p: &Path| -> io::Result<()> {
            let b = p.as_os_str().as_encoded_bytes();
            f.write_all(&(b.len() as u32).to_le_bytes())?;
            f.write_all(b)
        };
        for e in &self.events {
            match e {
                Event::Create { path } => {
                    f.write_all(&[0])?;
                    p(&mut f, path)?;
                }
                Event::Write { path, off, data } => {
                    f.write_all(&[1])?;
                    p(&mut f, path)?;
                    f.write_all(&off.to_le_bytes())?;
                    f.write_all(&(data.len() as u64).to_le_bytes())?;
                    f.write_all(data)?;
                }
                Event::SetLen { path, len } => {
                    f.write_all(&[2])?;
                    p(&mut f, path)?;
                    f.write_all(&len.to_le_bytes())?;
                }
                Event::Sync { path, begun } => {
                    f.write_all(&[3])?;
                    p(&mut f, path)?;
                    f.write_all(&(*begun as u64).to_le_bytes())?;
                }
                Event::Rename { from, to } => {
                    f.write_all(&[4])?;
                    p(&mut f, from)?;
                    p(&mut f, to)?;
                }
                Event::Remove { path } => {
                    f.write_all(&[5])?;
                    p(&mut f, path)?;
                }
                Event::SyncDir { dir, begun } => {
                    f.write_all(&[6])?;
                    p(&mut f, dir)?;
                    f.write_all(&(*begun as u64).to_le_bytes())?;
                }
                Event::Mark { tag } => {
                    f.write_all(&[7])?;
                    f.write_all(&tag.to_le_bytes())?;
                }
            }
        }
        f.flush()
    }

    /// Read a trace written by [`Trace::save`].
    pub fn load(path: &Path) -> io::Result<Trace> {
        let mut r = io::BufReader::new(std::fs::File::open(path)?);
        let bad = || io::Error::new(io::ErrorKind::InvalidData, "not a saved trace");
        let u64_of = |r: &mut io::BufReader<std::fs::File>| -> io::Result<u64> {
            let mut b = [0u8; 8];
            r.read_exact(&mut b)?;
            Ok(u64::from_le_bytes(b))
        };
        let path_of = |r: &mut io::BufReader<std::fs::File>| -> io::Result<PathBuf> {
            let mut b = [0u8; 4];
            r.read_exact(&mut b)?;
            let mut s = vec![0u8; u32::from_le_bytes(b) as usize];
            r.read_exact(&mut s)?;
            // SAFETY: the bytes were written by `as_encoded_bytes` of an OsStr on this
            // platform (Unix: any bytes are a valid OsStr).
            Ok(PathBuf::from(unsafe {
                std::ffi::OsString::from_encoded_bytes_unchecked(s)
            }))
        };
        let mut events = Vec::new();
        loop {
            let mut k = [0u8];
            match r.read_exact(&mut k) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => break,
                Err(e) => return Err(e),
            }
            events.push(match k[0] {
                0 => Event::Create {
                    path: path_of(&mut r)?,
                },
                1 => {
                    let path = path_of(&mut r)?;
                    let off = u64_of(&mut r)?;
                    let mut data = vec![0u8; u64_of(&mut r)? as usize];
                    r.read_exact(&mut data)?;
                    Event::Write { path, off, data }
                }
                2 => Event::SetLen {
                    path: path_of(&mut r)?,
                    len: u64_of(&mut r)?,
                },
                3 => Event::Sync {
                    path: path_of(&mut r)?,
                    begun: u64_of(&mut r)? as usize,
                },
                4 => Event::Rename {
                    from: path_of(&mut r)?,
                    to: path_of(&mut r)?,
                },
                5 => Event::Remove {
                    path: path_of(&mut r)?,
                },
                6 => Event::SyncDir {
                    dir: path_of(&mut r)?,
                    begun: u64_of(&mut r)? as usize,
                },
                7 => Event::Mark {
                    tag: u64_of(&mut r)?,
                },
                _ => return Err(bad()),
            });
        }
        Ok(Trace { events })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> PathBuf {
        PathBuf::from("/run").join(s)
    }

    fn trace(events: Vec<Event>) -> Trace {
        Trace { events }
    }

    fn files(t: &Trace, upto: usize, crash: Crash, seed: u64) -> BTreeMap<String, Vec<u8>> {
        let dir = tempfile::tempdir().unwrap();
        t.materialize(
            upto,
            crash,
            Damage::None,
            seed,
            Path::new("/run"),
            dir.path(),
        )
        .unwrap();
        let mut out = BTreeMap::new();
        for e in std::fs::read_dir(dir.path()).unwrap() {
            let e = e.unwrap();
            out.insert(
                e.file_name().to_string_lossy().into_owned(),
                std::fs::read(e.path()).unwrap(),
            );
        }
        out
    }

    fn write(name: &str, off: u64, data: &[u8]) -> Event {
        Event::Write {
            path: p(name),
            off,
            data: data.to_vec(),
        }
    }

    #[test]
    fn a_synced_write_survives_and_an_unsynced_one_may_not() {
        let t = trace(vec![
            Event::Create { path: p("a") },
            Event::SyncDir {
                dir: PathBuf::from("/run"),
                begun: 1,
            },
            write("a", 0, b"durable"),
            Event::Sync {
                path: p("a"),
                begun: 3,
            },
            write("a", 0, b"VOLATIL"),
        ]);
        assert_eq!(files(&t, 5, Crash::DropUnsynced, 1)["a"], b"durable");
        let seen: std::collections::HashSet<Vec<u8>> = (0..32)
            .map(|s| files(&t, 5, Crash::KeepSome, s)["a"].clone())
            .collect();
        assert_eq!(seen.len(), 2, "both outcomes occur: {seen:?}");
    }

    #[test]
    fn a_sync_covers_only_writes_done_before_it_began() {
        let t = trace(vec![
            Event::Create { path: p("a") },
            Event::SyncDir {
                dir: PathBuf::from("/run"),
                begun: 1,
            },
            write("a", 0, b"one"),
            write("a", 3, b"two"), // completed while the sync below ran
            Event::Sync {
                path: p("a"),
                begun: 3,
            },
        ]);
        for s in 0..8 {
            assert_eq!(&files(&t, 5, Crash::DropUnsynced, s)["a"][..3], b"one");
        }
        assert_eq!(files(&t, 5, Crash::DropUnsynced, 0)["a"].len(), 3);
    }

    #[test]
    fn a_file_whose_directory_was_not_synced_can_vanish() {
        let t = trace(vec![
            Event::Create { path: p("a") },
            write("a", 0, b"x"),
            Event::Sync {
                path: p("a"),
                begun: 2,
            },
        ]);
        assert!(files(&t, 3, Crash::DropUnsynced, 0).is_empty());
        let t2 = trace(vec![
            Event::Create { path: p("tmp") },
            write("tmp", 0, b"new"),
            Event::Sync {
                path: p("tmp"),
                begun: 2,
            },
            Event::Rename {
                from: p("tmp"),
                to: p("a"),
            },
            Event::SyncDir {
                dir: PathBuf::from("/run"),
                begun: 4,
            },
        ]);
        let f = files(&t2, 5, Crash::DropUnsynced, 0);
        assert_eq!(f.keys().collect::<Vec<_>>(), ["a"]);
        assert_eq!(f["a"], b"new");
        // before the directory sync, the rename (and the creation) may both be lost
        assert!(files(&t2, 4, Crash::DropUnsynced, 0).is_empty());
    }

    #[test]
    fn a_torn_write_keeps_whole_sectors() {
        let data: Vec<u8> = (0..4096).map(|i| (i / 512 + 1) as u8).collect();
        let t = trace(vec![
            Event::Create { path: p("a") },
            Event::SyncDir {
                dir: PathBuf::from("/run"),
                begun: 1,
            },
            Event::SetLen {
                path: p("a"),
                len: 4096,
            },
            Event::Sync {
                path: p("a"),
                begun: 3,
            },
            write("a", 0, &data),
        ]);
        let mut mixed = false;
        for s in 0..16 {
            let f = &files(&t, 5, Crash::Tear, s)["a"];
            for (j, sector) in f.chunks(512).enumerate() {
                let v = sector[0];
                assert!(v == 0 || v == j as u8 + 1, "sector {j} holds {v}");
                assert!(sector.iter().all(|&b| b == v), "a sector is whole");
            }
            mixed |= f.chunks(512).any(|s| s[0] == 0) && f.chunks(512).any(|s| s[0] != 0);
        }
        assert!(mixed, "some crash tore the write");
    }

    #[test]
    fn a_saved_trace_loads_the_same() {
        let t = trace(vec![
            Event::Create { path: p("a") },
            write("a", 9, b"abc"),
            Event::SetLen {
                path: p("a"),
                len: 77,
            },
            Event::Sync {
                path: p("a"),
                begun: 2,
            },
            Event::Rename {
                from: p("a"),
                to: p("b"),
            },
            Event::Remove { path: p("b") },
            Event::SyncDir {
                dir: PathBuf::from("/run"),
                begun: 6,
            },
            Event::Mark { tag: 42 },
        ]);
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("trace");
        t.save(&f).unwrap();
        assert_eq!(Trace::load(&f).unwrap().events, t.events);
        assert_eq!(t.last_mark(8), Some(42));
    }
}
