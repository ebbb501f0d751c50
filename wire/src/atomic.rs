//! Atomic Extended Transport Header and Atomic ACK Extended Transport
//! Header (IBTA 9.3.3.2, 9.3.5.3; kernel `struct rxe_atmeth`, `rxe_atmack`).

use crate::Result;

crate::view::header_view! {
    /// A zero-copy view of an AtomicETH.
    len = 28;
    /// Virtual address of the 8-byte target (8-byte aligned).
    va / set_va: u64 = [0..8, u64::MAX],
    /// Remote key.
    rkey / set_rkey: u32 = [8..12, 0xffff_ffff],
    /// Swap value (CMP_SWAP) or addend (FETCH_ADD).
    swap_add / set_swap_add: u64 = [12..20, u64::MAX],
    /// Compare value (CMP_SWAP).
    compare / set_compare: u64 = [20..28, u64::MAX],
}

/// The meaning of an AtomicETH.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AtomicEthRepr {
    /// Virtual address of the target.
    pub va: u64,
    /// Remote key.
    pub rkey: u32,
    /// Swap value or addend.
    pub swap_add: u64,
    /// Compare value.
    pub compare: u64,
}

impl AtomicEthRepr {
    /// Parse a checked view.
    pub fn parse<T: AsRef<[u8]>>(p: &Packet<T>) -> Result<AtomicEthRepr> {
        Ok(AtomicEthRepr {
            va: p.va(),
            rkey: p.rkey(),
            swap_add: p.swap_add(),
            compare: p.compare(),
        })
    }

    /// Write into a view.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut Packet<T>) {
        p.set_va(self.va);
        p.set_rkey(self.rkey);
        p.set_swap_add(self.swap_add);
        p.set_compare(self.compare);
    }

    /// Header length.
    pub const fn buffer_len() -> usize {
        HEADER_LEN
    }
}

/// The Atomic ACK ETH: the original value at the target.
pub mod ack {
    use crate::Result;

    crate::view::header_view! {
        /// A zero-copy view of an AtomicAckETH.
        len = 8;
        /// The value the target held before the operation.
        orig / set_orig: u64 = [0..8, u64::MAX],
    }

    /// The meaning of an AtomicAckETH.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub struct AtomicAckRepr {
        /// The original value.
        pub orig: u64,
    }

    impl AtomicAckRepr {
        /// Parse a checked view.
        pub fn parse<T: AsRef<[u8]>>(p: &Packet<T>) -> Result<AtomicAckRepr> {
            Ok(AtomicAckRepr { orig: p.orig() })
        }

        /// Write into a view.
        pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut Packet<T>) {
            p.set_orig(self.orig);
        }

        /// Header length.
        pub const fn buffer_len() -> usize {
            HEADER_LEN
        }
    }
}

pub use ack::AtomicAckRepr;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let mut bytes = [0u8; 28];
        bytes[..8].copy_from_slice(&0x5607_ccc6_f000u64.to_be_bytes());
        bytes[8..12].copy_from_slice(&0x697u32.to_be_bytes());
        bytes[12..20].copy_from_slice(&1u64.to_be_bytes());
        bytes[20..28].copy_from_slice(&7u64.to_be_bytes());
        let p = Packet::new_checked(&bytes[..]).unwrap();
        let r = AtomicEthRepr::parse(&p).unwrap();
        assert_eq!(
            r,
            AtomicEthRepr {
                va: 0x5607_ccc6_f000,
                rkey: 0x697,
                swap_add: 1,
                compare: 7
            }
        );
        let mut buf = [0xffu8; 28];
        r.emit(&mut Packet::new_unchecked(&mut buf[..]));
        assert_eq!(buf, bytes);
        assert!(Packet::new_checked(&bytes[..27]).is_err());
        let a = [0, 0, 0, 0, 0, 0, 0x01, 0x02];
        let r = AtomicAckRepr::parse(&ack::Packet::new_checked(&a[..]).unwrap()).unwrap();
        assert_eq!(r.orig, 0x102);
        let mut buf = [0xffu8; 8];
        r.emit(&mut ack::Packet::new_unchecked(&mut buf[..]));
        assert_eq!(buf, a);
    }
}
