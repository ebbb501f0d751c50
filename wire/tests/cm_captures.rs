//! Every CM MAD of the kernel rdma_cm captures (rdmacm_rping.pcap: REQ,
//! REP, RTU, DREQ, DREP of a real rping; rdmacm_req_to_host.pcap: a REQ,
//! its retransmission, and the REJ kernel cm sends when rping gives up;
//! tests/data/README.md): decoded field by field against what tshark 4.0
//! decodes (`tshark -r F -d udp.port==4791,infiniband -V`), re-emitted
//! byte-identically, and checked for how the kernel frames them on QP1.

mod common;

use std::net::IpAddr;

use common::read_capture;
use wire::cm::{self, CmMad, CmMessage, MessageResponse, RejectReason};
use wire::cma::{self, CmaHeaderRepr, PortSpace};
use wire::pcap::PcapReader;
use wire::{deth, frame, mad, Opcode, PacketRepr};

/// The CM MADs of one capture, with the capture time in ns.
fn cm_mads(file: &str) -> Vec<(u64, Vec<u8>, CmMad)> {
    let bytes = read_capture(file);
    let mut out = Vec::new();
    for (i, rec) in PcapReader::new(&bytes).unwrap().enumerate() {
        let rec = rec.unwrap();
        let f = frame::parse(rec.data).unwrap();
        let p = PacketRepr::parse(f.udp_payload).unwrap();
        if p.bth.dest_qpn != 1 {
            continue;
        }
        // How kernel rxe carries a MAD: UD SEND_ONLY to QP1 from QP1 with
        // the GSI Q_Key, one 256-byte MAD per datagram, PSN 0 (QP1's
        // first), AckReq set.
        assert_eq!(p.bth.opcode, Opcode::UD_SEND_ONLY, "{file} #{i}");
        let d = p.deth.unwrap();
        assert_eq!((d.qkey, d.src_qpn), (deth::GSI_QKEY, 1), "{file} #{i}");
        assert_eq!(p.payload.len(), mad::MAD_LEN, "{file} #{i}");
        assert_eq!(f.udp_payload.len(), 280, "{file} #{i}: BTH+DETH+MAD+ICRC");
        let m = CmMad::parse(p.payload).unwrap_or_else(|e| panic!("{file} #{i}: {e}"));
        out.push((rec.ts_ns, p.payload.to_vec(), m));
    }
    out
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn gid_v4(a: [u8; 4]) -> [u8; 16] {
    let mut g = [0u8; 16];
    g[10] = 0xff;
    g[11] = 0xff;
    g[12..].copy_from_slice(&a);
    g
}

#[test]
fn every_cm_mad_re_emits_byte_identical() {
    let mut n = 0;
    for file in ["rdmacm_rping.pcap", "rdmacm_req_to_host.pcap"] {
        for (_, bytes, m) in cm_mads(file) {
            assert_eq!(m.to_bytes().as_slice(), bytes.as_slice(), "{file}");
            let mut buf = vec![0xa5u8; mad::MAD_LEN];
            m.emit(&mut buf).unwrap();
            assert_eq!(buf, bytes, "{file}");
            n += 1;
        }
    }
    assert_eq!(n, 8, "5 MADs in rdmacm_rping, 3 in rdmacm_req_to_host");
}

#[test]
fn rping_exchange_decodes_as_tshark_does() {
    let mads = cm_mads("rdmacm_rping.pcap");
    let attrs: Vec<u16> = mads
        .iter()
        .map(|(_, _, m)| m.message.attribute_id())
        .collect();
    assert_eq!(
        attrs,
        [
            cm::attr::REQ,
            cm::attr::REP,
            cm::attr::RTU,
            cm::attr::DREQ,
            cm::attr::DREP
        ]
    );
    // Every MAD of the exchange carries the active side's TID: kernel
    // cm_form_tid (hi_tid 2 << 32 | the comm ID 0x4f5bc80c as the little-
    // endian host stored it), echoed by the passive side's REP and DREP.
    for (_, bytes, m) in &mads {
        assert_eq!(m.transaction_id, 0x0000_0002_0cc8_5b4f);
        assert_eq!(m.attribute_modifier, 0);
        let h = mad::MadHeaderRepr::parse(&mad::Packet::new_checked(&bytes[..]).unwrap()).unwrap();
        assert_eq!(h, m.header());
        assert_eq!((h.base_version, h.mgmt_class, h.class_version), (1, 7, 2));
        assert_eq!((h.method, h.status, h.class_specific), (3, 0, 0));
    }

    let CmMessage::Req(req) = &mads[0].2.message else {
        panic!("not a REQ")
    };
    assert_eq!(req.local_comm_id, 0x4f5b_c80c);
    assert_eq!(req.vendor_id, 0);
    assert_eq!(req.service_id, 0x0000_0000_0106_1c06);
    assert_eq!(
        cma::parse_ip_service_id(req.service_id),
        Some((PortSpace::Tcp, 7174))
    );
    assert_eq!(req.local_ca_guid, 0x5054_00ff_fe77_000c);
    assert_eq!(req.local_qkey, 0);
    assert_eq!((req.local_qpn, req.responder_resources), (0x1a, 1));
    assert_eq!((req.local_eecn, req.initiator_depth), (0, 1));
    assert_eq!(req.remote_eecn, 0);
    assert_eq!(req.remote_cm_response_timeout, 0x14);
    assert_eq!(
        (req.transport_type, req.end_to_end_flow_control),
        (0, false)
    );
    assert_eq!(req.starting_psn, 0x9d9f00);
    assert_eq!((req.local_cm_response_timeout, req.retry_count), (0x14, 7));
    assert_eq!(req.pkey, 0xffff);
    assert_eq!(
        (req.path_mtu, req.rdc_exists, req.rnr_retry_count),
        (3, false, 7)
    );
    assert_eq!(
        (req.max_cm_retries, req.srq, req.extended_transport_type),
        (15, false, 0)
    );
    let p = &req.primary_path;
    assert_eq!((p.local_lid, p.remote_lid), (0xffff, 0xffff));
    assert_eq!(p.local_gid, gid_v4([10, 77, 0, 12]));
    assert_eq!(p.remote_gid, gid_v4([10, 77, 0, 11]));
    // tshark 4.0 shows "Primary Flow Label: 0x006a2" and "Packet Rate:
    // 0x2a": its dissector reads this word misaligned. By the kernel's
    // layout (ibta_vol1_c12.h: flow label = top 20 bits of bytes 88-91,
    // rate = low 6 bits of byte 91) the bytes 6a 20 60 00 are flow label
    // 0x6a206 and rate 0; the byte-identical re-emit above holds either way.
    assert_eq!((p.flow_label, p.packet_rate), (0x6a206, 0));
    assert_eq!(
        (p.traffic_class, p.hop_limit, p.sl, p.subnet_local),
        (0, 0x40, 0, false)
    );
    // 0x13 = kernel cm_ack_timeout(rxe's ack_delay 15, packet life 18).
    assert_eq!(p.local_ack_timeout, 0x13);
    assert!(req.alternate_path.is_absent());
    assert!(!req.sap_supported);
    let hdr =
        CmaHeaderRepr::parse(&cma::Packet::new_checked(&req.private_data[..]).unwrap()).unwrap();
    assert_eq!(
        hdr,
        CmaHeaderRepr {
            src_port: 0xba00,
            src: ip("10.77.0.12"),
            dst: ip("10.77.0.11")
        }
    );
    assert!(req.private_data[cma::HEADER_LEN..].iter().all(|b| *b == 0));

    let CmMessage::Rep(rep) = &mads[1].2.message else {
        panic!("not a REP")
    };
    assert_eq!(
        (rep.local_comm_id, rep.remote_comm_id),
        (0xd672_d11f, 0x4f5b_c80c)
    );
    assert_eq!(
        (rep.local_qkey, rep.local_qpn, rep.local_eecn),
        (0, 0x1a, 0)
    );
    assert_eq!((rep.starting_psn, rep.vendor_id), (0x2cba7f, 0));
    assert_eq!((rep.responder_resources, rep.initiator_depth), (1, 1));
    assert_eq!((rep.target_ack_delay, rep.failover_accepted), (0x0f, 0));
    assert_eq!(
        (rep.end_to_end_flow_control, rep.rnr_retry_count, rep.srq),
        (false, 7, false)
    );
    assert_eq!(rep.local_ca_guid, 0x5054_00ff_fe77_000b);
    assert!(rep.private_data.iter().all(|b| *b == 0));

    let CmMessage::Rtu(rtu) = &mads[2].2.message else {
        panic!("not an RTU")
    };
    assert_eq!(
        (rtu.local_comm_id, rtu.remote_comm_id),
        (0x4f5b_c80c, 0xd672_d11f)
    );
    let CmMessage::Dreq(dreq) = &mads[3].2.message else {
        panic!("not a DREQ")
    };
    assert_eq!(
        (dreq.local_comm_id, dreq.remote_comm_id),
        (0x4f5b_c80c, 0xd672_d11f)
    );
    assert_eq!(dreq.remote_qpn, 0x1a);
    let CmMessage::Drep(drep) = &mads[4].2.message else {
        panic!("not a DREP")
    };
    assert_eq!(
        (drep.local_comm_id, drep.remote_comm_id),
        (0xd672_d11f, 0x4f5b_c80c)
    );
}

#[test]
fn unanswered_req_is_retransmitted_then_rejected_with_timeout() {
    let mads = cm_mads("rdmacm_req_to_host.pcap");
    assert_eq!(mads.len(), 3);
    let (t0, b0, m0) = &mads[0];
    let (t1, b1, _) = &mads[1];
    // The retransmission is the same MAD, byte for byte...
    assert_eq!(b0, b1);
    // ...6144 ms later: kernel cm's REQ timeout, 2 × cm_convert_to_ms(18)
    // (packet life time) + cm_convert_to_ms(20) (remote CM response
    // timeout) = 2 × 1024 + 4096 ms, plus scheduling delay.
    let gap_ms = (t1 - t0) / 1_000_000;
    assert!(
        (6144..6400).contains(&gap_ms),
        "REQ retransmitted after {gap_ms} ms"
    );
    let CmMessage::Req(req) = &m0.message else {
        panic!("not a REQ")
    };
    assert_eq!(req.local_comm_id, 0x4e5b_c80c);
    assert_eq!((req.local_qpn, req.starting_psn), (0x1d, 0xe62523));
    let hdr =
        CmaHeaderRepr::parse(&cma::Packet::new_checked(&req.private_data[..]).unwrap()).unwrap();
    assert_eq!(
        hdr,
        CmaHeaderRepr {
            src_port: 0x8b70,
            src: ip("10.77.0.12"),
            dst: ip("10.77.0.1")
        }
    );

    // rping gives up: ib_destroy_cm_id in REQ_SENT sends REJ(TIMEOUT) with
    // the local CA GUID as ARI, message rejected "other", same TID.
    let (_, _, m2) = &mads[2];
    assert_eq!(m2.transaction_id, m0.transaction_id);
    let CmMessage::Rej(rej) = &m2.message else {
        panic!("not a REJ")
    };
    assert_eq!((rej.local_comm_id, rej.remote_comm_id), (0x4e5b_c80c, 0));
    assert_eq!(rej.message_rejected, MessageResponse::Other);
    assert_eq!(rej.reason, RejectReason::TIMEOUT);
    assert_eq!(rej.reason.to_string(), "timeout (4)");
    assert_eq!(rej.ari_length, 8);
    assert_eq!(rej.ari_bytes(), 0x5054_00ff_fe77_000cu64.to_be_bytes());
    assert!(rej.private_data.iter().all(|b| *b == 0));
}
