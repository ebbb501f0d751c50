//! Invalidate Extended Transport Header: the rkey a SEND with invalidate
//! asks the responder to invalidate (IBTA Vol. 1, 9.3; kernel `struct
//! rxe_ieth`).

use crate::bytes::{self, header_view};
use crate::Result;

/// Byte layout of the IETH.
pub mod field {
    use crate::Field;
    /// The rkey to invalidate.
    pub const RKEY: Field = 0..4;
}

/// Length of the IETH.
pub const HEADER_LEN: usize = field::RKEY.end;

header_view!("an Invalidate Extended Transport Header");

impl<T: AsRef<[u8]>> Packet<T> {
    /// The rkey to invalidate.
    pub fn rkey(&self) -> u32 {
        bytes::read(self.buffer.as_ref(), field::RKEY) as u32
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Set the rkey to invalidate.
    pub fn set_rkey(&mut self, value: u32) {
        bytes::write(self.buffer.as_mut(), field::RKEY, value.into())
    }
}

/// The meaning of an IETH.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IethRepr {
    /// The rkey to invalidate.
    pub rkey: u32,
}

impl IethRepr {
    /// Read an IETH (`Truncated` if short).
    pub fn parse<T: AsRef<[u8]>>(packet: &Packet<T>) -> Result<IethRepr> {
        packet.check_len()?;
        Ok(IethRepr {
            rkey: packet.rkey(),
        })
    }

    /// Write the 4 bytes.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) {
        packet.set_rkey(self.rkey);
    }

    /// Bytes `emit` writes.
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// No capture carries an IETH; these bytes invalidate rkey 0x1005a
    /// (kernel rxe's rkeys are `index << 8 | key`).
    const BYTES: [u8; 4] = [0x00, 0x01, 0x00, 0x5a];

    #[test]
    fn deconstruct_construct() {
        assert_eq!(Packet::new_checked(&BYTES[..]).unwrap().rkey(), 0x1005a);
        let mut p = Packet::new_unchecked([0xffu8; 4]);
        p.set_rkey(0x1005a);
        assert_eq!(p.into_inner(), BYTES);
    }

    #[test]
    fn parse_emit_round_trip() {
        let r = IethRepr::parse(&Packet::new_checked(&BYTES[..]).unwrap()).unwrap();
        assert_eq!(r, IethRepr { rkey: 0x1005a });
        let mut buf = [0u8; 4];
        r.emit(&mut Packet::new_unchecked(&mut buf[..]));
        assert_eq!(buf, BYTES);
        assert_eq!(r.buffer_len(), 4);
        assert!(Packet::new_checked(&BYTES[..3]).is_err());
    }
}
