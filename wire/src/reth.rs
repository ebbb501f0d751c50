#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RethRepr {
    pub va: u64,
    pub rkey: u32,
    pub dma_len: u32,
}
