//! Property tests: PSN arithmetic across wrap-around, PacketRepr emit/parse
//! round trips for every opcode of the table, and parsers that never panic.

use proptest::prelude::*;
use wire::aeth::{AethRepr, Syndrome};
use wire::atomic::{AtomicAckRepr, AtomicEthRepr};
use wire::bth::BthRepr;
use wire::deth::DethRepr;
use wire::feth::FethRepr;
use wire::icrc::IpUdpInfo;
use wire::ieth::IethRepr;
use wire::immdt::ImmDtRepr;
use wire::rdeth::RdethRepr;
use wire::reth::RethRepr;
use wire::{OpFlags, Opcode, PacketRepr, Psn};

const MAX: u32 = 0x00ff_ffff;

proptest! {
    #[test]
    fn psn_add_sub_inverse(a in 0..=MAX, n in 0u32..=MAX) {
        let p = Psn::new(a);
        prop_assert_eq!(p.add(n).sub(n), p);
        prop_assert_eq!(p.add(n).value(), (a + n) & MAX);
    }

    #[test]
    fn psn_diff_is_antisymmetric_and_circular(a in 0..=MAX, d in -(1i32 << 23) + 1..(1i32 << 23)) {
        let p = Psn::new(a);
        let q = if d >= 0 { p.add(d as u32) } else { p.sub((-d) as u32) };
        prop_assert_eq!(q.diff(p), d);
        prop_assert_eq!(p.diff(q), -d);
        prop_assert_eq!(q.is_after(p), d > 0);
        prop_assert_eq!(q.is_before(p), d < 0);
    }

    #[test]
    fn psn_window(start in 0..=MAX, len in 1u32..1000, off in 0u32..2000) {
        let s = Psn::new(start);
        prop_assert_eq!(s.add(off).in_window(s, len), off < len);
    }

    #[test]
    fn packet_round_trip(op_idx in 0usize..60, qpn in 0..=MAX, psn in 0..=MAX, pkey: u16, se: bool, ack: bool,
                         va: u64, key: u32, len: u32, x: u64, y: u64, syn: u8, msn in 0..=MAX,
                         payload in proptest::collection::vec(any::<u8>(), 0..4200)) {
        let ops: Vec<Opcode> = (0..=255u8).map(Opcode).filter(|o| o.info().is_some()).collect();
        let op = ops[op_idx % ops.len()];
        let f = op.info().unwrap().flags;
        let has = |h| f.contains(h);
        let payload: &[u8] = if has(OpFlags::PAYLOAD) { &payload } else { &[] };
        let repr = PacketRepr {
            bth: BthRepr { opcode: op, solicited: se, mig_req: false, pad_count: ((4 - payload.len() % 4) % 4) as u8, tver: 0, pkey, fecn: false, becn: false, dest_qpn: qpn, ack_req: ack, psn: Psn::new(psn) },
            rdeth: has(OpFlags::RDETH).then_some(RdethRepr { een: qpn }),
            deth: has(OpFlags::DETH).then_some(DethRepr { qkey: key, src_qpn: msn }),
            reth: has(OpFlags::RETH).then_some(RethRepr { va, rkey: key, dma_len: len }),
            feth: has(OpFlags::FETH).then_some(FethRepr { selectivity: syn & 3, placement: syn & 0xf }),
            atomic: has(OpFlags::ATMETH).then_some(AtomicEthRepr { va, rkey: key, swap_add: x, compare: y }),
            aeth: has(OpFlags::AETH).then_some(AethRepr { syndrome: Syndrome::from_raw(syn), msn }),
            atomic_ack: has(OpFlags::ATMACK).then_some(AtomicAckRepr { orig: x }),
            immdt: has(OpFlags::IMMDT).then_some(ImmDtRepr { imm: key }),
            ieth: has(OpFlags::IETH).then_some(IethRepr { rkey: key }),
            payload,
        };
        let mut buf = vec![0u8; repr.buffer_len()];
        repr.emit(&mut buf).unwrap();
        let info = IpUdpInfo { src: "10.0.0.1".parse().unwrap(), dst: "10.0.0.2".parse().unwrap(), src_port: 49152, dst_port: 4791, ipv4_id: (x & 0xffff) as u16, ipv4_flags_frag: 0x4000 };
        wire::icrc::write(&info, &mut buf);
        prop_assert!(wire::icrc::check(&info, &buf));
        prop_assert_eq!(wire::icrc::solve_ipv4_id(&IpUdpInfo { ipv4_id: 0, ..info }, &buf), Some(info.ipv4_id));
        let back = PacketRepr::parse(&buf).unwrap();
        prop_assert_eq!(back, repr);
    }

    #[test]
    fn parsers_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
        let _ = PacketRepr::parse(&bytes);
        let _ = wire::frame::parse(&bytes);
        if let Ok(r) = wire::pcap::PcapReader::new(&bytes) {
            for rec in r.take(16) {
                let _ = rec;
            }
        }
        let info = IpUdpInfo { src: "10.0.0.1".parse().unwrap(), dst: "10.0.0.2".parse().unwrap(), src_port: 1, dst_port: 4791, ipv4_id: 0, ipv4_flags_frag: 0x4000 };
        let _ = wire::icrc::solve_ipv4_id(&info, &bytes);
        let _ = wire::icrc::check(&info, &bytes);
    }
}
