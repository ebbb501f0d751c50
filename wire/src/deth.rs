//! Datagram Extended Transport Header (IBTA 9.3.3; kernel `struct rxe_deth`).
use crate::Result;
crate::view::header_view! {
    /// A zero-copy view of the header.
    len = 8;
    /// Queue key.
    qkey / set_qkey: u32 = [0..4, 0xffff_ffff],
    /// Reserved byte.
    resv / set_resv: u8 = [4..5, 0xff],
    /// Source QP number (24 bits).
    src_qpn / set_src_qpn: u32 = [5..8, 0xff_ffff],
}

/// The meaning of the header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DethRepr {
    /// Queue key.
    pub qkey: u32,
    /// Source QP number (24 bits).
    pub src_qpn: u32,
}

impl DethRepr {
    /// Parse a checked view.
    pub fn parse<T: AsRef<[u8]>>(p: &Packet<T>) -> Result<DethRepr> {
        Ok(DethRepr {
            qkey: p.qkey(),
            src_qpn: p.src_qpn(),
        })
    }

    /// Write into a view.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut Packet<T>) {
        p.set_qkey(self.qkey);
        p.set_resv(0);
        p.set_src_qpn(self.src_qpn);
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
        let bytes = [0x80, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x19];
        let p = Packet::new_checked(&bytes[..]).unwrap();
        assert_eq!((p.qkey(), p.src_qpn()), (0x8001_0000, 0x19));
        let mut buf = [0xffu8; 8];
        DethRepr::parse(&p)
            .unwrap()
            .emit(&mut Packet::new_unchecked(&mut buf[..]));
        assert_eq!(buf, bytes);
        assert!(Packet::new_checked(&bytes[..7]).is_err());
    }
}
