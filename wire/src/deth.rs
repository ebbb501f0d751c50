//! Datagram Extended Transport Header: the Q_Key and source QP of a UD
//! (or RD) request (IBTA Vol. 1, 9.3; kernel `struct rxe_deth`).
//!
//! ```text
//!  byte 0-3    4      5-7
//!  Q_Key  | resv | SrcQP
//! ```

use crate::bytes::{self, header_view};
use crate::Result;

/// Byte layout of the DETH.
pub mod field {
    use crate::Field;
    /// Queue key, checked by the receiving UD QP.
    pub const QKEY: Field = 0..4;
    /// A reserved byte, then the source QP number (24 bits).
    pub const SQP: Field = 4..8;
}

/// Length of the DETH.
pub const HEADER_LEN: usize = field::SQP.end;

/// The source QP bits of `SQP` (kernel `DETH_SQP_MASK`).
pub const SQP_MASK: u32 = 0x00ff_ffff;

/// The well-known Q_Key of the General Services Interface, QP1 (kernel
/// `GSI_QKEY`): every CM MAD of the rdma_cm captures carries it.
pub const GSI_QKEY: u32 = 0x8001_0000;

header_view!("a Datagram Extended Transport Header");

impl<T: AsRef<[u8]>> Packet<T> {
    /// Queue key.
    pub fn qkey(&self) -> u32 {
        bytes::read(self.buffer.as_ref(), field::QKEY) as u32
    }

    /// The reserved byte before the source QP.
    pub fn resv(&self) -> u8 {
        bytes::read_bits(self.buffer.as_ref(), field::SQP, 0xff00_0000) as u8
    }

    /// Source QP number.
    pub fn src_qpn(&self) -> u32 {
        bytes::read_bits(self.buffer.as_ref(), field::SQP, SQP_MASK.into()) as u32
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Set the queue key.
    pub fn set_qkey(&mut self, value: u32) {
        bytes::write(self.buffer.as_mut(), field::QKEY, value.into())
    }

    /// Set the reserved byte.
    pub fn set_resv(&mut self, value: u8) {
        bytes::write_bits(self.buffer.as_mut(), field::SQP, 0xff00_0000, value.into())
    }

    /// Set the source QP number (low 24 bits of `value`).
    pub fn set_src_qpn(&mut self, value: u32) {
        bytes::write_bits(
            self.buffer.as_mut(),
            field::SQP,
            SQP_MASK.into(),
            value.into(),
        )
    }
}

/// The meaning of a DETH. The reserved byte is sent as zero (kernel
/// `__deth_set_sqp` masks it away) and ignored on receipt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DethRepr {
    /// Queue key.
    pub qkey: u32,
    /// Source QP number (24 bits).
    pub src_qpn: u32,
}

impl DethRepr {
    /// Read a DETH (`Truncated` if short).
    pub fn parse<T: AsRef<[u8]>>(packet: &Packet<T>) -> Result<DethRepr> {
        packet.check_len()?;
        Ok(DethRepr {
            qkey: packet.qkey(),
            src_qpn: packet.src_qpn(),
        })
    }

    /// Write the 8 bytes, the reserved byte as zero.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) {
        packet.set_qkey(self.qkey);
        packet.set_resv(0);
        packet.set_src_qpn(self.src_qpn);
    }

    /// Bytes `emit` writes.
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The DETH of the first UD SEND of ud_send.pcap (`ibv_ud_pingpong`,
    /// Q_Key 0x11111111, source QP 0x19).
    const UD_PINGPONG: [u8; 8] = [0x11, 0x11, 0x11, 0x11, 0x00, 0x00, 0x00, 0x19];

    #[test]
    fn deconstruct() {
        let p = Packet::new_checked(&UD_PINGPONG[..]).unwrap();
        assert_eq!(p.qkey(), 0x1111_1111);
        assert_eq!(p.resv(), 0);
        assert_eq!(p.src_qpn(), 0x19);
    }

    #[test]
    fn construct() {
        let mut p = Packet::new_unchecked([0u8; 8]);
        p.set_qkey(0x1111_1111);
        p.set_resv(0xab);
        p.set_src_qpn(0xff00_0019);
        assert_eq!(p.into_inner(), [0x11, 0x11, 0x11, 0x11, 0xab, 0, 0, 0x19]);
    }

    #[test]
    fn parse_emit_round_trip() {
        let r = DethRepr::parse(&Packet::new_checked(&UD_PINGPONG[..]).unwrap()).unwrap();
        assert_eq!(
            r,
            DethRepr {
                qkey: 0x1111_1111,
                src_qpn: 0x19
            }
        );
        let mut buf = [0xffu8; 8];
        r.emit(&mut Packet::new_unchecked(&mut buf[..]));
        assert_eq!(buf, UD_PINGPONG);
        assert_eq!(r.buffer_len(), 8);
        // The reserved byte is ignored on receipt.
        let mut dirty = UD_PINGPONG;
        dirty[4] = 0x5a;
        assert_eq!(
            DethRepr::parse(&Packet::new_checked(&dirty[..]).unwrap()),
            Ok(r)
        );
    }

    #[test]
    fn truncated() {
        assert!(Packet::new_checked(&UD_PINGPONG[..7]).is_err());
    }
}
