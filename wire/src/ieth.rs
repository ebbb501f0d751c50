//! Invalidate Extended Transport Header (IBTA 9.3.6): the rkey to invalidate.
use crate::Result;
crate::view::header_view! {
    /// A zero-copy view of the header.
    len = 4;
    /// The rkey the responder invalidates.
    rkey / set_rkey: u32 = [0..4, 0xffff_ffff],
}

/// The meaning of the header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IethRepr {
    /// The rkey to invalidate.
    pub rkey: u32,
}

impl IethRepr {
    /// Parse a checked view.
    pub fn parse<T: AsRef<[u8]>>(p: &Packet<T>) -> Result<IethRepr> {
        Ok(IethRepr { rkey: p.rkey() })
    }

    /// Write into a view.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut Packet<T>) {
        p.set_rkey(self.rkey);
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
        let bytes = [0x00, 0x01, 0x00, 0x5a];
        let r = IethRepr::parse(&Packet::new_checked(&bytes[..]).unwrap()).unwrap();
        assert_eq!(r.rkey, 0x1005a);
        let mut buf = [0u8; 4];
        r.emit(&mut Packet::new_unchecked(&mut buf[..]));
        assert_eq!(buf, bytes);
    }
}
