//! XRC Extended Transport Header: the XRC SRQ a request is for (IBTA Vol.
//! 1, Annex A14 "Extended Reliable Connected Transport Service"). Every
//! XRC request carries it right after the BTH; responses (ACKs, READ
//! responses, atomic ACKs) do not.
//!
//! ```text
//!  byte 0   1-3
//!  resv | XRC SRQ number
//! ```

use crate::bytes::{self, header_view};
use crate::Result;

/// Byte layout of the XRCETH.
pub mod field {
    use crate::Field;
    /// A reserved byte, then the XRC SRQ number (24 bits).
    pub const SRQN: Field = 0..4;
}

/// Length of the XRCETH.
pub const HEADER_LEN: usize = field::SRQN.end;

/// The SRQ number bits of `SRQN`.
pub const SRQN_MASK: u32 = 0x00ff_ffff;

header_view!("an XRC Extended Transport Header");

impl<T: AsRef<[u8]>> Packet<T> {
    /// The reserved byte.
    pub fn resv(&self) -> u8 {
        bytes::read_bits(self.buffer.as_ref(), field::SRQN, 0xff00_0000) as u8
    }

    /// The XRC SRQ number the request is for.
    pub fn srqn(&self) -> u32 {
        bytes::read_bits(self.buffer.as_ref(), field::SRQN, SRQN_MASK.into()) as u32
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Set the reserved byte.
    pub fn set_resv(&mut self, value: u8) {
        bytes::write_bits(self.buffer.as_mut(), field::SRQN, 0xff00_0000, value.into())
    }

    /// Set the XRC SRQ number (its low 24 bits).
    pub fn set_srqn(&mut self, value: u32) {
        bytes::write_bits(
            self.buffer.as_mut(),
            field::SRQN,
            SRQN_MASK.into(),
            (value & SRQN_MASK).into(),
        )
    }
}

/// The meaning of an XRCETH.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct XrcEthRepr {
    /// The XRC SRQ number (24 bits).
    pub srqn: u32,
}

impl XrcEthRepr {
    /// Read an XRCETH (`Truncated` if short). The reserved byte is ignored,
    /// as IBTA asks of receivers.
    pub fn parse<T: AsRef<[u8]>>(packet: &Packet<T>) -> Result<XrcEthRepr> {
        packet.check_len()?;
        Ok(XrcEthRepr {
            srqn: packet.srqn(),
        })
    }

    /// Write the 4 bytes (reserved byte 0).
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) {
        packet.set_resv(0);
        packet.set_srqn(self.srqn);
    }

    /// Bytes `emit` writes.
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// XRC SRQ 0x123456 with a reserved byte the sender set (ignored).
    const BYTES: [u8; 4] = [0x00, 0x12, 0x34, 0x56];

    #[test]
    fn deconstruct_construct() {
        let p = Packet::new_checked(&BYTES[..]).unwrap();
        assert_eq!((p.resv(), p.srqn()), (0, 0x12_3456));
        let mut q = Packet::new_unchecked([0xffu8; 4]);
        q.set_resv(0);
        q.set_srqn(0xff12_3456);
        assert_eq!(q.into_inner(), BYTES, "only 24 bits of the SRQ number");
    }

    #[test]
    fn parse_emit_round_trip_and_truncation() {
        let r = XrcEthRepr::parse(&Packet::new_checked(&[0xee, 0x12, 0x34, 0x56][..]).unwrap())
            .unwrap();
        assert_eq!(r, XrcEthRepr { srqn: 0x12_3456 });
        let mut out = [0xffu8; 4];
        r.emit(&mut Packet::new_unchecked(&mut out[..]));
        assert_eq!(out, BYTES);
        assert_eq!(
            Packet::new_checked(&BYTES[..3]),
            Err(crate::Error::Truncated)
        );
    }
}
