//! Fixed 64-byte messages.
//!
//! ```text
//!  0      kind         u8   (0 is invalid: an empty slot is all zeros)
//!  1      from_node    u8
//!  2..4   from_worker  u16  (the sender's worker, or handler, index)
//!  4..8   seq          u32  (a reply echoes its request's seq)
//!  8..63  body         55 bytes, owned by the protocol
//! 63      flag         FULL (0xA5) once the message is complete; written last
//! ```
//!
//! [`Envelope::from_bytes`] validates the frame (flag, kind, node range); a protocol's
//! [`Message::decode`] validates the body (unknown kinds and impossible fields are errors).

use crate::error::MsgError;
use byteorder::{ByteOrder, LittleEndian};

/// Bytes of a message.
pub const MSG_BYTES: usize = 64;
/// Bytes of a message body.
pub const BODY_BYTES: usize = 55;
/// Value of the last byte of a complete message.
pub const FULL: u8 = 0xA5;

/// A message with its routing header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Envelope {
    pub kind: u8,
    pub from_node: u8,
    pub from_worker: u16,
    pub seq: u32,
    pub body: [u8; BODY_BYTES],
}

impl Envelope {
    /// Wrap a typed message.
    pub fn new<M: Message>(m: &M, from_node: u8, from_worker: u16, seq: u32) -> Envelope {
        let mut body = [0u8; BODY_BYTES];
        m.encode(&mut body);
        Envelope {
            kind: m.kind(),
            from_node,
            from_worker,
            seq,
            body,
        }
    }

    /// Wrap a typed message whose header its channel fills in when it sends it (sender, the
    /// channel's flags, the position in the stream).
    pub fn of<M: Message>(m: &M) -> Envelope {
        Envelope::new(m, 0, 0, 0)
    }

    /// The wire image, flag set.
    pub fn to_bytes(&self) -> [u8; MSG_BYTES] {
        let mut b = [0u8; MSG_BYTES];
        b[0] = self.kind;
        b[1] = self.from_node;
        b[2..4].copy_from_slice(&self.from_worker.to_le_bytes());
        b[4..8].copy_from_slice(&self.seq.to_le_bytes());
        b[8..63].copy_from_slice(&self.body);
        b[63] = FULL;
        b
    }

    /// Parse a wire image; `nodes` bounds `from_node`.
    pub fn from_bytes(b: &[u8; MSG_BYTES], nodes: u8) -> Result<Envelope, MsgError> {
        if b[63] != FULL {
            return Err(MsgError::Decode(format!(
                "flag byte {:#04x} is not FULL",
                b[63]
            )));
        }
        if b[0] == 0 {
            return Err(MsgError::Decode("message kind 0".into()));
        }
        if b[1] >= nodes {
            return Err(MsgError::Decode(format!(
                "sender node {} outside the cluster of {nodes}",
                b[1]
            )));
        }
        Ok(Envelope {
            kind: b[0],
            from_node: b[1],
            from_worker: u16::from_le_bytes([b[2], b[3]]),
            seq: LittleEndian::read_u32(&b[4..]),
            body: b[8..63].try_into().expect("55 bytes"),
        })
    }

    /// Decode the body as protocol `M`.
    pub fn decode<M: Message>(&self) -> Result<M, MsgError> {
        M::decode(self.kind, &self.body)
    }
}

/// A protocol's typed messages.
pub trait Message: Sized {
    /// The kind byte (non-zero).
    fn kind(&self) -> u8;
    fn encode(&self, body: &mut [u8; BODY_BYTES]);
    /// Parse a body; unknown kinds and impossible fields are errors.
    fn decode(kind: u8, body: &[u8; BODY_BYTES]) -> Result<Self, MsgError>;
}

/// A small protocol used by the messaging tests and benchmarks: echo with a payload, and page
/// fetches that push a 4 KiB page into a frame of the requester.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Echo {
    /// Echo `data[..len]` back (len <= 46).
    Ping {
        n: u64,
        len: u8,
        data: [u8; 46],
    },
    Pong {
        n: u64,
        len: u8,
        data: [u8; 46],
    },
    /// Push page `page` into the requester's frame `frame`.
    FetchPage {
        page: u64,
        frame: u32,
    },
    /// The page is in the frame (pushed before this reply).
    PagePushed {
        page: u64,
        frame: u32,
    },
    /// The request could not be served.
    Refused {
        code: u32,
    },
}

impl Message for Echo {
    fn kind(&self) -> u8 {
        match self {
            Echo::Ping { .. } => 1,
            Echo::Pong { .. } => 2,
            Echo::FetchPage { .. } => 3,
            Echo::PagePushed { .. } => 4,
            Echo::Refused { .. } => 5,
        }
    }

    fn encode(&self, b: &mut [u8; BODY_BYTES]) {
        match *self {
            Echo::Ping { n, len, data } | Echo::Pong { n, len, data } => {
                b[0..8].copy_from_slice(&n.to_le_bytes());
                b[8] = len;
                b[9..55].copy_from_slice(&data);
            }
            Echo::FetchPage { page, frame } | Echo::PagePushed { page, frame } => {
                b[0..8].copy_from_slice(&page.to_le_bytes());
                b[8..12].copy_from_slice(&frame.to_le_bytes());
            }
            Echo::Refused { code } => b[0..4].copy_from_slice(&code.to_le_bytes()),
        }
    }

    fn decode(kind: u8, b: &[u8; BODY_BYTES]) -> Result<Self, MsgError> {
        let u64_at = |o: usize| LittleEndian::read_u64(&b[o..]);
        let u32_at = |o: usize| LittleEndian::read_u32(&b[o..]);
        Ok(match kind {
            1 | 2 => {
                let len = b[8];
                if len > 46 {
                    return Err(MsgError::Decode(format!("echo payload length {len} > 46")));
                }
                let (n, data) = (u64_at(0), b[9..55].try_into().expect("46 bytes"));
                if kind == 1 {
                    Echo::Ping { n, len, data }
                } else {
                    Echo::Pong { n, len, data }
                }
            }
            3 => Echo::FetchPage {
                page: u64_at(0),
                frame: u32_at(8),
            },
            4 => Echo::PagePushed {
                page: u64_at(0),
                frame: u32_at(8),
            },
            5 => Echo::Refused { code: u32_at(0) },
            k => return Err(MsgError::Decode(format!("unknown message kind {k}"))),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrip_and_validation() {
        let m = Echo::FetchPage { page: 7, frame: 3 };
        let e = Envelope::new(&m, 2, 9, 77);
        let b = e.to_bytes();
        let back = Envelope::from_bytes(&b, 4).unwrap();
        assert_eq!(back, e);
        assert_eq!(back.decode::<Echo>().unwrap(), m);
        assert!(
            Envelope::from_bytes(&b, 2).is_err(),
            "sender outside the cluster"
        );
        let mut torn = b;
        torn[63] = 0;
        assert!(Envelope::from_bytes(&torn, 4).is_err(), "no flag");
        let mut bad = b;
        bad[0] = 99;
        let e = Envelope::from_bytes(&bad, 4).unwrap();
        assert!(e.decode::<Echo>().is_err(), "unknown kind");
        let mut ping = Envelope::new(
            &Echo::Ping {
                n: 1,
                len: 3,
                data: [0; 46],
            },
            0,
            0,
            0,
        );
        ping.body[8] = 200;
        assert!(ping.decode::<Echo>().is_err(), "impossible length");
    }

    #[test]
    fn random_bytes_never_panic() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::SmallRng::seed_from_u64(5);
        for _ in 0..100_000 {
            let mut b = [0u8; MSG_BYTES];
            rng.fill(&mut b[..]);
            if rng.random_bool(0.5) {
                b[63] = FULL;
            }
            if let Ok(e) = Envelope::from_bytes(&b, 64) {
                let _ = e.decode::<Echo>();
            }
        }
    }
}
