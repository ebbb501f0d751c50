//! Reliable Datagram Extended Transport Header: the end-to-end context of
//! an RD packet (IBTA Vol. 1, 9.3; kernel `struct rxe_rdeth`). Kernel rxe
//! has no RD service, but its opcode table lists the RD opcodes, so this
//! header exists for the table's completeness.
//!
//! ```text
//!  byte 0      1-3
//!  resv   | EE-context
//! ```

use crate::bytes::{self, header_view};
use crate::Result;

/// Byte layout of the RDETH.
pub mod field {
    use crate::Field;
    /// A reserved byte, then the EE context (24 bits).
    pub const EEN: Field = 0..4;
}

/// Length of the RDETH.
pub const HEADER_LEN: usize = field::EEN.end;

/// The EE-context bits of `EEN` (kernel `RDETH_EEN_MASK`).
pub const EEN_MASK: u32 = 0x00ff_ffff;

header_view!("a Reliable Datagram Extended Transport Header");

impl<T: AsRef<[u8]>> Packet<T> {
    /// The reserved byte.
    pub fn resv(&self) -> u8 {
        bytes::read_bits(self.buffer.as_ref(), field::EEN, 0xff00_0000) as u8
    }

    /// End-to-end context number.
    pub fn een(&self) -> u32 {
        bytes::read_bits(self.buffer.as_ref(), field::EEN, EEN_MASK.into()) as u32
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Set the reserved byte.
    pub fn set_resv(&mut self, value: u8) {
        bytes::write_bits(self.buffer.as_mut(), field::EEN, 0xff00_0000, value.into())
    }

    /// Set the end-to-end context number (low 24 bits of `value`).
    pub fn set_een(&mut self, value: u32) {
        bytes::write_bits(
            self.buffer.as_mut(),
            field::EEN,
            EEN_MASK.into(),
            value.into(),
        )
    }
}

/// The meaning of an RDETH.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RdethRepr {
    /// End-to-end context number (24 bits).
    pub een: u32,
}

impl RdethRepr {
    /// Read an RDETH; the reserved byte is ignored (`Truncated` if short).
    pub fn parse<T: AsRef<[u8]>>(packet: &Packet<T>) -> Result<RdethRepr> {
        packet.check_len()?;
        Ok(RdethRepr { een: packet.een() })
    }

    /// Write the 4 bytes, the reserved byte as zero (kernel
    /// `__rdeth_set_een` masks it away).
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) {
        packet.set_resv(0);
        packet.set_een(self.een);
    }

    /// Bytes `emit` writes.
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// No capture carries an RDETH (kernel rxe never sends RD); EE context
    /// 0x123456.
    const BYTES: [u8; 4] = [0x00, 0x12, 0x34, 0x56];

    #[test]
    fn deconstruct_construct() {
        let p = Packet::new_checked(&BYTES[..]).unwrap();
        assert_eq!((p.resv(), p.een()), (0, 0x12_3456));
        let mut p = Packet::new_unchecked([0u8; 4]);
        p.set_resv(0x99);
        p.set_een(0xff12_3456);
        assert_eq!(p.into_inner(), [0x99, 0x12, 0x34, 0x56]);
    }

    #[test]
    fn parse_emit_round_trip() {
        let dirty = [0x99, 0x12, 0x34, 0x56];
        let r = RdethRepr::parse(&Packet::new_checked(&dirty[..]).unwrap()).unwrap();
        assert_eq!(r, RdethRepr { een: 0x12_3456 });
        let mut buf = [0xffu8; 4];
        r.emit(&mut Packet::new_unchecked(&mut buf[..]));
        assert_eq!(buf, BYTES);
        assert_eq!(r.buffer_len(), 4);
        assert!(Packet::new_checked(&BYTES[..3]).is_err());
    }
}
