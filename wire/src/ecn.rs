//! The ECN field of the IP header (RFC 3168): the low 2 bits of the IPv4
//! TOS byte or of the IPv6 traffic class.
//!
//! ```text
//!  TOS / traffic class:  DSCP (6 bits) | ECN (2 bits)
//!  ECN:  00 Not-ECT   01 ECT(1)   10 ECT(0)   11 CE
//! ```
//!
//! A sender that understands congestion marks sends ECT(0) or ECT(1); a
//! switch whose queue is long rewrites ECT to CE instead of dropping the
//! packet. RoCEv2's ICRC masks the whole TOS / traffic-class byte
//! ([`crate::icrc`]), so a CE mark never breaks a packet's ICRC. Kernel
//! rxe sends everything Not-ECT (TOS 0) and ignores marks.

/// An ECN codepoint (RFC 3168, 5).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Ecn {
    /// 00: the sender does not take part in ECN (kernel rxe, and the
    /// default of every socket).
    #[default]
    NotEct,
    /// 01: ECN-capable transport, codepoint 1.
    Ect1,
    /// 10: ECN-capable transport, codepoint 0.
    Ect0,
    /// 11: congestion experienced, set by a switch on an ECT packet.
    Ce,
}

/// The ECN bits of the TOS / traffic-class byte.
pub const ECN_MASK: u8 = 0x03;

impl Ecn {
    /// The codepoint of the low 2 bits of `bits` (higher bits are ignored).
    pub const fn from_bits(bits: u8) -> Ecn {
        match bits & ECN_MASK {
            0b00 => Ecn::NotEct,
            0b01 => Ecn::Ect1,
            0b10 => Ecn::Ect0,
            _ => Ecn::Ce,
        }
    }

    /// The 2-bit value.
    pub const fn bits(self) -> u8 {
        match self {
            Ecn::NotEct => 0b00,
            Ecn::Ect1 => 0b01,
            Ecn::Ect0 => 0b10,
            Ecn::Ce => 0b11,
        }
    }

    /// The codepoint of a TOS / traffic-class byte.
    pub const fn from_tos(tos: u8) -> Ecn {
        Ecn::from_bits(tos)
    }

    /// The TOS / traffic-class byte with DSCP `dscp` (low 6 bits used) and
    /// this codepoint.
    pub const fn tos(self, dscp: u8) -> u8 {
        (dscp << 2) | self.bits()
    }

    /// Whether a switch may mark this packet CE instead of dropping it:
    /// ECT(0) or ECT(1). (A CE packet is already marked.)
    pub const fn is_ect(self) -> bool {
        matches!(self, Ecn::Ect0 | Ecn::Ect1)
    }

    /// RFC 3168's name: `Not-ECT`, `ECT(1)`, `ECT(0)` or `CE`.
    pub const fn name(self) -> &'static str {
        match self {
            Ecn::NotEct => "Not-ECT",
            Ecn::Ect1 => "ECT(1)",
            Ecn::Ect0 => "ECT(0)",
            Ecn::Ce => "CE",
        }
    }
}

impl core::fmt::Display for Ecn {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codepoints_are_rfc_3168() {
        // RFC 3168 5: 00 Not-ECT, 01 ECT(1), 10 ECT(0), 11 CE.
        let all = [Ecn::NotEct, Ecn::Ect1, Ecn::Ect0, Ecn::Ce];
        for (bits, e) in all.iter().enumerate() {
            assert_eq!(Ecn::from_bits(bits as u8), *e);
            assert_eq!(e.bits(), bits as u8);
        }
        // The ToS 106 of public mlx5 setups: DSCP 26, ECT(0).
        assert_eq!(Ecn::from_tos(106), Ecn::Ect0);
        assert_eq!(Ecn::Ect0.tos(26), 106);
        // CNPs on DSCP 48, Not-ECT: TOS 0xc0.
        assert_eq!(Ecn::NotEct.tos(48), 0xc0);
        assert_eq!(Ecn::from_tos(0xff), Ecn::Ce);
        assert!(Ecn::Ect0.is_ect() && Ecn::Ect1.is_ect());
        assert!(!Ecn::NotEct.is_ect() && !Ecn::Ce.is_ect());
        assert_eq!(Ecn::default(), Ecn::NotEct);
        assert_eq!(Ecn::Ce.to_string(), "CE");
    }
}
