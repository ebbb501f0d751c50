#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IethRepr {
    pub rkey: u32,
}
