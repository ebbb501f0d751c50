//! Congestion control end to end (`rxe_core::cc`, `rxe_core::sim`): the
//! kernel-rxe-like default changes nothing; a ConnectX-like device sends
//! ECT(0), answers CE marks with CNPs laid out as ConnectX's, reacts to
//! CNPs with DCQCN, paces its QPs, and, through a marking bottleneck, two
//! flows share the link fairly with a short queue and one recovers its
//! rate when the other stops.

use std::time::Duration;

use rxe_core::cc::{CcConfig, CcModel, CcParams};
use rxe_core::sim::{
    node_config, Bottleneck, ConnectOpts, Dumbbell, DumbbellOpts, LinkConfig, Network, QpEnd,
    Sample,
};
use rxe_core::{AccessFlags, Ecn, Instant, QpType, RxDatagram, SendOp, SendWr, Sge, Transmit};

type Log = std::rc::Rc<std::cell::RefCell<Vec<(Instant, Transmit)>>>;

fn mlx5(line_mbps: u64) -> CcConfig {
    let mut params = CcParams::default();
    params.set("line_rate_mbps", line_mbps).unwrap();
    CcConfig {
        model: CcModel::Mlx5Like,
        params,
    }
}

/// Two nodes, one RC pair, a tap logging every transmit.
fn pair(cc: &CcConfig, link: LinkConfig) -> (Network, QpEnd, QpEnd, Log) {
    let mut n = Network::new(5, link);
    for (i, ip) in ["10.0.0.1", "10.0.0.2"].iter().enumerate() {
        let mut c = node_config(ip.parse().unwrap(), i as u64 + 1);
        c.cc = cc.clone();
        n.add_node(c);
    }
    let a = n.create_endpoint(0, QpType::Rc, None, None, 64).unwrap();
    let b = n.create_endpoint(1, QpType::Rc, None, None, 64).unwrap();
    let o = ConnectOpts {
        mtu: rxe_core::Mtu::M1024,
        ..ConnectOpts::default()
    };
    n.connect(&a, &b, &o).unwrap();
    let log: Log = Default::default();
    let l = log.clone();
    n.set_tap(move |now, t| l.borrow_mut().push((now, t.clone())));
    (n, a, b, log)
}

/// Post `count` RDMA WRITEs of `len` bytes from A to B and run to the end.
fn write(n: &mut Network, a: &QpEnd, b: &QpEnd, len: u32, count: u64) {
    let src = n.node(a.node).mem_mut().alloc(len as usize);
    let lkey = n
        .node(a.node)
        .reg_mr(a.pd, src, len.into(), AccessFlags::LOCAL_WRITE)
        .unwrap()
        .lkey;
    let dst = n.node(b.node).mem_mut().alloc(len as usize);
    let rkey = n
        .node(b.node)
        .reg_mr(
            b.pd,
            dst,
            len.into(),
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
        )
        .unwrap()
        .rkey;
    let now = n.now();
    for i in 0..count {
        let wr = SendWr::new(
            i,
            SendOp::RdmaWrite {
                remote_addr: dst,
                rkey,
            },
            vec![Sge {
                addr: src,
                length: len,
                lkey,
            }],
        );
        n.node(a.node).post_send(now, a.qpn, wr).unwrap();
    }
    let limit = n.now() + Duration::from_secs(10);
    let done = n.run_until(limit, |n| n.node(a.node).cq_len(a.send_cq) as u64 == count);
    assert!(done, "the WRITEs complete");
    let wcs = n.node(a.node).poll_cq(a.send_cq, count as usize).unwrap();
    assert!(wcs.iter().all(|w| w.status == rxe_core::WcStatus::Success));
}

fn cnp_payload(dest_qpn: u32, info: &wire::icrc::IpUdpInfo) -> Vec<u8> {
    let mut b = vec![0u8; 32];
    wire::cnp::CnpRepr::new(dest_qpn).emit(&mut b).unwrap();
    wire::icrc::write(info, &mut b);
    b
}

#[test]
fn rxe_like_default_sends_not_ect_and_ignores_marks_and_cnps() {
    assert_eq!(CcConfig::default().model, CcModel::RxeLike);
    // Even a link that marks every ECT packet finds nothing to mark.
    let link = LinkConfig {
        ce_mark: 1.0,
        ..LinkConfig::perfect()
    };
    let (mut n, a, b, log) = pair(&CcConfig::default(), link);
    write(&mut n, &a, &b, 64 * 1024, 4);
    let log = log.borrow();
    assert!(log.len() > 64);
    for (_, t) in log.iter() {
        assert_eq!((t.ecn, t.dscp), (Ecn::NotEct, 0));
        assert_ne!(t.payload[0], 0x81, "no CNP");
    }
    assert_eq!(n.stats().ce_marked, 0);
    assert!(n.nodes().iter().all(|e| e.poll_timeout().is_none()));
    // A CE-marked packet and a CNP reach B: the mark is ignored, the CNP
    // dropped and counted as ignored only (kernel rxe counts nothing).
    let before = n.nodes()[1].counters().clone();
    let info = wire::icrc::IpUdpInfo {
        src: "10.0.0.1".parse().unwrap(),
        dst: "10.0.0.2".parse().unwrap(),
        src_port: 0xc000,
        dst_port: 4791,
        ipv4_id: 0,
        ipv4_flags_frag: 0x4000,
    };
    let cnp = cnp_payload(b.qpn, &info);
    let now = n.now();
    n.node(1).handle_datagram(
        now,
        &RxDatagram {
            src: info.src,
            dst: info.dst,
            src_port: info.src_port,
            dst_port: 4791,
            ipv4_id: Some(0),
            payload: &cnp,
            ecn: Ecn::Ce,
        },
    );
    assert!(n.node(1).poll_transmit().is_none());
    let after = n.nodes()[1].counters().clone();
    assert_eq!(after.rp_cnp_ignored, before.rp_cnp_ignored + 1);
    let mut expect = before.clone();
    expect.rp_cnp_ignored += 1;
    assert_eq!(after, expect, "nothing else counted");
    assert_eq!(after.np_cnp_sent + after.np_ecn_marked_roce_packets, 0);
    assert!(!n.nodes()[0].qp_cc(a.qpn).unwrap().reacting);
}

#[test]
fn mlx5_like_marks_ect0_answers_ce_with_cnps_and_reacts() {
    // Every ECT packet is marked CE on the way.
    let link = LinkConfig {
        ce_mark: 1.0,
        ..LinkConfig::perfect()
    };
    let (mut n, a, b, log) = pair(&mlx5(10_000), link);
    write(&mut n, &a, &b, 64 * 1024, 1);
    let log = log.borrow();
    let (cnps, rest): (Vec<_>, Vec<_>) = log.iter().partition(|(_, t)| t.payload[0] == 0x81);
    // Every transport packet leaves ECT(0), DSCP 0.
    assert!(rest.iter().all(|(_, t)| (t.ecn, t.dscp) == (Ecn::Ect0, 0)));
    // CNPs: from B to A's QP, laid out as ConnectX's, DSCP 48, Not-ECT.
    assert!(!cnps.is_empty());
    for (_, t) in &cnps {
        assert_eq!((t.ecn, t.dscp), (Ecn::NotEct, 48));
        assert_eq!(t.info.src, "10.0.0.2".parse::<std::net::IpAddr>().unwrap());
        assert_eq!(t.info.dst_port, 4791);
        let c = wire::cnp::CnpRepr::parse(&t.payload).unwrap();
        assert_eq!(c, wire::cnp::CnpRepr::new(a.qpn));
        assert!(wire::icrc::check(&t.info, &t.payload));
        assert_eq!(&t.payload[..12], {
            let q = a.qpn.to_be_bytes();
            &[0x81, 0, 0xff, 0xff, 0x40, q[1], q[2], q[3], 0, 0, 0, 0][..]
        });
    }
    // At most one CNP per 4 µs (min_time_between_cnps) from the QP.
    for w in cnps.windows(2) {
        assert!(w[1].0.as_nanos() - w[0].0.as_nanos() >= 4_000);
    }
    // The counters agree with the wire (lumina's check_counters).
    let data_to_b = rest
        .iter()
        .filter(|(_, t)| t.info.dst == "10.0.0.2".parse::<std::net::IpAddr>().unwrap())
        .count() as u64;
    let cb = n.nodes()[1].counters();
    assert_eq!(cb.np_cnp_sent, cnps.len() as u64);
    assert_eq!(cb.np_ecn_marked_roce_packets, data_to_b);
    assert!(cb.np_cnp_sent < cb.np_ecn_marked_roce_packets, "paced");
    let ca = n.nodes()[0].counters();
    assert_eq!(ca.rp_cnp_handled, cnps.len() as u64);
    assert_eq!(ca.rp_cnp_ignored, 0);
    // A's ACKs to B were marked too, but acknowledgements draw no CNP.
    assert_eq!(ca.np_cnp_sent, 0);
    assert_eq!(
        n.nodes()[0].qp_counters(a.qpn).unwrap().rp_cnp_handled,
        cnps.len() as u64
    );
    // DCQCN cut A's rate.
    let s = n.nodes()[0].qp_cc(a.qpn).unwrap();
    assert!(s.reacting && s.current_rate_bps < 10_000_000_000, "{s:?}");
}

#[test]
fn mlx5_like_ignores_cnps_for_no_qp_or_from_strangers() {
    let (mut n, a, _b, _log) = pair(&mlx5(10_000), LinkConfig::perfect());
    let mk = |src: &str| wire::icrc::IpUdpInfo {
        src: src.parse().unwrap(),
        dst: "10.0.0.1".parse().unwrap(),
        src_port: 0xc000,
        dst_port: 4791,
        ipv4_id: 0,
        ipv4_flags_frag: 0x4000,
    };
    let now = n.now();
    for (src, qpn) in [("10.0.0.2", 0x77_7777), ("10.0.0.9", a.qpn)] {
        let info = mk(src);
        let cnp = cnp_payload(qpn, &info);
        n.node(0).handle_datagram(
            now,
            &RxDatagram {
                src: info.src,
                dst: info.dst,
                src_port: info.src_port,
                dst_port: 4791,
                ipv4_id: None,
                payload: &cnp,
                ecn: Ecn::NotEct,
            },
        );
    }
    let c = n.nodes()[0].counters();
    assert_eq!((c.rp_cnp_ignored, c.rp_cnp_handled), (2, 0));
    // A CNP with a bad ICRC is an ICRC error; a 33-byte one is malformed.
    let info = mk("10.0.0.2");
    let mut bad = cnp_payload(a.qpn, &info);
    bad[7] ^= 1;
    let mut long = cnp_payload(a.qpn, &info);
    long.insert(28, 0);
    wire::icrc::write(&info, &mut long);
    for p in [&bad, &long] {
        n.node(0).handle_datagram(
            now,
            &RxDatagram {
                src: info.src,
                dst: info.dst,
                src_port: info.src_port,
                dst_port: 4791,
                ipv4_id: Some(0),
                payload: p,
                ecn: Ecn::NotEct,
            },
        );
    }
    let c = n.nodes()[0].counters();
    assert_eq!((c.rcvd_icrc_err, c.rcvd_malformed), (1, 1));
    assert_eq!((c.rp_cnp_ignored, c.rp_cnp_handled), (2, 0));
    // From its peer, to its QP: handled.
    let cnp = cnp_payload(a.qpn, &info);
    n.node(0).handle_datagram(
        now,
        &RxDatagram {
            src: info.src,
            dst: info.dst,
            src_port: info.src_port,
            dst_port: 4791,
            ipv4_id: None,
            payload: &cnp,
            ecn: Ecn::NotEct,
        },
    );
    assert_eq!(n.nodes()[0].counters().rp_cnp_handled, 1);
}

#[test]
fn the_pacer_spaces_packets_and_poll_timeout_wakes_the_driver() {
    let mut cc = mlx5(10_000);
    cc.params.set("rpg_max_rate", 1000).unwrap(); // 1 Gb/s ceiling
    cc.params.set("pacing_burst_bytes", 1).unwrap();
    let (mut n, a, b, log) = pair(&cc, LinkConfig::perfect());
    write(&mut n, &a, &b, 256 * 1024, 1);
    let log = log.borrow();
    let data: Vec<&(Instant, Transmit)> = log
        .iter()
        .filter(|(_, t)| t.info.src == "10.0.0.1".parse::<std::net::IpAddr>().unwrap())
        .collect();
    assert_eq!(data.len(), 256);
    // 1024 B of payload + 12 BTH (+16 RETH on the first) + 4 ICRC + 42 on
    // the wire = 1082 B: 8656 ns apart at 1 Gb/s.
    for w in data[1..].windows(2) {
        assert_eq!(w[1].0.as_nanos() - w[0].0.as_nanos(), 8656);
    }
    let span = data[255].0.as_nanos() - data[0].0.as_nanos();
    assert!((2_200_000..2_220_000).contains(&span), "{span}");
    // And the engine says when it wants to send next while it waits.
    let now = n.now();
    let src = n.node(0).mem_mut().alloc(8192);
    let lkey = n
        .node(0)
        .reg_mr(a.pd, src, 8192, AccessFlags::LOCAL_WRITE)
        .unwrap()
        .lkey;
    let wr = SendWr::new(
        9,
        SendOp::Send,
        vec![Sge {
            addr: src,
            length: 8192,
            lkey,
        }],
    );
    n.node(0).post_send(now, a.qpn, wr).unwrap();
    let mut sent = 0;
    while n.node(0).poll_transmit().is_some() {
        sent += 1;
    }
    assert_eq!(sent, 1, "the bucket holds one packet");
    let wake = n.node(0).poll_timeout().unwrap();
    // SEND_FIRST: 1024 + 12 + 4 + 42 = 1082 B at 1 Gb/s, less the 8 bits
    // the full bucket held, plus the nanosecond that makes it positive.
    assert_eq!(wake.as_nanos() - now.as_nanos(), 1082 * 8 - 8 + 1);
    assert_eq!(n.nodes()[0].qp_cc(a.qpn).unwrap().paced_until, Some(wake));
    n.node(0).handle_timeout(wake);
    assert!(n.node(0).poll_transmit().is_some());
}

/// The dumbbell of the fairness and recovery tests: two senders at 10
/// Gb/s into a 10 Gb/s bottleneck (RED Kmin 40 KB, Kmax 160 KB, Pmax 0.2:
/// HPCC's DCQCN settings scaled to 10 Gb/s), 4 µs links, the second
/// sender 50 µs further away. Flow 0 starts at 0, flow 1 at 10 ms.
fn dumbbell(cc: CcConfig, stop1: Option<Duration>) -> DumbbellOpts {
    DumbbellOpts {
        cc,
        bottleneck: Bottleneck {
            rate_mbps: 10_000,
            buffer_bytes: 4_000_000,
            kmin_bytes: 40_000,
            kmax_bytes: 160_000,
            pmax: 0.2,
        },
        link: LinkConfig {
            delay: Duration::from_micros(4),
            ..LinkConfig::perfect()
        },
        sender_delay: vec![Duration::ZERO, Duration::from_micros(50)],
        active: vec![(Duration::ZERO, None), (Duration::from_millis(10), stop1)],
        mtu: rxe_core::Mtu::M4096,
        msg_len: 64 * 1024,
        depth: 8,
        seed: 1,
    }
}

fn mean(xs: impl Iterator<Item = f64>) -> f64 {
    let v: Vec<f64> = xs.collect();
    v.iter().sum::<f64>() / v.len().max(1) as f64
}

/// The fairness verdict over samples in `[from, to)` ms: each flow's
/// throughput within 10 % of the fair share (5 Gb/s), the link at least
/// 90 % used, DCQCN's two rates within 20 % of the link of each other,
/// and the queue short on average (under 200 KB; without congestion
/// control both flows' windows sit in it, over 900 KB).
fn fair(s: &[Sample], from: u64, to: u64) -> Result<(), String> {
    let w: Vec<&Sample> = s
        .iter()
        .filter(|x| (from * 1_000_000..to * 1_000_000).contains(&x.t.as_nanos()))
        .collect();
    let link = 10e9;
    let thr: Vec<f64> = (0..2)
        .map(|i| mean(w.iter().map(|x| x.throughput_bps[i])))
        .collect();
    let rate_gap = mean(
        w.iter()
            .map(|x| (x.rate_bps[0] as f64 - x.rate_bps[1] as f64).abs()),
    );
    let queue = mean(w.iter().map(|x| x.queued_bytes as f64));
    let why = format!(
        "throughput {:.2}/{:.2} Gb/s, DCQCN rates {:.2} Gb/s apart, queue {:.0} B",
        thr[0] / 1e9,
        thr[1] / 1e9,
        rate_gap / 1e9,
        queue
    );
    let share_ok = thr
        .iter()
        .all(|t| (t - link / 2.0).abs() <= 0.1 * link / 2.0);
    let used_ok = thr.iter().sum::<f64>() >= 0.9 * link;
    let rates_ok = rate_gap <= 0.2 * link;
    let queue_ok = queue < 200_000.0;
    if share_ok && used_ok && rates_ok && queue_ok {
        Ok(())
    } else {
        Err(why)
    }
}

fn run(opts: DumbbellOpts, ms: u64) -> (Vec<Sample>, Dumbbell) {
    let mut d = Dumbbell::new(opts).unwrap();
    let s = d
        .run(
            Instant::from_nanos(ms * 1_000_000),
            Duration::from_millis(1),
        )
        .unwrap();
    (s, d)
}

/// (a) Two flows converge to fair shares with a short queue, within 30 ms
/// of the second one starting (judged over 40-60 ms, 1 ms samples).
#[test]
fn two_flows_share_a_marked_bottleneck_fairly() {
    let (s, d) = run(dumbbell(mlx5(10_000), None), 60);
    fair(&s, 40, 60).unwrap();
    let tr = d.trace();
    assert!(tr.iter().all(|f| !f.cnps.is_empty()));
    assert!(tr.iter().all(|f| f.ect0_packets == f.data_packets));
    assert!(d.net.stats().ce_marked > 0);
    assert_eq!(d.net.stats().queue_dropped, 0, "no loss: ECN did the work");
}

/// The verdict above fails when congestion control is off or DCQCN is
/// broken, so the test that passes is worth something.
#[test]
fn the_fairness_verdict_fails_without_working_dcqcn() {
    // Off: kernel rxe's behaviour. The windows fill the queue.
    let (s, _) = run(dumbbell(CcConfig::default(), None), 60);
    let e = fair(&s, 40, 60).unwrap_err();
    assert!(e.contains("queue"), "{e}");
    // No cuts: CNPs arrive, rates never fall.
    let mut cc = mlx5(10_000);
    cc.params.set("rpg_min_dec_fac", 100).unwrap();
    let (s, _) = run(dumbbell(cc, None), 60);
    assert!(fair(&s, 40, 60).is_err());
    // No increases: rates only fall, the link idles.
    let mut cc = mlx5(10_000);
    cc.params.set("rpg_byte_reset", 0).unwrap();
    cc.params.set("rpg_time_reset", 4_000_000_000).unwrap();
    let (s, _) = run(dumbbell(cc, None), 60);
    assert!(fair(&s, 40, 60).is_err());
}

/// (b) When the second flow stops (at 40 ms), the first climbs back to
/// line rate: DCQCN's rate is back within 1 % of the ceiling and the flow uses over
/// 95 % of the link within 40 ms.
#[test]
fn one_flow_recovers_its_rate_after_congestion_ends() {
    let check = |cc: CcConfig| -> Result<(), String> {
        let (s, _) = run(dumbbell(cc, Some(Duration::from_millis(40))), 90);
        let at = |ms: u64| &s[ms as usize - 1];
        let during = mean((30..40).map(|ms| at(ms).rate_bps[0] as f64));
        let after_rate = at(90).rate_bps[0];
        let after_thr = mean((80..90).map(|ms| at(ms).throughput_bps[0]));
        if during < 0.7e10 && after_rate >= 9_900_000_000 && after_thr > 0.95e10 {
            Ok(())
        } else {
            Err(format!(
                "rate {:.2} Gb/s while shared, {:.2} after; throughput after {:.2}",
                during / 1e9,
                after_rate as f64 / 1e9,
                after_thr / 1e9
            ))
        }
    };
    check(mlx5(10_000)).unwrap();
    // Without increases there is no recovery; without congestion control
    // there was never a cut.
    let mut cc = mlx5(10_000);
    cc.params.set("rpg_ai_rate", 0).unwrap();
    cc.params.set("rpg_hai_rate", 0).unwrap();
    assert!(check(cc).is_err());
    assert!(check(CcConfig::default()).is_err());
}

/// (c) On kernel-rxe-like devices the dumbbell sees no ECT, no mark, no
/// CNP, and no rate but the line rate.
#[test]
fn rxe_like_devices_change_nothing_in_the_dumbbell() {
    let (s, d) = run(dumbbell(CcConfig::default(), None), 20);
    let tr = d.trace();
    assert!(tr.iter().all(|f| f.cnps.is_empty() && f.ect0_packets == 0));
    assert!(tr.iter().all(|f| f.data_packets > 100));
    assert_eq!(d.net.stats().ce_marked, 0);
    for n in d.net.nodes() {
        let c = n.counters();
        assert_eq!(
            (
                c.np_ecn_marked_roce_packets,
                c.np_cnp_sent,
                c.rp_cnp_handled,
                c.rp_cnp_ignored
            ),
            (0, 0, 0, 0)
        );
    }
    assert!(s.iter().all(|x| x.rate_bps == [100_000_000_000; 2]));
}
