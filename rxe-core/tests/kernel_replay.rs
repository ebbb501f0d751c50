//! Byte-exact conformance against kernel rxe, without a VM: our engine
//! plays the server (vm1, 10.77.0.11) of each reference capture made with
//! Linux 6.1 rdma_rxe. The client's real packets are fed in, in capture
//! order, and every packet the kernel server sent must come out of our
//! engine identical, byte for byte (BTH, AETH/MSN, READ data, atomic
//! results, UDP source port), with the same ICRC over the kernel's IP
//! header.
//!
//! The only edits to the client's packets: rkeys are mapped to the keys of
//! our MRs (placed at the captured virtual addresses), and their ICRC is
//! recomputed. READ data and atomic start values are taken from the
//! kernel's responses; the application's receive posting is inferred from
//! the kernel's answers (ACK: a receive was posted; RNR NAK: none was).

use std::collections::HashMap;
use std::net::IpAddr;

use rxe_core::mem::Memory;
use rxe_core::{
    AccessFlags, AhAttr, Engine, EngineConfig, Instant, Mtu, QpAttr, QpAttrMask as M, QpCap,
    QpInitAttr, QpState, QpType, RecvWr, RxDatagram, SendOp, SendWr, Sge,
};
use wire::icrc::IpUdpInfo;
use wire::{OpFlags, PacketRepr};

const SERVER: &str = "10.77.0.11";
const CLIENT: &str = "10.77.0.12";

struct Pkt {
    info: IpUdpInfo,
    udp: Vec<u8>,
}

fn load(name: &str) -> Vec<Pkt> {
    let path = format!("{}/../wire/tests/data/{name}", env!("CARGO_MANIFEST_DIR"));
    let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    wire::pcap::PcapReader::new(&bytes)
        .unwrap()
        .map(|r| {
            let r = r.unwrap();
            let f = wire::frame::parse(r.data).unwrap();
            Pkt {
                info: f.info,
                udp: f.udp_payload.to_vec(),
            }
        })
        .collect()
}

fn parse(p: &Pkt) -> PacketRepr<'_> {
    PacketRepr::parse(&p.udp).unwrap()
}

fn flags(p: &PacketRepr<'_>) -> OpFlags {
    p.bth.opcode.info().unwrap().flags
}

/// Replay `name` with our engine as the server; returns how many server
/// packets were compared.
fn replay(name: &str) -> usize {
    let pkts = load(name);
    let server: IpAddr = SERVER.parse().unwrap();
    let client: IpAddr = CLIENT.parse().unwrap();
    let to_srv: Vec<&Pkt> = pkts.iter().filter(|p| p.info.dst == server).collect();
    let from_srv: Vec<&Pkt> = pkts.iter().filter(|p| p.info.src == server).collect();
    let first = parse(to_srv[0]);
    let server_qpn = first.bth.dest_qpn;
    let client_qpn = from_srv
        .first()
        .map_or(server_qpn, |p| parse(p).bth.dest_qpn);
    let qp_type = match first.bth.opcode.transport() {
        wire::Transport::Rc => QpType::Rc,
        wire::Transport::Uc => QpType::Uc,
        t => panic!("{name}: transport {t:?} not replayed"),
    };
    let rq_psn = to_srv
        .iter()
        .map(|p| parse(p))
        .find(|p| flags(p).contains(OpFlags::REQ))
        .map_or(0, |p| p.bth.psn.value());
    let sq_psn = from_srv
        .iter()
        .map(|p| parse(p))
        .find(|p| flags(p).contains(OpFlags::REQ))
        .map_or(0, |p| p.bth.psn.value());
    let min_rnr_timer = from_srv
        .iter()
        .filter_map(|p| parse(p).aeth)
        .find_map(|a| match a.syndrome {
            wire::aeth::Syndrome::RnrNak { timer } => Some(timer),
            _ => None,
        })
        .unwrap_or(12);

    let mut cfg = EngineConfig::new(server);
    cfg.port_mtu = Mtu::M1024;
    cfg.qpn_range = (server_qpn, server_qpn + 100);
    let mut e = Engine::new(cfg, rxe_core::mem::VecMemory::new());
    let pd = e.alloc_pd().unwrap();
    let cq = e.create_cq(4096).unwrap();
    let cap = QpCap {
        max_send_wr: 256,
        max_recv_wr: 256,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let qpn = e
        .create_qp(QpInitAttr {
            pd,
            qp_type,
            send_cq: cq,
            recv_cq: cq,
            srq: None,
            cap,
            sq_sig_all: true,
        })
        .unwrap();
    assert_eq!(qpn, server_qpn);
    let now = Instant::ZERO; // time stands still: no timer fires during a replay
    let all = AccessFlags::LOCAL_WRITE
        | AccessFlags::REMOTE_WRITE
        | AccessFlags::REMOTE_READ
        | AccessFlags::REMOTE_ATOMIC;
    let init = QpAttr {
        qp_state: Some(QpState::Init),
        port_num: 1,
        qp_access_flags: all.bits(),
        ..QpAttr::default()
    };
    e.modify_qp(
        now,
        qpn,
        &init,
        M::STATE | M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS,
    )
    .unwrap();
    let dgid = match client {
        IpAddr::V4(v) => v.to_ipv6_mapped().octets(),
        IpAddr::V6(v) => v.octets(),
    };
    let rtr = QpAttr {
        qp_state: Some(QpState::Rtr),
        path_mtu: Some(Mtu::M1024),
        dest_qp_num: client_qpn,
        rq_psn,
        max_dest_rd_atomic: 16,
        min_rnr_timer,
        ah_attr: AhAttr {
            dgid,
            is_global: true,
            port_num: 1,
            hop_limit: 64,
            ..AhAttr::default()
        },
        ..QpAttr::default()
    };
    let mut mask = M::STATE | M::AV | M::PATH_MTU | M::DEST_QPN | M::RQ_PSN;
    if qp_type == QpType::Rc {
        mask |= M::MAX_DEST_RD_ATOMIC | M::MIN_RNR_TIMER;
    }
    e.modify_qp(now, qpn, &rtr, mask).unwrap();
    let rts = QpAttr {
        qp_state: Some(QpState::Rts),
        sq_psn,
        timeout: 14,
        retry_cnt: 7,
        rnr_retry: 7,
        max_rd_atomic: 16,
        ..QpAttr::default()
    };
    let mut mask = M::STATE | M::SQ_PSN;
    if qp_type == QpType::Rc {
        mask |= M::TIMEOUT | M::RETRY_CNT | M::RNR_RETRY | M::MAX_QP_RD_ATOMIC;
    }
    e.modify_qp(now, qpn, &rts, mask).unwrap();

    // Memory at the captured addresses, one MR per captured rkey.
    let mut spans: HashMap<u32, (u64, u64)> = HashMap::new();
    for p in &to_srv {
        let r = parse(p);
        let (va, len, rkey) = match (r.reth, r.atomic) {
            (Some(x), _) => (x.va, u64::from(x.dma_len), x.rkey),
            (_, Some(x)) => (x.va, 8, x.rkey),
            _ => continue,
        };
        let s = spans.entry(rkey).or_insert((va, va + len));
        s.0 = s.0.min(va);
        s.1 = s.1.max(va + len);
    }
    let mut rkeys = HashMap::new();
    for (k, (lo, hi)) in &spans {
        let addr = e
            .mem_mut()
            .alloc_at(*lo, (*hi - *lo).max(8) as usize)
            .unwrap();
        let mr = e.reg_mr(pd, addr, (*hi - *lo).max(8), all).unwrap();
        rkeys.insert(*k, mr.rkey);
    }
    // READ data and atomic start values from the kernel's responses.
    for p in &to_srv {
        let r = parse(p);
        if flags(&r).contains(OpFlags::READ) {
            let reth = r.reth.unwrap();
            for s in &from_srv {
                let q = parse(s);
                let k = q.bth.psn.diff(r.bth.psn);
                if flags(&q).contains(OpFlags::READ)
                    && k >= 0
                    && (k as u32) * 1024 < reth.dma_len.max(1)
                {
                    e.mem_mut()
                        .write(reth.va + k as u64 * 1024, q.payload)
                        .unwrap();
                }
            }
        }
    }
    let mut atomic_seeded = std::collections::HashSet::new();
    for p in &to_srv {
        let r = parse(p);
        if let Some(a) = r.atomic {
            if atomic_seeded.insert(a.va) {
                let ack = from_srv
                    .iter()
                    .map(|s| parse(s))
                    .find(|q| q.bth.psn == r.bth.psn && q.atomic_ack.is_some());
                if let Some(q) = ack {
                    e.mem_mut()
                        .write(a.va, &q.atomic_ack.unwrap().orig.to_ne_bytes())
                        .unwrap();
                }
            }
        }
    }
    let rbuf = e.mem_mut().alloc(64 * 1024);
    let rmr = e.reg_mr(pd, rbuf, 64 * 1024, all).unwrap();
    let sbuf = e.mem_mut().alloc(64 * 1024);
    let smr = e.reg_mr(pd, sbuf, 64 * 1024, all).unwrap();
    let mut posted_recvs = 0usize;
    let mut next_wr = 1u64;

    let mut compared = 0;
    // Kernel rxe runs its requester and responder as separate tasks, so
    // their packets interleave by scheduling: each stream is compared in
    // order on its own.
    let mut ours: std::collections::VecDeque<rxe_core::Transmit> = Default::default();
    for (i, p) in pkts.iter().enumerate() {
        if p.info.dst == server {
            let mut r = parse(p);
            // Does the kernel answer this request with an RNR NAK?
            let rnr = pkts[i + 1..]
                .iter()
                .filter(|q| q.info.src == server)
                .map(|q| parse(q))
                .find(|q| q.bth.psn == r.bth.psn && q.aeth.is_some());
            let is_rnr = rnr.is_some_and(|q| {
                matches!(
                    q.aeth.unwrap().syndrome,
                    wire::aeth::Syndrome::RnrNak { .. }
                )
            });
            if flags(&r).contains(OpFlags::RWR) && !is_rnr {
                let (_, in_rq) = (0, posted_recvs);
                if in_rq == 0 {
                    e.post_recv(
                        qpn,
                        RecvWr {
                            wr_id: next_wr,
                            sg_list: vec![Sge {
                                addr: rbuf,
                                length: 64 * 1024,
                                lkey: rmr.lkey,
                            }],
                        },
                    )
                    .unwrap();
                    next_wr += 1;
                    posted_recvs += 1;
                }
            }
            if let Some(x) = r.reth.as_mut() {
                x.rkey = rkeys[&x.rkey];
            }
            if let Some(x) = r.atomic.as_mut() {
                x.rkey = rkeys[&x.rkey];
            }
            let mut udp = vec![0u8; r.buffer_len()];
            r.emit(&mut udp).unwrap();
            wire::icrc::write(&p.info, &mut udp);
            let dg = RxDatagram {
                src: p.info.src,
                dst: p.info.dst,
                src_port: p.info.src_port,
                dst_port: p.info.dst_port,
                ipv4_id: Some(p.info.ipv4_id),
                payload: &udp,
                ecn: rxe_core::Ecn::NotEct,
            };
            e.handle_datagram(now, &dg);
            // Receives consumed so far.
            for wc in e.poll_cq(cq, 64).unwrap() {
                assert_eq!(
                    wc.status,
                    rxe_core::WcStatus::Success,
                    "{name}: {wc:?}; {:?}",
                    e.qp_error_reason(qpn)
                );
                if matches!(
                    wc.opcode,
                    rxe_core::WcOpcode::Recv | rxe_core::WcOpcode::RecvRdmaWithImm
                ) {
                    posted_recvs -= 1;
                }
            }
        } else if p.info.src == server {
            let want = parse(p);
            let is_req = |t: &rxe_core::Transmit| {
                PacketRepr::parse(&t.payload).is_ok_and(|q| flags(&q).contains(OpFlags::REQ))
            };
            let want_req = flags(&want).contains(OpFlags::REQ);
            ours.extend(std::iter::from_fn(|| e.poll_transmit()));
            if want_req && !ours.iter().any(is_req) {
                // The server application posts the same operation
                // (ibv_rc_pingpong sends, ib_write_lat writes).
                assert!(
                    flags(&want).contains(OpFlags::START | OpFlags::END),
                    "{name}: only single-packet server requests are replayed"
                );
                e.mem_mut().write(sbuf, want.payload).unwrap();
                let sg = vec![Sge {
                    addr: sbuf,
                    length: want.payload.len() as u32,
                    lkey: smr.lkey,
                }];
                let op = match want.reth {
                    Some(r) => SendOp::RdmaWrite {
                        remote_addr: r.va,
                        rkey: r.rkey,
                    },
                    None => SendOp::Send,
                };
                e.post_send(now, qpn, SendWr::new(next_wr, op, sg)).unwrap();
                next_wr += 1;
                ours.extend(std::iter::from_fn(|| e.poll_transmit()));
            }
            let pos = ours.iter().position(|t| is_req(t) == want_req);
            let Some(t) = pos.and_then(|i| ours.remove(i)) else {
                panic!(
                    "{name}: packet {} from the kernel server ({} PSN {}) has no counterpart from us; QP state {:?}: {:?}",
                    i + 1,
                    want.bth.opcode.name(),
                    want.bth.psn,
                    e.qp_state(qpn),
                    e.qp_error_reason(qpn)
                );
            };
            let ours = PacketRepr::parse(&t.payload).unwrap();
            let n = p.udp.len() - 4;
            assert_eq!(
                (t.info.src, t.info.dst, t.info.src_port, t.info.dst_port),
                (p.info.src, p.info.dst, p.info.src_port, p.info.dst_port),
                "{name}: packet {} addressing",
                i + 1
            );
            assert_eq!(
                &t.payload[..t.payload.len() - 4],
                &p.udp[..n],
                "{name}: packet {} differs: ours {:?} / kernel {:?}",
                i + 1,
                (ours.bth, ours.aeth),
                (want.bth, want.aeth)
            );
            let mut ours_icrc = t.payload.clone();
            wire::icrc::write(&p.info, &mut ours_icrc);
            assert_eq!(
                ours_icrc,
                p.udp,
                "{name}: packet {} ICRC over the kernel's IP header",
                i + 1
            );
            compared += 1;
        }
    }
    ours.extend(std::iter::from_fn(|| e.poll_transmit()));
    assert!(
        ours.is_empty(),
        "{name}: we sent packets the kernel did not: {:?}",
        ours.iter()
            .map(|t| PacketRepr::parse(&t.payload).map(|p| p.bth).ok())
            .collect::<Vec<_>>()
    );
    compared
}

#[test]
fn rc_send_recv() {
    assert_eq!(replay("rc_send_recv.pcap"), 6);
}

#[test]
fn rc_send_multi() {
    assert_eq!(replay("rc_send_multi.pcap"), 5);
}

#[test]
fn rc_write() {
    assert_eq!(replay("rc_write.pcap"), 5);
}

#[test]
fn rc_write_small() {
    assert_eq!(replay("rc_write_small.pcap"), 10);
}

#[test]
fn rc_read() {
    assert_eq!(replay("rc_read.pcap"), 15);
}

#[test]
fn rc_atomic_fadd() {
    assert_eq!(replay("rc_atomic_fadd.pcap"), 5);
}

#[test]
fn rc_atomic_cswap() {
    assert_eq!(replay("rc_atomic_cswap.pcap"), 5);
}

#[test]
fn rc_rnr_nak() {
    assert_eq!(replay("rc_rnr_nak.pcap"), 36);
}

#[test]
fn rc_retransmit_gaps_and_naks() {
    // 12 server packets: 5 ACKs and 7 PSN-sequence NAKs, one per gap.
    assert_eq!(replay("rc_retransmit.pcap"), 12);
}

#[test]
fn uc_write() {
    assert_eq!(replay("uc_write.pcap"), 0);
}
