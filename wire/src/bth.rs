//! Base Transport Header: the 12 bytes that start every RoCEv2 packet
//! (IBTA Vol. 1, 9.2; kernel `struct rxe_bth` in rxe_hdr.h).
//!
//! ```text
//!  byte 0      1              2-3     4              5-7        8          9-11
//!  OpCode | SE M Pad TVer | P_Key | F B resv6a | DestQP | A resv7 | PSN
//! ```

use crate::bytes::{self, header_view};
use crate::{Opcode, Psn, Result};

/// Byte layout of the BTH. Bit fields inside these ranges are given by
/// the `*_MASK` constants, which are the kernel's.
pub mod field {
    use crate::Field;
    /// Opcode: transport and operation.
    pub const OPCODE: Field = 0..1;
    /// SE, MigReq, PadCnt, TVer.
    pub const FLAGS: Field = 1..2;
    /// Partition key.
    pub const PKEY: Field = 2..4;
    /// FECN, BECN, 6 reserved bits, destination QP.
    pub const QPN: Field = 4..8;
    /// AckReq, 7 reserved bits, PSN.
    pub const APSN: Field = 8..12;
}

/// Length of the BTH.
pub const HEADER_LEN: usize = field::APSN.end;

/// Solicited event, in `FLAGS` (kernel `BTH_SE_MASK`).
pub const SE_MASK: u8 = 0x80;
/// Migration request, in `FLAGS` (kernel `BTH_MIG_MASK`).
pub const MIG_MASK: u8 = 0x40;
/// Pad count, in `FLAGS` (kernel `BTH_PAD_MASK`).
pub const PAD_MASK: u8 = 0x30;
/// Transport header version, in `FLAGS` (kernel `BTH_TVER_MASK`).
pub const TVER_MASK: u8 = 0x0f;
/// Forward explicit congestion notification, in `QPN` (kernel
/// `BTH_FECN_MASK`).
pub const FECN_MASK: u32 = 0x8000_0000;
/// Backward explicit congestion notification, in `QPN` (kernel
/// `BTH_BECN_MASK`).
pub const BECN_MASK: u32 = 0x4000_0000;
/// Reserved bits, in `QPN` (kernel `BTH_RESV6A_MASK`).
pub const RESV6A_MASK: u32 = 0x3f00_0000;
/// Destination QP number, in `QPN` (kernel `BTH_QPN_MASK`).
pub const QPN_MASK: u32 = 0x00ff_ffff;
/// Acknowledge request, in `APSN` (kernel `BTH_ACK_MASK`).
pub const ACK_MASK: u32 = 0x8000_0000;
/// Reserved bits, in `APSN` (kernel `BTH_RESV7_MASK`).
pub const RESV7_MASK: u32 = 0x7f00_0000;
/// The PSN, in `APSN` (kernel `BTH_PSN_MASK`).
pub const PSN_MASK: u32 = 0x00ff_ffff;

/// The only transport header version (kernel `BTH_TVER`); kernel rxe drops
/// packets with any other.
pub const TVER: u8 = 0;
/// The default partition key, the only one kernel rxe uses on the wire
/// (kernel `BTH_DEF_PKEY`; every packet of the reference captures).
pub const DEFAULT_PKEY: u16 = 0xffff;

header_view!("a Base Transport Header");

impl<T: AsRef<[u8]>> Packet<T> {
    fn get(&self, f: crate::Field, mask: u64) -> u64 {
        bytes::read_bits(self.buffer.as_ref(), f, mask)
    }

    /// The opcode.
    pub fn opcode(&self) -> Opcode {
        Opcode(self.get(field::OPCODE, 0xff) as u8)
    }

    /// Solicited event: the responder should raise a completion event.
    pub fn solicited(&self) -> bool {
        self.get(field::FLAGS, SE_MASK.into()) != 0
    }

    /// Migration request (automatic path migration; kernel rxe sends 0).
    pub fn mig_req(&self) -> bool {
        self.get(field::FLAGS, MIG_MASK.into()) != 0
    }

    /// Pad count: bytes (0-3) between the payload and the ICRC that make
    /// the packet a multiple of 4 bytes.
    pub fn pad_count(&self) -> u8 {
        self.get(field::FLAGS, PAD_MASK.into()) as u8
    }

    /// Transport header version.
    pub fn tver(&self) -> u8 {
        self.get(field::FLAGS, TVER_MASK.into()) as u8
    }

    /// Partition key.
    pub fn pkey(&self) -> u16 {
        self.get(field::PKEY, 0xffff) as u16
    }

    /// Forward ECN: congestion seen on the way (masked out of the ICRC).
    pub fn fecn(&self) -> bool {
        self.get(field::QPN, FECN_MASK.into()) != 0
    }

    /// Backward ECN (masked out of the ICRC).
    pub fn becn(&self) -> bool {
        self.get(field::QPN, BECN_MASK.into()) != 0
    }

    /// The 6 reserved bits after BECN (masked out of the ICRC).
    pub fn resv6a(&self) -> u8 {
        self.get(field::QPN, RESV6A_MASK.into()) as u8
    }

    /// Destination QP number (24 bits).
    pub fn dest_qpn(&self) -> u32 {
        self.get(field::QPN, QPN_MASK.into()) as u32
    }

    /// Acknowledge request: the responder must answer this packet.
    pub fn ack_req(&self) -> bool {
        self.get(field::APSN, ACK_MASK.into()) != 0
    }

    /// The 7 reserved bits after AckReq (covered by the ICRC).
    pub fn resv7(&self) -> u8 {
        self.get(field::APSN, RESV7_MASK.into()) as u8
    }

    /// Packet sequence number.
    pub fn psn(&self) -> Psn {
        Psn::new(self.get(field::APSN, PSN_MASK.into()) as u32)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    fn put(&mut self, f: crate::Field, mask: u64, value: u64) {
        bytes::write_bits(self.buffer.as_mut(), f, mask, value)
    }

    /// Set the opcode.
    pub fn set_opcode(&mut self, value: Opcode) {
        self.put(field::OPCODE, 0xff, value.0.into())
    }

    /// Set the solicited event bit.
    pub fn set_solicited(&mut self, value: bool) {
        self.put(field::FLAGS, SE_MASK.into(), value.into())
    }

    /// Set the migration request bit.
    pub fn set_mig_req(&mut self, value: bool) {
        self.put(field::FLAGS, MIG_MASK.into(), value.into())
    }

    /// Set the pad count (low 2 bits of `value`).
    pub fn set_pad_count(&mut self, value: u8) {
        self.put(field::FLAGS, PAD_MASK.into(), value.into())
    }

    /// Set the transport header version (low 4 bits of `value`).
    pub fn set_tver(&mut self, value: u8) {
        self.put(field::FLAGS, TVER_MASK.into(), value.into())
    }

    /// Set the partition key.
    pub fn set_pkey(&mut self, value: u16) {
        self.put(field::PKEY, 0xffff, value.into())
    }

    /// Set the FECN bit.
    pub fn set_fecn(&mut self, value: bool) {
        self.put(field::QPN, FECN_MASK.into(), value.into())
    }

    /// Set the BECN bit.
    pub fn set_becn(&mut self, value: bool) {
        self.put(field::QPN, BECN_MASK.into(), value.into())
    }

    /// Set the 6 reserved bits after BECN (low 6 bits of `value`).
    pub fn set_resv6a(&mut self, value: u8) {
        self.put(field::QPN, RESV6A_MASK.into(), value.into())
    }

    /// Set the destination QP number (low 24 bits of `value`).
    pub fn set_dest_qpn(&mut self, value: u32) {
        self.put(field::QPN, QPN_MASK.into(), value.into())
    }

    /// Set the acknowledge request bit.
    pub fn set_ack_req(&mut self, value: bool) {
        self.put(field::APSN, ACK_MASK.into(), value.into())
    }

    /// Set the 7 reserved bits after AckReq (low 7 bits of `value`).
    pub fn set_resv7(&mut self, value: u8) {
        self.put(field::APSN, RESV7_MASK.into(), value.into())
    }

    /// Set the PSN.
    pub fn set_psn(&mut self, value: Psn) {
        self.put(field::APSN, PSN_MASK.into(), value.value().into())
    }
}

/// The meaning of a BTH. The reserved bits are not kept: they are sent as
/// zero and ignored on receipt (IBTA convention; kernel rxe's `bth_init`
/// writes zeros and its receive path never looks at them).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BthRepr {
    /// Transport and operation; decides which headers follow.
    pub opcode: Opcode,
    /// Solicited event.
    pub solicited: bool,
    /// Migration request.
    pub mig_req: bool,
    /// Pad bytes before the ICRC (0-3). [`crate::PacketRepr::emit`]
    /// computes it from the payload length and ignores this value.
    pub pad_count: u8,
    /// Transport header version; must be 0 ([`TVER`]).
    pub tver: u8,
    /// Partition key ([`DEFAULT_PKEY`] from kernel rxe).
    pub pkey: u16,
    /// Forward ECN.
    pub fecn: bool,
    /// Backward ECN.
    pub becn: bool,
    /// Destination QP number (24 bits).
    pub dest_qpn: u32,
    /// Acknowledge request.
    pub ack_req: bool,
    /// Packet sequence number.
    pub psn: Psn,
}

impl BthRepr {
    /// Read a BTH. Never fails on a view of at least 12 bytes: every bit
    /// pattern is a BTH (the opcode and TVer are judged by
    /// [`crate::PacketRepr::parse`], which knows what follows).
    pub fn parse<T: AsRef<[u8]>>(packet: &Packet<T>) -> Result<BthRepr> {
        packet.check_len()?;
        Ok(BthRepr {
            opcode: packet.opcode(),
            solicited: packet.solicited(),
            mig_req: packet.mig_req(),
            pad_count: packet.pad_count(),
            tver: packet.tver(),
            pkey: packet.pkey(),
            fecn: packet.fecn(),
            becn: packet.becn(),
            dest_qpn: packet.dest_qpn(),
            ack_req: packet.ack_req(),
            psn: packet.psn(),
        })
    }

    /// Write all 12 bytes, reserved bits as zero. Values wider than their
    /// field are truncated to it.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) {
        packet.set_opcode(self.opcode);
        packet.set_solicited(self.solicited);
        packet.set_mig_req(self.mig_req);
        packet.set_pad_count(self.pad_count);
        packet.set_tver(self.tver);
        packet.set_pkey(self.pkey);
        packet.set_fecn(self.fecn);
        packet.set_becn(self.becn);
        packet.set_resv6a(0);
        packet.set_dest_qpn(self.dest_qpn);
        packet.set_ack_req(self.ack_req);
        packet.set_resv7(0);
        packet.set_psn(self.psn);
    }

    /// Bytes `emit` writes.
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The BTH of the first RDMA READ request of rc_read.pcap: opcode 0x0c,
    /// P_Key 0xffff, DestQP 0x15, AckReq, PSN 15224777.
    const READ_REQUEST: [u8; 12] = [
        0x0c, 0x00, 0xff, 0xff, 0x00, 0x00, 0x00, 0x15, 0x80, 0xe8, 0x4f, 0xc9,
    ];

    /// The BTH of an RNR NAK of rc_rnr_nak.pcap: opcode 0x11 (ACK), DestQP
    /// 0x1b, no AckReq, PSN 0x63d35f.
    const RNR_NAK: [u8; 12] = [
        0x11, 0x00, 0xff, 0xff, 0x00, 0x00, 0x00, 0x1b, 0x00, 0x63, 0xd3, 0x5f,
    ];

    fn read_request_repr() -> BthRepr {
        BthRepr {
            opcode: Opcode::RC_RDMA_READ_REQUEST,
            solicited: false,
            mig_req: false,
            pad_count: 0,
            tver: 0,
            pkey: DEFAULT_PKEY,
            fecn: false,
            becn: false,
            dest_qpn: 0x15,
            ack_req: true,
            psn: Psn::new(15_224_777),
        }
    }

    #[test]
    fn deconstruct() {
        let p = Packet::new_checked(&READ_REQUEST[..]).unwrap();
        assert_eq!(p.opcode(), Opcode::RC_RDMA_READ_REQUEST);
        assert!(!p.solicited() && !p.mig_req());
        assert_eq!((p.pad_count(), p.tver()), (0, 0));
        assert_eq!(p.pkey(), 0xffff);
        assert!(!p.fecn() && !p.becn());
        assert_eq!((p.resv6a(), p.resv7()), (0, 0));
        assert_eq!(p.dest_qpn(), 0x15);
        assert!(p.ack_req());
        assert_eq!(p.psn(), Psn::new(15_224_777));
        let p = Packet::new_checked(&RNR_NAK[..]).unwrap();
        assert_eq!(p.opcode(), Opcode::RC_ACKNOWLEDGE);
        assert!(!p.ack_req());
        assert_eq!(p.psn(), Psn::new(0x63_d35f));
    }

    #[test]
    fn construct() {
        let mut buf = [0u8; 12];
        let mut p = Packet::new_unchecked(&mut buf[..]);
        p.set_opcode(Opcode::RC_SEND_ONLY);
        p.set_solicited(true);
        p.set_pad_count(3);
        p.set_pkey(0x7fff);
        p.set_fecn(true);
        p.set_dest_qpn(0x0012_3456);
        p.set_psn(Psn::new(0xab_cdef));
        assert_eq!(
            buf,
            [0x04, 0xb0, 0x7f, 0xff, 0x80, 0x12, 0x34, 0x56, 0x00, 0xab, 0xcd, 0xef]
        );
        // Every bit field set and cleared independently.
        let mut p = Packet::new_unchecked([0u8; 12]);
        p.set_mig_req(true);
        p.set_tver(0xf);
        p.set_becn(true);
        p.set_resv6a(0x3f);
        p.set_ack_req(true);
        p.set_resv7(0x7f);
        assert_eq!(
            p.clone().into_inner(),
            [0, 0x4f, 0, 0, 0x7f, 0, 0, 0, 0xff, 0, 0, 0]
        );
        p.set_resv6a(0);
        p.set_resv7(0);
        p.set_dest_qpn(u32::MAX); // truncated to 24 bits, BECN kept
        assert_eq!(
            p.into_inner(),
            [0, 0x4f, 0, 0, 0x40, 0xff, 0xff, 0xff, 0x80, 0, 0, 0]
        );
    }

    #[test]
    fn parse() {
        let p = Packet::new_checked(&READ_REQUEST[..]).unwrap();
        assert_eq!(BthRepr::parse(&p).unwrap(), read_request_repr());
    }

    #[test]
    fn emit() {
        let repr = read_request_repr();
        let mut buf = [0xa5u8; 12];
        repr.emit(&mut Packet::new_unchecked(&mut buf[..]));
        assert_eq!(buf, READ_REQUEST);
        assert_eq!(repr.buffer_len(), 12);
    }

    #[test]
    fn round_trip_and_reserved_bits() {
        for bytes in [READ_REQUEST, RNR_NAK] {
            let r = BthRepr::parse(&Packet::new_checked(&bytes[..]).unwrap()).unwrap();
            let mut out = [0xffu8; 12];
            r.emit(&mut Packet::new_unchecked(&mut out[..]));
            assert_eq!(out, bytes);
        }
        // Reserved bits are ignored on receipt and sent as zero.
        let mut dirty = READ_REQUEST;
        dirty[4] |= 0x3f;
        dirty[8] |= 0x7f;
        let r = BthRepr::parse(&Packet::new_checked(&dirty[..]).unwrap()).unwrap();
        assert_eq!(r, read_request_repr());
        let mut out = [0u8; 12];
        r.emit(&mut Packet::new_unchecked(&mut out[..]));
        assert_eq!(out, READ_REQUEST);
    }

    #[test]
    fn truncated() {
        assert_eq!(
            Packet::new_checked(&READ_REQUEST[..11]),
            Err(crate::Error::Truncated)
        );
        let short = Packet::new_unchecked(&READ_REQUEST[..11]);
        assert_eq!(BthRepr::parse(&short), Err(crate::Error::Truncated));
    }
}
