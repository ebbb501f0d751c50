//! RDMA Extended Transport Header: where an RDMA WRITE, READ, FLUSH or
//! ATOMIC WRITE lands at the responder (IBTA Vol. 1, 9.3; kernel `struct
//! rxe_reth`). It is in the first packet of a WRITE, in every READ request
//! (and in kernel rxe's retried READ requests, which resume at an
//! offset), and in FLUSH and ATOMIC WRITE.

use crate::bytes::{self, header_view};
use crate::Result;

/// Byte layout of the RETH.
pub mod field {
    use crate::Field;
    /// Virtual address at the responder.
    pub const VA: Field = 0..8;
    /// Remote key of the responder's memory region or window.
    pub const RKEY: Field = 8..12;
    /// Length in bytes of the whole message (not of this packet).
    pub const DMA_LEN: Field = 12..16;
}

/// Length of the RETH.
pub const HEADER_LEN: usize = field::DMA_LEN.end;

header_view!("an RDMA Extended Transport Header");

impl<T: AsRef<[u8]>> Packet<T> {
    /// Virtual address at the responder.
    pub fn va(&self) -> u64 {
        bytes::read(self.buffer.as_ref(), field::VA)
    }

    /// Remote key.
    pub fn rkey(&self) -> u32 {
        bytes::read(self.buffer.as_ref(), field::RKEY) as u32
    }

    /// Length of the whole message.
    pub fn dma_len(&self) -> u32 {
        bytes::read(self.buffer.as_ref(), field::DMA_LEN) as u32
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Set the virtual address.
    pub fn set_va(&mut self, value: u64) {
        bytes::write(self.buffer.as_mut(), field::VA, value)
    }

    /// Set the remote key.
    pub fn set_rkey(&mut self, value: u32) {
        bytes::write(self.buffer.as_mut(), field::RKEY, value.into())
    }

    /// Set the message length.
    pub fn set_dma_len(&mut self, value: u32) {
        bytes::write(self.buffer.as_mut(), field::DMA_LEN, value.into())
    }
}

/// The meaning of a RETH.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RethRepr {
    /// Virtual address at the responder.
    pub va: u64,
    /// Remote key.
    pub rkey: u32,
    /// Length of the whole message.
    pub dma_len: u32,
}

impl RethRepr {
    /// Read a RETH (every bit pattern is valid; `Truncated` if short).
    pub fn parse<T: AsRef<[u8]>>(packet: &Packet<T>) -> Result<RethRepr> {
        packet.check_len()?;
        Ok(RethRepr {
            va: packet.va(),
            rkey: packet.rkey(),
            dma_len: packet.dma_len(),
        })
    }

    /// Write the 16 bytes.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) {
        packet.set_va(self.va);
        packet.set_rkey(self.rkey);
        packet.set_dma_len(self.dma_len);
    }

    /// Bytes `emit` writes.
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The RETH of the first READ request of rc_read.pcap: VA
    /// 0x5607ccc6f000, rkey 0x697, 2500 bytes.
    const BYTES: [u8; 16] = [
        0x00, 0x00, 0x56, 0x07, 0xcc, 0xc6, 0xf0, 0x00, 0x00, 0x00, 0x06, 0x97, 0x00, 0x00, 0x09,
        0xc4,
    ];

    const REPR: RethRepr = RethRepr {
        va: 0x5607_ccc6_f000,
        rkey: 0x697,
        dma_len: 2500,
    };

    #[test]
    fn deconstruct() {
        let p = Packet::new_checked(&BYTES[..]).unwrap();
        assert_eq!(p.va(), 0x5607_ccc6_f000);
        assert_eq!(p.rkey(), 0x697);
        assert_eq!(p.dma_len(), 2500);
    }

    #[test]
    fn construct() {
        let mut p = Packet::new_unchecked([0u8; 16]);
        p.set_va(0x5607_ccc6_f000);
        p.set_rkey(0x697);
        p.set_dma_len(2500);
        assert_eq!(p.into_inner(), BYTES);
    }

    #[test]
    fn parse_emit_round_trip() {
        let r = RethRepr::parse(&Packet::new_checked(&BYTES[..]).unwrap()).unwrap();
        assert_eq!(r, REPR);
        let mut buf = [0xffu8; 16];
        r.emit(&mut Packet::new_unchecked(&mut buf[..]));
        assert_eq!(buf, BYTES);
        assert_eq!(r.buffer_len(), 16);
    }

    #[test]
    fn truncated() {
        assert!(Packet::new_checked(&BYTES[..15]).is_err());
        assert!(RethRepr::parse(&Packet::new_unchecked(&BYTES[..15])).is_err());
    }
}
