//! Every packet of the kernel-rxe reference captures (Linux 6.1 rdma_rxe,
//! see tests/data/README.md): ICRC agreement both ways, parse, and
//! byte-identical re-emit from the Repr.

use std::collections::BTreeMap;

use wire::aeth::Syndrome;
use wire::frame;
use wire::icrc;
use wire::pcap::PcapReader;
use wire::PacketRepr;

fn captures() -> Vec<(String, Vec<u8>)> {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data");
    let mut v: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "pcap"))
        .map(|p| {
            (
                p.file_name().unwrap().to_string_lossy().into_owned(),
                std::fs::read(&p).unwrap(),
            )
        })
        .collect();
    v.sort();
    v
}

#[test]
fn every_captured_packet_round_trips_with_its_icrc() {
    let mut total = 0;
    let mut opcodes: BTreeMap<String, BTreeMap<u8, usize>> = BTreeMap::new();
    let mut syndromes = BTreeMap::new();
    for (name, bytes) in captures() {
        for rec in PcapReader::new(&bytes).unwrap() {
            let rec = rec.unwrap();
            total += 1;
            let f = frame::parse(rec.data).unwrap_or_else(|e| panic!("{name}: frame: {e}"));
            let udp = f.udp_payload;
            let stored = icrc::stored(udp).unwrap();
            let roce = &udp[..udp.len() - 4];
            assert_eq!(
                icrc::compute_from_headers(f.ip_header, f.udp_header, roce).unwrap(),
                stored,
                "{name}"
            );
            assert_eq!(icrc::compute(&f.info, roce), stored, "{name}");
            assert!(icrc::check(&f.info, udp));
            // Through a UDP socket the IP ID is hidden; solving recovers it.
            assert_eq!(
                icrc::solve_ipv4_id(
                    &icrc::IpUdpInfo {
                        ipv4_id: 0,
                        ..f.info
                    },
                    udp
                ),
                Some(f.info.ipv4_id),
                "{name}"
            );
            let p = PacketRepr::parse(udp).unwrap_or_else(|e| panic!("{name}: parse: {e}"));
            let mut out = vec![0u8; p.buffer_len()];
            p.emit(&mut out).unwrap();
            icrc::write(&f.info, &mut out);
            assert_eq!(out, udp, "{name}: re-emitted packet differs");
            *opcodes
                .entry(name.clone())
                .or_default()
                .entry(p.bth.opcode.0)
                .or_default() += 1;
            if let Some(a) = p.aeth {
                *syndromes.entry(a.syndrome.to_raw()).or_insert(0) += 1;
                assert_eq!(Syndrome::from_raw(a.syndrome.to_raw()), a.syndrome);
            }
            // Every captured packet is what kernel rxe sends: P_Key 0xffff, TVer 0, DF.
            assert_eq!(p.bth.pkey, 0xffff);
            assert_eq!(f.info.ipv4_flags_frag, 0x4000);
            assert_eq!(f.info.dst_port, 4791);
        }
    }
    assert_eq!(total, 488, "the reference captures hold 488 packets");
    for s in [0x1f, 0x2c, 0x60] {
        assert!(
            syndromes.contains_key(&s),
            "AETH syndrome {s:#x} missing: {syndromes:?}"
        );
    }
    let o = |f: &str| opcodes[f].keys().copied().collect::<Vec<u8>>();
    assert_eq!(o("rc_send_multi.pcap"), vec![0, 1, 2, 17]);
    assert_eq!(o("rc_write.pcap"), vec![6, 7, 8, 17]);
    assert_eq!(o("rc_read.pcap"), vec![12, 13, 14, 15]);
    assert_eq!(o("rc_atomic_fadd.pcap"), vec![18, 20]);
    assert_eq!(o("rc_atomic_cswap.pcap"), vec![18, 19]);
    assert_eq!(o("uc_write.pcap"), vec![38, 39, 40]);
    assert_eq!(o("ud_send.pcap"), vec![100]);
    assert_eq!(o("rdmacm_rping.pcap"), vec![4, 10, 12, 16, 17, 100]);
}

#[test]
fn corrupted_captured_packets_fail_the_icrc() {
    let (_, bytes) = captures()
        .into_iter()
        .find(|(n, _)| n == "rc_read.pcap")
        .unwrap();
    for rec in PcapReader::new(&bytes).unwrap().take(6) {
        let f = frame::parse(rec.unwrap().data).unwrap();
        let mut udp = f.udp_payload.to_vec();
        let bits = udp.len() * 8;
        for bit in (0..bits).step_by(7) {
            if bit / 8 == 4 {
                continue; // BTH byte 4 is masked by design
            }
            udp[bit / 8] ^= 1 << (bit % 8);
            assert!(
                !icrc::check(&f.info, &udp),
                "flip of bit {bit} not detected"
            );
            assert_eq!(
                icrc::solve_ipv4_id(
                    &icrc::IpUdpInfo {
                        ipv4_id: 0,
                        ..f.info
                    },
                    &udp
                ),
                None,
                "bit {bit}"
            );
            udp[bit / 8] ^= 1 << (bit % 8);
        }
        // The masked byte really is outside the ICRC.
        udp[4] ^= 0xc0;
        assert!(icrc::check(&f.info, &udp));
    }
}
