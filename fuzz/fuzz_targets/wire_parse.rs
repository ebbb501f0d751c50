//! Any bytes through every parser: never a panic; what parses re-emits to
//! something that parses to the same meaning.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(p) = wire::PacketRepr::parse(data) {
        let mut buf = vec![0u8; p.buffer_len()];
        p.emit(&mut buf).expect("a parsed packet must emit");
        let again = wire::PacketRepr::parse(&buf).expect("an emitted packet must parse");
        assert_eq!(again.bth.opcode, p.bth.opcode);
        assert_eq!(again.payload, p.payload);
    }
    let _ = wire::frame::parse(data);
    if let Ok(c) = wire::cnp::CnpRepr::parse(data) {
        let mut buf = [0u8; 32];
        c.emit(&mut buf).expect("a parsed CNP must emit");
        assert_eq!(wire::cnp::CnpRepr::parse(&buf), Ok(c));
    }
    if let Ok(m) = wire::cm::CmMad::parse(data) {
        let again = wire::cm::CmMad::parse(&m.to_bytes()).expect("an emitted CM MAD must parse");
        assert_eq!(again, m);
    }
    let _ = wire::cma::CmaHeaderRepr::parse(&wire::cma::Packet::new_unchecked(data));
    if let Ok(r) = wire::pcap::PcapReader::new(data) {
        for rec in r.take(64) {
            if rec.is_err() {
                break;
            }
        }
    }
    let info = wire::icrc::IpUdpInfo {
        src: "10.0.0.1".parse().unwrap(),
        dst: "10.0.0.2".parse().unwrap(),
        src_port: 49152,
        dst_port: 4791,
        ipv4_id: 0,
        ipv4_flags_frag: 0x4000,
    };
    let _ = wire::icrc::check(&info, data);
    let _ = wire::icrc::solve_ipv4_id(&info, data);
});
