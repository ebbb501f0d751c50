//! A small macro that builds a header's zero-copy view from its field table.
//!
//! Each field is a big-endian unsigned integer over a byte range, optionally
//! narrowed by a mask (bit fields such as BTH's SE bit or 24-bit QPNs). The
//! macro writes `mod field` (the layout, readable against the spec), the
//! header length, and `Packet<T>` with `new_unchecked`, `new_checked`,
//! `into_inner`, getters, and setters when the buffer is mutable.

/// Read a big-endian unsigned integer from `bytes` (at most 8 bytes).
#[inline]
pub(crate) fn read_be(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0u64, |acc, b| (acc << 8) | u64::from(*b))
}

/// Write `v` big-endian into `bytes`.
#[inline]
pub(crate) fn write_be(bytes: &mut [u8], mut v: u64) {
    for b in bytes.iter_mut().rev() {
        *b = v as u8;
        v >>= 8;
    }
}

macro_rules! header_view {
    (
        $(#[$hm:meta])*
        len = $len:expr;
        $( $(#[$fm:meta])* $name:ident / $set:ident : $ty:ty = [$range:expr, $mask:expr] ),* $(,)?
    ) => {
        /// Byte ranges and bit masks of the header's fields.
        #[allow(non_upper_case_globals, dead_code)]
        pub mod field {
            $(
                #[doc = concat!("Bytes of `", stringify!($name), "`, and the mask of its bits in them.")]
                pub const $name: (core::ops::Range<usize>, u64) = ($range, $mask);
            )*
        }

        /// Length of the header in bytes.
        pub const HEADER_LEN: usize = $len;

        $(#[$hm])*
        #[derive(Debug, Clone, PartialEq, Eq)]
        pub struct Packet<T: AsRef<[u8]>> {
            buffer: T,
        }

        impl<T: AsRef<[u8]>> Packet<T> {
            /// Wrap a buffer without checking its length: getters and setters
            /// panic on a short buffer. Use `new_checked` for untrusted data.
            pub const fn new_unchecked(buffer: T) -> Self {
                Packet { buffer }
            }

            /// Wrap a buffer, checking once that it holds the whole header.
            pub fn new_checked(buffer: T) -> crate::Result<Self> {
                if buffer.as_ref().len() < HEADER_LEN {
                    Err(crate::Error::Truncated)
                } else {
                    Ok(Packet { buffer })
                }
            }

            /// The wrapped buffer.
            pub fn into_inner(self) -> T {
                self.buffer
            }

            $(
                $(#[$fm])*
                #[inline]
                pub fn $name(&self) -> $ty {
                    let (r, mask) = field::$name;
                    let v = crate::view::read_be(&self.buffer.as_ref()[r]) & mask;
                    (v >> mask.trailing_zeros()) as $ty
                }
            )*
        }

        impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
            $(
                #[doc = concat!("Set `", stringify!($name), "`; bits outside the field are kept.")]
                #[inline]
                pub fn $set(&mut self, value: $ty) {
                    let (r, mask) = field::$name;
                    let b = &mut self.buffer.as_mut()[r];
                    let old = crate::view::read_be(b);
                    let v = (old & !mask) | ((u64::from(value) << mask.trailing_zeros()) & mask);
                    crate::view::write_be(b, v);
                }
            )*
        }
    };
}
pub(crate) use header_view;
