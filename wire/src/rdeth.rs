#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RdethRepr {
    pub een: u32,
}
