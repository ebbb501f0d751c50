//! The BTH opcode table, as data.
//!
//! Kernel rxe describes every opcode it knows in one table
//! (`rxe_opcode[]` in `rxe_opcode.c`): a name, a mask of `enum
//! rxe_hdr_mask` bits saying which extension headers follow the BTH and
//! what the packet means (request or response, SEND/WRITE/READ/atomic,
//! first/middle/last), and the header length. The rest of the driver asks
//! the table instead of matching on opcodes. This module is that table:
//! [`Opcode::info`] returns an [`OpcodeInfo`] with [`OpFlags`] and the
//! header length, and [`OpcodeInfo::offset_of`] locates one extension
//! header the way the kernel's `offset[]` array does.
//!
//! The table has kernel rxe's 60 entries: RC 0x00-0x14, 0x16, 0x17, 0x1c
//! (FLUSH), 0x1d (ATOMIC WRITE); UC 0x20-0x2b; RD 0x40-0x54 (rxe never
//! sends RD, but its table has them); UD 0x64, 0x65. To them rxe-emu adds
//! the 23 XRC opcodes of IBTA Annex A14 (0xa0-0xb4, 0xb6, 0xb7: the RC
//! operations with the XRC prefix 101), which kernel rxe lacks.
//!
//! Extension headers always follow the BTH in one order, which every entry
//! of the kernel table obeys: RDETH, DETH, XRCETH, FETH, RETH, AtomicETH,
//! AETH, AtomicAckETH, ImmDt, IETH (IBTA Vol. 1, 9.2 and 9.3, Annex A14;
//! FLUSH's FETH before its RETH per IBTA Annex A19 and kernel
//! `IB_OPCODE_RC_FLUSH`). XRC requests carry the XRCETH; XRC responses
//! carry none.

use core::fmt;

use bitflags::bitflags;

/// A BTH opcode (IBTA Vol. 1, 9.2): the top 3 bits are the transport
/// ([`Transport`]), the low 5 bits the operation.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct Opcode(pub u8);

/// The transport service of an opcode, from its top 3 bits (IBTA Vol. 1,
/// 9.2).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Transport {
    /// 000: Reliable Connected.
    Rc,
    /// 001: Unreliable Connected.
    Uc,
    /// 010: Reliable Datagram (in kernel rxe's table, never used by it).
    Rd,
    /// 011: Unreliable Datagram.
    Ud,
    /// 100: Congestion Notification Packet (RoCEv2 CNP, opcode 0x81).
    Cnp,
    /// 101: Extended Reliable Connected (XRC, IBTA Annex A14), which kernel
    /// rxe lacks.
    Xrc,
    /// 110/111: manufacturer specific.
    Reserved,
}

bitflags! {
    /// What an opcode's packets carry and mean: kernel rxe's `enum
    /// rxe_hdr_mask` (`rxe_opcode.h`), bit for bit in meaning (the bit
    /// positions are ours).
    #[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
    pub struct OpFlags: u32 {
        /// An RDMA Extended Transport Header follows (16 bytes).
        const RETH = 1 << 0;
        /// An ACK Extended Transport Header follows (4 bytes).
        const AETH = 1 << 1;
        /// An Atomic Extended Transport Header follows (28 bytes).
        const ATMETH = 1 << 2;
        /// An Atomic ACK Extended Transport Header follows (8 bytes).
        const ATMACK = 1 << 3;
        /// An Invalidate Extended Transport Header follows (4 bytes).
        const IETH = 1 << 4;
        /// An XRC Extended Transport Header follows (4 bytes; XRC requests).
        const XRCETH = 1 << 23;
        /// A Reliable Datagram Extended Transport Header follows (4 bytes).
        const RDETH = 1 << 5;
        /// A Datagram Extended Transport Header follows (8 bytes).
        const DETH = 1 << 6;
        /// Immediate data follows (4 bytes).
        const IMMDT = 1 << 7;
        /// A FLUSH Extended Transport Header follows (4 bytes).
        const FETH = 1 << 8;
        /// The packet may carry a payload after its headers.
        const PAYLOAD = 1 << 9;
        /// A request (requester to responder).
        const REQ = 1 << 10;
        /// A response: ACK, NAK, READ response or atomic ACK.
        const ACK = 1 << 11;
        /// Part of a SEND.
        const SEND = 1 << 12;
        /// Part of an RDMA WRITE.
        const WRITE = 1 << 13;
        /// Part of an RDMA READ. Kernel rxe sets this on the READ request
        /// only and tells READ responses apart by opcode; we also set it on
        /// READ responses (with `ACK`, not `REQ`), so "a READ response" is
        /// `READ` and not `REQ`. This is the one deliberate difference from
        /// the kernel's masks.
        const READ = 1 << 14;
        /// A CMP_SWAP or FETCH_ADD request.
        const ATOMIC = 1 << 15;
        /// A FLUSH request (IBTA Annex A19).
        const FLUSH = 1 << 16;
        /// An ATOMIC WRITE request (IBTA Annex A19).
        const ATOMIC_WRITE = 1 << 17;
        /// Consumes a receive WQE at the responder (first packet of a SEND,
        /// or a WRITE with immediate).
        const RWR = 1 << 18;
        /// Completes a receive WQE at the responder (last packet of a SEND,
        /// or a WRITE with immediate).
        const COMP = 1 << 19;
        /// First packet of a message (FIRST, or ONLY with `END`).
        const START = 1 << 20;
        /// Neither first nor last packet of a message.
        const MIDDLE = 1 << 21;
        /// Last packet of a message (LAST, or ONLY with `START`).
        const END = 1 << 22;
    }
}

/// Everything the table knows about one opcode (kernel `struct
/// rxe_opcode_info`).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct OpcodeInfo {
    /// The opcode's name without the kernel's `IB_OPCODE_` prefix, e.g.
    /// `"RC_SEND_ONLY"`.
    pub name: &'static str,
    /// Which headers follow and what the packet means.
    pub flags: OpFlags,
    /// Bytes from the start of the BTH to the payload: BTH plus extension
    /// headers (kernel `.length`).
    pub hdr_len: usize,
    /// [`OpcodeInfo::offset_of`] by the header flag's bit number
    /// ([`NO_OFFSET`] for a flag that is not a header this opcode carries):
    /// computed once with the table, where walking the header order took
    /// about 14 instructions per look, ten looks per packet parsed.
    offsets: [u8; 32],
}

/// In [`OpcodeInfo::offsets`]: not a header of this opcode.
const NO_OFFSET: u8 = u8::MAX;

/// Length of the BTH (kernel `RXE_BTH_BYTES`).
const BTH_LEN: usize = 12;

impl OpFlags {
    /// The extension headers (those of [`HEADER_ORDER`] but the payload).
    pub const HEADERS: OpFlags = {
        let mut f = OpFlags::empty();
        let mut i = 0;
        while i < HEADER_ORDER.len() {
            if HEADER_ORDER[i].1 > 0 {
                f = f.union(HEADER_ORDER[i].0);
            }
            i += 1;
        }
        f
    };
}

/// The extension headers in the order they follow the BTH, with their
/// lengths (kernel `enum rxe_hdr_length`). `PAYLOAD` comes last with
/// length 0, so its offset is the header length, as the kernel's
/// `offset[RXE_PAYLOAD]`.
const HEADER_ORDER: [(OpFlags, usize); 11] = [
    (OpFlags::RDETH, crate::rdeth::HEADER_LEN),
    (OpFlags::DETH, crate::deth::HEADER_LEN),
    (OpFlags::XRCETH, crate::xrceth::HEADER_LEN),
    (OpFlags::FETH, crate::feth::HEADER_LEN),
    (OpFlags::RETH, crate::reth::HEADER_LEN),
    (OpFlags::ATMETH, crate::atomic::HEADER_LEN),
    (OpFlags::AETH, crate::aeth::HEADER_LEN),
    (OpFlags::ATMACK, crate::atomic::ack::HEADER_LEN),
    (OpFlags::IMMDT, crate::immdt::HEADER_LEN),
    (OpFlags::IETH, crate::ieth::HEADER_LEN),
    (OpFlags::PAYLOAD, 0),
];

impl OpcodeInfo {
    /// An entry whose header length is derived from its flags, so the
    /// length and the headers can never disagree.
    const fn new(name: &'static str, flags: OpFlags) -> OpcodeInfo {
        let mut hdr_len = BTH_LEN;
        let mut offsets = [NO_OFFSET; 32];
        let mut i = 0;
        while i < HEADER_ORDER.len() {
            let (h, len) = HEADER_ORDER[i];
            if flags.contains(h) {
                offsets[h.bits().trailing_zeros() as usize] = hdr_len as u8;
                hdr_len += len;
            }
            i += 1;
        }
        OpcodeInfo {
            name,
            flags,
            hdr_len,
            offsets,
        }
    }

    /// Offset from the start of the BTH of one extension header (exactly
    /// one header flag, e.g. `OpFlags::RETH`), or of the payload for
    /// `OpFlags::PAYLOAD` (kernel `rxe_opcode[op].offset[]`). `None` if this
    /// opcode does not carry it, or `hdr` is not a single header flag.
    pub fn offset_of(&self, hdr: OpFlags) -> Option<usize> {
        if hdr.bits().count_ones() != 1 {
            return None;
        }
        match self.offsets[hdr.bits().trailing_zeros() as usize] {
            NO_OFFSET => None,
            o => Some(usize::from(o)),
        }
    }
}

/// `OpFlags` from a list of flag names, usable in a `const` context.
macro_rules! flags {
    ($($f:ident)|+) => {
        OpFlags::from_bits_retain(0 $(| OpFlags::$f.bits())+)
    };
}

/// Declares every opcode once: its `Opcode` constant and its table entry,
/// so the two cannot drift apart.
macro_rules! opcode_table {
    ($($name:ident = $value:literal: $($f:ident)|+;)*) => {
        impl Opcode {
            $(
                #[doc = concat!("BTH opcode `", stringify!($value), "`, kernel `IB_OPCODE_",
                    stringify!($name), "`.")]
                pub const $name: Opcode = Opcode($value);
            )*
        }

        /// Kernel rxe's opcode table, indexed by opcode.
        static TABLE: [Option<OpcodeInfo>; 256] = {
            let mut t: [Option<OpcodeInfo>; 256] = [None; 256];
            $( t[$value as usize] = Some(OpcodeInfo::new(stringify!($name), flags!($($f)|+))); )*
            t
        };
    };
}

// Transcribed from kernel rxe_opcode.c (v6.2+, which added FLUSH and
// ATOMIC WRITE), in its order. The only difference: READ on READ
// responses (see `OpFlags::READ`).
opcode_table! {
    RC_SEND_FIRST = 0x00: PAYLOAD | REQ | RWR | SEND | START;
    RC_SEND_MIDDLE = 0x01: PAYLOAD | REQ | SEND | MIDDLE;
    RC_SEND_LAST = 0x02: PAYLOAD | REQ | COMP | SEND | END;
    RC_SEND_LAST_WITH_IMMEDIATE = 0x03: IMMDT | PAYLOAD | REQ | COMP | SEND | END;
    RC_SEND_ONLY = 0x04: PAYLOAD | REQ | COMP | RWR | SEND | START | END;
    RC_SEND_ONLY_WITH_IMMEDIATE = 0x05: IMMDT | PAYLOAD | REQ | COMP | RWR | SEND | START | END;
    RC_RDMA_WRITE_FIRST = 0x06: RETH | PAYLOAD | REQ | WRITE | START;
    RC_RDMA_WRITE_MIDDLE = 0x07: PAYLOAD | REQ | WRITE | MIDDLE;
    RC_RDMA_WRITE_LAST = 0x08: PAYLOAD | REQ | WRITE | END;
    RC_RDMA_WRITE_LAST_WITH_IMMEDIATE = 0x09: IMMDT | PAYLOAD | REQ | WRITE | COMP | RWR | END;
    RC_RDMA_WRITE_ONLY = 0x0a: RETH | PAYLOAD | REQ | WRITE | START | END;
    RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE = 0x0b:
        RETH | IMMDT | PAYLOAD | REQ | WRITE | COMP | RWR | START | END;
    RC_RDMA_READ_REQUEST = 0x0c: RETH | REQ | READ | START | END;
    RC_RDMA_READ_RESPONSE_FIRST = 0x0d: AETH | PAYLOAD | ACK | READ | START;
    RC_RDMA_READ_RESPONSE_MIDDLE = 0x0e: PAYLOAD | ACK | READ | MIDDLE;
    RC_RDMA_READ_RESPONSE_LAST = 0x0f: AETH | PAYLOAD | ACK | READ | END;
    RC_RDMA_READ_RESPONSE_ONLY = 0x10: AETH | PAYLOAD | ACK | READ | START | END;
    RC_ACKNOWLEDGE = 0x11: AETH | ACK | START | END;
    RC_ATOMIC_ACKNOWLEDGE = 0x12: AETH | ATMACK | ACK | START | END;
    RC_COMPARE_SWAP = 0x13: ATMETH | REQ | ATOMIC | START | END;
    RC_FETCH_ADD = 0x14: ATMETH | REQ | ATOMIC | START | END;
    RC_SEND_LAST_WITH_INVALIDATE = 0x16: IETH | PAYLOAD | REQ | COMP | SEND | END;
    RC_SEND_ONLY_WITH_INVALIDATE = 0x17: IETH | PAYLOAD | REQ | COMP | RWR | SEND | START | END;
    RC_FLUSH = 0x1c: FETH | RETH | FLUSH | START | END | REQ;
    RC_ATOMIC_WRITE = 0x1d: RETH | PAYLOAD | REQ | ATOMIC_WRITE | START | END;

    UC_SEND_FIRST = 0x20: PAYLOAD | REQ | RWR | SEND | START;
    UC_SEND_MIDDLE = 0x21: PAYLOAD | REQ | SEND | MIDDLE;
    UC_SEND_LAST = 0x22: PAYLOAD | REQ | COMP | SEND | END;
    UC_SEND_LAST_WITH_IMMEDIATE = 0x23: IMMDT | PAYLOAD | REQ | COMP | SEND | END;
    UC_SEND_ONLY = 0x24: PAYLOAD | REQ | COMP | RWR | SEND | START | END;
    UC_SEND_ONLY_WITH_IMMEDIATE = 0x25: IMMDT | PAYLOAD | REQ | COMP | RWR | SEND | START | END;
    UC_RDMA_WRITE_FIRST = 0x26: RETH | PAYLOAD | REQ | WRITE | START;
    UC_RDMA_WRITE_MIDDLE = 0x27: PAYLOAD | REQ | WRITE | MIDDLE;
    UC_RDMA_WRITE_LAST = 0x28: PAYLOAD | REQ | WRITE | END;
    UC_RDMA_WRITE_LAST_WITH_IMMEDIATE = 0x29: IMMDT | PAYLOAD | REQ | WRITE | COMP | RWR | END;
    UC_RDMA_WRITE_ONLY = 0x2a: RETH | PAYLOAD | REQ | WRITE | START | END;
    UC_RDMA_WRITE_ONLY_WITH_IMMEDIATE = 0x2b:
        RETH | IMMDT | PAYLOAD | REQ | WRITE | COMP | RWR | START | END;

    RD_SEND_FIRST = 0x40: RDETH | DETH | PAYLOAD | REQ | RWR | SEND | START;
    RD_SEND_MIDDLE = 0x41: RDETH | DETH | PAYLOAD | REQ | SEND | MIDDLE;
    RD_SEND_LAST = 0x42: RDETH | DETH | PAYLOAD | REQ | COMP | SEND | END;
    RD_SEND_LAST_WITH_IMMEDIATE = 0x43: RDETH | DETH | IMMDT | PAYLOAD | REQ | COMP | SEND | END;
    RD_SEND_ONLY = 0x44: RDETH | DETH | PAYLOAD | REQ | COMP | RWR | SEND | START | END;
    RD_SEND_ONLY_WITH_IMMEDIATE = 0x45:
        RDETH | DETH | IMMDT | PAYLOAD | REQ | COMP | RWR | SEND | START | END;
    RD_RDMA_WRITE_FIRST = 0x46: RDETH | DETH | RETH | PAYLOAD | REQ | WRITE | START;
    RD_RDMA_WRITE_MIDDLE = 0x47: RDETH | DETH | PAYLOAD | REQ | WRITE | MIDDLE;
    RD_RDMA_WRITE_LAST = 0x48: RDETH | DETH | PAYLOAD | REQ | WRITE | END;
    RD_RDMA_WRITE_LAST_WITH_IMMEDIATE = 0x49:
        RDETH | DETH | IMMDT | PAYLOAD | REQ | WRITE | COMP | RWR | END;
    RD_RDMA_WRITE_ONLY = 0x4a: RDETH | DETH | RETH | PAYLOAD | REQ | WRITE | START | END;
    RD_RDMA_WRITE_ONLY_WITH_IMMEDIATE = 0x4b:
        RDETH | DETH | RETH | IMMDT | PAYLOAD | REQ | WRITE | COMP | RWR | START | END;
    RD_RDMA_READ_REQUEST = 0x4c: RDETH | DETH | RETH | REQ | READ | START | END;
    RD_RDMA_READ_RESPONSE_FIRST = 0x4d: RDETH | AETH | PAYLOAD | ACK | READ | START;
    RD_RDMA_READ_RESPONSE_MIDDLE = 0x4e: RDETH | PAYLOAD | ACK | READ | MIDDLE;
    RD_RDMA_READ_RESPONSE_LAST = 0x4f: RDETH | AETH | PAYLOAD | ACK | READ | END;
    RD_RDMA_READ_RESPONSE_ONLY = 0x50: RDETH | AETH | PAYLOAD | ACK | READ | START | END;
    RD_ACKNOWLEDGE = 0x51: RDETH | AETH | ACK | START | END;
    RD_ATOMIC_ACKNOWLEDGE = 0x52: RDETH | AETH | ATMACK | ACK | START | END;
    RD_COMPARE_SWAP = 0x53: RDETH | DETH | ATMETH | REQ | ATOMIC | START | END;
    RD_FETCH_ADD = 0x54: RDETH | DETH | ATMETH | REQ | ATOMIC | START | END;

    UD_SEND_ONLY = 0x64: DETH | PAYLOAD | REQ | COMP | RWR | SEND | START | END;
    UD_SEND_ONLY_WITH_IMMEDIATE = 0x65:
        DETH | IMMDT | PAYLOAD | REQ | COMP | RWR | SEND | START | END;

    // XRC (IBTA Annex A14, table 160; not in kernel rxe): RC's operations
    // with the prefix 101, an XRCETH on every request.
    XRC_SEND_FIRST = 0xa0: XRCETH | PAYLOAD | REQ | RWR | SEND | START;
    XRC_SEND_MIDDLE = 0xa1: XRCETH | PAYLOAD | REQ | SEND | MIDDLE;
    XRC_SEND_LAST = 0xa2: XRCETH | PAYLOAD | REQ | COMP | SEND | END;
    XRC_SEND_LAST_WITH_IMMEDIATE = 0xa3: XRCETH | IMMDT | PAYLOAD | REQ | COMP | SEND | END;
    XRC_SEND_ONLY = 0xa4: XRCETH | PAYLOAD | REQ | COMP | RWR | SEND | START | END;
    XRC_SEND_ONLY_WITH_IMMEDIATE = 0xa5:
        XRCETH | IMMDT | PAYLOAD | REQ | COMP | RWR | SEND | START | END;
    XRC_RDMA_WRITE_FIRST = 0xa6: XRCETH | RETH | PAYLOAD | REQ | WRITE | START;
    XRC_RDMA_WRITE_MIDDLE = 0xa7: XRCETH | PAYLOAD | REQ | WRITE | MIDDLE;
    XRC_RDMA_WRITE_LAST = 0xa8: XRCETH | PAYLOAD | REQ | WRITE | END;
    XRC_RDMA_WRITE_LAST_WITH_IMMEDIATE = 0xa9:
        XRCETH | IMMDT | PAYLOAD | REQ | WRITE | COMP | RWR | END;
    XRC_RDMA_WRITE_ONLY = 0xaa: XRCETH | RETH | PAYLOAD | REQ | WRITE | START | END;
    XRC_RDMA_WRITE_ONLY_WITH_IMMEDIATE = 0xab:
        XRCETH | RETH | IMMDT | PAYLOAD | REQ | WRITE | COMP | RWR | START | END;
    XRC_RDMA_READ_REQUEST = 0xac: XRCETH | RETH | REQ | READ | START | END;
    XRC_RDMA_READ_RESPONSE_FIRST = 0xad: AETH | PAYLOAD | ACK | READ | START;
    XRC_RDMA_READ_RESPONSE_MIDDLE = 0xae: PAYLOAD | ACK | READ | MIDDLE;
    XRC_RDMA_READ_RESPONSE_LAST = 0xaf: AETH | PAYLOAD | ACK | READ | END;
    XRC_RDMA_READ_RESPONSE_ONLY = 0xb0: AETH | PAYLOAD | ACK | READ | START | END;
    XRC_ACKNOWLEDGE = 0xb1: AETH | ACK | START | END;
    XRC_ATOMIC_ACKNOWLEDGE = 0xb2: AETH | ATMACK | ACK | START | END;
    XRC_COMPARE_SWAP = 0xb3: XRCETH | ATMETH | REQ | ATOMIC | START | END;
    XRC_FETCH_ADD = 0xb4: XRCETH | ATMETH | REQ | ATOMIC | START | END;
    XRC_SEND_LAST_WITH_INVALIDATE = 0xb6: XRCETH | IETH | PAYLOAD | REQ | COMP | SEND | END;
    XRC_SEND_ONLY_WITH_INVALIDATE = 0xb7:
        XRCETH | IETH | PAYLOAD | REQ | COMP | RWR | SEND | START | END;
}

impl Opcode {
    /// The RoCEv2 Congestion Notification Packet (IBTA Annex A17; kernel
    /// `IB_BTH_OPCODE_CNP`). Not in kernel rxe's table, so
    /// [`Opcode::info`] is `None`: see [`crate::cnp`].
    pub const CNP: Opcode = Opcode(0x81);

    /// The XRC opcode for an RC one (same operation, prefix 101), or
    /// `None` for an RC opcode XRC does not have (FLUSH, ATOMIC WRITE) or
    /// a non-RC opcode.
    pub fn to_xrc(self) -> Option<Opcode> {
        (self.transport() == Transport::Rc)
            .then_some(Opcode(self.0 | 0xa0))
            .filter(|o| o.info().is_some())
    }

    /// The RC opcode with the same operation as an XRC one, or `None`.
    pub fn xrc_to_rc(self) -> Option<Opcode> {
        (self.transport() == Transport::Xrc).then_some(Opcode(self.0 & 0x1f))
    }
}

impl Opcode {
    /// The table entry, or `None` for an opcode the table does not have
    /// (reserved, CNP, vendor-specific...).
    pub fn info(self) -> Option<&'static OpcodeInfo> {
        TABLE[usize::from(self.0)].as_ref()
    }

    /// The transport service, from the top 3 bits.
    pub fn transport(self) -> Transport {
        match self.0 >> 5 {
            0 => Transport::Rc,
            1 => Transport::Uc,
            2 => Transport::Rd,
            3 => Transport::Ud,
            4 => Transport::Cnp,
            5 => Transport::Xrc,
            _ => Transport::Reserved,
        }
    }

    /// The table name, e.g. `"RC_SEND_ONLY"`; `"CNP"` for the RoCEv2
    /// CNP, which is not in the table ([`crate::cnp`]); `"UNKNOWN"` for
    /// anything else the table lacks.
    pub fn name(self) -> &'static str {
        match self.info() {
            Some(i) => i.name,
            None if self == Opcode::CNP => "CNP",
            None => "UNKNOWN",
        }
    }

    /// Every opcode in the table, in ascending order.
    pub fn all_known() -> impl Iterator<Item = Opcode> {
        (0..=u8::MAX).map(Opcode).filter(|o| o.info().is_some())
    }
}

impl fmt::Display for Opcode {
    /// Name and number, e.g. `RC_SEND_ONLY (0x04)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({:#04x})", self.name(), self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Kernel rxe's `.length` of every entry, written out by hand from
    /// rxe_opcode.c (BTH 12, RETH 16, AETH 4, ATMETH 28, ATMACK 8, DETH 8,
    /// RDETH 4, IMMDT 4, IETH 4, FETH 4), so the computed lengths are
    /// checked against something other than themselves.
    const KERNEL_LENGTHS: [(u8, usize); 60] = [
        (0x00, 12),
        (0x01, 12),
        (0x02, 12),
        (0x03, 16),
        (0x04, 12),
        (0x05, 16),
        (0x06, 28),
        (0x07, 12),
        (0x08, 12),
        (0x09, 16),
        (0x0a, 28),
        (0x0b, 32),
        (0x0c, 28),
        (0x0d, 16),
        (0x0e, 12),
        (0x0f, 16),
        (0x10, 16),
        (0x11, 16),
        (0x12, 24),
        (0x13, 40),
        (0x14, 40),
        (0x16, 16),
        (0x17, 16),
        (0x1c, 32),
        (0x1d, 28),
        (0x20, 12),
        (0x21, 12),
        (0x22, 12),
        (0x23, 16),
        (0x24, 12),
        (0x25, 16),
        (0x26, 28),
        (0x27, 12),
        (0x28, 12),
        (0x29, 16),
        (0x2a, 28),
        (0x2b, 32),
        (0x40, 24),
        (0x41, 24),
        (0x42, 24),
        (0x43, 28),
        (0x44, 24),
        (0x45, 28),
        (0x46, 40),
        (0x47, 24),
        (0x48, 24),
        (0x49, 28),
        (0x4a, 40),
        (0x4b, 44),
        (0x4c, 40),
        (0x4d, 20),
        (0x4e, 16),
        (0x4f, 20),
        (0x50, 20),
        (0x51, 20),
        (0x52, 28),
        (0x53, 52),
        (0x54, 52),
        (0x64, 20),
        (0x65, 24),
    ];

    #[test]
    fn table_has_exactly_the_kernel_opcodes_and_lengths() {
        let known: Vec<u8> = Opcode::all_known()
            .filter(|o| o.transport() != Transport::Xrc)
            .map(|o| o.0)
            .collect();
        let kernel: Vec<u8> = KERNEL_LENGTHS.iter().map(|(o, _)| *o).collect();
        assert_eq!(known, kernel);
        for (op, len) in KERNEL_LENGTHS {
            let info = Opcode(op).info().unwrap();
            assert_eq!(info.hdr_len, len, "{}", info.name);
            assert_eq!(info.offset_of(OpFlags::PAYLOAD).unwrap_or(len), len);
        }
        for op in [0x15, 0x18, 0x1b, 0x1e, 0x2c, 0x55, 0x63, 0x66, 0x80, 0xff] {
            assert!(Opcode(op).info().is_none(), "{op:#x}");
            assert_eq!(Opcode(op).name(), "UNKNOWN");
        }
        // The RoCEv2 CNP has a name but no table entry (kernel rxe drops it).
        assert!(Opcode::CNP.info().is_none());
        assert_eq!(Opcode::CNP.name(), "CNP");
    }

    /// The precomputed offsets are the header order walked: for every
    /// opcode in the table and every flag, one at a time and combined,
    /// the offset of a header the opcode carries is the BTH plus the
    /// headers before it, and anything else (a header it does not carry,
    /// a flag that is not a header, two flags) has none.
    #[test]
    fn offsets_are_the_header_order_walked() {
        let walked = |info: &OpcodeInfo, hdr: OpFlags| {
            if !info.flags.contains(hdr) {
                return None;
            }
            let mut offset = BTH_LEN;
            for (h, len) in HEADER_ORDER {
                if h == hdr {
                    return Some(offset);
                }
                if info.flags.contains(h) {
                    offset += len;
                }
            }
            None
        };
        // The ten extension headers, not the payload nor a property.
        assert_eq!(OpFlags::HEADERS.bits().count_ones(), 10);
        assert!(!OpFlags::HEADERS.intersects(OpFlags::PAYLOAD | OpFlags::REQ | OpFlags::ACK));
        let mut looked = 0;
        for op in Opcode::all_known() {
            let info = op.info().unwrap();
            for bit in 0..32 {
                let one = OpFlags::from_bits_retain(1 << bit);
                assert_eq!(
                    info.offset_of(one),
                    walked(info, one),
                    "{} bit {bit}",
                    info.name
                );
                let two = one | OpFlags::PAYLOAD;
                if two != one {
                    assert_eq!(
                        info.offset_of(two),
                        None,
                        "{} bit {bit} + PAYLOAD",
                        info.name
                    );
                }
                looked += usize::from(info.offset_of(one).is_some());
            }
        }
        // Each opcode carries a payload or a header, many several: the
        // walk above compared offsets that exist, not only `None`s.
        assert!(looked > Opcode::all_known().count(), "{looked}");
    }

    /// Each XRC opcode is its RC twin plus a 4-byte XRCETH on requests
    /// (IBTA A14 table 160), and the mapping goes both ways.
    #[test]
    fn xrc_opcodes_mirror_rc() {
        let xrc: Vec<Opcode> = Opcode::all_known()
            .filter(|o| o.transport() == Transport::Xrc)
            .collect();
        assert_eq!(xrc.len(), 23);
        for x in xrc {
            let rc = x.xrc_to_rc().unwrap();
            let (xi, ri) = (x.info().unwrap(), rc.info().unwrap());
            assert_eq!(xi.name.strip_prefix("XRC_"), ri.name.strip_prefix("RC_"));
            assert_eq!(xi.flags - OpFlags::XRCETH, ri.flags, "{}", xi.name);
            let extra = if ri.flags.contains(OpFlags::REQ) {
                4
            } else {
                0
            };
            assert_eq!(xi.hdr_len, ri.hdr_len + extra, "{}", xi.name);
            assert_eq!(rc.to_xrc(), Some(x));
        }
        assert_eq!(Opcode::RC_FLUSH.to_xrc(), None);
        assert_eq!(Opcode::RC_ATOMIC_WRITE.to_xrc(), None);
        assert_eq!(Opcode::UC_SEND_ONLY.to_xrc(), None);
        let i = Opcode::XRC_RDMA_WRITE_ONLY_WITH_IMMEDIATE.info().unwrap();
        assert_eq!(i.offset_of(OpFlags::XRCETH), Some(12));
        assert_eq!(i.offset_of(OpFlags::RETH), Some(16));
        assert_eq!(i.offset_of(OpFlags::IMMDT), Some(32));
    }

    #[test]
    fn hdr_len_is_the_sum_of_the_header_sizes() {
        for op in Opcode::all_known() {
            let i = op.info().unwrap();
            let sum: usize = HEADER_ORDER
                .iter()
                .filter(|(h, _)| i.flags.contains(*h))
                .map(|(_, l)| l)
                .sum();
            assert_eq!(i.hdr_len, 12 + sum, "{}", i.name);
        }
    }

    #[test]
    fn flags_are_sane() {
        for op in Opcode::all_known() {
            let i = op.info().unwrap();
            let f = i.flags;
            assert!(
                f.contains(OpFlags::REQ) != f.contains(OpFlags::ACK),
                "{}",
                i.name
            );
            let name = i.name;
            let (start, middle, end) = if name.contains("_FIRST") {
                (true, false, false)
            } else if name.contains("_MIDDLE") {
                (false, true, false)
            } else if name.contains("_LAST") {
                (false, false, true)
            } else {
                // ONLY, READ_REQUEST, ACKNOWLEDGE, atomics, FLUSH, ATOMIC_WRITE.
                (true, false, true)
            };
            assert_eq!(f.contains(OpFlags::START), start, "{name}");
            assert_eq!(f.contains(OpFlags::MIDDLE), middle, "{name}");
            assert_eq!(f.contains(OpFlags::END), end, "{name}");
            // Exactly one operation kind per opcode (ACK/atomic ACK have none).
            let kinds = f
                & (OpFlags::SEND
                    | OpFlags::WRITE
                    | OpFlags::READ
                    | OpFlags::ATOMIC
                    | OpFlags::FLUSH
                    | OpFlags::ATOMIC_WRITE);
            assert!(kinds.bits().count_ones() <= 1, "{name}");
            assert_eq!(kinds.is_empty(), name.contains("ACKNOWLEDGE"), "{name}");
            // Name and transport agree; RD carries RDETH, UD DETH, RC/UC neither.
            let prefix = match op.transport() {
                Transport::Rc => "RC_",
                Transport::Uc => "UC_",
                Transport::Rd => "RD_",
                Transport::Ud => "UD_",
                Transport::Xrc => "XRC_",
                _ => panic!("{name}: unexpected transport"),
            };
            assert!(name.starts_with(prefix), "{name}");
            match op.transport() {
                Transport::Rd => assert!(f.contains(OpFlags::RDETH)),
                Transport::Ud => assert!(f.contains(OpFlags::DETH) && !f.contains(OpFlags::RDETH)),
                _ => assert!(!f.intersects(OpFlags::DETH | OpFlags::RDETH), "{name}"),
            }
            // IBTA A14: every XRC request and no response carries an XRCETH.
            assert_eq!(
                f.contains(OpFlags::XRCETH),
                op.transport() == Transport::Xrc && f.contains(OpFlags::REQ),
                "{name}"
            );
            assert_eq!(
                f.contains(OpFlags::IMMDT),
                name.contains("IMMEDIATE"),
                "{name}"
            );
            assert_eq!(
                f.contains(OpFlags::IETH),
                name.contains("INVALIDATE"),
                "{name}"
            );
            // Requests with a payload, responses with data, never both
            // AtomicETH and RETH.
            assert!(!(f.contains(OpFlags::ATMETH) && f.contains(OpFlags::RETH)));
        }
    }

    #[test]
    fn offsets_follow_the_kernel_header_order() {
        let i = Opcode::RD_RDMA_WRITE_ONLY_WITH_IMMEDIATE.info().unwrap();
        assert_eq!(i.offset_of(OpFlags::RDETH), Some(12));
        assert_eq!(i.offset_of(OpFlags::DETH), Some(16));
        assert_eq!(i.offset_of(OpFlags::RETH), Some(24));
        assert_eq!(i.offset_of(OpFlags::IMMDT), Some(40));
        assert_eq!(i.offset_of(OpFlags::PAYLOAD), Some(44));
        assert_eq!(i.offset_of(OpFlags::AETH), None);
        let i = Opcode::RC_FLUSH.info().unwrap();
        assert_eq!(i.offset_of(OpFlags::FETH), Some(12));
        assert_eq!(i.offset_of(OpFlags::RETH), Some(16));
        assert_eq!(i.offset_of(OpFlags::PAYLOAD), None, "FLUSH has no payload");
        let i = Opcode::RC_ATOMIC_WRITE.info().unwrap();
        assert_eq!(i.offset_of(OpFlags::RETH), Some(12));
        assert_eq!(i.offset_of(OpFlags::PAYLOAD), Some(28));
        let i = Opcode::RC_ATOMIC_ACKNOWLEDGE.info().unwrap();
        assert_eq!(i.offset_of(OpFlags::AETH), Some(12));
        assert_eq!(i.offset_of(OpFlags::ATMACK), Some(16));
        let i = Opcode::UD_SEND_ONLY_WITH_IMMEDIATE.info().unwrap();
        assert_eq!(i.offset_of(OpFlags::DETH), Some(12));
        assert_eq!(i.offset_of(OpFlags::IMMDT), Some(20));
        // Not a single header flag.
        assert_eq!(i.offset_of(OpFlags::DETH | OpFlags::IMMDT), None);
        assert_eq!(i.offset_of(OpFlags::REQ), None);
    }

    #[test]
    fn transport_and_display() {
        assert_eq!(Opcode(0x04).transport(), Transport::Rc);
        assert_eq!(Opcode(0x2a).transport(), Transport::Uc);
        assert_eq!(Opcode(0x4c).transport(), Transport::Rd);
        assert_eq!(Opcode(0x64).transport(), Transport::Ud);
        assert_eq!(Opcode(0x81).transport(), Transport::Cnp);
        assert_eq!(Opcode(0xa0).transport(), Transport::Xrc);
        assert_eq!(Opcode(0xc0).transport(), Transport::Reserved);
        assert_eq!(Opcode(0xff).transport(), Transport::Reserved);
        assert_eq!(Opcode::RC_SEND_ONLY.to_string(), "RC_SEND_ONLY (0x04)");
        assert_eq!(Opcode(0x15).to_string(), "UNKNOWN (0x15)");
    }
}
