pub const CREDITS_INVALID: u8 = 0x1f;
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NakCode {
    PsnSequenceError,
    InvalidRequest,
    RemoteAccessError,
    RemoteOperationalError,
    InvalidRdRequest,
    Reserved(u8),
}
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Syndrome {
    Ack { credits: u8 },
    RnrNak { timer: u8 },
    Nak(NakCode),
    Reserved(u8),
}
impl Syndrome {
    pub fn from_raw(v: u8) -> Syndrome {
        let low = v & 0x1f;
        match v >> 5 {
            0 => Syndrome::Ack { credits: low },
            1 => Syndrome::RnrNak { timer: low },
            3 => Syndrome::Nak(match low {
                0 => NakCode::PsnSequenceError,
                1 => NakCode::InvalidRequest,
                2 => NakCode::RemoteAccessError,
                3 => NakCode::RemoteOperationalError,
                4 => NakCode::InvalidRdRequest,
                o => NakCode::Reserved(o),
            }),
            _ => Syndrome::Reserved(v),
        }
    }
    pub fn to_raw(self) -> u8 {
        match self {
            Syndrome::Ack { credits } => credits & 0x1f,
            Syndrome::RnrNak { timer } => 0x20 | (timer & 0x1f),
            Syndrome::Nak(c) => {
                0x60 | match c {
                    NakCode::PsnSequenceError => 0,
                    NakCode::InvalidRequest => 1,
                    NakCode::RemoteAccessError => 2,
                    NakCode::RemoteOperationalError => 3,
                    NakCode::InvalidRdRequest => 4,
                    NakCode::Reserved(o) => o & 0x1f,
                }
            }
            Syndrome::Reserved(v) => v,
        }
    }
}
impl std::fmt::Display for Syndrome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{self:?} ({:#04x})", self.to_raw())
    }
}
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AethRepr {
    pub syndrome: Syndrome,
    pub msn: u32,
}
const RNR_US: [u64; 32] = [
    655360, 10, 20, 30, 40, 60, 80, 120, 160, 240, 320, 480, 640, 960, 1280, 1920, 2560, 3840,
    5120, 7680, 10240, 15360, 20480, 30720, 40960, 61440, 81920, 122880, 163840, 245760, 327680,
    491520,
];
pub fn rnr_timer_ns(code: u8) -> u64 {
    RNR_US[(code & 0x1f) as usize] * 1000
}
