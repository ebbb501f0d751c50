//! Reliable Datagram Extended Transport Header (IBTA 9.3.1), for the RD opcodes of the table.
use crate::Result;
crate::view::header_view! {
    /// A zero-copy view of the header.
    len = 4;
    /// Reserved byte.
    resv / set_resv: u8 = [0..1, 0xff],
    /// End-to-end context (24 bits).
    een / set_een: u32 = [1..4, 0xff_ffff],
}

/// The meaning of the header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RdethRepr {
    /// End-to-end context number.
    pub een: u32,
}

impl RdethRepr {
    /// Parse a checked view.
    pub fn parse<T: AsRef<[u8]>>(p: &Packet<T>) -> Result<RdethRepr> {
        Ok(RdethRepr { een: p.een() })
    }

    /// Write into a view.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut Packet<T>) {
        p.set_resv(0);
        p.set_een(self.een);
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
        let bytes = [0, 0x12, 0x34, 0x56];
        let r = RdethRepr::parse(&Packet::new_checked(&bytes[..]).unwrap()).unwrap();
        assert_eq!(r.een, 0x123456);
        let mut buf = [0xffu8; 4];
        r.emit(&mut Packet::new_unchecked(&mut buf[..]));
        assert_eq!(buf, bytes);
    }
}
