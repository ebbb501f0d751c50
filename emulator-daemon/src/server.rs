//! The daemon: devices (reuseport groups steered by QPN), slots, clients.
//!
//! One thread and one `poll` loop: the control socket, each client's
//! connection, and the slot sockets nobody owns (drained and counted).
//! Nothing a client or a datagram does can end the loop; only `STOP`, a
//! signal (when the caller asks for signal handling) or the caller's stop
//! flag do.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use nix::fcntl::{Flock, FlockArg};
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::signal::{SigSet, Signal};
use nix::sys::signalfd::SignalFd;
use nix::sys::socket::{getsockopt, sockopt};
use socket2::{Domain, Protocol, Socket, Type};

use crate::cm::CmService;
use crate::fdpass;
use crate::proto::DeviceInfo;

#[path = "server_cm.rs"]
mod cm_io;

/// Slots per device (the first, slot 0, is the daemon's).
pub const DEFAULT_SLOTS: u32 = 64;

/// What a device is bound to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Binding {
    /// One address: the device owns UDP 4791 on it.
    Addr(IpAddr),
    /// A network interface (`rdma link add rxe0 type rxe netdev eth0`):
    /// the device takes its first IPv4 address (else its first global
    /// IPv6 address) and its MTU when it is added.
    Netdev(String),
}

/// A device to host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceSpec {
    /// Name clients open it by (`rxe0`).
    pub name: String,
    /// The address or netdev it is bound to.
    pub binding: Binding,
    /// MTU of its netdev; `None` looks it up (the interface that has the
    /// address), 65536 for loopback and 1500 if not found.
    pub netdev_mtu: Option<u32>,
    /// What it is like: the newest kernel rxe (the default), an older one
    /// (`like=6.1`, `like=6.12`) or ConnectX (`like=mlx5`: ECN, CNPs,
    /// DCQCN).
    pub like: rxe_core::Like,
}

impl std::str::FromStr for DeviceSpec {
    type Err = String;
    /// `NAME=ADDR`, `NAME=ADDR/MTU` or `NAME=netdev:IFNAME`, each
    /// optionally followed by `,like=rxe` (the default), `,like=6.1`,
    /// `,like=6.12`, `,like=7.2` or `,like=mlx5`.
    fn from_str(s: &str) -> Result<Self, String> {
        let (name, rest) = s.split_once('=').ok_or_else(|| {
            format!("device {s:?}: expected NAME=ADDR, NAME=ADDR/MTU or NAME=netdev:IFNAME, optionally with ,like=rxe|6.1|6.12|7.2|mlx5")
        })?;
        if name.is_empty() || name.len() > 63 || !name.chars().all(|c| c.is_ascii_graphic()) {
            return Err(format!("device {s:?}: bad name"));
        }
        let mut options = rest.split(',');
        let rest = options.next().unwrap_or("");
        let mut like = rxe_core::Like::default();
        for o in options {
            match o.split_once('=') {
                Some(("like", m)) => {
                    like = rxe_core::Like::from_name(m).ok_or_else(|| {
                        format!(
                            "device {s:?}: like={m:?}: expected {}",
                            rxe_core::Like::NAMES
                        )
                    })?;
                }
                _ => {
                    return Err(format!(
                        "device {s:?}: unknown option {o:?} (like=rxe|6.1|6.12|7.2|mlx5)"
                    ))
                }
            }
        }
        if let Some(ifname) = rest.strip_prefix("netdev:") {
            if ifname.is_empty() || ifname.len() > 15 || ifname.contains(['/', ' ']) {
                return Err(format!("device {s:?}: bad netdev name {ifname:?}"));
            }
            return Ok(DeviceSpec {
                name: name.to_string(),
                binding: Binding::Netdev(ifname.to_string()),
                netdev_mtu: None,
                like,
            });
        }
        let (addr, mtu) = match rest.split_once('/') {
            Some((a, m)) => (
                a,
                Some(
                    m.parse()
                        .ok()
                        .filter(|m| (256..=65536).contains(m))
                        .ok_or_else(|| format!("device {s:?}: bad MTU {m:?} (256..=65536)"))?,
                ),
            ),
            None => (rest, None),
        };
        Ok(DeviceSpec {
            name: name.to_string(),
            binding: Binding::Addr(
                addr.parse()
                    .map_err(|_| format!("device {s:?}: bad address {addr:?}"))?,
            ),
            netdev_mtu: mtu,
            like,
        })
    }
}

impl std::fmt::Display for DeviceSpec {
    /// The form [`DeviceSpec::from_str`] reads.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (&self.binding, self.netdev_mtu) {
            (Binding::Netdev(n), _) => write!(f, "{}=netdev:{n}", self.name)?,
            (Binding::Addr(a), Some(m)) => write!(f, "{}={a}/{m}", self.name)?,
            (Binding::Addr(a), None) => write!(f, "{}={a}", self.name)?,
        }
        if self.like == rxe_core::Like::default() {
            Ok(())
        } else {
            write!(f, ",like={}", self.like.name())
        }
    }
}

/// How to run the daemon.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Control socket path.
    pub socket_path: PathBuf,
    /// Devices to host.
    pub devices: Vec<DeviceSpec>,
    /// Slots per device, 2..=64 (slot 0 is the daemon's).
    pub slots: u32,
    /// Serve clients of any user (a system-wide daemon). By default only
    /// the daemon's own user may connect (checked with `SO_PEERCRED`).
    pub any_user: bool,
}

/// Per-device drop counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DeviceStats {
    /// Datagrams for a slot nobody owns (a client that exited, or QPNs no
    /// client was given).
    pub no_owner: u64,
    /// Datagrams that reached the daemon's own slot: too short for a BTH,
    /// or for QPNs below 0x10000 other than CM MADs for QP1.
    pub daemon_slot: u64,
    /// CM MADs received on QP1 (with a good ICRC).
    pub cm_received: u64,
    /// CM MADs sent from QP1.
    pub cm_sent: u64,
}

struct Device {
    spec: DeviceSpec,
    /// The address it owns (the spec's, or its netdev's).
    addr: IpAddr,
    /// The interface that has the address, if any (`lo` for loopback).
    netdev: Option<String>,
    netdev_mtu: u32,
    socks: Vec<UdpSocket>,
    /// Client id owning each slot.
    owner: Vec<Option<u64>>,
    /// Times each slot was given out.
    generation: Vec<u32>,
    /// The same-host inbox of each owned slot (`local_link`): created when
    /// the slot is given out, closed when it is released, handed to the
    /// owner with its socket and to the device's other processes on
    /// request (`INBOX`). `None` also if it could not be created (no
    /// memfd): the device's processes then use UDP alone.
    inboxes: Vec<Option<local_link::InboxFile>>,
    /// When each slot was last released (a sequence number; 0: never
    /// used): the least recently used free slot is given first.
    released: Vec<u64>,
    stats: DeviceStats,
    /// The fault spec `rxe-emu fault` set (sent to every process that
    /// opens the device later too).
    fault: Option<String>,
    /// Congestion-control parameters (`rxe-emu cc set`), given to every
    /// process that opens the device (a ConnectX-like one).
    cc: rxe_core::CcParams,
    /// The `rxe-emu trace` client watching the device, and its tag.
    tracer: Option<(u64, u64)>,
    /// PSN of QP1's last send.
    qp1_psn: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Query {
    Stat,
    Qps,
    Fault,
    Cc,
}

/// A question the daemon asked the processes of a device for a CLI
/// client; answered when every process replied or after a second.
struct Pending {
    cli: u64,
    query: Query,
    dev: usize,
    waiting: Vec<u64>,
    replies: Vec<(u64, Vec<String>)>,
    deadline: std::time::Instant,
}

/// How long a process may take to answer.
const QUERY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(1);

struct Client {
    stream: UnixStream,
    pid: i32,
    uid: u32,
    buf: Vec<u8>,
    /// (device index, slot) pairs this client holds.
    slots: Vec<(usize, usize)>,
    /// Bytes queued for it (trace output), written as it reads.
    out: Vec<u8>,
    /// It sent `CM`: a connection-manager command connection.
    cm: bool,
}

/// Most trace output queued for a slow reader; more is dropped.
const MAX_OUT: usize = 16 << 20;

/// The longest line a client may send: a traced process's `P` line
/// carries a whole datagram in hex, and a UDP datagram has at most 65535
/// bytes (a full-size RoCEv2 packet of path MTU 4096 makes a line of
/// about 8.5 KB), plus its addresses and ports.
const MAX_LINE: usize = 2 * 65536 + 1024;

/// A bound daemon, ready to [`Server::run`].
pub struct Server {
    cfg: ServerConfig,
    listener: UnixListener,
    _lock: Flock<File>,
    devices: Vec<Device>,
    clients: HashMap<u64, Client>,
    next_client: u64,
    release_seq: u64,
    signals: Option<SignalFd>,
    pending: HashMap<u64, Pending>,
    next_tag: u64,
    /// The RDMA connection manager of every device.
    cm: CmService,
    /// Event channels, by number.
    chans: HashMap<u64, cm_io::Chan>,
}

fn io_err(what: &str, e: impl std::fmt::Display) -> String {
    format!("{what}: {e}")
}

/// Write what is queued for a client, as much as it takes now.
fn write_out(c: &mut Client) {
    while !c.out.is_empty() {
        match c.stream.write(&c.out) {
            Ok(0) => break,
            Ok(n) => {
                c.out.drain(..n);
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => break,
        }
    }
}

/// The MTU of interface `ifname`, from sysfs.
fn netdev_mtu_of(ifname: &str) -> Option<u32> {
    std::fs::read_to_string(format!("/sys/class/net/{ifname}/mtu"))
        .ok()
        .and_then(|s| s.trim().parse().ok())
}

/// Where a spec puts the device: its address, the interface that has it,
/// and that interface's MTU (the spec's MTU wins; loopback addresses are
/// on `lo` with 65536, an address on no interface gets 1500).
fn resolve(spec: &DeviceSpec) -> Result<(IpAddr, Option<String>, u32), String> {
    let ifs: Vec<(String, IpAddr)> = nix::ifaddrs::getifaddrs()
        .map(|it| {
            it.filter_map(|i| {
                let a = i.address?;
                let ip = a
                    .as_sockaddr_in()
                    .map(|s| IpAddr::V4(s.ip()))
                    .or_else(|| a.as_sockaddr_in6().map(|s| IpAddr::V6(s.ip())))?;
                Some((i.interface_name, ip))
            })
            .collect()
        })
        .unwrap_or_default();
    let (addr, netdev) = match &spec.binding {
        Binding::Addr(a) => {
            let on = ifs.iter().find(|(_, ip)| ip == a).map(|(n, _)| n.clone());
            (*a, on.or_else(|| a.is_loopback().then(|| "lo".to_string())))
        }
        Binding::Netdev(n) => {
            let mine: Vec<IpAddr> = ifs
                .iter()
                .filter(|(i, _)| i == n)
                .map(|(_, ip)| *ip)
                .collect();
            if mine.is_empty() && !std::path::Path::new("/sys/class/net").join(n).exists() {
                return Err(format!("device {}: no netdev {n:?}", spec.name));
            }
            // A link-local IPv6 address needs a scope to bind: skip it.
            let global6 = |ip: &IpAddr| match ip {
                IpAddr::V6(v6) => (v6.segments()[0] & 0xffc0) != 0xfe80,
                IpAddr::V4(_) => false,
            };
            let a = mine
                .iter()
                .find(|ip| ip.is_ipv4())
                .or_else(|| mine.iter().find(|ip| global6(ip)))
                .ok_or_else(|| {
                    format!(
                        "device {}: netdev {n} has no IPv4 or global IPv6 address to bind",
                        spec.name
                    )
                })?;
            (*a, Some(n.clone()))
        }
    };
    let mtu = spec
        .netdev_mtu
        .or_else(|| netdev.as_deref().and_then(netdev_mtu_of))
        .unwrap_or(if addr.is_loopback() { 65536 } else { 1500 });
    Ok((addr, netdev, mtu))
}

mod pmtu {
    use nix::{getsockopt_impl, setsockopt_impl, sockopt_impl};
    sockopt_impl!(
        /// `IP_MTU_DISCOVER` (`IP_PMTUDISC_*`): whether IPv4 datagrams carry DF.
        PmtuDiscover,
        Both,
        libc::IPPROTO_IP,
        libc::IP_MTU_DISCOVER,
        usize
    );
}
use pmtu::PmtuDiscover;

fn bind_group(spec: &DeviceSpec, ip: IpAddr, slots: u32) -> Result<Vec<UdpSocket>, String> {
    let addr = SocketAddr::new(ip, 4791);
    // Probe without SO_REUSEPORT first: joining a group someone else made
    // (another daemon of this user) would succeed silently and steer
    // nothing to us; a plain bind fails if anything owns the port.
    let probe = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))
        .map_err(|e| io_err("socket", e))?;
    if addr.is_ipv6() {
        let _ = probe.set_only_v6(true);
    }
    probe.bind(&addr.into()).map_err(|e| {
        format!(
            "device {}: cannot bind UDP {addr}: {e} (another rxe-emud, an in-process rxe-emu device, kernel rdma_rxe, or a process still holding a deleted device of this address owns it)",
            spec.name
        )
    })?;
    drop(probe);
    let mut socks = Vec::with_capacity(slots as usize);
    for i in 0..slots {
        let s = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))
            .map_err(|e| io_err("socket", e))?;
        s.set_reuse_port(true)
            .map_err(|e| io_err("SO_REUSEPORT", e))?;
        if addr.is_ipv6() {
            s.set_only_v6(true).map_err(|e| io_err("IPV6_V6ONLY", e))?;
        }
        let _ = s.set_recv_buffer_size(8 << 20);
        let _ = s.set_send_buffer_size(8 << 20);
        s.bind(&addr.into()).map_err(|e| {
            format!(
                "device {}: cannot bind slot {i} on UDP {addr}: {e}",
                spec.name
            )
        })?;
        s.set_nonblocking(true)
            .map_err(|e| io_err("O_NONBLOCK", e))?;
        if addr.is_ipv4() {
            // Slot 0 is the daemon's QP1: its CM MADs' ICRCs are computed
            // over IP ID 0, which Linux gives a DF datagram of an
            // unconnected socket only under IP_PMTUDISC_DO (the default,
            // WANT, sets DF but picks a random ID: every MAD would reach
            // kernel rxe with a bad ICRC and be dropped). A client's slot
            // gets the same from verbs-api; set it on every slot alike.
            nix::sys::socket::setsockopt(&s, PmtuDiscover, &(libc::IP_PMTUDISC_DO as usize))
                .map_err(|e| io_err("IP_MTU_DISCOVER", e))?;
        }
        socks.push(UdpSocket::from(s));
    }
    crate::steer::attach(&socks[0], slots).map_err(|e| io_err("SO_ATTACH_REUSEPORT_CBPF", e))?;
    Ok(socks)
}

/// Create the socket's directory if needed: private to the user (0700),
/// or, for a daemon serving every user, open to all (0755). An existing
/// directory is left as it is.
fn prepare_dir(path: &Path, any_user: bool) -> Result<(), String> {
    if let Some(dir) = path.parent() {
        if !dir.exists() {
            std::fs::create_dir_all(dir).map_err(|e| io_err(&dir.display().to_string(), e))?;
            let mode = if any_user { 0o755 } else { 0o700 };
            let _ = std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode));
        }
    }
    Ok(())
}

/// Bind a device for `spec`, unless its name or address is taken.
fn new_device(existing: &[Device], spec: &DeviceSpec, slots: u32) -> Result<Device, String> {
    if existing.iter().any(|d| d.spec.name == spec.name) {
        return Err(format!("device {} exists already", spec.name));
    }
    let (addr, netdev, netdev_mtu) = resolve(spec)?;
    if let Some(d) = existing.iter().find(|d| d.addr == addr) {
        return Err(format!(
            "device {}: address {addr} is device {}'s already",
            spec.name, d.spec.name
        ));
    }
    let socks = bind_group(spec, addr, slots)?;
    let n = socks.len();
    Ok(Device {
        spec: spec.clone(),
        addr,
        netdev,
        netdev_mtu,
        socks,
        owner: vec![None; n],
        generation: vec![0; n],
        inboxes: (0..n).map(|_| None).collect(),
        released: vec![0; n],
        stats: DeviceStats::default(),
        fault: None,
        cc: rxe_core::CcParams::default(),
        tracer: None,
        qp1_psn: 0,
    })
}

impl Server {
    /// Take the lock, bind every device and the control socket. Fails
    /// clearly if another daemon holds the socket path or a device's
    /// address.
    pub fn bind(cfg: ServerConfig, handle_signals: bool) -> Result<Server, String> {
        if !(2..=64).contains(&cfg.slots) {
            return Err(format!("slots must be 2..=64, not {}", cfg.slots));
        }
        if cfg.devices.is_empty() {
            return Err("no device to host".into());
        }
        prepare_dir(&cfg.socket_path, cfg.any_user)?;
        let lock_path = cfg.socket_path.with_extension("lock");
        let lock_file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .mode(0o600)
            .open(&lock_path)
            .map_err(|e| io_err(&lock_path.display().to_string(), e))?;
        let mut lock =
            Flock::lock(lock_file, FlockArg::LockExclusiveNonblock).map_err(|(mut f, _)| {
                let mut pid = String::new();
                let _ = f.read_to_string(&mut pid);
                format!(
                    "rxe-emud is already running on {} (pid {})",
                    cfg.socket_path.display(),
                    pid.trim()
                )
            })?;
        let _ = lock.set_len(0);
        let _ = write!(lock, "{}", std::process::id());
        let mut devices = Vec::new();
        let mut cm = CmService::default();
        for spec in &cfg.devices {
            let d = new_device(&devices, spec, cfg.slots)?;
            cm.add_device(&spec.name, d.addr, d.netdev_mtu);
            devices.push(d);
        }
        // We hold the lock: a socket file left there is stale.
        let _ = std::fs::remove_file(&cfg.socket_path);
        let listener = UnixListener::bind(&cfg.socket_path)
            .map_err(|e| io_err(&cfg.socket_path.display().to_string(), e))?;
        // Connecting needs write permission on the socket: the user only,
        // or everyone for a system-wide daemon (which still checks each
        // peer's credentials and gives each process its own slot and keys).
        let mode = if cfg.any_user { 0o666 } else { 0o600 };
        let _ = std::fs::set_permissions(&cfg.socket_path, std::fs::Permissions::from_mode(mode));
        listener
            .set_nonblocking(true)
            .map_err(|e| io_err("O_NONBLOCK", e))?;
        let signals = if handle_signals {
            let mut mask = SigSet::empty();
            for s in [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP] {
                mask.add(s);
            }
            mask.thread_block().map_err(|e| io_err("sigprocmask", e))?;
            Some(SignalFd::new(&mask).map_err(|e| io_err("signalfd", e))?)
        } else {
            None
        };
        Ok(Server {
            cfg,
            listener,
            _lock: lock,
            devices,
            clients: HashMap::new(),
            next_client: 1,
            release_seq: 0,
            signals,
            pending: HashMap::new(),
            next_tag: 1,
            cm,
            chans: HashMap::new(),
        })
    }

    /// Drop counters of device `name`.
    pub fn stats(&self, name: &str) -> Option<DeviceStats> {
        self.devices
            .iter()
            .find(|d| d.spec.name == name)
            .map(|d| d.stats)
    }

    /// Serve until `STOP`, a signal, or `stop` is set (checked at least
    /// every 100 ms). Removes the control socket on the way out.
    pub fn run(self, stop: &AtomicBool) -> Result<(), String> {
        self.run_with(stop, std::time::Duration::from_millis(100))
    }

    /// Serve until `STOP` or a signal (`rxe-emud`). With nothing due the
    /// daemon sleeps up to a second: each wake takes a CPU from the
    /// applications for a moment (in a TCG guest, a few hundred
    /// microseconds), and every deadline it has (CM timers, queries to
    /// processes) ends its wait on time anyway.
    pub fn run_until_stopped(self) -> Result<(), String> {
        self.run_with(&AtomicBool::new(false), std::time::Duration::from_secs(1))
    }

    /// [`Server::run`], sleeping at most `longest` when nothing is due.
    fn run_with(mut self, stop: &AtomicBool, longest: std::time::Duration) -> Result<(), String> {
        let mut buf = vec![0u8; 65536];
        let mut stopping = false;
        while !stopping && !stop.load(Ordering::SeqCst) {
            // What to watch: [signals], listener, clients, free slots.
            let client_ids: Vec<u64> = self.clients.keys().copied().collect();
            let free: Vec<(usize, usize)> = self
                .devices
                .iter()
                .enumerate()
                .flat_map(|(d, dev)| {
                    dev.owner
                        .iter()
                        .enumerate()
                        .filter(|(_, o)| o.is_none())
                        .map(move |(s, _)| (d, s))
                })
                .collect();
            let (sig_ready, listen_ready, client_ready, slot_ready) = {
                let mut fds = Vec::new();
                if let Some(s) = &self.signals {
                    fds.push(PollFd::new(s.as_fd(), PollFlags::POLLIN));
                }
                fds.push(PollFd::new(self.listener.as_fd(), PollFlags::POLLIN));
                for id in &client_ids {
                    let c = &self.clients[id];
                    let ev = if c.out.is_empty() {
                        PollFlags::POLLIN
                    } else {
                        PollFlags::POLLIN | PollFlags::POLLOUT
                    };
                    fds.push(PollFd::new(c.stream.as_fd(), ev));
                }
                for &(d, s) in &free {
                    fds.push(PollFd::new(
                        self.devices[d].socks[s].as_fd(),
                        PollFlags::POLLIN,
                    ));
                }
                // At most `longest`; sooner for a CM deadline or a query
                // to processes, and 5 ms while events wait for room in a
                // channel. Rounded up to whole milliseconds: a deadline
                // is never polled for in a busy loop.
                let now = std::time::Instant::now();
                let mut wait = longest;
                if let Some(t) = self.cm.poll_timeout() {
                    wait = wait.min(t.saturating_duration_since(now));
                }
                if let Some(t) = self.pending.values().map(|p| p.deadline).min() {
                    wait = wait.min(t.saturating_duration_since(now));
                }
                if self.cm_backlog() {
                    wait = wait.min(std::time::Duration::from_millis(5));
                }
                let ms = u16::try_from(wait.as_nanos().div_ceil(1_000_000)).unwrap_or(1000);
                match poll(&mut fds, PollTimeout::from(ms)) {
                    Ok(_) => {}
                    Err(nix::errno::Errno::EINTR) => continue,
                    Err(e) => return Err(io_err("poll", e)),
                }
                let ready: Vec<bool> = fds
                    .iter()
                    .map(|f| f.revents().is_some_and(|r| !r.is_empty()))
                    .collect();
                let mut i = 0;
                let sig = if self.signals.is_some() {
                    i += 1;
                    ready[0]
                } else {
                    false
                };
                let l = ready[i];
                i += 1;
                let c: Vec<u64> = client_ids
                    .iter()
                    .zip(&ready[i..i + client_ids.len()])
                    .filter(|(_, r)| **r)
                    .map(|(id, _)| *id)
                    .collect();
                i += client_ids.len();
                let s: Vec<(usize, usize)> = free
                    .iter()
                    .zip(&ready[i..])
                    .filter(|(_, r)| **r)
                    .map(|(x, _)| *x)
                    .collect();
                (sig, l, c, s)
            };
            if sig_ready {
                if let Some(s) = &self.signals {
                    if let Ok(Some(si)) = s.read_signal() {
                        eprintln!("rxe-emud: signal {}, stopping", si.ssi_signo);
                    }
                }
                break;
            }
            for (d, s) in slot_ready {
                self.drain(d, s, &mut buf);
            }
            if listen_ready {
                self.accept_all();
            }
            for id in client_ready {
                if let Some(c) = self.clients.get_mut(&id) {
                    write_out(c);
                }
                if self.clients.contains_key(&id) && self.serve(id) {
                    stopping = true;
                }
            }
            let now = std::time::Instant::now();
            let expired: Vec<u64> = self
                .pending
                .iter()
                .filter(|(_, p)| p.deadline <= now)
                .map(|(t, _)| *t)
                .collect();
            for t in expired {
                self.finish(t);
            }
            self.cm_tick();
        }
        let _ = std::fs::remove_file(&self.cfg.socket_path);
        Ok(())
    }

    /// Read and count every datagram waiting on a slot nobody owns.
    fn drain(&mut self, d: usize, s: usize, buf: &mut [u8]) {
        if s == 0 {
            while let Ok((n, src)) = self.devices[d].socks[0].recv_from(buf) {
                self.on_daemon_datagram(d, src, &buf[..n]);
            }
            return;
        }
        let dev = &mut self.devices[d];
        while let Ok(_n) = dev.socks[s].recv(buf) {
            dev.stats.no_owner += 1;
        }
    }

    fn accept_all(&mut self) {
        loop {
            let stream = match self.listener.accept() {
                Ok((s, _)) => s,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    eprintln!("rxe-emud: accept: {e}");
                    return;
                }
            };
            let cred = getsockopt(&stream, sockopt::PeerCredentials).ok();
            let (pid, uid) = cred.map_or((0, u32::MAX), |c| (c.pid(), c.uid()));
            if !self.cfg.any_user && uid != nix::unistd::getuid().as_raw() {
                let mut s = stream;
                let _ = s.write_all(
                    format!(
                        "ERR this rxe-emud serves uid {} only (start a system-wide daemon with --any-user)\n",
                        nix::unistd::getuid()
                    )
                    .as_bytes(),
                );
                continue;
            }
            if stream.set_nonblocking(true).is_err() {
                continue;
            }
            let id = self.next_client;
            self.next_client += 1;
            self.clients.insert(
                id,
                Client {
                    stream,
                    pid,
                    uid,
                    buf: Vec::new(),
                    slots: Vec::new(),
                    out: Vec::new(),
                    cm: false,
                },
            );
        }
    }

    /// Handle what client `id` sent. Returns true on `STOP`.
    fn serve(&mut self, id: u64) -> bool {
        let mut chunk = [0u8; 1024];
        let mut closed = false;
        {
            let c = self.clients.get_mut(&id).expect("polled client exists");
            // Bytes after the last newline: the line still being sent.
            let mut partial =
                c.buf.len() - c.buf.iter().rposition(|&b| b == b'\n').map_or(0, |p| p + 1);
            loop {
                match c.stream.read(&mut chunk) {
                    Ok(0) => {
                        closed = true;
                        break;
                    }
                    Ok(n) => {
                        c.buf.extend_from_slice(&chunk[..n]);
                        partial = match chunk[..n].iter().rposition(|&b| b == b'\n') {
                            Some(p) => n - p - 1,
                            None => partial + n,
                        };
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(_) => {
                        closed = true;
                        break;
                    }
                }
                // Many whole lines (a traced process's burst of packet
                // lines) are fine; one line longer than MAX_LINE is not:
                // nobody needs a request that long, it is a confused peer.
                if partial > MAX_LINE {
                    closed = true;
                    break;
                }
                if c.buf.len() >= 256 << 10 {
                    // Handle these lines first; the rest is read on the
                    // next round (the socket stays readable).
                    break;
                }
            }
        }
        let mut stop = false;
        // Answer every complete request, even from a client that has
        // already closed its side.
        let mut done = false;
        while !done {
            let c = self.clients.get_mut(&id).expect("client exists");
            let Some(nl) = c.buf.iter().position(|&b| b == b'\n') else {
                break;
            };
            let line: Vec<u8> = c.buf.drain(..=nl).collect();
            let line = String::from_utf8_lossy(&line).trim().to_string();
            if self.clients.get(&id).is_some_and(|c| c.cm) {
                self.serve_cm(id, &line);
                if !self.clients.contains_key(&id) {
                    return stop; // dropped: it read none of its answers
                }
                continue;
            }
            if line == "CM" {
                let c = self.clients.get_mut(&id).expect("client exists");
                c.cm = true;
                let _ = c.stream.write_all(b"OK\n");
                continue;
            }
            if let Some(reply) = line.strip_prefix("R ") {
                self.reply(id, reply);
                continue;
            }
            if let Some(kind @ ("P" | "N" | "E")) =
                line.get(..1).filter(|_| line.get(1..2) == Some(" "))
            {
                self.forward_trace(id, kind, &line[2..]);
                continue;
            }
            if self
                .devices
                .iter()
                .any(|d| d.tracer.is_some_and(|(c, _)| c == id))
            {
                continue; // a tracer has nothing more to ask
            }
            let mut words = line.split_whitespace();
            match (words.next(), words.next(), words.next()) {
                (Some(q @ ("STAT" | "QPS")), Some(dev), None) => {
                    let q = if q == "STAT" { Query::Stat } else { Query::Qps };
                    if let Err(e) = self.ask(id, dev, q, None) {
                        let c = self.clients.get_mut(&id).expect("client exists");
                        let _ = c.stream.write_all(format!("ERR {e}\n").as_bytes());
                        done = true;
                    } else {
                        // Answered (and closed) by `finish`.
                        return stop;
                    }
                }
                (Some("TRACE"), Some(dev), None) => {
                    if let Err(e) = self.start_trace(id, dev) {
                        let c = self.clients.get_mut(&id).expect("client exists");
                        let _ = c.stream.write_all(format!("ERR {e}\n").as_bytes());
                        done = true;
                    }
                }
                (Some("FAULT"), Some(dev), _) => {
                    let spec = line.splitn(3, ' ').nth(2).unwrap_or("").to_string();
                    if let Err(e) = self.ask(id, dev, Query::Fault, Some(spec)) {
                        let c = self.clients.get_mut(&id).expect("client exists");
                        let _ = c.stream.write_all(format!("ERR {e}\n").as_bytes());
                        done = true;
                    } else {
                        return stop;
                    }
                }
                (Some("CC"), Some("SHOW"), Some(dev)) => {
                    let text = self.cc_show(dev).unwrap_or_else(|e| format!("ERR {e}\n"));
                    let c = self.clients.get_mut(&id).expect("client exists");
                    let _ = c.stream.set_nonblocking(false);
                    let _ = c.stream.write_all(text.as_bytes());
                    done = true;
                }
                (Some("CC"), Some("SET"), Some(dev)) => {
                    let kvs = line.splitn(4, ' ').nth(3).unwrap_or("").to_string();
                    let asked = self
                        .cc_update(dev, &kvs)
                        .and_then(|spec| self.ask(id, dev, Query::Cc, Some(spec)));
                    if let Err(e) = asked {
                        let c = self.clients.get_mut(&id).expect("client exists");
                        let _ = c.stream.write_all(format!("ERR {e}\n").as_bytes());
                        done = true;
                    } else {
                        return stop;
                    }
                }
                (Some("INBOX"), Some(dev), Some(slot)) => {
                    self.send_inbox(id, dev, slot);
                    done = true;
                }
                (Some("OPEN"), Some(name), None) => {
                    if let Err(e) = self.open(id, name) {
                        let c = self.clients.get_mut(&id).expect("client exists");
                        let _ = c.stream.write_all(format!("ERR {e}\n").as_bytes());
                    }
                }
                (Some("LINK"), Some(op @ ("ADD" | "DEL" | "SHOW")), arg) => {
                    let reply = match (op, arg) {
                        ("ADD", Some(spec)) => self.link_add(spec),
                        ("DEL", Some(name)) => self.link_delete(name),
                        ("SHOW", name) => self.link_show(name),
                        _ => Err(format!("LINK {op} needs an argument")),
                    };
                    let text = reply.unwrap_or_else(|e| format!("ERR {e}\n"));
                    if let Some(c) = self.clients.get_mut(&id) {
                        let _ = c.stream.set_nonblocking(false);
                        let _ = c.stream.write_all(text.as_bytes());
                    }
                    done = true;
                }
                (Some("STATUS"), None, None) => {
                    let text = self.status();
                    let c = self.clients.get_mut(&id).expect("client exists");
                    let _ = c.stream.set_nonblocking(false);
                    let _ = c.stream.write_all(text.as_bytes());
                    done = true;
                }
                (Some("STOP"), None, None) => {
                    let c = self.clients.get_mut(&id).expect("client exists");
                    let _ = c.stream.write_all(b"OK stopping\n");
                    stop = true;
                    done = true;
                }
                _ => {
                    let c = self.clients.get_mut(&id).expect("client exists");
                    let shown: String = line.chars().take(60).collect();
                    let _ = c.stream.write_all(
                        format!("ERR unknown request {shown:?}: expected OPEN <device>, LINK ADD|DEL|SHOW, CC SHOW|SET, STATUS or STOP\n")
                            .as_bytes(),
                    );
                    done = true;
                }
            }
        }
        if done || closed {
            self.release(id);
        }
        stop
    }

    /// Ask every process holding a slot of device `name` (for CLI client
    /// `cli`); `spec` is the fault spec of a FAULT query.
    fn ask(
        &mut self,
        cli: u64,
        name: &str,
        query: Query,
        spec: Option<String>,
    ) -> Result<(), String> {
        let d = self
            .devices
            .iter()
            .position(|d| d.spec.name == name)
            .ok_or_else(|| format!("no device {name:?}"))?;
        let tag = self.next_tag;
        self.next_tag += 1;
        let (word, extra) = match query {
            Query::Stat => ("STAT", String::new()),
            Query::Qps => ("QPS", String::new()),
            Query::Fault => {
                let spec = spec.unwrap_or_default();
                self.devices[d].fault = Some(spec.clone()).filter(|s| !s.trim().is_empty());
                ("FAULT", format!(" {spec}"))
            }
            // The device's whole parameter set (defaults + overrides).
            Query::Cc => ("CC", format!(" {}", spec.unwrap_or_default())),
        };
        let mut owners: Vec<u64> = self.devices[d].owner.iter().flatten().copied().collect();
        owners.dedup();
        let mut waiting = Vec::new();
        for o in owners {
            if let Some(c) = self.clients.get_mut(&o) {
                if c.stream
                    .write_all(format!("{word} {tag}{extra}\n").as_bytes())
                    .is_ok()
                {
                    waiting.push(o);
                }
            }
        }
        self.pending.insert(
            tag,
            Pending {
                cli,
                query,
                dev: d,
                waiting,
                replies: Vec::new(),
                deadline: std::time::Instant::now() + QUERY_TIMEOUT,
            },
        );
        if self.pending[&tag].waiting.is_empty() {
            self.finish(tag);
        }
        Ok(())
    }

    /// Make CLI client `cli` the tracer of device `name`: every process
    /// of the device (and every later one) sends it what it sends and
    /// receives until `cli` goes away.
    fn start_trace(&mut self, cli: u64, name: &str) -> Result<(), String> {
        let d = self
            .devices
            .iter()
            .position(|d| d.spec.name == name)
            .ok_or_else(|| format!("no device {name:?}"))?;
        if let Some((other, _)) = self.devices[d].tracer {
            if self.clients.contains_key(&other) {
                return Err(format!("device {name} is already being traced"));
            }
        }
        let tag = self.next_tag;
        self.next_tag += 1;
        self.devices[d].tracer = Some((cli, tag));
        let header = format!("T {} {}\n", self.devices[d].spec.name, self.devices[d].addr);
        if let Some(c) = self.clients.get_mut(&cli) {
            c.out.extend_from_slice(header.as_bytes());
            write_out(c);
        }
        let owners: Vec<u64> = self.devices[d].owner.iter().flatten().copied().collect();
        for o in owners {
            if let Some(c) = self.clients.get_mut(&o) {
                let _ = c.stream.write_all(format!("TRACE {tag} on\n").as_bytes());
            }
        }
        Ok(())
    }

    /// A trace line from a process: to the device's tracer, with the slot.
    fn forward_trace(&mut self, from: u64, kind: &str, rest: &str) {
        let (tag, body) = rest.split_once(' ').unwrap_or((rest, ""));
        let Ok(tag) = tag.parse::<u64>() else { return };
        let Some(dev) = self
            .devices
            .iter()
            .find(|d| d.tracer.is_some_and(|(_, t)| t == tag))
        else {
            return; // a trace that ended
        };
        let slot = dev.owner.iter().position(|o| *o == Some(from)).unwrap_or(0);
        let cli = dev.tracer.map(|(c, _)| c).unwrap_or(0);
        if let Some(c) = self.clients.get_mut(&cli) {
            if c.out.len() < MAX_OUT {
                c.out
                    .extend_from_slice(format!("{kind} {slot} {body}\n").as_bytes());
                write_out(c);
            }
        }
    }

    /// A process answered (`<tag> <line>` or `<tag> END`).
    fn reply(&mut self, from: u64, reply: &str) {
        let (tag, rest) = reply.split_once(' ').unwrap_or((reply, ""));
        let Ok(tag) = tag.parse::<u64>() else { return };
        let Some(p) = self.pending.get_mut(&tag) else {
            return; // late, or for a fault set at open
        };
        if rest == "END" {
            p.waiting.retain(|w| *w != from);
            if p.waiting.is_empty() {
                self.finish(tag);
            }
        } else {
            match p.replies.iter_mut().find(|(c, _)| *c == from) {
                Some((_, lines)) => lines.push(rest.to_string()),
                None => p.replies.push((from, vec![rest.to_string()])),
            }
        }
    }

    /// Answer the CLI client of query `tag` and close it.
    fn finish(&mut self, tag: u64) {
        let Some(p) = self.pending.remove(&tag) else {
            return;
        };
        let dev = &self.devices[p.dev];
        let slot_of = |c: u64| dev.owner.iter().position(|o| *o == Some(c));
        let mut out = String::new();
        match p.query {
            Query::Stat => {
                // Totals in the order the first process listed them.
                let mut names: Vec<String> = Vec::new();
                let mut sums: HashMap<String, u64> = HashMap::new();
                for (_, lines) in &p.replies {
                    // A process's device line (pid=...) counts; its QP
                    // lines (qp=...) are shares of it.
                    let device_lines = lines.iter().filter(|l| l.starts_with("pid="));
                    for kv in device_lines.flat_map(|l| l.split_whitespace()) {
                        if let Some((k, v)) = kv.split_once('=') {
                            if k == "pid" {
                                continue;
                            }
                            // Words (placed_via) are a process's own.
                            let Ok(v) = v.parse::<u64>() else { continue };
                            if !sums.contains_key(k) {
                                names.push(k.to_string());
                            }
                            *sums.entry(k.to_string()).or_default() += v;
                        }
                    }
                }
                out += &format!("link {}/1", dev.spec.name);
                for k in &names {
                    out += &format!(" {k} {}", sums[k]);
                }
                out += &format!(
                    "\n  daemon dropped_no_owner {} dropped_daemon_slot {}\n",
                    dev.stats.no_owner, dev.stats.daemon_slot
                );
                for (c, lines) in &p.replies {
                    for l in lines {
                        if l.starts_with("qp=") {
                            out += &format!("    {}\n", l.replace('=', " "));
                        } else {
                            let slot = slot_of(*c).map_or("-".into(), |s| s.to_string());
                            out += &format!("  slot {slot} {}\n", l.replace('=', " "));
                        }
                    }
                }
            }
            Query::Qps => {
                for (c, lines) in &p.replies {
                    for l in lines {
                        let slot = slot_of(*c).map_or("-".into(), |s| s.to_string());
                        // key=value pairs read as "key value" (the rdma
                        // tool's style); the error text stays as written.
                        let (kv, err) = match l.split_once(" error=") {
                            Some((kv, e)) => (kv, format!(" error: {e}")),
                            None => (l.as_str(), String::new()),
                        };
                        out += &format!(
                            "link {}/1 slot {slot} {}{err}\n",
                            dev.spec.name,
                            kv.replace('=', " ")
                        );
                    }
                }
                if out.is_empty() {
                    out += &format!("link {}/1: no QPs\n", dev.spec.name);
                }
            }
            Query::Fault | Query::Cc => {
                // A setting every process applies: their refusals, then
                // what is set and how many took it.
                let ok = p
                    .replies
                    .iter()
                    .filter(|(_, l)| l.iter().any(|x| x == "OK"))
                    .count();
                for (_, lines) in &p.replies {
                    for l in lines.iter().filter(|l| l.starts_with("ERR")) {
                        out += &format!("{l}\n");
                    }
                }
                let (what, set) = if p.query == Query::Fault {
                    ("fault", dev.fault.clone().unwrap_or_else(|| "off".into()))
                } else {
                    let set: Vec<String> = dev
                        .cc
                        .overrides()
                        .iter()
                        .map(|(k, v)| format!("{k}={v}"))
                        .collect();
                    let set = if set.is_empty() {
                        "all defaults".to_string()
                    } else {
                        set.join(" ")
                    };
                    ("cc", set)
                };
                out += &format!(
                    "{what} on {}: {set} ({} of {} processes applied it; processes that open it later get it too)\n",
                    dev.spec.name,
                    ok,
                    p.replies.len() + p.waiting.len()
                );
            }
        }
        for w in &p.waiting {
            out += &format!("  no answer from the process in slot {:?}\n", slot_of(*w));
        }
        if let Some(c) = self.clients.get_mut(&p.cli) {
            let _ = c.stream.set_nonblocking(false);
            let _ = c.stream.write_all(out.as_bytes());
        }
        self.release(p.cli);
    }

    /// Give client `id` a slot of device `name` and send its socket.
    fn open(&mut self, id: u64, name: &str) -> Result<(), String> {
        let d = self
            .devices
            .iter()
            .position(|d| d.spec.name == name)
            .ok_or_else(|| {
                let names: Vec<&str> = self.devices.iter().map(|d| d.spec.name.as_str()).collect();
                format!("no device {name:?} (this daemon has {})", names.join(", "))
            })?;
        let dev = &mut self.devices[d];
        let slot = (1..dev.socks.len())
            .filter(|&s| dev.owner[s].is_none())
            .min_by_key(|&s| dev.released[s])
            .ok_or_else(|| {
                format!(
                    "device {name} has no free slot ({} processes have it open)",
                    dev.socks.len() - 1
                )
            })?;
        // Whatever waited for the previous owner is stale: count it.
        let mut scratch = vec![0u8; 65536];
        while dev.socks[slot].recv(&mut scratch).is_ok() {
            dev.stats.no_owner += 1;
        }
        let gen = dev.generation[slot];
        dev.generation[slot] = gen.wrapping_add(1);
        let lo = (slot as u32) << 16 | 0x11;
        let hi = (slot as u32) << 16 | 0xffff;
        let first = lo + (gen.wrapping_mul(0x1000) % (hi - lo + 1));
        let seed = (u64::from(std::process::id()) << 32)
            ^ (id << 16)
            ^ slot as u64
            ^ std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |t| t.as_nanos() as u64);
        let info = DeviceInfo {
            name: dev.spec.name.clone(),
            addr: dev.addr,
            netdev_mtu: dev.netdev_mtu,
            slot: slot as u32,
            qpn_lo: lo,
            qpn_hi: hi,
            qpn_first: first,
            key_seed: seed,
            like: dev.spec.like,
            cc_params: dev
                .cc
                .overrides()
                .into_iter()
                .map(|(k, v)| (k.to_string(), v))
                .collect(),
            any_user: self.cfg.any_user,
        };
        // The slot's inbox for the same-host path, new for each owner (a
        // sender still holding the last owner's sees it closed).
        let inbox = local_link::InboxFile::create(
            &format!("rxe-emu {name} slot {slot}"),
            dev.socks.len(),
            local_link::DEFAULT_RING_SIZE,
        );
        if let Err(e) = &inbox {
            eprintln!("rxe-emud: device {name} slot {slot}: no same-host inbox ({e}); its packets go by UDP");
        }
        dev.inboxes[slot] = inbox.ok();
        let mut fds = vec![dev.socks[slot].as_raw_fd()];
        if let Some(i) = &dev.inboxes[slot] {
            fds.extend([i.memfd().as_raw_fd(), i.eventfd().as_raw_fd()]);
        }
        let c = self.clients.get_mut(&id).expect("client exists");
        if let Err(e) = fdpass::send_line_with_fds(&c.stream, &info.to_line(), &fds) {
            dev.inboxes[slot] = None;
            return Err(format!("sending the slot socket: {e}"));
        }
        dev.owner[slot] = Some(id);
        c.slots.push((d, slot));
        if let Some(f) = &dev.fault {
            let _ = c.stream.write_all(format!("FAULT 0 {f}\n").as_bytes());
        }
        if let Some((_, tag)) = dev.tracer {
            let _ = c.stream.write_all(format!("TRACE {tag} on\n").as_bytes());
        }
        Ok(())
    }

    /// `INBOX <device> <slot>`: the fds of that slot's same-host inbox
    /// (`INBOX <slot>` and a memfd and an eventfd), or `NONE <why>` when
    /// nobody owns the slot or it has no inbox (then UDP is the way).
    fn send_inbox(&mut self, id: u64, name: &str, slot: &str) {
        let c = self.clients.get(&id).expect("client exists");
        let Some(dev) = self.devices.iter().find(|d| d.spec.name == name) else {
            let _ = (&c.stream).write_all(format!("NONE no device {name:?}\n").as_bytes());
            return;
        };
        let inbox = slot
            .parse::<usize>()
            .ok()
            .and_then(|s| dev.inboxes.get(s))
            .and_then(|i| i.as_ref());
        let sent = match inbox {
            Some(i) => fdpass::send_line_with_fds(
                &c.stream,
                &format!("INBOX {slot}"),
                &[i.memfd().as_raw_fd(), i.eventfd().as_raw_fd()],
            ),
            None => (&c.stream).write_all(
                format!("NONE slot {slot} of {name} has no inbox (no owner)\n").as_bytes(),
            ),
        };
        let _ = sent;
    }

    /// Client `id` is gone: free its slots.
    fn release(&mut self, id: u64) {
        let Some(c) = self.clients.remove(&id) else {
            return;
        };
        if c.cm {
            self.release_cm(id);
        }
        // Queries waiting for it finish without it.
        let tags: Vec<u64> = self
            .pending
            .iter()
            .filter(|(_, p)| p.waiting.contains(&id))
            .map(|(t, _)| *t)
            .collect();
        for t in &tags {
            if let Some(p) = self.pending.get_mut(t) {
                p.waiting.retain(|w| *w != id);
            }
        }
        for (d, s) in c.slots {
            self.release_seq += 1;
            let dev = &mut self.devices[d];
            dev.owner[s] = None;
            // Dropping it marks it closed for the senders that hold it.
            dev.inboxes[s] = None;
            dev.released[s] = self.release_seq;
        }
        for t in tags {
            if self.pending.get(&t).is_some_and(|p| p.waiting.is_empty()) {
                self.finish(t);
            }
        }
        // A tracer that left: the processes stop sending.
        for d in 0..self.devices.len() {
            if let Some((cli, tag)) = self.devices[d].tracer {
                if cli == id {
                    self.devices[d].tracer = None;
                    let owners: Vec<u64> =
                        self.devices[d].owner.iter().flatten().copied().collect();
                    for o in owners {
                        if let Some(c) = self.clients.get_mut(&o) {
                            let _ = c.stream.write_all(format!("TRACE {tag} off\n").as_bytes());
                        }
                    }
                }
            }
        }
    }

    /// `LINK ADD NAME=ADDR[/MTU]` or `NAME=netdev:IF`: host one more device.
    fn link_add(&mut self, spec: &str) -> Result<String, String> {
        let spec: DeviceSpec = spec.parse()?;
        let dev = new_device(&self.devices, &spec, self.cfg.slots)?;
        self.cm.add_device(&spec.name, dev.addr, dev.netdev_mtu);
        self.devices.push(dev);
        let line = self.link_line(self.devices.len() - 1);
        eprintln!("rxe-emud: added {line}");
        Ok(format!("OK {line}\n"))
    }

    /// `LINK DEL NAME`: remove a device. As when kernel rxe's link is
    /// deleted under its users, every process that has it open gets
    /// DEVICE_FATAL (a `GONE` line, then the end of its connection) and
    /// its QPs go to ERR; a trace of it ends.
    fn link_delete(&mut self, name: &str) -> Result<String, String> {
        let d = self
            .devices
            .iter()
            .position(|d| d.spec.name == name)
            .ok_or_else(|| format!("no device {name:?}"))?;
        // Questions about it are answered with what came in so far.
        let tags: Vec<u64> = self
            .pending
            .iter()
            .filter(|(_, p)| p.dev == d)
            .map(|(t, _)| *t)
            .collect();
        for t in tags {
            self.finish(t);
        }
        let mut users: Vec<u64> = self.devices[d].owner.iter().flatten().copied().collect();
        users.extend(self.devices[d].tracer.map(|(c, _)| c));
        users.sort_unstable();
        users.dedup();
        let why = format!("device {name} was deleted (rxe-emu link delete)");
        for u in &users {
            if let Some(c) = self.clients.get_mut(u) {
                let _ = c.stream.write_all(format!("GONE {why}\n").as_bytes());
            }
            self.release(*u);
        }
        self.devices.remove(d);
        self.cm.remove_device(name);
        self.flush_cm();
        for c in self.clients.values_mut() {
            for (dd, _) in c.slots.iter_mut() {
                if *dd > d {
                    *dd -= 1;
                }
            }
        }
        for p in self.pending.values_mut() {
            if p.dev > d {
                p.dev -= 1;
            }
        }
        eprintln!("rxe-emud: {why}; {} processes had it open", users.len());
        Ok(format!(
            "OK link {name} deleted ({} processes had it open)\n",
            users.len()
        ))
    }

    /// `LINK SHOW [NAME]`: one line per device, in the `rdma link` style.
    fn link_show(&self, name: Option<&str>) -> Result<String, String> {
        let mut out = String::new();
        for (i, d) in self.devices.iter().enumerate() {
            if name.is_none_or(|n| n == d.spec.name) {
                out += &self.link_line(i);
                out.push('\n');
            }
        }
        match name {
            Some(n) if out.is_empty() => Err(format!("no device {n:?}")),
            _ => Ok(out),
        }
    }

    fn link_line(&self, d: usize) -> String {
        let dev = &self.devices[d];
        format!(
            "link {}/1 state ACTIVE physical_state LINK_UP netdev {} addr {} netdev_mtu {} like {} processes {}",
            dev.spec.name,
            dev.netdev.as_deref().unwrap_or("-"),
            dev.addr,
            dev.netdev_mtu,
            dev.spec.like.name(),
            dev.owner.iter().filter(|o| o.is_some()).count()
        )
    }

    fn device_index(&self, name: &str) -> Result<usize, String> {
        self.devices
            .iter()
            .position(|d| d.spec.name == name)
            .ok_or_else(|| format!("no device {name:?}"))
    }

    /// `CC SHOW <dev>`: the model and every parameter with its value,
    /// default, range and meaning.
    fn cc_show(&self, name: &str) -> Result<String, String> {
        let dev = &self.devices[self.device_index(name)?];
        let like = dev.spec.like.name();
        let mut out = match dev.spec.like.cc {
            rxe_core::CcModel::RxeLike => format!(
                "link {name}/1 like {like}: kernel rxe's congestion behaviour (Not-ECT, CE ignored, CNPs dropped); these parameters apply to devices added with --like mlx5\n"
            ),
            rxe_core::CcModel::Mlx5Like => format!(
                "link {name}/1 like mlx5: ECT(0) out, a CNP for each CE-marked data packet (at most one per min_time_between_cnps per QP), DCQCN pacing each QP\n"
            ),
        };
        out += &format!(
            "{:<30} {:>10} {:>10}  {:<18} {}\n",
            "parameter", "value", "default", "range", "meaning"
        );
        for spec in rxe_core::CcParams::specs() {
            let max = match spec.max {
                rxe_core::cc::Max::Value(v) => v.to_string(),
                rxe_core::cc::Max::LineRate => format!("{} (line)", dev.cc.line_rate_mbps),
            };
            let value = dev.cc.get(spec.name).unwrap_or(spec.default);
            out += &format!(
                "{:<30} {:>10} {:>10}  {:<18} {}{}\n",
                spec.name,
                value,
                spec.default,
                format!("{}..={max}", spec.min),
                spec.what,
                if value != spec.default { " (set)" } else { "" }
            );
        }
        Ok(out)
    }

    /// `CC SET <dev> name=value ...`: check every assignment against the
    /// parameter's range (all or nothing), keep them for processes that
    /// open the device later, and return the device's whole parameter set
    /// (its overrides, in spec order) for the processes that have it open.
    fn cc_update(&mut self, name: &str, kvs: &str) -> Result<String, String> {
        let d = self.device_index(name)?;
        let dev = &self.devices[d];
        if dev.spec.like.cc != rxe_core::CcModel::Mlx5Like {
            return Err(format!(
                "device {name} is kernel-rxe-like: it has no congestion control to set (add a device with --like mlx5)"
            ));
        }
        if kvs.split_whitespace().next().is_none() {
            return Err(
                "cc set needs NAME=VALUE assignments (rxe-emu cc show lists the names)".into(),
            );
        }
        let mut p = dev.cc.clone();
        for kv in kvs.split_whitespace() {
            let (k, v) = kv
                .split_once('=')
                .ok_or_else(|| format!("{kv:?} is not NAME=VALUE"))?;
            let v: u64 = match v {
                "default" => rxe_core::CcParams::specs()
                    .iter()
                    .find(|s| s.name == k)
                    .map(|s| u64::from(s.default))
                    .ok_or_else(|| rxe_core::CcParamError::Unknown(k.to_string()).to_string())?,
                _ => v.parse().map_err(|_| {
                    format!("{k}={v}: the value is not a whole number (or \"default\")")
                })?,
            };
            p.set(k, v).map_err(|e| e.to_string())?;
        }
        // Processes rebuild the set from the defaults in spec order: the
        // result must pass that too (a floor above a lowered line rate
        // would not).
        let overrides = p.overrides();
        rxe_core::CcParams::with_overrides(overrides.iter().map(|(k, v)| (*k, u64::from(*v))))
            .map_err(|e| e.to_string())?;
        self.devices[d].cc = p;
        Ok(overrides
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(" "))
    }

    /// The devices hosted now: name and address.
    pub fn devices(&self) -> Vec<(String, IpAddr)> {
        self.devices
            .iter()
            .map(|d| (d.spec.name.clone(), d.addr))
            .collect()
    }

    fn status(&self) -> String {
        let mut out = format!(
            "rxe-emud pid {} socket {}\n",
            std::process::id(),
            self.cfg.socket_path.display()
        );
        for dev in &self.devices {
            let used = dev.owner.iter().filter(|o| o.is_some()).count();
            out += &format!(
                "device {} addr {} netdev_mtu {} slots {}/{} dropped_no_owner {} dropped_daemon_slot {} cm_mads_received {} cm_mads_sent {} netdev {}\n",
                dev.spec.name,
                dev.addr,
                dev.netdev_mtu,
                used,
                dev.socks.len() - 1,
                dev.stats.no_owner,
                dev.stats.daemon_slot,
                dev.stats.cm_received,
                dev.stats.cm_sent,
                dev.netdev.as_deref().unwrap_or("-")
            );
            for (s, o) in dev.owner.iter().enumerate() {
                if let Some(c) = o.and_then(|id| self.clients.get(&id)) {
                    out += &format!(
                        "  slot {s} pid {} uid {} qpns {:#x}-{:#x}\n",
                        c.pid,
                        c.uid,
                        (s as u32) << 16 | 0x11,
                        (s as u32) << 16 | 0xffff
                    );
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_ipv4_slot_sends_with_df_so_qp1_mads_leave_with_ip_id_0() {
        let spec: DeviceSpec = "rxe0=127.0.61.1".parse().unwrap();
        let socks = bind_group(&spec, "127.0.61.1".parse().unwrap(), 4).unwrap();
        for s in &socks {
            let v = getsockopt(s, PmtuDiscover).unwrap();
            assert_eq!(v, libc::IP_PMTUDISC_DO as usize);
        }
    }

    #[test]
    fn device_specs_parse_print_and_refuse_nonsense() {
        for text in [
            "rxe0=10.0.0.1",
            "rxe1=::1/9000",
            "rxe2=netdev:eth0",
            "rxe3=10.0.0.3,like=mlx5",
            "rxe4=10.0.0.4/1500,like=mlx5",
            "rxe5=netdev:eth1,like=mlx5",
            "rxe6=10.0.0.6,like=6.1",
            "rxe7=netdev:eth2,like=6.12",
        ] {
            let s: DeviceSpec = text.parse().unwrap();
            assert_eq!(s.to_string(), text);
        }
        let s: DeviceSpec = "rxe0=10.0.0.1".parse().unwrap();
        assert_eq!(s.like, rxe_core::Like::default());
        // like=rxe (and like=7.2, the newest kernel) is the default, so it
        // prints as before.
        for l in ["rxe", "7.2"] {
            let s: DeviceSpec = format!("rxe0=10.0.0.1,like={l}").parse().unwrap();
            assert_eq!(
                (s.like, s.to_string()),
                (rxe_core::Like::default(), "rxe0=10.0.0.1".into())
            );
        }
        let s: DeviceSpec = "rxe0=netdev:lo,like=mlx5".parse().unwrap();
        assert_eq!(s.like.cc, rxe_core::CcModel::Mlx5Like);
        let s: DeviceSpec = "rxe0=10.0.0.1,like=6.1".parse().unwrap();
        assert_eq!(s.like.release, rxe_core::RxeRelease::V6_1);
        for bad in ["cx7", "6.2", "6"] {
            assert!(format!("rxe0=10.0.0.1,like={bad}")
                .parse::<DeviceSpec>()
                .unwrap_err()
                .contains("expected rxe (kernel rxe 7.2), 6.1, 6.12, 7.2 or mlx5"));
        }
        assert!("rxe0=10.0.0.1,speed=100"
            .parse::<DeviceSpec>()
            .unwrap_err()
            .contains("unknown option"));
        let s: DeviceSpec = "rxe2=netdev:veth-a".parse().unwrap();
        assert_eq!(s.binding, Binding::Netdev("veth-a".into()));
        for bad in [
            "rxe0",
            "=10.0.0.1",
            "rxe0=10.0.0.300",
            "rxe0=10.0.0.1/7",
            "rxe0=10.0.0.1/x",
            "rxe0=netdev:",
            "rxe0=netdev:a-name-too-long-for-linux",
            "my dev=10.0.0.1",
        ] {
            assert!(bad.parse::<DeviceSpec>().is_err(), "{bad}");
        }
    }

    #[test]
    fn a_netdev_gives_its_address_and_mtu_and_a_missing_one_is_an_error() {
        let lo: DeviceSpec = "d=netdev:lo".parse().unwrap();
        let (addr, netdev, mtu) = resolve(&lo).unwrap();
        assert!(addr.is_loopback(), "{addr}");
        assert_eq!(netdev.as_deref(), Some("lo"));
        assert_eq!(Some(mtu), netdev_mtu_of("lo"));
        let none: DeviceSpec = "d=netdev:nosuchif9".parse().unwrap();
        assert!(resolve(&none).unwrap_err().contains("no netdev"));
        let a: DeviceSpec = "d=127.0.77.1/1500".parse().unwrap();
        let (addr, netdev, mtu) = resolve(&a).unwrap();
        assert_eq!(
            (addr.to_string(), netdev.as_deref(), mtu),
            ("127.0.77.1".into(), Some("lo"), 1500)
        );
    }
}
