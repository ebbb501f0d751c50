pub const PSN_MASK: u32 = 0x00ff_ffff;
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Default)]
pub struct Psn(u32);
impl Psn {
    pub const fn new(v: u32) -> Psn {
        Psn(v & PSN_MASK)
    }
    pub const fn value(self) -> u32 {
        self.0
    }
    #[allow(clippy::should_implement_trait)] // also implemented as `+`
    pub fn add(self, n: u32) -> Psn {
        Psn::new(self.0.wrapping_add(n))
    }
    #[allow(clippy::should_implement_trait)] // also implemented as `-`
    pub fn sub(self, n: u32) -> Psn {
        Psn::new(self.0.wrapping_sub(n))
    }
    pub fn next(self) -> Psn {
        self.add(1)
    }
    pub fn diff(self, other: Psn) -> i32 {
        ((self.0.wrapping_sub(other.0) << 8) as i32) >> 8
    }
    pub fn is_before(self, o: Psn) -> bool {
        self.diff(o) < 0
    }
    pub fn is_after(self, o: Psn) -> bool {
        self.diff(o) > 0
    }
    pub fn is_before_or_eq(self, o: Psn) -> bool {
        self.diff(o) <= 0
    }
    pub fn is_after_or_eq(self, o: Psn) -> bool {
        self.diff(o) >= 0
    }
    pub fn in_window(self, start: Psn, len: u32) -> bool {
        (self.0.wrapping_sub(start.0) & PSN_MASK) < len
    }
}
impl std::fmt::Display for Psn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({:#x})", self.0, self.0)
    }
}

impl std::ops::Add<u32> for Psn {
    type Output = Psn;
    fn add(self, n: u32) -> Psn {
        Psn::add(self, n)
    }
}

impl std::ops::Sub<u32> for Psn {
    type Output = Psn;
    fn sub(self, n: u32) -> Psn {
        Psn::sub(self, n)
    }
}
