//! The `cm-*` scenarios: Debian's unmodified RDMA CM programs (package
//! `rdmacm-utils`, and perftest with `-R`) on both sides, connecting
//! through the connection manager: in the guest kernel rdma_cm over kernel
//! rxe, on the host our drop-in `librdmacm.so.1` and `libibverbs.so.1`
//! over rxe-emud, whose QP1 speaks the IB CM (REQ/REP/RTU/DREQ/DREP, SIDR
//! for UD) with kernel cm. The server is the side that listens.
//!
//! A run passes on both sides' exit code 0 and the lines each tool prints
//! when it succeeded (rping's 10 echoed buffers, byte for byte, with its
//! own `-V` check on the client), an ICRC check of every packet (CM MADs
//! included), the data opcodes the tool must use, and the CM exchange
//! itself, decoded from the capture with `wire`: who sent which message,
//! the REQ's rdma_cm service ID (port space and port), and no REJ.
//! Everything here is pure, so the rules are unit-tested.

use std::collections::BTreeMap;
use std::net::IpAddr;

use wire::cm::{attr, CmMad, CmMessage};

/// udaddy has no port option: it always listens on 7174.
pub const UDADDY_PORT: u16 = 7174;
/// rping pings (`-C`).
pub const RPING_COUNT: u32 = 10;
/// rping's default buffer size (its `-S`).
const RPING_SIZE: usize = 64;
/// Connections of ucmatose and udaddy (`-c`): two ids on one listener.
pub const CONNECTIONS: u32 = 2;
/// perftest: message size and iterations.
pub const PERF_SIZE: usize = 4096;
/// perftest `-n` for ib_send_bw.
pub const PERF_BW_ITERS: u32 = 200;
/// perftest `-n` for ib_write_lat (and its size).
pub const PERF_LAT_ITERS: u32 = 100;
/// ib_write_lat's message size.
pub const PERF_LAT_SIZE: usize = 64;

/// The rdma_cm port spaces of the service ID (`RDMA_PS_*`; kernel
/// `cma_get_service_id`: `(ps << 16) + port`).
pub const PS_TCP: u64 = 0x0106;
/// `RDMA_PS_UDP`.
pub const PS_UDP: u64 = 0x0111;

/// Which program pair runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CmTool {
    /// `rping -s` / `rping -c`: SEND, RDMA READ and WRITE over RC.
    Rping,
    /// `ucmatose`: RC SENDs on `CONNECTIONS` connections.
    Ucmatose,
    /// `udaddy`: UD SENDs; the CM resolves the service with SIDR.
    Udaddy,
    /// `rdma_server` / `rdma_client`: the `rdma_getaddrinfo` and
    /// `rdma_create_ep` API, one SEND each way.
    RdmaServer,
    /// perftest `ib_send_bw -R`: parameters exchanged over one rdma_cm
    /// connection, then the test QP connected by rdma_cm on a second one.
    SendBw,
    /// perftest `ib_write_lat -R`.
    WriteLat,
    /// perftest `ib_send_bw -z`: parameters exchanged over an rdma_cm
    /// connection, the test QP connected with them by hand.
    SendBwComm,
    /// `rstream -T v`: a stream rsocket (rsocket.c's protocol: RDMA WRITE
    /// WITH IMMEDIATE into the peer's buffer, credits as SGL updates),
    /// data verified.
    Rstream,
}

/// rstream's transfer size (`-S`) and count (`-C`).
pub const RSTREAM_SIZE: usize = 4096;
/// `-C`.
pub const RSTREAM_COUNT: u32 = 100;

/// rstream's command line: `side` (`-b ADDR` or `-s ADDR`), port, size,
/// count, and data verification.
fn rstream(side: &[&str], port: &str) -> Vec<String> {
    let (size, count) = (RSTREAM_SIZE.to_string(), RSTREAM_COUNT.to_string());
    let mut v: Vec<String> = vec!["rstream".into()];
    v.extend(side.iter().map(|s| s.to_string()));
    v.extend(["-p", port, "-S", &size, "-C", &count, "-T", "v"].map(String::from));
    v
}

/// The CM messages a capture holds, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MadSeen {
    /// Sender's address.
    pub src: IpAddr,
    /// Attribute ID (`wire::cm::attr`).
    pub attr: u16,
    /// The service ID of a REQ or SIDR_REQ.
    pub service_id: Option<u64>,
}

/// Every CM MAD (a UD SEND to QP1 that parses as one) in a capture.
pub fn cm_mads(pcap: &[u8]) -> Result<Vec<MadSeen>, String> {
    let r = wire::pcap::PcapReader::new(pcap).map_err(|e| format!("capture: {e}"))?;
    let mut out = Vec::new();
    for rec in r {
        let rec = rec.map_err(|e| format!("capture record: {e}"))?;
        let Ok(f) = wire::frame::parse(rec.data) else {
            continue;
        };
        let Ok(p) = wire::PacketRepr::parse(f.udp_payload) else {
            continue;
        };
        if p.bth.opcode != wire::Opcode::UD_SEND_ONLY || p.bth.dest_qpn != 1 {
            continue;
        }
        let mad = CmMad::parse(p.payload)
            .map_err(|e| format!("a datagram to QP1 from {} is no CM MAD: {e}", f.info.src))?;
        let service_id = match &mad.message {
            CmMessage::Req(m) => Some(m.service_id),
            CmMessage::SidrReq(m) => Some(m.service_id),
            _ => None,
        };
        out.push(MadSeen {
            src: f.info.src,
            attr: mad.message.attribute_id(),
            service_id,
        });
    }
    Ok(out)
}

/// A CM message's name.
pub fn attr_name(a: u16) -> &'static str {
    match a {
        attr::REQ => "REQ",
        attr::MRA => "MRA",
        attr::REJ => "REJ",
        attr::REP => "REP",
        attr::RTU => "RTU",
        attr::DREQ => "DREQ",
        attr::DREP => "DREP",
        attr::SIDR_REQ => "SIDR_REQ",
        attr::SIDR_REP => "SIDR_REP",
        _ => "?",
    }
}

/// The buffer rping's client sends in ping `n` (`rping_test_client`:
/// `"rdma-ping-%d: "`, then ASCII from `'A' + n` upwards, wrapping after
/// `'z'` to `'A'`, NUL in the last byte), as both sides print it.
pub fn rping_line(n: u32) -> String {
    let mut s = format!("rdma-ping-{n}: ");
    let mut c = 65 + (n % 58) as u8;
    while s.len() < RPING_SIZE - 1 {
        s.push(c as char);
        c = if c >= 122 { 65 } else { c + 1 };
    }
    s
}

impl CmTool {
    /// The port the server listens on (`run_port`: the run's own).
    pub fn port(self, run_port: u16) -> u16 {
        match self {
            CmTool::Udaddy => UDADDY_PORT,
            _ => run_port,
        }
    }

    /// The rdma_cm port space of the tool's ids.
    pub fn port_space(self) -> u64 {
        match self {
            CmTool::Udaddy => PS_UDP,
            _ => PS_TCP,
        }
    }

    /// Whether the connection is UD (SIDR) rather than RC.
    pub fn ud(self) -> bool {
        self == CmTool::Udaddy
    }

    /// The server's command line (program first), listening on `bind`.
    pub fn server_cmd(self, bind: &str, port: u16) -> Vec<String> {
        let p = port.to_string();
        let c = CONNECTIONS.to_string();
        let v: Vec<&str> = match self {
            CmTool::Rping => vec!["rping", "-s", "-a", bind, "-p", &p, "-v", "-C", "10"],
            CmTool::Ucmatose => vec!["ucmatose", "-b", bind, "-p", &p, "-c", &c],
            CmTool::Udaddy => vec!["udaddy", "-b", bind, "-c", &c],
            CmTool::RdmaServer => vec!["rdma_server", "-s", bind, "-p", &p],
            CmTool::Rstream => return rstream(&["-b", bind], &p),
            CmTool::SendBw | CmTool::WriteLat | CmTool::SendBwComm => {
                return self.perftest(port, None)
            }
        };
        v.into_iter().map(String::from).collect()
    }

    /// The client's command line (program first), connecting to `server`.
    pub fn client_cmd(self, server: &str, port: u16) -> Vec<String> {
        let p = port.to_string();
        let c = CONNECTIONS.to_string();
        let v: Vec<&str> = match self {
            CmTool::Rping => vec![
                "rping", "-c", "-a", server, "-p", &p, "-v", "-V", "-C", "10",
            ],
            CmTool::Ucmatose => vec!["ucmatose", "-s", server, "-p", &p, "-c", &c],
            CmTool::Udaddy => vec!["udaddy", "-s", server, "-c", &c],
            CmTool::RdmaServer => vec!["rdma_client", "-s", server, "-p", &p],
            CmTool::Rstream => return rstream(&["-s", server], &p),
            CmTool::SendBw | CmTool::WriteLat | CmTool::SendBwComm => {
                return self.perftest(port, Some(server))
            }
        };
        v.into_iter().map(String::from).collect()
    }

    /// perftest with `-R` (connect with rdma_cm, exchange parameters over
    /// it too) or `-z` (exchange only), `-F` (no CPU frequency check in a
    /// VM).
    fn perftest(self, port: u16, server: Option<&str>) -> Vec<String> {
        let (tool, size, iters) = self.perf();
        let mode = if self == CmTool::SendBwComm {
            "-z"
        } else {
            "-R"
        };
        let mut v: Vec<String> = [
            tool,
            mode,
            "-d",
            "rxe0",
            "-F",
            "-p",
            &port.to_string(),
            "-s",
            &size.to_string(),
            "-n",
            &iters.to_string(),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        v.extend(server.map(String::from));
        v
    }

    /// perftest's program, message size and iterations.
    fn perf(self) -> (&'static str, usize, u32) {
        match self {
            CmTool::WriteLat => ("ib_write_lat", PERF_LAT_SIZE, PERF_LAT_ITERS),
            _ => ("ib_send_bw", PERF_SIZE, PERF_BW_ITERS),
        }
    }

    /// Whether this tool runs with the kernel as client only. perftest
    /// 4.5's `-R` client (Debian 12) connects its test QP as soon as the
    /// parameter exchange ends, while the server only then creates its
    /// second listener, and it does not retry (later perftest retries 10
    /// times, 100 ms apart). Our client resolves and connects within a
    /// millisecond, before the guest's server listens under TCG, and
    /// kernel cm rightly rejects the REQ (no listener: reason 8). So `-R`
    /// runs with the kernel as client only, and `-z` (one rdma_cm
    /// connection) both ways.
    pub fn emu_server_only(self) -> bool {
        matches!(self, CmTool::SendBw | CmTool::WriteLat)
    }

    /// Messages moved, for the table (`bytes` column).
    pub fn bytes(self) -> u64 {
        match self {
            CmTool::Rping => (RPING_COUNT as usize * RPING_SIZE * 2) as u64,
            CmTool::Rstream => (RSTREAM_SIZE as u64) * u64::from(RSTREAM_COUNT) * 2,
            CmTool::SendBw | CmTool::SendBwComm => (PERF_SIZE as u64) * u64::from(PERF_BW_ITERS),
            CmTool::WriteLat => (PERF_LAT_SIZE as u64) * u64::from(PERF_LAT_ITERS) * 2,
            _ => 0,
        }
    }

    /// Why one side's output does not show success; empty when it does.
    pub fn check_side(self, side: &str, rc: Option<i32>, out: &str, server: bool) -> Vec<String> {
        let mut why = Vec::new();
        match rc {
            Some(0) => {}
            Some(rc) => why.push(format!("{side} exited with {rc}")),
            None => why.push(format!("{side} did not finish (killed)")),
        }
        for bad in [
            "data mismatch",
            "RDMA_CM_EVENT_REJECTED",
            "cq completion failed",
        ] {
            if out.contains(bad) {
                why.push(format!("{side} printed \"{bad}\""));
            }
        }
        if rc != Some(0) {
            return why;
        }
        let mut want: Vec<String> = Vec::new();
        match self {
            CmTool::Rping => {
                let prefix = if server {
                    "server ping data: "
                } else {
                    "ping data: "
                };
                want.extend((0..RPING_COUNT).map(|n| format!("{prefix}{}", rping_line(n))));
            }
            CmTool::Ucmatose | CmTool::Udaddy => {
                want.extend(
                    [
                        "data transfers complete",
                        "test complete",
                        "return status 0",
                    ]
                    .map(String::from),
                );
            }
            CmTool::RdmaServer => {
                let who = if server { "rdma_server" } else { "rdma_client" };
                want.push(format!("{who}: end 0"));
            }
            CmTool::Rstream => {
                // "custom    4k      100     1       800k   ..."
                let size = format!("{}k", RSTREAM_SIZE / 1024);
                let found = out.lines().any(|l| {
                    let w: Vec<&str> = l.split_whitespace().collect();
                    w.len() >= 4
                        && w[0] == "custom"
                        && w[1] == size
                        && w[2] == RSTREAM_COUNT.to_string()
                });
                if !found {
                    why.push(format!(
                        "{side} printed no result line for {size} x {RSTREAM_COUNT}"
                    ));
                }
            }
            CmTool::SendBw | CmTool::WriteLat | CmTool::SendBwComm => {
                let (_, size, iters) = self.perf();
                // the result line: " 4096       200   ..."
                let found = out.lines().any(|l| {
                    let mut w = l.split_whitespace();
                    w.next() == Some(&size.to_string()) && w.next() == Some(&iters.to_string())
                });
                if !found {
                    why.push(format!(
                        "{side} printed no result line for {size} bytes x {iters}"
                    ));
                }
                if !out.contains("Data ex. method : rdma_cm") {
                    why.push(format!(
                        "{side} did not exchange its parameters over rdma_cm"
                    ));
                }
                let qps = out
                    .lines()
                    .find(|l| l.trim_start().starts_with("rdma_cm QPs"))
                    .is_some_and(|l| l.trim_end().ends_with("ON"));
                if qps != (self != CmTool::SendBwComm) {
                    why.push(format!(
                        "{side}: \"rdma_cm QPs\" is not {}",
                        if qps { "OFF" } else { "ON" }
                    ));
                }
            }
        }
        let lines: Vec<&str> = out.lines().map(str::trim_end).collect();
        for w in want {
            if !lines.contains(&w.as_str()) {
                why.push(format!("{side} did not print \"{w}\""));
            }
        }
        why
    }

    /// Opcodes (as `rxe-emu pcap check` names them) the data must use,
    /// each at least once, and whether any other transport's may appear
    /// (CM MADs are UD SENDs whatever the tool).
    pub fn check_opcodes(self, opcodes: &BTreeMap<String, u64>) -> Vec<String> {
        let want: &[&str] = match self {
            CmTool::Rping => &[
                "RC_SEND_ONLY",
                "RC_RDMA_READ_REQUEST",
                "RC_RDMA_READ_RESPONSE_ONLY",
                "RC_RDMA_WRITE_ONLY",
            ],
            CmTool::Ucmatose | CmTool::RdmaServer => &["RC_SEND_ONLY"],
            CmTool::SendBw | CmTool::SendBwComm => &["RC_SEND_FIRST", "RC_SEND_LAST"],
            CmTool::WriteLat => &["RC_RDMA_WRITE_ONLY"],
            CmTool::Udaddy => &["UD_SEND_ONLY"],
            // credits and control messages: zero- or 16-byte writes with
            // immediate data
            CmTool::Rstream => &["RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE"],
        };
        let mut why: Vec<String> = want
            .iter()
            .filter(|o| opcodes.get(**o).copied().unwrap_or(0) == 0)
            .map(|o| format!("no {o} in the capture"))
            .collect();
        let foreign: Vec<&String> = opcodes
            .keys()
            .filter(|k| {
                let own = if self.ud() { "UD_" } else { "RC_" };
                !(k.as_str() == "UD_SEND_ONLY" || k.starts_with(own))
            })
            .collect();
        if !foreign.is_empty() {
            why.push(format!("opcodes of another transport: {foreign:?}"));
        }
        why
    }

    /// Why the CM exchange in the capture is not the one this run must
    /// show; empty when it is. `server`/`client`: the two addresses.
    pub fn check_mads(
        self,
        mads: &[MadSeen],
        server: IpAddr,
        client: IpAddr,
        port: u16,
    ) -> Vec<String> {
        let mut why = Vec::new();
        let n = |a: u16, from: IpAddr| {
            mads.iter().filter(|m| m.attr == a && m.src == from).count() as u32
        };
        let conns = match self {
            CmTool::Ucmatose | CmTool::Udaddy => CONNECTIONS,
            // the parameter exchange, then the test QP
            CmTool::SendBw | CmTool::WriteLat => 2,
            _ => 1,
        };
        // (message, sender, at least): retransmissions may add more
        let (req, rep) = if self.ud() {
            (attr::SIDR_REQ, attr::SIDR_REP)
        } else {
            (attr::REQ, attr::REP)
        };
        let mut rules = vec![(req, client, conns), (rep, server, conns)];
        if !self.ud() {
            rules.push((attr::RTU, client, conns));
            // either side may disconnect first; every DREQ is answered
            let dreqs = n(attr::DREQ, server) + n(attr::DREQ, client);
            let dreps = n(attr::DREP, server) + n(attr::DREP, client);
            if dreqs < conns {
                why.push(format!("{dreqs} DREQ in the capture, want {conns} or more"));
            }
            if dreps < conns {
                why.push(format!("{dreps} DREP in the capture, want {conns} or more"));
            }
        }
        for (a, from, min) in rules {
            let got = n(a, from);
            if got < min {
                why.push(format!(
                    "{got} {} from {from} in the capture, want {min} or more",
                    attr_name(a)
                ));
            }
        }
        let sid = (self.port_space() << 16) | u64::from(port);
        for m in mads.iter().filter(|m| m.attr == req) {
            if m.service_id != Some(sid) {
                why.push(format!(
                    "{} with service ID {:#018x}, want {sid:#018x} (rdma_cm port space {:#x}, port {port})",
                    attr_name(req),
                    m.service_id.unwrap_or(0),
                    self.port_space()
                ));
            }
        }
        // An MRA is no error: kernel rdma_cm answers a duplicate REP with
        // one (`CMA_CM_MRA_SETTING`), which a slow guest can provoke.
        let odd: Vec<&str> = mads
            .iter()
            .filter(|m| {
                let sidr = matches!(m.attr, attr::SIDR_REQ | attr::SIDR_REP);
                m.attr == attr::REJ || (m.attr != attr::MRA && sidr != self.ud())
            })
            .map(|m| attr_name(m.attr))
            .collect();
        if !odd.is_empty() {
            why.push(format!("unexpected CM messages: {odd:?}"));
        }
        why
    }
}

/// `count x NAME` for each CM message in order of first appearance.
pub fn summary(mads: &[MadSeen]) -> String {
    let mut seen: Vec<(u16, u32)> = Vec::new();
    for m in mads {
        match seen.iter_mut().find(|(a, _)| *a == m.attr) {
            Some((_, c)) => *c += 1,
            None => seen.push((m.attr, 1)),
        }
    }
    let parts: Vec<String> = seen
        .iter()
        .map(|(a, c)| format!("{} {c}", attr_name(*a)))
        .collect();
    format!("CM {}", parts.join(" "))
}

/// Whether a guest listener on `port` shows in `rdma res show cm_id`.
pub fn guest_listens(rdma_res: &str, port: u16) -> bool {
    let tail = format!(":{port}");
    rdma_res.lines().any(|l| {
        l.contains("state LISTEN")
            && l.split_whitespace()
                .skip_while(|w| *w != "src-addr")
                .nth(1)
                .is_some_and(|a| a.ends_with(&tail))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOST: &str = "10.77.0.1";
    const GUEST: &str = "10.77.0.11";

    #[test]
    fn rping_lines_are_rpings_own() {
        // as Debian's rping -v printed them in the guest
        assert_eq!(
            rping_line(0),
            "rdma-ping-0: ABCDEFGHIJKLMNOPQRSTUVWXYZ[\\]^_`abcdefghijklmnopqr"
        );
        assert_eq!(
            rping_line(2),
            "rdma-ping-2: CDEFGHIJKLMNOPQRSTUVWXYZ[\\]^_`abcdefghijklmnopqrst"
        );
        assert_eq!(rping_line(9).len(), 63);
        assert!(rping_line(9).ends_with("yzA"), "{}", rping_line(9));
    }

    #[test]
    fn commands() {
        assert_eq!(
            CmTool::Rping.server_cmd(HOST, 18600).join(" "),
            "rping -s -a 10.77.0.1 -p 18600 -v -C 10"
        );
        assert_eq!(
            CmTool::Rping.client_cmd(GUEST, 18600).join(" "),
            "rping -c -a 10.77.0.11 -p 18600 -v -V -C 10"
        );
        assert_eq!(
            CmTool::Udaddy.client_cmd(HOST, 1).join(" "),
            "udaddy -s 10.77.0.1 -c 2"
        );
        assert_eq!(CmTool::Udaddy.port(18600), 7174);
        assert_eq!(
            CmTool::RdmaServer.server_cmd(GUEST, 5).join(" "),
            "rdma_server -s 10.77.0.11 -p 5"
        );
        assert_eq!(
            CmTool::SendBw.client_cmd(HOST, 5).join(" "),
            "ib_send_bw -R -d rxe0 -F -p 5 -s 4096 -n 200 10.77.0.1"
        );
        assert_eq!(
            CmTool::WriteLat.server_cmd(HOST, 5).join(" "),
            "ib_write_lat -R -d rxe0 -F -p 5 -s 64 -n 100"
        );
        assert_eq!(
            CmTool::SendBwComm.server_cmd(HOST, 5).join(" "),
            "ib_send_bw -z -d rxe0 -F -p 5 -s 4096 -n 200"
        );
    }

    #[test]
    fn sides_are_judged_by_their_own_lines() {
        let rp: String = (0..RPING_COUNT)
            .map(|n| format!("ping data: {}\n", rping_line(n)))
            .collect();
        assert!(CmTool::Rping
            .check_side("k", Some(0), &rp, false)
            .is_empty());
        // the server prints "server ping data: "
        assert_eq!(
            CmTool::Rping.check_side("k", Some(0), &rp, true).len(),
            RPING_COUNT as usize
        );
        let short = rp.replace(&rping_line(7), "rdma-ping-7: x");
        assert_eq!(
            CmTool::Rping.check_side("k", Some(0), &short, false).len(),
            1
        );
        let bad = format!("{rp}data mismatch!\n");
        assert_eq!(CmTool::Rping.check_side("k", Some(1), &bad, false).len(), 2);
        let uc =
            "cmatose: starting client\ndata transfers complete\ntest complete\nreturn status 0\n";
        assert!(CmTool::Ucmatose
            .check_side("k", Some(0), uc, false)
            .is_empty());
        assert_eq!(
            CmTool::Ucmatose
                .check_side("k", Some(0), &uc.replace("status 0", "status -1"), false)
                .len(),
            1
        );
        assert!(CmTool::RdmaServer
            .check_side(
                "k",
                Some(0),
                "rdma_server: start\nrdma_server: end 0\n",
                true
            )
            .is_empty());
        assert_eq!(
            CmTool::RdmaServer
                .check_side("k", Some(0), "rdma_server: end 0\n", false)
                .len(),
            1
        );
        let bw = " rdma_cm QPs\t : ON\n Data ex. method : rdma_cm\n #bytes     #iterations    BW peak[MB/sec]\n 4096       200              9.49               2.11   \t\t   0.000540\n";
        assert!(CmTool::SendBw.check_side("k", Some(0), bw, true).is_empty());
        assert_eq!(
            CmTool::SendBw
                .check_side("k", Some(0), &bw.replace(" 200 ", " 20 "), true)
                .len(),
            1
        );
        assert_eq!(CmTool::SendBw.check_side("k", None, bw, true).len(), 1);
        assert_eq!(
            CmTool::SendBwComm.check_side("k", Some(0), bw, true).len(),
            1
        );
        let z = bw.replace(": ON", ": OFF");
        assert!(CmTool::SendBwComm
            .check_side("k", Some(0), &z, true)
            .is_empty());
    }

    fn mad(src: &str, a: u16, sid: Option<u64>) -> MadSeen {
        MadSeen {
            src: src.parse().unwrap(),
            attr: a,
            service_id: sid,
        }
    }

    #[test]
    fn the_cm_exchange_is_checked_message_by_message() {
        let (s, c) = (HOST.parse().unwrap(), GUEST.parse().unwrap());
        let sid = Some(0x0106_0000 | 18600);
        let rc = vec![
            mad(GUEST, attr::REQ, sid),
            mad(HOST, attr::REP, None),
            mad(GUEST, attr::RTU, None),
            mad(GUEST, attr::DREQ, None),
            mad(HOST, attr::DREP, None),
        ];
        assert!(CmTool::Rping.check_mads(&rc, s, c, 18600).is_empty());
        assert_eq!(summary(&rc), "CM REQ 1 REP 1 RTU 1 DREQ 1 DREP 1");
        // the server's address sent the REQ: wrong way round
        assert_eq!(CmTool::Rping.check_mads(&rc, c, s, 18600).len(), 3);
        assert_eq!(CmTool::Rping.check_mads(&rc, s, c, 18601).len(), 1);
        let mut rej = rc.clone();
        rej.push(mad(HOST, attr::REJ, None));
        assert_eq!(CmTool::Rping.check_mads(&rej, s, c, 18600).len(), 1);
        assert_eq!(CmTool::Rping.check_mads(&rc[..3], s, c, 18600).len(), 2);
        // two connections of ucmatose need two of each
        assert_eq!(CmTool::Ucmatose.check_mads(&rc, s, c, 18600).len(), 5);
        let usid = Some(0x0111_0000 | 7174);
        let ud = vec![
            mad(GUEST, attr::SIDR_REQ, usid),
            mad(HOST, attr::SIDR_REP, None),
            mad(GUEST, attr::SIDR_REQ, usid),
            mad(HOST, attr::SIDR_REP, None),
        ];
        assert!(CmTool::Udaddy.check_mads(&ud, s, c, 7174).is_empty());
        assert_eq!(CmTool::Udaddy.check_mads(&rc, s, c, 7174).len(), 3);
    }

    #[test]
    fn data_opcodes() {
        let ops = |v: &[&str]| -> BTreeMap<String, u64> {
            v.iter().map(|o| (o.to_string(), 1)).collect()
        };
        let rp = ops(&[
            "UD_SEND_ONLY",
            "RC_SEND_ONLY",
            "RC_RDMA_READ_REQUEST",
            "RC_RDMA_READ_RESPONSE_ONLY",
            "RC_RDMA_WRITE_ONLY",
            "RC_ACKNOWLEDGE",
        ]);
        assert!(CmTool::Rping.check_opcodes(&rp).is_empty());
        assert_eq!(CmTool::SendBw.check_opcodes(&rp).len(), 2);
        assert_eq!(CmTool::Udaddy.check_opcodes(&rp).len(), 1);
        // udaddy sends with immediate data
        assert!(CmTool::Udaddy
            .check_opcodes(&ops(&["UD_SEND_ONLY", "UD_SEND_ONLY_WITH_IMMEDIATE"]))
            .is_empty());
        assert_eq!(
            CmTool::Ucmatose
                .check_opcodes(&ops(&["RC_SEND_ONLY", "UC_SEND_ONLY"]))
                .len(),
            1
        );
    }

    #[test]
    fn guest_listeners_by_port() {
        let res = "link rxe0/- cm-idn 10 state LISTEN ps TCP pid 1407 comm ib_send_bw src-addr 0.0.0.0:7201 \n\
            link rxe0/1 cm-idn 8 state LISTEN ps TCP pid 1365 comm rping src-addr 10.77.0.11:7200 dst-addr 0.0.0.0:0 \n\
            link rxe0/1 cm-idn 11 state CONNECT ps TCP pid 1365 comm rping src-addr 10.77.0.11:7300 dst-addr 10.77.0.1:4000 \n";
        assert!(guest_listens(res, 7201));
        assert!(guest_listens(res, 7200));
        assert!(!guest_listens(res, 720));
        assert!(!guest_listens(res, 7300));
    }
}
