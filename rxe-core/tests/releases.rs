//! Where kernel rxe releases differ (`RxeRelease`): an engine configured
//! as 6.1 behaves as 6.1, one configured as 6.12 or 7.2 as those, over the
//! deterministic simulator. The interop suite checks the same facts
//! against each real kernel.

use std::time::Duration;

use rxe_core::sim::{node_config, ConnectOpts, LinkConfig, Network, QpEnd};
use rxe_core::{
    AccessFlags, QpType, RxeRelease, SendOp, SendWr, Sge, WcStatus, FLUSH_GLOBAL, FLUSH_RANGE,
};

const RW: AccessFlags = AccessFlags::LOCAL_WRITE
    .union(AccessFlags::REMOTE_WRITE)
    .union(AccessFlags::REMOTE_READ);

/// Two nodes: `a` behaves as `ra`, `b` as `rb`.
fn net(ra: RxeRelease, rb: RxeRelease) -> Network {
    let mut n = Network::new(7, LinkConfig::perfect());
    for (ip, r, seed) in [("10.0.0.1", ra, 7), ("10.0.0.2", rb, 8)] {
        let mut c = node_config(ip.parse().unwrap(), seed);
        c.set_release(r);
        n.add_node(c);
    }
    n
}

fn pair(n: &mut Network, access: AccessFlags) -> (QpEnd, QpEnd) {
    let a = n.create_endpoint(0, QpType::Rc, None, None, 16).unwrap();
    let b = n.create_endpoint(1, QpType::Rc, None, None, 16).unwrap();
    let o = ConnectOpts {
        access,
        ..ConnectOpts::default()
    };
    n.connect(&a, &b, &o).unwrap();
    (a, b)
}

#[test]
fn max_msg_sz_per_release() {
    for (r, want) in [
        (RxeRelease::V6_1, 0x80_0000),
        (RxeRelease::V6_12, 1u32 << 31),
        (RxeRelease::V7_2, 1u32 << 31),
    ] {
        let mut n = net(r, r);
        assert_eq!(n.node(0).config().caps.max_msg_sz, want, "{r:?}");
    }
}

#[test]
fn local_only_mr_rkey_is_0_up_to_6_4_then_the_lkey() {
    for (r, zero) in [
        (RxeRelease::V6_1, true),
        (RxeRelease::V6_12, false),
        (RxeRelease::V7_2, false),
    ] {
        let mut n = net(r, r);
        let (a, _b) = pair(&mut n, RW);
        let e = n.node(0);
        let addr = e.mem_mut().alloc(64);
        let local = e
            .reg_mr(a.pd, addr, 64, AccessFlags::LOCAL_WRITE)
            .unwrap()
            .clone();
        assert_eq!(local.rkey == 0, zero, "{r:?}: {local:?}");
        assert_ne!(local.lkey, 0);
        if !zero {
            assert_eq!(local.rkey, local.lkey);
        }
        // Remote access: rkey == lkey on every release.
        let remote = e.reg_mr(a.pd, addr, 64, RW).unwrap().clone();
        assert_eq!(remote.rkey, remote.lkey);
        // ibv_rereg_mr changes the PD and access only and keeps the keys
        // (kernel rxe_rereg_user_mr).
        let again = e
            .rereg_mr(remote.lkey, None, None, Some(AccessFlags::LOCAL_WRITE))
            .unwrap()
            .clone();
        assert_eq!((again.lkey, again.rkey), (remote.lkey, remote.rkey));
    }
}

fn flush_wr(va: u64, rkey: u32) -> SendWr {
    SendWr::new(
        1,
        SendOp::Flush {
            remote_addr: va,
            rkey,
            length: 64,
            placement: FLUSH_GLOBAL,
            selectivity: FLUSH_RANGE,
        },
        vec![],
    )
}

#[test]
fn a_6_1_device_knows_no_flush_nor_atomic_write() {
    let mut n = net(RxeRelease::V6_1, RxeRelease::V6_1);
    let (a, _b) = pair(&mut n, RW);
    let e = n.node(0);
    let addr = e.mem_mut().alloc(64);
    for acc in [AccessFlags::FLUSH_GLOBAL, AccessFlags::FLUSH_PERSISTENT] {
        let err = e.reg_mr(a.pd, addr, 64, RW | acc).unwrap_err();
        assert_eq!(
            err.errno(),
            22,
            "{acc:?}: EINVAL, an access bit 6.1 does not know"
        );
    }
    let now = n.now();
    let err = n
        .node(0)
        .post_send(now, a.qpn, flush_wr(addr, 1))
        .unwrap_err();
    assert_eq!(err.errno(), 22, "{err}");
    let aw = SendWr::new(
        2,
        SendOp::AtomicWrite {
            remote_addr: addr,
            rkey: 1,
        },
        vec![Sge {
            addr,
            length: 8,
            lkey: 0,
        }],
    );
    let err = n.node(0).post_send(now, a.qpn, aw).unwrap_err();
    assert_eq!(err.errno(), 22, "{err}");
}

#[test]
fn a_6_1_responder_drops_a_flush_from_a_newer_peer() {
    // a (6.12) flushes b (6.1): b does not know the opcode and drops it,
    // counted as malformed; a retries and, with retry_cnt 1, gives up
    // with RETRY_EXC_ERR. The same pair with b as 6.12 completes.
    for (rb, want) in [
        (RxeRelease::V6_1, WcStatus::RetryExcErr),
        (RxeRelease::V6_12, WcStatus::Success),
    ] {
        let mut n = net(RxeRelease::V6_12, rb);
        let a = n.create_endpoint(0, QpType::Rc, None, None, 16).unwrap();
        let b = n.create_endpoint(1, QpType::Rc, None, None, 16).unwrap();
        let o = ConnectOpts {
            access: RW | AccessFlags::FLUSH_GLOBAL,
            retry_cnt: 1,
            ..ConnectOpts::default()
        };
        n.connect(&a, &b, &o).unwrap();
        let eb = n.node(1);
        let addr = eb.mem_mut().alloc(64);
        let acc = if rb == RxeRelease::V6_1 {
            RW
        } else {
            RW | AccessFlags::FLUSH_GLOBAL
        };
        let mr = eb.reg_mr(b.pd, addr, 64, acc).unwrap().clone();
        let now = n.now();
        n.node(0)
            .post_send(now, a.qpn, flush_wr(addr, mr.rkey))
            .unwrap();
        let limit = n.now() + Duration::from_secs(60);
        n.run_until(limit, |_| false);
        let wc = n.node(0).poll_cq(a.send_cq, 8).unwrap();
        assert_eq!(wc.len(), 1, "{rb:?}: {wc:?}");
        assert_eq!(wc[0].status, want, "{rb:?}");
        let dropped = n.node(1).counters().rcvd_malformed;
        assert_eq!(dropped > 0, rb == RxeRelease::V6_1, "{rb:?}: {dropped}");
    }
}

#[test]
fn query_qp_cur_qp_state_per_release() {
    for (r, want) in [
        (RxeRelease::V6_1, rxe_core::QpState::Reset),
        (RxeRelease::V6_12, rxe_core::QpState::Rts),
        (RxeRelease::V7_2, rxe_core::QpState::Rts),
    ] {
        let mut n = net(r, r);
        let (a, _b) = pair(&mut n, RW);
        let (attr, _) = n.node(0).query_qp(a.qpn).unwrap();
        assert_eq!(attr.qp_state, Some(rxe_core::QpState::Rts), "{r:?}");
        assert_eq!(attr.cur_qp_state, Some(want), "{r:?}");
    }
}
