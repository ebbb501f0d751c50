//! Property tests: 24-bit PSN arithmetic across the wrap, PacketRepr
//! emit/parse round trips over every opcode of the table, the ICRC and IP
//! ID solving, and parsers that never panic on any bytes.

use proptest::prelude::*;
use wire::aeth::{AethRepr, Syndrome};
use wire::atomic::{AtomicAckRepr, AtomicEthRepr};
use wire::bth::BthRepr;
use wire::deth::DethRepr;
use wire::feth::FethRepr;
use wire::icrc::{self, IpUdpInfo};
use wire::ieth::IethRepr;
use wire::immdt::ImmDtRepr;
use wire::rdeth::RdethRepr;
use wire::reth::RethRepr;
use wire::xrceth::XrcEthRepr;
use wire::{frame, pcap, OpFlags, Opcode, PacketRepr, Psn};

const MAX: u32 = 0x00ff_ffff;
const HALF: i32 = 1 << 23;

fn known_opcodes() -> Vec<Opcode> {
    Opcode::all_known().collect()
}

/// Everything a valid `PacketRepr` is made of, owned.
#[derive(Debug, Clone)]
struct Parts {
    bth: BthRepr,
    words: [u64; 4],
    syndrome: u8,
    payload: Vec<u8>,
}

impl Parts {
    /// The repr: the opcode's headers, filled from `words`, each value
    /// within its field's width.
    fn repr(&self) -> PacketRepr<'_> {
        let f = self.bth.opcode.info().unwrap().flags;
        let has = |h| f.contains(h);
        let [a, b, c, d] = self.words;
        let (lo, hi) = (a as u32, (a >> 32) as u32);
        PacketRepr {
            bth: self.bth,
            rdeth: has(OpFlags::RDETH).then_some(RdethRepr { een: lo & MAX }),
            deth: has(OpFlags::DETH).then_some(DethRepr {
                qkey: hi,
                src_qpn: lo & MAX,
            }),
            xrceth: has(OpFlags::XRCETH).then_some(XrcEthRepr {
                srqn: (d >> 40) as u32 & MAX,
            }),
            reth: has(OpFlags::RETH).then_some(RethRepr {
                va: b,
                rkey: hi,
                dma_len: lo,
            }),
            feth: has(OpFlags::FETH).then_some(FethRepr {
                selectivity: (lo & 3) as u8,
                placement: (hi & 0xf) as u8,
            }),
            atomic: has(OpFlags::ATMETH).then_some(AtomicEthRepr {
                va: b,
                rkey: lo,
                swap_add: c,
                compare: d,
            }),
            aeth: has(OpFlags::AETH).then_some(AethRepr {
                syndrome: Syndrome::from_raw(self.syndrome),
                msn: hi & MAX,
            }),
            atomic_ack: has(OpFlags::ATMACK).then_some(AtomicAckRepr { orig: c }),
            immdt: has(OpFlags::IMMDT).then_some(ImmDtRepr {
                imm: (d >> 7) as u32,
            }),
            ieth: has(OpFlags::IETH).then_some(IethRepr {
                rkey: (c >> 3) as u32,
            }),
            payload: if has(OpFlags::PAYLOAD) {
                &self.payload
            } else {
                &[]
            },
        }
    }
}

prop_compose! {
    fn arb_bth()(op in prop::sample::select(known_opcodes()), se: bool, mig: bool, pkey: u16,
                 fecn: bool, becn: bool, qpn in 0..=MAX, ack: bool, psn in 0..=MAX) -> BthRepr {
        BthRepr {
            opcode: op, solicited: se, mig_req: mig, pad_count: 0, tver: 0, pkey, fecn, becn,
            dest_qpn: qpn, ack_req: ack, psn: Psn::new(psn),
        }
    }
}

prop_compose! {
    fn arb_parts()(bth in arb_bth(), words: [u64; 4], syndrome: u8,
                   payload in prop::collection::vec(any::<u8>(), 0..2100)) -> Parts {
        Parts { bth, words, syndrome, payload }
    }
}

prop_compose! {
    fn arb_info()(v6: bool, a: [u8; 16], b: [u8; 16], sport: u16, id: u16, df: bool) -> IpUdpInfo {
        let (src, dst) = if v6 {
            (std::net::Ipv6Addr::from(a).into(), std::net::Ipv6Addr::from(b).into())
        } else {
            (std::net::Ipv4Addr::new(a[0], a[1], a[2], a[3]).into(),
             std::net::Ipv4Addr::new(b[0], b[1], b[2], b[3]).into())
        };
        IpUdpInfo { src, dst, src_port: sport, dst_port: wire::ROCEV2_UDP_PORT, ipv4_id: id,
                    ipv4_flags_frag: if df { 0x4000 } else { 0 } }
    }
}

/// Re-emit a parsed packet and parse that: the same meaning must come
/// back. Only the pad count may differ: the input's is whatever it was,
/// `emit` writes the one the payload length calls for.
fn reemit_same_meaning(p: &PacketRepr<'_>) -> Result<(), TestCaseError> {
    let mut out = vec![0u8; p.buffer_len()];
    p.emit(&mut out).unwrap();
    let again = PacketRepr::parse(&out).unwrap();
    prop_assert_eq!(
        usize::from(again.bth.pad_count),
        (4 - p.payload.len() % 4) % 4
    );
    let same = PacketRepr {
        bth: BthRepr {
            pad_count: again.bth.pad_count,
            ..p.bth
        },
        ..p.clone()
    };
    prop_assert_eq!(again, same);
    Ok(())
}

/// Emit and seal a packet.
fn sealed(repr: &PacketRepr<'_>, info: &IpUdpInfo) -> Vec<u8> {
    let mut buf = vec![0u8; repr.buffer_len()];
    repr.emit(&mut buf).unwrap();
    icrc::write(info, &mut buf);
    buf
}

proptest! {
    #[test]
    fn psn_add_sub_are_inverse_and_wrap(a in 0..=MAX, n: u32) {
        let p = Psn::new(a);
        prop_assert_eq!(p.add(n).sub(n), p);
        prop_assert_eq!(p.sub(n).add(n), p);
        prop_assert_eq!(p.add(n).value(), a.wrapping_add(n) & MAX);
        prop_assert_eq!(p + n, p.add(n));
        prop_assert_eq!(Psn::new(MAX).add(n), Psn::new(n.wrapping_sub(1)));
        prop_assert_eq!(Psn::new(0).sub(n.wrapping_add(1)), Psn::new(MAX).sub(n));
    }

    #[test]
    fn psn_diff_is_antisymmetric_and_circular(a in 0..=MAX, d in -HALF + 1..HALF) {
        let p = Psn::new(a);
        let q = if d >= 0 { p.add(d as u32) } else { p.sub(d.unsigned_abs()) };
        prop_assert_eq!(q.diff(p), d);
        prop_assert_eq!(p.diff(q), -d);
        prop_assert_eq!(q.is_after(p), d > 0);
        prop_assert_eq!(q.is_before(p), d < 0);
        prop_assert_eq!(q.is_after_or_eq(p), d >= 0);
        prop_assert_eq!(q.is_before_or_eq(p), d <= 0);
        prop_assert_eq!(p.add(q.diff(p) as u32), q);
        // Exactly half the space apart: both sides call the other "before",
        // as the kernel's psn_compare does.
        let far = p.add(HALF as u32);
        prop_assert_eq!((far.diff(p), p.diff(far)), (-HALF, -HALF));
    }

    #[test]
    fn psn_window_membership(start in 0..=MAX, len in 0u32..2000, off in 0u32..4000) {
        let s = Psn::new(start);
        prop_assert_eq!(s.add(off).in_window(s, len), off < len);
        prop_assert!(s.add(off).in_window(s, 1 << 24));
        if off < len && len <= 1 << 23 {
            prop_assert!(s.add(off).is_after_or_eq(s));
        }
    }

    #[test]
    fn packet_repr_round_trips(parts in arb_parts(), info in arb_info()) {
        let repr = parts.repr();
        let buf = sealed(&repr, &info);
        prop_assert_eq!(buf.len() % 4, 0, "RoCE packets are 4-byte multiples");
        prop_assert!(icrc::check(&info, &buf));
        let back = PacketRepr::parse(&buf).unwrap();
        prop_assert_eq!(usize::from(back.bth.pad_count), (4 - repr.payload.len() % 4) % 4);
        let expect = PacketRepr { bth: BthRepr { pad_count: back.bth.pad_count, ..repr.bth }, ..repr.clone() };
        prop_assert_eq!(&back, &expect);
        prop_assert_eq!(sealed(&back, &info), buf.clone());
        prop_assert_eq!(back.header_len(), repr.bth.opcode.info().unwrap().hdr_len);
    }

    #[test]
    fn icrc_agrees_with_real_headers_and_catches_single_bit_flips(
        parts in arb_parts(), info in arb_info(), bit in any::<prop::sample::Index>())
    {
        let repr = parts.repr();
        let mut buf = sealed(&repr, &info);
        let frame = frame::build(&info, &buf);
        let f = frame::parse(&frame).unwrap();
        prop_assert_eq!(f.udp_payload, &buf[..]);
        let roce = &buf[..buf.len() - 4];
        prop_assert_eq!(icrc::compute_from_headers(f.ip_header, f.udp_header, roce),
                        Ok(icrc::stored(&buf).unwrap()));
        let bit = bit.index(buf.len() * 8);
        buf[bit / 8] ^= 1 << (bit % 8);
        // BTH byte 4 (FECN, BECN, reserved) is outside the ICRC, but for
        // a FLUSH, whose ICRC kernel rxe computes over its headers a
        // second time, unmasked (see wire::icrc).
        let flush = buf[0] == 0x1c;
        prop_assert_eq!(icrc::check(&info, &buf), bit / 8 == 4 && !flush);
    }

    #[test]
    fn solve_ipv4_id_recovers_any_id(parts in arb_parts(), info in arb_info(), id: u16) {
        let info = IpUdpInfo { src: [10, 0, 0, 1].into(), dst: [10, 0, 0, 2].into(), ipv4_id: id, ..info };
        let buf = sealed(&parts.repr(), &info);
        prop_assert_eq!(icrc::solve_ipv4_id(&IpUdpInfo { ipv4_id: id ^ 0x5a5a, ..info }, &buf), Some(id));
    }

    #[test]
    fn icrc_is_affine_in_the_ipv4_id(a: u16, b: u16, len in 0usize..3000, fill: u8) {
        let roce = vec![fill; len];
        let at = |id| icrc::compute(&IpUdpInfo { src: [10, 0, 0, 1].into(), dst: [10, 0, 0, 2].into(),
            src_port: 49152, dst_port: 4791, ipv4_id: id, ipv4_flags_frag: 0x4000 }, &roce);
        prop_assert_eq!(at(a) ^ at(b) ^ at(a ^ b) ^ at(0), 0);
    }

    #[test]
    fn parsers_never_panic_on_arbitrary_bytes(bytes in prop::collection::vec(any::<u8>(), 0..600)) {
        if let Ok(p) = PacketRepr::parse(&bytes) {
            // What parses re-emits to something that parses to the same meaning.
            reemit_same_meaning(&p)?;
        }
        let _ = frame::parse(&bytes);
        if let Ok(c) = wire::cnp::CnpRepr::parse(&bytes) {
            let mut out = [0u8; 32];
            c.emit(&mut out).unwrap();
            prop_assert_eq!(wire::cnp::CnpRepr::parse(&out), Ok(c));
        }
        if let Ok(r) = pcap::PcapReader::new(&bytes) {
            for rec in r.take(64) {
                let _ = rec;
            }
        }
        let info = IpUdpInfo { src: [10, 0, 0, 1].into(), dst: [10, 0, 0, 2].into(), src_port: 1,
                               dst_port: 4791, ipv4_id: 0, ipv4_flags_frag: 0x4000 };
        let _ = icrc::solve_ipv4_id(&info, &bytes);
        let _ = icrc::check(&info, &bytes);
        let _ = icrc::stored(&bytes);
        let n = bytes.len();
        let _ = icrc::compute_from_headers(&bytes[..n / 3], &bytes[n / 3..n / 2], &bytes[n / 2..]);
    }

    #[test]
    fn packet_parse_never_panics_on_damaged_packets(
        parts in arb_parts(),
        edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..6),
        cut in any::<prop::sample::Index>(),
        opcode: u8)
    {
        let info = IpUdpInfo { src: [10, 0, 0, 1].into(), dst: [10, 0, 0, 2].into(), src_port: 1,
                               dst_port: 4791, ipv4_id: 0, ipv4_flags_frag: 0x4000 };
        let mut buf = sealed(&parts.repr(), &info);
        for (at, v) in edits {
            let at = at.index(buf.len());
            buf[at] = v;
        }
        if opcode % 4 == 0 {
            buf[0] = opcode; // another opcode over the same bytes
        }
        let n = cut.index(buf.len() + 1);
        for bytes in [&buf[..], &buf[..n]] {
            if let Ok(p) = PacketRepr::parse(bytes) {
                reemit_same_meaning(&p)?;
            }
        }
    }

    #[test]
    fn frame_parse_never_panics_on_damaged_frames(
        info in arb_info(),
        payload in prop::collection::vec(any::<u8>(), 0..200),
        edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..6),
        cut in any::<prop::sample::Index>(),
        vlan: bool,
        tos: u8)
    {
        let mut f = frame::build_with_tos(&info, tos, &payload);
        prop_assert_eq!(frame::parse(&f).map(|p| p.tos), Ok(tos));
        if vlan {
            f.splice(12..12, [0x81, 0x00, 0x00, 0x07]);
        }
        match frame::parse(&f) {
            Ok(p) => {
                prop_assert_eq!(p.udp_payload, &payload[..]);
            }
            Err(e) => prop_assert!(false, "{e}"),
        }
        for (at, v) in edits {
            let at = at.index(f.len());
            f[at] = v;
        }
        let n = cut.index(f.len() + 1);
        let _ = frame::parse(&f);
        let _ = frame::parse(&f[..n]);
    }
}

mod cm_mads {
    use proptest::prelude::*;
    use wire::cm::{self, CmMad};
    use wire::cma::{self, CmaHeaderRepr};
    use wire::mad::{self, MadHeaderRepr};

    /// 256 random bytes under a valid CM header with attribute 0x10-0x16.
    fn cm_bytes() -> impl Strategy<Value = Vec<u8>> {
        (
            prop::collection::vec(any::<u8>(), mad::DATA_LEN),
            0x10u16..=0x16,
            any::<u64>(),
            any::<u32>(),
        )
            .prop_map(|(data, attr, tid, modifier)| {
                let mut h = MadHeaderRepr::cm_send(attr, tid);
                h.attribute_modifier = modifier;
                let mut b = vec![0u8; mad::MAD_LEN];
                h.emit(&mut mad::Packet::new_unchecked(&mut b[..mad::HEADER_LEN]));
                b[mad::HEADER_LEN..].copy_from_slice(&data);
                b
            })
    }

    proptest! {
        #[test]
        fn random_bytes_never_panic(b in prop::collection::vec(any::<u8>(), 0..300)) {
            let _ = CmMad::parse(&b);
            // parse checks the length itself, even on an unchecked view.
            let _ = CmaHeaderRepr::parse(&cma::Packet::new_unchecked(&b[..]));
            for attr in 0x10u16..=0x16 {
                let _ = cm::CmMessage::parse(attr, &b);
            }
        }

        /// Whatever parses re-emits to a MAD that parses to the same
        /// meaning, and differs from the input only in reserved bits.
        #[test]
        fn parse_emit_parse(b in cm_bytes()) {
            match CmMad::parse(&b) {
                Ok(m) => {
                    let out = m.to_bytes();
                    prop_assert_eq!(CmMad::parse(&out), Ok(m.clone()));
                    for (i, (x, y)) in b.iter().zip(out.iter()).enumerate() {
                        // Emitting never sets a bit the input did not have.
                        prop_assert_eq!(y & !x, 0, "byte {}", i);
                    }
                    prop_assert_eq!(&out[..18], &b[..18]);
                }
                // Only the reserved REJ/MRA codes are refused.
                Err(e) => prop_assert_eq!(e, wire::Error::Malformed),
            }
        }

        #[test]
        fn cma_header_round_trips(
            port in any::<u16>(),
            v4 in any::<bool>(),
            a in any::<[u8; 16]>(),
            c in any::<[u8; 16]>(),
        ) {
            let (src, dst): (std::net::IpAddr, std::net::IpAddr) = if v4 {
                ([a[0], a[1], a[2], a[3]].into(), [c[0], c[1], c[2], c[3]].into())
            } else {
                (a.into(), c.into())
            };
            let r = CmaHeaderRepr { src_port: port, src, dst };
            let mut buf = [0xffu8; cma::HEADER_LEN];
            r.emit(&mut cma::Packet::new_unchecked(&mut buf[..])).unwrap();
            prop_assert_eq!(CmaHeaderRepr::parse(&cma::Packet::new_checked(&buf[..]).unwrap()), Ok(r));
        }
    }
}
