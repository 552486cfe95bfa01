//! Shared by the messaging tests: an echo/page server and a page pattern.
#![allow(dead_code)]

use shoal_messaging::{Echo, Envelope, Mailboxes, Responder, Transport, BODY_BYTES, PAGE_BYTES};
use std::time::Duration;

/// The page a node serves for page number `page`: every byte derived from (node, page).
pub fn page_image(node: u8, page: u64) -> Box<[u8; PAGE_BYTES]> {
    let mut b = Box::new([0u8; PAGE_BYTES]);
    let mut x = (page ^ 0x9E37_79B9_7F4A_7C15).wrapping_mul(node as u64 + 3);
    for chunk in b.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        chunk.copy_from_slice(&x.to_le_bytes());
    }
    b
}

/// Serve `Echo`: pings are echoed, page fetches push `page_image` into the requester's frame.
pub fn serve<T: Transport>(node: u8, env: &Envelope, r: &mut Responder<'_, T>) -> Envelope {
    let reply = |m: &Echo| Envelope::new(m, 0, 0, 0);
    match env.decode::<Echo>() {
        Ok(Echo::Ping { n, len, data }) => reply(&Echo::Pong { n, len, data }),
        Ok(Echo::FetchPage { page, frame }) => match r.push_page(frame, &page_image(node, page)) {
            Ok(()) => reply(&Echo::PagePushed { page, frame }),
            Err(_) => reply(&Echo::Refused { code: 2 }),
        },
        _ => reply(&Echo::Refused { code: 1 }),
    }
}

/// Ask `peer` to push page `n` into our frame `frame`, then check the frame holds exactly
/// `page_image(peer, n)`.
pub fn fetch_and_verify<T: Transport>(mb: &Mailboxes<T>, w: u16, peer: u8, n: u64, frame: u32) {
    let r = mb
        .call(
            w,
            peer,
            &Echo::FetchPage { page: n, frame },
            Duration::from_secs(10),
        )
        .unwrap();
    assert_eq!(
        r.decode::<Echo>().unwrap(),
        Echo::PagePushed { page: n, frame }
    );
    let mut page = [0u8; PAGE_BYTES];
    mb.read_frame(frame, &mut page).unwrap();
    assert!(page == *page_image(peer, n), "page payload corrupted");
}

/// A test's guard against hanging for ever, not a speed target: `check` fails the test once
/// [`HangGuard::LIMIT`] passed since the guard was made (a machine can be slow; a test that
/// waits a minute for something that takes milliseconds is stuck).
pub struct HangGuard(std::time::Instant);

impl HangGuard {
    pub const LIMIT: Duration = Duration::from_secs(60);

    pub fn start() -> HangGuard {
        HangGuard(std::time::Instant::now())
    }

    /// Fail with `what` if the limit passed.
    pub fn check(&self, what: impl FnOnce() -> String) {
        if self.0.elapsed() >= Self::LIMIT {
            panic!("hang guard ({:?}): {}", Self::LIMIT, what());
        }
    }
}

/// A channel message of a test's own kind (9) whose first body byte is `n` (the channel fills
/// in sender and position).
pub fn numbered(n: u8) -> Envelope {
    let mut body = [0u8; BODY_BYTES];
    body[0] = n;
    Envelope {
        kind: 9,
        from_node: 0,
        from_worker: 0,
        seq: 0,
        body,
    }
}
