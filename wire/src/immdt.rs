//! Immediate Data Extended Transport Header: 4 bytes the requester hands
//! to the responder's completion (SEND or RDMA WRITE "with immediate";
//! IBTA Vol. 1, 9.3; kernel `struct rxe_immdt`).
//!
//! The value is opaque to the transport: kernel rxe copies the `__be32`
//! through unchanged into `wc.ex.imm_data`, so the verbs user sees the
//! bytes in wire order. [`ImmDtRepr::imm`] is those 4 bytes read
//! big-endian; `imm.to_be_bytes()` gives them back.

use crate::bytes::{self, header_view};
use crate::Result;

/// Byte layout of the ImmDt.
pub mod field {
    use crate::Field;
    /// The immediate data.
    pub const IMM: Field = 0..4;
}

/// Length of the ImmDt.
pub const HEADER_LEN: usize = field::IMM.end;

header_view!("an Immediate Data Extended Transport Header");

impl<T: AsRef<[u8]>> Packet<T> {
    /// The immediate data, read big-endian.
    pub fn imm(&self) -> u32 {
        bytes::read(self.buffer.as_ref(), field::IMM) as u32
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Set the immediate data (written big-endian).
    pub fn set_imm(&mut self, value: u32) {
        bytes::write(self.buffer.as_mut(), field::IMM, value.into())
    }
}

/// The meaning of an ImmDt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ImmDtRepr {
    /// The 4 wire bytes read as a big-endian integer.
    pub imm: u32,
}

impl ImmDtRepr {
    /// Read an ImmDt (`Truncated` if short).
    pub fn parse<T: AsRef<[u8]>>(packet: &Packet<T>) -> Result<ImmDtRepr> {
        packet.check_len()?;
        Ok(ImmDtRepr { imm: packet.imm() })
    }

    /// Write the 4 bytes.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) {
        packet.set_imm(self.imm);
    }

    /// Bytes `emit` writes.
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// No capture carries immediate data; these bytes are the IBTA layout
    /// of the value 0x12345678.
    const BYTES: [u8; 4] = [0x12, 0x34, 0x56, 0x78];

    #[test]
    fn deconstruct_construct() {
        assert_eq!(Packet::new_checked(&BYTES[..]).unwrap().imm(), 0x1234_5678);
        let mut p = Packet::new_unchecked([0u8; 4]);
        p.set_imm(0x1234_5678);
        assert_eq!(p.into_inner(), BYTES);
    }

    #[test]
    fn parse_emit_round_trip() {
        let r = ImmDtRepr::parse(&Packet::new_checked(&BYTES[..]).unwrap()).unwrap();
        assert_eq!(r, ImmDtRepr { imm: 0x1234_5678 });
        assert_eq!(r.imm.to_be_bytes(), BYTES);
        let mut buf = [0u8; 4];
        r.emit(&mut Packet::new_unchecked(&mut buf[..]));
        assert_eq!(buf, BYTES);
        assert_eq!(r.buffer_len(), 4);
        assert!(Packet::new_checked(&BYTES[..3]).is_err());
    }
}
