#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DethRepr {
    pub qkey: u32,
    pub src_qpn: u32,
}
