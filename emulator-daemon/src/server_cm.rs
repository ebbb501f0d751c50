//! The I/O around [`crate::cm::CmService`]: CM command connections, the
//! event channels' sockets, and QP1 datagrams (CM MADs in UD SEND_ONLY
//! packets on slot 0 of each device).

use std::collections::VecDeque;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::os::fd::{AsRawFd, OwnedFd};
use std::time::Instant;

use nix::sys::socket::{send, socketpair, AddressFamily, MsgFlags, SockFlag, SockType};

use super::Server;
use crate::cmproto::{CmErr, Request};
use crate::fdpass;

/// An event channel: the daemon's end of its `SOCK_SEQPACKET` pair, and
/// events the process has not made room for yet.
pub(super) struct Chan {
    sock: OwnedFd,
    queue: VecDeque<String>,
}

/// Most events kept for a channel whose process does not read them; more
/// are dropped (and the process is told nothing: it is not reading).
const MAX_QUEUED: usize = 4096;

/// Answers a CM process may leave unread before it is dropped.
const MAX_UNREAD: usize = 1 << 20;

/// The GSI QP.
const QP1: u32 = 1;

/// The source address the host's routing picks to reach `dst`.
fn route_src(dst: IpAddr) -> Option<IpAddr> {
    let bind: SocketAddr = if dst.is_ipv4() {
        "0.0.0.0:0".parse().ok()?
    } else {
        "[::]:0".parse().ok()?
    };
    let s = UdpSocket::bind(bind).ok()?;
    s.connect(SocketAddr::new(dst, wire::ROCEV2_UDP_PORT))
        .ok()?;
    s.local_addr().ok().map(|a| a.ip())
}

impl Server {
    /// A line from a CM command connection.
    pub(super) fn serve_cm(&mut self, client: u64, line: &str) {
        let reply = match Request::parse(line) {
            // The socket travels with its reply line: only when nothing
            // else is queued before it (a process waits for each answer).
            Ok(Request::Channel)
                if self.clients.get(&client).is_some_and(|c| !c.out.is_empty()) =>
            {
                Err(CmErr::new(
                    libc::EBUSY,
                    "read the answers to earlier requests first",
                ))
            }
            Ok(Request::Channel) => match self.new_channel(client) {
                Ok((chan, theirs)) => {
                    let sent = self.clients.get(&client).map(|c| {
                        fdpass::send_line_with_fd(
                            &c.stream,
                            &format!("OK chan={chan}"),
                            theirs.as_raw_fd(),
                        )
                    });
                    if !matches!(sent, Some(Ok(()))) {
                        self.chans.remove(&chan);
                    }
                    return;
                }
                Err(e) => Err(e),
            },
            Ok(req) => self.cm.request(Instant::now(), client, &req, &route_src),
            Err(e) => Err(e),
        };
        let text = match reply {
            Ok(f) if f.is_empty() => "OK\n".to_string(),
            Ok(f) => format!("OK {f}\n"),
            Err(e) => format!("{}\n", e.to_line()),
        };
        // The events the request made go out first: once the process has
        // its OK, they are in their channels' sockets (a REQUEUE'd
        // RDMA_CM_EVENT_USER is readable when rdma_write_cm_event
        // returns, as the kernel's is).
        self.flush_cm();
        // Queued and written as the process reads: one that sends
        // requests without reading the answers cannot block the daemon,
        // and is dropped once it owes too much.
        let mut unread = false;
        if let Some(c) = self.clients.get_mut(&client) {
            c.out.extend_from_slice(text.as_bytes());
            super::write_out(c);
            unread = c.out.len() > MAX_UNREAD;
        }
        if unread {
            self.release(client);
        }
        self.flush_cm();
    }

    fn new_channel(&mut self, client: u64) -> Result<(u64, OwnedFd), CmErr> {
        let (ours, theirs) = socketpair(
            AddressFamily::Unix,
            SockType::SeqPacket,
            None,
            SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK,
        )
        .map_err(|e| CmErr::new(e as i32, format!("event channel: {e}")))?;
        // The process's end blocks (rdma_get_cm_event waits) unless it
        // sets O_NONBLOCK itself.
        let _ = nix::fcntl::fcntl(
            &theirs,
            nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::empty()),
        );
        let chan = self.cm.new_channel(client)?;
        self.chans.insert(
            chan,
            Chan {
                sock: ours,
                queue: VecDeque::new(),
            },
        );
        Ok((chan, theirs))
    }

    /// A CM client went away: its ids and channels go.
    pub(super) fn release_cm(&mut self, client: u64) {
        for chan in self.cm.channels_of(client) {
            self.chans.remove(&chan);
        }
        self.cm.drop_owner(Instant::now(), client);
        self.flush_cm();
    }

    /// Send the MADs and events the service has.
    pub(super) fn flush_cm(&mut self) {
        while let Some(out) = self.cm.poll_transmit() {
            self.send_mad(&out.device, out.to, &out.mad);
        }
        while let Some((chan, ev)) = self.cm.poll_event() {
            if let Some(c) = self.chans.get_mut(&chan) {
                if c.queue.len() < MAX_QUEUED {
                    c.queue.push_back(ev.to_line());
                }
            }
        }
        let mut gone = Vec::new();
        for (n, c) in self.chans.iter_mut() {
            while let Some(line) = c.queue.front() {
                match send(
                    c.sock.as_raw_fd(),
                    line.as_bytes(),
                    MsgFlags::MSG_DONTWAIT | MsgFlags::MSG_NOSIGNAL,
                ) {
                    Ok(_) => {
                        c.queue.pop_front();
                    }
                    Err(nix::errno::Errno::EAGAIN) => break,
                    Err(nix::errno::Errno::EINTR) => {}
                    Err(_) => {
                        // The process closed its end (rdma_destroy_event_channel).
                        gone.push(*n);
                        break;
                    }
                }
            }
        }
        for n in gone {
            self.chans.remove(&n);
        }
    }

    /// Channels with events still waiting for room.
    pub(super) fn cm_backlog(&self) -> bool {
        self.chans.values().any(|c| !c.queue.is_empty())
    }

    /// Fire due CM timers.
    pub(super) fn cm_tick(&mut self) {
        let now = Instant::now();
        if self.cm.poll_timeout().is_some_and(|t| t <= now) {
            self.cm.handle_timeout(now);
        }
        self.flush_cm();
    }

    /// Build the UD SEND_ONLY from QP1 to QP1 carrying `mad` and send it
    /// from the device's own socket.
    fn send_mad(&mut self, device: &str, to: IpAddr, mad: &[u8]) {
        let Some(d) = self.devices.iter().position(|x| x.spec.name == device) else {
            return;
        };
        let dev = &mut self.devices[d];
        dev.qp1_psn = (dev.qp1_psn + 1) & 0x00ff_ffff;
        let repr = wire::PacketRepr {
            bth: wire::bth::BthRepr {
                opcode: wire::Opcode::UD_SEND_ONLY,
                solicited: false,
                mig_req: false,
                pad_count: 0,
                tver: 0,
                pkey: 0xffff,
                fecn: false,
                becn: false,
                dest_qpn: QP1,
                ack_req: false,
                psn: wire::Psn::new(dev.qp1_psn),
            },
            rdeth: None,
            deth: Some(wire::deth::DethRepr {
                qkey: wire::deth::GSI_QKEY,
                src_qpn: QP1,
            }),
            xrceth: None,
            reth: None,
            feth: None,
            atomic: None,
            aeth: None,
            atomic_ack: None,
            immdt: None,
            ieth: None,
            payload: mad,
        };
        let mut buf = vec![0u8; repr.buffer_len()];
        if repr.emit(&mut buf).is_err() {
            return;
        }
        let info = wire::icrc::IpUdpInfo {
            src: dev.addr,
            dst: to,
            src_port: wire::ROCEV2_UDP_PORT,
            dst_port: wire::ROCEV2_UDP_PORT,
            ipv4_id: 0,
            ipv4_flags_frag: 0x4000,
        };
        wire::icrc::write(&info, &mut buf);
        let _ = dev.socks[0].send_to(&buf, SocketAddr::new(to, wire::ROCEV2_UDP_PORT));
        dev.stats.cm_sent += 1;
        self.trace_daemon_packet(d, 't', &info, &buf);
    }

    /// A datagram on the device's own slot: a CM MAD for QP1 is the
    /// connection manager's; anything else is counted and dropped.
    pub(super) fn on_daemon_datagram(&mut self, d: usize, src: SocketAddr, dg: &[u8]) {
        let dev = &self.devices[d];
        let info = wire::icrc::IpUdpInfo {
            src: src.ip(),
            dst: dev.addr,
            src_port: src.port(),
            dst_port: wire::ROCEV2_UDP_PORT,
            ipv4_id: 0,
            ipv4_flags_frag: 0x4000,
        };
        let icrc_ok = match (src.ip(), dev.addr) {
            (IpAddr::V4(_), IpAddr::V4(_)) => wire::icrc::solve_ipv4_id(&info, dg).is_some(),
            _ => wire::icrc::check(&info, dg),
        };
        let mad = wire::PacketRepr::parse(dg).ok().and_then(|p| {
            let gsi = p.bth.opcode == wire::Opcode::UD_SEND_ONLY
                && p.bth.dest_qpn == QP1
                && p.deth.is_some_and(|d| d.qkey == wire::deth::GSI_QKEY);
            gsi.then(|| p.payload.to_vec())
        });
        let name = dev.spec.name.clone();
        match mad {
            Some(mad) if icrc_ok => {
                self.devices[d].stats.cm_received += 1;
                self.trace_daemon_packet(d, 'r', &info, dg);
                self.cm.handle_mad(Instant::now(), &name, src.ip(), &mad);
                self.flush_cm();
            }
            _ => self.devices[d].stats.daemon_slot += 1,
        }
    }

    /// Show a packet the daemon itself sent or received to the device's
    /// tracer, as slot 0.
    fn trace_daemon_packet(&mut self, d: usize, dir: char, info: &wire::icrc::IpUdpInfo, p: &[u8]) {
        let Some((cli, _)) = self.devices[d].tracer else {
            return;
        };
        if let Some(c) = self.clients.get_mut(&cli) {
            if c.out.len() < super::MAX_OUT {
                let ns = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_nanos());
                let line = format!(
                    "P 0 {ns} {dir} {} {} {} {} {}\n",
                    info.src,
                    info.src_port,
                    info.dst,
                    info.dst_port,
                    crate::cmproto::hex(p)
                );
                c.out.extend_from_slice(line.as_bytes());
                super::write_out(c);
            }
        }
    }
}
