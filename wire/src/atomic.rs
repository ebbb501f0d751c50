//! Atomic Extended Transport Header (in CMP_SWAP and FETCH_ADD requests)
//! and, in [`ack`], the Atomic Acknowledge Extended Transport Header (in
//! atomic ACKs) (IBTA Vol. 1, 9.3; kernel `struct rxe_atmeth`, `struct
//! rxe_atmack`). Both operate on one 8-byte, 8-byte-aligned word.
//!
//! The AtomicETH is 28 bytes, not 32: kernel rxe declares it `__packed`,
//! so the 64-bit swap/add value starts at byte 12, right after the rkey.

use crate::bytes::{self, header_view};
use crate::Result;

/// Byte layout of the AtomicETH.
pub mod field {
    use crate::Field;
    /// Virtual address of the 8-byte target.
    pub const VA: Field = 0..8;
    /// Remote key.
    pub const RKEY: Field = 8..12;
    /// Swap value (CMP_SWAP) or addend (FETCH_ADD).
    pub const SWAP_ADD: Field = 12..20;
    /// Compare value (CMP_SWAP; unused by FETCH_ADD).
    pub const COMPARE: Field = 20..28;
}

/// Length of the AtomicETH.
pub const HEADER_LEN: usize = field::COMPARE.end;

header_view!("an Atomic Extended Transport Header");

impl<T: AsRef<[u8]>> Packet<T> {
    /// Virtual address of the target.
    pub fn va(&self) -> u64 {
        bytes::read(self.buffer.as_ref(), field::VA)
    }

    /// Remote key.
    pub fn rkey(&self) -> u32 {
        bytes::read(self.buffer.as_ref(), field::RKEY) as u32
    }

    /// Swap value or addend.
    pub fn swap_add(&self) -> u64 {
        bytes::read(self.buffer.as_ref(), field::SWAP_ADD)
    }

    /// Compare value.
    pub fn compare(&self) -> u64 {
        bytes::read(self.buffer.as_ref(), field::COMPARE)
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

    /// Set the swap value or addend.
    pub fn set_swap_add(&mut self, value: u64) {
        bytes::write(self.buffer.as_mut(), field::SWAP_ADD, value)
    }

    /// Set the compare value.
    pub fn set_compare(&mut self, value: u64) {
        bytes::write(self.buffer.as_mut(), field::COMPARE, value)
    }
}

/// The meaning of an AtomicETH.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AtomicEthRepr {
    /// Virtual address of the target.
    pub va: u64,
    /// Remote key.
    pub rkey: u32,
    /// Swap value (CMP_SWAP) or addend (FETCH_ADD).
    pub swap_add: u64,
    /// Compare value (CMP_SWAP).
    pub compare: u64,
}

impl AtomicEthRepr {
    /// Read an AtomicETH (every bit pattern is valid; `Truncated` if
    /// short). Alignment of `va` is the responder's business, not the
    /// wire's.
    pub fn parse<T: AsRef<[u8]>>(packet: &Packet<T>) -> Result<AtomicEthRepr> {
        packet.check_len()?;
        Ok(AtomicEthRepr {
            va: packet.va(),
            rkey: packet.rkey(),
            swap_add: packet.swap_add(),
            compare: packet.compare(),
        })
    }

    /// Write the 28 bytes.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) {
        packet.set_va(self.va);
        packet.set_rkey(self.rkey);
        packet.set_swap_add(self.swap_add);
        packet.set_compare(self.compare);
    }

    /// Bytes `emit` writes.
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }
}

/// The Atomic Acknowledge ETH: the value the target held before the
/// atomic operation.
pub mod ack {
    use crate::bytes::{self, header_view};
    use crate::Result;

    /// Byte layout of the AtomicAckETH.
    pub mod field {
        use crate::Field;
        /// The original value at the target.
        pub const ORIG: Field = 0..8;
    }

    /// Length of the AtomicAckETH.
    pub const HEADER_LEN: usize = field::ORIG.end;

    header_view!("an Atomic Acknowledge Extended Transport Header");

    impl<T: AsRef<[u8]>> Packet<T> {
        /// The original value at the target.
        pub fn orig(&self) -> u64 {
            bytes::read(self.buffer.as_ref(), field::ORIG)
        }
    }

    impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
        /// Set the original value.
        pub fn set_orig(&mut self, value: u64) {
            bytes::write(self.buffer.as_mut(), field::ORIG, value)
        }
    }

    /// The meaning of an AtomicAckETH.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub struct AtomicAckRepr {
        /// The value the target held before the operation.
        pub orig: u64,
    }

    impl AtomicAckRepr {
        /// Read an AtomicAckETH (`Truncated` if short).
        pub fn parse<T: AsRef<[u8]>>(packet: &Packet<T>) -> Result<AtomicAckRepr> {
            packet.check_len()?;
            Ok(AtomicAckRepr {
                orig: packet.orig(),
            })
        }

        /// Write the 8 bytes.
        pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) {
            packet.set_orig(self.orig);
        }

        /// Bytes `emit` writes.
        pub const fn buffer_len(&self) -> usize {
            HEADER_LEN
        }
    }
}

pub use ack::AtomicAckRepr;

#[cfg(test)]
mod tests {
    use super::*;

    /// The AtomicETH of the first FETCH_ADD of rc_atomic_fadd.pcap: VA
    /// 0x55896867e000, rkey 0x759, add 1, compare 0.
    const FETCH_ADD: [u8; 28] = [
        0x00, 0x00, 0x55, 0x89, 0x68, 0x67, 0xe0, 0x00, // VA
        0x00, 0x00, 0x07, 0x59, // rkey
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, // add
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // compare
    ];

    /// The AtomicAckETH of its atomic ACK: original value
    /// 0xc37469e6c94af846 (the target was not initialised by perftest).
    const ATOMIC_ACK: [u8; 8] = [0xc3, 0x74, 0x69, 0xe6, 0xc9, 0x4a, 0xf8, 0x46];

    const FETCH_ADD_REPR: AtomicEthRepr = AtomicEthRepr {
        va: 0x5589_6867_e000,
        rkey: 0x759,
        swap_add: 1,
        compare: 0,
    };

    #[test]
    fn deconstruct() {
        let p = Packet::new_checked(&FETCH_ADD[..]).unwrap();
        assert_eq!(p.va(), 0x5589_6867_e000);
        assert_eq!(p.rkey(), 0x759);
        assert_eq!((p.swap_add(), p.compare()), (1, 0));
        let a = ack::Packet::new_checked(&ATOMIC_ACK[..]).unwrap();
        assert_eq!(a.orig(), 0xc374_69e6_c94a_f846);
    }

    #[test]
    fn construct() {
        let mut p = Packet::new_unchecked([0xeeu8; 28]);
        p.set_va(0x5589_6867_e000);
        p.set_rkey(0x759);
        p.set_swap_add(1);
        p.set_compare(0);
        assert_eq!(p.into_inner(), FETCH_ADD);
        let mut a = ack::Packet::new_unchecked([0u8; 8]);
        a.set_orig(0xc374_69e6_c94a_f846);
        assert_eq!(a.into_inner(), ATOMIC_ACK);
    }

    #[test]
    fn parse_emit_round_trip() {
        let r = AtomicEthRepr::parse(&Packet::new_checked(&FETCH_ADD[..]).unwrap()).unwrap();
        assert_eq!(r, FETCH_ADD_REPR);
        let mut buf = [0xffu8; 28];
        r.emit(&mut Packet::new_unchecked(&mut buf[..]));
        assert_eq!(buf, FETCH_ADD);
        assert_eq!(r.buffer_len(), 28);

        let a = AtomicAckRepr::parse(&ack::Packet::new_checked(&ATOMIC_ACK[..]).unwrap()).unwrap();
        assert_eq!(a.orig, 0xc374_69e6_c94a_f846);
        let mut buf = [0u8; 8];
        a.emit(&mut ack::Packet::new_unchecked(&mut buf[..]));
        assert_eq!(buf, ATOMIC_ACK);
        assert_eq!(a.buffer_len(), 8);
    }

    #[test]
    fn truncated() {
        assert!(Packet::new_checked(&FETCH_ADD[..27]).is_err());
        assert!(ack::Packet::new_checked(&ATOMIC_ACK[..7]).is_err());
        assert!(AtomicAckRepr::parse(&ack::Packet::new_unchecked(&ATOMIC_ACK[..7])).is_err());
    }
}
