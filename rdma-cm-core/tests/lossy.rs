//! Two endpoints against each other through a simulated link that drops
//! chosen MADs, in simulated time: every loss is recovered the kernel's
//! way, and a vanished peer ends in Unreachable/Disconnected at the time
//! kernel cm computes, never a hang.

use std::time::{Duration, Instant};

use proptest::prelude::*;
use rdma_cm_core::timing::{
    cm_convert_to_ms, CMA_CM_RESPONSE_TIMEOUT, CMA_IBOE_PACKET_LIFETIME, CMA_MAX_CM_RETRIES,
    RXE_ACK_DELAY,
};
use rdma_cm_core::{
    AcceptParams, CmError, Config, ConnId, ConnectParams, Endpoint, Event, SentMessage, SidrParams,
    SidrReplyParams, State,
};
use wire::cm::{
    self, attr, CmMad, CmMessage, DreqRepr, MessageResponse, PathRepr, RejectReason, SidrStatus,
};

const GID_A: [u8; 16] = [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xa];
const GID_B: [u8; 16] = [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xb];
const SERVICE: u64 = 0x0000_0000_0106_4e21;

/// REQ timeout of the active side: 2 × 1024 + 4096 ms.
const REQ_TIMEOUT_MS: u64 = 6144;
/// REP timeout of the passive side: cm_convert_to_ms(20).
const REP_TIMEOUT_MS: u64 = 4096;
/// TIMEWAIT: cm_convert_to_ms(19).
const TIMEWAIT_MS: u64 = 2048;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Side {
    A,
    B,
}

/// SIDR_REQ timeout of rdma_cm (`cma_resolve_ib_udp`):
/// 1 << (CMA_CM_RESPONSE_TIMEOUT - 8) ms.
const SIDR_TIMEOUT_MS: u64 = 4096;

/// What the passive consumer does with a SidrRequest.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum SidrAnswer {
    /// `sidr_reply` SUCCESS with QPN 0x5d5 and Q_Key 0x1234_5678.
    Reply,
    /// Nothing (a slow consumer).
    Ignore,
}

/// What the passive consumer does with a ConnectRequest.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Passive {
    Accept,
    Reject,
    Mra { delayed: bool },
}

struct Net {
    a: Endpoint,
    b: Endpoint,
    t0: Instant,
    now: Instant,
    /// Every MAD put on the link: time, sender, attribute, dropped?
    log: Vec<(Duration, Side, u16, bool)>,
    events: Vec<(Duration, Side, Event)>,
    drop: Box<dyn FnMut(Side, u16, usize) -> bool>,
    passive: Passive,
    /// The active side disconnects as soon as it is established.
    auto_disconnect: bool,
    sidr_answer: SidrAnswer,
}

fn config(guid: u64, operand: u32) -> Config {
    Config {
        local_ca_guid: guid,
        ack_delay: RXE_ACK_DELAY,
        hi_tid: 7,
        comm_id_operand: operand,
    }
}

fn accept_params() -> AcceptParams {
    accept_params_for(0xa1a)
}

fn connect_params(qpn: u32) -> ConnectParams {
    ConnectParams {
        service_id: SERVICE,
        qpn,
        starting_psn: 0x123456,
        responder_resources: 4,
        initiator_depth: 4,
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
            local_gid: GID_A,
            remote_gid: GID_B,
            hop_limit: 64,
            ..PathRepr::default()
        },
        private_data: b"hello from A".to_vec(),
        ece_vendor_id: 0,
        ece_attr_mod: 0,
    }
}

/// The passive side's answer; its QPN follows the REQ's (0xa1a → 0xb0b)
/// so that every connection has its own QP, as in life (two connections
/// to one QPN are stale to kernel cm).
fn accept_params_for(req_qpn: u32) -> AcceptParams {
    AcceptParams {
        qpn: req_qpn + 0xf1,
        starting_psn: 0x654321,
        responder_resources: 4,
        initiator_depth: 4,
        failover_accepted: 0,
        flow_control: false,
        rnr_retry_count: 7,
        srq: false,
        private_data: b"hello from B".to_vec(),
        ece_vendor_id: 0,
        ece_attr_mod: 0,
    }
}

impl Net {
    fn new(drop: impl FnMut(Side, u16, usize) -> bool + 'static) -> Net {
        let t0 = Instant::now();
        let mut b = Endpoint::new(config(0xbbbb, 0x5555_0000));
        b.listen(SERVICE).unwrap();
        Net {
            a: Endpoint::new(config(0xaaaa, 0x1111_0000)),
            b,
            t0,
            now: t0,
            log: Vec::new(),
            events: Vec::new(),
            drop: Box::new(drop),
            passive: Passive::Accept,
            auto_disconnect: false,
            sidr_answer: SidrAnswer::Reply,
        }
    }

    fn ms(&self) -> u64 {
        (self.now - self.t0).as_millis() as u64
    }

    /// Move MADs and events until nothing happens before `limit_ms`.
    fn run(&mut self, limit_ms: u64) {
        let limit = self.t0 + Duration::from_millis(limit_ms);
        loop {
            let mut busy = false;
            for side in [Side::A, Side::B] {
                loop {
                    let (from, to) = match side {
                        Side::A => (&mut self.a, &mut self.b),
                        Side::B => (&mut self.b, &mut self.a),
                    };
                    let Some(t) = from.poll_transmit() else { break };
                    busy = true;
                    let attr = u16::from_be_bytes([t.mad[16], t.mad[17]]);
                    let nth = self
                        .log
                        .iter()
                        .filter(|(_, s, a, _)| *s == side && *a == attr)
                        .count();
                    let dropped = (self.drop)(side, attr, nth);
                    self.log.push((self.now - self.t0, side, attr, dropped));
                    if !dropped {
                        let src = if side == Side::A { GID_A } else { GID_B };
                        assert_eq!(t.dst_gid, if side == Side::A { GID_B } else { GID_A });
                        to.handle_mad(self.now, src, &t.mad);
                    }
                }
            }
            while let Some(e) = self.a.poll_event() {
                busy = true;
                match &e {
                    Event::ConnectReply { id, .. } => self.a.ready_to_use(*id, b"rtu").unwrap(),
                    Event::Established { id, .. } if self.auto_disconnect => {
                        self.a.disconnect(self.now, *id, b"bye").unwrap()
                    }
                    _ => {}
                }
                self.events.push((self.now - self.t0, Side::A, e));
            }
            while let Some(e) = self.b.poll_event() {
                busy = true;
                if let Event::ConnectRequest { id, req, .. } = &e {
                    match self.passive {
                        Passive::Accept => self
                            .b
                            .accept(self.now, *id, &accept_params_for(req.local_qpn))
                            .unwrap(),
                        Passive::Reject => self
                            .b
                            .reject(self.now, *id, RejectReason::CONSUMER_DEFINED, b"no thanks")
                            .unwrap(),
                        Passive::Mra { delayed } => self.b.send_mra(*id, 24, delayed).unwrap(),
                    }
                }
                if let (Event::SidrRequest { id, .. }, SidrAnswer::Reply) = (&e, self.sidr_answer) {
                    self.b
                        .sidr_reply(*id, SidrStatus::SUCCESS, 0x5d5, 0x1234_5678, b"sidr from B")
                        .unwrap();
                }
                self.events.push((self.now - self.t0, Side::B, e));
            }
            if busy {
                continue;
            }
            let next = [self.a.poll_timeout(), self.b.poll_timeout()]
                .into_iter()
                .flatten()
                .min();
            match next {
                Some(t) if t <= limit => {
                    self.now = self.now.max(t);
                    self.a.handle_timeout(self.now);
                    self.b.handle_timeout(self.now);
                }
                _ => break,
            }
        }
        self.now = self.now.max(limit);
    }

    fn sent(&self) -> Vec<(u64, Side, u16, bool)> {
        self.log
            .iter()
            .map(|(t, s, a, d)| (t.as_millis() as u64, *s, *a, *d))
            .collect()
    }

    fn event_names(&self, side: Side) -> Vec<(u64, &'static str)> {
        self.events
            .iter()
            .filter(|(_, s, _)| *s == side)
            .map(|(t, _, e)| {
                let name = match e {
                    Event::ConnectRequest { .. } => "ConnectRequest",
                    Event::ConnectReply { .. } => "ConnectReply",
                    Event::Established { .. } => "Established",
                    Event::Rejected { .. } => "Rejected",
                    Event::Unreachable { .. } => "Unreachable",
                    Event::Disconnected { .. } => "Disconnected",
                    Event::TimewaitExit { .. } => "TimewaitExit",
                    Event::SidrRequest { .. } => "SidrRequest",
                    Event::SidrReply { .. } => "SidrReply",
                };
                (t.as_millis() as u64, name)
            })
            .collect()
    }
}

use Side::{A, B};

/// rdma_cm's SIDR parameters (`cma_resolve_ib_udp`): 4096 ms, 15 retries.
fn sidr_params() -> SidrParams {
    SidrParams {
        service_id: SERVICE,
        pkey: 0xffff,
        remote_gid: GID_B,
        timeout: Duration::from_millis(cm_convert_to_ms(CMA_CM_RESPONSE_TIMEOUT)),
        max_cm_retries: CMA_MAX_CM_RETRIES,
        private_data: b"sidr from A".to_vec(),
    }
}

#[test]
fn clean_connect_and_disconnect() {
    let mut n = Net::new(|_, _, _| false);
    let id = n.a.connect(n.now, &connect_params(0xa1a)).unwrap();
    n.run(10);
    assert_eq!(n.a.state(id), Some(State::Established));
    let (_, _, Event::ConnectRequest { id: bid, req, .. }) = &n.events[0] else {
        panic!("{:?}", n.events[0])
    };
    let bid = *bid;
    assert_eq!(
        (req.local_qpn, &req.private_data[..12]),
        (0xa1a, &b"hello from A"[..])
    );
    assert_eq!(n.b.state(bid), Some(State::Established));
    // The passive side sees the RTU's private data; the active side the REP's.
    assert!(n.events.iter().any(|(_, s, e)| *s == B
        && matches!(e, Event::Established { private_data, .. } if &private_data[..3] == b"rtu")));
    assert!(n.events.iter().any(|(_, s, e)| *s == A
        && matches!(e, Event::ConnectReply { rep, .. } if rep.local_qpn == 0xb0b && &rep.private_data[..12] == b"hello from B")));

    n.a.disconnect(n.now, id, b"bye").unwrap();
    n.run(20);
    assert_eq!(n.a.state(id), Some(State::Timewait));
    assert_eq!(n.b.state(bid), Some(State::Timewait));
    assert!(n.events.iter().any(|(_, s, e)| *s == B
        && matches!(e, Event::Disconnected { private_data: Some(p), .. } if &p[..3] == b"bye")));
    n.run(20 + TIMEWAIT_MS);
    assert_eq!((n.a.connection_count(), n.b.connection_count()), (0, 0));
    assert_eq!(
        n.sent(),
        [
            (0, A, attr::REQ, false),
            (0, B, attr::REP, false),
            (0, A, attr::RTU, false),
            (10, A, attr::DREQ, false),
            (10, B, attr::DREP, false)
        ]
    );
    assert_eq!(
        n.event_names(A),
        [
            (0, "ConnectReply"),
            (0, "Established"),
            (10, "Disconnected"),
            (10 + TIMEWAIT_MS, "TimewaitExit")
        ]
    );
    assert_eq!(
        n.event_names(B),
        [
            (0, "ConnectRequest"),
            (0, "Established"),
            (10, "Disconnected"),
            (10 + TIMEWAIT_MS, "TimewaitExit")
        ]
    );
    assert_eq!(
        n.a.accept(n.now, id, &accept_params()),
        Err(CmError::UnknownId(id))
    );
}

#[test]
fn lost_rep_is_resent_after_the_rep_timeout() {
    let mut n = Net::new(|side, attr, nth| side == B && attr == attr::REP && nth == 0);
    n.a.connect(n.now, &connect_params(0xa1a)).unwrap();
    n.run(60_000);
    assert_eq!(
        n.sent(),
        [
            (0, A, attr::REQ, false),
            (0, B, attr::REP, true),
            (REP_TIMEOUT_MS, B, attr::REP, false),
            (REP_TIMEOUT_MS, A, attr::RTU, false)
        ]
    );
    assert_eq!(
        n.event_names(B),
        [(0, "ConnectRequest"), (REP_TIMEOUT_MS, "Established")]
    );
}

#[test]
fn lost_rtu_is_recovered_by_the_resent_rep() {
    let mut n = Net::new(|side, attr, nth| side == A && attr == attr::RTU && nth == 0);
    n.a.connect(n.now, &connect_params(0xa1a)).unwrap();
    n.run(60_000);
    // The active side is ESTABLISHED and answers the duplicate REP with
    // its RTU again (kernel cm_dup_rep_handler).
    assert_eq!(
        n.sent(),
        [
            (0, A, attr::REQ, false),
            (0, B, attr::REP, false),
            (0, A, attr::RTU, true),
            (REP_TIMEOUT_MS, B, attr::REP, false),
            (REP_TIMEOUT_MS, A, attr::RTU, false)
        ]
    );
    assert_eq!(n.event_names(A), [(0, "ConnectReply"), (0, "Established")]);
    assert_eq!(
        n.event_names(B),
        [(0, "ConnectRequest"), (REP_TIMEOUT_MS, "Established")]
    );
    assert!(n.events.iter().any(|(_, s, e)| *s == B
        && matches!(e, Event::Established { private_data, .. } if &private_data[..3] == b"rtu")));
}

#[test]
fn lost_dreq_is_resent_after_the_req_timeout() {
    let mut n = Net::new(|side, attr, nth| side == A && attr == attr::DREQ && nth == 0);
    n.auto_disconnect = true;
    n.a.connect(n.now, &connect_params(0xa1a)).unwrap();
    n.run(60_000);
    let t = REQ_TIMEOUT_MS;
    assert_eq!(
        n.sent()[3..],
        [
            (0, A, attr::DREQ, true),
            (t, A, attr::DREQ, false),
            (t, B, attr::DREP, false)
        ]
    );
    assert_eq!(
        n.event_names(A)[2..],
        [(t, "Disconnected"), (t + TIMEWAIT_MS, "TimewaitExit")]
    );
    assert_eq!((n.a.connection_count(), n.b.connection_count()), (0, 0));
}

#[test]
fn vanished_passive_side_makes_the_req_unreachable_after_all_retries() {
    // Nothing A sends arrives.
    let mut n = Net::new(|side, _, _| side == A);
    let id = n.a.connect(n.now, &connect_params(0xa1a)).unwrap();
    n.run(1_000_000);
    let sends = u64::from(CMA_MAX_CM_RETRIES) + 1;
    let reqs: Vec<u64> = n.sent().iter().map(|(t, ..)| *t).collect();
    assert_eq!(
        reqs,
        (0..sends).map(|i| i * REQ_TIMEOUT_MS).collect::<Vec<_>>()
    );
    // 16 × 6144 ms = 98.3 s: kernel rdma_connect to a dead host.
    assert_eq!(n.event_names(A), [(sends * REQ_TIMEOUT_MS, "Unreachable")]);
    assert!(
        matches!(n.events[0].2, Event::Unreachable { id: e, message: SentMessage::Req } if e == id)
    );
    assert_eq!(n.a.state(id), None);
    assert_eq!(n.a.poll_timeout(), None);
    assert!(n.event_names(B).is_empty());
}

#[test]
fn lost_rtus_make_the_rep_unreachable_and_the_active_side_is_told_on_disconnect() {
    let mut n = Net::new(|side, attr, _| side == A && attr == attr::RTU);
    let id = n.a.connect(n.now, &connect_params(0xa1a)).unwrap();
    n.run(1_000_000);
    let sends = u64::from(CMA_MAX_CM_RETRIES) + 1;
    let reps = n
        .sent()
        .iter()
        .filter(|(_, _, a, _)| *a == attr::REP)
        .count() as u64;
    assert_eq!(reps, sends);
    assert_eq!(
        n.event_names(B),
        [
            (0, "ConnectRequest"),
            (sends * REP_TIMEOUT_MS, "Unreachable")
        ]
    );
    assert!(n.events.iter().any(|(_, _, e)| matches!(
        e,
        Event::Unreachable {
            message: SentMessage::Rep,
            ..
        }
    )));
    // A still thinks it is connected; its DREQ to the forgotten connection
    // gets a DREP anyway (kernel cm_issue_drep), so A does not hang.
    assert_eq!(n.a.state(id), Some(State::Established));
    n.a.disconnect(n.now, id, &[]).unwrap();
    let t = n.ms();
    n.run(t + 1);
    assert_eq!(n.a.state(id), Some(State::Timewait));
    assert_eq!(n.sent().last(), Some(&(t, B, attr::DREP, false)));
}

#[test]
fn unanswered_dreq_still_disconnects() {
    let mut n = Net::new(|side, attr, _| side == B && attr == attr::DREP);
    n.auto_disconnect = true;
    n.a.connect(n.now, &connect_params(0xa1a)).unwrap();
    n.run(1_000_000);
    let sends = u64::from(CMA_MAX_CM_RETRIES) + 1;
    let dreqs = n
        .sent()
        .iter()
        .filter(|(_, _, a, _)| *a == attr::DREQ)
        .count() as u64;
    assert_eq!(dreqs, sends);
    let t = sends * REQ_TIMEOUT_MS;
    assert_eq!(
        n.event_names(A)[2..],
        [(t, "Disconnected"), (t + TIMEWAIT_MS, "TimewaitExit")]
    );
    assert_eq!((n.a.connection_count(), n.b.connection_count()), (0, 0));
}

#[test]
fn reject_carries_reason_and_private_data() {
    let mut n = Net::new(|_, _, _| false);
    n.passive = Passive::Reject;
    let id = n.a.connect(n.now, &connect_params(0xa1a)).unwrap();
    n.run(100_000);
    let Some((
        _,
        A,
        Event::Rejected {
            id: e,
            reason,
            ari,
            private_data,
        },
    )) = n.events.get(1)
    else {
        panic!("{:?}", n.events)
    };
    assert_eq!((*e, *reason), (id, RejectReason::CONSUMER_DEFINED));
    assert!(ari.is_empty());
    assert_eq!(&private_data[..9], b"no thanks");
    assert_eq!((n.a.connection_count(), n.b.connection_count()), (0, 0));
    // The REJ of a REQ from REQ_RCVD names no local comm ID (kernel
    // cm_format_rej) and the REQ as the rejected message.
    assert_eq!(
        n.sent(),
        [(0, A, attr::REQ, false), (0, B, attr::REJ, false)]
    );
}

#[test]
fn req_for_an_unknown_service_is_rejected_invalid_service_id() {
    let mut n = Net::new(|_, _, _| false);
    n.b.unlisten(SERVICE).unwrap();
    assert_eq!(n.b.unlisten(SERVICE), Err(CmError::NotListening(SERVICE)));
    let id = n.a.connect(n.now, &connect_params(0xa1a)).unwrap();
    n.run(100_000);
    assert!(
        matches!(&n.events[..], [(_, A, Event::Rejected { id: e, reason: RejectReason::INVALID_SERVICE_ID, .. })] if *e == id)
    );
    assert_eq!(n.a.state(id), None);
}

#[test]
fn mra_extends_the_req_timeout() {
    let mut n = Net::new(|_, _, _| false);
    n.passive = Passive::Mra { delayed: false };
    let id = n.a.connect(n.now, &connect_params(0xa1a)).unwrap();
    n.run(1);
    assert_eq!(n.a.state(id), Some(State::MraReqRcvd));
    // service timeout 24 + av.timeout 19: 65536 + 2048 ms from now.
    let extended = cm_convert_to_ms(24) + cm_convert_to_ms(19);
    assert_eq!(
        n.a.poll_timeout(),
        Some(n.t0 + Duration::from_millis(extended))
    );
    // The consumer accepts after 10 s: within the extension, no REQ resent.
    let (_, _, Event::ConnectRequest { id: bid, .. }) = n.events[0].clone() else {
        panic!()
    };
    n.now = n.t0 + Duration::from_secs(10);
    n.b.accept(n.now, bid, &accept_params()).unwrap();
    n.run(20_000);
    assert_eq!(n.a.state(id), Some(State::Established));
    assert_eq!(n.b.state(bid), Some(State::Established));
    let reqs = n
        .sent()
        .iter()
        .filter(|(_, _, a, _)| *a == attr::REQ)
        .count();
    assert_eq!(reqs, 1);
}

#[test]
fn delayed_mra_answers_the_retransmitted_req() {
    let mut n = Net::new(|_, _, _| false);
    n.passive = Passive::Mra { delayed: true };
    let id = n.a.connect(n.now, &connect_params(0xa1a)).unwrap();
    n.run(REQ_TIMEOUT_MS);
    // No MRA until the REQ comes again (IB_CM_MRA_FLAG_DELAY), then one.
    assert_eq!(
        n.sent(),
        [
            (0, A, attr::REQ, false),
            (REQ_TIMEOUT_MS, A, attr::REQ, false),
            (REQ_TIMEOUT_MS, B, attr::MRA, false)
        ]
    );
    assert_eq!(n.a.state(id), Some(State::MraReqRcvd));
}

#[test]
fn duplicate_req_in_timewait_gets_stale_connection_reject() {
    let mut n = Net::new(|_, _, _| false);
    let id = n.a.connect(n.now, &connect_params(0xa1a)).unwrap();
    n.run(1);
    // Keep A's REQ as a late duplicate.
    let (_, _, Event::ConnectRequest { id: bid, req, .. }) = n.events[0].clone() else {
        panic!()
    };
    let late_req = CmMad {
        transaction_id: 0,
        attribute_modifier: 0,
        message: CmMessage::Req(*req),
    };
    n.a.disconnect(n.now, id, &[]).unwrap();
    n.run(2);
    assert_eq!(n.b.state(bid), Some(State::Timewait));
    n.b.handle_mad(n.now, GID_A, &late_req.to_bytes());
    let t = n.b.poll_transmit().expect("a REJ");
    let CmMessage::Rej(rej) = CmMad::parse(&t.mad).unwrap().message else {
        panic!("not a REJ")
    };
    assert_eq!(rej.reason, RejectReason::STALE_CONN);
    assert_eq!(
        (rej.local_comm_id, rej.message_rejected),
        (bid.0, MessageResponse::Other)
    );
}

#[test]
fn dreq_for_an_unknown_connection_gets_a_drep() {
    let mut b = Endpoint::new(config(0xbbbb, 0));
    let dreq = CmMad {
        transaction_id: 0x77,
        attribute_modifier: 0,
        message: CmMessage::Dreq(DreqRepr {
            local_comm_id: 0x1234,
            remote_comm_id: 0x9999,
            remote_qpn: 0x11,
            private_data: [0; cm::dreq::PRIVATE_DATA_LEN],
        }),
    };
    let t0 = Instant::now();
    b.handle_mad(t0, GID_A, &dreq.to_bytes());
    let t = b.poll_transmit().expect("a DREP");
    assert_eq!(t.dst_gid, GID_A);
    let m = CmMad::parse(&t.mad).unwrap();
    assert_eq!(m.transaction_id, 0x77);
    let CmMessage::Drep(d) = m.message else {
        panic!("not a DREP")
    };
    assert_eq!((d.local_comm_id, d.remote_comm_id), (0x9999, 0x1234));
    assert_eq!(b.connection_count(), 0);
}

#[test]
fn stray_rep_and_garbage_are_dropped() {
    let mut n = Net::new(|_, _, _| false);
    n.a.connect(n.now, &connect_params(0xa1a)).unwrap();
    n.run(1);
    let rep_bytes = {
        let (_, _, Event::ConnectReply { rep, .. }) = n.events[1].clone() else {
            panic!("{:?}", n.events)
        };
        let mut rep = *rep;
        rep.remote_comm_id ^= 0xffff; // names no connection of A
        CmMad {
            transaction_id: 1,
            attribute_modifier: 0,
            message: CmMessage::Rep(rep),
        }
        .to_bytes()
    };
    let before = n.a.dropped();
    n.a.handle_mad(n.now, GID_B, &rep_bytes);
    n.a.handle_mad(n.now, GID_B, &[0u8; 10]);
    n.a.handle_mad(n.now, GID_B, &[0xffu8; 256]);
    // Kernel cm_rep_handler/cm_dup_rep_handler: no connection, no answer.
    assert!(n.a.poll_transmit().is_none());
    assert!(n.a.poll_event().is_none());
    assert_eq!(n.a.dropped(), before + 3);
}

#[test]
fn req_reusing_a_live_qpn_is_stale_and_disconnects_the_old_connection() {
    let mut n = Net::new(|_, _, _| false);
    let old = n.a.connect(n.now, &connect_params(0xa1a)).unwrap();
    n.run(1);
    // A "restarts" and connects again with the same QPN, from a fresh
    // endpoint (new comm IDs).
    n.a = Endpoint::new(config(0xaaaa, 0x2222_0000));
    n.events.clear();
    let new = n.a.connect(n.now, &connect_params(0xa1a)).unwrap();
    assert_ne!(new, old);
    n.run(2);
    assert!(matches!(
        &n.events[0],
        (
            _,
            A,
            Event::Rejected {
                reason: RejectReason::STALE_CONN,
                ..
            }
        )
    ));
    // B disconnects the old connection: its DREQ reaches A's new endpoint,
    // which answers with cm_issue_drep, and B ends in TIMEWAIT.
    let tail: Vec<u16> = n
        .sent()
        .iter()
        .rev()
        .take(3)
        .map(|(_, _, a, _)| *a)
        .collect();
    assert_eq!(tail, [attr::DREP, attr::DREQ, attr::REJ]);
    assert!(n
        .events
        .iter()
        .any(|(_, s, e)| *s == B && matches!(e, Event::Disconnected { .. })));
}

#[test]
fn consumer_errors_are_explained() {
    let mut n = Net::new(|_, _, _| false);
    let mut p = connect_params(1);
    p.private_data = vec![0; 93];
    let e = n.a.connect(n.now, &p).unwrap_err();
    assert_eq!(e, CmError::PrivateDataTooLong { len: 93, max: 92 });
    assert_eq!(
        e.to_string(),
        "93 bytes of private data do not fit: this CM message holds 92"
    );
    let id = n.a.connect(n.now, &connect_params(1)).unwrap();
    let e = n.a.disconnect(n.now, id, &[]).unwrap_err();
    assert_eq!(
        e,
        CmError::InvalidState {
            id,
            state: State::ReqSent,
            call: "disconnect"
        }
    );
    assert!(e.to_string().contains("ReqSent"), "{e}");
    assert_eq!(n.b.listen(SERVICE), Err(CmError::ServiceIdInUse(SERVICE)));
    let ghost = ConnId(0xdead);
    assert_eq!(n.a.ready_to_use(ghost, &[]), Err(CmError::UnknownId(ghost)));
    assert!(CmError::UnknownId(ghost).to_string().contains("0x0000dead"));
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    /// Whatever the link drops (random losses, then perhaps a blackout in
    /// one or both directions from some message on: a vanished peer),
    /// both sides reach IDLE with no timer left and the active side is
    /// told exactly one outcome: never a hang.
    #[test]
    fn any_loss_pattern_ends_idle(
        drops in prop::collection::vec(any::<bool>(), 64),
        p_drop in 0usize..4,
        blackout in prop::option::of((0usize..12, 0u8..3)),
    ) {
        let mut k = 0usize;
        let mut n = Net::new(move |side, _, _| {
            k += 1;
            let dark = blackout.is_some_and(|(from, dir)| {
                k > from && (dir == 2 || (dir == 0) == (side == A))
            });
            dark || (drops[k % 64] && (k % 4) < p_drop)
        });
        n.auto_disconnect = true;
        n.a.connect(n.now, &connect_params(0xa1a)).unwrap();
        n.run(10_000_000);
        prop_assert_eq!(n.a.connection_count(), 0);
        prop_assert_eq!(n.a.poll_timeout(), None);
        prop_assert_eq!(n.b.poll_timeout(), None);
        // The passive side may stay ESTABLISHED: if the active side
        // vanishes after the RTU, no CM message will ever tell it (kernel
        // cm too); its QP's transport errors will.
        if n.b.connection_count() > 0 {
            let bid = n.events.iter().find_map(|(_, _, e)| match e {
                Event::ConnectRequest { id, .. } => Some(*id),
                _ => None,
            });
            prop_assert_eq!(n.b.connection_count(), 1);
            prop_assert_eq!(bid.and_then(|id| n.b.state(id)), Some(State::Established));
            prop_assert!(blackout.is_some());
        }
        let outcomes: Vec<_> = n.event_names(A).into_iter()
            .filter(|(_, e)| matches!(*e, "Unreachable" | "Rejected" | "TimewaitExit"))
            .collect();
        prop_assert_eq!(outcomes.len(), 1, "{:?}", n.event_names(A));
        // Nothing takes longer than every retry of REQ and DREQ plus TIMEWAIT.
        let worst = 2 * 16 * REQ_TIMEOUT_MS + TIMEWAIT_MS;
        prop_assert!(outcomes[0].0 <= worst, "{:?}", outcomes);
    }
}

#[test]
fn active_side_giving_up_rejects_with_timeout_found_by_ca_guid() {
    // B's REP is lost; A's consumer destroys the id in REQ_SENT: kernel
    // sends REJ TIMEOUT whose ARI is A's CA GUID, and B (REP_SENT) finds
    // its connection by that GUID and A's comm ID (cm_acquire_rejected_id).
    let mut n = Net::new(|side, attr, _| side == B && attr == attr::REP);
    let id = n.a.connect(n.now, &connect_params(0xa1a)).unwrap();
    n.run(1);
    let (_, _, Event::ConnectRequest { id: bid, .. }) = n.events[0].clone() else {
        panic!()
    };
    assert_eq!(n.b.state(bid), Some(State::RepSent));
    n.a.destroy(n.now, id).unwrap();
    n.run(2);
    let Some((_, B, Event::Rejected { reason, ari, .. })) = n.events.last() else {
        panic!("{:?}", n.events)
    };
    assert_eq!(*reason, RejectReason::TIMEOUT);
    assert_eq!(ari.as_slice(), 0xaaaau64.to_be_bytes());
    assert_eq!((n.a.connection_count(), n.b.connection_count()), (0, 0));
    assert_eq!(n.b.poll_timeout(), None, "the REP is no longer resent");
}

#[test]
fn traffic_before_the_rtu_establishes_the_passive_side() {
    // All RTUs lost, but the consumer sees the QP's first packet (kernel
    // ib_cm_notify(IB_EVENT_COMM_EST)): ESTABLISHED, no more REP resends.
    let mut n = Net::new(|side, attr, _| side == A && attr == attr::RTU);
    n.a.connect(n.now, &connect_params(0xa1a)).unwrap();
    n.run(1);
    let (_, _, Event::ConnectRequest { id: bid, .. }) = n.events[0].clone() else {
        panic!()
    };
    assert_eq!(n.b.state(bid), Some(State::RepSent));
    n.b.notify_established(bid).unwrap();
    assert_eq!(n.b.state(bid), Some(State::Established));
    assert_eq!(n.b.poll_timeout(), None);
    assert!(matches!(n.b.poll_event(), Some(Event::Established { id, .. }) if id == bid));
    assert!(matches!(
        n.b.notify_established(bid),
        Err(CmError::InvalidState {
            state: State::Established,
            ..
        })
    ));
}

proptest! {
    /// Hostile MADs (random class data under a valid CM header, random
    /// comm IDs that sometimes name live connections) never panic the
    /// endpoint, and a consumer call afterwards still works.
    #[test]
    fn hostile_mads_never_panic(
        mads in prop::collection::vec(
            (prop::collection::vec(any::<u8>(), 232), 0x10u16..=0x18, any::<bool>(), any::<u64>()),
            1..40,
        ),
    ) {
        let mut n = Net::new(|_, _, _| false);
        let id = n.a.connect(n.now, &connect_params(0xa1a)).unwrap();
        n.run(1);
        let (_, _, Event::ConnectRequest { id: bid, .. }) = n.events[0].clone() else { panic!() };
        for (mut data, attr, aim, tid) in mads {
            if aim {
                // Name the live connection in both comm ID slots.
                data[..4].copy_from_slice(&id.0.to_be_bytes());
                data[4..8].copy_from_slice(&bid.0.to_be_bytes());
            }
            let mut mad = [0u8; 256];
            wire::mad::MadHeaderRepr::cm_send(attr, tid)
                .emit(&mut wire::mad::Packet::new_unchecked(&mut mad[..24]));
            mad[24..].copy_from_slice(&data);
            n.a.handle_mad(n.now, GID_B, &mad);
            n.b.handle_mad(n.now, GID_A, &mad);
            n.now += Duration::from_millis(u64::from(data[0]) * 100);
            n.a.handle_timeout(n.now);
            n.b.handle_timeout(n.now);
            while n.a.poll_transmit().is_some() || n.b.poll_transmit().is_some() {}
            while n.a.poll_event().is_some() || n.b.poll_event().is_some() {}
        }
        // The endpoints still take calls: a fresh connection comes up.
        n.events.clear();
        n.log.clear();
        let id2 = n.a.connect(n.now, &connect_params(0xa2a)).unwrap();
        n.run(n.ms() + 1);
        prop_assert_eq!(n.a.state(id2), Some(State::Established));
    }
}

#[test]
fn sidr_request_is_answered_with_qpn_and_qkey() {
    let mut n = Net::new(|_, _, _| false);
    let id = n.a.sidr_request(n.now, &sidr_params()).unwrap();
    assert_eq!(n.a.state(id), Some(State::SidrReqSent));
    n.run(100_000);
    assert_eq!(
        n.sent(),
        [(0, A, attr::SIDR_REQ, false), (0, B, attr::SIDR_REP, false)]
    );
    let [(
        _,
        B,
        Event::SidrRequest {
            remote_gid, req, ..
        },
    ), (
        _,
        A,
        Event::SidrReply {
            id: got,
            status,
            qpn,
            qkey,
            info,
            private_data,
        },
    )] = &n.events[..]
    else {
        panic!("{:?}", n.events)
    };
    assert_eq!(*remote_gid, GID_A);
    assert_eq!((req.service_id, req.pkey), (SERVICE, 0xffff));
    assert_eq!(&req.private_data[..11], b"sidr from A");
    assert_eq!(
        (*got, *status, *qpn, *qkey),
        (id, SidrStatus::SUCCESS, 0x5d5, 0x1234_5678)
    );
    assert!(info.is_empty());
    assert_eq!(&private_data[..11], b"sidr from B");
    // Nothing is left: a SIDR id has no TIMEWAIT.
    assert_eq!((n.a.connection_count(), n.b.connection_count()), (0, 0));
    assert_eq!((n.a.poll_timeout(), n.b.poll_timeout()), (None, None));
    assert_eq!(n.a.state(id), None);
}

#[test]
fn sidr_request_for_an_unlistened_service_is_answered_unsupported() {
    // Kernel cm_sidr_req_handler: no listener → SIDR_REP status 1
    // (IB_SIDR_UNSUPPORTED) at once, nothing kept, no consumer event.
    let mut n = Net::new(|_, _, _| false);
    n.b.unlisten(SERVICE).unwrap();
    let id = n.a.sidr_request(n.now, &sidr_params()).unwrap();
    n.run(100_000);
    assert_eq!(
        n.sent(),
        [(0, A, attr::SIDR_REQ, false), (0, B, attr::SIDR_REP, false)]
    );
    assert!(
        matches!(&n.events[..], [(_, A, Event::SidrReply { id: e, status, qpn: 0, qkey: 0, .. })]
            if *e == id && *status == SidrStatus::UNSUPPORTED && status.0 == 1),
        "{:?}",
        n.events
    );
    assert_eq!((n.a.connection_count(), n.b.connection_count()), (0, 0));
}

#[test]
fn lost_sidr_req_is_resent_after_its_timeout() {
    let mut n = Net::new(|side, attr, nth| side == A && attr == attr::SIDR_REQ && nth < 2);
    let id = n.a.sidr_request(n.now, &sidr_params()).unwrap();
    n.run(1_000_000);
    assert_eq!(
        n.sent(),
        [
            (0, A, attr::SIDR_REQ, true),
            (SIDR_TIMEOUT_MS, A, attr::SIDR_REQ, true),
            (2 * SIDR_TIMEOUT_MS, A, attr::SIDR_REQ, false),
            (2 * SIDR_TIMEOUT_MS, B, attr::SIDR_REP, false)
        ]
    );
    assert!(matches!(
        n.events.last(),
        Some((_, A, Event::SidrReply { id: e, status: SidrStatus::SUCCESS, .. })) if *e == id
    ));
}

#[test]
fn lost_sidr_rep_is_recovered_by_the_resent_sidr_req() {
    // An answered SIDR_REQ is forgotten (kernel cm_send_sidr_rep_locked
    // takes it out of the remote SIDR table), so the resent copy is a new
    // request to the consumer, who answers it again.
    let mut n = Net::new(|side, attr, nth| side == B && attr == attr::SIDR_REP && nth == 0);
    n.a.sidr_request(n.now, &sidr_params()).unwrap();
    n.run(1_000_000);
    assert_eq!(
        n.sent(),
        [
            (0, A, attr::SIDR_REQ, false),
            (0, B, attr::SIDR_REP, true),
            (SIDR_TIMEOUT_MS, A, attr::SIDR_REQ, false),
            (SIDR_TIMEOUT_MS, B, attr::SIDR_REP, false)
        ]
    );
    assert_eq!(
        n.event_names(B),
        [(0, "SidrRequest"), (SIDR_TIMEOUT_MS, "SidrRequest")]
    );
    assert_eq!(n.event_names(A), [(SIDR_TIMEOUT_MS, "SidrReply")]);
}

#[test]
fn vanished_peer_makes_the_sidr_req_unreachable_after_all_retries() {
    // Kernel: the MAD layer sends the SIDR_REQ once and resends it
    // max_cm_retries (15) times, every timeout_ms (4096); then
    // IB_CM_SIDR_REQ_ERROR, which rdma_cm reports as UNREACHABLE.
    let mut n = Net::new(|side, _, _| side == A);
    let id = n.a.sidr_request(n.now, &sidr_params()).unwrap();
    n.run(10_000_000);
    let expected: Vec<_> = (0..=u64::from(CMA_MAX_CM_RETRIES))
        .map(|k| (k * SIDR_TIMEOUT_MS, A, attr::SIDR_REQ, true))
        .collect();
    assert_eq!(n.sent(), expected);
    assert_eq!(expected.len(), 16);
    let give_up = 16 * SIDR_TIMEOUT_MS;
    assert_eq!(n.event_names(A), [(give_up, "Unreachable")]);
    assert!(matches!(
        n.events[..],
        [(_, A, Event::Unreachable { id: e, message: SentMessage::SidrReq })] if e == id
    ));
    assert_eq!(n.a.state(id), None);
    assert_eq!(n.a.poll_timeout(), None);
}

#[test]
fn duplicate_sidr_req_is_dropped_while_the_consumer_decides() {
    let mut n = Net::new(|_, _, _| false);
    n.sidr_answer = SidrAnswer::Ignore;
    let id = n.a.sidr_request(n.now, &sidr_params()).unwrap();
    n.run(SIDR_TIMEOUT_MS + 1);
    // The resent SIDR_REQ reached B but is the pending request again.
    assert_eq!(
        n.sent(),
        [
            (0, A, attr::SIDR_REQ, false),
            (SIDR_TIMEOUT_MS, A, attr::SIDR_REQ, false)
        ]
    );
    assert_eq!(n.event_names(B), [(0, "SidrRequest")]);
    assert_eq!(n.b.dropped(), 1);
    let Some((_, B, Event::SidrRequest { id: bid, req, .. })) = n.events.first().cloned() else {
        panic!("{:?}", n.events)
    };
    assert_eq!(n.b.state(bid), Some(State::SidrReqRcvd));
    // The same request ID from another GID is another requester.
    let gid_c = [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xc];
    let copy = CmMad {
        transaction_id: 1,
        attribute_modifier: 0,
        message: CmMessage::SidrReq(*req.clone()),
    };
    n.b.handle_mad(n.now, gid_c, &copy.to_bytes());
    assert!(matches!(
        n.b.poll_event(),
        Some(Event::SidrRequest { remote_gid, .. }) if remote_gid == gid_c
    ));
    assert_eq!(n.b.connection_count(), 2);
    // The consumer answers the first: A is done.
    n.b.sidr_reply(bid, SidrStatus::SUCCESS, 0x77, 0x99, &[])
        .unwrap();
    n.run(SIDR_TIMEOUT_MS + 2);
    assert!(matches!(
        n.events.last(),
        Some((_, A, Event::SidrReply { id: e, qpn: 0x77, qkey: 0x99, .. })) if *e == id
    ));
    assert_eq!(n.a.connection_count(), 0);
    assert_eq!(
        n.b.sidr_reply(bid, SidrStatus::SUCCESS, 0x77, 0x99, &[]),
        Err(CmError::UnknownId(bid))
    );
}

#[test]
fn destroying_sidr_ids() {
    // Passive (kernel cm_destroy_id in SIDR_REQ_RCVD): SIDR_REP REJECT.
    let mut n = Net::new(|_, _, _| false);
    n.sidr_answer = SidrAnswer::Ignore;
    let id = n.a.sidr_request(n.now, &sidr_params()).unwrap();
    n.run(1);
    let Some((_, B, Event::SidrRequest { id: bid, .. })) = n.events.first().cloned() else {
        panic!("{:?}", n.events)
    };
    n.b.destroy(n.now, bid).unwrap();
    n.run(2);
    assert!(matches!(
        n.events.last(),
        Some((_, A, Event::SidrReply { id: e, status: SidrStatus::REJECT, .. })) if *e == id
    ));
    assert_eq!((n.a.connection_count(), n.b.connection_count()), (0, 0));

    // Active (SIDR_REQ_SENT): no more resends and no event; a late
    // SIDR_REP finds nothing.
    let mut n = Net::new(|side, _, _| side == B);
    let id = n.a.sidr_request(n.now, &sidr_params()).unwrap();
    n.run(1);
    n.a.destroy(n.now, id).unwrap();
    assert_eq!(n.a.poll_timeout(), None);
    n.run(1_000_000);
    assert_eq!(n.event_names(A), []);
    assert_eq!(n.a.destroy(n.now, id), Err(CmError::UnknownId(id)));
}

#[test]
fn sidr_consumer_errors_are_explained() {
    let mut n = Net::new(|_, _, _| false);
    n.sidr_answer = SidrAnswer::Ignore;
    let too_long = SidrParams {
        private_data: vec![0; 217],
        ..sidr_params()
    };
    assert_eq!(
        n.a.sidr_request(n.now, &too_long),
        Err(CmError::PrivateDataTooLong { len: 217, max: 216 })
    );
    let id = n.a.sidr_request(n.now, &sidr_params()).unwrap();
    n.run(1);
    let e =
        n.a.sidr_reply(id, SidrStatus::SUCCESS, 1, 2, &[])
            .unwrap_err();
    assert_eq!(
        e,
        CmError::InvalidState {
            id,
            state: State::SidrReqSent,
            call: "sidr_reply"
        }
    );
    let Some((_, B, Event::SidrRequest { id: bid, .. })) = n.events.first().cloned() else {
        panic!("{:?}", n.events)
    };
    assert_eq!(
        n.b.sidr_reply(bid, SidrStatus::SUCCESS, 1, 2, &[0; 137]),
        Err(CmError::PrivateDataTooLong { len: 137, max: 136 })
    );
    let params = SidrReplyParams {
        status: SidrStatus::REDIRECT,
        qpn: 0,
        qkey: 0,
        info: vec![1; 73],
        private_data: Vec::new(),
        ece_vendor_id: 0,
        ece_attr_mod: 0,
    };
    let e = n.b.sidr_reply_with(bid, &params).unwrap_err();
    assert_eq!(e, CmError::AdditionalInfoTooLong { len: 73, max: 72 });
    assert!(e.to_string().contains("a SIDR_REP holds 72"), "{e}");
    // Still pending after the refused calls; a SIDR id is not a connection.
    assert_eq!(n.b.state(bid), Some(State::SidrReqRcvd));
    assert!(matches!(
        n.b.accept(n.now, bid, &accept_params()),
        Err(CmError::UnknownId(_))
    ));
    // Additional information reaches the requester, trimmed to its length.
    let params = SidrReplyParams {
        info: vec![1, 2, 3],
        ..params
    };
    n.b.sidr_reply_with(bid, &params).unwrap();
    n.run(2);
    assert!(matches!(
        n.events.last(),
        Some((_, A, Event::SidrReply { status: SidrStatus::REDIRECT, info, .. })) if info == &[1, 2, 3]
    ));
}

#[test]
fn sidr_messages_carry_what_the_kernel_puts_in_them() {
    // Byte level: the SIDR_REQ's TID is formed from the request ID as a
    // REQ's is (cm_form_tid), with no attribute modifier; the SIDR_REP
    // echoes TID, request ID and service ID, and carries ECE as kernel
    // cm_format_sidr_rep does (vendor ID bits 15-0, attr_mod in the header).
    let t0 = Instant::now();
    let mut a = Endpoint::new(config(0xaaaa, 0x1111_0000));
    let mut b = Endpoint::new(config(0xbbbb, 0x5555_0000));
    b.listen(SERVICE).unwrap();
    let id = a.sidr_request(t0, &sidr_params()).unwrap();
    let t = a.poll_transmit().unwrap();
    assert_eq!(t.dst_gid, GID_B);
    let m = CmMad::parse(&t.mad).unwrap();
    let tid = 7u64 << 32 | u64::from(u32::from_le_bytes(id.0.to_be_bytes()));
    assert_eq!((m.transaction_id, m.attribute_modifier), (tid, 0));
    let CmMessage::SidrReq(req) = &m.message else {
        panic!("{m:?}")
    };
    assert_eq!(
        (req.request_id, req.pkey, req.service_id),
        (id.0, 0xffff, SERVICE)
    );

    b.handle_mad(t0, GID_A, &t.mad);
    let Some(Event::SidrRequest { id: bid, .. }) = b.poll_event() else {
        panic!()
    };
    let params = SidrReplyParams {
        status: SidrStatus::SUCCESS,
        qpn: 0x1_00c0de,
        qkey: 0x1111_2222,
        info: Vec::new(),
        private_data: b"pd".to_vec(),
        ece_vendor_id: 0x00ab_cdef,
        ece_attr_mod: 0x8000_0005,
    };
    b.sidr_reply_with(bid, &params).unwrap();
    let r = b.poll_transmit().unwrap();
    assert_eq!(r.dst_gid, GID_A);
    assert_eq!(&r.mad[16..24], &[0, 0x18, 0, 0, 0x80, 0, 0, 5]);
    let m = CmMad::parse(&r.mad).unwrap();
    assert_eq!(m.transaction_id, tid);
    let CmMessage::SidrRep(rep) = &m.message else {
        panic!("{m:?}")
    };
    assert_eq!(
        (
            rep.request_id,
            rep.service_id,
            rep.qpn,
            rep.qkey,
            rep.vendor_id
        ),
        (id.0, SERVICE, 0x00c0de, 0x1111_2222, 0xcdef)
    );
    a.handle_mad(t0, GID_B, &r.mad);
    assert!(matches!(
        a.poll_event(),
        Some(Event::SidrReply { id: e, qpn: 0x00c0de, .. }) if e == id
    ));
    // A copy of the SIDR_REP finds nothing any more.
    a.handle_mad(t0, GID_B, &r.mad);
    assert_eq!(a.poll_event(), None);
    assert_eq!(a.dropped(), 1);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    /// Whatever the link drops, a SIDR request ends in exactly one
    /// SidrReply or Unreachable, no later than every retry, and leaves
    /// both sides idle.
    #[test]
    fn any_sidr_loss_pattern_ends_idle(drops in prop::collection::vec(any::<bool>(), 40)) {
        let mut k = 0usize;
        let mut n = Net::new(move |_, _, _| {
            k += 1;
            drops[k % 40]
        });
        n.a.sidr_request(n.now, &sidr_params()).unwrap();
        n.run(10_000_000);
        prop_assert_eq!((n.a.connection_count(), n.b.connection_count()), (0, 0));
        prop_assert_eq!((n.a.poll_timeout(), n.b.poll_timeout()), (None, None));
        let outcomes = n.event_names(A);
        prop_assert_eq!(outcomes.len(), 1, "{:?}", outcomes);
        prop_assert!(outcomes[0].0 <= 16 * SIDR_TIMEOUT_MS);
    }
}

#[test]
fn ece_travels_in_req_and_rep_as_the_kernel_sends_it() {
    // Kernel cm_format_req / cm_format_rep: the vendor ID in the message
    // (REQ bytes 5-7; REP bytes 15, 19 and 23), the options in the MAD
    // header's attribute modifier (cm_format_mad_ece_hdr), and
    // cm_format_req_event / cm_format_rep_event hand both up. Every other
    // message keeps attribute modifier 0 (cm_format_mad_hdr).
    let t0 = Instant::now();
    let mut a = Endpoint::new(config(0xaaaa, 0x1111_0000));
    let mut b = Endpoint::new(config(0xbbbb, 0x5555_0000));
    b.listen(SERVICE).unwrap();
    let params = ConnectParams {
        // Above 24 bits is cut, as IBA_SET cuts it.
        ece_vendor_id: 0x0100_02c9,
        ece_attr_mod: 0x8000_0001,
        ..connect_params(0xa1a)
    };
    let id = a.connect(t0, &params).unwrap();
    let req = a.poll_transmit().unwrap().mad;
    assert_eq!(&req[20..24], &[0x80, 0, 0, 1]);
    assert_eq!(&req[24 + 4..24 + 8], &[0, 0, 0x02, 0xc9]);
    // The resent REQ is the same REQ.
    let t1 = t0 + Duration::from_millis(REQ_TIMEOUT_MS);
    a.handle_timeout(t1);
    assert_eq!(a.poll_transmit().unwrap().mad, req);

    b.handle_mad(t1, GID_A, &req);
    let Some(Event::ConnectRequest {
        id: bid,
        req: r,
        ece_attr_mod,
        ..
    }) = b.poll_event()
    else {
        panic!("no ConnectRequest")
    };
    assert_eq!((r.vendor_id, ece_attr_mod), (0x02c9, 0x8000_0001));
    let accept = AcceptParams {
        ece_vendor_id: 0x00ab_cdef,
        ece_attr_mod: 0x8000_0000,
        ..accept_params()
    };
    b.accept(t1, bid, &accept).unwrap();
    let rep = b.poll_transmit().unwrap().mad;
    assert_eq!(&rep[20..24], &[0x80, 0, 0, 0]);
    assert_eq!(
        (rep[24 + 15], rep[24 + 19], rep[24 + 23]),
        (0xab, 0xcd, 0xef)
    );
    a.handle_mad(t1, GID_B, &rep);
    let Some(Event::ConnectReply {
        id: e,
        rep: r,
        ece_attr_mod,
    }) = a.poll_event()
    else {
        panic!("no ConnectReply")
    };
    assert_eq!(
        (e, r.vendor_id, ece_attr_mod),
        (id, 0x00ab_cdef, 0x8000_0000)
    );

    // RTU, DREQ and DREP carry none.
    a.ready_to_use(id, &[]).unwrap();
    let rtu = a.poll_transmit().unwrap().mad;
    b.handle_mad(t1, GID_A, &rtu);
    a.disconnect(t1, id, &[]).unwrap();
    let dreq = a.poll_transmit().unwrap().mad;
    b.handle_mad(t1, GID_A, &dreq);
    let drep = b.poll_transmit().unwrap().mad;
    for (name, mad) in [("RTU", rtu), ("DREQ", dreq), ("DREP", drep)] {
        assert_eq!(CmMad::parse(&mad).unwrap().attribute_modifier, 0, "{name}");
    }
}

#[test]
fn refusing_ece_is_a_reject_vendor_option_not_supported() {
    // rdma_reject with IB_CM_REJ_VENDOR_OPTION_NOT_SUPPORTED (the one
    // reason besides CONSUMER_DEFINED that ucma_reject lets through):
    // ib_send_cm_rej with reason 35; the REJ's attribute modifier is 0.
    let mut n = Net::new(|_, _, _| false);
    let params = ConnectParams {
        ece_vendor_id: 0x02c9,
        ece_attr_mod: 1,
        ..connect_params(0xa1a)
    };
    let id = n.a.connect(n.now, &params).unwrap();
    // B's consumer refuses the options by hand.
    let req = n.a.poll_transmit().unwrap().mad;
    n.b.handle_mad(n.now, GID_A, &req);
    let Some(Event::ConnectRequest {
        id: bid,
        ece_attr_mod: 1,
        ..
    }) = n.b.poll_event()
    else {
        panic!("no ConnectRequest with ECE")
    };
    n.b.reject(
        n.now,
        bid,
        RejectReason::VENDOR_OPTION_NOT_SUPPORTED,
        b"no ece",
    )
    .unwrap();
    let rej = n.b.poll_transmit().unwrap().mad;
    let m = CmMad::parse(&rej).unwrap();
    assert_eq!(m.attribute_modifier, 0);
    let CmMessage::Rej(r) = &m.message else {
        panic!("{m:?}")
    };
    assert_eq!((r.reason.0, r.message_rejected), (35, MessageResponse::Req));
    n.a.handle_mad(n.now, GID_B, &rej);
    let Some(Event::Rejected {
        id: e,
        reason,
        private_data,
        ..
    }) = n.a.poll_event()
    else {
        panic!("no Rejected")
    };
    assert_eq!(
        (reason, &private_data[..6]),
        (RejectReason::VENDOR_OPTION_NOT_SUPPORTED, &b"no ece"[..])
    );
    assert_eq!(e, id);
    assert_eq!(n.a.state(id), None);
}
