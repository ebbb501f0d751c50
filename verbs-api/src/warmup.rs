//! Run the engine's data path once, before a process's first message.
//!
//! A QEMU TCG guest translates machine code the first time a process runs
//! it, and again in every process (its translation cache is keyed by
//! virtual address, and ASLR loads the library elsewhere in each). Kernel
//! rxe's code is translated once for all processes; ours was translated at
//! each process's first post and poll: in the project's TCG guest the first
//! iteration of `ib_write_lat` took 4-6 ms and the next two up to 3 ms
//! (kernel rxe: 0.4-0.6 ms), and those were two or three of the five
//! iterations that make its 99.9th percentile of 5000. On a machine that
//! runs code natively it saves the first message its cold caches and page
//! faults of code, a few tens of microseconds.
//!
//! So when a process first connects a QP, [`once`] runs a WRITE, a SEND
//! and a READ between two QPs of a scratch engine of its own, with the
//! device's release and ICRC settings, passing the packets from one QP to
//! the other in memory (through a scratch inbox when the
//! device has the same-host path): the same code (the same monomorphization,
//! `Engine<HostMemory>`) as the device's engine will run, on memory of its
//! own. Nothing of it is seen outside: no packet leaves, the device's
//! engine, counters, tracer and capture are not involved, and the QP
//! numbers and keys of the device are not used.

use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};

use rxe_core::{
    AccessFlags, AhAttr, Engine, EngineConfig, Instant, Mtu, QpAttr, QpAttrMask, QpCap, QpInitAttr,
    QpState, QpType, RecvWr, RxDatagram, SendOp, SendWr, Sge,
};

use crate::device::RX_BUF;
use crate::hostmem::HostMemory;

static DONE: AtomicBool = AtomicBool::new(false);

/// Run the data path once in this process (the first call only; later
/// calls return at once). `RXE_EMU_WARMUP=off` (or `0`, `no`) skips it.
pub(crate) fn once(addr: IpAddr, release: rxe_core::model::RxeRelease, defer_icrc: bool) {
    if DONE.swap(true, Ordering::AcqRel) {
        return;
    }
    if matches!(
        std::env::var("RXE_EMU_WARMUP").as_deref(),
        Ok("off" | "0" | "no")
    ) {
        return;
    }
    // A failure here only means that the first message is slower.
    let _ = run(addr, release, defer_icrc);
}

/// One WRITE, SEND and READ between two QPs of a scratch engine. Returns
/// how many completions were successful (4 when all went through: the
/// three requests and the SEND's receive) and whether each moved its
/// bytes.
fn run(
    addr: IpAddr,
    release: rxe_core::model::RxeRelease,
    defer_icrc: bool,
) -> rxe_core::Result<(usize, bool)> {
    let mut cfg = EngineConfig::new(addr);
    cfg.gids = crate::device::gid_table(addr);
    cfg.set_release(release);
    let mut e = Engine::new(cfg, HostMemory::default());
    e.defer_icrc(defer_icrc);
    // Source and target buffers, in this function's frame: the engine
    // writes only into the MR over them, and is dropped before they are.
    let mut mem = [0u8; 256];
    for (i, b) in mem[..24].iter_mut().enumerate() {
        *b = i as u8 + 1;
    }
    mem[192..200].copy_from_slice(&[0xa5; 8]);
    let base = mem.as_mut_ptr() as u64;
    let pd = e.alloc_pd()?;
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ;
    let mr = e.reg_mr(pd, base, mem.len() as u64, access)?;
    let cq = e.create_cq(16)?;
    let qp = |e: &mut Engine<HostMemory>| {
        e.create_qp(QpInitAttr {
            pd,
            qp_type: QpType::Rc,
            send_cq: cq,
            recv_cq: cq,
            srq: None,
            cap: QpCap {
                max_send_wr: 4,
                max_recv_wr: 4,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 64,
            },
            sq_sig_all: false,
        })
    };
    let (a, b) = (qp(&mut e)?, qp(&mut e)?);
    let now = Instant::from_nanos(1);
    let gid = rxe_core::ip_to_gid(addr);
    for (me, peer) in [(a, b), (b, a)] {
        let init = QpAttr {
            qp_state: Some(QpState::Init),
            port_num: 1,
            qp_access_flags: access.bits(),
            ..QpAttr::default()
        };
        e.modify_qp(
            now,
            me,
            &init,
            QpAttrMask::STATE
                | QpAttrMask::PKEY_INDEX
                | QpAttrMask::PORT
                | QpAttrMask::ACCESS_FLAGS,
        )?;
        let rtr = QpAttr {
            qp_state: Some(QpState::Rtr),
            path_mtu: Some(Mtu::M1024),
            dest_qp_num: peer,
            max_dest_rd_atomic: 1,
            ah_attr: AhAttr {
                dgid: gid,
                is_global: true,
                hop_limit: 64,
                port_num: 1,
                ..AhAttr::default()
            },
            ..QpAttr::default()
        };
        e.modify_qp(
            now,
            me,
            &rtr,
            QpAttrMask::STATE
                | QpAttrMask::AV
                | QpAttrMask::PATH_MTU
                | QpAttrMask::DEST_QPN
                | QpAttrMask::RQ_PSN
                | QpAttrMask::MAX_DEST_RD_ATOMIC
                | QpAttrMask::MIN_RNR_TIMER,
        )?;
        let rts = QpAttr {
            qp_state: Some(QpState::Rts),
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            max_rd_atomic: 1,
            ..QpAttr::default()
        };
        e.modify_qp(
            now,
            me,
            &rts,
            QpAttrMask::STATE
                | QpAttrMask::SQ_PSN
                | QpAttrMask::TIMEOUT
                | QpAttrMask::RETRY_CNT
                | QpAttrMask::RNR_RETRY
                | QpAttrMask::MAX_QP_RD_ATOMIC,
        )?;
    }
    let sge = |off: u64| Sge {
        addr: base + off,
        length: 8,
        lkey: mr.lkey,
    };
    e.post_recv(
        b,
        RecvWr {
            wr_id: 1,
            sg_list: vec![sge(64)],
        },
    )?;
    let remote = |off: u64| (base + off, mr.rkey);
    let (wa, wk) = remote(128);
    e.post_send(
        now,
        a,
        SendWr::new(
            2,
            SendOp::RdmaWrite {
                remote_addr: wa,
                rkey: wk,
            },
            vec![sge(0)],
        ),
    )?;
    e.post_send(now, a, SendWr::new(3, SendOp::Send, vec![sge(8)]))?;
    let (ra, rk) = remote(192);
    e.post_send(
        now,
        a,
        SendWr::new(
            4,
            SendOp::RdmaRead {
                remote_addr: ra,
                rkey: rk,
            },
            vec![sge(16)],
        ),
    )?;
    let mut done = 0;
    // With the same-host path, packets go through an inbox of their own
    // (ring 1 of two, the smallest), as between processes.
    let inbox = if defer_icrc { scratch_inbox() } else { None };
    // As the device's: room for a datagram at the alignment it had in the
    // ring (`Inbox::pop_aligned`).
    let mut buf = vec![0u8; if inbox.is_some() { RX_BUF } else { 0 }];
    // Each round hands every packet sent to the engine as received; a
    // handful of rounds carries requests, responses and ACKs.
    for _ in 0..8 {
        let mut any = false;
        while let Some(t) = e.poll_transmit() {
            any = true;
            let (payload, icrc) = match &inbox {
                Some((_, i)) => {
                    let how = if t.icrc {
                        local_link::Icrc::Right
                    } else {
                        local_link::Icrc::Unwritten
                    };
                    if i.push_with(1, t.info.src_port, 0, &t.payload, how).is_err() {
                        return Ok((done, false));
                    }
                    match i.pop_aligned(&mut buf) {
                        Some(p) => (&buf[p.at..p.at + p.len], p.icrc),
                        None => return Ok((done, false)),
                    }
                }
                None => (&t.payload[..], local_link::Icrc::Unchecked),
            };
            let dg = RxDatagram {
                src: t.info.src,
                dst: t.info.dst,
                src_port: t.info.src_port,
                dst_port: t.info.dst_port,
                ipv4_id: None,
                payload,
                ecn: t.ecn,
            };
            if icrc == local_link::Icrc::Unchecked {
                e.handle_datagram(now, &dg);
            } else {
                e.handle_intact_datagram(now, &dg);
            }
            e.recycle(t.payload);
        }
        done += e
            .poll_cq(cq, 16)?
            .iter()
            .filter(|wc| wc.status == rxe_core::WcStatus::Success)
            .count();
        if !any {
            break;
        }
    }
    drop(e);
    if let Some((_, i)) = &inbox {
        let _ = wrap(i, &mut buf);
    }
    // The buffers outlive the engine that wrote into them.
    let mem = std::hint::black_box(&mut mem);
    let moved = mem[128..136] == mem[0..8] && mem[64..72] == mem[8..16] && mem[16..24] == [0xa5; 8];
    Ok((done, moved))
}

/// Take the scratch inbox's ring 1 through a lap: a producer that finds
/// its ring empty 64 KiB into a lap starts the next (`EARLY_WRAP`), and
/// reads the consumer's index more often past that point. A conversation
/// of small messages gets there after 1,000-2,000 messages, where that
/// code ran for the first time in each process: in the TCG guest one of
/// the slowest iterations of every `ib_send_lat` (iteration 1025, 0.3-0.5
/// ms) and `ib_read_lat` (1640) run, one of the five that set their 99.9th
/// percentiles.
/// Returns how many of the 72 datagrams of 1 KiB (72 KiB: past 64 KiB,
/// and back at the start) went through.
fn wrap(i: &local_link::Inbox, buf: &mut [u8]) -> usize {
    let filler = [0u8; 1024];
    (0..72)
        .take_while(|_| {
            i.push_with(1, 0, 0, &filler, local_link::Icrc::Unwritten)
                .is_ok()
                && i.pop_aligned(buf).is_some_and(|p| p.len == filler.len())
        })
        .count()
}

/// An inbox of two small rings (ring 0 is the daemon's), for this
/// process alone (the file with it: dropping it closes the inbox).
fn scratch_inbox() -> Option<(local_link::InboxFile, local_link::Inbox)> {
    let f = local_link::InboxFile::create("rxe-emu warm-up", 2, 128 << 10).ok()?;
    let memfd = f.memfd().try_clone_to_owned().ok()?;
    let eventfd = f.eventfd().try_clone_to_owned().ok()?;
    let i = local_link::Inbox::open(memfd, eventfd).ok()?;
    Some((f, i))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The scratch exchange goes through: each posted WR completes, and the
    /// WRITE and READ moved bytes (a warm-up that failed early would have
    /// left the later code cold).
    #[test]
    fn scratch_exchange_completes_every_request() {
        for defer in [false, true] {
            let (n, moved) = run(
                "127.0.0.1".parse().unwrap(),
                rxe_core::model::RxeRelease::default(),
                defer,
            )
            .unwrap();
            // WRITE, SEND, READ at the requester; the SEND's receive.
            assert_eq!(n, 4, "defer_icrc {defer}");
            assert!(moved, "defer_icrc {defer}");
        }
    }

    /// The scratch ring's lap goes through whole, and the producer went
    /// back to the ring's start 64 KiB into it (early), not at its end
    /// (128 KiB): the code of that wrap has run.
    #[test]
    fn the_scratch_ring_is_taken_through_a_lap() {
        let (_f, i) = scratch_inbox().unwrap();
        let mut buf = vec![0u8; RX_BUF];
        assert_eq!(i.write_offset(1), Some(0));
        assert_eq!(wrap(&i, &mut buf), 72);
        let at = i.write_offset(1).unwrap();
        assert!(at < 16 << 10, "the next record goes at {at}: no early wrap");
    }
}
