use crate::{Opcode, Psn};
pub const HEADER_LEN: usize = 12;
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
    pub fn parse_bytes(b: &[u8]) -> crate::Result<BthRepr> {
        if b.len() < 12 {
            return Err(crate::Error::Truncated);
        }
        Ok(BthRepr {
            opcode: Opcode(b[0]),
            solicited: b[1] & 0x80 != 0,
            mig_req: b[1] & 0x40 != 0,
            pad_count: (b[1] >> 4) & 3,
            tver: b[1] & 0xf,
            pkey: u16::from_be_bytes([b[2], b[3]]),
            fecn: b[4] & 0x80 != 0,
            becn: b[4] & 0x40 != 0,
            dest_qpn: u32::from_be_bytes([0, b[5], b[6], b[7]]),
            ack_req: b[8] & 0x80 != 0,
            psn: Psn::new(u32::from_be_bytes([0, b[9], b[10], b[11]])),
        })
    }
    pub fn emit_bytes(&self, b: &mut [u8]) {
        b[0] = self.opcode.0;
        b[1] = (u8::from(self.solicited) << 7)
            | (u8::from(self.mig_req) << 6)
            | ((self.pad_count & 3) << 4)
            | (self.tver & 0xf);
        b[2..4].copy_from_slice(&self.pkey.to_be_bytes());
        b[4] = (u8::from(self.fecn) << 7) | (u8::from(self.becn) << 6);
        b[5..8].copy_from_slice(&self.dest_qpn.to_be_bytes()[1..]);
        b[8] = u8::from(self.ack_req) << 7;
        b[9..12].copy_from_slice(&self.psn.value().to_be_bytes()[1..]);
    }
}
