//! Big-endian access to header fields, and the common part of every
//! header's `Packet<T>` view.
//!
//! Every InfiniBand header field goes on the wire most significant byte
//! first (the IBTA's big-endian convention); kernel rxe reads them with
//! `be32_to_cpu` and friends.

use crate::Field;

/// Read `field` of `data` as a big-endian unsigned integer (at most 8
/// bytes). Panics if `data` is shorter than `field.end`: views only call it
/// after `check_len`, as smoltcp's do.
#[inline]
pub(crate) fn read(data: &[u8], field: Field) -> u64 {
    data[field]
        .iter()
        .fold(0u64, |acc, b| (acc << 8) | u64::from(*b))
}

/// Write the low bytes of `value` big-endian into `field` of `data`.
#[inline]
pub(crate) fn write(data: &mut [u8], field: Field, mut value: u64) {
    for b in data[field].iter_mut().rev() {
        *b = value as u8;
        value >>= 8;
    }
}

/// Read the bits `mask` of a big-endian field, shifted down to bit 0.
#[inline]
pub(crate) fn read_bits(data: &[u8], field: Field, mask: u64) -> u64 {
    (read(data, field) & mask) >> mask.trailing_zeros()
}

/// Replace the bits `mask` of a big-endian field with `value` (shifted up
/// into place and truncated to the mask), keeping the other bits.
#[inline]
pub(crate) fn write_bits(data: &mut [u8], field: Field, mask: u64, value: u64) {
    let old = read(data, field.clone());
    let new = (old & !mask) | ((value << mask.trailing_zeros()) & mask);
    write(data, field, new);
}

/// The part of a header view that is the same for every header: the
/// struct, `new_unchecked`, `new_checked`, `check_len`, `into_inner`.
/// Getters and setters are written out in each header's module, next to
/// its `mod field`.
macro_rules! header_view {
    ($what:literal) => {
        #[doc = concat!("A read/write view of ", $what, " over a byte buffer, without copying.")]
        ///
        /// Make it with `new_checked`, which validates the length once; the
        /// getters and setters then index without further checks (like
        /// smoltcp's views), so a view made with `new_unchecked` over a
        /// buffer shorter than [`HEADER_LEN`] panics when a field is
        /// accessed.
        #[derive(Debug, Clone, PartialEq, Eq)]
        pub struct Packet<T: AsRef<[u8]>> {
            buffer: T,
        }

        impl<T: AsRef<[u8]>> Packet<T> {
            /// Wrap a buffer without checking its length (for buffers this
            /// program sized itself).
            pub const fn new_unchecked(buffer: T) -> Packet<T> {
                Packet { buffer }
            }

            /// Wrap a buffer, checking once that it holds the whole header:
            /// the way to view untrusted bytes.
            pub fn new_checked(buffer: T) -> $crate::Result<Packet<T>> {
                let packet = Packet::new_unchecked(buffer);
                packet.check_len()?;
                Ok(packet)
            }

            /// `Err(Error::Truncated)` if the buffer is shorter than
            /// [`HEADER_LEN`]. Bytes after the header are allowed: they are
            /// the next header or the payload.
            pub fn check_len(&self) -> $crate::Result<()> {
                if self.buffer.as_ref().len() < HEADER_LEN {
                    Err($crate::Error::Truncated)
                } else {
                    Ok(())
                }
            }

            /// The wrapped buffer.
            pub fn into_inner(self) -> T {
                self.buffer
            }
        }

        impl<T: AsRef<[u8]>> AsRef<[u8]> for Packet<T> {
            fn as_ref(&self) -> &[u8] {
                self.buffer.as_ref()
            }
        }
    };
}
pub(crate) use header_view;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn big_endian_fields_and_bits() {
        let mut b = [0u8; 6];
        write(&mut b, 1..5, 0x1234_5678);
        assert_eq!(b, [0, 0x12, 0x34, 0x56, 0x78, 0]);
        assert_eq!(read(&b, 1..5), 0x1234_5678);
        write_bits(&mut b, 1..5, 0x00ff_ffff, 0xab_cdef);
        assert_eq!(b, [0, 0x12, 0xab, 0xcd, 0xef, 0]);
        assert_eq!(read_bits(&b, 1..5, 0xff00_0000), 0x12);
        // A value wider than the mask is truncated, not spilled.
        write_bits(&mut b, 0..1, 0x30, 0xff);
        assert_eq!(b[0], 0x30);
    }
}
