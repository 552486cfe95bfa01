//! Sealed frames: the optional encryption of a `tcp` stream (`encrypt = true` in the cluster
//! file; docs/cluster.md, Security).
//!
//! **Keys.** The handshake already proves that both ends know the cluster secret, over both
//! hellos and two fresh nonces (the *transcript*). Each end then derives the same two 256-bit
//! keys with HKDF-SHA256 (RFC 5869): input key material the cluster secret, salt the
//! transcript, one key per direction (`info` names it). The nonces make every connection's keys
//! new, so a frame recorded on one connection means nothing on another.
//!
//! **Frames.** Each frame of the plain protocol (`offset | len | reserved | bytes`) is sealed
//! with AES-256-GCM (NIST SP 800-38D; RustCrypto's `aes-gcm`, which uses the AES-NI and
//! carry-less multiply instructions where the CPU has them and a constant-time software
//! fallback elsewhere) and sent as `sealed_len u32 | ciphertext | tag 16`, where
//! `sealed_len` (ciphertext plus tag) travels in clear as associated data, so it is
//! authenticated too. The AEAD nonce is a per-direction frame counter: TCP delivers in order,
//! so the receiver knows which counter the next frame must carry, and a frame that was
//! altered, dropped, replayed, reordered or injected fails authentication and closes the
//! connection before any byte of it is applied.
//!
//! **Not given**: forward secrecy (anyone who later learns the cluster secret and recorded the
//! traffic can derive the keys: there is no Diffie-Hellman exchange), and hiding frame sizes
//! and timing.

use aes_gcm::aead::consts::U12;
use aes_gcm::aead::{AeadInPlace, KeyInit};
use aes_gcm::{Aes256Gcm, Key, Nonce, Tag};

/// Bytes of the authentication tag appended to every sealed frame.
pub(crate) const TAG: usize = 16;
/// Bytes of the clear length in front of every sealed frame.
pub(crate) const LEN: usize = 4;

const DIALER_TO_ACCEPTOR: &[u8] = b"shoal tcp frames: dialer to acceptor";
const ACCEPTOR_TO_DIALER: &[u8] = b"shoal tcp frames: acceptor to dialer";

/// Everything both ends of a handshake saw: the dialer's hello and nonce, then the acceptor's.
#[derive(Clone)]
pub(crate) struct Transcript(pub Vec<u8>);

/// One end's keys for a connection: seal what it sends, open what it receives.
pub(crate) struct Keys {
    pub send: Sealer,
    pub recv: Opener,
}

/// Derive one end's keys (`dialer`: this end dialed the connection) from the cluster secret
/// and the handshake transcript.
pub(crate) fn keys(secret: &[u8], transcript: &Transcript, dialer: bool) -> Keys {
    assert!(!secret.is_empty(), "sealed frames need a cluster secret");
    let hk = hkdf::Hkdf::<sha2::Sha256>::new(Some(&transcript.0), secret);
    let key = |info: &[u8]| {
        let mut k = [0u8; 32];
        hk.expand(info, &mut k)
            .expect("32 bytes is a valid HKDF-SHA256 output length");
        Aes256Gcm::new(Key::<Aes256Gcm>::from_slice(&k))
    };
    let (send, recv) = if dialer {
        (DIALER_TO_ACCEPTOR, ACCEPTOR_TO_DIALER)
    } else {
        (ACCEPTOR_TO_DIALER, DIALER_TO_ACCEPTOR)
    };
    Keys {
        send: Sealer {
            aead: key(send),
            next: 0,
        },
        recv: Opener {
            aead: key(recv),
            next: 0,
        },
    }
}

fn nonce(counter: u64) -> Nonce<U12> {
    let mut n = [0u8; 12];
    n[4..].copy_from_slice(&counter.to_le_bytes());
    *Nonce::from_slice(&n)
}

/// Seals the frames one end sends on one connection, in order.
pub(crate) struct Sealer {
    aead: Aes256Gcm,
    next: u64,
}

impl Sealer {
    /// Seal `frame` in place: `frame[..LEN]` is a placeholder for the sealed length, the rest
    /// the plain frame. Afterwards `frame` is the sealed frame, ready to send.
    #[cfg(test)]
    pub(crate) fn seal(&mut self, frame: &mut Vec<u8>) {
        self.seal_at(frame, 0);
    }

    /// Seal the frame that begins at `start` of `buf` and runs to its end, in place (as
    /// [`Sealer::seal`]); the bytes before `start` (frames sealed before) are left alone.
    pub(crate) fn seal_at(&mut self, buf: &mut Vec<u8>, start: usize) {
        assert!(buf.len() > start + LEN, "a frame has a header");
        let sealed_len = u32::try_from(buf.len() - start - LEN + TAG).expect("frames are small");
        let len = sealed_len.to_le_bytes();
        buf[start..start + LEN].copy_from_slice(&len);
        let counter = self.next;
        // A counter is never reused with a key: at 10^9 frames per second it lasts 584 years.
        self.next = counter.checked_add(1).expect("frame counter exhausted");
        let tag = self
            .aead
            .encrypt_in_place_detached(&nonce(counter), &len, &mut buf[start + LEN..])
            .expect("AES-GCM seals any frame below 64 GiB");
        buf.extend_from_slice(&tag);
    }
}

/// Opens the frames one end receives on one connection, in order.
pub(crate) struct Opener {
    aead: Aes256Gcm,
    next: u64,
}

impl Opener {
    /// Open a sealed frame whose clear length bytes were `len` and whose ciphertext and tag
    /// are `body` (`sealed_len` bytes). On success `body[..body.len() - TAG]` holds the plain
    /// frame. Fails if the frame is not the next one this end's peer sealed, unaltered.
    pub(crate) fn open(&mut self, len: [u8; LEN], body: &mut [u8]) -> Result<(), ()> {
        if body.len() < TAG || u32::from_le_bytes(len) as usize != body.len() {
            return Err(());
        }
        let (text, tag) = body.split_at_mut(body.len() - TAG);
        self.aead
            .decrypt_in_place_detached(&nonce(self.next), &len, text, Tag::from_slice(tag))
            .map_err(|_| ())?;
        self.next += 1;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair(secret: &[u8], t: &[u8]) -> (Keys, Keys) {
        let t = Transcript(t.to_vec());
        (keys(secret, &t, true), keys(secret, &t, false))
    }

    fn sealed(s: &mut Sealer, plain: &[u8]) -> Vec<u8> {
        let mut f = vec![0u8; LEN];
        f.extend_from_slice(plain);
        s.seal(&mut f);
        f
    }

    fn open(o: &mut Opener, f: &[u8]) -> Result<Vec<u8>, ()> {
        let len: [u8; LEN] = f[..LEN].try_into().unwrap();
        let mut body = f[LEN..].to_vec();
        o.open(len, &mut body)?;
        body.truncate(body.len() - TAG);
        Ok(body)
    }

    #[test]
    fn frames_open_in_order_in_both_directions_and_hide_their_bytes() {
        let (mut d, mut a) = pair(b"a cluster secret of 32 bytes....", b"transcript");
        for i in 0..3u8 {
            let plain = vec![i; 100];
            let f = sealed(&mut d.send, &plain);
            assert_eq!(f.len(), LEN + 100 + TAG);
            assert!(!f.windows(16).any(|w| w == &plain[..16]), "sent in clear");
            assert_eq!(open(&mut a.recv, &f).unwrap(), plain);
            let back = sealed(&mut a.send, &plain);
            assert_ne!(back, f, "each direction has its own key");
            assert_eq!(open(&mut d.recv, &back).unwrap(), plain);
        }
    }

    #[test]
    fn altered_replayed_reordered_or_foreign_frames_fail() {
        let secret = b"a cluster secret of 32 bytes....";
        let (mut d, mut a) = pair(secret, b"transcript");
        let f0 = sealed(&mut d.send, b"first frame");
        let f1 = sealed(&mut d.send, b"second frame");
        // reordered: the second frame before the first
        assert!(open(&mut a.recv, &f1).is_err());
        // altered: one bit of the ciphertext, of the tag, of the clear length
        for at in [LEN + 3, f0.len() - 1, 0] {
            let mut bad = f0.clone();
            bad[at] ^= 1;
            assert!(open(&mut a.recv, &bad).is_err(), "bit at {at}");
        }
        assert_eq!(open(&mut a.recv, &f0).unwrap(), b"first frame");
        // replayed
        assert!(open(&mut a.recv, &f0).is_err());
        assert_eq!(open(&mut a.recv, &f1).unwrap(), b"second frame");
        // another connection (other nonces) or another secret cannot open them
        let (mut d2, mut a2) = pair(secret, b"another transcript");
        assert!(open(&mut a2.recv, &f0).is_err());
        let (_, mut a3) = pair(b"another secret of 32 bytes......", b"transcript");
        assert!(open(&mut a3.recv, &f0).is_err());
        // a frame of the other connection works there
        let g = sealed(&mut d2.send, b"x");
        assert_eq!(open(&mut a2.recv, &g).unwrap(), b"x");
    }
}
