#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ImmDtRepr {
    pub imm: u32,
}
