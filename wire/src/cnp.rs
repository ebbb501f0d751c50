//! The RoCEv2 Congestion Notification Packet (CNP, BTH opcode 0x81): what
//! a notification point (the receiver of CE-marked packets) sends back to
//! the reaction point (their sender) so that it slows the named QP down.
//!
//! ```text
//!  byte 0-11   12-27                  28-31
//!  BTH       | 16 reserved bytes (0) | ICRC
//!
//!  BTH: opcode 0x81, SE M PadCnt TVer = 0, P_Key 0xffff,
//!       FECN 0, BECN 1, DestQP = the data sender's QP, AckReq 0, PSN 0
//! ```
//!
//! Sources: IBTA Annex A17 (RoCEv2) as summarised by NVIDIA's knowledge
//! article "RoCEv2 CNP Packet Format Example" (2018), whose capture is a
//! test vector below; scapy's `contrib/roce.py` (`cnp()`: `BTH(opcode=0x81,
//! becn=1)` + two zero 64-bit fields); Linux `include/rdma/ib_hdrs.h`
//! (`IB_BTH_OPCODE_CNP = 0x81`). Not the native-InfiniBand CNP of Annex A10
//! (opcode 0x80, kernel `IB_OPCODE_CNP`).
//!
//! Kernel rxe's opcode table has no entry for 0x81, so
//! [`crate::PacketRepr::parse`] refuses a CNP with
//! [`crate::Error::UnknownOpcode`]; this module is how to read one. The
//! reserved bytes are sent as zero and ignored on receipt; so are SE, M,
//! PadCnt and AckReq. The ICRC is computed and checked as for any RoCEv2
//! packet ([`crate::icrc`]).

use crate::bth::{self, BthRepr};
use crate::bytes::header_view;
use crate::{Error, Opcode, Psn, Result, ICRC_LEN};

/// The BTH opcode of a RoCEv2 CNP (kernel `IB_BTH_OPCODE_CNP`).
pub const OPCODE: Opcode = Opcode::CNP;

/// Byte layout of a CNP (the whole UDP payload).
pub mod field {
    use crate::Field;
    /// The Base Transport Header.
    pub const BTH: Field = 0..12;
    /// Reserved: sent as zero, ignored on receipt.
    pub const RESERVED: Field = 12..28;
    /// The invariant CRC, little-endian as in every RoCEv2 packet.
    pub const ICRC: Field = 28..32;
}

/// Length of a CNP's UDP payload: BTH, 16 reserved bytes, ICRC. The view
/// checks this much (the macro calls it the header length).
pub const HEADER_LEN: usize = field::ICRC.end;

/// Length of the reserved field after the BTH.
pub const RESERVED_LEN: usize = field::RESERVED.end - field::RESERVED.start;

header_view!("a whole RoCEv2 CNP (BTH, reserved bytes and ICRC)");

impl<T: AsRef<[u8]>> Packet<T> {
    /// A view of the BTH.
    pub fn bth(&self) -> bth::Packet<&[u8]> {
        bth::Packet::new_unchecked(&self.buffer.as_ref()[field::BTH])
    }

    /// The 16 reserved bytes.
    pub fn reserved(&self) -> &[u8] {
        &self.buffer.as_ref()[field::RESERVED]
    }

    /// The ICRC as stored (little-endian on the wire).
    pub fn icrc(&self) -> u32 {
        let b = &self.buffer.as_ref()[field::ICRC];
        u32::from_le_bytes([b[0], b[1], b[2], b[3]])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// A mutable view of the BTH.
    pub fn bth_mut(&mut self) -> bth::Packet<&mut [u8]> {
        bth::Packet::new_unchecked(&mut self.buffer.as_mut()[field::BTH])
    }

    /// The reserved bytes, to fill.
    pub fn reserved_mut(&mut self) -> &mut [u8] {
        &mut self.buffer.as_mut()[field::RESERVED]
    }
}

/// The meaning of a CNP: which QP it is for and its BTH's congestion bits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CnpRepr {
    /// The QP that must slow down: the sender of the CE-marked packets.
    pub dest_qpn: u32,
    /// BECN: 1 in every CNP seen (scapy's default, NVIDIA's capture).
    pub becn: bool,
    /// FECN: 0 when sent (the ICRC masks it, so a switch could set it).
    pub fecn: bool,
    /// Partition key (0xffff, the default one).
    pub pkey: u16,
    /// PSN: 0 when sent; a CNP is outside the QP's PSN sequence.
    pub psn: Psn,
}

impl CnpRepr {
    /// The CNP a notification point sends to `dest_qpn`: BECN 1, FECN 0,
    /// P_Key 0xffff, PSN 0.
    pub const fn new(dest_qpn: u32) -> CnpRepr {
        CnpRepr {
            dest_qpn: dest_qpn & bth::QPN_MASK,
            becn: true,
            fecn: false,
            pkey: bth::DEFAULT_PKEY,
            psn: Psn::new(0),
        }
    }

    /// Read a CNP from a whole UDP payload (BTH through ICRC). The ICRC is
    /// not checked here (see [`crate::icrc::check`]).
    ///
    /// `Error::Truncated` if shorter than 32 bytes; `Error::Malformed` if
    /// longer, if the opcode is not 0x81, or if TVer is not 0. Never
    /// panics.
    pub fn parse(udp_payload: &[u8]) -> Result<CnpRepr> {
        let p = Packet::new_checked(udp_payload)?;
        if udp_payload.len() != HEADER_LEN {
            return Err(Error::Malformed);
        }
        let b = p.bth();
        if b.opcode() != OPCODE || b.tver() != bth::TVER {
            return Err(Error::Malformed);
        }
        Ok(CnpRepr {
            dest_qpn: b.dest_qpn(),
            becn: b.becn(),
            fecn: b.fecn(),
            pkey: b.pkey(),
            psn: b.psn(),
        })
    }

    /// Write the 32 bytes into `buf[..32]`: the BTH (SE, M, PadCnt, TVer,
    /// AckReq and reserved bits zero), zero reserved bytes and a zero
    /// ICRC, which the caller then seals with [`crate::icrc::write`].
    /// `Error::Truncated` if `buf` is shorter; bytes after 32 are left
    /// alone.
    pub fn emit(&self, buf: &mut [u8]) -> Result<()> {
        let buf = buf.get_mut(..HEADER_LEN).ok_or(Error::Truncated)?;
        let bth = BthRepr {
            opcode: OPCODE,
            solicited: false,
            mig_req: false,
            pad_count: 0,
            tver: bth::TVER,
            pkey: self.pkey,
            fecn: self.fecn,
            becn: self.becn,
            dest_qpn: self.dest_qpn,
            ack_req: false,
            psn: self.psn,
        };
        let mut p = Packet::new_unchecked(buf);
        bth.emit(&mut p.bth_mut());
        p.reserved_mut().fill(0);
        p.into_inner()[field::ICRC].fill(0);
        Ok(())
    }

    /// Bytes `emit` writes (the whole UDP payload, ICRC included).
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }
}

/// Whether a UDP payload claims to be a CNP (its first byte is 0x81);
/// [`CnpRepr::parse`] judges the rest.
pub fn is_cnp(udp_payload: &[u8]) -> bool {
    udp_payload.first() == Some(&OPCODE.0)
}

// A CNP ends with the same ICRC as every packet.
const _: () = assert!(field::ICRC.end - field::ICRC.start == ICRC_LEN);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::icrc::{self, IpUdpInfo};

    /// The UDP payload of a CNP as a Wireshark capture shows it in NVIDIA
    /// (Mellanox) knowledge article "RoCEv2 CNP Packet Format Example"
    /// (community.mellanox.com/s/article/rocev2-cnp-packet-format-example,
    /// 2018-12-05; mirrored at cnblogs.com/ztguang/p/15201924.html):
    /// `81 00 ff ff 40 00 00 d2`, 20 zero bytes, `e4 2d ad 81`. The
    /// article does not give the IP and UDP headers, so its ICRC cannot be
    /// recomputed here; every other byte is checked.
    const NVIDIA_ARTICLE_CNP: [u8; 32] = [
        0x81, 0x00, 0xff, 0xff, 0x40, 0x00, 0x00, 0xd2, 0x00, 0x00, 0x00, 0x00, // BTH
        0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, // reserved
        0xe4, 0x2d, 0xad, 0x81, // ICRC
    ];

    fn info() -> IpUdpInfo {
        IpUdpInfo {
            src: "10.0.0.2".parse().unwrap(),
            dst: "10.0.0.1".parse().unwrap(),
            src_port: 0xc123,
            dst_port: crate::ROCEV2_UDP_PORT,
            ipv4_id: 0,
            ipv4_flags_frag: 0x4000,
        }
    }

    #[test]
    fn deconstruct_the_article_capture() {
        let p = Packet::new_checked(&NVIDIA_ARTICLE_CNP[..]).unwrap();
        assert_eq!(p.bth().opcode(), OPCODE);
        assert!(p.bth().becn() && !p.bth().fecn());
        assert_eq!(p.bth().pkey(), 0xffff);
        assert_eq!(p.bth().dest_qpn(), 0xd2);
        assert_eq!(p.bth().psn(), Psn::new(0));
        assert!(!p.bth().ack_req() && !p.bth().solicited());
        assert_eq!(p.reserved(), &[0u8; 16]);
        assert_eq!(p.icrc(), 0x81ad_2de4);
        assert_eq!(CnpRepr::parse(&NVIDIA_ARTICLE_CNP), Ok(CnpRepr::new(0xd2)));
        assert!(is_cnp(&NVIDIA_ARTICLE_CNP));
    }

    #[test]
    fn emit_reproduces_the_article_capture_up_to_the_icrc() {
        let mut out = [0xa5u8; 36];
        CnpRepr::new(0xd2).emit(&mut out).unwrap();
        assert_eq!(&out[..28], &NVIDIA_ARTICLE_CNP[..28]);
        assert_eq!(&out[28..32], &[0; 4], "ICRC left for icrc::write");
        assert_eq!(&out[32..], &[0xa5; 4], "bytes after the CNP untouched");
        assert_eq!(CnpRepr::new(0xd2).buffer_len(), 32);
    }

    #[test]
    fn sealed_cnp_checks_and_round_trips() {
        let mut buf = [0u8; 32];
        let repr = CnpRepr::new(0x00ab_cdef);
        repr.emit(&mut buf).unwrap();
        icrc::write(&info(), &mut buf);
        assert!(icrc::check(&info(), &buf));
        assert_eq!(CnpRepr::parse(&buf), Ok(repr));
        // BECN/FECN are masked out of the ICRC: a switch may set FECN.
        buf[4] |= 0x80;
        assert!(icrc::check(&info(), &buf));
        assert!(CnpRepr::parse(&buf).unwrap().fecn);
        // The QPN is covered.
        buf[7] ^= 1;
        assert!(!icrc::check(&info(), &buf));
        // A DestQP wider than 24 bits is truncated, not spilled into BECN.
        assert_eq!(CnpRepr::new(u32::MAX).dest_qpn, 0x00ff_ffff);
    }

    #[test]
    fn reserved_bits_are_ignored_on_receipt() {
        let mut dirty = NVIDIA_ARTICLE_CNP;
        dirty[1] = 0xf0; // SE, M, PadCnt
        dirty[4] |= 0x3f; // resv6a
        dirty[8] = 0xff; // AckReq, resv7
        dirty[12..28].fill(0x55);
        assert_eq!(CnpRepr::parse(&dirty), Ok(CnpRepr::new(0xd2)));
        let mut out = [0u8; 32];
        CnpRepr::parse(&dirty).unwrap().emit(&mut out).unwrap();
        assert_eq!(&out[..28], &NVIDIA_ARTICLE_CNP[..28]);
    }

    #[test]
    fn malformed_is_an_error_not_a_panic() {
        assert_eq!(CnpRepr::parse(&[]), Err(Error::Truncated));
        assert_eq!(CnpRepr::parse(&[0x81]), Err(Error::Truncated));
        assert_eq!(
            CnpRepr::parse(&NVIDIA_ARTICLE_CNP[..31]),
            Err(Error::Truncated)
        );
        let mut long = NVIDIA_ARTICLE_CNP.to_vec();
        long.push(0);
        assert_eq!(CnpRepr::parse(&long), Err(Error::Malformed));
        let mut other = NVIDIA_ARTICLE_CNP;
        other[0] = 0x80; // the native-IB CNP of Annex A10
        assert_eq!(CnpRepr::parse(&other), Err(Error::Malformed));
        assert!(!is_cnp(&other) && !is_cnp(&[]));
        let mut tver = NVIDIA_ARTICLE_CNP;
        tver[1] = 0x01;
        assert_eq!(CnpRepr::parse(&tver), Err(Error::Malformed));
        assert_eq!(CnpRepr::new(1).emit(&mut [0u8; 31]), Err(Error::Truncated));
        // The transport table still refuses it, as kernel rxe's does.
        assert_eq!(
            crate::PacketRepr::parse(&NVIDIA_ARTICLE_CNP),
            Err(Error::UnknownOpcode(0x81))
        );
    }
}
