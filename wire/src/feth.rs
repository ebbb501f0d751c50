//! FLUSH Extended Transport Header (IBTA 1.5 A19; kernel rxe_hdr.h `FETH_SEL_MASK`, `FETH_PLT_MASK`).
use crate::Result;
crate::view::header_view! {
    /// A zero-copy view of the header.
    len = 4;
    /// Reserved bits.
    resv / set_resv: u32 = [0..4, 0xffff_ffc0],
    /// Selectivity level (2 bits).
    selectivity / set_selectivity: u8 = [0..4, 0x30],
    /// Placement type (4 bits).
    placement / set_placement: u8 = [0..4, 0x0f],
}

/// The meaning of the header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FethRepr {
    /// Selectivity level.
    pub selectivity: u8,
    /// Placement type.
    pub placement: u8,
}

impl FethRepr {
    /// Parse a checked view.
    pub fn parse<T: AsRef<[u8]>>(p: &Packet<T>) -> Result<FethRepr> {
        Ok(FethRepr {
            selectivity: p.selectivity(),
            placement: p.placement(),
        })
    }

    /// Write into a view.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut Packet<T>) {
        p.set_resv(0);
        p.set_selectivity(self.selectivity);
        p.set_placement(self.placement);
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
        let bytes = [0, 0, 0, 0x13];
        let r = FethRepr::parse(&Packet::new_checked(&bytes[..]).unwrap()).unwrap();
        assert_eq!((r.selectivity, r.placement), (1, 3));
        let mut buf = [0xffu8; 4];
        r.emit(&mut Packet::new_unchecked(&mut buf[..]));
        assert_eq!(buf, bytes);
    }
}
