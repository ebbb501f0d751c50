//! One line per RoCEv2 packet: terse (opcode, QPN, PSN, length) or, for
//! people learning RDMA, in plain words (`rxe-emu trace --explain`).

use std::net::IpAddr;

use wire::aeth::{NakCode, Syndrome};
use wire::cnp::CnpRepr;
use wire::{Ecn, OpFlags, PacketRepr, Transport};

/// One RoCEv2 datagram (a UDP payload, BTH to ICRC) from `src`, which
/// arrived with ECN codepoint `ecn`: [`explain`] (or [`terse`]) for the
/// packets of kernel rxe's opcode table, [`explain_cnp`] (or
/// [`terse_cnp`]) for a CNP, and what the codepoint says. `Err` for bytes
/// that are neither (the parsers' reason).
pub fn describe(
    payload: &[u8],
    src: IpAddr,
    ecn: Ecn,
    in_words: bool,
) -> Result<String, wire::Error> {
    let text = match PacketRepr::parse(payload) {
        Ok(p) if in_words => explain(&p) + &explain_ecn(&p, ecn),
        Ok(p) => terse(&p) + &terse_ecn(ecn),
        Err(wire::Error::UnknownOpcode(0x81)) => {
            let c = CnpRepr::parse(payload)?;
            if in_words {
                explain_cnp(src, &c)
            } else {
                terse_cnp(&c) + &terse_ecn(ecn)
            }
        }
        Err(e) => return Err(e),
    };
    Ok(text)
}

/// ` ecn CE` (nothing for Not-ECT, kernel rxe's only codepoint).
fn terse_ecn(ecn: Ecn) -> String {
    match ecn {
        Ecn::NotEct => String::new(),
        e => format!(" ecn {e}"),
    }
}

/// Whether a CE mark on this packet makes a ConnectX-like receiver send a
/// CNP: data and requests do; acknowledgements (ACK, NAK, atomic ACK) do
/// not (lumina's checker counts marked data packets only).
fn is_ack(p: &PacketRepr<'_>) -> bool {
    p.aeth.is_some()
        && !p
            .bth
            .opcode
            .info()
            .is_some_and(|i| i.flags.contains(OpFlags::READ))
}

/// What the IP ECN codepoint says about a packet, in words (empty for
/// Not-ECT).
pub fn explain_ecn(p: &PacketRepr<'_>, ecn: Ecn) -> String {
    match ecn {
        Ecn::NotEct => String::new(),
        Ecn::Ce if is_ack(p) => "; marked CE (congestion experienced) by a switch on the way; \
             an acknowledgement, so the receiver sends no CNP for it"
            .into(),
        Ecn::Ce => format!(
            "; marked CE (congestion experienced) by a switch on the way: a \
             ConnectX-like receiver (qp {:#x}) answers with a CNP to the QP that \
             sent it; kernel rxe ignores the mark",
            p.bth.dest_qpn
        ),
        e => format!(
            "; sent ECN-capable ({e}): a congested switch may mark it CE instead of dropping it"
        ),
    }
}

/// `CNP qp 0x0000d2 becn`.
pub fn terse_cnp(c: &CnpRepr) -> String {
    format!(
        "CNP qp {:#08x}{}{}",
        c.dest_qpn,
        if c.becn { " becn" } else { "" },
        if c.fecn { " fecn" } else { "" }
    )
}

/// A CNP in words: who sent it, which QP must slow down, what happens
/// next on a ConnectX-like and on a kernel-rxe-like device.
pub fn explain_cnp(src: IpAddr, c: &CnpRepr) -> String {
    format!(
        "CNP from {src} to QP {:#x}: the receiver saw congestion-marked (ECN CE) packets \
             of this QP; a ConnectX-like sender cuts the QP's rate (DCQCN) and raises it \
             again while no CNP comes, kernel rxe drops it{}",
        c.dest_qpn,
        if c.becn {
            ""
        } else {
            " (BECN is 0, unlike every CNP ConnectX and scapy send)"
        }
    )
}

fn transport(t: Transport) -> &'static str {
    match t {
        Transport::Rc => "RC",
        Transport::Uc => "UC",
        Transport::Rd => "RD",
        Transport::Ud => "UD",
        Transport::Xrc => "XRC",
        _ => "??",
    }
}

/// The opcode name without its transport prefix (`SEND_ONLY`).
fn short(p: &PacketRepr<'_>) -> &'static str {
    let n = p.bth.opcode.name();
    n.split_once('_').map_or(n, |(_, rest)| rest)
}

/// `RC_SEND_ONLY qp 0x000011 psn 0x000012 len 64 [AckReq]`.
pub fn terse(p: &PacketRepr<'_>) -> String {
    format!(
        "{} qp {:#08x} psn {:#08x} len {}{}{}",
        p.bth.opcode.name(),
        p.bth.dest_qpn,
        p.bth.psn.value(),
        p.payload.len(),
        if p.bth.ack_req { " AckReq" } else { "" },
        p.aeth
            .map(|a| format!(" aeth {:?} msn {}", a.syndrome, a.msn))
            .unwrap_or_default()
    )
}

fn rnr_ms(code: u8) -> f64 {
    wire::aeth::rnr_timer_ns(code) as f64 / 1e6
}

/// The packet in words, e.g. `RC WRITE_LAST psn 0x000012 → qp 0x11: 1024 B;
/// AckReq (asks for an ACK)`, or `RNR NAK from qp 0x11: no receive posted;
/// retry in 0.64 ms (timer code 12)`.
pub fn explain(p: &PacketRepr<'_>) -> String {
    if let Some(cm) = explain_cm(p) {
        return cm;
    }
    let t = transport(p.bth.opcode.transport());
    let qp = p.bth.dest_qpn;
    let psn = p.bth.psn.value();
    let flags = p.bth.opcode.info().map_or(OpFlags::empty(), |i| i.flags);
    let len = p.payload.len();
    let mut s = if let Some(a) = p.aeth.filter(|_| !flags.contains(OpFlags::REQ)) {
        // Responses: ACK/NAK, READ responses, atomic ACKs.
        if flags.contains(OpFlags::READ) {
            format!(
                "{t} READ response ({}) psn {psn:#08x} → qp {qp:#x}: {len} B of READ data",
                short(p)
            )
        } else if let Some(ack) = p.atomic_ack {
            format!("{t} atomic ACK psn {psn:#08x} → qp {qp:#x}: the target held {:#x} before the operation", ack.orig)
        } else {
            match a.syndrome {
                Syndrome::Ack { .. } => format!(
                    "{t} ACK → qp {qp:#x}: everything up to psn {psn:#08x} arrived (msn {})",
                    a.msn
                ),
                Syndrome::RnrNak { timer } => format!(
                    "{t} RNR NAK → qp {qp:#x} for psn {psn:#08x}: no receive posted at the responder; retry in {} ms (timer code {timer}), the requester's rnr_retry counts down",
                    rnr_ms(timer)
                ),
                Syndrome::Nak(NakCode::PsnSequenceError) => format!(
                    "{t} NAK (PSN sequence error) → qp {qp:#x}: a packet was lost; the responder expects psn {psn:#08x} and the requester resends from there"
                ),
                Syndrome::Nak(NakCode::RemoteAccessError) => format!(
                    "{t} NAK (remote access error) → qp {qp:#x} for psn {psn:#08x}: bad rkey, range or permission; the WR fails with REM_ACCESS_ERR and both QPs go to ERR"
                ),
                Syndrome::Nak(NakCode::InvalidRequest) => format!(
                    "{t} NAK (invalid request) → qp {qp:#x} for psn {psn:#08x}: the responder cannot do this (e.g. too long for the receive buffer); the WR fails with REM_INV_REQ_ERR"
                ),
                Syndrome::Nak(NakCode::RemoteOperationalError) => format!(
                    "{t} NAK (remote operational error) → qp {qp:#x} for psn {psn:#08x}: the responder failed; the WR fails with REM_OP_ERR"
                ),
                Syndrome::Nak(other) => {
                    format!("{t} NAK ({other:?}) → qp {qp:#x} for psn {psn:#08x}")
                }
                Syndrome::Reserved(b) => {
                    format!("{t} ACK with reserved syndrome {b:#04x} → qp {qp:#x} (ignored)")
                }
            }
        }
    } else if flags.contains(OpFlags::READ) {
        match p.reth {
            Some(r) => format!(
                "{t} READ request psn {psn:#08x} → qp {qp:#x}: {} B at {:#x} (rkey {:#x}); answered by READ responses",
                r.dma_len, r.va, r.rkey
            ),
            None => format!("{t} READ request psn {psn:#08x} → qp {qp:#x} without a RETH"),
        }
    } else if let Some(a) = p.atomic {
        if matches!(
            p.bth.opcode,
            wire::Opcode::RC_COMPARE_SWAP | wire::Opcode::XRC_COMPARE_SWAP
        ) {
            format!(
                "{t} COMPARE_SWAP psn {psn:#08x} → qp {qp:#x}: if the 8 bytes at {:#x} (rkey {:#x}) are {:#x}, make them {:#x}",
                a.va, a.rkey, a.compare, a.swap_add
            )
        } else {
            format!(
                "{t} FETCH_ADD psn {psn:#08x} → qp {qp:#x}: add {:#x} to the 8 bytes at {:#x} (rkey {:#x})",
                a.swap_add, a.va, a.rkey
            )
        }
    } else {
        let mut s = format!("{t} {} psn {psn:#08x} → qp {qp:#x}: {len} B", short(p));
        if let Some(r) = p.reth {
            s += &format!(
                " at {:#x} (rkey {:#x}, message of {} B)",
                r.va, r.rkey, r.dma_len
            );
        }
        if let Some(d) = p.deth {
            s += &format!(" from qp {:#x} with Q_Key {:#x}", d.src_qpn, d.qkey);
        }
        if let Some(x) = p.xrceth {
            s += &format!(" for XRC SRQ {:#x}", x.srqn);
        }
        if let Some(i) = p.immdt {
            s += &format!("; immediate {:#010x}", i.imm);
        }
        if let Some(i) = p.ieth {
            s += &format!("; invalidates rkey {:#x}", i.rkey);
        }
        s
    };
    if p.bth.ack_req {
        s += "; AckReq (asks for an ACK)";
    }
    if p.bth.solicited {
        s += "; solicited event";
    }
    s
}

/// The rdma_cm service a service ID names, in words.
fn service(sid: u64) -> String {
    match wire::cma::parse_ip_service_id(sid) {
        Some((ps, port)) => format!("rdma_cm {ps:?} port {port}"),
        None => format!("service {sid:#018x}"),
    }
}

/// The consumer's private data: its printable start, or its size.
fn private(pd: &[u8]) -> String {
    let used = pd.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1);
    if used == 0 {
        return String::new();
    }
    let text: String = pd[..used]
        .iter()
        .take(24)
        .map(|&b| {
            if (0x20..0x7f).contains(&b) {
                b as char
            } else {
                '.'
            }
        })
        .collect();
    format!("; private data {used} B \"{text}\"")
}

/// A CM MAD on QP1 (the GSI) in words, or `None` for anything else.
fn explain_cm(p: &PacketRepr<'_>) -> Option<String> {
    use wire::cm::{CmMad, CmMessage};
    let d = p.deth?;
    if p.bth.dest_qpn != 1 || d.qkey != wire::deth::GSI_QKEY {
        return None;
    }
    let Ok(mad) = CmMad::parse(p.payload) else {
        return Some(format!(
            "UD to QP1 (GSI) psn {:#08x}: a {} B MAD that is not a CM message",
            p.bth.psn.value(),
            p.payload.len()
        ));
    };
    let words = match &mad.message {
        CmMessage::Req(r) => {
            let cma_pd = r.private_data.get(wire::cma::HEADER_LEN..).unwrap_or(&[]);
            format!(
                "CM REQ (connect) comm id {:#x}: to {} from QP {:#x}, starting psn {:#x}, path MTU {}, retry {} rnr_retry {}{}",
                r.local_comm_id,
                service(r.service_id),
                r.local_qpn,
                r.starting_psn,
                128u32 << r.path_mtu.min(5),
                r.retry_count,
                r.rnr_retry_count,
                private(cma_pd)
            )
        }
        CmMessage::Rep(r) => format!(
            "CM REP (accept) comm id {:#x} → {:#x}: the passive side's QP {:#x}, starting psn {:#x}{}",
            r.local_comm_id,
            r.remote_comm_id,
            r.local_qpn,
            r.starting_psn,
            private(&r.private_data)
        ),
        CmMessage::Rtu(r) => format!(
            "CM RTU (ready to use) comm id {:#x} → {:#x}: the active side's QP is at RTS; the connection is established",
            r.local_comm_id, r.remote_comm_id
        ),
        CmMessage::Rej(r) => format!(
            "CM REJ comm id {:#x} → {:#x}: rejected ({}, reason {}){}",
            r.local_comm_id,
            r.remote_comm_id,
            r.reason,
            r.reason.0,
            private(&r.private_data)
        ),
        CmMessage::Mra(m) => format!(
            "CM MRA comm id {:#x} → {:#x}: message received, the answer will take a while (service timeout {})",
            m.local_comm_id, m.remote_comm_id, m.service_timeout
        ),
        CmMessage::Dreq(r) => format!(
            "CM DREQ (disconnect) comm id {:#x} → {:#x}: the QPs stop; a DREP answers",
            r.local_comm_id, r.remote_comm_id
        ),
        CmMessage::Drep(r) => format!(
            "CM DREP comm id {:#x} → {:#x}: disconnect acknowledged; both sides wait out TIMEWAIT",
            r.local_comm_id, r.remote_comm_id
        ),
        CmMessage::SidrReq(r) => format!(
            "CM SIDR_REQ request {:#x}: which UD QP and Q_Key serve {}?{}",
            r.request_id,
            service(r.service_id),
            private(r.private_data.get(wire::cma::HEADER_LEN..).unwrap_or(&[]))
        ),
        CmMessage::SidrRep(r) if r.status == wire::cm::sidr_rep::SidrStatus::SUCCESS => format!(
            "CM SIDR_REP request {:#x}: {} is served by QP {:#x} with Q_Key {:#x}",
            r.request_id,
            service(r.service_id),
            r.qpn,
            r.qkey
        ),
        CmMessage::SidrRep(r) => format!(
            "CM SIDR_REP request {:#x}: {} refused ({})",
            r.request_id,
            service(r.service_id),
            r.status
        ),
    };
    Some(words)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn find(name: &str, want: impl Fn(&PacketRepr<'_>) -> bool) -> String {
        let bytes = std::fs::read(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../wire/tests/data")
                .join(name),
        )
        .unwrap();
        for rec in wire::pcap::PcapReader::new(&bytes).unwrap() {
            let rec = rec.unwrap();
            let f = wire::frame::parse(rec.data).unwrap();
            let p = PacketRepr::parse(f.udp_payload).unwrap();
            if want(&p) {
                return explain(&p);
            }
        }
        panic!("no such packet in {name}");
    }

    #[test]
    fn kernel_packets_in_words() {
        let e = find("rc_rnr_nak.pcap", |p| {
            p.aeth
                .is_some_and(|a| matches!(a.syndrome, Syndrome::RnrNak { .. }))
        });
        assert!(
            e.contains("RNR NAK") && e.contains("no receive posted"),
            "{e}"
        );
        assert!(e.contains("0.64 ms (timer code 12)"), "{e}");
        let e = find("rc_write.pcap", |p| p.reth.is_some());
        assert!(e.starts_with("RC RDMA_WRITE_") && e.contains("rkey"), "{e}");
        let e = find("rc_read.pcap", |p| {
            p.bth.opcode == wire::Opcode::RC_RDMA_READ_REQUEST
        });
        assert!(e.starts_with("RC READ request"), "{e}");
        let e = find("rc_read.pcap", |p| {
            p.bth.opcode == wire::Opcode::RC_RDMA_READ_RESPONSE_FIRST
        });
        assert!(
            e.starts_with("RC READ response (RDMA_READ_RESPONSE_FIRST)"),
            "{e}"
        );
        let e = find("rc_atomic_cswap.pcap", |p| p.atomic.is_some());
        assert!(e.contains("COMPARE_SWAP") && e.contains("make them"), "{e}");
        let e = find("rc_atomic_cswap.pcap", |p| p.atomic_ack.is_some());
        assert!(e.contains("atomic ACK"), "{e}");
        // The CM MADs of a kernel rping connection, in words.
        let e = find("rdmacm_rping.pcap", |p| p.payload.get(17) == Some(&0x10));
        assert!(
            e.starts_with("CM REQ (connect)") && e.contains("rdma_cm Tcp port 7174"),
            "{e}"
        );
        let e = find("rdmacm_rping.pcap", |p| p.payload.get(17) == Some(&0x13));
        assert!(e.starts_with("CM REP (accept)"), "{e}");
        let e = find("rdmacm_rping.pcap", |p| p.payload.get(17) == Some(&0x15));
        assert!(e.starts_with("CM DREQ (disconnect)"), "{e}");
        let e = find("ud_send.pcap", |p| p.deth.is_some());
        assert!(e.starts_with("UD SEND_ONLY") && e.contains("Q_Key"), "{e}");
        let e = find("rc_retransmit.pcap", |p| {
            p.aeth
                .is_some_and(|a| a.syndrome == Syndrome::Nak(NakCode::PsnSequenceError))
        });
        assert!(e.contains("a packet was lost"), "{e}");

        // XRC (no capture has it): the XRCETH names the target SRQ.
        let x = PacketRepr {
            bth: wire::bth::BthRepr {
                opcode: wire::Opcode::XRC_SEND_ONLY,
                solicited: false,
                mig_req: false,
                pad_count: 0,
                tver: 0,
                pkey: 0xffff,
                fecn: false,
                becn: false,
                dest_qpn: 0x11,
                ack_req: true,
                psn: wire::Psn::new(5),
            },
            rdeth: None,
            deth: None,
            xrceth: Some(wire::xrceth::XrcEthRepr { srqn: 0x2a }),
            reth: None,
            feth: None,
            atomic: None,
            aeth: None,
            atomic_ack: None,
            immdt: None,
            ieth: None,
            payload: &[1, 2, 3],
        };
        let e = explain(&x);
        assert!(
            e.starts_with("XRC SEND_ONLY psn 0x000005 → qp 0x11: 3 B for XRC SRQ 0x2a"),
            "{e}"
        );
    }

    fn sealed_cnp(qpn: u32) -> Vec<u8> {
        let mut b = vec![0u8; 32];
        CnpRepr::new(qpn).emit(&mut b).unwrap();
        b
    }

    #[test]
    fn a_cnp_in_words_and_terse() {
        let src: IpAddr = "10.0.0.2".parse().unwrap();
        let b = sealed_cnp(0x11);
        let e = describe(&b, src, Ecn::NotEct, true).unwrap();
        assert!(
            e.starts_with(
                "CNP from 10.0.0.2 to QP 0x11: the receiver saw congestion-marked \
                 (ECN CE) packets of this QP;"
            ),
            "{e}"
        );
        assert!(e.contains("DCQCN") && !e.contains("BECN is 0"), "{e}");
        assert_eq!(
            describe(&b, src, Ecn::NotEct, false).unwrap(),
            "CNP qp 0x000011 becn"
        );
        let mut no_becn = b.clone();
        no_becn[4] = 0;
        let e = describe(&no_becn, src, Ecn::NotEct, true).unwrap();
        assert!(e.contains("BECN is 0"), "{e}");
        // A broken CNP is an error, not a panic or a sentence.
        assert_eq!(
            describe(&b[..20], src, Ecn::NotEct, true),
            Err(wire::Error::Truncated)
        );
        assert_eq!(
            describe(&[0x80; 32], src, Ecn::NotEct, true),
            Err(wire::Error::UnknownOpcode(0x80))
        );
    }

    #[test]
    fn a_ce_mark_is_mentioned() {
        let src: IpAddr = "10.0.0.1".parse().unwrap();
        let bytes = std::fs::read(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../wire/tests/data/rc_write.pcap"),
        )
        .unwrap();
        let mut write = None;
        let mut ack = None;
        for rec in wire::pcap::PcapReader::new(&bytes).unwrap() {
            let f = wire::frame::parse(rec.unwrap().data).unwrap();
            let p = PacketRepr::parse(f.udp_payload).unwrap();
            if p.reth.is_some() && write.is_none() {
                write = Some(f.udp_payload.to_vec());
            }
            if p.bth.opcode == wire::Opcode::RC_ACKNOWLEDGE && ack.is_none() {
                ack = Some(f.udp_payload.to_vec());
            }
        }
        let (write, ack) = (write.unwrap(), ack.unwrap());
        let plain = describe(&write, src, Ecn::NotEct, true).unwrap();
        assert!(!plain.contains("CE") && !plain.contains("ECN"), "{plain}");
        let ce = describe(&write, src, Ecn::Ce, true).unwrap();
        assert!(ce.starts_with(&plain), "{ce}");
        assert!(
            ce.contains("marked CE (congestion experienced)") && ce.contains("answers with a CNP"),
            "{ce}"
        );
        let ect = describe(&write, src, Ecn::Ect0, true).unwrap();
        assert!(ect.contains("ECN-capable (ECT(0))"), "{ect}");
        let a = describe(&ack, src, Ecn::Ce, true).unwrap();
        assert!(a.contains("marked CE") && a.contains("sends no CNP"), "{a}");
        assert!(describe(&write, src, Ecn::Ce, false)
            .unwrap()
            .ends_with(" ecn CE"));
    }
}
