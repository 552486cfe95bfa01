//! Unit tests of the wire format: every message round-trips, garbage is refused.

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
                again: false,
            },
        ),
        w(
            3,
            Msg::Request {
                want: Mode::Shared,
                have: false,
                again: true,
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
                source_keeps: false,
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
                source_keeps: false,
            }),
        ),
        w(
            5,
            Msg::Transfer {
                want: Mode::Shared,
                epoch: 4,
                keep: false,
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
        w(
            0,
            Msg::Grant(Grant {
                mode: Mode::Shared,
                epoch: 12,
                data: None,
                source: Some(2),
                invalidate: 0,
                source_keeps: true,
            }),
        ),
        w(
            5,
            Msg::Transfer {
                want: Mode::Shared,
                epoch: 12,
                keep: true,
            },
        ),
        w(
            0,
            Msg::Offer {
                epoch: 1 << 40,
                data: Attached,
            },
        ),
        w(0, Msg::OfferReply { accepted: true }),
        w(9, Msg::Reclaim { epoch: 1 << 41 }),
        w(9, Msg::Gone),
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
        Control::Room { frames: 1 << 33 },
        Control::LogFence { seq: 5 },
        Control::LogFenced { seq: u64::MAX },
        Control::Ping { at: 1 },
        Control::Pong { at: u64::MAX },
        Control::Found { pid: 2 << 56 | 9 },
        Control::FoundAck { pid: 1 },
        Control::Ask { pid: 1 << 56 | 4 },
        Control::Has { pid: 7, holds: 3 },
        Control::Settle { node: 2, seq: 9 },
        Control::Settled {
            node: 63,
            seq: u64::MAX,
            done: 1,
        },
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
    assert!(Control::decode(CONTROL_BASE + 18, &[0u8; BODY_BYTES]).is_err());
    // a census answer that no `Holds` stands for
    let mut b = [0u8; BODY_BYTES];
    Control::Has { pid: 7, holds: 0 }.encode(&mut b);
    b[8] = 4;
    assert!(Control::decode(CONTROL_BASE + 15, &b).is_err());
    // a settle message naming node 64 or above, an answer neither 0 nor 1
    let mut b = [0u8; BODY_BYTES];
    Control::Settle { node: 1, seq: 2 }.encode(&mut b);
    b[0] = 64;
    assert!(Control::decode(CONTROL_BASE + 16, &b).is_err());
    Control::Settled {
        node: 1,
        seq: 2,
        done: 1,
    }
    .encode(&mut b);
    b[9] = 2;
    assert!(Control::decode(CONTROL_BASE + 17, &b).is_err());
    for h in [Holds::Nothing, Holds::Shared, Holds::Exclusive, Holds::Busy] {
        assert_eq!(holds_of(holds_code(h)), Some(h));
    }
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
    // a forwarded grant (source keeps its copy) for exclusive possession, or invalidating
    // (grant: ... invalidation set at 19..27, source_keeps at 27)
    let (k, mut b) = enc(&s[12]);
    b[8] = 1;
    assert!(Wire::decode(k, &b).is_err());
    let (k, mut b) = enc(&s[12]);
    b[20] = 1;
    assert!(Wire::decode(k, &b).is_err());
    let (k, mut b) = enc(&s[12]);
    b[27] = 2;
    assert!(Wire::decode(k, &b).is_err());
    // a transfer keeping the source's copy must be shared (mode at 8, keep at 17)
    let (k, mut b) = enc(&s[13]);
    b[8] = 1;
    assert!(Wire::decode(k, &b).is_err());
    assert!(Wire::decode(k, &enc(&s[13]).1).is_ok());
    // kinds outside the protocol
    for k in [0u8, 1, 15, KIND_BASE + 13, 255] {
        assert!(Wire::decode(k, &[0u8; BODY_BYTES]).is_err(), "kind {k}");
    }
}

#[test]
fn random_bodies_never_panic_and_decode_to_reencodable_messages() {
    let mut rng = rand::rngs::SmallRng::seed_from_u64(5);
    let mut ok = 0;
    for i in 0..200_000u32 {
        let kind = KIND_BASE + (i % 12) as u8;
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
