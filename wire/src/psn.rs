//! 24-bit packet sequence numbers.
//!
//! The BTH carries a 24-bit PSN (IBTA Vol. 1, 9.2) that wraps from
//! 0xffffff to 0. Ordering is therefore circular: a PSN is "after" another
//! when it lies less than half the space (2^23) ahead of it. Kernel rxe
//! compares PSNs with `psn_compare()` (rxe_verbs.h), which shifts the 32-bit
//! difference left by 8 and reads it as signed; [`Psn::diff`] is that
//! comparison, and `Psn` deliberately implements neither `Ord` nor
//! `PartialOrd` so nobody compares PSNs as plain integers by mistake.

use core::fmt;

/// The 24 bits of a PSN (kernel `BTH_PSN_MASK`).
pub const PSN_MASK: u32 = 0x00ff_ffff;

/// A 24-bit packet sequence number with circular arithmetic.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Default)]
pub struct Psn(u32);

impl Psn {
    /// A PSN from the low 24 bits of `v` (the upper bits are dropped, as
    /// the kernel's `& BTH_PSN_MASK` does).
    pub const fn new(v: u32) -> Psn {
        Psn(v & PSN_MASK)
    }

    /// The PSN as an integer in `0..=0xffffff`.
    pub const fn value(self) -> u32 {
        self.0
    }

    /// `self + n`, wrapping at 2^24.
    #[allow(clippy::should_implement_trait)] // also available as `psn + n`
    pub fn add(self, n: u32) -> Psn {
        Psn::new(self.0.wrapping_add(n))
    }

    /// `self - n`, wrapping at 2^24.
    #[allow(clippy::should_implement_trait)] // also available as `psn - n`
    pub fn sub(self, n: u32) -> Psn {
        Psn::new(self.0.wrapping_sub(n))
    }

    /// The PSN of the next packet.
    pub fn next(self) -> Psn {
        self.add(1)
    }

    /// The signed distance `self - other` in `[-2^23, 2^23)`: positive when
    /// `self` is after `other`. Kernel rxe's `psn_compare(self, other)`
    /// has the same sign.
    pub fn diff(self, other: Psn) -> i32 {
        // Put the 24-bit difference in the top of an i32 and shift it back
        // down arithmetically, which sign-extends bit 23.
        ((self.0.wrapping_sub(other.0) << 8) as i32) >> 8
    }

    /// `self` comes strictly before `other` (circularly).
    pub fn is_before(self, other: Psn) -> bool {
        self.diff(other) < 0
    }

    /// `self` comes strictly after `other` (circularly).
    pub fn is_after(self, other: Psn) -> bool {
        self.diff(other) > 0
    }

    /// `self` comes before `other` or equals it.
    pub fn is_before_or_eq(self, other: Psn) -> bool {
        self.diff(other) <= 0
    }

    /// `self` comes after `other` or equals it.
    pub fn is_after_or_eq(self, other: Psn) -> bool {
        self.diff(other) >= 0
    }

    /// `start <= self < start + len`, modulo 2^24: whether `self` is one of
    /// the `len` PSNs beginning at `start` (a window of outstanding
    /// packets, for example kernel rxe's 128 unacknowledged PSNs). Every
    /// PSN is in a window of 2^24 or more.
    pub fn in_window(self, start: Psn, len: u32) -> bool {
        (self.0.wrapping_sub(start.0) & PSN_MASK) < len
    }
}

impl fmt::Display for Psn {
    /// Decimal, as perftest and `ibv_rc_pingpong` print PSNs, then hex, as
    /// tshark and the kernel's debug messages do: `15224777 (0xe84fc9)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({:#x})", self.0, self.0)
    }
}

impl core::ops::Add<u32> for Psn {
    type Output = Psn;
    fn add(self, n: u32) -> Psn {
        Psn::add(self, n)
    }
}

impl core::ops::Sub<u32> for Psn {
    type Output = Psn;
    fn sub(self, n: u32) -> Psn {
        Psn::sub(self, n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masks_to_24_bits() {
        assert_eq!(Psn::new(0x1234_5678).value(), 0x34_5678);
        assert_eq!(Psn::new(PSN_MASK).value(), PSN_MASK);
    }

    #[test]
    fn wraps_at_0xffffff() {
        let last = Psn::new(0xff_ffff);
        assert_eq!(last.next(), Psn::new(0));
        assert_eq!(Psn::new(0).sub(1), last);
        assert_eq!(last + 3, Psn::new(2));
        assert_eq!(Psn::new(2) - 3, last);
        assert_eq!(Psn::new(0).diff(last), 1);
        assert_eq!(last.diff(Psn::new(0)), -1);
        assert!(Psn::new(0).is_after(last));
        assert!(last.is_before(Psn::new(0)));
    }

    #[test]
    fn half_space_boundary_is_like_psn_compare() {
        let zero = Psn::new(0);
        // (0x800000 - 0) << 8 is i32::MIN in the kernel: "before".
        assert_eq!(Psn::new(0x80_0000).diff(zero), -(1 << 23));
        assert!(Psn::new(0x80_0000).is_before(zero));
        assert_eq!(Psn::new(0x7f_ffff).diff(zero), (1 << 23) - 1);
        assert!(Psn::new(0x7f_ffff).is_after(zero));
        assert!(zero.is_before_or_eq(zero) && zero.is_after_or_eq(zero));
        assert!(!zero.is_before(zero) && !zero.is_after(zero));
    }

    #[test]
    fn window_membership_across_the_wrap() {
        let start = Psn::new(0xff_fffe);
        assert!(start.in_window(start, 1));
        assert!(!start.in_window(start, 0));
        assert!(Psn::new(1).in_window(start, 4)); // fffffe ffffff 0 1
        assert!(!Psn::new(2).in_window(start, 4));
        assert!(!Psn::new(0xff_fffd).in_window(start, 4));
        assert!(Psn::new(0xff_fffd).in_window(start, 1 << 24));
    }

    #[test]
    fn display_is_decimal_then_hex() {
        assert_eq!(Psn::new(15_224_777).to_string(), "15224777 (0xe84fc9)");
    }
}
