#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AtomicEthRepr {
    pub va: u64,
    pub rkey: u32,
    pub swap_add: u64,
    pub compare: u64,
}
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AtomicAckRepr {
    pub orig: u64,
}
