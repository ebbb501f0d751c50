//! The scenarios, the commands each side runs, and how a run is judged.
//! Everything here is pure, so the rules themselves are unit-tested.

use std::collections::BTreeMap;
use std::fmt;

use crate::cm::CmTool;
use crate::peer::{self, PeerSpec};

/// The host side's address (the bridge in the namespace).
pub const HOST_IP: &str = "10.77.0.1";
/// Guest 1's address.
pub const GUEST_IP: &str = "10.77.0.11";
/// First TCP port of the pingpong address exchange; each run takes its own.
pub const BASE_PORT: u16 = 18515;
/// QPs of `ibv_srq_pingpong` (`-q`; its default is 16), all receiving from
/// one SRQ.
pub const SRQ_QPS: u32 = 4;

/// The QP type, i.e. which pingpong pair runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// `ibv_rc_pingpong` / `rxe-rc-pingpong`.
    Rc,
    /// `ibv_uc_pingpong` / `rxe-rc-pingpong --uc`.
    Uc,
    /// `ibv_ud_pingpong` / `rxe-ud-pingpong`.
    Ud,
}

impl Transport {
    /// The opcode-name prefix of this transport's SENDs in `rxe-emu pcap check`.
    pub fn send_prefix(self) -> &'static str {
        match self {
            Transport::Rc => "RC_SEND_",
            Transport::Uc => "UC_SEND_",
            Transport::Ud => "UD_SEND_",
        }
    }
}

/// Who is the server (the side that listens for the address exchange).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// rxe-emu on the host serves; kernel rxe in the guest connects.
    EmuServer,
    /// kernel rxe in the guest serves; rxe-emu on the host connects.
    KernelServer,
}

impl fmt::Display for Direction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Direction::EmuServer => "emu-server",
            Direction::KernelServer => "kernel-server",
        })
    }
}

/// One scenario; it runs once in each direction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scenario {
    /// Name in the table, e.g. `rc-65536`.
    pub name: String,
    /// QP type.
    pub transport: Transport,
    /// Message size (`-s`).
    pub size: usize,
    /// Exchanges (`-n`).
    pub iters: u32,
    /// Path MTU (`-m`; RC and UC only).
    pub path_mtu: u32,
    /// Link MTU of bridge, tap and guest eth0 (and `--netdev-mtu` of ours).
    pub link_mtu: u32,
    /// netem loss in percent on both directions (0: a clean link), applied
    /// to RoCEv2 packets that carry payload; ACKs and NAKs always pass.
    ///
    /// Why not ACKs too: `ibv_rc_pingpong` exits as soon as its own work is
    /// complete. If the last ACK one side sends is lost, the other side
    /// resends, but the first has destroyed its QP and answers nothing; the
    /// resender retries for ever, because kernel rxe (and rxe-emu, which
    /// matches it) treats `retry_cnt = 7`, the value pingpong sets, as
    /// unlimited. Both CI and local runs hung this way about once in ten.
    /// Lost ACKs and NAKs are covered by rxe-core's simulated-link tests.
    pub loss_pct: u32,
    /// `Some`: rxe-interop-peer on both sides (the server is the
    /// responder) instead of the pingpongs; see `peer.rs`.
    pub peer: Option<PeerSpec>,
    /// Debian's unmodified `ibv_*_pingpong` on both sides: in the guest on
    /// kernel rxe, on the host through our drop-in `libibverbs.so.1` and
    /// rxe-emud (instead of our `rxe-*-pingpong`).
    pub dropin: bool,
    /// `ibv_srq_pingpong` (RC, `SRQ_QPS` QPs receiving from one SRQ);
    /// only with `dropin`.
    pub srq: bool,
    /// `-e`: both sides sleep on completion events instead of polling.
    pub events: bool,
    /// `Some`: Debian's RDMA CM programs on both sides (host: through our
    /// drop-in `librdmacm.so.1` and `libibverbs.so.1`); see `cm.rs`.
    pub cm: Option<CmTool>,
}

impl Scenario {
    fn new(name: &str, transport: Transport, size: usize, iters: u32) -> Self {
        Scenario {
            name: name.into(),
            transport,
            size,
            iters,
            path_mtu: 1024,
            link_mtu: 1500,
            loss_pct: 0,
            peer: None,
            dropin: false,
            srq: false,
            events: false,
            cm: None,
        }
    }

    /// Debian's RDMA CM programs on both sides (host: through the drop-in
    /// librdmacm and libibverbs).
    fn cm(name: &str, tool: CmTool) -> Self {
        let transport = if tool.ud() {
            Transport::Ud
        } else {
            Transport::Rc
        };
        Scenario {
            cm: Some(tool),
            ..Scenario::new(name, transport, 0, 0)
        }
    }

    /// Debian's `ibv_*_pingpong` on both sides (host: through the drop-in).
    fn dropin(name: &str, transport: Transport, size: usize, iters: u32, events: bool) -> Self {
        Scenario {
            dropin: true,
            events,
            ..Scenario::new(name, transport, size, iters)
        }
    }

    /// `ibv_srq_pingpong` on both sides (host: through the drop-in).
    fn dropin_srq(name: &str, size: usize, iters: u32, events: bool) -> Self {
        Scenario {
            srq: true,
            ..Scenario::dropin(name, Transport::Rc, size, iters, events)
        }
    }

    /// An rxe-interop-peer scenario at `path_mtu` (link MTU 9000 for 4096).
    pub fn peer(name: &str, spec: PeerSpec, path_mtu: u32) -> Self {
        let transport = match spec.op {
            "uc-send" | "uc-write" => Transport::Uc,
            "ud-send" => Transport::Ud,
            _ => Transport::Rc,
        };
        Scenario {
            name: name.into(),
            transport,
            size: spec.sizes.iter().copied().max().unwrap_or(0),
            iters: spec.msgs() as u32,
            path_mtu,
            link_mtu: if path_mtu > 1024 { 9000 } else { 1500 },
            loss_pct: 0,
            peer: Some(spec),
            dropin: false,
            srq: false,
            events: false,
            cm: None,
        }
    }

    /// Bytes moved as both pingpongs count them (`size * iters * 2`).
    pub fn bytes(&self) -> u64 {
        if let Some(p) = &self.peer {
            return p.bytes();
        }
        if let Some(t) = self.cm {
            return t.bytes();
        }
        self.size as u64 * u64::from(self.iters) * 2
    }

    /// The guest command line (rdma-core's tool against kernel rxe).
    pub fn kernel_cmd(&self, dir: Direction, port: u16) -> String {
        if let Some(t) = self.cm {
            let port = t.port(port);
            return match dir {
                Direction::EmuServer => t.client_cmd(HOST_IP, port),
                Direction::KernelServer => t.server_cmd(GUEST_IP, port),
            }
            .join(" ");
        }
        if let Some(p) = &self.peer {
            let to = (dir == Direction::EmuServer).then_some(HOST_IP);
            return format!(
                "rxe-interop-peer {}",
                p.args(port, self.path_mtu, to).join(" ")
            );
        }
        let to = (dir == Direction::EmuServer).then_some(HOST_IP);
        self.debian_cmd(port, to).join(" ")
    }

    /// rdma-core's pingpong and its arguments; `connect_to` makes it the
    /// client.
    fn debian_cmd(&self, port: u16, connect_to: Option<&str>) -> Vec<String> {
        let tool = match self.transport {
            _ if self.srq => "ibv_srq_pingpong",
            Transport::Rc => "ibv_rc_pingpong",
            Transport::Uc => "ibv_uc_pingpong",
            Transport::Ud => "ibv_ud_pingpong",
        };
        let mut c: Vec<String> = [
            tool,
            "-d",
            "rxe0",
            "-g",
            "1",
            "-p",
            &port.to_string(),
            "-s",
            &self.size.to_string(),
            "-n",
            &self.iters.to_string(),
            "-c",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        if self.transport != Transport::Ud {
            c.extend(["-m".into(), self.path_mtu.to_string()]);
        }
        if self.srq {
            c.extend(["-q".into(), SRQ_QPS.to_string()]);
        }
        if self.events {
            c.push("-e".into());
        }
        c.extend(connect_to.map(String::from));
        c
    }

    /// Our tool's arguments (after the binary).
    pub fn emu_args(&self, dir: Direction, port: u16) -> Vec<String> {
        if let Some(t) = self.cm {
            let port = t.port(port);
            let mut c = match dir {
                Direction::EmuServer => t.server_cmd(HOST_IP, port),
                Direction::KernelServer => t.client_cmd(GUEST_IP, port),
            };
            return c.split_off(1);
        }
        if let Some(p) = &self.peer {
            let to = (dir == Direction::KernelServer).then_some(GUEST_IP);
            let mut a = p.args(port, self.path_mtu, None);
            a.extend(["--linger".into(), peer::LINGER_MS.to_string()]);
            a.extend(to.map(String::from));
            return a;
        }
        if self.dropin {
            let to = (dir == Direction::KernelServer).then_some(GUEST_IP);
            return self.debian_cmd(port, to).split_off(1);
        }
        let mut a: Vec<String> = vec![
            "--ip".into(),
            HOST_IP.into(),
            "--netdev-mtu".into(),
            self.link_mtu.to_string(),
            "-g".into(),
            "1".into(),
            "-p".into(),
            port.to_string(),
            "-s".into(),
            self.size.to_string(),
            "-n".into(),
            self.iters.to_string(),
            "-c".into(),
        ];
        if self.transport != Transport::Ud {
            a.extend(["-m".into(), self.path_mtu.to_string()]);
        }
        if self.transport == Transport::Uc {
            a.push("--uc".into());
        }
        if dir == Direction::KernelServer {
            a.push(GUEST_IP.into());
        }
        a
    }

    /// Our binary's name (in the build's bin dir), or for `dropin` and
    /// `cm` Debian's tool (found on PATH); `dir` says whether our side
    /// serves (rdma_server or rdma_client).
    pub fn emu_bin(&self, dir: Direction) -> String {
        if let Some(t) = self.cm {
            let mut c = match dir {
                Direction::EmuServer => t.server_cmd(HOST_IP, 0),
                Direction::KernelServer => t.client_cmd(GUEST_IP, 0),
            };
            return c.swap_remove(0);
        }
        if self.peer.is_some() {
            return "rxe-interop-peer".into();
        }
        if self.dropin {
            return self.debian_cmd(0, None).swap_remove(0);
        }
        match self.transport {
            Transport::Rc | Transport::Uc => "rxe-rc-pingpong".into(),
            Transport::Ud => "rxe-ud-pingpong".into(),
        }
    }

    /// Our side runs through the drop-in `libibverbs.so.1` and rxe-emud.
    pub fn needs_daemon(&self) -> bool {
        self.peer.is_some() || self.dropin || self.cm.is_some()
    }

    /// The directions this scenario runs in (see `CmTool::emu_server_only`).
    pub fn directions(&self) -> &'static [Direction] {
        if self.cm.is_some_and(CmTool::emu_server_only) {
            &[Direction::EmuServer]
        } else {
            &[Direction::EmuServer, Direction::KernelServer]
        }
    }

    /// Our side runs a Debian program found on PATH (not one of ours).
    pub fn debian_on_host(&self) -> bool {
        self.dropin || self.cm.is_some()
    }
}

/// Every scenario, in the order they run (grouped so the link MTU changes
/// once).
pub fn all() -> Vec<Scenario> {
    use Transport::*;
    let mut v = vec![
        Scenario::new("rc-1", Rc, 1, 100),
        Scenario::new("rc-4096", Rc, 4096, 50),
        Scenario::new("rc-65536", Rc, 65536, 20),
        Scenario::new("uc-1", Uc, 1, 100),
        Scenario::new("uc-4096", Uc, 4096, 50),
        Scenario::new("uc-65536", Uc, 65536, 20),
        Scenario::new("ud-1", Ud, 1, 100),
        Scenario::new("ud-984", Ud, 984, 100),
    ];
    v.extend(
        peer::data_ops(1024)
            .into_iter()
            .chain(peer::error_modes())
            .chain(peer::since_6_2())
            .map(|(n, p)| Scenario::peer(&n, p, 1024)),
    );
    // Debian's unmodified pingpongs on both sides; UD at the path-MTU
    // payload (1024 bytes + the 40-byte GRH in the receive buffer)
    v.extend([
        Scenario::dropin("deb-rc-1", Rc, 1, 100, false),
        Scenario::dropin("deb-rc-65536-e", Rc, 65536, 20, true),
        Scenario::dropin("deb-uc-1-e", Uc, 1, 100, true),
        Scenario::dropin("deb-uc-65536", Uc, 65536, 20, false),
        Scenario::dropin("deb-ud-1", Ud, 1, 100, false),
        Scenario::dropin("deb-ud-1024-e", Ud, 1024, 100, true),
        Scenario::dropin_srq("deb-srq-1", 1, 50, false),
        Scenario::dropin_srq("deb-srq-65536-e", 65536, 5, true),
    ]);
    // Debian's RDMA CM programs on both sides: kernel rdma_cm against the
    // daemon's CM on QP1 (host: drop-in librdmacm and libibverbs)
    v.extend([
        Scenario::cm("cm-rping", CmTool::Rping),
        Scenario::cm("cm-ucmatose", CmTool::Ucmatose),
        Scenario::cm("cm-udaddy", CmTool::Udaddy),
        Scenario::cm("cm-rdma-server", CmTool::RdmaServer),
        Scenario::cm("cm-send-bw", CmTool::SendBw),
        Scenario::cm("cm-write-lat", CmTool::WriteLat),
        Scenario::cm("cm-send-bw-z", CmTool::SendBwComm),
        Scenario::cm("cm-rstream", CmTool::Rstream),
    ]);
    let mut loss = Scenario::new("rc-loss5-16384", Rc, 16384, 30);
    loss.loss_pct = 5;
    v.push(loss);
    for (size, iters) in [(4096, 50), (65536, 20)] {
        let mut s = Scenario::new(&format!("rc-mtu4096-{size}"), Rc, size, iters);
        s.path_mtu = 4096;
        s.link_mtu = 9000;
        v.push(s);
    }
    v.extend(
        peer::data_ops(4096)
            .into_iter()
            .map(|(n, p)| Scenario::peer(&n, p, 4096)),
    );
    v
}

/// What one side of a run produced.
#[derive(Debug, Clone, Default)]
pub struct SideResult {
    /// Exit code (None: killed or never finished).
    pub rc: Option<i32>,
    /// Its standard output and error together.
    pub output: String,
}

/// Why one side did not succeed; empty when it did.
/// `emu`: this is our side; `responder`: this side was the server.
pub fn check_side(
    s: &Scenario,
    side: &str,
    r: &SideResult,
    emu: bool,
    responder: bool,
) -> Vec<String> {
    if let Some(p) = &s.peer {
        return p.check_side(side, r.rc, &r.output, responder);
    }
    if let Some(t) = s.cm {
        return t.check_side(side, r.rc, &r.output, responder);
    }
    let mut why = Vec::new();
    match r.rc {
        Some(0) => {}
        Some(rc) => why.push(format!("{side} exited with {rc}")),
        None => why.push(format!("{side} did not finish (killed)")),
    }
    if r.rc != Some(0) {
        return why;
    }
    let bytes = format!("{} bytes in ", s.bytes());
    let iters = format!("{} iters in ", s.iters);
    for want in [&bytes, &iters] {
        if !r.output.contains(want.as_str()) {
            why.push(format!("{side} did not print \"{}\"", want.trim_end()));
        }
    }
    if emu && !s.dropin {
        let checked = format!("{} received messages checked", s.iters);
        if !r.output.contains(&checked) {
            why.push(format!("{side} did not print \"{checked}\""));
        }
    }
    if r.output.contains("invalid data") {
        why.push(format!("{side} reports invalid data"));
    }
    why
}

/// Kernel rxe's hw_counters (`name:value` lines as `grep -H . *` prints them).
pub fn parse_counters(text: &str) -> BTreeMap<String, u64> {
    text.lines()
        .filter_map(|l| {
            let (k, v) = l.split_once(':')?;
            let k = k.rsplit('/').next()?.trim();
            Some((k.to_string(), v.trim().parse().ok()?))
        })
        .collect()
}

/// `after - before` for every counter that moved.
pub fn counter_delta(
    before: &BTreeMap<String, u64>,
    after: &BTreeMap<String, u64>,
) -> BTreeMap<String, u64> {
    after
        .iter()
        .filter_map(|(k, &a)| {
            let d = a.saturating_sub(before.get(k).copied().unwrap_or(0));
            (d > 0).then(|| (k.clone(), d))
        })
        .collect()
}

/// Counters that mean the run went wrong however slow the guest is.
const HARD_ERRORS: &[&str] = &[
    "retry_exceeded_err",
    "retry_rnr_exceeded_err",
    "send_err",
    "link_downed",
];
/// Sequence errors and RNR: a clean link with receives posted ahead has none.
const SEQUENCE_ERRORS: &[&str] = &[
    "rcvd_seq_err",
    "out_of_seq_request",
    "rcvd_rnr_err",
    "send_rnr_err",
];
/// Retransmission by timeout. Linux 6.1 rxe arms its retransmit timer only
/// when it is not already pending and does not stop it on an ACK
/// (`update_state()` in `rxe_req.c`), so a timer armed by an earlier message
/// can fire while a later one is in flight, and that one is resent
/// (`completer_retry_err`; the peer counts a `duplicate_request`). A slow
/// TCG guest can cause the same.
const SLOW_PEER: &[&str] = &["completer_retry_err", "duplicate_request"];

/// Judge kernel rxe's counter deltas: `(failures, notes)`.
///
/// `required`: counters the run must move, `(name, min, max)` (an RNR run
/// must show its RNR NAKs, a vanished peer its retries); they and
/// `allowed` are exempt from the clean-link rules.
pub fn judge_counters(
    delta: &BTreeMap<String, u64>,
    lossy: bool,
    strict: bool,
    required: &[(&str, u64, u64)],
    allowed: &[&str],
) -> (Vec<String>, Vec<String>) {
    let (mut fail, mut note) = (Vec::new(), Vec::new());
    for &(k, min, max) in required {
        let v = delta.get(k).copied().unwrap_or(0);
        if v < min || v > max {
            fail.push(format!("kernel counter {k}={v}, want {min}..={max}"));
        } else {
            note.push(format!("{k}={v} (expected)"));
        }
    }
    let delta: BTreeMap<String, u64> = delta
        .iter()
        .filter(|(k, _)| !required.iter().any(|r| r.0 == k.as_str()))
        .map(|(k, v)| (k.clone(), *v))
        .collect();
    let delta = &delta;
    for (k, v) in delta {
        if allowed.contains(&k.as_str()) {
            note.push(format!("{k}={v} (allowed here)"));
        }
    }
    let delta: BTreeMap<String, u64> = delta
        .iter()
        .filter(|(k, _)| !allowed.contains(&k.as_str()))
        .map(|(k, v)| (k.clone(), *v))
        .collect();
    let delta = &delta;
    let recovered: u64 = SEQUENCE_ERRORS
        .iter()
        .chain(SLOW_PEER)
        .filter_map(|k| delta.get(*k))
        .sum();
    if lossy && recovered == 0 {
        fail.push("netem loss left no trace in kernel rxe's counters: was it applied?".into());
    }
    for (k, &v) in delta {
        let item = format!("{k}={v}");
        if HARD_ERRORS.contains(&k.as_str()) {
            fail.push(format!("kernel counter {item}"));
        } else if SEQUENCE_ERRORS.contains(&k.as_str()) {
            if lossy {
                note.push(format!("{item} (netem loss)"));
            } else {
                fail.push(format!("kernel counter {item} on a clean link"));
            }
        } else if SLOW_PEER.contains(&k.as_str()) {
            if lossy {
                note.push(format!("{item} (netem loss)"));
            } else if strict {
                fail.push(format!("kernel counter {item} (CONFORMANCE_STRICT=1)"));
            } else {
                note.push(format!("{item} (retransmit timer, see README)"));
            }
        }
    }
    (fail, note)
}

/// What `rxe-emu pcap check` said about a capture.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PcapSummary {
    /// RoCEv2 packets.
    pub roce: u64,
    /// Of those, with a correct ICRC.
    pub icrc_ok: u64,
    /// With a wrong ICRC or that do not parse.
    pub bad: u64,
    /// Cut short: not checkable.
    pub truncated: u64,
    /// Packets per opcode name.
    pub opcodes: BTreeMap<String, u64>,
}

/// Parse `rxe-emu pcap check`'s report (its first line is
/// `FILE: N records, N RoCEv2 packets: N ICRC ok, N bad, N truncated ...`,
/// then one `  OPCODE  COUNT` line per opcode).
pub fn parse_pcap_check(text: &str) -> Option<PcapSummary> {
    let mut lines = text.lines();
    let head = lines.next()?;
    let num_before = |word: &str| -> Option<u64> {
        let i = head.find(word)?;
        head[..i].split_whitespace().last()?.parse().ok()
    };
    let mut s = PcapSummary {
        roce: num_before(" RoCEv2 packets")?,
        icrc_ok: num_before(" ICRC ok")?,
        bad: num_before(" bad")?,
        truncated: num_before(" truncated")?,
        opcodes: BTreeMap::new(),
    };
    for l in lines {
        let mut it = l.split_whitespace();
        if let (Some(op), Some(n), None) = (it.next(), it.next(), it.next()) {
            if op.chars().all(|c| c.is_ascii_uppercase() || c == '_') {
                if let Ok(n) = n.parse() {
                    s.opcodes.insert(op.to_string(), n);
                }
            }
        }
    }
    Some(s)
}

/// Why a capture does not back the run up; empty when it does: every
/// packet checkable with a good ICRC, and SENDs of the scenario's transport.
pub fn check_pcap(s: &Scenario, p: &PcapSummary) -> Vec<String> {
    let mut why = Vec::new();
    if p.roce == 0 {
        why.push("no RoCEv2 packet captured".into());
    }
    if p.bad > 0 {
        why.push(format!("{} packets with a bad ICRC or unparsable", p.bad));
    }
    if p.truncated > 0 {
        why.push(format!(
            "{} truncated packets (ICRC not checked)",
            p.truncated
        ));
    }
    if p.icrc_ok != p.roce {
        why.push(format!("{} of {} ICRCs verified", p.icrc_ok, p.roce));
    }
    if let Some(peer) = &s.peer {
        why.extend(peer.check_wire(&p.opcodes));
    }
    if let Some(t) = s.cm {
        // CM MADs are UD SENDs beside the tool's own transport; the MADs
        // themselves are checked from the capture (`cm::check_mads`)
        why.extend(t.check_opcodes(&p.opcodes));
        return why;
    }
    let prefix = s.transport.send_prefix();
    let sends: u64 = p
        .opcodes
        .iter()
        .filter(|(k, _)| k.starts_with(prefix))
        .map(|(_, n)| n)
        .sum();
    if sends == 0 && s.peer.is_none() {
        why.push(format!("no {prefix}* packet in the capture"));
    }
    let foreign: Vec<&String> = p
        .opcodes
        .keys()
        .filter(|k| !k.starts_with(&prefix[..3]))
        .collect();
    if !foreign.is_empty() {
        why.push(format!("opcodes of another transport: {foreign:?}"));
    }
    why
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rc() -> Scenario {
        Scenario::new("rc-4096", Transport::Rc, 4096, 50)
    }

    #[test]
    fn commands_mirror_each_other() {
        let s = rc();
        assert_eq!(
            s.kernel_cmd(Direction::KernelServer, 18600),
            "ibv_rc_pingpong -d rxe0 -g 1 -p 18600 -s 4096 -n 50 -c -m 1024"
        );
        assert!(s
            .kernel_cmd(Direction::EmuServer, 18600)
            .ends_with(" 10.77.0.1"));
        let a = s.emu_args(Direction::KernelServer, 18600).join(" ");
        assert_eq!(
            a,
            "--ip 10.77.0.1 --netdev-mtu 1500 -g 1 -p 18600 -s 4096 -n 50 -c -m 1024 10.77.0.11"
        );
        let mut uc = rc();
        uc.transport = Transport::Uc;
        assert!(uc
            .emu_args(Direction::EmuServer, 1)
            .contains(&"--uc".into()));
        assert!(uc
            .kernel_cmd(Direction::EmuServer, 1)
            .starts_with("ibv_uc_pingpong"));
        let ud = Scenario::new("ud-1", Transport::Ud, 1, 10);
        assert!(!ud.kernel_cmd(Direction::KernelServer, 1).contains("-m"));
        assert_eq!(ud.emu_bin(Direction::EmuServer), "rxe-ud-pingpong");
    }

    #[test]
    fn dropin_runs_debians_tool_on_both_sides() {
        let v = all();
        let srq = v.iter().find(|s| s.name == "deb-srq-65536-e").unwrap();
        assert_eq!(
            srq.kernel_cmd(Direction::EmuServer, 18600),
            "ibv_srq_pingpong -d rxe0 -g 1 -p 18600 -s 65536 -n 5 -c -m 1024 -q 4 -e 10.77.0.1"
        );
        assert_eq!(srq.emu_bin(Direction::EmuServer), "ibv_srq_pingpong");
        assert_eq!(
            srq.emu_args(Direction::KernelServer, 18600).join(" "),
            "-d rxe0 -g 1 -p 18600 -s 65536 -n 5 -c -m 1024 -q 4 -e 10.77.0.11"
        );
        assert!(srq.needs_daemon());
        let ud = v.iter().find(|s| s.name == "deb-ud-1").unwrap();
        assert_eq!(ud.emu_bin(Direction::KernelServer), "ibv_ud_pingpong");
        assert_eq!(
            ud.emu_args(Direction::EmuServer, 1).join(" "),
            "-d rxe0 -g 1 -p 1 -s 1 -n 100 -c"
        );
        // no "received messages checked" line from Debian's tool
        let ok = SideResult {
            rc: Some(0),
            output:
                "200 bytes in 0.01 seconds = 1 Mbit/sec\n100 iters in 0.01 seconds = 1 usec/iter\n"
                    .into(),
        };
        assert!(check_side(ud, "emu", &ok, true, true).is_empty());
        assert!(!rc().needs_daemon());
    }

    #[test]
    fn cm_runs_debians_rdma_cm_tools_with_the_server_where_the_direction_says() {
        let v = all();
        let rp = v.iter().find(|s| s.name == "cm-rping").unwrap();
        assert!(rp.needs_daemon() && rp.debian_on_host());
        assert_eq!(
            rp.kernel_cmd(Direction::EmuServer, 18600),
            "rping -c -a 10.77.0.1 -p 18600 -v -V -C 10"
        );
        assert_eq!(
            rp.emu_args(Direction::EmuServer, 18600).join(" "),
            "-s -a 10.77.0.1 -p 18600 -v -C 10"
        );
        assert_eq!(
            rp.kernel_cmd(Direction::KernelServer, 18600),
            "rping -s -a 10.77.0.11 -p 18600 -v -C 10"
        );
        let rs = v.iter().find(|s| s.name == "cm-rdma-server").unwrap();
        assert_eq!(rs.emu_bin(Direction::EmuServer), "rdma_server");
        assert_eq!(rs.emu_bin(Direction::KernelServer), "rdma_client");
        assert_eq!(
            rs.emu_args(Direction::KernelServer, 7).join(" "),
            "-s 10.77.0.11 -p 7"
        );
        let ud = v.iter().find(|s| s.name == "cm-udaddy").unwrap();
        assert_eq!(ud.transport, Transport::Ud);
        assert_eq!(
            ud.kernel_cmd(Direction::EmuServer, 18600),
            "udaddy -s 10.77.0.1 -c 2"
        );
        // the CM MADs (UD SENDs) beside RC data are no foreign transport
        let p = parse_pcap_check(
            "f: 9 records, 9 RoCEv2 packets: 9 ICRC ok, 0 bad, 0 truncated\n\
             \x20 UD_SEND_ONLY 5\n\
             \x20 RC_SEND_ONLY 2\n\
             \x20 RC_RDMA_READ_REQUEST 1\n\
             \x20 RC_RDMA_READ_RESPONSE_ONLY 1\n\
             \x20 RC_RDMA_WRITE_ONLY 1\n",
        )
        .unwrap();
        assert_eq!(check_pcap(rp, &p), Vec::<String>::new());
    }

    #[test]
    fn every_scenario_name_is_unique_and_mtu_changes_once() {
        let v = all();
        let mut names: Vec<_> = v.iter().map(|s| s.name.clone()).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), v.len());
        let changes = v
            .windows(2)
            .filter(|w| w[0].link_mtu != w[1].link_mtu)
            .count();
        assert_eq!(changes, 1);
        for s in &v {
            if s.path_mtu == 4096 {
                assert!(s.link_mtu >= 4096 + 48 + 28 + 14);
            }
            if s.transport == Transport::Ud && s.peer.is_none() {
                assert!(s.size <= 1024, "a UD message fits one 1024-byte packet");
            }
            assert!(!s.srq || s.dropin, "only Debian's tool does SRQ");
        }
    }

    const GOOD: &str = "  local address:  LID 0x0000\n\
        409600 bytes in 0.05 seconds = 25.38 Mbit/sec\n\
        50 iters in 0.05 seconds = 2581.96 usec/iter\n\
        50 received messages checked\n";

    #[test]
    fn a_side_passes_only_with_rc_0_and_the_expected_lines() {
        let s = rc();
        let ok = SideResult {
            rc: Some(0),
            output: GOOD.into(),
        };
        assert!(check_side(&s, "emu", &ok, true, false).is_empty());
        assert!(check_side(&s, "kernel", &ok, false, false).is_empty());
        let rc1 = SideResult {
            rc: Some(1),
            ..ok.clone()
        };
        assert_eq!(
            check_side(&s, "emu", &rc1, true, false),
            ["emu exited with 1"]
        );
        let killed = SideResult {
            rc: None,
            ..ok.clone()
        };
        assert_eq!(check_side(&s, "emu", &killed, true, false).len(), 1);
        let short = SideResult {
            rc: Some(0),
            output: GOOD.replace("409600", "4096"),
        };
        assert_eq!(check_side(&s, "kernel", &short, false, false).len(), 1);
        let unchecked = SideResult {
            rc: Some(0),
            output: GOOD.replace("50 received", "49 received"),
        };
        assert!(check_side(&s, "kernel", &unchecked, false, false).is_empty());
        assert_eq!(check_side(&s, "emu", &unchecked, true, false).len(), 1);
        let invalid = SideResult {
            rc: Some(0),
            output: format!("{GOOD}invalid data in page 0\n"),
        };
        assert_eq!(check_side(&s, "kernel", &invalid, false, false).len(), 1);
    }

    #[test]
    fn counters_parse_and_diff() {
        let before = parse_counters("a/sent_pkts:10\nrcvd_pkts:5\nlifespan:10\n");
        let after =
            parse_counters("a/sent_pkts:30\nrcvd_pkts:5\nlifespan:10\nduplicate_request:2\n");
        let d = counter_delta(&before, &after);
        assert_eq!(d.len(), 2);
        assert_eq!(d["sent_pkts"], 20);
        assert_eq!(d["duplicate_request"], 2);
    }

    #[test]
    fn counter_judgement() {
        let d: BTreeMap<String, u64> = [
            ("duplicate_request".to_string(), 2),
            ("sent_pkts".into(), 9),
        ]
        .into_iter()
        .collect();
        let (f, n) = judge_counters(&d, false, false, &[], &[]);
        assert!(f.is_empty());
        assert_eq!(n.len(), 1);
        assert_eq!(judge_counters(&d, false, true, &[], &[]).0.len(), 1);
        let seq: BTreeMap<String, u64> = [("rcvd_seq_err".to_string(), 1)].into_iter().collect();
        assert_eq!(judge_counters(&seq, false, false, &[], &[]).0.len(), 1);
        assert!(judge_counters(&seq, true, true, &[], &[]).0.is_empty());
        let quiet: BTreeMap<String, u64> = [("sent_pkts".to_string(), 100)].into_iter().collect();
        assert!(judge_counters(&quiet, false, true, &[], &[]).0.is_empty());
        assert_eq!(
            judge_counters(&quiet, true, false, &[], &[]).0.len(),
            1,
            "loss must show"
        );
        let hard: BTreeMap<String, u64> = [("retry_exceeded_err".to_string(), 1)]
            .into_iter()
            .collect();
        assert_eq!(judge_counters(&hard, false, false, &[], &[]).0.len(), 1);
        // a required counter must move within its bounds, and is then
        // exempt from the clean-link rules; allowed ones are notes
        let req = [("retry_exceeded_err", 1, 1)];
        assert!(judge_counters(&hard, false, false, &req, &[]).0.is_empty());
        assert_eq!(judge_counters(&quiet, false, false, &req, &[]).0.len(), 1);
        let (f, n) = judge_counters(&seq, false, false, &[], &["rcvd_seq_err"]);
        assert!(f.is_empty() && n.len() == 1, "{f:?} {n:?}");
    }

    const CHECK: &str = "/tmp/x.pcap: 623 records, 623 RoCEv2 packets: 623 ICRC ok, 0 bad, 0 truncated (not checkable)\n\
        \x20 RC_ACKNOWLEDGE                           36\n\
        \x20 RC_SEND_FIRST                            37\n\
        \x20 RC_SEND_MIDDLE                           514\n";

    #[test]
    fn pcap_report_parses_and_is_judged() {
        let p = parse_pcap_check(CHECK).unwrap();
        assert_eq!((p.roce, p.icrc_ok, p.bad, p.truncated), (623, 623, 0, 0));
        assert_eq!(p.opcodes["RC_SEND_MIDDLE"], 514);
        assert!(check_pcap(&rc(), &p).is_empty());
        let mut uc = rc();
        uc.transport = Transport::Uc;
        assert_eq!(check_pcap(&uc, &p).len(), 2, "no UC SEND and RC opcodes");
        let bad =
            parse_pcap_check(&CHECK.replace("623 ICRC ok, 0 bad", "622 ICRC ok, 1 bad")).unwrap();
        assert_eq!(check_pcap(&rc(), &bad).len(), 2);
        let empty =
            parse_pcap_check("f: 0 records, 0 RoCEv2 packets: 0 ICRC ok, 0 bad, 0 truncated\n")
                .unwrap();
        assert!(!check_pcap(&rc(), &empty).is_empty());
        assert!(parse_pcap_check("garbage").is_none());
    }
}
