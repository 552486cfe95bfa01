//! Wire format of the coherence messages: a [`Msg`] about one page in one 64-byte channel
//! message (shoal-messaging's [`shoal_messaging::Envelope`] body of 55 bytes).
//!
//! A message that carries a page travels with the page as the channel's attachment; the
//! message itself only says that it has one ([`Attached`]). The sender's protocol data (its
//! frame index) and the receiver's (the bytes that arrived) are both mapped from and to that
//! with [`Msg::map_data`]: one message type on the wire, no placeholder fields.
//!
//! Body layout (little endian): `pid u64 | fields of the kind`, every byte a kind does not use
//! must be zero. Decoding rejects unknown kinds, modes and flags other than 0 or 1, node ids
//! of 64 and above, and non-zero padding, so a corrupt or foreign message is an error, never a
//! wrong protocol action.

use crate::coherence::protocol::{Grant, Mode, Msg, Node, NodeSet};
use shoal_messaging::{Message, MsgError, BODY_BYTES, PAGE_BYTES};

/// The page of a message travels as the channel's attachment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Attached;

/// First message kind of the coherence protocol (kinds below belong to other protocols).
pub const KIND_BASE: u8 = 16;
const NO_NODE: u8 = 0xFF;

/// One coherence message as it travels.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Wire {
    /// The page (raw page id).
    pub pid: u64,
    pub msg: Msg<Attached>,
}

impl Wire {
    /// The wire form of `msg` about page `pid` (whatever its page is, it travels attached).
    pub fn new<D: Clone>(pid: u64, msg: &Msg<D>) -> Wire {
        Wire {
            pid,
            msg: msg.clone().map_data(|_| Attached),
        }
    }
}

fn kind_of(m: &Msg<Attached>) -> u8 {
    KIND_BASE
        + match m {
            Msg::Request { .. } => 0,
            Msg::Grant(_) => 1,
            Msg::Transfer { .. } => 2,
            Msg::Page { .. } => 3,
            Msg::CopyBack { .. } => 4,
            Msg::Invalidate { .. } => 5,
            Msg::InvalidateAck => 6,
            Msg::Evict { .. } => 7,
            Msg::EvictReply { .. } => 8,
        }
}

fn mode_byte(m: Mode) -> u8 {
    match m {
        Mode::Shared => 0,
        Mode::Exclusive => 1,
    }
}

/// Writes fields after the 12-byte header.
struct W<'a> {
    b: &'a mut [u8; BODY_BYTES],
    at: usize,
}

impl W<'_> {
    fn u8(&mut self, v: u8) -> &mut Self {
        self.b[self.at] = v;
        self.at += 1;
        self
    }
    fn u32(&mut self, v: u32) -> &mut Self {
        self.b[self.at..self.at + 4].copy_from_slice(&v.to_le_bytes());
        self.at += 4;
        self
    }
    fn u64(&mut self, v: u64) -> &mut Self {
        self.b[self.at..self.at + 8].copy_from_slice(&v.to_le_bytes());
        self.at += 8;
        self
    }
    fn opt_page(&mut self, p: Option<Attached>) -> &mut Self {
        self.u8(p.is_some() as u8)
    }
}

/// Reads fields after the 12-byte header, validating as it goes.
struct R<'a> {
    b: &'a [u8; BODY_BYTES],
    at: usize,
}

fn bad(what: String) -> MsgError {
    MsgError::Decode(what)
}

impl R<'_> {
    fn u8(&mut self) -> u8 {
        let v = self.b[self.at];
        self.at += 1;
        v
    }
    fn u32(&mut self) -> u32 {
        let mut w = [0u8; 4];
        w.copy_from_slice(&self.b[self.at..self.at + 4]);
        self.at += 4;
        u32::from_le_bytes(w)
    }
    fn u64(&mut self) -> u64 {
        let mut w = [0u8; 8];
        w.copy_from_slice(&self.b[self.at..self.at + 8]);
        self.at += 8;
        u64::from_le_bytes(w)
    }
    fn flag(&mut self, what: &str) -> Result<bool, MsgError> {
        match self.u8() {
            0 => Ok(false),
            1 => Ok(true),
            v => Err(bad(format!("{what} flag is {v}, not 0 or 1"))),
        }
    }
    fn mode(&mut self) -> Result<Mode, MsgError> {
        match self.u8() {
            0 => Ok(Mode::Shared),
            1 => Ok(Mode::Exclusive),
            v => Err(bad(format!("possession mode {v} does not exist"))),
        }
    }
    fn opt_page(&mut self) -> Result<Option<Attached>, MsgError> {
        Ok(self.flag("page")?.then_some(Attached))
    }
    fn node(&mut self) -> Result<Option<Node>, MsgError> {
        match self.u8() {
            NO_NODE => Ok(None),
            n if n < 64 => Ok(Some(n)),
            n => Err(bad(format!("node id {n} is not below 64"))),
        }
    }
    /// Everything after the fields must be zero.
    fn end(&self) -> Result<(), MsgError> {
        match self.b[self.at..].iter().position(|&x| x != 0) {
            None => Ok(()),
            Some(i) => Err(bad(format!(
                "non-zero padding at body byte {}",
                self.at + i
            ))),
        }
    }
}

impl Message for Wire {
    fn kind(&self) -> u8 {
        kind_of(&self.msg)
    }

    fn encode(&self, b: &mut [u8; BODY_BYTES]) {
        b.fill(0);
        let mut w = W { b, at: 0 };
        w.u64(self.pid);
        match &self.msg {
            Msg::Request { want, have } => {
                w.u8(mode_byte(*want)).u8(*have as u8);
            }
            Msg::Grant(g) => {
                w.u8(mode_byte(g.mode))
                    .u64(g.epoch)
                    .opt_page(g.data)
                    .u8(g.source.unwrap_or(NO_NODE))
                    .u64(g.invalidate);
            }
            Msg::Transfer { want, epoch } => {
                w.u8(mode_byte(*want)).u64(*epoch);
            }
            Msg::Page {
                data: Attached,
                dirty,
            } => {
                w.u8(*dirty as u8);
            }
            Msg::CopyBack { data } => {
                w.opt_page(*data);
            }
            Msg::Invalidate { epoch } => {
                w.u64(*epoch);
            }
            Msg::InvalidateAck => {}
            Msg::Evict { epoch, data } => {
                w.u64(*epoch).opt_page(*data);
            }
            Msg::EvictReply { accepted } => {
                w.u8(*accepted as u8);
            }
        }
    }

    fn decode(kind: u8, b: &[u8; BODY_BYTES]) -> Result<Self, MsgError> {
        let mut r = R { b, at: 0 };
        let pid = r.u64();
        let k = kind.checked_sub(KIND_BASE).unwrap_or(u8::MAX);
        let msg = match k {
            0 => Msg::Request {
                want: r.mode()?,
                have: r.flag("have")?,
            },
            1 => {
                let mode = r.mode()?;
                let epoch = r.u64();
                let data = r.opt_page()?;
                let source = r.node()?;
                let invalidate: NodeSet = r.u64();
                if source.is_some_and(|s| invalidate & (1u64 << s) != 0) {
                    return Err(bad(
                        "a grant's source is also in its invalidation set".into()
                    ));
                }
                Msg::Grant(Grant {
                    mode,
                    epoch,
                    data,
                    source,
                    invalidate,
                })
            }
            2 => Msg::Transfer {
                want: r.mode()?,
                epoch: r.u64(),
            },
            3 => Msg::Page {
                data: Attached,
                dirty: r.flag("dirty")?,
            },
            4 => Msg::CopyBack {
                data: r.opt_page()?,
            },
            5 => Msg::Invalidate { epoch: r.u64() },
            6 => Msg::InvalidateAck,
            7 => Msg::Evict {
                epoch: r.u64(),
                data: r.opt_page()?,
            },
            8 => Msg::EvictReply {
                accepted: r.flag("accepted")?,
            },
            _ => {
                return Err(bad(format!(
                    "message kind {kind} is not a coherence message"
                )))
            }
        };
        r.end()?;
        Ok(Wire { pid, msg })
    }
}

/// First message kind of the control messages (kinds below belong to the coherence protocol).
pub const CONTROL_BASE: u8 = 32;
/// [`Control::Refuse`] code: the page does not exist.
pub const REFUSE_NO_PAGE: u8 = 1;
/// [`Control::Refuse`] code: the home could not read the page from its store.
pub const REFUSE_READ: u8 = 2;
/// [`Control::Refuse`] code: the page's holder (or a node that must hand it over or drop a
/// copy) is unreachable; `node` names it.
pub const REFUSE_HOLDER_DEAD: u8 = 3;

/// Messages beside the protocol's own: answers that end a request without a grant, the
/// cluster barrier, and allocation on another node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Control {
    /// Home -> requester: the request for `pid` is refused (`code`: [`REFUSE_NO_PAGE`],
    /// [`REFUSE_READ`], [`REFUSE_HOLDER_DEAD`] with the dead `node`); the home recorded nothing.
    Refuse { pid: u64, code: u8, node: u8 },
    /// The sender reached barrier number `generation` (see `Engine::barrier`).
    Arrive { generation: u64 },
    /// Please allocate a page homed on the receiver; answer with [`Control::Allocated`]
    /// carrying the same `request` number.
    Alloc { request: u64 },
    /// Answer to [`Control::Alloc`]: the new page (zeroed, resident at its home), or
    /// [`Pid::NONE`](crate::pid::Pid::NONE)'s raw value when the store is full or failed.
    Allocated { request: u64, pid: u64 },
    /// To the home: the only current copy of `pid` was at `node`, which died before handing
    /// it over; the home refuses every later request for the page.
    Lost { pid: u64, node: u8 },
    /// Several small coherence messages of the sender, in the order it sent them, packed into
    /// the attached page ([`encode_batch`]): eviction notices without a page and eviction
    /// replies. The receiver applies them as if they had arrived one by one, in that order.
    Batch { count: u16 },
    /// Requester -> home: the page [`Control::Allocated`] named came after the requester had
    /// given up waiting (its allocation failed with a timeout), so nobody knows its pid: the
    /// home frees it if it handed it out to the sender and no node ever asked for it.
    Unused { pid: u64 },
}

impl Message for Control {
    fn kind(&self) -> u8 {
        match self {
            Control::Refuse { .. } => CONTROL_BASE,
            Control::Arrive { .. } => CONTROL_BASE + 1,
            Control::Alloc { .. } => CONTROL_BASE + 2,
            Control::Allocated { .. } => CONTROL_BASE + 3,
            Control::Lost { .. } => CONTROL_BASE + 4,
            Control::Batch { .. } => CONTROL_BASE + 5,
            Control::Unused { .. } => CONTROL_BASE + 6,
        }
    }

    fn encode(&self, b: &mut [u8; BODY_BYTES]) {
        b.fill(0);
        let mut w = W { b, at: 0 };
        match self {
            Control::Refuse { pid, code, node } => {
                w.u64(*pid).u8(*code).u8(*node);
            }
            Control::Arrive { generation } => {
                w.u64(*generation);
            }
            Control::Alloc { request } => {
                w.u64(*request);
            }
            Control::Allocated { request, pid } => {
                w.u64(*request).u64(*pid);
            }
            Control::Lost { pid, node } => {
                w.u64(*pid).u8(*node);
            }
            Control::Batch { count } => {
                w.u32(*count as u32);
            }
            Control::Unused { pid } => {
                w.u64(*pid);
            }
        }
    }

    fn decode(kind: u8, b: &[u8; BODY_BYTES]) -> Result<Self, MsgError> {
        let mut r = R { b, at: 0 };
        let c = match kind {
            CONTROL_BASE => {
                let pid = r.u64();
                let code = r.u8();
                let node = r.u8();
                if !matches!(code, REFUSE_NO_PAGE | REFUSE_READ | REFUSE_HOLDER_DEAD) {
                    return Err(bad(format!("refusal code {code} does not exist")));
                }
                if node as usize >= crate::pid::MAX_NODES {
                    return Err(bad(format!("refusal names node {node}")));
                }
                Control::Refuse { pid, code, node }
            }
            k if k == CONTROL_BASE + 1 => Control::Arrive {
                generation: r.u64(),
            },
            k if k == CONTROL_BASE + 2 => Control::Alloc { request: r.u64() },
            k if k == CONTROL_BASE + 3 => Control::Allocated {
                request: r.u64(),
                pid: r.u64(),
            },
            k if k == CONTROL_BASE + 4 => {
                let pid = r.u64();
                let node = r.u8();
                if node as usize >= crate::pid::MAX_NODES {
                    return Err(bad(format!("lost page names node {node}")));
                }
                Control::Lost { pid, node }
            }
            k if k == CONTROL_BASE + 5 => {
                let count = r.u32();
                if count == 0 || count as usize > BATCH_MAX {
                    return Err(bad(format!(
                        "a batch of {count} messages (1 to {BATCH_MAX} fit)"
                    )));
                }
                Control::Batch {
                    count: count as u16,
                }
            }
            k if k == CONTROL_BASE + 6 => Control::Unused { pid: r.u64() },
            k => return Err(bad(format!("message kind {k} is not a control message"))),
        };
        r.end()?;
        Ok(c)
    }
}

/// Bytes of one message in a batch: `pid u64 | tag u8 | epoch u64`.
const BATCH_ENTRY: usize = 17;
/// Most messages one batch carries.
pub const BATCH_MAX: usize = PAGE_BYTES / BATCH_ENTRY;
const TAG_EVICT: u8 = 0;
const TAG_DECLINED: u8 = 1;
const TAG_ACCEPTED: u8 = 2;

/// Messages that may travel in a [`Control::Batch`]: an eviction notice without a page, an
/// eviction reply.
pub fn batchable<D>(m: &Msg<D>) -> bool {
    matches!(m, Msg::Evict { data: None, .. } | Msg::EvictReply { .. })
}

/// Pack `msgs` (each [`batchable`], at most [`BATCH_MAX`]) into a page; unused bytes are zero.
pub fn encode_batch(msgs: &[(u64, Msg<Attached>)]) -> Box<[u8; PAGE_BYTES]> {
    assert!(
        !msgs.is_empty() && msgs.len() <= BATCH_MAX,
        "batch of {}",
        msgs.len()
    );
    let mut page = Box::new([0u8; PAGE_BYTES]);
    for (e, (pid, m)) in page.chunks_exact_mut(BATCH_ENTRY).zip(msgs) {
        let (tag, epoch) = match m {
            Msg::Evict { epoch, data: None } => (TAG_EVICT, *epoch),
            Msg::EvictReply { accepted: false } => (TAG_DECLINED, 0),
            Msg::EvictReply { accepted: true } => (TAG_ACCEPTED, 0),
            other => panic!("{} does not travel in a batch", other.name()),
        };
        e[..8].copy_from_slice(&pid.to_le_bytes());
        e[8] = tag;
        e[9..].copy_from_slice(&epoch.to_le_bytes());
    }
    page
}

/// Unpack a batch of `count` messages; unknown tags, an epoch on a reply and bytes after the
/// last message that are not zero are errors (nothing of a bad batch is applied).
pub fn decode_batch(
    count: u16,
    page: &[u8; PAGE_BYTES],
) -> Result<Vec<(u64, Msg<Attached>)>, MsgError> {
    let count = count as usize;
    if count == 0 || count > BATCH_MAX {
        return Err(bad(format!("a batch of {count} messages")));
    }
    let (used, rest) = page.split_at(count * BATCH_ENTRY);
    if rest.iter().any(|&b| b != 0) {
        return Err(bad("bytes after a batch's last message".into()));
    }
    used.chunks_exact(BATCH_ENTRY)
        .enumerate()
        .map(|(i, e)| {
            let pid = u64::from_le_bytes(e[..8].try_into().expect("8 bytes"));
            let epoch = u64::from_le_bytes(e[9..].try_into().expect("8 bytes"));
            let m = match (e[8], epoch) {
                (TAG_EVICT, epoch) => Msg::Evict { epoch, data: None },
                (TAG_DECLINED, 0) => Msg::EvictReply { accepted: false },
                (TAG_ACCEPTED, 0) => Msg::EvictReply { accepted: true },
                (tag, epoch) => {
                    return Err(bad(format!(
                        "batch message {i}: tag {tag} with epoch {epoch}"
                    )))
                }
            };
            Ok((pid, m))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use shoal_messaging::Envelope;

    fn samples() -> Vec<Wire> {
        let w = |_: u32, msg| Wire {
            pid: 0x0100_0000_0000_002A,
            msg,
        };
        vec![
            w(
                7,
                Msg::Request {
                    want: Mode::Exclusive,
                    have: true,
                },
            ),
            w(
                3,
                Msg::Request {
                    want: Mode::Shared,
                    have: false,
                },
            ),
            w(
                0,
                Msg::Grant(Grant {
                    mode: Mode::Exclusive,
                    epoch: 99,
                    data: None,
                    source: Some(3),
                    invalidate: 0,
                }),
            ),
            w(
                0,
                Msg::Grant(Grant {
                    mode: Mode::Exclusive,
                    epoch: u64::MAX - 1, // above 32 bits: epochs travel whole
                    data: Some(Attached),
                    source: None,
                    invalidate: (1 << 63) | 0b1010,
                }),
            ),
            w(
                5,
                Msg::Transfer {
                    want: Mode::Shared,
                    epoch: 4,
                },
            ),
            w(
                0,
                Msg::Page {
                    data: Attached,
                    dirty: true,
                },
            ),
            w(0, Msg::CopyBack { data: None }),
            w(
                0,
                Msg::CopyBack {
                    data: Some(Attached),
                },
            ),
            w(0, Msg::Invalidate { epoch: 8 }),
            w(0, Msg::InvalidateAck),
            w(
                0,
                Msg::Evict {
                    epoch: 2,
                    data: Some(Attached),
                },
            ),
            w(0, Msg::EvictReply { accepted: false }),
        ]
    }

    #[test]
    fn every_message_round_trips_through_an_envelope() {
        for m in samples() {
            let env = Envelope::new(&m, 2, 5, 11);
            let back = Envelope::from_bytes(&env.to_bytes(), 4).unwrap();
            assert_eq!(back.decode::<Wire>().unwrap(), m);
        }
    }

    #[test]
    fn control_messages_round_trip_and_reject_garbage() {
        let all = [
            Control::Refuse {
                pid: 5,
                code: REFUSE_READ,
                node: 0,
            },
            Control::Refuse {
                pid: 6,
                code: REFUSE_HOLDER_DEAD,
                node: 63,
            },
            Control::Arrive { generation: 3 },
            Control::Alloc { request: u64::MAX },
            Control::Allocated {
                request: 9,
                pid: 77,
            },
            Control::Unused { pid: 1 << 56 | 3 },
        ];
        for c in all {
            let env = Envelope::new(&c, 1, 0, 0);
            let back = Envelope::from_bytes(&env.to_bytes(), 4).unwrap();
            assert_eq!(back.decode::<Control>().unwrap(), c);
            // trailing garbage after the fields is refused
            let mut b = [0u8; BODY_BYTES];
            c.encode(&mut b);
            b[BODY_BYTES - 1] = 1;
            assert!(Control::decode(c.kind(), &b).is_err(), "{c:?}");
        }
        assert!(Control::decode(CONTROL_BASE + 7, &[0u8; BODY_BYTES]).is_err());
        // a batch of no messages, or of more than a page holds
        for count in [0u32, BATCH_MAX as u32 + 1] {
            let mut b = [0u8; BODY_BYTES];
            b[..4].copy_from_slice(&count.to_le_bytes());
            assert!(Control::decode(CONTROL_BASE + 5, &b).is_err(), "{count}");
        }
    }

    #[test]
    fn batches_round_trip_and_reject_garbage() {
        let msgs: Vec<(u64, Msg<Attached>)> = (0..BATCH_MAX as u64)
            .map(|i| {
                let m = match i % 3 {
                    0 => Msg::Evict {
                        epoch: i * 7 + (1 << 40),
                        data: None,
                    },
                    1 => Msg::EvictReply { accepted: true },
                    _ => Msg::EvictReply { accepted: false },
                };
                (i << 20 | 3, m)
            })
            .collect();
        for n in [1, 2, BATCH_MAX] {
            let page = encode_batch(&msgs[..n]);
            assert_eq!(decode_batch(n as u16, &page).unwrap(), msgs[..n]);
            // a count short of what was packed leaves bytes after the last message
            if n > 1 {
                assert!(decode_batch(n as u16 - 1, &page).is_err());
            }
        }
        let mut page = encode_batch(&msgs[..2]);
        page[BATCH_ENTRY + 8] = 9; // unknown tag
        assert!(decode_batch(2, &page).is_err());
        let mut page = encode_batch(&msgs[..2]);
        page[BATCH_ENTRY + 9] = 1; // a reply with an epoch
        assert!(decode_batch(2, &page).is_err());
        assert!(decode_batch(0, &page).is_err());
        assert!(decode_batch(BATCH_MAX as u16 + 1, &page).is_err());
        assert!(batchable(&Msg::<Attached>::Evict {
            epoch: 1,
            data: None
        }));
        assert!(!batchable(&Msg::<Attached>::Evict {
            epoch: 1,
            data: Some(Attached)
        }));
        assert!(!batchable(&Msg::<Attached>::InvalidateAck));
    }

    #[test]
    fn impossible_fields_are_errors() {
        let enc = |m: &Wire| {
            let mut b = [0u8; BODY_BYTES];
            m.encode(&mut b);
            (m.kind(), b)
        };
        let s = samples();
        // mode byte 2 (a request: mode at body byte 8, after the pid)
        let (k, mut b) = enc(&s[0]);
        b[8] = 2;
        assert!(Wire::decode(k, &b).is_err());
        // have flag 7
        let (k, mut b) = enc(&s[0]);
        b[9] = 7;
        assert!(Wire::decode(k, &b).is_err());
        // source node 64 (grant: mode at 8, epoch at 9..17, page flag at 17, source at 18)
        let (k, mut b) = enc(&s[2]);
        b[18] = 64;
        assert!(Wire::decode(k, &b).is_err());
        // source also invalidated (invalidation set at 19..27; the source is node 3)
        let (k, mut b) = enc(&s[2]);
        b[19] = 0b1000;
        assert!(Wire::decode(k, &b)
            .unwrap_err()
            .to_string()
            .contains("source"));
        // padding
        let (k, mut b) = enc(&s[9]);
        b[54] = 1;
        assert!(Wire::decode(k, &b)
            .unwrap_err()
            .to_string()
            .contains("padding"));
        // a field on a message that has none
        let (k, mut b) = enc(&s[9]);
        b[8] = 1;
        assert!(Wire::decode(k, &b).is_err());
        // a page flag that is neither 0 nor 1
        let (k, mut b) = enc(&s[6]);
        b[8] = 2;
        assert!(Wire::decode(k, &b).is_err());
        // kinds outside the protocol
        for k in [0u8, 1, 15, KIND_BASE + 9, 255] {
            assert!(Wire::decode(k, &[0u8; BODY_BYTES]).is_err(), "kind {k}");
        }
    }

    #[test]
    fn random_bodies_never_panic_and_decode_to_reencodable_messages() {
        let mut rng = rand::rngs::SmallRng::seed_from_u64(5);
        let mut ok = 0;
        for i in 0..200_000u32 {
            let kind = KIND_BASE + (i % 10) as u8;
            let mut b = [0u8; BODY_BYTES];
            // mostly-zero bodies with a few random bytes reach the valid encodings often
            for _ in 0..rng.random_range(0..6) {
                let at = rng.random_range(0..BODY_BYTES);
                b[at] = rng.random();
            }
            if let Ok(m) = Wire::decode(kind, &b) {
                let mut again = [0u8; BODY_BYTES];
                m.encode(&mut again);
                assert_eq!(again, b, "decode/encode is not the identity for {m:?}");
                ok += 1;
            }
        }
        assert!(ok > 1000, "only {ok} random bodies decoded");
    }
}
