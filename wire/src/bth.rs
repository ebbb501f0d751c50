//! Base Transport Header (IBTA 9.2; kernel rxe_hdr.h `struct rxe_bth`).

use crate::{Opcode, Psn, Result};

crate::view::header_view! {
    /// A zero-copy view of a BTH.
    len = 12;
    /// The opcode (transport and operation).
    opcode / set_opcode: u8 = [0..1, 0xff],
    /// Solicited event (IBTA 9.2.3).
    solicited / set_solicited: u8 = [1..2, 0x80],
    /// Migration request.
    mig_req / set_mig_req: u8 = [1..2, 0x40],
    /// Pad count: bytes added to align the payload to 4.
    pad_count / set_pad_count: u8 = [1..2, 0x30],
    /// Transport header version (0).
    tver / set_tver: u8 = [1..2, 0x0f],
    /// Partition key.
    pkey / set_pkey: u16 = [2..4, 0xffff],
    /// Forward ECN (masked out of the ICRC).
    fecn / set_fecn: u8 = [4..5, 0x80],
    /// Backward ECN (masked out of the ICRC).
    becn / set_becn: u8 = [4..5, 0x40],
    /// Reserved bits of byte 4 (masked out of the ICRC).
    resv6 / set_resv6: u8 = [4..5, 0x3f],
    /// Destination QP number (24 bits).
    dest_qpn / set_dest_qpn: u32 = [5..8, 0xff_ffff],
    /// Acknowledge request.
    ack_req / set_ack_req: u8 = [8..9, 0x80],
    /// Reserved bits of byte 8.
    resv7 / set_resv7: u8 = [8..9, 0x7f],
    /// Packet sequence number (24 bits).
    psn_raw / set_psn_raw: u32 = [9..12, 0xff_ffff],
}

/// The meaning of a BTH.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BthRepr {
    pub opcode: Opcode,
    pub solicited: bool,
    pub mig_req: bool,
    pub pad_count: u8,
    pub tver: u8,
    pub pkey: u16,
    pub fecn: bool,
    pub becn: bool,
    pub dest_qpn: u32,
    pub ack_req: bool,
    pub psn: Psn,
}

impl BthRepr {
    /// Parse a checked view. Reserved bits are ignored on receive (IBTA
    /// 9.2: reserved fields are not checked by the receiver).
    pub fn parse<T: AsRef<[u8]>>(p: &Packet<T>) -> Result<BthRepr> {
        Ok(BthRepr {
            opcode: Opcode(p.opcode()),
            solicited: p.solicited() != 0,
            mig_req: p.mig_req() != 0,
            pad_count: p.pad_count(),
            tver: p.tver(),
            pkey: p.pkey(),
            fecn: p.fecn() != 0,
            becn: p.becn() != 0,
            dest_qpn: p.dest_qpn(),
            ack_req: p.ack_req() != 0,
            psn: Psn::new(p.psn_raw()),
        })
    }

    /// Write into a view; reserved bits are written as zero.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut Packet<T>) {
        p.set_opcode(self.opcode.0);
        p.set_solicited(u8::from(self.solicited));
        p.set_mig_req(u8::from(self.mig_req));
        p.set_pad_count(self.pad_count);
        p.set_tver(self.tver);
        p.set_pkey(self.pkey);
        p.set_fecn(u8::from(self.fecn));
        p.set_becn(u8::from(self.becn));
        p.set_resv6(0);
        p.set_dest_qpn(self.dest_qpn);
        p.set_ack_req(u8::from(self.ack_req));
        p.set_resv7(0);
        p.set_psn_raw(self.psn.value());
    }

    /// Header length.
    pub const fn buffer_len() -> usize {
        HEADER_LEN
    }

    /// Parse from bytes (checked).
    pub fn parse_bytes(b: &[u8]) -> Result<BthRepr> {
        BthRepr::parse(&Packet::new_checked(b)?)
    }

    /// Emit into bytes; `b` must hold 12 bytes.
    pub fn emit_bytes(&self, b: &mut [u8]) {
        self.emit(&mut Packet::new_unchecked(b))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The first READ request of rc_read.pcap: opcode 12, P_Key 0xffff,
    /// QPN 0x15, AckReq, PSN 15224777.
    const BYTES: [u8; 12] = [
        0x0c, 0x00, 0xff, 0xff, 0x00, 0x00, 0x00, 0x15, 0x80, 0xe8, 0x4f, 0xc9,
    ];

    #[test]
    fn deconstruct() {
        let p = Packet::new_checked(&BYTES[..]).unwrap();
        assert_eq!(p.opcode(), 12);
        assert_eq!(
            (p.solicited(), p.mig_req(), p.pad_count(), p.tver()),
            (0, 0, 0, 0)
        );
        assert_eq!(p.pkey(), 0xffff);
        assert_eq!(p.dest_qpn(), 0x15);
        assert_eq!(p.ack_req(), 1);
        assert_eq!(p.psn_raw(), 15224777);
    }

    #[test]
    fn construct_parse_emit() {
        let mut buf = [0xaau8; 12];
        let mut p = Packet::new_unchecked(&mut buf[..]);
        let r = BthRepr::parse(&Packet::new_checked(&BYTES[..]).unwrap()).unwrap();
        r.emit(&mut p);
        assert_eq!(buf, BYTES);
        let mut buf = [0u8; 12];
        let mut p = Packet::new_unchecked(&mut buf[..]);
        p.set_opcode(4);
        p.set_solicited(1);
        p.set_pad_count(3);
        p.set_pkey(0x7fff);
        p.set_fecn(1);
        p.set_dest_qpn(0x123456);
        p.set_psn_raw(0xabcdef);
        assert_eq!(
            buf,
            [0x04, 0xb0, 0x7f, 0xff, 0x80, 0x12, 0x34, 0x56, 0x00, 0xab, 0xcd, 0xef]
        );
        assert!(Packet::new_checked(&BYTES[..11]).is_err());
    }
}
