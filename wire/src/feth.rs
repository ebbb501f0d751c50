//! FLUSH Extended Transport Header: what a FLUSH makes persistent or
//! visible (IBTA Vol. 1 Annex A19, Memory Placement Extensions, A19.4.1;
//! kernel `struct rxe_feth`, `FETH_PLT_MASK`, `FETH_SEL_MASK`).
//!
//! One big-endian 32-bit word: bits 3-0 placement type, bits 5-4
//! selectivity level, the rest reserved. It comes right after the BTH, before
//! the FLUSH's RETH (kernel `IB_OPCODE_RC_FLUSH` offsets).

use crate::bytes::{self, header_view};
use crate::Result;

/// Byte layout of the FETH.
pub mod field {
    use crate::Field;
    /// Reserved bits, selectivity level and placement type.
    pub const BITS: Field = 0..4;
}

/// Length of the FETH.
pub const HEADER_LEN: usize = field::BITS.end;

/// Placement type, bits 3-0 of `BITS` (kernel `FETH_PLT_MASK`): 1 = global
/// visibility, 2 = persistence.
pub const PLACEMENT_MASK: u32 = 0x0000_000f;
/// Selectivity level, bits 5-4 of `BITS` (kernel `FETH_SEL_MASK`): 0 =
/// the memory region range in the RETH, 1 = the whole memory region.
pub const SELECTIVITY_MASK: u32 = 0x0000_0030;
/// The reserved bits of `BITS`.
pub const RESERVED_MASK: u32 = !(PLACEMENT_MASK | SELECTIVITY_MASK);

header_view!("a FLUSH Extended Transport Header");

impl<T: AsRef<[u8]>> Packet<T> {
    fn get(&self, mask: u32) -> u32 {
        bytes::read_bits(self.buffer.as_ref(), field::BITS, mask.into()) as u32
    }

    /// Selectivity level (2 bits).
    pub fn selectivity(&self) -> u8 {
        self.get(SELECTIVITY_MASK) as u8
    }

    /// Placement type (4 bits).
    pub fn placement(&self) -> u8 {
        self.get(PLACEMENT_MASK) as u8
    }

    /// The reserved bits, in place (not shifted).
    pub fn reserved(&self) -> u32 {
        self.get(RESERVED_MASK) << RESERVED_MASK.trailing_zeros()
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    fn put(&mut self, mask: u32, value: u32) {
        bytes::write_bits(self.buffer.as_mut(), field::BITS, mask.into(), value.into())
    }

    /// Set the selectivity level (low 2 bits of `value`).
    pub fn set_selectivity(&mut self, value: u8) {
        self.put(SELECTIVITY_MASK, value.into())
    }

    /// Set the placement type (low 4 bits of `value`).
    pub fn set_placement(&mut self, value: u8) {
        self.put(PLACEMENT_MASK, value.into())
    }

    /// Set the reserved bits (given in place; bits outside
    /// [`RESERVED_MASK`] are ignored).
    pub fn set_reserved(&mut self, value: u32) {
        self.put(RESERVED_MASK, value >> RESERVED_MASK.trailing_zeros())
    }
}

/// The meaning of a FETH (kernel `feth_init(pkt, type, level)`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FethRepr {
    /// Selectivity level (2 bits).
    pub selectivity: u8,
    /// Placement type (4 bits).
    pub placement: u8,
}

impl FethRepr {
    /// Read a FETH; reserved bits are ignored (`Truncated` if short).
    pub fn parse<T: AsRef<[u8]>>(packet: &Packet<T>) -> Result<FethRepr> {
        packet.check_len()?;
        Ok(FethRepr {
            selectivity: packet.selectivity(),
            placement: packet.placement(),
        })
    }

    /// Write the 4 bytes, reserved bits as zero; wider values are
    /// truncated to their fields, as the kernel's masks do.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) {
        packet.set_reserved(0);
        packet.set_selectivity(self.selectivity);
        packet.set_placement(self.placement);
    }

    /// Bytes `emit` writes.
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// No capture carries a FETH (Linux 6.1 predates FLUSH); these bytes
    /// are what kernel `feth_init(pkt, 2 /* persistence */, 1 /* whole MR */)`
    /// writes.
    const BYTES: [u8; 4] = [0x00, 0x00, 0x00, 0x12];

    #[test]
    fn deconstruct_construct() {
        let p = Packet::new_checked(&BYTES[..]).unwrap();
        assert_eq!((p.selectivity(), p.placement(), p.reserved()), (1, 2, 0));
        let mut p = Packet::new_unchecked([0u8; 4]);
        p.set_selectivity(1);
        p.set_placement(2);
        assert_eq!(p.clone().into_inner(), BYTES);
        p.set_reserved(0xffff_ffc0);
        assert_eq!(p.into_inner(), [0xff, 0xff, 0xff, 0xd2]);
    }

    #[test]
    fn parse_emit_round_trip() {
        let r = FethRepr::parse(&Packet::new_checked(&BYTES[..]).unwrap()).unwrap();
        assert_eq!(
            r,
            FethRepr {
                selectivity: 1,
                placement: 2
            }
        );
        let mut buf = [0xffu8; 4];
        r.emit(&mut Packet::new_unchecked(&mut buf[..]));
        assert_eq!(buf, BYTES);
        assert_eq!(r.buffer_len(), 4);
        // Reserved bits are ignored on receipt.
        let dirty = [0xff, 0xff, 0xff, 0xd2];
        assert_eq!(
            FethRepr::parse(&Packet::new_checked(&dirty[..]).unwrap()),
            Ok(r)
        );
        assert!(Packet::new_checked(&BYTES[..3]).is_err());
    }
}
