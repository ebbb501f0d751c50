//! A whole RoCEv2 transport packet: the UDP payload, from the BTH through
//! the extension headers, payload and pad to the ICRC.
//!
//! ```text
//!  BTH | RDETH | DETH | XRCETH | FETH | RETH | AtomicETH | AETH | AtomicAckETH | ImmDt | IETH | payload | pad | ICRC
//!        `------------------ those the opcode's table entry lists ------------------'
//! ```
//!
//! Which extension headers are present, and where, is decided by the
//! opcode alone ([`crate::opcode`]), exactly as kernel rxe does it with
//! `rxe_opcode[opcode].offset[]`.

use crate::aeth::AethRepr;
use crate::atomic::{AtomicAckRepr, AtomicEthRepr};
use crate::bth::BthRepr;
use crate::deth::DethRepr;
use crate::feth::FethRepr;
use crate::ieth::IethRepr;
use crate::immdt::ImmDtRepr;
use crate::rdeth::RdethRepr;
use crate::reth::RethRepr;
use crate::xrceth::XrcEthRepr;
use crate::{aeth, atomic, bth, deth, feth, ieth, immdt, rdeth, reth, xrceth};
use crate::{Error, OpFlags, OpcodeInfo, Result, ICRC_LEN};

/// The meaning of a whole transport packet: the BTH, each extension
/// header the opcode carries (`Some`) or does not (`None`), and the
/// payload without its pad.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PacketRepr<'a> {
    /// Base Transport Header.
    pub bth: BthRepr,
    /// Reliable Datagram ETH (RD opcodes).
    pub rdeth: Option<RdethRepr>,
    /// Datagram ETH (UD and RD opcodes).
    pub deth: Option<DethRepr>,
    /// XRC ETH (XRC requests).
    pub xrceth: Option<XrcEthRepr>,
    /// RDMA ETH (first WRITE packet, READ request, FLUSH, ATOMIC WRITE).
    pub reth: Option<RethRepr>,
    /// FLUSH ETH (FLUSH).
    pub feth: Option<FethRepr>,
    /// Atomic ETH (CMP_SWAP, FETCH_ADD).
    pub atomic: Option<AtomicEthRepr>,
    /// ACK ETH (ACK, atomic ACK, first and last READ response).
    pub aeth: Option<AethRepr>,
    /// Atomic ACK ETH (atomic ACK).
    pub atomic_ack: Option<AtomicAckRepr>,
    /// Immediate data (`..._WITH_IMMEDIATE`).
    pub immdt: Option<ImmDtRepr>,
    /// Invalidate ETH (`SEND_..._WITH_INVALIDATE`).
    pub ieth: Option<IethRepr>,
    /// The payload, without pad bytes.
    pub payload: &'a [u8],
}

/// Pad bytes that bring `payload_len` to a multiple of 4 (IBTA Vol. 1,
/// 9.2: the BTH pad count).
const fn pad_for(payload_len: usize) -> usize {
    (4 - payload_len % 4) % 4
}

impl<'a> PacketRepr<'a> {
    /// Parse a UDP payload that ends with the 4-byte ICRC.
    ///
    /// Checks what kernel rxe's receive path checks before it looks at a
    /// QP (`rxe_rcv` and `hdr_check` in rxe_recv.c): TVer is 0
    /// ([`Error::Malformed`]) and the packet holds the opcode's headers,
    /// pad and ICRC ([`Error::Truncated`]); and that the opcode is in the
    /// table ([`Error::UnknownOpcode`]), without which its headers cannot
    /// be located. It also rejects a pad count larger than the
    /// bytes after the headers, and any payload or pad on an opcode that
    /// carries none ([`Error::Malformed`]). The pad bytes' values are not
    /// checked (IBTA: ignored by the receiver). The ICRC is not checked
    /// here: see [`crate::icrc::check`]. Never panics.
    pub fn parse(udp_payload: &'a [u8]) -> Result<PacketRepr<'a>> {
        let bth = BthRepr::parse(&bth::Packet::new_checked(udp_payload)?)?;
        let info = bth
            .opcode
            .info()
            .ok_or(Error::UnknownOpcode(bth.opcode.0))?;
        if bth.tver != bth::TVER {
            return Err(Error::Malformed);
        }
        let icrc_at = udp_payload
            .len()
            .checked_sub(ICRC_LEN)
            .ok_or(Error::Truncated)?;
        // The BTH and extension headers, which must end before the ICRC.
        let headers = udp_payload
            .get(..info.hdr_len)
            .filter(|_| info.hdr_len <= icrc_at)
            .ok_or(Error::Truncated)?;
        let pad = usize::from(bth.pad_count);
        let payload_end = icrc_at
            .checked_sub(pad)
            .filter(|end| *end >= info.hdr_len)
            .ok_or(Error::Malformed)?;
        if !info.flags.contains(OpFlags::PAYLOAD) && icrc_at != info.hdr_len {
            return Err(Error::Malformed);
        }
        let payload = udp_payload
            .get(info.hdr_len..payload_end)
            .ok_or(Error::Truncated)?;

        // Each extension header is a view over its offset to the end of
        // `headers`: in bounds by construction, and `new_checked` checks its
        // length anyway.
        let at = |h: OpFlags| info.offset_of(h).and_then(|o| headers.get(o..));
        macro_rules! ext {
            ($flag:ident, $repr:ty, $($module:ident)::+) => {{
                match at(OpFlags::$flag) {
                    Some(b) => Some(<$repr>::parse(&$($module)::+::Packet::new_checked(b)?)?),
                    None if info.flags.contains(OpFlags::$flag) => return Err(Error::Truncated),
                    None => None,
                }
            }};
        }
        Ok(PacketRepr {
            bth,
            rdeth: ext!(RDETH, RdethRepr, rdeth),
            deth: ext!(DETH, DethRepr, deth),
            xrceth: ext!(XRCETH, XrcEthRepr, xrceth),
            reth: ext!(RETH, RethRepr, reth),
            feth: ext!(FETH, FethRepr, feth),
            atomic: ext!(ATMETH, AtomicEthRepr, atomic),
            aeth: ext!(AETH, AethRepr, aeth),
            atomic_ack: ext!(ATMACK, AtomicAckRepr, atomic::ack),
            immdt: ext!(IMMDT, ImmDtRepr, immdt),
            ieth: ext!(IETH, IethRepr, ieth),
            payload,
        })
    }

    /// Bytes from the start of the BTH to the payload, from the opcode's
    /// table entry (12, the BTH alone, for an opcode not in the table).
    pub fn header_len(&self) -> usize {
        self.bth
            .opcode
            .info()
            .map_or(bth::HEADER_LEN, |i| i.hdr_len)
    }

    /// Total UDP payload length: headers, payload, pad and ICRC.
    pub fn buffer_len(&self) -> usize {
        self.header_len() + self.payload.len() + pad_for(self.payload.len()) + ICRC_LEN
    }

    /// The table entry, after checking that the `Option` headers present
    /// are exactly those the opcode carries, and that a payload is only
    /// given to an opcode that carries one.
    fn checked_info(&self) -> Result<&'static OpcodeInfo> {
        let info = self
            .bth
            .opcode
            .info()
            .ok_or(Error::UnknownOpcode(self.bth.opcode.0))?;
        // The headers present as flags, against the opcode's: one compare
        // (a walk of the ten pairs was about a fifth of an ACK's emit).
        let on = |f: OpFlags, is_some: bool| if is_some { f.bits() } else { 0 };
        let present = OpFlags::from_bits_retain(
            on(OpFlags::RDETH, self.rdeth.is_some())
                | on(OpFlags::DETH, self.deth.is_some())
                | on(OpFlags::XRCETH, self.xrceth.is_some())
                | on(OpFlags::RETH, self.reth.is_some())
                | on(OpFlags::FETH, self.feth.is_some())
                | on(OpFlags::ATMETH, self.atomic.is_some())
                | on(OpFlags::AETH, self.aeth.is_some())
                | on(OpFlags::ATMACK, self.atomic_ack.is_some())
                | on(OpFlags::IMMDT, self.immdt.is_some())
                | on(OpFlags::IETH, self.ieth.is_some()),
        );
        let headers_match = info.flags.intersection(OpFlags::HEADERS) == present;
        let payload_allowed = info.flags.contains(OpFlags::PAYLOAD) || self.payload.is_empty();
        if headers_match && payload_allowed {
            Ok(info)
        } else {
            Err(Error::Malformed)
        }
    }

    /// Emit headers, payload and zero pad into `buf[..buffer_len()]`, and
    /// zero the 4 ICRC bytes; the caller then seals the packet with
    /// [`crate::icrc::write`]. The pad count written is computed from
    /// `payload.len()` (`bth.pad_count` is ignored), as kernel rxe's
    /// requester and responder compute it.
    ///
    /// `Error::Truncated` if `buf` is shorter than [`Self::buffer_len`];
    /// `Error::UnknownOpcode` for an opcode not in the table;
    /// `Error::Malformed` if the `Option` headers present do not match the
    /// opcode's table entry, or a payload is given to an opcode that has
    /// none. Bytes of `buf` after `buffer_len()` are left alone.
    pub fn emit(&self, buf: &mut [u8]) -> Result<()> {
        self.emit_with(buf, true)
    }

    /// As [`Self::emit`], but the payload's bytes of `buf` (after the
    /// headers, `self.payload.len()` of them) are left as they are, for a
    /// caller that fills them itself: `self.payload` gives only their
    /// number. Headers, pad and the ICRC's place are written.
    pub fn emit_headers(&self, buf: &mut [u8]) -> Result<()> {
        self.emit_with(buf, false)
    }

    fn emit_with(&self, buf: &mut [u8], copy_payload: bool) -> Result<()> {
        let info = self.checked_info()?;
        let total = self.buffer_len();
        let buf = buf.get_mut(..total).ok_or(Error::Truncated)?;
        let hdr_len = info.hdr_len;
        let payload_end = hdr_len + self.payload.len();
        let (headers, rest) = buf.split_at_mut(hdr_len);

        let mut bth = self.bth;
        bth.pad_count = pad_for(self.payload.len()) as u8;
        bth.emit(&mut bth::Packet::new_checked(&mut headers[..])?);

        // A view from the header's offset to the end of the headers; the
        // offsets come from the same table entry as `hdr_len`.
        macro_rules! ext {
            ($field:ident, $flag:ident, $($module:ident)::+) => {
                if let Some(repr) = &self.$field {
                    let offset = info.offset_of(OpFlags::$flag).ok_or(Error::Malformed)?;
                    let bytes = headers.get_mut(offset..).ok_or(Error::Truncated)?;
                    repr.emit(&mut $($module)::+::Packet::new_checked(bytes)?);
                }
            };
        }
        ext!(rdeth, RDETH, rdeth);
        ext!(deth, DETH, deth);
        ext!(xrceth, XRCETH, xrceth);
        ext!(reth, RETH, reth);
        ext!(feth, FETH, feth);
        ext!(atomic, ATMETH, atomic);
        ext!(aeth, AETH, aeth);
        ext!(atomic_ack, ATMACK, atomic::ack);
        ext!(immdt, IMMDT, immdt);
        ext!(ieth, IETH, ieth);

        let (payload, pad_and_icrc) = rest.split_at_mut(payload_end - hdr_len);
        if copy_payload {
            payload.copy_from_slice(self.payload);
        }
        pad_and_icrc.fill(0);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::aeth::{NakCode, Syndrome};
    use crate::{Opcode, Psn};

    /// An RNR NAK from rc_rnr_nak.pcap (UDP payload): BTH opcode 0x11 to QP
    /// 0x1b, PSN 0x63d35f; AETH 0x2c (RNR NAK, timer 12), MSN 2; ICRC.
    const RNR_NAK: [u8; 20] = [
        0x11, 0x00, 0xff, 0xff, 0x00, 0x00, 0x00, 0x1b, 0x00, 0x63, 0xd3, 0x5f, // BTH
        0x2c, 0x00, 0x00, 0x02, // AETH
        0xa3, 0x0e, 0x47, 0xb5, // ICRC
    ];

    /// An atomic ACK from rc_atomic_fadd.pcap: BTH 0x12, AETH 0x1f MSN 1,
    /// AtomicAckETH 0xc37469e6c94af846, ICRC.
    const ATOMIC_ACK: [u8; 28] = [
        0x12, 0x00, 0xff, 0xff, 0x00, 0x00, 0x00, 0x16, 0x00, 0x75, 0xe6, 0x72, // BTH
        0x1f, 0x00, 0x00, 0x01, // AETH
        0xc3, 0x74, 0x69, 0xe6, 0xc9, 0x4a, 0xf8, 0x46, // AtomicAckETH
        0x2d, 0x94, 0x26, 0x52, // ICRC
    ];

    fn bth(opcode: Opcode, qpn: u32, psn: u32) -> BthRepr {
        BthRepr {
            opcode,
            solicited: false,
            mig_req: false,
            pad_count: 0,
            tver: 0,
            pkey: 0xffff,
            fecn: false,
            becn: false,
            dest_qpn: qpn,
            ack_req: false,
            psn: Psn::new(psn),
        }
    }

    fn bare(bth: BthRepr) -> PacketRepr<'static> {
        PacketRepr {
            bth,
            rdeth: None,
            deth: None,
            xrceth: None,
            reth: None,
            feth: None,
            atomic: None,
            aeth: None,
            atomic_ack: None,
            immdt: None,
            ieth: None,
            payload: &[],
        }
    }

    fn rnr_nak_repr() -> PacketRepr<'static> {
        PacketRepr {
            aeth: Some(AethRepr {
                syndrome: Syndrome::RnrNak { timer: 12 },
                msn: 2,
            }),
            ..bare(bth(Opcode::RC_ACKNOWLEDGE, 0x1b, 0x63_d35f))
        }
    }

    #[test]
    fn parse_captured_packets() {
        assert_eq!(PacketRepr::parse(&RNR_NAK).unwrap(), rnr_nak_repr());
        let p = PacketRepr::parse(&ATOMIC_ACK).unwrap();
        assert_eq!(p.bth.opcode, Opcode::RC_ATOMIC_ACKNOWLEDGE);
        assert_eq!(p.aeth.unwrap().syndrome, Syndrome::Ack { credits: 0x1f });
        assert_eq!(p.atomic_ack.unwrap().orig, 0xc374_69e6_c94a_f846);
        assert_eq!(p.payload, &[] as &[u8]);
        assert_eq!((p.header_len(), p.buffer_len()), (24, 28));
    }

    #[test]
    fn emit_reproduces_captured_packets_up_to_the_icrc() {
        for bytes in [&RNR_NAK[..], &ATOMIC_ACK[..]] {
            let p = PacketRepr::parse(bytes).unwrap();
            let mut out = vec![0xaau8; p.buffer_len() + 3];
            p.emit(&mut out).unwrap();
            let n = bytes.len();
            assert_eq!(&out[..n - 4], &bytes[..n - 4]);
            assert_eq!(&out[n - 4..n], &[0, 0, 0, 0], "ICRC left zero");
            assert_eq!(&out[n..], &[0xaa; 3], "bytes after buffer_len untouched");
        }
    }

    #[test]
    fn payload_and_pad() {
        // A 5-byte SEND gets 3 zero pad bytes and pad count 3.
        let repr = PacketRepr {
            payload: b"hello",
            ..bare(bth(Opcode::RC_SEND_ONLY, 0x11, 7))
        };
        assert_eq!(repr.buffer_len(), 12 + 5 + 3 + 4);
        let mut buf = vec![0xffu8; repr.buffer_len()];
        repr.emit(&mut buf).unwrap();
        assert_eq!(buf[1] & bth::PAD_MASK, 0x30);
        assert_eq!(&buf[12..17], b"hello");
        assert_eq!(&buf[17..], &[0; 7]);
        let back = PacketRepr::parse(&buf).unwrap();
        assert_eq!(back.payload, b"hello");
        assert_eq!(back.bth.pad_count, 3);
        assert_eq!(
            PacketRepr {
                bth: repr.bth,
                ..back
            },
            repr
        );
        // Pad bytes are not checked on receipt.
        buf[17] = 0x99;
        assert_eq!(PacketRepr::parse(&buf).unwrap().payload, b"hello");
    }

    #[test]
    fn every_extension_header_lands_where_the_table_says() {
        // RD WRITE ONLY with immediate: RDETH, DETH, RETH, ImmDt.
        let repr = PacketRepr {
            rdeth: Some(RdethRepr { een: 0x12_3456 }),
            deth: Some(DethRepr {
                qkey: 0x1111_1111,
                src_qpn: 0x19,
            }),
            reth: Some(RethRepr {
                va: 0x1000,
                rkey: 0x697,
                dma_len: 4,
            }),
            immdt: Some(ImmDtRepr { imm: 0xdead_beef }),
            payload: &[1, 2, 3, 4],
            ..bare(bth(Opcode::RD_RDMA_WRITE_ONLY_WITH_IMMEDIATE, 0x11, 1))
        };
        let mut buf = vec![0u8; repr.buffer_len()];
        repr.emit(&mut buf).unwrap();
        assert_eq!(&buf[12..16], &[0, 0x12, 0x34, 0x56]);
        assert_eq!(&buf[16..24], &[0x11, 0x11, 0x11, 0x11, 0, 0, 0, 0x19]);
        assert_eq!(&buf[24..32], &0x1000u64.to_be_bytes());
        assert_eq!(&buf[40..44], &[0xde, 0xad, 0xbe, 0xef]);
        assert_eq!(&buf[44..48], &[1, 2, 3, 4]);
        assert_eq!(PacketRepr::parse(&buf).unwrap(), repr);
        // FLUSH: FETH before RETH, no payload.
        let flush = PacketRepr {
            feth: Some(FethRepr {
                selectivity: 0,
                placement: 2,
            }),
            reth: Some(RethRepr {
                va: 0x2000,
                rkey: 5,
                dma_len: 64,
            }),
            ..bare(bth(Opcode::RC_FLUSH, 0x11, 2))
        };
        let mut buf = vec![0u8; flush.buffer_len()];
        flush.emit(&mut buf).unwrap();
        assert_eq!(buf.len(), 36);
        assert_eq!(&buf[12..16], &[0, 0, 0, 2]);
        assert_eq!(&buf[16..24], &0x2000u64.to_be_bytes());
        assert_eq!(PacketRepr::parse(&buf).unwrap(), flush);
    }

    #[test]
    fn parse_rejects_what_kernel_rxe_drops() {
        // Unknown opcode.
        let mut b = RNR_NAK;
        b[0] = 0x15;
        assert_eq!(PacketRepr::parse(&b), Err(Error::UnknownOpcode(0x15)));
        // TVer 1.
        let mut b = RNR_NAK;
        b[1] = 0x01;
        assert_eq!(PacketRepr::parse(&b), Err(Error::Malformed));
        // Too short for the AETH + ICRC, or even the BTH.
        assert_eq!(PacketRepr::parse(&RNR_NAK[..19]), Err(Error::Truncated));
        assert_eq!(PacketRepr::parse(&RNR_NAK[..15]), Err(Error::Truncated));
        assert_eq!(PacketRepr::parse(&RNR_NAK[..11]), Err(Error::Truncated));
        assert_eq!(PacketRepr::parse(&[]), Err(Error::Truncated));
        // An ACK with a payload, or with a pad count.
        let mut b = RNR_NAK.to_vec();
        b.splice(16..16, [0u8; 4]);
        assert_eq!(PacketRepr::parse(&b), Err(Error::Malformed));
        let mut b = RNR_NAK;
        b[1] = 0x10;
        assert_eq!(PacketRepr::parse(&b), Err(Error::Malformed));
        // A pad count larger than what follows the headers.
        let send = [
            0x04, 0x30, 0xff, 0xff, 0, 0, 0, 0x11, 0, 0, 0, 1, 0xaa, 0xbb, 0, 0, 0, 0,
        ];
        assert_eq!(PacketRepr::parse(&send), Err(Error::Malformed));
        // ... but exactly enough is fine: 2 bytes = pad only, empty payload.
        let mut ok = send;
        ok[1] = 0x20;
        assert_eq!(PacketRepr::parse(&ok).unwrap().payload, &[] as &[u8]);
    }

    #[test]
    fn emit_headers_writes_all_but_the_payload() {
        let data = [7u8, 8, 9, 10, 11];
        let p = PacketRepr {
            reth: Some(RethRepr {
                va: 0x1000,
                rkey: 0x42,
                dma_len: 5,
            }),
            payload: &data,
            ..bare(bth(Opcode::RC_RDMA_WRITE_ONLY, 0x11, 7))
        };
        let mut whole = vec![0xeeu8; p.buffer_len()];
        p.emit(&mut whole).unwrap();
        // Over garbage, then the payload by hand: the same bytes (the
        // pad of 3 and the ICRC's place zeroed too).
        let mut parts = vec![0xeeu8; p.buffer_len()];
        p.emit_headers(&mut parts).unwrap();
        let hl = p.header_len();
        assert_eq!(
            &parts[hl..hl + data.len()],
            &[0xee; 5],
            "payload left alone"
        );
        parts[hl..hl + data.len()].copy_from_slice(&data);
        assert_eq!(parts, whole);
    }

    #[test]
    fn emit_rejects_headers_that_do_not_match_the_opcode() {
        let good = rnr_nak_repr();
        let mut buf = [0u8; 64];
        assert_eq!(good.emit(&mut buf[..19]), Err(Error::Truncated));
        assert!(good.emit(&mut buf[..20]).is_ok());
        let missing = PacketRepr {
            aeth: None,
            ..good.clone()
        };
        assert_eq!(missing.emit(&mut buf), Err(Error::Malformed));
        let extra = PacketRepr {
            deth: Some(DethRepr {
                qkey: 1,
                src_qpn: 1,
            }),
            ..good.clone()
        };
        assert_eq!(extra.emit(&mut buf), Err(Error::Malformed));
        let payload = PacketRepr {
            payload: &[1],
            ..good.clone()
        };
        assert_eq!(payload.emit(&mut buf), Err(Error::Malformed));
        let unknown = PacketRepr {
            bth: BthRepr {
                opcode: Opcode(0x1e),
                ..good.bth
            },
            ..good.clone()
        };
        assert_eq!(unknown.emit(&mut buf), Err(Error::UnknownOpcode(0x1e)));
        // A NAK for completeness: same layout, other syndrome.
        let nak = PacketRepr {
            aeth: Some(AethRepr {
                syndrome: Syndrome::Nak(NakCode::PsnSequenceError),
                msn: 2,
            }),
            ..good
        };
        nak.emit(&mut buf).unwrap();
        assert_eq!(buf[12], 0x60);
    }
}
