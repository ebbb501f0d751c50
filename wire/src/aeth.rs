//! ACK Extended Transport Header: the responder's verdict on a request
//! (IBTA Vol. 1, 9.3 and 9.7.5; kernel `struct rxe_aeth`, `enum
//! aeth_syndrome`). It is in every ACK, NAK and atomic ACK, and in the
//! first and last (or only) packet of a READ response.
//!
//! ```text
//!  byte 0      1-3
//!  Syndrome | MSN
//! ```
//!
//! The syndrome's top 3 bits say what it is (kernel `AETH_TYPE_MASK`
//! 0xe0): 000 ACK (low 5 bits: credit count, 0x1f = no flow control), 001
//! RNR NAK (low 5 bits: RNR timer code), 011 NAK (low 5 bits: error code);
//! anything else is reserved. Kernel rxe was seen to send 0x1f, 0x2c (RNR
//! NAK, timer 12) and 0x60 (NAK, PSN sequence error) in the reference
//! captures.

use core::fmt;

use crate::bytes::{self, header_view};
use crate::Result;

/// Byte layout of the AETH.
pub mod field {
    use crate::Field;
    /// ACK, RNR NAK or NAK, and its 5-bit value.
    pub const SYNDROME: Field = 0..1;
    /// Message sequence number: messages completed by the responder
    /// (24 bits).
    pub const MSN: Field = 1..4;
}

/// Length of the AETH.
pub const HEADER_LEN: usize = field::MSN.end;

/// The 24 bits of the MSN (kernel `AETH_MSN_MASK`).
pub const MSN_MASK: u32 = 0x00ff_ffff;

/// The credit count of an ACK that means "end-to-end flow control is not
/// used" (IBTA: invalid credit count; kernel `AETH_ACK_UNLIMITED`). Kernel
/// rxe sends it in every ACK, having no credits.
pub const CREDITS_INVALID: u8 = 0x1f;

/// The error of a NAK (the low 5 bits of syndrome 011xxxxx; IBTA Vol. 1,
/// the AETH syndrome encoding of chapter 9).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NakCode {
    /// 0: a request arrived out of sequence; the requester goes back to the
    /// PSN in the BTH (kernel `AETH_NAK_PSN_SEQ_ERROR`).
    PsnSequenceError,
    /// 1: invalid request (kernel `AETH_NAK_INVALID_REQ`).
    InvalidRequest,
    /// 2: remote access error, e.g. a bad rkey or range (kernel
    /// `AETH_NAK_REM_ACC_ERR`).
    RemoteAccessError,
    /// 3: remote operational error (kernel `AETH_NAK_REM_OP_ERR`).
    RemoteOperationalError,
    /// 4: invalid RD request (RD only).
    InvalidRdRequest,
    /// 5-31: reserved; the value is kept so it re-emits unchanged.
    Reserved(u8),
}

impl NakCode {
    /// The 5-bit code.
    pub fn to_raw(self) -> u8 {
        match self {
            NakCode::PsnSequenceError => 0,
            NakCode::InvalidRequest => 1,
            NakCode::RemoteAccessError => 2,
            NakCode::RemoteOperationalError => 3,
            NakCode::InvalidRdRequest => 4,
            NakCode::Reserved(code) => code & 0x1f,
        }
    }

    /// The code from the low 5 bits of `v`.
    pub fn from_raw(v: u8) -> NakCode {
        match v & 0x1f {
            0 => NakCode::PsnSequenceError,
            1 => NakCode::InvalidRequest,
            2 => NakCode::RemoteAccessError,
            3 => NakCode::RemoteOperationalError,
            4 => NakCode::InvalidRdRequest,
            code => NakCode::Reserved(code),
        }
    }
}

impl fmt::Display for NakCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NakCode::PsnSequenceError => f.write_str("PSN sequence error"),
            NakCode::InvalidRequest => f.write_str("invalid request"),
            NakCode::RemoteAccessError => f.write_str("remote access error"),
            NakCode::RemoteOperationalError => f.write_str("remote operational error"),
            NakCode::InvalidRdRequest => f.write_str("invalid RD request"),
            NakCode::Reserved(code) => write!(f, "reserved code {code}"),
        }
    }
}

/// The meaning of the AETH syndrome byte.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Syndrome {
    /// 000xxxxx: positive acknowledgement, with a 5-bit credit count
    /// ([`CREDITS_INVALID`] from kernel rxe).
    Ack {
        /// The credit count code.
        credits: u8,
    },
    /// 001xxxxx: receiver not ready; retry after the timer (code, see
    /// [`rnr_timer_ns`]).
    RnrNak {
        /// The RNR timer code.
        timer: u8,
    },
    /// 011xxxxx: negative acknowledgement.
    Nak(NakCode),
    /// 010xxxxx or 1xxxxxxx: reserved. The whole byte is kept.
    Reserved(u8),
}

impl Syndrome {
    /// Decode a syndrome byte. Total: every byte is some syndrome, and
    /// `to_raw(from_raw(b)) == b`.
    pub fn from_raw(v: u8) -> Syndrome {
        let low = v & 0x1f;
        match v >> 5 {
            0b000 => Syndrome::Ack { credits: low },
            0b001 => Syndrome::RnrNak { timer: low },
            0b011 => Syndrome::Nak(NakCode::from_raw(low)),
            _ => Syndrome::Reserved(v),
        }
    }

    /// Encode as a syndrome byte (values wider than 5 bits are truncated).
    pub fn to_raw(self) -> u8 {
        match self {
            Syndrome::Ack { credits } => credits & 0x1f,
            Syndrome::RnrNak { timer } => 0x20 | (timer & 0x1f),
            Syndrome::Nak(code) => 0x60 | code.to_raw(),
            Syndrome::Reserved(v) => v,
        }
    }
}

impl fmt::Display for Syndrome {
    /// In words, e.g. "ACK, credits invalid", "RNR NAK, timer code 12
    /// (0.64 ms)", "NAK, PSN sequence error".
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Syndrome::Ack { credits } if credits & 0x1f == CREDITS_INVALID => {
                f.write_str("ACK, credits invalid (no end-to-end flow control)")
            }
            Syndrome::Ack { credits } => write!(f, "ACK, credit code {}", credits & 0x1f),
            Syndrome::RnrNak { timer } => {
                let ns = rnr_timer_ns(timer);
                write!(
                    f,
                    "RNR NAK, timer code {} ({}.{:02} ms)",
                    timer & 0x1f,
                    ns / 1_000_000,
                    ns % 1_000_000 / 10_000
                )
            }
            Syndrome::Nak(code) => write!(f, "NAK, {code}"),
            Syndrome::Reserved(v) => write!(f, "reserved syndrome {v:#04x}"),
        }
    }
}

/// The RNR NAK timer codes in microseconds (the IBTA Vol. 1 table of RNR
/// NAK timer encodings, chapter 9): how long the requester waits before
/// retrying after an RNR NAK.
const RNR_TIMER_US: [u64; 32] = [
    655_360, 10, 20, 30, 40, 60, 80, 120, 160, 240, 320, 480, 640, 960, 1_280, 1_920, 2_560, 3_840,
    5_120, 7_680, 10_240, 15_360, 20_480, 30_720, 40_960, 61_440, 81_920, 122_880, 163_840,
    245_760, 327_680, 491_520,
];

/// The RNR timer of code `code` (low 5 bits) in nanoseconds: code 0 =
/// 655.36 ms, 1 = 10 µs, ..., 12 = 0.64 ms, ..., 31 = 491.52 ms.
///
/// Code 25 is 61.44 ms as the IBTA table says; kernel rxe's
/// `rnrnak_usec[]` has 61410 µs there, a typo we do not reproduce.
pub fn rnr_timer_ns(code: u8) -> u64 {
    RNR_TIMER_US[usize::from(code & 0x1f)] * 1_000
}

header_view!("an ACK Extended Transport Header");

impl<T: AsRef<[u8]>> Packet<T> {
    /// The raw syndrome byte.
    pub fn syndrome_raw(&self) -> u8 {
        bytes::read(self.buffer.as_ref(), field::SYNDROME) as u8
    }

    /// The decoded syndrome.
    pub fn syndrome(&self) -> Syndrome {
        Syndrome::from_raw(self.syndrome_raw())
    }

    /// Message sequence number.
    pub fn msn(&self) -> u32 {
        bytes::read(self.buffer.as_ref(), field::MSN) as u32
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Set the raw syndrome byte.
    pub fn set_syndrome_raw(&mut self, value: u8) {
        bytes::write(self.buffer.as_mut(), field::SYNDROME, value.into())
    }

    /// Set the syndrome.
    pub fn set_syndrome(&mut self, value: Syndrome) {
        self.set_syndrome_raw(value.to_raw())
    }

    /// Set the MSN (low 24 bits of `value`).
    pub fn set_msn(&mut self, value: u32) {
        bytes::write(self.buffer.as_mut(), field::MSN, (value & MSN_MASK).into())
    }
}

/// The meaning of an AETH.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AethRepr {
    /// ACK, RNR NAK or NAK.
    pub syndrome: Syndrome,
    /// Message sequence number (24 bits).
    pub msn: u32,
}

impl AethRepr {
    /// Read an AETH (every bit pattern is valid; `Truncated` if short).
    pub fn parse<T: AsRef<[u8]>>(packet: &Packet<T>) -> Result<AethRepr> {
        packet.check_len()?;
        Ok(AethRepr {
            syndrome: packet.syndrome(),
            msn: packet.msn(),
        })
    }

    /// Write the 4 bytes.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) {
        packet.set_syndrome(self.syndrome);
        packet.set_msn(self.msn);
    }

    /// Bytes `emit` writes.
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The AETH of an RNR NAK in rc_rnr_nak.pcap: syndrome 0x2c (RNR NAK,
    /// timer 12), MSN 2.
    const RNR_NAK: [u8; 4] = [0x2c, 0x00, 0x00, 0x02];

    #[test]
    fn deconstruct() {
        let p = Packet::new_checked(&RNR_NAK[..]).unwrap();
        assert_eq!(p.syndrome_raw(), 0x2c);
        assert_eq!(p.syndrome(), Syndrome::RnrNak { timer: 12 });
        assert_eq!(p.msn(), 2);
    }

    #[test]
    fn construct() {
        let mut p = Packet::new_unchecked([0xffu8; 4]);
        p.set_syndrome(Syndrome::RnrNak { timer: 12 });
        p.set_msn(0xff00_0002); // the top byte is not the MSN's
        assert_eq!(p.into_inner(), RNR_NAK);
    }

    #[test]
    fn parse_emit_round_trip() {
        let r = AethRepr::parse(&Packet::new_checked(&RNR_NAK[..]).unwrap()).unwrap();
        assert_eq!(
            r,
            AethRepr {
                syndrome: Syndrome::RnrNak { timer: 12 },
                msn: 2
            }
        );
        let mut buf = [0u8; 4];
        r.emit(&mut Packet::new_unchecked(&mut buf[..]));
        assert_eq!(buf, RNR_NAK);
        assert!(Packet::new_checked(&RNR_NAK[..3]).is_err());
    }

    #[test]
    fn syndromes_as_kernel_rxe_encodes_them() {
        for (raw, syn) in [
            (
                0x1f,
                Syndrome::Ack {
                    credits: CREDITS_INVALID,
                },
            ),
            (0x2c, Syndrome::RnrNak { timer: 12 }),
            (0x60, Syndrome::Nak(NakCode::PsnSequenceError)),
            (0x61, Syndrome::Nak(NakCode::InvalidRequest)),
            (0x62, Syndrome::Nak(NakCode::RemoteAccessError)),
            (0x63, Syndrome::Nak(NakCode::RemoteOperationalError)),
            (0x64, Syndrome::Nak(NakCode::InvalidRdRequest)),
            (0x65, Syndrome::Nak(NakCode::Reserved(5))),
            (0x40, Syndrome::Reserved(0x40)),
            (0x9f, Syndrome::Reserved(0x9f)),
        ] {
            assert_eq!(Syndrome::from_raw(raw), syn, "{raw:#x}");
            assert_eq!(syn.to_raw(), raw);
        }
        for v in 0..=255u8 {
            assert_eq!(Syndrome::from_raw(v).to_raw(), v);
        }
    }

    #[test]
    fn syndromes_in_words() {
        let s = |v: u8| Syndrome::from_raw(v).to_string();
        assert_eq!(s(0x1f), "ACK, credits invalid (no end-to-end flow control)");
        assert_eq!(s(0x05), "ACK, credit code 5");
        assert_eq!(s(0x2c), "RNR NAK, timer code 12 (0.64 ms)");
        assert_eq!(s(0x20), "RNR NAK, timer code 0 (655.36 ms)");
        assert_eq!(s(0x21), "RNR NAK, timer code 1 (0.01 ms)");
        assert_eq!(s(0x60), "NAK, PSN sequence error");
        assert_eq!(s(0x62), "NAK, remote access error");
        assert_eq!(s(0x7f), "NAK, reserved code 31");
        assert_eq!(s(0x40), "reserved syndrome 0x40");
    }

    #[test]
    fn rnr_timer_table() {
        assert_eq!(rnr_timer_ns(0), 655_360_000);
        assert_eq!(rnr_timer_ns(1), 10_000);
        assert_eq!(rnr_timer_ns(12), 640_000);
        assert_eq!(
            rnr_timer_ns(25),
            61_440_000,
            "the IBTA value, not kernel rxe's 61.41 ms typo"
        );
        assert_eq!(rnr_timer_ns(31), 491_520_000);
        assert_eq!(
            rnr_timer_ns(0xe0 | 12),
            640_000,
            "only the low 5 bits count"
        );
        // Strictly increasing from code 1 on.
        for c in 2..32u8 {
            assert!(rnr_timer_ns(c) > rnr_timer_ns(c - 1));
        }
    }
}
