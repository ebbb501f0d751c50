use bitflags::bitflags;
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct Opcode(pub u8);
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Transport {
    Rc,
    Uc,
    Rd,
    Ud,
    Cnp,
    Reserved,
}
bitflags! {
    #[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
    pub struct OpFlags: u32 {
        const RETH = 1; const AETH = 1<<1; const ATMETH = 1<<2; const ATMACK = 1<<3; const IETH = 1<<4; const RDETH = 1<<5;
        const DETH = 1<<6; const IMMDT = 1<<7; const FETH = 1<<8; const PAYLOAD = 1<<9; const REQ = 1<<10; const ACK = 1<<11;
        const SEND = 1<<12; const WRITE = 1<<13; const READ = 1<<14; const ATOMIC = 1<<15; const FLUSH = 1<<16; const ATOMIC_WRITE = 1<<17;
        const RWR = 1<<18; const COMP = 1<<19; const START = 1<<20; const MIDDLE = 1<<21; const END = 1<<22;
    }
}
pub struct OpcodeInfo {
    pub name: &'static str,
    pub flags: OpFlags,
    pub hdr_len: usize,
}
const ORDER: [(OpFlags, usize); 10] = [
    (OpFlags::RDETH, 4),
    (OpFlags::DETH, 8),
    (OpFlags::FETH, 4),
    (OpFlags::RETH, 16),
    (OpFlags::ATMETH, 28),
    (OpFlags::AETH, 4),
    (OpFlags::ATMACK, 8),
    (OpFlags::IMMDT, 4),
    (OpFlags::IETH, 4),
    (OpFlags::PAYLOAD, 0),
];
impl OpcodeInfo {
    pub fn offset_of(&self, hdr: OpFlags) -> Option<usize> {
        if !self.flags.contains(hdr) {
            return None;
        }
        let mut off = 12;
        for (f, l) in ORDER {
            if f == hdr {
                return Some(off);
            }
            if self.flags.contains(f) {
                off += l;
            }
        }
        None
    }
}
macro_rules! ops { ($($name:ident = $v:expr, $s:expr, [$($f:ident)|*];)*) => {
    impl Opcode { $(pub const $name: Opcode = Opcode($v);)* }
    static TABLE: &[(u8, &str, u32)] = &[$(($v, $s, 0 $(| OpFlags::$f.bits())*),)*];
}}
ops! {
 RC_SEND_FIRST = 0x00, "RC_SEND_FIRST", [PAYLOAD|REQ|RWR|SEND|START];
 RC_SEND_MIDDLE = 0x01, "RC_SEND_MIDDLE", [PAYLOAD|REQ|SEND|MIDDLE];
 RC_SEND_LAST = 0x02, "RC_SEND_LAST", [PAYLOAD|REQ|COMP|SEND|END];
 RC_SEND_LAST_WITH_IMMEDIATE = 0x03, "RC_SEND_LAST_WITH_IMMEDIATE", [IMMDT|PAYLOAD|REQ|COMP|SEND|END];
 RC_SEND_ONLY = 0x04, "RC_SEND_ONLY", [PAYLOAD|REQ|COMP|RWR|SEND|START|END];
 RC_SEND_ONLY_WITH_IMMEDIATE = 0x05, "RC_SEND_ONLY_WITH_IMMEDIATE", [IMMDT|PAYLOAD|REQ|COMP|RWR|SEND|START|END];
 RC_RDMA_WRITE_FIRST = 0x06, "RC_RDMA_WRITE_FIRST", [RETH|PAYLOAD|REQ|WRITE|START];
 RC_RDMA_WRITE_MIDDLE = 0x07, "RC_RDMA_WRITE_MIDDLE", [PAYLOAD|REQ|WRITE|MIDDLE];
 RC_RDMA_WRITE_LAST = 0x08, "RC_RDMA_WRITE_LAST", [PAYLOAD|REQ|WRITE|END];
 RC_RDMA_WRITE_LAST_WITH_IMMEDIATE = 0x09, "RC_RDMA_WRITE_LAST_WITH_IMMEDIATE", [IMMDT|PAYLOAD|REQ|WRITE|COMP|RWR|END];
 RC_RDMA_WRITE_ONLY = 0x0a, "RC_RDMA_WRITE_ONLY", [RETH|PAYLOAD|REQ|WRITE|START|END];
 RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE = 0x0b, "RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE", [RETH|IMMDT|PAYLOAD|REQ|WRITE|COMP|RWR|START|END];
 RC_RDMA_READ_REQUEST = 0x0c, "RC_RDMA_READ_REQUEST", [RETH|REQ|READ|START|END];
 RC_RDMA_READ_RESPONSE_FIRST = 0x0d, "RC_RDMA_READ_RESPONSE_FIRST", [AETH|PAYLOAD|ACK|READ|START];
 RC_RDMA_READ_RESPONSE_MIDDLE = 0x0e, "RC_RDMA_READ_RESPONSE_MIDDLE", [PAYLOAD|ACK|READ|MIDDLE];
 RC_RDMA_READ_RESPONSE_LAST = 0x0f, "RC_RDMA_READ_RESPONSE_LAST", [AETH|PAYLOAD|ACK|READ|END];
 RC_RDMA_READ_RESPONSE_ONLY = 0x10, "RC_RDMA_READ_RESPONSE_ONLY", [AETH|PAYLOAD|ACK|READ|START|END];
 RC_ACKNOWLEDGE = 0x11, "RC_ACKNOWLEDGE", [AETH|ACK|START|END];
 RC_ATOMIC_ACKNOWLEDGE = 0x12, "RC_ATOMIC_ACKNOWLEDGE", [AETH|ATMACK|ACK|START|END];
 RC_COMPARE_SWAP = 0x13, "RC_COMPARE_SWAP", [ATMETH|REQ|ATOMIC|START|END];
 RC_FETCH_ADD = 0x14, "RC_FETCH_ADD", [ATMETH|REQ|ATOMIC|START|END];
 RC_SEND_LAST_WITH_INVALIDATE = 0x16, "RC_SEND_LAST_WITH_INVALIDATE", [IETH|PAYLOAD|REQ|COMP|SEND|END];
 RC_SEND_ONLY_WITH_INVALIDATE = 0x17, "RC_SEND_ONLY_WITH_INVALIDATE", [IETH|PAYLOAD|REQ|COMP|RWR|SEND|START|END];
 RC_FLUSH = 0x1c, "RC_FLUSH", [FETH|RETH|REQ|FLUSH|START|END];
 RC_ATOMIC_WRITE = 0x1d, "RC_ATOMIC_WRITE", [RETH|PAYLOAD|REQ|ATOMIC_WRITE|START|END];
 UC_SEND_FIRST = 0x20, "UC_SEND_FIRST", [PAYLOAD|REQ|RWR|SEND|START];
 UC_SEND_MIDDLE = 0x21, "UC_SEND_MIDDLE", [PAYLOAD|REQ|SEND|MIDDLE];
 UC_SEND_LAST = 0x22, "UC_SEND_LAST", [PAYLOAD|REQ|COMP|SEND|END];
 UC_SEND_LAST_WITH_IMMEDIATE = 0x23, "UC_SEND_LAST_WITH_IMMEDIATE", [IMMDT|PAYLOAD|REQ|COMP|SEND|END];
 UC_SEND_ONLY = 0x24, "UC_SEND_ONLY", [PAYLOAD|REQ|COMP|RWR|SEND|START|END];
 UC_SEND_ONLY_WITH_IMMEDIATE = 0x25, "UC_SEND_ONLY_WITH_IMMEDIATE", [IMMDT|PAYLOAD|REQ|COMP|RWR|SEND|START|END];
 UC_RDMA_WRITE_FIRST = 0x26, "UC_RDMA_WRITE_FIRST", [RETH|PAYLOAD|REQ|WRITE|START];
 UC_RDMA_WRITE_MIDDLE = 0x27, "UC_RDMA_WRITE_MIDDLE", [PAYLOAD|REQ|WRITE|MIDDLE];
 UC_RDMA_WRITE_LAST = 0x28, "UC_RDMA_WRITE_LAST", [PAYLOAD|REQ|WRITE|END];
 UC_RDMA_WRITE_LAST_WITH_IMMEDIATE = 0x29, "UC_RDMA_WRITE_LAST_WITH_IMMEDIATE", [IMMDT|PAYLOAD|REQ|WRITE|COMP|RWR|END];
 UC_RDMA_WRITE_ONLY = 0x2a, "UC_RDMA_WRITE_ONLY", [RETH|PAYLOAD|REQ|WRITE|START|END];
 UC_RDMA_WRITE_ONLY_WITH_IMMEDIATE = 0x2b, "UC_RDMA_WRITE_ONLY_WITH_IMMEDIATE", [RETH|IMMDT|PAYLOAD|REQ|WRITE|COMP|RWR|START|END];
 RD_SEND_FIRST = 0x40, "RD_SEND_FIRST", [RDETH|DETH|PAYLOAD|REQ|RWR|SEND|START];
 RD_SEND_MIDDLE = 0x41, "RD_SEND_MIDDLE", [RDETH|DETH|PAYLOAD|REQ|SEND|MIDDLE];
 RD_SEND_LAST = 0x42, "RD_SEND_LAST", [RDETH|DETH|PAYLOAD|REQ|COMP|SEND|END];
 RD_SEND_LAST_WITH_IMMEDIATE = 0x43, "RD_SEND_LAST_WITH_IMMEDIATE", [RDETH|DETH|IMMDT|PAYLOAD|REQ|COMP|SEND|END];
 RD_SEND_ONLY = 0x44, "RD_SEND_ONLY", [RDETH|DETH|PAYLOAD|REQ|COMP|RWR|SEND|START|END];
 RD_SEND_ONLY_WITH_IMMEDIATE = 0x45, "RD_SEND_ONLY_WITH_IMMEDIATE", [RDETH|DETH|IMMDT|PAYLOAD|REQ|COMP|RWR|SEND|START|END];
 RD_RDMA_WRITE_FIRST = 0x46, "RD_RDMA_WRITE_FIRST", [RDETH|DETH|RETH|PAYLOAD|REQ|WRITE|START];
 RD_RDMA_WRITE_MIDDLE = 0x47, "RD_RDMA_WRITE_MIDDLE", [RDETH|DETH|PAYLOAD|REQ|WRITE|MIDDLE];
 RD_RDMA_WRITE_LAST = 0x48, "RD_RDMA_WRITE_LAST", [RDETH|DETH|PAYLOAD|REQ|WRITE|END];
 RD_RDMA_WRITE_LAST_WITH_IMMEDIATE = 0x49, "RD_RDMA_WRITE_LAST_WITH_IMMEDIATE", [RDETH|DETH|IMMDT|PAYLOAD|REQ|WRITE|COMP|RWR|END];
 RD_RDMA_WRITE_ONLY = 0x4a, "RD_RDMA_WRITE_ONLY", [RDETH|DETH|RETH|PAYLOAD|REQ|WRITE|START|END];
 RD_RDMA_WRITE_ONLY_WITH_IMMEDIATE = 0x4b, "RD_RDMA_WRITE_ONLY_WITH_IMMEDIATE", [RDETH|DETH|RETH|IMMDT|PAYLOAD|REQ|WRITE|COMP|RWR|START|END];
 RD_RDMA_READ_REQUEST = 0x4c, "RD_RDMA_READ_REQUEST", [RDETH|DETH|RETH|REQ|READ|START|END];
 RD_RDMA_READ_RESPONSE_FIRST = 0x4d, "RD_RDMA_READ_RESPONSE_FIRST", [RDETH|AETH|PAYLOAD|ACK|READ|START];
 RD_RDMA_READ_RESPONSE_MIDDLE = 0x4e, "RD_RDMA_READ_RESPONSE_MIDDLE", [RDETH|PAYLOAD|ACK|READ|MIDDLE];
 RD_RDMA_READ_RESPONSE_LAST = 0x4f, "RD_RDMA_READ_RESPONSE_LAST", [RDETH|AETH|PAYLOAD|ACK|READ|END];
 RD_RDMA_READ_RESPONSE_ONLY = 0x50, "RD_RDMA_READ_RESPONSE_ONLY", [RDETH|AETH|PAYLOAD|ACK|READ|START|END];
 RD_ACKNOWLEDGE = 0x51, "RD_ACKNOWLEDGE", [RDETH|AETH|ACK|START|END];
 RD_ATOMIC_ACKNOWLEDGE = 0x52, "RD_ATOMIC_ACKNOWLEDGE", [RDETH|AETH|ATMACK|ACK|START|END];
 RD_COMPARE_SWAP = 0x53, "RD_COMPARE_SWAP", [RDETH|DETH|ATMETH|REQ|ATOMIC|START|END];
 RD_FETCH_ADD = 0x54, "RD_FETCH_ADD", [RDETH|DETH|ATMETH|REQ|ATOMIC|START|END];
 UD_SEND_ONLY = 0x64, "UD_SEND_ONLY", [DETH|PAYLOAD|REQ|COMP|RWR|SEND|START|END];
 UD_SEND_ONLY_WITH_IMMEDIATE = 0x65, "UD_SEND_ONLY_WITH_IMMEDIATE", [DETH|IMMDT|PAYLOAD|REQ|COMP|RWR|SEND|START|END];
}
static INFOS: std::sync::OnceLock<Vec<Option<OpcodeInfo>>> = std::sync::OnceLock::new();
impl Opcode {
    pub fn info(self) -> Option<&'static OpcodeInfo> {
        let v = INFOS.get_or_init(|| {
            let mut v: Vec<Option<OpcodeInfo>> = (0..256).map(|_| None).collect();
            for &(o, n, f) in TABLE {
                let flags = OpFlags::from_bits_truncate(f);
                let hdr_len = 12
                    + ORDER
                        .iter()
                        .filter(|(x, _)| flags.contains(*x))
                        .map(|(_, l)| l)
                        .sum::<usize>();
                v[o as usize] = Some(OpcodeInfo {
                    name: n,
                    flags,
                    hdr_len,
                });
            }
            v
        });
        v[self.0 as usize].as_ref()
    }
    pub fn transport(self) -> Transport {
        match self.0 >> 5 {
            0 => Transport::Rc,
            1 => Transport::Uc,
            2 => Transport::Rd,
            3 => Transport::Ud,
            4 => Transport::Cnp,
            _ => Transport::Reserved,
        }
    }
    pub fn name(self) -> &'static str {
        self.info().map(|i| i.name).unwrap_or("UNKNOWN")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_is_consistent() {
        let mut n = 0;
        for v in 0..=255u8 {
            let Some(i) = Opcode(v).info() else { continue };
            n += 1;
            let f = i.flags;
            assert!(
                f.contains(OpFlags::REQ) != f.contains(OpFlags::ACK),
                "{}",
                i.name
            );
            assert!(
                f.intersects(OpFlags::START | OpFlags::MIDDLE | OpFlags::END),
                "{}",
                i.name
            );
            assert!(!(f.contains(OpFlags::MIDDLE) && f.intersects(OpFlags::START | OpFlags::END)));
            // RD carries RDETH, UD carries DETH, RC/UC neither.
            match Opcode(v).transport() {
                Transport::Rd => assert!(f.contains(OpFlags::RDETH)),
                Transport::Ud => assert!(f.contains(OpFlags::DETH) && !f.contains(OpFlags::RDETH)),
                _ => assert!(!f.intersects(OpFlags::DETH | OpFlags::RDETH)),
            }
            let prefix = match Opcode(v).transport() {
                Transport::Rc => "RC_",
                Transport::Uc => "UC_",
                Transport::Rd => "RD_",
                Transport::Ud => "UD_",
                _ => "?",
            };
            assert!(i.name.starts_with(prefix), "{}", i.name);
        }
        // Kernel rxe: 25 RC (with FLUSH and ATOMIC_WRITE), 12 UC, 21 RD, 2 UD.
        assert_eq!(n, 60);
    }

    #[test]
    fn header_lengths_match_kernel_rxe() {
        // rxe_opcode.c .length values (BTH 12, RETH 16, AETH 4, ATMETH 28,
        // ATMACK 8, DETH 8, RDETH 4, IMMDT 4, IETH 4, FETH 4).
        for (op, len) in [
            (Opcode::RC_SEND_ONLY, 12),
            (Opcode::RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE, 32),
            (Opcode::RC_RDMA_READ_RESPONSE_FIRST, 16),
            (Opcode::RC_ATOMIC_ACKNOWLEDGE, 24),
            (Opcode::RC_COMPARE_SWAP, 40),
            (Opcode::RC_SEND_ONLY_WITH_INVALIDATE, 16),
            (Opcode::RC_FLUSH, 32),
            (Opcode::RC_ATOMIC_WRITE, 28),
            (Opcode::UD_SEND_ONLY_WITH_IMMEDIATE, 24),
            (Opcode::RD_RDMA_WRITE_ONLY_WITH_IMMEDIATE, 44),
            (Opcode::RD_ATOMIC_ACKNOWLEDGE, 28),
        ] {
            assert_eq!(op.info().unwrap().hdr_len, len, "{}", op.name());
        }
        let i = Opcode::RD_RDMA_WRITE_ONLY_WITH_IMMEDIATE.info().unwrap();
        assert_eq!(i.offset_of(OpFlags::RDETH), Some(12));
        assert_eq!(i.offset_of(OpFlags::DETH), Some(16));
        assert_eq!(i.offset_of(OpFlags::RETH), Some(24));
        assert_eq!(i.offset_of(OpFlags::IMMDT), Some(40));
        let f = Opcode::RC_FLUSH.info().unwrap();
        assert_eq!(f.offset_of(OpFlags::FETH), Some(12));
        assert_eq!(f.offset_of(OpFlags::RETH), Some(16));
        assert!(Opcode(0x15).info().is_none());
        assert!(Opcode(0x66).info().is_none());
    }
}
