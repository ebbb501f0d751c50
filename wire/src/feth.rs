#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FethRepr {
    pub selectivity: u8,
    pub placement: u8,
}
