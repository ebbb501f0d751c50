//! Immediate Data Extended Transport Header (IBTA 9.3.5).
use crate::Result;
crate::view::header_view! {
    /// A zero-copy view of the header.
    len = 4;
    /// Immediate data, as on the wire (big-endian).
    imm / set_imm: u32 = [0..4, 0xffff_ffff],
}

/// The meaning of the header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ImmDtRepr {
    /// The 32-bit value read big-endian.
    pub imm: u32,
}

impl ImmDtRepr {
    /// Parse a checked view.
    pub fn parse<T: AsRef<[u8]>>(p: &Packet<T>) -> Result<ImmDtRepr> {
        Ok(ImmDtRepr { imm: p.imm() })
    }

    /// Write into a view.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut Packet<T>) {
        p.set_imm(self.imm);
    }

    /// Header length.
    pub const fn buffer_len() -> usize {
        HEADER_LEN
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let bytes = [0x12, 0x34, 0x56, 0x78];
        let r = ImmDtRepr::parse(&Packet::new_checked(&bytes[..]).unwrap()).unwrap();
        assert_eq!(r.imm, 0x1234_5678);
        let mut buf = [0u8; 4];
        r.emit(&mut Packet::new_unchecked(&mut buf[..]));
        assert_eq!(buf, bytes);
    }
}
