//! # wire: RoCEv2 on the wire, byte-exact with Linux kernel rxe
//!
//! Everything between the UDP header and the end of a RoCEv2 datagram, plus
//! the little around it that a capture needs:
//!
//! - one module per transport header ([`bth`], [`reth`], [`aeth`],
//!   [`atomic`], [`deth`], [`immdt`], [`ieth`], [`feth`], [`rdeth`],
//!   [`xrceth`]), each a
//!   zero-copy `Packet<T>` view over a byte buffer with a `mod field` byte
//!   layout, and an owned `...Repr` with `parse` and `emit`, in the manner of
//!   smoltcp's `src/wire/`;
//! - the opcode table of kernel rxe (`rxe_opcode.c`) as data ([`opcode`]):
//!   which extension headers follow each opcode, in which order, and what
//!   the packet means to the requester and responder;
//! - a whole-packet view, [`PacketRepr`] ([`packet`]): BTH, extension
//!   headers, payload, pad and ICRC;
//! - the invariant CRC ([`icrc`], IBTA Annex A17 / kernel `rxe_icrc.c`),
//!   including recovery of the IPv4 ID that a UDP socket hides;
//! - congestion control on the wire: the RoCEv2 CNP (BTH opcode 0x81,
//!   [`cnp`]), which kernel rxe's table lacks, and the IP ECN codepoints
//!   ([`ecn`]);
//! - 24-bit PSN arithmetic ([`psn`]);
//! - the Management Datagrams that ride on QP1: the MAD common header
//!   ([`mad`]), the IB Communication Manager messages ([`cm`]: REQ, MRA,
//!   REJ, REP, RTU, DREQ, DREP) and rdma_cm's private-data header and IP
//!   service IDs ([`cma`]);
//! - classic pcap files and Ethernet/IP/UDP framing ([`pcap`], [`frame`]),
//!   so our traffic can be compared with kernel captures and read by tshark.
//!
//! The crate has no I/O beyond [`pcap::PcapWriter`]'s `io::Write`, no state,
//! no `unsafe`, and no panic on any input: every parser validates lengths
//! once and returns [`Error`] instead.
//!
//! ```
//! use wire::{icrc, PacketRepr};
//!
//! // An RC ACK (syndrome 0x1f, MSN 1) as kernel rxe sent it, with its ICRC.
//! let udp_payload = [
//!     0x11, 0x00, 0xff, 0xff, 0x00, 0x00, 0x00, 0x11, 0x00, 0xac, 0x66, 0x82, // BTH
//!     0x1f, 0x00, 0x00, 0x01, // AETH
//!     0x96, 0x5b, 0x52, 0x6d, // ICRC
//! ];
//! let info = icrc::IpUdpInfo {
//!     src: "10.77.0.11".parse().unwrap(),
//!     dst: "10.77.0.12".parse().unwrap(),
//!     src_port: 49441,
//!     dst_port: wire::ROCEV2_UDP_PORT,
//!     ipv4_id: 0x8b97,
//!     ipv4_flags_frag: 0x4000,
//! };
//! assert!(icrc::check(&info, &udp_payload));
//! let p = PacketRepr::parse(&udp_payload).unwrap();
//! assert_eq!(p.bth.opcode, wire::Opcode::RC_ACKNOWLEDGE);
//! let mut out = vec![0u8; p.buffer_len()];
//! p.emit(&mut out).unwrap();
//! icrc::write(&info, &mut out);
//! assert_eq!(out, udp_payload);
//! ```
#![forbid(unsafe_code)]
#![warn(missing_docs)]
#![cfg_attr(
    not(test),
    deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)
)]

mod bytes;

pub mod aeth;
pub mod atomic;
pub mod bth;
pub mod cm;
pub mod cma;
pub mod cnp;
pub mod deth;
pub mod ecn;
pub mod feth;
pub mod frame;
pub mod icrc;
pub mod ieth;
pub mod immdt;
pub mod mad;
pub mod opcode;
pub mod packet;
pub mod pcap;
pub mod psn;
pub mod rdeth;
pub mod reth;
pub mod xrceth;

pub use ecn::Ecn;
pub use opcode::{OpFlags, Opcode, OpcodeInfo, Transport};
pub use packet::PacketRepr;
pub use psn::Psn;

/// The UDP destination port of RoCEv2 (IBTA Annex A17, assigned by IANA).
/// Kernel rxe listens on it and sends every packet to it; the source port
/// varies per QP.
pub const ROCEV2_UDP_PORT: u16 = 4791;

/// Length of the invariant CRC that ends every RoCEv2 packet (IBTA Annex
/// A17; kernel `RXE_ICRC_SIZE`).
pub const ICRC_LEN: usize = 4;

/// The byte range of one header field, as in smoltcp's `wire::field`: each
/// header module lists its layout as `mod field { pub const X: Field = a..b; }`
/// so it can be read against the specification at a glance.
pub type Field = core::ops::Range<usize>;

/// Why bytes could not be taken as a RoCEv2 packet (or frame, or capture).
///
/// One small enum for the whole crate, as smoltcp does: the receive path
/// only needs to know whether to drop, and the `Display` text says what to
/// look at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Error {
    /// The buffer is shorter than the headers, pad and ICRC that its
    /// opcode (or framing, or file format) requires.
    Truncated,
    /// A field holds a value the specification or kernel rxe rejects, such
    /// as a nonzero TVer, a pad count larger than the payload, or a payload
    /// on an opcode that carries none.
    Malformed,
    /// The BTH opcode is not in kernel rxe's opcode table, so the extension
    /// headers cannot be located.
    UnknownOpcode(u8),
    /// A checksum (the ICRC) does not match.
    Checksum,
    /// Well-formed, but not something this crate handles: a protocol other
    /// than IPv4/IPv6 + UDP, an IP fragment, IPv6 extension headers.
    Unsupported,
    /// A well-formed MAD that is not a Communication Manager Send this
    /// crate decodes (another management class or class version, another
    /// method, or a CM attribute such as LAP or APR).
    UnsupportedMad {
        /// Management class (0x07 is the CM).
        mgmt_class: u8,
        /// Class version (the CM's is 2).
        class_version: u8,
        /// Method byte (the CM uses Send, 0x03).
        method: u8,
        /// Attribute ID.
        attribute_id: u16,
    },
}

impl core::fmt::Display for Error {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Error::Truncated => f.write_str(
                "truncated: the buffer is shorter than the headers, pad and ICRC \
                 its opcode or framing requires",
            ),
            Error::Malformed => f.write_str(
                "malformed: a field has a value kernel rxe rejects (nonzero TVer, \
                 pad count beyond the payload, payload on an opcode without one, \
                 or headers that do not match the opcode)",
            ),
            Error::UnknownOpcode(op) => write!(
                f,
                "unknown BTH opcode {op:#04x}: kernel rxe's opcode table has no \
                 entry for it, so its headers cannot be located"
            ),
            Error::Checksum => f.write_str(
                "ICRC mismatch: the packet was corrupted, or the IP/UDP \
                 information used to check it is not the packet's own",
            ),
            Error::Unsupported => f.write_str(
                "unsupported framing: expected Ethernet (optionally 802.1Q) + \
                 unfragmented IPv4 or IPv6 without extension headers + UDP",
            ),
            Error::UnsupportedMad {
                mgmt_class,
                class_version,
                method,
                attribute_id,
            } => write!(
                f,
                "unsupported MAD: class {mgmt_class:#04x} version {class_version}, \
                 method {method:#04x}, attribute {attribute_id:#06x}; only CM \
                 (class 0x07, version 2) Sends of REQ, MRA, REJ, REP, RTU, DREQ, \
                 DREP, SIDR_REQ and SIDR_REP (attributes 0x0010-0x0018) are decoded"
            ),
        }
    }
}

impl std::error::Error for Error {}

/// The result type of every fallible function of this crate.
pub type Result<T> = core::result::Result<T, Error>;
