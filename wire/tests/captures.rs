//! Every packet of the kernel rxe reference captures (488 packets, Linux
//! 6.1 rdma_rxe; tests/data/README.md): framing, ICRC agreement both ways,
//! IPv4 ID recovery, parse, and byte-identical re-emit.

mod common;

use std::collections::{BTreeMap, BTreeSet};

use common::{for_each_packet, read_capture, CAPTURES, TOTAL_PACKETS};
use wire::aeth::{NakCode, Syndrome, CREDITS_INVALID};
use wire::icrc::{self, IpUdpInfo};
use wire::pcap::{PcapReader, PcapWriter};
use wire::{frame, Opcode, PacketRepr, Transport};

#[test]
fn every_captured_packet_round_trips_byte_identical() {
    let mut total = 0;
    let mut per_file: BTreeMap<&str, (usize, BTreeSet<u8>)> = BTreeMap::new();
    for_each_packet(|c| {
        let at = format!("{} #{}", c.file, c.index);
        let f = &c.parsed;
        let udp = f.udp_payload;
        total += 1;

        // ICRC both ways: from the real header bytes, and from the IP/UDP
        // information alone (what a UDP socket gives).
        let stored = icrc::stored(udp).unwrap();
        let roce = &udp[..udp.len() - wire::ICRC_LEN];
        assert_eq!(
            icrc::compute_from_headers(f.ip_header, f.udp_header, roce),
            Ok(stored),
            "{at}"
        );
        assert_eq!(icrc::compute(&f.info, roce), stored, "{at}");
        assert!(icrc::check(&f.info, udp), "{at}");

        // With the IP ID hidden (as a UDP socket hides it), solving
        // recovers the real one.
        let hidden = IpUdpInfo {
            ipv4_id: 0,
            ..f.info
        };
        assert_eq!(
            icrc::solve_ipv4_id(&hidden, udp),
            Some(f.info.ipv4_id),
            "{at}"
        );

        // Parse, emit, seal: the same bytes.
        let p = PacketRepr::parse(udp).unwrap_or_else(|e| panic!("{at}: {e}"));
        let mut out = vec![0u8; p.buffer_len()];
        p.emit(&mut out).unwrap();
        icrc::write(&f.info, &mut out);
        assert_eq!(out, udp, "{at}: re-emitted packet differs");

        // And the frame around it: frame::build reproduces kernel rxe's IP
        // and UDP headers exactly (only the MACs are ours).
        let rebuilt = frame::build(&f.info, udp);
        assert_eq!(
            &rebuilt[12..],
            &c.frame[12..],
            "{at}: IP/UDP headers differ"
        );

        // What every kernel rxe packet looks like.
        assert_eq!(f.info.dst_port, wire::ROCEV2_UDP_PORT, "{at}");
        assert_eq!(f.info.src_port & 0xc000, 0xc000, "{at}: rxe source ports");
        assert_eq!(f.info.ipv4_flags_frag, 0x4000, "{at}: DF");
        assert_eq!(f.ip_header[8], 64, "{at}: TTL");
        assert_eq!(f.ip_header[1], 0, "{at}: TOS");
        assert_eq!(&f.udp_header[6..8], &[0, 0], "{at}: UDP checksum");
        assert_eq!(p.bth.pkey, 0xffff, "{at}");
        assert_eq!((p.bth.tver, p.bth.mig_req), (0, false), "{at}");
        assert_eq!(roce[4], 0, "{at}: FECN/BECN/resv6a");
        assert_eq!(roce[8] & 0x7f, 0, "{at}: resv7");
        assert_ne!(p.bth.opcode.transport(), Transport::Rd, "{at}");

        let entry = per_file.entry(c.file).or_default();
        entry.0 += 1;
        entry.1.insert(p.bth.opcode.0);
    });
    assert_eq!(
        total, TOTAL_PACKETS,
        "the reference captures hold 488 packets"
    );
    for (file, count, opcodes) in CAPTURES {
        let (n, seen) = &per_file[file];
        assert_eq!(*n, count, "{file}: packet count");
        assert_eq!(
            seen.iter().copied().collect::<Vec<_>>(),
            opcodes,
            "{file}: opcodes"
        );
    }
}

/// The AETH syndromes and what they say, per file.
fn syndromes(file: &str) -> BTreeMap<u8, usize> {
    let bytes = read_capture(file);
    let mut seen = BTreeMap::new();
    for rec in PcapReader::new(&bytes).unwrap() {
        let f = frame::parse(rec.unwrap().data).unwrap();
        let p = PacketRepr::parse(f.udp_payload).unwrap();
        if let Some(aeth) = p.aeth {
            *seen.entry(aeth.syndrome.to_raw()).or_insert(0) += 1;
        }
    }
    seen
}

#[test]
fn rnr_nak_capture_has_ack_rnr_nak_and_sequence_nak() {
    let seen = syndromes("rc_rnr_nak.pcap");
    assert_eq!(
        seen.keys().copied().collect::<Vec<_>>(),
        vec![0x1f, 0x2c, 0x60],
        "{seen:?}"
    );
    assert_eq!(
        Syndrome::from_raw(0x1f),
        Syndrome::Ack {
            credits: CREDITS_INVALID
        }
    );
    assert_eq!(Syndrome::from_raw(0x2c), Syndrome::RnrNak { timer: 12 });
    assert_eq!(
        Syndrome::from_raw(0x60),
        Syndrome::Nak(NakCode::PsnSequenceError)
    );
    // rc_retransmit.pcap: 7 PSN sequence NAKs among its ACKs (README).
    let seen = syndromes("rc_retransmit.pcap");
    assert_eq!(seen.get(&0x60), Some(&7), "{seen:?}");
    assert_eq!(seen.keys().copied().collect::<Vec<_>>(), vec![0x1f, 0x60]);
}

#[test]
fn captured_headers_mean_what_the_logs_say() {
    // rc_read.pcap: five READ requests of 2500 bytes, PSNs 3 apart; then
    // the responses: 1024, 1024 and 452 bytes (path MTU 1024), AETH on
    // first and last only, PSNs from the request's.
    let bytes = read_capture("rc_read.pcap");
    let mut lens = Vec::new();
    for rec in PcapReader::new(&bytes).unwrap().take(8) {
        let f = frame::parse(rec.unwrap().data).unwrap();
        let p = PacketRepr::parse(f.udp_payload).unwrap();
        if p.bth.opcode == Opcode::RC_RDMA_READ_REQUEST {
            assert_eq!(p.reth.unwrap().dma_len, 2500);
            assert!(p.bth.ack_req);
        } else {
            let first = wire::Psn::new(15_224_777);
            lens.push((p.bth.opcode, p.payload.len(), p.aeth.is_some()));
            assert_eq!(p.bth.psn.diff(first), lens.len() as i32 - 1);
        }
    }
    assert_eq!(
        lens,
        vec![
            (Opcode::RC_RDMA_READ_RESPONSE_FIRST, 1024, true),
            (Opcode::RC_RDMA_READ_RESPONSE_MIDDLE, 1024, false),
            (Opcode::RC_RDMA_READ_RESPONSE_LAST, 452, true),
        ]
    );
    // rdmacm captures: CM MADs are UD SEND ONLY to QP1 with the GSI Q_Key,
    // 256-byte MADs.
    let bytes = read_capture("rdmacm_req_to_host.pcap");
    for rec in PcapReader::new(&bytes).unwrap() {
        let f = frame::parse(rec.unwrap().data).unwrap();
        assert_eq!(f.udp_payload.len(), 280);
        let p = PacketRepr::parse(f.udp_payload).unwrap();
        assert_eq!(p.bth.dest_qpn, 1);
        let deth = p.deth.unwrap();
        assert_eq!((deth.qkey, deth.src_qpn), (wire::deth::GSI_QKEY, 1));
        assert_eq!(p.payload.len(), 256);
    }
}

/// Single-bit flips of captured packets: the ICRC catches every one (CRC-32
/// detects all single-bit errors), and with the IP ID unknown,
/// `solve_ipv4_id` still rejects every flip of this fixed set: the first
/// two packets of every capture, every bit but the masked BTH byte 4.
#[test]
fn corrupted_captured_packets_fail_the_icrc_and_id_solving() {
    let mut flips = 0;
    for_each_packet(|c| {
        if c.index >= 2 {
            return;
        }
        let f = &c.parsed;
        let hidden = IpUdpInfo {
            ipv4_id: 0,
            ..f.info
        };
        let mut udp = f.udp_payload.to_vec();
        for bit in 0..udp.len() * 8 {
            if bit / 8 == 4 {
                continue; // BTH byte 4 is masked by design
            }
            udp[bit / 8] ^= 1 << (bit % 8);
            assert!(!icrc::check(&f.info, &udp), "{} bit {bit}", c.file);
            assert_eq!(
                icrc::solve_ipv4_id(&hidden, &udp),
                None,
                "{} #{} bit {bit}",
                c.file,
                c.index
            );
            udp[bit / 8] ^= 1 << (bit % 8);
            flips += 1;
        }
        // The masked byte really is outside the ICRC.
        udp[4] ^= 0xc0;
        assert!(icrc::check(&f.info, &udp));
    });
    assert_eq!(flips, 83_328, "single-bit flips tried");
}

#[test]
fn pcap_writer_reader_round_trip_of_every_capture() {
    for (file, count, _) in CAPTURES {
        let bytes = read_capture(file);
        let original: Vec<_> = PcapReader::new(&bytes)
            .unwrap()
            .map(Result::unwrap)
            .collect();
        assert_eq!(original.len(), count);

        // Frames as captured.
        let mut w = PcapWriter::new(Vec::new()).unwrap();
        for rec in &original {
            w.write_frame(rec.ts_ns, rec.data).unwrap();
        }
        let copy = w.into_inner();
        let again: Vec<_> = PcapReader::new(&copy)
            .unwrap()
            .map(Result::unwrap)
            .collect();
        assert_eq!(again, original, "{file}");

        // UDP payloads framed by us: the same payloads and addresses come
        // back, timestamps kept to the nanosecond.
        let mut w = PcapWriter::new(Vec::new()).unwrap();
        for rec in &original {
            let f = frame::parse(rec.data).unwrap();
            w.write_roce(rec.ts_ns + 7, &f.info, f.udp_payload).unwrap();
        }
        let ours = w.into_inner();
        let reader = PcapReader::new(&ours).unwrap();
        assert!(reader.is_nanosecond());
        for (rec, orig) in reader.zip(&original) {
            let rec = rec.unwrap();
            assert_eq!(rec.ts_ns, orig.ts_ns + 7);
            let (a, b) = (
                frame::parse(rec.data).unwrap(),
                frame::parse(orig.data).unwrap(),
            );
            assert_eq!((a.info, a.udp_payload), (b.info, b.udp_payload), "{file}");
        }
    }
}
