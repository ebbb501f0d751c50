//! `rxe-emu trace`: watch a device's packets, QP state changes and events
//! live, decoded (or explained in plain words), optionally into a pcap.

use std::io::{BufRead, BufReader, Write};
use std::net::IpAddr;
use std::os::unix::net::UnixStream;
use std::path::Path;

use wire::icrc::IpUdpInfo;

/// What to show.
#[derive(Debug, Clone, Default)]
pub struct TraceOptions {
    /// A sentence per packet instead of the terse decode.
    pub explain: bool,
    /// Stop after this many packets.
    pub count: Option<usize>,
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

/// Trace device `dev` of the daemon at `socket`, writing lines to `out`
/// and packets to `pcap` (flushed per packet, so an interrupted trace
/// leaves a valid file). `ready` runs once the processes have been told to
/// report. Returns the number of packets shown.
pub fn run(
    socket: &Path,
    dev: &str,
    opts: &TraceOptions,
    mut pcap: Option<wire::pcap::PcapWriter<std::fs::File>>,
    out: &mut dyn Write,
    ready: impl FnOnce(),
) -> Result<usize, String> {
    let mut s = UnixStream::connect(socket)
        .map_err(|e| format!("cannot reach rxe-emud at {}: {e}", socket.display()))?;
    s.write_all(format!("TRACE {dev}\n").as_bytes())
        .map_err(|e| format!("rxe-emud: {e}"))?;
    let mut lines = BufReader::new(s).lines();
    let header = lines
        .next()
        .ok_or("rxe-emud closed the connection")?
        .map_err(|e| format!("rxe-emud: {e}"))?;
    if let Some(e) = header.strip_prefix("ERR ") {
        return Err(format!("rxe-emud: {e}"));
    }
    let addr: IpAddr = header
        .split_whitespace()
        .nth(2)
        .and_then(|a| a.parse().ok())
        .ok_or_else(|| format!("unexpected reply from rxe-emud: {header:?}"))?;
    let _ = writeln!(
        out,
        "tracing {dev} ({addr}); packets between its processes are shown once, as sent"
    );
    ready();
    let mut shown = 0usize;
    let mut t0: Option<u128> = None;
    for line in lines {
        let line = line.map_err(|e| format!("rxe-emud: {e}"))?;
        let mut w = line.splitn(4, ' ');
        let (kind, slot, ns, rest) = (
            w.next().unwrap_or(""),
            w.next().unwrap_or("?"),
            w.next().and_then(|n| n.parse::<u128>().ok()).unwrap_or(0),
            w.next().unwrap_or(""),
        );
        let t = ns.saturating_sub(*t0.get_or_insert(ns)) as f64 / 1e9;
        match kind {
            "P" => {
                // `dir src sport dst dport hex [tos]`: the IP TOS (DSCP and
                // ECN) follows when it is not 0 (a ConnectX-like device's
                // ECT and CE marks, a CNP's DSCP).
                let f: Vec<&str> = rest.split(' ').collect();
                let (dir, src, sport, dst, dport, hex, tos) = match f[..] {
                    [dir, src, sport, dst, dport, hex] => (dir, src, sport, dst, dport, hex, 0),
                    [dir, src, sport, dst, dport, hex, tos] => match tos.parse::<u8>() {
                        Ok(tos) => (dir, src, sport, dst, dport, hex, tos),
                        Err(_) => continue,
                    },
                    _ => continue,
                };
                let (Ok(src), Ok(sport), Ok(dst), Ok(dport), Some(payload)) = (
                    src.parse::<IpAddr>(),
                    sport.parse::<u16>(),
                    dst.parse::<IpAddr>(),
                    dport.parse::<u16>(),
                    unhex(hex),
                ) else {
                    continue;
                };
                // A packet between two processes of the device is reported
                // by both: show the send.
                if dir == "r" && src == addr {
                    continue;
                }
                let text = match crate::explain::describe(
                    &payload,
                    src,
                    wire::Ecn::from_tos(tos),
                    opts.explain,
                ) {
                    Ok(t) => t,
                    Err(e) => format!("malformed ({e}), {} bytes", payload.len()),
                };
                let arrow = if dir == "t" { "sent" } else { "recv" };
                let _ = writeln!(
                    out,
                    "{t:10.6} slot {slot} {arrow} {src}:{sport} -> {dst}:{dport}  {text}"
                );
                if let Some(w) = pcap.as_mut() {
                    let info = IpUdpInfo {
                        src,
                        dst,
                        src_port: sport,
                        dst_port: dport,
                        ipv4_id: 0,
                        ipv4_flags_frag: 0x4000,
                    };
                    let frame = wire::frame::build_with_tos(&info, tos, &payload);
                    w.write_frame(ns as u64, &frame)
                        .and_then(|_| w.flush())
                        .map_err(|e| format!("pcap: {e}"))?;
                }
                shown += 1;
                if opts.count.is_some_and(|c| shown >= c) {
                    break;
                }
            }
            "N" => {
                let _ = writeln!(out, "{t:10.6} slot {slot} {rest}");
            }
            "E" => {
                let _ = writeln!(out, "{t:10.6} slot {slot} async event {rest}");
            }
            _ => {}
        }
    }
    Ok(shown)
}
