//! The `rxe-interop-peer` scenarios: one C program (`peer/rxe-interop-peer.c`)
//! on both sides, over kernel rxe in the guest and over rxe-emu's drop-in
//! `libibverbs.so.1` on the host. The server is the responder, the client
//! the requester; each side checks every byte it can see and prints
//! `PEER-OK op=.. role=.. msgs=N bytes=B verified=V`. Everything here is
//! pure, so the rules are unit-tested.

use std::collections::BTreeMap;

/// RC and UC messages: around the 1024 and 4096 path MTUs, and up to 1 MiB.
pub const SIZES: &[usize] = &[
    1, 2, 63, 1023, 1024, 1025, 4095, 4096, 4097, 65536, 1_048_576,
];
/// Atomics per message (each 8 bytes, at its own aligned address).
pub const ATOMICS_PER_MSG: u64 = 16;
/// RNR scenario: the responder posts its receive this late (ms) ...
pub const RNR_DELAY_MS: u64 = 300;
/// ... and NAKs with this RNR timer code (20: 10.24 ms, IBTA table 45).
pub const MIN_RNR_TIMER: u32 = 20;
/// `min_rnr_timer` code 20 in microseconds.
pub const RNR_TIMER_US: u64 = 10_240;
/// Vanished peer: local ACK timeout code (4.096 us * 2^14 = 67.1 ms) ...
pub const VANISH_TIMEOUT: u32 = 14;
/// ... and retries (kernel rxe treats 7 as "for ever").
pub const VANISH_RETRY_CNT: u32 = 3;
/// How long our side keeps its device open after PEER-OK, so that the
/// harness can read its counters (they live in the process).
pub const LINGER_MS: u64 = 1500;

/// One peer scenario's operation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerSpec {
    /// `-o` of rxe-interop-peer.
    pub op: &'static str,
    /// `-S`: message sizes (ignored by the atomics, which use one message
    /// of `ATOMICS_PER_MSG` atomics per entry).
    pub sizes: Vec<usize>,
}

impl PeerSpec {
    /// Whether the op is CAS or FAA.
    pub fn atomic(&self) -> bool {
        matches!(self.op, "cas" | "faa")
    }

    /// Whether the op came with kernel rxe 6.2 (FLUSH, ATOMIC WRITE): it
    /// does not run against Linux 6.1, whose rxe lacks it.
    pub fn needs_6_2(&self) -> bool {
        matches!(self.op, "flush" | "atomic-write")
    }

    /// Messages as the peer counts them.
    pub fn msgs(&self) -> usize {
        match self.op {
            "rnr" | "bad-rkey" | "vanish" => 1,
            _ => self.sizes.len(),
        }
    }

    /// Bytes both sides report (`bytes=`).
    pub fn bytes(&self) -> u64 {
        match self.op {
            "vanish" => 0,
            "rnr" | "bad-rkey" => self.sizes[0] as u64,
            _ if self.atomic() || self.op == "atomic-write" => {
                8 * ATOMICS_PER_MSG * self.sizes.len() as u64
            }
            _ => self.sizes.iter().map(|&s| s as u64).sum(),
        }
    }

    /// The arguments after the program name; `connect_to` makes it the
    /// client (requester).
    pub fn args(&self, port: u16, path_mtu: u32, connect_to: Option<&str>) -> Vec<String> {
        let sizes: Vec<String> = self.sizes.iter().map(|s| s.to_string()).collect();
        let mut a: Vec<String> = [
            "-o",
            self.op,
            "-d",
            "rxe0",
            "-g",
            "1",
            "-p",
            &port.to_string(),
            "-m",
            &path_mtu.to_string(),
            "-S",
            &sizes.join(","),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        match self.op {
            "rnr" => a.extend([
                "--rnr-delay".into(),
                RNR_DELAY_MS.to_string(),
                "--min-rnr-timer".into(),
                MIN_RNR_TIMER.to_string(),
                "--rnr-retry".into(),
                "7".into(),
            ]),
            "vanish" => a.extend([
                "--timeout".into(),
                VANISH_TIMEOUT.to_string(),
                "--retry-cnt".into(),
                VANISH_RETRY_CNT.to_string(),
            ]),
            _ => {}
        }
        if let Some(host) = connect_to {
            a.push(host.into());
        }
        a
    }

    /// Opcodes (as `rxe-emu pcap check` names them) the capture must hold,
    /// each at least once.
    pub fn wire_opcodes(&self) -> &'static [&'static str] {
        match self.op {
            "send" | "srq-send" => &["RC_SEND_ONLY", "RC_SEND_FIRST", "RC_SEND_LAST"],
            "send-imm" => &["RC_SEND_ONLY_WITH_IMMEDIATE", "RC_SEND_LAST_WITH_IMMEDIATE"],
            "write" => &["RC_RDMA_WRITE_ONLY", "RC_RDMA_WRITE_LAST"],
            "write-imm" => &[
                "RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE",
                "RC_RDMA_WRITE_LAST_WITH_IMMEDIATE",
            ],
            "read" => &[
                "RC_RDMA_READ_REQUEST",
                "RC_RDMA_READ_RESPONSE_ONLY",
                "RC_RDMA_READ_RESPONSE_LAST",
            ],
            "cas" => &["RC_COMPARE_SWAP", "RC_ATOMIC_ACKNOWLEDGE"],
            "faa" => &["RC_FETCH_ADD", "RC_ATOMIC_ACKNOWLEDGE"],
            "uc-send" => &["UC_SEND_ONLY", "UC_SEND_LAST"],
            "uc-write" => &["UC_RDMA_WRITE_ONLY", "UC_RDMA_WRITE_LAST"],
            "ud-send" => &["UD_SEND_ONLY"],
            "rnr" => &["RC_SEND_FIRST", "RC_ACKNOWLEDGE"],
            "bad-rkey" => &["RC_RDMA_WRITE_FIRST", "RC_ACKNOWLEDGE"],
            "vanish" => &["RC_SEND_ONLY"],
            // The WRITE, then the FLUSH and its empty READ RESPONSE ONLY.
            "flush" => &[
                "RC_RDMA_WRITE_ONLY",
                "RC_FLUSH",
                "RC_RDMA_READ_RESPONSE_ONLY",
            ],
            "atomic-write" => &["RC_ATOMIC_WRITE", "RC_RDMA_READ_RESPONSE_ONLY"],
            _ => &[],
        }
    }

    /// Why the capture's opcode counts do not fit; empty when they do.
    pub fn check_wire(&self, opcodes: &BTreeMap<String, u64>) -> Vec<String> {
        let mut why: Vec<String> = self
            .wire_opcodes()
            .iter()
            .filter(|o| opcodes.get(**o).copied().unwrap_or(0) == 0)
            .map(|o| format!("no {o} in the capture"))
            .collect();
        if self.op == "vanish" {
            // One SEND and `retry_cnt` retransmissions, then RETRY_EXC_ERR.
            let n = opcodes.get("RC_SEND_ONLY").copied().unwrap_or(0);
            let want = u64::from(VANISH_RETRY_CNT) + 1;
            if n != want {
                why.push(format!(
                    "{n} RC_SEND_ONLY on the wire, want {want} (1 + retry_cnt {VANISH_RETRY_CNT})"
                ));
            }
        }
        why
    }

    /// Why one side's output does not show success; empty when it does.
    /// `responder`: this side was the server.
    pub fn check_side(
        &self,
        side: &str,
        rc: Option<i32>,
        out: &str,
        responder: bool,
    ) -> Vec<String> {
        let mut why = Vec::new();
        match rc {
            Some(0) => {}
            Some(rc) => why.push(format!("{side} exited with {rc}")),
            None => why.push(format!("{side} did not finish (killed)")),
        }
        for l in out.lines().filter(|l| l.starts_with("FAIL")) {
            why.push(format!("{side}: {l}"));
        }
        if rc != Some(0) {
            return why;
        }
        let role = if responder { "responder" } else { "requester" };
        let vanish_resp = self.op == "vanish" && responder;
        let (msgs, bytes) = if vanish_resp {
            (0, 0)
        } else {
            (self.msgs(), self.bytes())
        };
        let head = format!(
            "PEER-OK op={} role={role} msgs={msgs} bytes={bytes} ",
            self.op
        );
        let Some(line) = out.lines().find(|l| l.starts_with(&head)) else {
            why.push(format!("{side} did not print \"{}\"", head.trim_end()));
            return why;
        };
        let verified: u64 = line
            .split_whitespace()
            .find_map(|w| w.strip_prefix("verified="))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        // Which side sees the data: the responder (SEND, WRITE, atomics'
        // final memory, READ source, memory behind a bad rkey), the
        // requester (READ data, atomics' original values).
        let sees = match self.op {
            "vanish" => false,
            "read" | "cas" | "faa" => true,
            _ => responder,
        };
        if sees && verified < bytes {
            why.push(format!(
                "{side} verified {verified} bytes, fewer than the {bytes} moved"
            ));
        }
        let want: &[&str] = match (self.op, responder) {
            ("rnr", false) => &["RNR requester: success after"],
            ("rnr", true) => &["RNR responder posted its receive"],
            ("bad-rkey", false) => &["ACCESS requester: WRITE with rkey", "remote access error"],
            ("vanish", false) => &["VANISH requester: transport retry counter exceeded after"],
            _ => &[],
        };
        for w in want {
            if !out.contains(w) {
                why.push(format!("{side} did not print \"{w}\""));
            }
        }
        why
    }

    /// Counters of the kernel this scenario must move, `(name, min, max)`,
    /// given which side the kernel is. Their names are then exempt from the
    /// generic clean-link rules.
    pub fn kernel_counters(&self, kernel_responder: bool) -> Vec<(&'static str, u64, u64)> {
        // RNR NAKs: one per try while the receive is missing: at most
        // delay / timer + 3, at least delay / (8 * timer) (a slow guest
        // stretches each round trip).
        let rnr_max = RNR_DELAY_MS * 1000 / RNR_TIMER_US + 3;
        let rnr_min = (RNR_DELAY_MS * 1000 / (8 * RNR_TIMER_US)).max(1);
        match (self.op, kernel_responder) {
            ("rnr", true) => vec![("send_rnr_err", rnr_min, rnr_max)],
            ("rnr", false) => vec![("rcvd_rnr_err", rnr_min, rnr_max)],
            ("vanish", false) => vec![
                ("retry_exceeded_err", 1, 1),
                (
                    "completer_retry_err",
                    u64::from(VANISH_RETRY_CNT),
                    u64::from(VANISH_RETRY_CNT),
                ),
            ],
            _ => vec![],
        }
    }

    /// Counters that this scenario may move on the kernel without being
    /// required to (side effects of the error it provokes).
    pub fn kernel_allowed(&self) -> &'static [&'static str] {
        match self.op {
            // after an RNR NAK the rest of a multi-packet message is out of
            // sequence at the responder, and the requester's ACK timer may
            // also run out while it waits
            "rnr" => &[
                "out_of_seq_request",
                "rcvd_seq_err",
                "completer_retry_err",
                "duplicate_request",
                "send_rnr_err",
                "rcvd_rnr_err",
            ],
            "bad-rkey" => &["send_err"],
            _ => &[],
        }
    }
}

/// Counters that must agree, for the same workload in the same role,
/// between kernel rxe and rxe-emu.
pub const COMPARED: &[&str] = &[
    "sent_pkts",
    "rcvd_pkts",
    "rdma_sends",
    "rdma_recvs",
    "retry_exceeded_err",
];
/// Counters of recovery (retransmission, RNR): their presence makes
/// packet counts depend on timing, so the comparison is then a note.
const RECOVERY: &[&str] = &[
    "completer_retry_err",
    "duplicate_request",
    "rcvd_seq_err",
    "out_of_seq_request",
    "retrans_timeouts",
    "rcvd_rnr_err",
    "send_rnr_err",
];

/// Packet counts of a run that ends in a NAK: a requester sends the
/// packets of a multi-packet WRITE until the NAK of its first one arrives,
/// so how many left first depends on timing (the kernel requester sent 1
/// of 4 in one TCG run, ours 4). Such runs compare only the other counters.
const PACKETS: &[&str] = &["sent_pkts", "rcvd_pkts"];

/// Whether `name`'s packet counts depend on when a NAK arrives.
pub fn packets_timing_dependent(name: &str) -> bool {
    name.starts_with("p-bad-rkey")
}

/// Compare `COMPARED` between kernel rxe and rxe-emu in each role:
/// `None` when any of the four sets shows recovery (not comparable),
/// else the counters that differ (`role name kernel|emu`). With
/// `skip_packets`, packet counts are not compared (see [`PACKETS`]).
pub fn compare_roles(
    kernel_req: &BTreeMap<String, u64>,
    emu_req: &BTreeMap<String, u64>,
    kernel_resp: &BTreeMap<String, u64>,
    emu_resp: &BTreeMap<String, u64>,
    skip_packets: bool,
) -> Option<Vec<String>> {
    let sets = [kernel_req, emu_req, kernel_resp, emu_resp];
    let get = |m: &BTreeMap<String, u64>, k: &str| m.get(k).copied().unwrap_or(0);
    if sets.iter().any(|m| RECOVERY.iter().any(|k| get(m, k) > 0)) {
        return None;
    }
    let mut diff = Vec::new();
    for (role, k, e) in [
        ("requester", kernel_req, emu_req),
        ("responder", kernel_resp, emu_resp),
    ] {
        for c in COMPARED {
            if skip_packets && PACKETS.contains(c) {
                continue;
            }
            let (a, b) = (get(k, c), get(e, c));
            if a != b {
                diff.push(format!("{role} {c} {a}|{b}"));
            }
        }
    }
    Some(diff)
}

/// RNR back-off on the wire: for each RNR NAK in the capture, the time
/// until the requester sends the NAKed PSN again, with the timer the NAK
/// asked for, `(asked_ns, waited_ns)`. A NAK never followed by its retry
/// is an error (the capture ends with the message delivered), and so is a
/// second NAK before that retry, unless it answers another transmission
/// of the same PSN: a requester whose retransmission timer fired before a
/// slow responder answered sent the packet twice, and each copy gets its
/// NAK (the 6.12 guest once stalled 180 ms, 2026-11-29); the back-off is
/// then timed from the first.
pub fn rnr_backoffs(pcap: &[u8]) -> Result<Vec<(u64, u64)>, String> {
    use wire::aeth::Syndrome;
    let r = wire::pcap::PcapReader::new(pcap).map_err(|e| format!("capture: {e}"))?;
    let mut pending: Option<(u64, u64, wire::Psn)> = None;
    // Transmissions of a request PSN that no RNR NAK has answered yet.
    let mut unanswered: std::collections::HashMap<wire::Psn, u32> = Default::default();
    let mut out = Vec::new();
    for rec in r {
        let rec = rec.map_err(|e| format!("capture record: {e}"))?;
        let Ok(f) = wire::frame::parse(rec.data) else {
            continue;
        };
        let Ok(p) = wire::PacketRepr::parse(f.udp_payload) else {
            continue;
        };
        let is_req = p
            .bth
            .opcode
            .info()
            .is_some_and(|i| i.flags.contains(wire::OpFlags::REQ));
        let psn = p.bth.psn;
        let rnr = matches!(p.aeth.map(|a| a.syndrome), Some(Syndrome::RnrNak { .. }));
        // Whether this NAK answers a transmission not answered yet.
        let answers = rnr
            && unanswered.get_mut(&psn).is_some_and(|n| {
                let had = *n > 0;
                *n = n.saturating_sub(1);
                had
            });
        if is_req {
            *unanswered.entry(psn).or_default() += 1;
        }
        match (p.aeth.map(|a| a.syndrome), pending) {
            (Some(Syndrome::RnrNak { timer }), None) => {
                pending = Some((rec.ts_ns, wire::aeth::rnr_timer_ns(timer), psn));
            }
            (Some(Syndrome::RnrNak { .. }), Some((_, _, first))) if first == psn && answers => {}
            (Some(Syndrome::RnrNak { .. }), Some(_)) => {
                return Err("two RNR NAKs without a retry between them".into())
            }
            (_, Some((t0, asked, nak_psn))) if is_req && psn == nak_psn => {
                out.push((asked, rec.ts_ns.saturating_sub(t0)));
                pending = None;
            }
            _ => {}
        }
    }
    if pending.is_some() {
        return Err("the last RNR NAK was never followed by a retry".into());
    }
    Ok(out)
}

/// The RNR back-offs judged: `(failures, notes)`. Every NAK must ask for
/// the responder's `min_rnr_timer` ([`RNR_TIMER_US`]). A retry may not come
/// sooner than 90% of the timer (capture timestamps of two hosts on one
/// bridge; kernel rxe rounds up to jiffies) when the requester is ours
/// (`kernel_requester` false). Kernel rxe's requester is not judged on its
/// timing, only reported: after an RNR NAK for the first packet of a
/// multi-packet send, the responder (kernel rxe's as ours) also NAKs the
/// rest as out of sequence, and kernel rxe's completer then runs its retry
/// flow beside the RNR timer; in the 6.12 guest it once retried 6.5 ms
/// after a 10.24 ms NAK.
pub fn judge_rnr_backoffs(b: &[(u64, u64)], kernel_requester: bool) -> (Vec<String>, Vec<String>) {
    if b.is_empty() {
        return (vec!["no RNR NAK in the capture".into()], vec![]);
    }
    let mut failures: Vec<String> = b
        .iter()
        .filter(|(asked, _)| *asked != RNR_TIMER_US * 1000)
        .take(1)
        .map(|(asked, _)| {
            format!(
                "an RNR NAK asked for {:.2} ms; the responder's min_rnr_timer is {:.2} ms",
                *asked as f64 / 1e6,
                RNR_TIMER_US as f64 / 1e3
            )
        })
        .collect();
    let early: Vec<(usize, u64, u64)> = b
        .iter()
        .enumerate()
        .filter(|(_, (asked, waited))| *waited * 10 < *asked * 9)
        .map(|(i, &(asked, waited))| (i + 1, asked, waited))
        .collect();
    let mut notes = Vec::new();
    if kernel_requester {
        if let Some(&(_, asked, _)) = early.first() {
            let shortest = early.iter().map(|e| e.2).min().unwrap_or_default();
            notes.push(format!(
                "kernel rxe's requester retried {} of {} RNR NAKs sooner than the {:.2} ms asked (shortest {:.2} ms; its timing is not judged)",
                early.len(),
                b.len(),
                asked as f64 / 1e6,
                shortest as f64 / 1e6
            ));
        }
    } else {
        failures.extend(early.iter().map(|(i, asked, waited)| {
            format!(
                "RNR retry {i} came {:.2} ms after the NAK; the NAK asked for {:.2} ms",
                *waited as f64 / 1e6,
                *asked as f64 / 1e6
            )
        }));
    }
    (failures, notes)
}

/// The device totals of `rxe-emu stat DEV` (its `link DEV/1 k v k v ...`
/// line).
pub fn parse_emu_stat(text: &str) -> BTreeMap<String, u64> {
    let Some(line) = text.lines().find(|l| l.starts_with("link ")) else {
        return BTreeMap::new();
    };
    let w: Vec<&str> = line.split_whitespace().skip(2).collect();
    w.chunks(2)
        .filter_map(|c| Some((c.first()?.to_string(), c.get(1)?.parse().ok()?)))
        .collect()
}

/// The peer scenarios at one path MTU: every data operation.
pub fn data_ops(path_mtu: u32) -> Vec<(String, PeerSpec)> {
    let ud: Vec<usize> = if path_mtu >= 4096 {
        vec![1, 2048, 4096]
    } else {
        vec![1, 512, 1024]
    };
    [
        "send",
        "send-imm",
        "write",
        "write-imm",
        "read",
        "cas",
        "faa",
        "srq-send",
        "uc-send",
        "uc-write",
        "ud-send",
    ]
    .into_iter()
    .map(|op| {
        let sizes = match op {
            "cas" | "faa" => vec![8; 4],
            "ud-send" => ud.clone(),
            _ => SIZES.to_vec(),
        };
        (format!("p-{op}-m{path_mtu}"), PeerSpec { op, sizes })
    })
    .collect()
}

/// FLUSH (after a WRITE of the same range; every other one of the whole
/// MR) and ATOMIC WRITE, which kernel rxe has since 6.2 (path MTU 1024).
pub fn since_6_2() -> Vec<(String, PeerSpec)> {
    vec![
        (
            "p-flush".into(),
            PeerSpec {
                op: "flush",
                sizes: vec![1, 1024, 4097, 65536, 1_048_576],
            },
        ),
        (
            "p-atomic-write".into(),
            PeerSpec {
                op: "atomic-write",
                sizes: vec![8; 4],
            },
        ),
    ]
}

/// The protocol-behaviour scenarios (path MTU 1024).
pub fn error_modes() -> Vec<(String, PeerSpec)> {
    [("rnr", 4096), ("bad-rkey", 4096), ("vanish", 64)]
        .into_iter()
        .map(|(op, size)| {
            (
                format!("p-{op}"),
                PeerSpec {
                    op,
                    sizes: vec![size],
                },
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(op: &'static str) -> PeerSpec {
        let mut all = data_ops(1024);
        all.extend(error_modes());
        all.into_iter().find(|(_, s)| s.op == op).unwrap().1
    }

    #[test]
    fn args_and_bytes() {
        let s = spec("send");
        let a = s.args(18600, 1024, Some("10.77.0.1")).join(" ");
        assert!(a.starts_with("-o send -d rxe0 -g 1 -p 18600 -m 1024 -S 1,2,63,"));
        assert!(a.ends_with(",1048576 10.77.0.1"));
        assert_eq!(s.bytes(), SIZES.iter().map(|&s| s as u64).sum::<u64>());
        assert_eq!(spec("cas").bytes(), 8 * 16 * 4);
        assert_eq!(spec("vanish").bytes(), 0);
        assert!(spec("vanish")
            .args(1, 1024, None)
            .join(" ")
            .ends_with("--timeout 14 --retry-cnt 3"));
    }

    #[test]
    fn a_side_passes_only_with_its_verified_bytes() {
        let s = spec("write");
        let b = s.bytes();
        let ok = format!(
            "PEER-OK op=write role=responder msgs=11 bytes={b} verified={} secs=1\n",
            b + 10
        );
        assert!(s.check_side("k", Some(0), &ok, true).is_empty());
        // the responder must have compared at least every byte written
        let few = ok.replace(&format!("verified={}", b + 10), "verified=3");
        assert_eq!(s.check_side("k", Some(0), &few, true).len(), 1);
        // a FAIL line fails even with rc 0
        let f = format!("FAIL responder: byte 3\n{ok}");
        assert_eq!(s.check_side("k", Some(0), &f, true).len(), 1);
        // the requester of a WRITE sees no data
        let req = format!("PEER-OK op=write role=requester msgs=11 bytes={b} verified=0 secs=1\n");
        assert!(s.check_side("k", Some(0), &req, false).is_empty());
        // wrong role or count, exit code, killed
        assert!(!s.check_side("k", Some(0), &req, true).is_empty());
        assert!(!s.check_side("k", Some(1), &ok, true).is_empty());
        assert!(!s.check_side("k", None, &ok, true).is_empty());
        let r = spec("read");
        let rb = r.bytes();
        let req0 = format!("PEER-OK op=read role=requester msgs=11 bytes={rb} verified=0 secs=1\n");
        assert!(!r.check_side("k", Some(0), &req0, false).is_empty());
    }

    #[test]
    fn error_modes_need_their_outcome_lines() {
        let v = spec("vanish");
        let ok = "VANISH requester: transport retry counter exceeded after 270.1 ms; expected\n\
                  PEER-OK op=vanish role=requester msgs=1 bytes=0 verified=0 secs=0.3\n";
        assert!(v.check_side("e", Some(0), ok, false).is_empty());
        let no = ok.replace("transport retry counter exceeded", "success");
        assert!(!v.check_side("e", Some(0), &no, false).is_empty());
        let resp = "PEER-OK op=vanish role=responder msgs=0 bytes=0 verified=0\n";
        assert!(v.check_side("e", Some(0), resp, true).is_empty());
        let b = spec("bad-rkey");
        let acc = "ACCESS requester: WRITE with rkey 0x1: remote access error (vendor_err 0x0)\n\
                   PEER-OK op=bad-rkey role=requester msgs=1 bytes=4096 verified=0 secs=0\n";
        assert!(b.check_side("e", Some(0), acc, false).is_empty());
        let wrong = acc.replace("remote access error", "success");
        assert!(!b.check_side("e", Some(0), &wrong, false).is_empty());
    }

    #[test]
    fn wire_and_counters() {
        let v = spec("vanish");
        let mut ops = BTreeMap::new();
        ops.insert("RC_SEND_ONLY".to_string(), 4);
        assert!(v.check_wire(&ops).is_empty());
        ops.insert("RC_SEND_ONLY".to_string(), 9);
        assert_eq!(v.check_wire(&ops).len(), 1);
        assert_eq!(spec("read").check_wire(&ops).len(), 3);
        let r = spec("rnr").kernel_counters(true);
        assert_eq!(r, vec![("send_rnr_err", 3, 32)]);
        let st = "link rxe0/1 sent_pkts 131 rcvd_pkts 130 rcvd_rnr_err 21\n  daemon dropped_no_owner 4\n";
        let c = parse_emu_stat(st);
        assert_eq!(c["sent_pkts"], 131);
        assert_eq!(c["rcvd_rnr_err"], 21);
        assert!(parse_emu_stat("nothing").is_empty());
    }

    /// A capture: RNR NAK for PSN 5 at 0 ms, retry at `retry_ms`.
    fn rnr_capture(retry_ms: u64) -> Vec<u8> {
        rnr_capture_of(&[(0, false), (retry_ms, true)])
    }

    /// A capture of PSN 5's packets: at each time (ms), an RNR NAK from
    /// the responder, or (true) the requester's SEND.
    fn rnr_capture_of(events: &[(u64, bool)]) -> Vec<u8> {
        use wire::aeth::{AethRepr, Syndrome};
        let info = |src: &str, dst: &str| wire::icrc::IpUdpInfo {
            src: src.parse().unwrap(),
            dst: dst.parse().unwrap(),
            src_port: 50000,
            dst_port: 4791,
            ipv4_id: 0,
            ipv4_flags_frag: 0x4000,
        };
        let pkt = |op: wire::Opcode, aeth: Option<AethRepr>, payload: &'static [u8]| {
            let mut p = wire::PacketRepr {
                bth: wire::bth::BthRepr {
                    opcode: op,
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
                xrceth: None,
                reth: None,
                feth: None,
                atomic: None,
                aeth,
                atomic_ack: None,
                immdt: None,
                ieth: None,
                payload,
            };
            p.bth.pad_count = ((4 - payload.len() % 4) % 4) as u8;
            let mut b = vec![0; p.buffer_len()];
            p.emit(&mut b).unwrap();
            b
        };
        let nak = pkt(
            wire::Opcode::RC_ACKNOWLEDGE,
            Some(AethRepr {
                syndrome: Syndrome::RnrNak { timer: 20 },
                msn: 0,
            }),
            b"",
        );
        let send = pkt(wire::Opcode::RC_SEND_ONLY, None, b"abcd");
        let mut w = wire::pcap::PcapWriter::new(Vec::new()).unwrap();
        for &(ms, is_send) in events {
            let (src, dst, b) = if is_send {
                ("10.0.0.1", "10.0.0.2", &send)
            } else {
                ("10.0.0.2", "10.0.0.1", &nak)
            };
            w.write_roce(ms * 1_000_000, &info(src, dst), b).unwrap();
        }
        w.into_inner()
    }

    /// A requester that sent its packet again before the responder's RNR
    /// NAK came gets two NAKs in a row: not an error, timed from the
    /// first. Two NAKs for one transmission are.
    #[test]
    fn two_rnr_naks_answer_two_transmissions() {
        let twice = [
            (0, true),
            (67, true),
            (180, false),
            (181, false),
            (200, true),
        ];
        assert_eq!(
            rnr_backoffs(&rnr_capture_of(&twice)).unwrap(),
            vec![(10_240_000, 20_000_000)]
        );
        let once = [(0, true), (180, false), (181, false), (200, true)];
        assert!(rnr_backoffs(&rnr_capture_of(&once)).is_err());
        let none_left = [
            (0, true),
            (67, true),
            (180, false),
            (181, false),
            (182, false),
        ];
        assert!(rnr_backoffs(&rnr_capture_of(&none_left)).is_err());
    }

    #[test]
    fn rnr_backoff_is_read_from_the_capture_and_judged() {
        let ok = rnr_backoffs(&rnr_capture(12)).unwrap();
        assert_eq!(ok, vec![(10_240_000, 12_000_000)]);
        for kernel_requester in [false, true] {
            assert_eq!(judge_rnr_backoffs(&ok, kernel_requester), (vec![], vec![]));
            assert_eq!(judge_rnr_backoffs(&[], kernel_requester).0.len(), 1);
        }
        // An early retry fails ours and is a note for kernel rxe's.
        let early = rnr_backoffs(&rnr_capture(2)).unwrap();
        let (f, n) = judge_rnr_backoffs(&early, false);
        assert_eq!((f.len(), n.len()), (1, 0), "{f:?}");
        assert!(f[0].contains("RNR retry 1 came 2.00 ms"), "{f:?}");
        let (f, n) = judge_rnr_backoffs(&early, true);
        assert_eq!((f.len(), n.len()), (0, 1), "{n:?}");
        assert!(n[0].contains("retried 1 of 1"), "{n:?}");
        // A NAK asking for another timer than the QP's fails either way.
        for kernel_requester in [false, true] {
            let (f, _) = judge_rnr_backoffs(&[(20_480_000, 21_000_000)], kernel_requester);
            assert_eq!(f.len(), 1, "{f:?}");
        }
    }

    #[test]
    fn roles_compare_unless_something_recovered() {
        let m = |v: &[(&str, u64)]| -> BTreeMap<String, u64> {
            v.iter().map(|(k, n)| (k.to_string(), *n)).collect()
        };
        let kreq = m(&[("sent_pkts", 1108), ("rcvd_pkts", 26), ("rdma_sends", 11)]);
        let kresp = m(&[("sent_pkts", 26), ("rcvd_pkts", 1108), ("rdma_recvs", 11)]);
        let mut ereq = kreq.clone();
        ereq.insert("rcvd_bad_qp".into(), 0);
        assert_eq!(
            compare_roles(&kreq, &ereq, &kresp, &kresp, false),
            Some(vec![])
        );
        ereq.insert("rdma_sends".into(), 0);
        assert_eq!(
            compare_roles(&kreq, &ereq, &kresp, &kresp, false),
            Some(vec!["requester rdma_sends 11|0".to_string()])
        );
        // Packet counts that depend on when a NAK arrives are skipped.
        let mut short = kreq.clone();
        short.insert("sent_pkts".into(), 1);
        assert_eq!(
            compare_roles(&kreq, &short, &kresp, &kresp, false),
            Some(vec!["requester sent_pkts 1108|1".to_string()])
        );
        assert_eq!(
            compare_roles(&kreq, &short, &kresp, &kresp, true),
            Some(vec![])
        );
        assert!(packets_timing_dependent("p-bad-rkey"));
        assert!(!packets_timing_dependent("p-write-m1024"));
        ereq.insert("retrans_timeouts".into(), 1);
        assert_eq!(compare_roles(&kreq, &ereq, &kresp, &kresp, false), None);
    }
}
