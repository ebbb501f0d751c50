//! RDMA Extended Transport Header (IBTA 9.3.2; kernel `struct rxe_reth`).
use crate::Result;
crate::view::header_view! {
    /// A zero-copy view of the header.
    len = 16;
    /// Virtual address at the responder.
    va / set_va: u64 = [0..8, u64::MAX],
    /// Remote key.
    rkey / set_rkey: u32 = [8..12, 0xffff_ffff],
    /// DMA length of the whole message.
    dma_len / set_dma_len: u32 = [12..16, 0xffff_ffff],
}

/// The meaning of the header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RethRepr {
    /// Virtual address.
    pub va: u64,
    /// Remote key.
    pub rkey: u32,
    /// Length of the whole message.
    pub dma_len: u32,
}

impl RethRepr {
    /// Parse a checked view.
    pub fn parse<T: AsRef<[u8]>>(p: &Packet<T>) -> Result<RethRepr> {
        Ok(RethRepr {
            va: p.va(),
            rkey: p.rkey(),
            dma_len: p.dma_len(),
        })
    }

    /// Write into a view.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut Packet<T>) {
        p.set_va(self.va);
        p.set_rkey(self.rkey);
        p.set_dma_len(self.dma_len);
    }

    /// Header length.
    pub const fn buffer_len() -> usize {
        HEADER_LEN
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The RETH of the first READ request of rc_read.pcap.
    const BYTES: [u8; 16] = [
        0, 0, 0x56, 0x07, 0xcc, 0xc6, 0xf0, 0, 0, 0, 0x06, 0x97, 0, 0, 0x09, 0xc4,
    ];

    #[test]
    fn round_trip() {
        let p = Packet::new_checked(&BYTES[..]).unwrap();
        assert_eq!(
            (p.va(), p.rkey(), p.dma_len()),
            (0x5607_ccc6_f000, 0x697, 2500)
        );
        let r = RethRepr::parse(&p).unwrap();
        let mut buf = [0xffu8; 16];
        r.emit(&mut Packet::new_unchecked(&mut buf[..]));
        assert_eq!(buf, BYTES);
        assert!(Packet::new_checked(&BYTES[..15]).is_err());
    }
}
