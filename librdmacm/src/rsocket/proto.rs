//! What two rsockets say to each other, as rdma-core's `rsocket.c`
//! (v44) says it: the private data of the connection request and reply,
//! and the 32-bit immediate data of every RDMA WRITE WITH IMMEDIATE.
//!
//! A stream rsocket is one RC QP. Each side owns a receive buffer
//! (`rbuf`, two halves) that the peer writes into directly, and a tiny
//! "target SGL" array (2 entries of [`RsSge`]) through which the peer
//! tells it which half it may write next. Every transfer is an RDMA
//! WRITE WITH IMMEDIATE whose immediate says what happened:
//!
//! ```text
//! bit 31..29  op (RS_OP_*)
//! bit 28..0   data: bytes written (DATA), credits (SGL), RS_CTRL_* (CTRL)
//! ```

/// Data was written into the receive buffer; data = bytes.
pub const RS_OP_DATA: u32 = 0;
/// Local only: a direct write to an iomap (never on the wire).
pub const RS_OP_WRITE: u32 = 2;
/// Credits (and perhaps a new target SGE written before it): data = the
/// sequence number up to which the peer may send (mod 2^16).
pub const RS_OP_SGL: u32 = 4;
/// An iomap entry was written; data = its index.
pub const RS_OP_IOMAP_SGL: u32 = 6;
/// Control: data = [`RS_CTRL_DISCONNECT`], [`RS_CTRL_KEEPALIVE`] or
/// [`RS_CTRL_SHUTDOWN`].
pub const RS_OP_CTRL: u32 = 7;

pub const RS_CTRL_DISCONNECT: u32 = 0;
pub const RS_CTRL_KEEPALIVE: u32 = 1;
pub const RS_CTRL_SHUTDOWN: u32 = 2;

/// rsocket.c's tunables (the defaults it uses with no
/// `/etc/rdma/rsocket/*` files).
pub const RS_OLAP_START_SIZE: u32 = 2048;
pub const RS_MAX_TRANSFER: u32 = 65536;
pub const RS_SNDLOWAT: u32 = 2048;
pub const RS_QP_MIN_SIZE: u16 = 16;
pub const RS_QP_MAX_SIZE: u16 = 0xFFFE;
/// Control messages that may be outstanding (a power of 2).
pub const RS_QP_CTRL_SIZE: u32 = 4;
pub const RS_CONN_RETRIES: u32 = 6;
/// Entries of the target SGL array.
pub const RS_SGL_SIZE: u32 = 2;
pub const DEF_INLINE: u16 = 64;
pub const DEF_SQSIZE: u16 = 384;
pub const DEF_RQSIZE: u16 = 384;
pub const DEF_MEM: u32 = 1 << 17;
pub const DEF_WMEM: u32 = 1 << 17;
/// Bytes of one control message kept in the send buffer when it cannot
/// go inline (`sizeof(struct rs_sge)`).
pub const RS_MAX_CTRL_MSG: u32 = RsSge::LEN as u32;

/// Receive work requests carry this bit in their `wr_id`.
pub const WR_ID_RECV: u64 = 1 << 63;

/// The 32-bit immediate (host order) of an op and its data.
pub fn msg(op: u32, data: u32) -> u32 {
    (op << 29) | data
}

pub fn msg_op(imm: u32) -> u32 {
    imm >> 29
}

pub fn msg_data(imm: u32) -> u32 {
    imm & 0x1FFF_FFFF
}

/// rsocket.c `rs_value_to_scale`: a size in 8 bits (values above 128
/// are kept as multiples of 256).
pub fn value_to_scale(value: u32, bits: u32) -> u32 {
    if value <= 1 << (bits - 1) {
        value
    } else {
        (1 << (bits - 1)) | (value >> bits)
    }
}

/// rsocket.c `rs_scale_to_value`.
#[cfg(test)]
pub fn scale_to_value(value: u32, bits: u32) -> u32 {
    if value <= 1 << (bits - 1) {
        value
    } else {
        (value & !(1 << (bits - 1))) << bits
    }
}

/// `struct rs_sge`: where the peer may write, 16 bytes. In the
/// connection data it is big-endian; in the target SGL array it is in
/// the receiver's byte order (the writer swaps when the orders differ:
/// `RS_OPT_SWAP_SGL`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RsSge {
    pub addr: u64,
    pub key: u32,
    pub length: u32,
}

impl RsSge {
    pub const LEN: usize = 16;

    fn to_be(self) -> [u8; 16] {
        let mut b = [0u8; 16];
        b[0..8].copy_from_slice(&self.addr.to_be_bytes());
        b[8..12].copy_from_slice(&self.key.to_be_bytes());
        b[12..16].copy_from_slice(&self.length.to_be_bytes());
        b
    }

    fn from_be(b: &[u8]) -> RsSge {
        RsSge {
            addr: u64::from_be_bytes(b[0..8].try_into().unwrap_or_default()),
            key: u32::from_be_bytes(b[8..12].try_into().unwrap_or_default()),
            length: u32::from_be_bytes(b[12..16].try_into().unwrap_or_default()),
        }
    }

    /// As the target SGL array holds it for a receiver of byte order
    /// `swap` (true: the other order from ours).
    pub fn to_target(self, swap: bool) -> [u8; 16] {
        if swap {
            self.to_be_if_le()
        } else {
            let mut b = [0u8; 16];
            b[0..8].copy_from_slice(&self.addr.to_ne_bytes());
            b[8..12].copy_from_slice(&self.key.to_ne_bytes());
            b[12..16].copy_from_slice(&self.length.to_ne_bytes());
            b
        }
    }

    fn to_be_if_le(self) -> [u8; 16] {
        let mut b = [0u8; 16];
        b[0..8].copy_from_slice(&self.addr.swap_bytes().to_ne_bytes());
        b[8..12].copy_from_slice(&self.key.swap_bytes().to_ne_bytes());
        b[12..16].copy_from_slice(&self.length.swap_bytes().to_ne_bytes());
        b
    }
}

/// `RS_CONN_FLAG_NET`: the sender is big-endian.
pub const RS_CONN_FLAG_NET: u8 = 1 << 0;
/// `RS_CONN_FLAG_IOMAP`: the sender's target SGL array is followed by
/// `target_iomap_size` iomap entries.
pub const RS_CONN_FLAG_IOMAP: u8 = 1 << 1;
pub const RS_CONN_VERSION: u8 = 1;

/// `struct rs_conn_data`: the private data of the connection request and
/// of the reply (40 bytes, multi-byte fields big-endian).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ConnData {
    pub version: u8,
    pub flags: u8,
    /// Messages the peer may send before it hears from us.
    pub credits: u16,
    /// Scaled by [`value_to_scale`].
    pub target_iomap_size: u8,
    /// Our target SGL array (length = entries).
    pub target_sgl: RsSge,
    /// The first half of our receive buffer.
    pub data_buf: RsSge,
}

mod field {
    use std::ops::Range;
    pub const VERSION: usize = 0;
    pub const FLAGS: usize = 1;
    pub const CREDITS: Range<usize> = 2..4;
    pub const RESERVED: Range<usize> = 4..7;
    pub const TARGET_IOMAP_SIZE: usize = 7;
    pub const TARGET_SGL: Range<usize> = 8..24;
    pub const DATA_BUF: Range<usize> = 24..40;
}

impl ConnData {
    pub const LEN: usize = 40;

    pub fn emit(&self) -> [u8; Self::LEN] {
        let mut b = [0u8; Self::LEN];
        b[field::VERSION] = self.version;
        b[field::FLAGS] = self.flags;
        b[field::CREDITS].copy_from_slice(&self.credits.to_be_bytes());
        b[field::RESERVED].fill(0);
        b[field::TARGET_IOMAP_SIZE] = self.target_iomap_size;
        b[field::TARGET_SGL].copy_from_slice(&self.target_sgl.to_be());
        b[field::DATA_BUF].copy_from_slice(&self.data_buf.to_be());
        b
    }

    /// `None` if shorter than 40 bytes.
    pub fn parse(b: &[u8]) -> Option<ConnData> {
        if b.len() < Self::LEN {
            return None;
        }
        Some(ConnData {
            version: b[field::VERSION],
            flags: b[field::FLAGS],
            credits: u16::from_be_bytes([b[2], b[3]]),
            target_iomap_size: b[field::TARGET_IOMAP_SIZE],
            target_sgl: RsSge::from_be(&b[field::TARGET_SGL]),
            data_buf: RsSge::from_be(&b[field::DATA_BUF]),
        })
    }
}

/// Whether this host is big-endian (`rs_host_is_net`).
pub fn host_is_net() -> bool {
    cfg!(target_endian = "big")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn immediate_encoding() {
        assert_eq!(msg(RS_OP_DATA, 4096), 0x0000_1000);
        assert_eq!(msg(RS_OP_SGL, 384 + 7), 0x8000_0187);
        assert_eq!(msg(RS_OP_CTRL, RS_CTRL_DISCONNECT), 0xE000_0000);
        assert_eq!(msg(RS_OP_CTRL, RS_CTRL_SHUTDOWN), 0xE000_0002);
        assert_eq!(msg_op(0xE000_0002), RS_OP_CTRL);
        assert_eq!(msg_data(0x8001_0187), 0x10187);
    }

    #[test]
    fn scale() {
        assert_eq!(value_to_scale(0, 8), 0);
        assert_eq!(value_to_scale(128, 8), 128);
        assert_eq!(value_to_scale(512, 8), 0x82);
        assert_eq!(scale_to_value(0x82, 8), 512);
        assert_eq!(scale_to_value(100, 8), 100);
    }

    /// The bytes of a request as rsocket.c (little-endian host) formats
    /// it: version 1, IOMAP flag, 384 credits, no iomap, target SGL of 2
    /// entries, data buffer half of 512 KiB.
    #[test]
    fn conn_data_bytes() {
        let c = ConnData {
            version: 1,
            flags: RS_CONN_FLAG_IOMAP,
            credits: 384,
            target_iomap_size: 0,
            target_sgl: RsSge {
                addr: 0x5555_0000_1000,
                key: 0x1234,
                length: 2,
            },
            data_buf: RsSge {
                addr: 0x7f00_0000_0000,
                key: 0xabcd,
                length: 0x8_0000,
            },
        };
        let b = c.emit();
        let want: [u8; 40] = [
            1, 2, 0x01, 0x80, 0, 0, 0, 0, //
            0, 0, 0x55, 0x55, 0, 0, 0x10, 0, 0, 0, 0x12, 0x34, 0, 0, 0, 2, //
            0, 0, 0x7f, 0, 0, 0, 0, 0, 0, 0, 0xab, 0xcd, 0, 0x08, 0, 0,
        ];
        assert_eq!(b, want);
        assert_eq!(ConnData::parse(&b), Some(c));
        assert_eq!(ConnData::parse(&b[..39]), None);
    }

    #[test]
    fn target_sge_byte_order() {
        let s = RsSge {
            addr: 0x0102_0304_0506_0708,
            key: 0x1122_3344,
            length: 0x8000,
        };
        let native = s.to_target(false);
        assert_eq!(&native[0..8], &0x0102_0304_0506_0708u64.to_ne_bytes());
        let swapped = s.to_target(true);
        assert_eq!(&swapped[0..8], &0x0807_0605_0403_0201u64.to_ne_bytes());
        assert_eq!(&swapped[12..16], &0x8000u32.swap_bytes().to_ne_bytes());
    }
}
