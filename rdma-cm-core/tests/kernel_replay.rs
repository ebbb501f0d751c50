//! The endpoint in either host's place of the kernel rping exchange
//! (wire/tests/data/rdmacm_rping.pcap, Linux 6.1 rdma_cm over rxe): fed
//! the other host's real MADs, it must send exactly the MADs the kernel
//! sent, byte for byte (comm IDs, TIDs, QPNs, PSNs, timeouts, private
//! data). And the unanswered REQ of rdmacm_req_to_host.pcap: retransmitted
//! after 6144 ms, then REJ TIMEOUT when the consumer gives up.

use std::time::{Duration, Instant};

use rdma_cm_core::timing::{
    CMA_CM_RESPONSE_TIMEOUT, CMA_IBOE_PACKET_LIFETIME, CMA_MAX_CM_RETRIES, RXE_ACK_DELAY,
};
use rdma_cm_core::{AcceptParams, Config, ConnId, ConnectParams, Endpoint, Event, State};
use wire::cm::{CmMad, CmMessage, PathRepr};
use wire::cma::{self, CmaHeaderRepr, PortSpace};
use wire::pcap::PcapReader;
use wire::{frame, PacketRepr};

const VM1: [u8; 16] = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 77, 0, 11];
const VM2: [u8; 16] = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 77, 0, 12];
const HOST: [u8; 16] = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 77, 0, 1];

/// (capture time ns, source GID, MAD bytes) of every CM MAD of a capture.
fn mads(name: &str) -> Vec<(u64, [u8; 16], Vec<u8>)> {
    let path = format!("{}/../wire/tests/data/{name}", env!("CARGO_MANIFEST_DIR"));
    let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let mut out = Vec::new();
    for rec in PcapReader::new(&bytes).unwrap() {
        let rec = rec.unwrap();
        let f = frame::parse(rec.data).unwrap();
        let p = PacketRepr::parse(f.udp_payload).unwrap();
        if p.bth.dest_qpn == 1 {
            let std::net::IpAddr::V4(src) = f.info.src else {
                panic!("IPv4 capture")
            };
            let mut gid = [0u8; 16];
            gid[10] = 0xff;
            gid[11] = 0xff;
            gid[12..].copy_from_slice(&src.octets());
            out.push((rec.ts_ns, gid, p.payload.to_vec()));
        }
    }
    out
}

/// The endpoint config that makes comm ID number 1 come out as `id`.
fn config(guid: u64, id: u32) -> Config {
    Config {
        local_ca_guid: guid,
        ack_delay: RXE_ACK_DELAY,
        hi_tid: 2,
        comm_id_operand: id ^ 1,
    }
}

fn sole_transmit(ep: &mut Endpoint) -> ([u8; 16], [u8; 256]) {
    let t = ep.poll_transmit().expect("a MAD to send");
    assert!(ep.poll_transmit().is_none(), "exactly one MAD");
    (t.dst_gid, t.mad)
}

#[test]
fn passive_side_answers_the_kernel_req_as_the_kernel_did() {
    let m = mads("rdmacm_rping.pcap");
    let (req, rep, rtu, dreq, drep) = (&m[0], &m[1], &m[2], &m[3], &m[4]);
    let t0 = Instant::now();
    let mut ep = Endpoint::new(config(0x5054_00ff_fe77_000b, 0xd672_d11f));
    ep.listen(cma::ip_service_id(PortSpace::Tcp, 7174)).unwrap();

    ep.handle_mad(t0, req.1, &req.2);
    let Some(Event::ConnectRequest {
        id,
        remote_gid,
        req: r,
        ece_attr_mod,
    }) = ep.poll_event()
    else {
        panic!("no ConnectRequest")
    };
    assert_eq!(id, ConnId(0xd672_d11f));
    assert_eq!(remote_gid, VM2);
    // Kernel rdma_cm without ECE: vendor ID and attribute modifier 0.
    assert_eq!((r.vendor_id, ece_attr_mod), (0, 0));
    assert_eq!(
        (r.local_qpn, r.starting_psn, r.local_comm_id),
        (0x1a, 0x9d9f00, 0x4f5b_c80c)
    );
    assert_eq!(r.primary_path.remote_gid, VM1);
    let hdr =
        CmaHeaderRepr::parse(&cma::Packet::new_checked(&r.private_data[..]).unwrap()).unwrap();
    assert_eq!(
        (hdr.src_port, hdr.src.to_string(), hdr.dst.to_string()),
        (0xba00, "10.77.0.12".into(), "10.77.0.11".into())
    );
    assert_eq!(ep.state(id), Some(State::ReqRcvd));
    assert!(ep.poll_transmit().is_none());

    // rping's server accepts: QPN 0x1a, PSN 0x2cba7f, 1 resource each way,
    // RNR retry 7, no private data (librdmacm's ucma sends none for it).
    let accept = AcceptParams {
        qpn: 0x1a,
        starting_psn: 0x2cba7f,
        responder_resources: 1,
        initiator_depth: 1,
        failover_accepted: 0,
        flow_control: false,
        rnr_retry_count: 7,
        srq: false,
        private_data: vec![],
        ece_vendor_id: 0,
        ece_attr_mod: 0,
    };
    let t1 = t0 + Duration::from_millis(49);
    ep.accept(t1, id, &accept).unwrap();
    let (dst, out) = sole_transmit(&mut ep);
    assert_eq!(dst, VM2);
    assert_eq!(
        out.as_slice(),
        rep.2.as_slice(),
        "our REP differs from the kernel's"
    );
    assert_eq!(ep.state(id), Some(State::RepSent));
    // Unanswered, it would be resent after cm_convert_to_ms(REQ local CM
    // response timeout 20) = 4096 ms.
    assert_eq!(ep.poll_timeout(), Some(t1 + Duration::from_millis(4096)));

    // A duplicate of the REQ now is dropped (kernel cm_dup_req_handler:
    // only MRA_REQ_SENT and TIMEWAIT answer; the REP has its own timer).
    ep.handle_mad(t1, req.1, &req.2);
    assert!(ep.poll_transmit().is_none());

    ep.handle_mad(t1, rtu.1, &rtu.2);
    assert!(matches!(ep.poll_event(), Some(Event::Established { id: e, .. }) if e == id));
    assert_eq!(ep.state(id), Some(State::Established));
    assert_eq!(ep.poll_timeout(), None);

    let t2 = t1 + Duration::from_millis(70);
    ep.handle_mad(t2, dreq.1, &dreq.2);
    let (dst, out) = sole_transmit(&mut ep);
    assert_eq!(dst, VM2);
    assert_eq!(
        out.as_slice(),
        drep.2.as_slice(),
        "our DREP differs from the kernel's"
    );
    assert!(
        matches!(ep.poll_event(), Some(Event::Disconnected { id: e, private_data: Some(_) }) if e == id)
    );
    assert_eq!(ep.state(id), Some(State::Timewait));
    // TIMEWAIT: cm_convert_to_ms(av.timeout 19) = 2048 ms. A duplicate
    // DREQ meanwhile gets the same DREP again.
    ep.handle_mad(t2, dreq.1, &dreq.2);
    assert_eq!(sole_transmit(&mut ep).1.as_slice(), drep.2.as_slice());
    assert_eq!(ep.poll_timeout(), Some(t2 + Duration::from_millis(2048)));
    ep.handle_timeout(t2 + Duration::from_millis(2047));
    assert_eq!(ep.state(id), Some(State::Timewait));
    ep.handle_timeout(t2 + Duration::from_millis(2048));
    assert_eq!(ep.poll_event(), Some(Event::TimewaitExit { id }));
    assert_eq!(ep.state(id), None);
    assert_eq!(ep.dropped(), 1, "the duplicate REQ");
}

/// What kernel rdma_cm (rping's client) put into its REQ, as parameters.
fn rping_connect(
    qpn: u32,
    psn: u32,
    dst: [u8; 16],
    src_port: u16,
    flow_label: u32,
) -> ConnectParams {
    let hdr = CmaHeaderRepr {
        src_port,
        src: "10.77.0.12".parse().unwrap(),
        dst: std::net::Ipv4Addr::new(dst[12], dst[13], dst[14], dst[15]).into(),
    };
    let mut pd = vec![0u8; cma::HEADER_LEN];
    hdr.emit(&mut cma::Packet::new_unchecked(&mut pd[..]))
        .unwrap();
    ConnectParams {
        service_id: cma::ip_service_id(PortSpace::Tcp, 7174),
        qpn,
        starting_psn: psn,
        responder_resources: 1,
        initiator_depth: 1,
        remote_cm_response_timeout: CMA_CM_RESPONSE_TIMEOUT,
        local_cm_response_timeout: CMA_CM_RESPONSE_TIMEOUT,
        retry_count: 7,
        rnr_retry_count: 7,
        max_cm_retries: CMA_MAX_CM_RETRIES,
        path_mtu: 3,
        pkey: 0xffff,
        srq: false,
        packet_life_time: CMA_IBOE_PACKET_LIFETIME,
        primary_path: PathRepr {
            local_lid: 0xffff,
            remote_lid: 0xffff,
            local_gid: VM2,
            remote_gid: dst,
            flow_label,
            packet_rate: 0,
            traffic_class: 0,
            hop_limit: 64,
            sl: 0,
            subnet_local: false,
            local_ack_timeout: 0,
        },
        private_data: pd,
        ece_vendor_id: 0,
        ece_attr_mod: 0,
    }
}

#[test]
fn active_side_connects_and_disconnects_as_the_kernel_did() {
    let m = mads("rdmacm_rping.pcap");
    let (req, rep, rtu, dreq, drep) = (&m[0], &m[1], &m[2], &m[3], &m[4]);
    let t0 = Instant::now();
    let mut ep = Endpoint::new(config(0x5054_00ff_fe77_000c, 0x4f5b_c80c));
    let id = ep
        .connect(t0, &rping_connect(0x1a, 0x9d9f00, VM1, 0xba00, 0x6a206))
        .unwrap();
    assert_eq!(id, ConnId(0x4f5b_c80c));
    let (dst, out) = sole_transmit(&mut ep);
    assert_eq!(dst, VM1);
    assert_eq!(
        out.as_slice(),
        req.2.as_slice(),
        "our REQ differs from the kernel's"
    );
    assert_eq!(ep.state(id), Some(State::ReqSent));
    assert_eq!(ep.poll_timeout(), Some(t0 + Duration::from_millis(6144)));

    ep.handle_mad(t0, rep.1, &rep.2);
    let Some(Event::ConnectReply {
        id: e,
        rep: r,
        ece_attr_mod,
    }) = ep.poll_event()
    else {
        panic!("no ConnectReply")
    };
    assert_eq!((e, r.local_qpn, r.starting_psn), (id, 0x1a, 0x2cba7f));
    assert_eq!((r.vendor_id, ece_attr_mod), (0, 0));
    assert_eq!(ep.state(id), Some(State::RepRcvd));
    assert_eq!(ep.poll_timeout(), None, "the REQ is answered");

    ep.ready_to_use(id, &[]).unwrap();
    assert_eq!(
        sole_transmit(&mut ep).1.as_slice(),
        rtu.2.as_slice(),
        "our RTU differs"
    );
    assert!(matches!(ep.poll_event(), Some(Event::Established { id: e, .. }) if e == id));
    // A duplicate REP (our RTU was lost) is answered with the RTU again.
    ep.handle_mad(t0, rep.1, &rep.2);
    assert_eq!(sole_transmit(&mut ep).1.as_slice(), rtu.2.as_slice());

    let t1 = t0 + Duration::from_millis(70);
    ep.disconnect(t1, id, &[]).unwrap();
    assert_eq!(
        sole_transmit(&mut ep).1.as_slice(),
        dreq.2.as_slice(),
        "our DREQ differs"
    );
    assert_eq!(ep.state(id), Some(State::DreqSent));
    ep.handle_mad(t1, drep.1, &drep.2);
    assert!(
        matches!(ep.poll_event(), Some(Event::Disconnected { id: e, private_data: None }) if e == id)
    );
    assert_eq!(ep.state(id), Some(State::Timewait));
    // av.timeout after the REP: cm_ack_timeout(target ACK delay 15, 18) = 19.
    assert_eq!(ep.poll_timeout(), Some(t1 + Duration::from_millis(2048)));
}

#[test]
fn unanswered_req_is_resent_like_the_kernel_then_rejected_on_destroy() {
    let m = mads("rdmacm_req_to_host.pcap");
    assert_eq!(m.len(), 3);
    let t0 = Instant::now();
    let mut ep = Endpoint::new(config(0x5054_00ff_fe77_000c, 0x4e5b_c80c));
    let id = ep
        .connect(t0, &rping_connect(0x1d, 0xe62523, HOST, 0x8b70, 0x0fe96))
        .unwrap();
    assert_eq!(
        sole_transmit(&mut ep),
        (HOST, m[0].2.as_slice().try_into().unwrap())
    );
    let t1 = t0 + Duration::from_millis(6144);
    ep.handle_timeout(t1 - Duration::from_millis(1));
    assert!(ep.poll_transmit().is_none());
    ep.handle_timeout(t1);
    assert_eq!(sole_transmit(&mut ep).1.as_slice(), m[1].2.as_slice());
    // rping gives up (ib_destroy_cm_id in REQ_SENT): REJ TIMEOUT with our
    // CA GUID, as the kernel sent it.
    ep.destroy(t1, id).unwrap();
    assert_eq!(
        sole_transmit(&mut ep).1.as_slice(),
        m[2].2.as_slice(),
        "our REJ differs"
    );
    assert_eq!(ep.state(id), None);
    assert!(ep.poll_event().is_none(), "a destroyed id reports nothing");
    let CmMessage::Rej(_) = CmMad::parse(&m[2].2).unwrap().message else {
        panic!()
    };
}
