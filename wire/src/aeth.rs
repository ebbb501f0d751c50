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
crate::view::header_view! {
    /// A zero-copy view of an ACK Extended Transport Header (IBTA 9.3.5;
    /// kernel `struct rxe_aeth`).
    len = 4;
    /// The syndrome byte: ACK, RNR NAK or NAK and its code.
    syndrome_raw / set_syndrome_raw: u8 = [0..1, 0xff],
    /// Message sequence number (24 bits).
    msn / set_msn: u32 = [1..4, 0xff_ffff],
}

/// The meaning of an AETH.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AethRepr {
    /// What the responder says.
    pub syndrome: Syndrome,
    /// Message sequence number (24 bits).
    pub msn: u32,
}

impl AethRepr {
    /// Parse a checked view.
    pub fn parse<T: AsRef<[u8]>>(p: &Packet<T>) -> crate::Result<AethRepr> {
        Ok(AethRepr {
            syndrome: Syndrome::from_raw(p.syndrome_raw()),
            msn: p.msn(),
        })
    }

    /// Write into a view.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut Packet<T>) {
        p.set_syndrome_raw(self.syndrome.to_raw());
        p.set_msn(self.msn);
    }

    /// Header length.
    pub const fn buffer_len() -> usize {
        HEADER_LEN
    }
}
const RNR_US: [u64; 32] = [
    655360, 10, 20, 30, 40, 60, 80, 120, 160, 240, 320, 480, 640, 960, 1280, 1920, 2560, 3840,
    5120, 7680, 10240, 15360, 20480, 30720, 40960, 61440, 81920, 122880, 163840, 245760, 327680,
    491520,
];
pub fn rnr_timer_ns(code: u8) -> u64 {
    RNR_US[(code & 0x1f) as usize] * 1000
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn captured_syndromes() {
        // rc_rnr_nak.pcap: ACK (0x1f), RNR NAK timer 12 (0x2c), NAK PSN sequence error (0x60).
        for (raw, syn) in [
            (
                0x1f,
                Syndrome::Ack {
                    credits: CREDITS_INVALID,
                },
            ),
            (0x2c, Syndrome::RnrNak { timer: 12 }),
            (0x60, Syndrome::Nak(NakCode::PsnSequenceError)),
            (0x61, Syndrome::Nak(NakCode::InvalidRequest)),
            (0x62, Syndrome::Nak(NakCode::RemoteAccessError)),
            (0x63, Syndrome::Nak(NakCode::RemoteOperationalError)),
            (0x64, Syndrome::Nak(NakCode::InvalidRdRequest)),
        ] {
            let bytes = [raw, 0x00, 0x00, 0x05];
            let p = Packet::new_checked(&bytes[..]).unwrap();
            let r = AethRepr::parse(&p).unwrap();
            assert_eq!(
                r,
                AethRepr {
                    syndrome: syn,
                    msn: 5
                }
            );
            let mut buf = [0u8; 4];
            r.emit(&mut Packet::new_unchecked(&mut buf[..]));
            assert_eq!(buf, bytes);
        }
        for v in 0..=255u8 {
            assert_eq!(Syndrome::from_raw(v).to_raw(), v);
        }
        assert!(Packet::new_checked(&[0u8; 3][..]).is_err());
    }

    #[test]
    fn rnr_timer_table() {
        assert_eq!(rnr_timer_ns(0), 655_360_000);
        assert_eq!(rnr_timer_ns(1), 10_000);
        assert_eq!(rnr_timer_ns(12), 640_000);
        assert_eq!(
            rnr_timer_ns(25),
            61_440_000,
            "IBTA value, not the kernel's 61.41 ms typo"
        );
        assert_eq!(rnr_timer_ns(31), 491_520_000);
    }
}
