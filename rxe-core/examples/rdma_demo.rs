//! Two RDMA nodes over a simulated link that loses, duplicates, reorders and
//! corrupts packets. An RC SEND, an RDMA WRITE, an RDMA READ and a
//! FETCH_ADD run; the engines recover by retransmission; the summary says
//! what happened, and `rdma_demo.pcap` holds every packet for tshark or
//! Wireshark.
//!
//! Run: `cargo run --release --example rdma_demo [-- --seed N --loss 0.05 --pcap FILE]`

use std::cell::RefCell;
use std::fs::File;
use std::io::BufWriter;
use std::rc::Rc;
use std::time::Duration;

use rxe_core::mem::Memory;
use rxe_core::sim::{node_config, ConnectOpts, LinkConfig, Network};
use rxe_core::{AccessFlags, QpType, RecvWr, SendOp, SendWr, Sge, WcStatus};

fn arg<T: std::str::FromStr>(name: &str, default: T) -> T {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let seed: u64 = arg("--seed", 7);
    let loss: f64 = arg("--loss", 0.05);
    let pcap_path: String = arg("--pcap", "rdma_demo.pcap".to_string());
    let link = LinkConfig {
        loss,
        duplicate: 0.02,
        reorder: 0.05,
        corrupt: 0.01,
        ..LinkConfig::perfect()
    };
    let mut net = Network::new(seed, link);
    let a = net.add_node(node_config("192.0.2.1".parse()?, seed));
    let b = net.add_node(node_config("192.0.2.2".parse()?, seed + 1));

    let pcap = Rc::new(RefCell::new(wire::pcap::PcapWriter::new(BufWriter::new(
        File::create(&pcap_path)?,
    ))?));
    let tap = pcap.clone();
    net.set_tap(move |now, t| {
        let _ = tap
            .borrow_mut()
            .write_roce(now.as_nanos(), &t.info, &t.payload);
    });

    let qa = net.create_endpoint(a, QpType::Rc, None, None, 64)?;
    let qb = net.create_endpoint(b, QpType::Rc, None, None, 64)?;
    net.connect(&qa, &qb, &ConnectOpts::default())?;
    println!(
        "node A 192.0.2.1 QP {:#x} <-> node B 192.0.2.2 QP {:#x} (RC, path MTU 1024)",
        qa.qpn, qb.qpn
    );
    println!(
        "link: {:.0}% loss, 2% duplication, 5% reordering, 1% bit corruption (seed {seed})\n",
        loss * 100.0
    );

    const LEN: usize = 256 * 1024;
    let all = AccessFlags::LOCAL_WRITE
        | AccessFlags::REMOTE_WRITE
        | AccessFlags::REMOTE_READ
        | AccessFlags::REMOTE_ATOMIC;
    let src = net.node(a).mem_mut().alloc(LEN);
    let data: Vec<u8> = (0..LEN).map(|i| (i * 7 + i / 251) as u8).collect();
    net.node(a).mem_mut().write(src, &data)?;
    let mr_a = net.node(a).reg_mr(qa.pd, src, LEN as u64, all)?;
    let back = net.node(a).mem_mut().alloc(LEN);
    let mr_back = net.node(a).reg_mr(qa.pd, back, LEN as u64, all)?;
    let dst = net.node(b).mem_mut().alloc(LEN);
    let mr_b = net.node(b).reg_mr(qb.pd, dst, LEN as u64, all)?;
    let rbuf = net.node(b).mem_mut().alloc(4096);
    let mr_rb = net.node(b).reg_mr(qb.pd, rbuf, 4096, all)?;
    net.node(b).post_recv(
        qb.qpn,
        RecvWr {
            wr_id: 1,
            sg_list: vec![Sge {
                addr: rbuf,
                length: 4096,
                lkey: mr_rb.lkey,
            }],
        },
    )?;

    let now = net.now();
    let e = net.node(a);
    e.post_send(
        now,
        qa.qpn,
        SendWr::new(
            1,
            SendOp::SendWithImm { imm: 0x1234 },
            vec![Sge {
                addr: src,
                length: 3000,
                lkey: mr_a.lkey,
            }],
        ),
    )?;
    e.post_send(
        now,
        qa.qpn,
        SendWr::new(
            2,
            SendOp::RdmaWrite {
                remote_addr: dst,
                rkey: mr_b.rkey,
            },
            vec![Sge {
                addr: src,
                length: LEN as u32,
                lkey: mr_a.lkey,
            }],
        ),
    )?;
    e.post_send(
        now,
        qa.qpn,
        SendWr::new(
            3,
            SendOp::RdmaRead {
                remote_addr: dst,
                rkey: mr_b.rkey,
            },
            vec![Sge {
                addr: back,
                length: LEN as u32,
                lkey: mr_back.lkey,
            }],
        ),
    )?;
    e.post_send(
        now,
        qa.qpn,
        SendWr::new(
            4,
            SendOp::AtomicFetchAdd {
                remote_addr: dst,
                rkey: mr_b.rkey,
                add: 1,
            },
            vec![Sge {
                addr: back,
                length: 8,
                lkey: mr_back.lkey,
            }],
        ),
    )?;

    let limit = net.now() + Duration::from_secs(60);
    let mut wcs = Vec::new();
    net.run_until(limit, |n| {
        wcs.extend(n.node(a).poll_cq(qa.send_cq, 16).unwrap_or_default());
        wcs.len() == 4
    });
    let recv = net.node(b).poll_cq(qb.recv_cq, 16)?;
    pcap.borrow_mut().flush()?;

    println!("completions at A (requester):");
    for w in &wcs {
        println!(
            "  wr_id {} {:?}: {}, {} bytes",
            w.wr_id, w.opcode, w.status, w.byte_len
        );
    }
    for w in &recv {
        println!(
            "completion at B (responder): {:?} {}, {} bytes, immediate {:#x}",
            w.opcode, w.status, w.byte_len, w.imm_data
        );
    }
    let mut got = vec![0u8; LEN];
    net.node(a).mem_mut().read(back + 8, &mut got[8..])?;
    let ok = got[8..] == data[8..] && wcs.iter().all(|w| w.status == WcStatus::Success);
    let st = net.stats().clone();
    let (ca, cb) = (
        net.nodes()[a].counters().clone(),
        net.nodes()[b].counters().clone(),
    );
    println!("\nwhat the link did: {} datagrams sent, {} lost, {} duplicated, {} reordered, {} corrupted", st.sent, st.lost, st.duplicated, st.reordered, st.corrupted);
    println!("how the engines recovered:");
    println!(
        "  {} corrupted datagrams were dropped because their ICRC did not match",
        ca.rcvd_icrc_err + cb.rcvd_icrc_err
    );
    println!(
        "  B saw {} requests out of sequence (a gap: it sent one PSN-sequence NAK per gap)",
        cb.out_of_seq_request
    );
    println!(
        "  B saw {} duplicate requests (re-ACKed, or READs re-executed)",
        cb.duplicate_request
    );
    println!(
        "  A received {} sequence NAKs and its retransmission timer fired {} times",
        ca.rcvd_seq_err, ca.retrans_timeouts
    );
    println!(
        "  A went back to the oldest unacknowledged PSN {} times (go-back-N)",
        ca.completer_retry_err
    );
    println!(
        "  simulated time: {:?}",
        net.now() - rxe_core::Instant::ZERO
    );
    println!(
        "\ndata read back equals data written: {}",
        if ok { "yes" } else { "NO" }
    );
    println!("every packet is in {pcap_path}: try `tshark -r {pcap_path}`");
    if !ok {
        std::process::exit(1);
    }
    Ok(())
}
