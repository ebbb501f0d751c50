//! The RDMA connection manager of `rxe-emud`: what kernel `rdma_cm`
//! (`drivers/infiniband/core/cma.c`) and ucma are to kernel rxe.
//!
//! [`CmService`] is sans IO, like the engine: requests of
//! [`crate::cmproto`], CM MADs received on QP1 and time go in; MADs to
//! send, events for event channels and the next deadline come out. The
//! server feeds it and does the I/O (QP1 datagrams on slot 0 of each
//! device, the channels' sockets).
//!
//! It keeps the rdma_cm ids of every process (port spaces, bound ports,
//! listeners, states) and, per device, an IB CM [`Endpoint`] that speaks
//! REQ/REP/RTU/REJ/DREQ/DREP (and SIDR for UD ids) on the wire exactly as
//! kernel cm does. The service IDs and the private-data header are
//! rdma_cm's ([`wire::cma`]), so kernel rdma_cm accepts our REQs and we
//! accept its.
//!
//! Deviations from the kernel, on purpose:
//! - the listen backlog is not enforced (kernel ucma rejects a REQ when
//!   `backlog` CONNECT_REQUEST events are unacknowledged; the daemon does
//!   not see acknowledgements);
//! - addresses resolve without ARP: the device is the one that owns the
//!   source address the host's routing picks for the destination.

use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::Instant;

use rdma_cm_core::timing::{CMA_CM_RESPONSE_TIMEOUT, CMA_IBOE_PACKET_LIFETIME, CMA_MAX_CM_RETRIES};
use rdma_cm_core::SidrParams;
use rdma_cm_core::{
    AcceptParams, Config, ConnId, ConnectParams, Endpoint, Event as EpEvent, Transmit,
};
use wire::cm::sidr_rep::SidrStatus;
use wire::cm::{PathRepr, RejectReason};
use wire::cma::{self, CmaHeaderRepr, PortSpace};

use crate::cmproto::{event, Addrs, CmErr, CmEvent, ConnParam, Request};

/// The Q_Key rdma_cm gives UD ids of `RDMA_PS_UDP` and multicast groups
/// (kernel `RDMA_UDP_QKEY`).
pub const RDMA_UDP_QKEY: u32 = 0x0123_4567;

/// The service timeout of rdma_cm's MRAs (kernel `CMA_CM_MRA_SETTING`
/// without its delay flag: 24, about 69 s).
const CMA_CM_MRA_TIMEOUT: u8 = 24;
/// Event channels one process may hold (each is a socket in the daemon).
pub const MAX_CHANNELS: usize = 1024;
/// rdma_cm ids one process may hold (connection requests that arrive
/// for its listeners count too; past this they are rejected).
pub const MAX_IDS: usize = 65536;
/// `enum ibv_qp_type`: RC.
const QPT_RC: u32 = 2;
/// `enum ibv_qp_type`: UD.
const QPT_UD: u32 = 4;
/// `IBV_EVENT_COMM_EST`.
const IBV_EVENT_COMM_EST: u32 = 9;
/// First and last ephemeral port (Linux `ip_local_port_range`).
const EPHEMERAL: (u16, u16) = (32768, 60999);

/// The GID of an address as RoCEv2 names it.
pub fn gid_of(ip: IpAddr) -> [u8; 16] {
    match ip {
        IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
        IpAddr::V6(v6) => v6.octets(),
    }
}

/// The address a RoCEv2 GID names.
pub fn ip_of_gid(gid: [u8; 16]) -> IpAddr {
    let v6 = Ipv6Addr::from(gid);
    match v6.to_ipv4_mapped() {
        Some(v4) => IpAddr::V4(v4),
        None => IpAddr::V6(v6),
    }
}

/// The path MTU rdma_cm gives a RoCE route (`enum ibv_mtu`): the largest
/// IB MTU that fits the netdev MTU less the RoCE headers (kernel
/// `iboe_get_mtu`), at most the port's active MTU (kernel rxe: netdev MTU
/// less 80), and at least 256.
pub fn path_mtu(netdev_mtu: u32) -> u8 {
    let fit = |room: u32| -> u8 { (1..=5u8).rev().find(|m| (128u32 << m) <= room).unwrap_or(1) };
    fit(netdev_mtu.saturating_sub(96)).min(fit(netdev_mtu.saturating_sub(80)))
}

/// Kernel rdma_cm's flow label of a RoCEv2 path (`cma_get_roce_udp_flow_label`
/// for IPv4 ids): `sport * 31 + dport`, 20 bits.
fn flow_label(sport: u16, dport: u16) -> u32 {
    (u32::from(sport) * 31 + u32::from(dport)) & 0xf_ffff
}

fn any(ip: IpAddr) -> bool {
    ip.is_unspecified()
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum St {
    Idle,
    AddrBound,
    AddrResolved,
    RouteResolved,
    Listen,
    /// REQ (or SIDR_REQ) sent.
    Connect,
    /// CONNECT_REQUEST reported, not answered yet.
    ReqRcvd,
    /// REP sent, waiting for the RTU.
    Accepted,
    /// CONNECT_RESPONSE reported; the library sends ESTABLISH.
    RepRcvd,
    Established,
    /// Rejected, unreachable or disconnected: only destroy is left.
    Done,
}

#[derive(Debug)]
struct Id {
    owner: u64,
    chan: u64,
    ps: PortSpace,
    qp_type: u32,
    state: St,
    /// Bound address and port (holds the port while `Some`, unless
    /// `child`).
    src: Option<(IpAddr, u16)>,
    /// Made by a connection request: it shares its listener's address
    /// but owns no port (kernel rdma_cm puts only bound ids on a port's
    /// bind list), so the port can be bound again once the listener is
    /// gone, as perftest's `-R` server does.
    child: bool,
    dst: Option<(IpAddr, u16)>,
    /// Index into the service's devices, by name.
    device: Option<String>,
    reuseaddr: bool,
    afonly: bool,
    tos: u8,
    conn: Option<ConnId>,
    mcast: Vec<IpAddr>,
}

struct Device {
    name: String,
    addr: IpAddr,
    mtu: u8,
    ep: Endpoint,
    /// Service IDs `ep` listens on.
    listening: Vec<u64>,
}

/// A MAD to send: from QP1 of the device at `from` to QP1 at `to`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MadOut {
    /// The sending device's name.
    pub device: String,
    /// Destination address (from the GID).
    pub to: IpAddr,
    /// The MAD.
    pub mad: [u8; wire::mad::MAD_LEN],
}

/// The connection manager of every device of the daemon. See the module
/// documentation.
pub struct CmService {
    devices: Vec<Device>,
    ids: HashMap<u64, Id>,
    /// Channel -> owner.
    chans: HashMap<u64, u64>,
    next: u64,
    /// (device, comm ID) -> id.
    conns: HashMap<(String, u32), u64>,
    events: VecDeque<(u64, CmEvent)>,
    out: VecDeque<MadOut>,
    seed: u64,
    next_port: u16,
}

fn err(errno: i32, msg: impl Into<String>) -> CmErr {
    CmErr::new(errno, msg)
}

fn ep_err(e: rdma_cm_core::CmError) -> CmErr {
    let errno = match e {
        rdma_cm_core::CmError::PrivateDataTooLong { .. } => libc::EINVAL,
        rdma_cm_core::CmError::ServiceIdInUse(_) => libc::EADDRINUSE,
        _ => libc::EINVAL,
    };
    err(errno, e.to_string())
}

/// A random 64-bit number from the standard library's hasher keys.
fn random_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(0x5eed);
    h.finish()
}

impl Default for CmService {
    fn default() -> Self {
        Self::new(random_u64())
    }
}

impl CmService {
    /// A service without devices; `seed` picks comm IDs, TIDs and
    /// ephemeral ports (tests fix it).
    pub fn new(seed: u64) -> CmService {
        let span = u64::from(EPHEMERAL.1 - EPHEMERAL.0) + 1;
        CmService {
            devices: Vec::new(),
            ids: HashMap::new(),
            chans: HashMap::new(),
            next: 1,
            conns: HashMap::new(),
            events: VecDeque::new(),
            out: VecDeque::new(),
            seed,
            next_port: EPHEMERAL.0 + (seed % span) as u16,
        }
    }

    /// A device appears (`rxe-emu link add`, or at start).
    pub fn add_device(&mut self, name: &str, addr: IpAddr, netdev_mtu: u32) {
        let mac = wire::frame::mac_for(addr);
        let eui = [
            mac[0] ^ 2,
            mac[1],
            mac[2],
            0xff,
            0xfe,
            mac[3],
            mac[4],
            mac[5],
        ];
        let n = self.devices.len() as u64 + 1;
        let r = self
            .seed
            .wrapping_mul(0x9e37_79b9_7f4a_7c15)
            .rotate_left(n as u32 * 7)
            ^ n;
        let mut ep = Endpoint::new(Config {
            local_ca_guid: u64::from_be_bytes(eui),
            ack_delay: rdma_cm_core::timing::RXE_ACK_DELAY,
            hi_tid: (r >> 32) as u32 | 1,
            comm_id_operand: r as u32,
        });
        // Listeners bound to any address listen on every device.
        let mut listening = self.listened_sids(None);
        listening.sort_unstable();
        listening.dedup();
        listening.retain(|sid| ep.listen(*sid).is_ok());
        self.devices.push(Device {
            name: name.to_string(),
            addr,
            mtu: path_mtu(netdev_mtu),
            ep,
            listening,
        });
    }

    /// A device goes (`rxe-emu link delete`): its ids get
    /// DEVICE_REMOVAL, as kernel rdma_cm reports it.
    pub fn remove_device(&mut self, name: &str) {
        self.devices.retain(|d| d.name != name);
        self.conns.retain(|(d, _), _| d != name);
        let ids: Vec<u64> = self
            .ids
            .iter()
            .filter(|(_, i)| i.device.as_deref() == Some(name))
            .map(|(k, _)| *k)
            .collect();
        for id in ids {
            if let Some(i) = self.ids.get_mut(&id) {
                i.conn = None;
                i.state = St::Done;
            }
            self.emit(id, event::DEVICE_REMOVAL, 0, None);
        }
    }

    /// A new event channel for `owner`.
    pub fn new_channel(&mut self, owner: u64) -> Result<u64, CmErr> {
        if self.chans.values().filter(|o| **o == owner).count() >= MAX_CHANNELS {
            return Err(err(
                libc::EMFILE,
                format!("a process may have {MAX_CHANNELS} event channels"),
            ));
        }
        let c = self.alloc();
        self.chans.insert(c, owner);
        Ok(c)
    }

    /// `owner` is gone (its command connection closed): destroy its ids
    /// (DREQ, REJ as the CM does for a destroyed id) and channels.
    pub fn drop_owner(&mut self, now: Instant, owner: u64) {
        let ids: Vec<u64> = self
            .ids
            .iter()
            .filter(|(_, i)| i.owner == owner)
            .map(|(k, _)| *k)
            .collect();
        for id in ids {
            self.destroy(now, id);
        }
        self.chans.retain(|_, o| *o != owner);
    }

    /// Channels of `owner` (to close their sockets).
    pub fn channels_of(&self, owner: u64) -> Vec<u64> {
        self.chans
            .iter()
            .filter(|(_, o)| **o == owner)
            .map(|(c, _)| *c)
            .collect()
    }

    /// The next event, with the channel it goes to.
    pub fn poll_event(&mut self) -> Option<(u64, CmEvent)> {
        self.events.pop_front()
    }

    /// The next MAD to send.
    pub fn poll_transmit(&mut self) -> Option<MadOut> {
        self.out.pop_front()
    }

    /// The earliest CM deadline.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.devices
            .iter()
            .filter_map(|d| d.ep.poll_timeout())
            .min()
    }

    /// Time passes.
    pub fn handle_timeout(&mut self, now: Instant) {
        for d in 0..self.devices.len() {
            self.devices[d].ep.handle_timeout(now);
            self.pump(now, d);
        }
    }

    /// A CM MAD arrived on QP1 of device `name` from `src`.
    pub fn handle_mad(&mut self, now: Instant, name: &str, src: IpAddr, mad: &[u8]) {
        let Some(d) = self.devices.iter().position(|x| x.name == name) else {
            return;
        };
        self.devices[d].ep.handle_mad(now, gid_of(src), mad);
        self.pump(now, d);
    }

    /// MADs the endpoints dropped (malformed, unmatched, duplicates).
    pub fn dropped(&self) -> u64 {
        self.devices.iter().map(|d| d.ep.dropped()).sum()
    }

    fn alloc(&mut self) -> u64 {
        let n = self.next;
        self.next += 1;
        n
    }

    fn dev(&self, name: &str) -> Option<usize> {
        self.devices.iter().position(|d| d.name == name)
    }

    fn dev_of_addr(&self, ip: IpAddr) -> Option<usize> {
        let ip = canon(ip);
        self.devices.iter().position(|d| canon(d.addr) == ip)
    }

    fn addrs(&self, id: &Id) -> Addrs {
        let d = id.device.as_deref().and_then(|n| self.dev(n));
        Addrs {
            src: id.src,
            dst: id.dst,
            device: id.device.clone(),
            sgid: id.src.map(|(a, _)| gid_of(a)).filter(|_| d.is_some()),
            dgid: id.dst.map(|(a, _)| gid_of(a)),
            path_mtu: d.map(|d| self.devices[d].mtu),
        }
    }

    fn emit(&mut self, id: u64, ev: u32, status: i32, param: Option<ConnParam>) {
        self.emit_full(id, ev, status, param, None, None);
    }

    fn emit_full(
        &mut self,
        id: u64,
        ev: u32,
        status: i32,
        param: Option<ConnParam>,
        listen_id: Option<u64>,
        addrs: Option<Addrs>,
    ) {
        let Some(i) = self.ids.get(&id) else {
            return;
        };
        let addrs = addrs.unwrap_or_else(|| self.addrs(i));
        let chan = i.chan;
        self.events.push_back((
            chan,
            CmEvent {
                id,
                listen_id,
                event: ev,
                status,
                param,
                addrs,
                arg: 0,
            },
        ));
    }

    fn id_mut(&mut self, owner: u64, id: u64) -> Result<&mut Id, CmErr> {
        match self.ids.get_mut(&id) {
            Some(i) if i.owner == owner => Ok(i),
            _ => Err(err(libc::EINVAL, format!("no rdma_cm id {id}"))),
        }
    }

    /// Whether `(ps, port, addr)` may be bound by `who`: kernel
    /// `cma_check_port`.
    fn check_port(
        &self,
        who: u64,
        ps: PortSpace,
        addr: IpAddr,
        port: u16,
        reuseaddr: bool,
        afonly: bool,
    ) -> Result<(), CmErr> {
        for (k, cur) in &self.ids {
            let Some((caddr, cport)) = cur.src else {
                continue;
            };
            if *k == who || cur.child || cur.ps != ps || cport != port {
                continue;
            }
            if reuseaddr && cur.reuseaddr && cur.state != St::Listen {
                continue;
            }
            if afonly && cur.afonly && addr.is_ipv4() != caddr.is_ipv4() {
                continue;
            }
            if any(addr) || any(caddr) {
                return Err(err(
                    libc::EADDRNOTAVAIL,
                    format!("port {port} is bound to {caddr} already"),
                ));
            }
            if canon(addr) == canon(caddr) {
                return Err(err(libc::EADDRINUSE, format!("{addr}:{port} is in use")));
            }
        }
        Ok(())
    }

    fn bind_id(&mut self, id: u64, addr: IpAddr, port: u16) -> Result<(), CmErr> {
        let (ps, reuse, afonly) = {
            let i = &self.ids[&id];
            (i.ps, i.reuseaddr, i.afonly)
        };
        let device = if any(addr) {
            None
        } else {
            match self.dev_of_addr(addr) {
                Some(d) => Some(self.devices[d].name.clone()),
                // Kernel rdma_cm (measured on Linux 6.1 with rxe0 on eth0:
                // rdma_server -s 127.0.0.1 listens) binds a loopback
                // address no device has without a device, like the
                // wildcard; libfabric's verbs provider relies on it (its
                // passive fi_getinfo binds "localhost" and, finding no
                // device on the id, offers every device's addresses).
                None if addr.is_loopback() => None,
                None => {
                    return Err(err(
                        libc::EADDRNOTAVAIL,
                        format!("no rxe-emu device has address {addr} (rxe-emu link show)"),
                    ))
                }
            }
        };
        let port = if port != 0 {
            self.check_port(id, ps, addr, port, reuse, afonly)?;
            port
        } else {
            let span = EPHEMERAL.1 - EPHEMERAL.0 + 1;
            let mut found = None;
            for _ in 0..span {
                let p = self.next_port;
                self.next_port = if p >= EPHEMERAL.1 { EPHEMERAL.0 } else { p + 1 };
                if self.check_port(id, ps, addr, p, false, afonly).is_ok() {
                    found = Some(p);
                    break;
                }
            }
            found.ok_or_else(|| err(libc::EADDRNOTAVAIL, "no free port"))?
        };
        let i = self.ids.get_mut(&id).expect("caller checked the id");
        i.src = Some((addr, port));
        i.device = device;
        i.state = St::AddrBound;
        Ok(())
    }

    /// Service IDs some listener bound to `device` (or to any, for
    /// `None`: only any-address listeners) needs.
    fn listened_sids(&self, device: Option<&str>) -> Vec<u64> {
        self.ids
            .values()
            .filter(|i| i.state == St::Listen)
            .filter(|i| i.device.is_none() || (device.is_some() && i.device.as_deref() == device))
            .filter_map(|i| i.src.map(|(_, p)| cma::ip_service_id(i.ps, p)))
            .collect()
    }

    /// Make each endpoint listen on exactly the service IDs its
    /// listeners need.
    fn sync_listeners(&mut self) {
        for d in 0..self.devices.len() {
            let name = self.devices[d].name.clone();
            let want = self.listened_sids(Some(&name));
            let dev = &mut self.devices[d];
            for sid in &want {
                if !dev.listening.contains(sid) && dev.ep.listen(*sid).is_ok() {
                    dev.listening.push(*sid);
                }
            }
            for sid in dev.listening.clone() {
                if !want.contains(&sid) {
                    let _ = dev.ep.unlisten(sid);
                }
            }
            dev.listening.retain(|s| want.contains(s));
        }
    }

    fn destroy(&mut self, now: Instant, id: u64) {
        let Some(i) = self.ids.remove(&id) else {
            return;
        };
        if let (Some(c), Some(dev)) = (i.conn, i.device.as_deref()) {
            if let Some(d) = self.dev(dev) {
                let _ = self.devices[d].ep.destroy(now, c);
                self.pump(now, d);
            }
            self.conns.remove(&(dev.to_string(), c.0));
        }
        if i.state == St::Listen {
            self.sync_listeners();
        }
    }

    /// Serve one request of `owner` (any but `CHANNEL`, which the server
    /// answers since it makes a socket). `route_src` is the source
    /// address the host's routing picks for a destination.
    pub fn request(
        &mut self,
        now: Instant,
        owner: u64,
        req: &Request,
        route_src: &dyn Fn(IpAddr) -> Option<IpAddr>,
    ) -> Result<String, CmErr> {
        match req {
            Request::Channel => Err(err(libc::EINVAL, "CHANNEL is the server's")),
            Request::Create { chan, ps, qp_type } => {
                if self.chans.get(chan) != Some(&owner) {
                    return Err(err(libc::EINVAL, format!("no event channel {chan}")));
                }
                if self.ids.values().filter(|i| i.owner == owner).count() >= MAX_IDS {
                    return Err(err(
                        libc::ENOMEM,
                        format!("a process may have {MAX_IDS} rdma_cm ids"),
                    ));
                }
                let ps = PortSpace::from_raw(*ps)
                    .ok_or_else(|| err(libc::EINVAL, format!("port space {ps:#x}")))?;
                let qp_type = match (ps, *qp_type) {
                    (PortSpace::Tcp, _) => QPT_RC,
                    (PortSpace::Udp | PortSpace::Ipoib, _) => QPT_UD,
                    (PortSpace::Ib, t @ (QPT_RC | QPT_UD)) => t,
                    (PortSpace::Ib, t) => {
                        return Err(err(libc::EINVAL, format!("qp_type {t} in RDMA_PS_IB")))
                    }
                };
                let id = self.alloc();
                self.ids.insert(
                    id,
                    Id {
                        owner,
                        chan: *chan,
                        ps,
                        qp_type,
                        state: St::Idle,
                        src: None,
                        child: false,
                        dst: None,
                        device: None,
                        reuseaddr: false,
                        afonly: false,
                        tos: 0,
                        conn: None,
                        mcast: Vec::new(),
                    },
                );
                Ok(format!("id={id}"))
            }
            Request::Destroy { id } => {
                self.id_mut(owner, *id)?;
                self.destroy(now, *id);
                Ok(String::new())
            }
            Request::Bind { id, addr, port } => {
                if self.id_mut(owner, *id)?.state != St::Idle {
                    return Err(err(libc::EINVAL, "the id is bound already"));
                }
                self.bind_id(*id, *addr, *port)?;
                Ok(self.bound_line(*id))
            }
            Request::ResolveAddr { id, src, dst, .. } => {
                self.resolve_addr(owner, *id, *src, *dst, route_src)
            }
            Request::ResolveRoute { id, .. } => {
                let i = self.id_mut(owner, *id)?;
                if i.state != St::AddrResolved {
                    return Err(err(libc::EINVAL, "resolve the address first"));
                }
                i.state = St::RouteResolved;
                self.emit(*id, event::ROUTE_RESOLVED, 0, None);
                Ok(String::new())
            }
            Request::Listen { id, .. } => {
                let st = self.id_mut(owner, *id)?.state;
                match st {
                    St::Idle => self.bind_id(*id, IpAddr::V4(Ipv4Addr::UNSPECIFIED), 0)?,
                    St::AddrBound => {}
                    St::Listen => return Ok(self.bound_line(*id)),
                    _ => return Err(err(libc::EINVAL, "rdma_listen on a connected id")),
                }
                let (ps, (addr, port), afonly) = {
                    let i = &self.ids[id];
                    let src = i
                        .src
                        .ok_or_else(|| err(libc::EINVAL, "the id is not bound"))?;
                    (i.ps, src, i.afonly)
                };
                // No two listeners on one port (kernel cma_bind_listen).
                for (k, cur) in &self.ids {
                    if *k != *id
                        && cur.state == St::Listen
                        && cur.ps == ps
                        && cur.src.is_some_and(|(a, p)| {
                            p == port
                                && !(afonly && cur.afonly && a.is_ipv4() != addr.is_ipv4())
                                && (any(a) || any(addr) || canon(a) == canon(addr))
                        })
                    {
                        return Err(err(libc::EADDRINUSE, format!("port {port} has a listener")));
                    }
                }
                self.ids.get_mut(id).expect("checked").state = St::Listen;
                self.sync_listeners();
                Ok(self.bound_line(*id))
            }
            Request::Connect { id, param } => self.connect(now, owner, *id, param),
            Request::Accept { id, param } => self.accept(now, owner, *id, param),
            Request::Reject {
                id,
                private_data,
                reason,
            } => {
                let i = self.id_mut(owner, *id)?;
                let (Some(c), St::ReqRcvd) = (i.conn, i.state) else {
                    return Err(err(
                        libc::EINVAL,
                        "rdma_reject: no connection request to reject",
                    ));
                };
                i.state = St::Done;
                let dev = i.device.clone().unwrap_or_default();
                let d = self
                    .dev(&dev)
                    .ok_or_else(|| err(libc::ENODEV, "device gone"))?;
                let reason = RejectReason(if *reason == 0 { 28 } else { u16::from(*reason) });
                if i_is_ud(&self.ids[id]) {
                    self.devices[d]
                        .ep
                        .sidr_reply(c, SidrStatus::REJECT, 0, 0, private_data)
                        .map_err(ep_err)?;
                } else {
                    self.devices[d]
                        .ep
                        .reject(now, c, reason, private_data)
                        .map_err(ep_err)?;
                }
                self.pump(now, d);
                Ok(String::new())
            }
            Request::Establish { id } => {
                let i = self.id_mut(owner, *id)?;
                let (Some(c), St::RepRcvd) = (i.conn, i.state) else {
                    return Err(err(
                        libc::EINVAL,
                        "rdma_establish: no connect response to answer",
                    ));
                };
                i.state = St::Established;
                let dev = i.device.clone().unwrap_or_default();
                let d = self
                    .dev(&dev)
                    .ok_or_else(|| err(libc::ENODEV, "device gone"))?;
                self.devices[d].ep.ready_to_use(c, &[]).map_err(ep_err)?;
                self.pump(now, d);
                Ok(String::new())
            }
            Request::Disconnect { id } => {
                let i = self.id_mut(owner, *id)?;
                let Some(c) = i.conn else {
                    return Err(err(libc::EINVAL, "rdma_disconnect: not connected"));
                };
                let dev = i.device.clone().unwrap_or_default();
                if let Some(d) = self.dev(&dev) {
                    // As kernel rdma_disconnect: a DREQ, or a DREP if one
                    // came; neither possible is not an error.
                    let _ = self.devices[d].ep.disconnect(now, c, &[]);
                    self.pump(now, d);
                }
                Ok(String::new())
            }
            Request::Notify { id, event: ev } => {
                let i = self.id_mut(owner, *id)?;
                if *ev != IBV_EVENT_COMM_EST {
                    return Ok(String::new());
                }
                let (Some(c), St::Accepted) = (i.conn, i.state) else {
                    return Ok(String::new());
                };
                let dev = i.device.clone().unwrap_or_default();
                if let Some(d) = self.dev(&dev) {
                    let _ = self.devices[d].ep.notify_established(c);
                    self.pump(now, d);
                }
                Ok(String::new())
            }
            Request::Migrate { id, chan } => {
                if self.chans.get(chan) != Some(&owner) {
                    return Err(err(libc::EINVAL, format!("no event channel {chan}")));
                }
                self.id_mut(owner, *id)?.chan = *chan;
                Ok(String::new())
            }
            Request::SetOption {
                id,
                level,
                name,
                value,
            } => self.set_option(owner, *id, *level, *name, value),
            Request::Join { id, addr, .. } => {
                let i = self.id_mut(owner, *id)?;
                if i.device.is_none() {
                    return Err(err(
                        libc::ENODEV,
                        "bind or resolve the id to a device first",
                    ));
                }
                let is_mc = match addr {
                    IpAddr::V4(a) => a.is_multicast(),
                    IpAddr::V6(a) => a.is_multicast(),
                };
                if !is_mc {
                    return Err(err(
                        libc::EINVAL,
                        format!("{addr} is not a multicast address"),
                    ));
                }
                if i.mcast.contains(addr) {
                    return Err(err(libc::EADDRINUSE, format!("joined {addr} already")));
                }
                i.mcast.push(*addr);
                let mut addrs = self.addrs(&self.ids[id]);
                addrs.dst = Some((*addr, 0));
                addrs.dgid = Some(gid_of(*addr));
                let param = ConnParam {
                    qp_num: 0x00ff_ffff,
                    qkey: RDMA_UDP_QKEY,
                    ..ConnParam::default()
                };
                self.emit_full(
                    *id,
                    event::MULTICAST_JOIN,
                    0,
                    Some(param),
                    None,
                    Some(addrs),
                );
                Ok(String::new())
            }
            Request::Requeue { chan, event } => {
                if self.chans.get(chan) != Some(&owner) {
                    return Err(err(libc::EINVAL, format!("no event channel {chan}")));
                }
                self.events.push_back((*chan, event.clone()));
                Ok(String::new())
            }
            Request::Leave { id, addr } => {
                let i = self.id_mut(owner, *id)?;
                let before = i.mcast.len();
                i.mcast.retain(|a| a != addr);
                if i.mcast.len() == before {
                    return Err(err(libc::EADDRNOTAVAIL, format!("not joined to {addr}")));
                }
                Ok(String::new())
            }
        }
    }

    fn bound_line(&self, id: u64) -> String {
        let i = &self.ids[&id];
        let mut s = String::new();
        let a = Addrs {
            src: i.src,
            device: i.device.clone(),
            ..Addrs::default()
        };
        a.write(&mut s);
        s.trim_start().to_string()
    }

    fn resolve_addr(
        &mut self,
        owner: u64,
        id: u64,
        src: Option<(IpAddr, u16)>,
        dst: (IpAddr, u16),
        route_src: &dyn Fn(IpAddr) -> Option<IpAddr>,
    ) -> Result<String, CmErr> {
        let st = self.id_mut(owner, id)?.state;
        if any(dst.0) {
            return Err(err(
                libc::EINVAL,
                "rdma_resolve_addr: no destination address",
            ));
        }
        match st {
            St::Idle => {
                let (a, p) = src.unwrap_or((IpAddr::V4(Ipv4Addr::UNSPECIFIED), 0));
                if !any(a) && self.dev_of_addr(a).is_none() {
                    return Err(err(
                        libc::EADDRNOTAVAIL,
                        format!("no rxe-emu device has address {a}"),
                    ));
                }
                self.bind_id(id, a, p)?;
            }
            St::AddrBound => {}
            _ => return Err(err(libc::EINVAL, "rdma_resolve_addr: the id is in use")),
        }
        let (bound, port) = self.ids[&id]
            .src
            .ok_or_else(|| err(libc::EINVAL, "the id is not bound"))?;
        // The source the host's routing picks, when bound to any address.
        // A destination a device owns is reached through that device
        // (loopback, as kernel rdma_cm's local routes do).
        let chosen = if !any(bound) {
            Some(bound)
        } else if self.dev_of_addr(dst.0).is_some() {
            Some(dst.0)
        } else {
            route_src(dst.0)
        };
        let dev = chosen.and_then(|a| self.dev_of_addr(a));
        let i = self.ids.get_mut(&id).expect("checked");
        i.dst = Some(dst);
        match (chosen, dev) {
            (Some(a), Some(d)) => {
                i.src = Some((a, port));
                i.device = Some(self.devices[d].name.clone());
                i.state = St::AddrResolved;
                self.emit(id, event::ADDR_RESOLVED, 0, None);
            }
            (None, _) => self.emit(id, event::ADDR_ERROR, -libc::EHOSTUNREACH, None),
            (Some(_), None) => self.emit(id, event::ADDR_ERROR, -libc::ENODEV, None),
        }
        Ok(String::new())
    }

    fn connect(
        &mut self,
        now: Instant,
        owner: u64,
        id: u64,
        p: &ConnParam,
    ) -> Result<String, CmErr> {
        let i = self.id_mut(owner, id)?;
        if i.state != St::RouteResolved {
            return Err(err(libc::EINVAL, "rdma_connect: resolve the route first"));
        }
        let ((sa, sport), (da, dport)) = i
            .src
            .zip(i.dst)
            .ok_or_else(|| err(libc::EINVAL, "rdma_connect: the route has no addresses"))?;
        let dev = i.device.clone().unwrap_or_default();
        let (ps, tos, ud) = (i.ps, i.tos, i_is_ud(i));
        let d = self
            .dev(&dev)
            .ok_or_else(|| err(libc::ENODEV, "device gone"))?;
        let hdr = CmaHeaderRepr {
            src_port: sport,
            src: sa,
            dst: da,
        };
        let mut pd = vec![0u8; cma::HEADER_LEN];
        hdr.emit(&mut cma::Packet::new_unchecked(&mut pd[..]))
            .map_err(|_| err(libc::EINVAL, "address family"))?;
        pd.extend_from_slice(&p.private_data);
        let sid = cma::ip_service_id(ps, dport);
        let c = if ud {
            self.devices[d]
                .ep
                .sidr_request(
                    now,
                    &SidrParams {
                        service_id: sid,
                        pkey: 0xffff,
                        remote_gid: gid_of(da),
                        timeout: rdma_cm_core::timing::iba_time(CMA_CM_RESPONSE_TIMEOUT),
                        max_cm_retries: CMA_MAX_CM_RETRIES,
                        private_data: pd,
                    },
                )
                .map_err(ep_err)?
        } else {
            if p.private_data.len() > cma::REQ_CONSUMER_PRIVATE_DATA_LEN {
                return Err(err(
                    libc::EINVAL,
                    format!(
                        "private data of {} bytes: a REQ has room for {}",
                        p.private_data.len(),
                        cma::REQ_CONSUMER_PRIVATE_DATA_LEN
                    ),
                ));
            }
            let mtu = self.devices[d].mtu;
            let params = ConnectParams {
                service_id: sid,
                qpn: p.qp_num,
                starting_psn: p.psn,
                responder_resources: p.responder_resources,
                initiator_depth: p.initiator_depth,
                remote_cm_response_timeout: CMA_CM_RESPONSE_TIMEOUT,
                local_cm_response_timeout: CMA_CM_RESPONSE_TIMEOUT,
                retry_count: p.retry_count.min(7),
                rnr_retry_count: p.rnr_retry_count.min(7),
                max_cm_retries: CMA_MAX_CM_RETRIES,
                path_mtu: mtu,
                pkey: 0xffff,
                srq: p.srq,
                packet_life_time: CMA_IBOE_PACKET_LIFETIME,
                primary_path: PathRepr {
                    local_lid: 0xffff,
                    remote_lid: 0xffff,
                    local_gid: gid_of(sa),
                    remote_gid: gid_of(da),
                    flow_label: flow_label(sport, dport),
                    packet_rate: 0,
                    traffic_class: tos,
                    hop_limit: 64,
                    sl: 0,
                    subnet_local: false,
                    local_ack_timeout: 0,
                },
                private_data: pd,
                ece_vendor_id: p.ece_vendor_id,
                ece_attr_mod: p.ece_attr_mod,
            };
            self.devices[d].ep.connect(now, &params).map_err(ep_err)?
        };
        let i = self.ids.get_mut(&id).expect("checked");
        i.conn = Some(c);
        i.state = St::Connect;
        self.conns.insert((dev, c.0), id);
        self.pump(now, d);
        Ok(String::new())
    }

    fn accept(
        &mut self,
        now: Instant,
        owner: u64,
        id: u64,
        p: &ConnParam,
    ) -> Result<String, CmErr> {
        let i = self.id_mut(owner, id)?;
        let (Some(c), St::ReqRcvd) = (i.conn, i.state) else {
            return Err(err(
                libc::EINVAL,
                "rdma_accept: no connection request to accept",
            ));
        };
        let ud = i_is_ud(i);
        let dev = i.device.clone().unwrap_or_default();
        let d = self
            .dev(&dev)
            .ok_or_else(|| err(libc::ENODEV, "device gone"))?;
        if ud {
            let qkey = if p.qkey == 0 { RDMA_UDP_QKEY } else { p.qkey };
            self.devices[d]
                .ep
                .sidr_reply(c, SidrStatus::SUCCESS, p.qp_num, qkey, &p.private_data)
                .map_err(ep_err)?;
            let i = self.ids.get_mut(&id).expect("checked");
            i.state = St::Established;
        } else {
            self.devices[d]
                .ep
                .accept(
                    now,
                    c,
                    &AcceptParams {
                        qpn: p.qp_num,
                        starting_psn: p.psn,
                        responder_resources: p.responder_resources,
                        initiator_depth: p.initiator_depth,
                        failover_accepted: 0,
                        flow_control: p.flow_control != 0,
                        rnr_retry_count: p.rnr_retry_count.min(7),
                        srq: p.srq,
                        private_data: p.private_data.clone(),
                        ece_vendor_id: p.ece_vendor_id,
                        ece_attr_mod: p.ece_attr_mod,
                    },
                )
                .map_err(ep_err)?;
            self.ids.get_mut(&id).expect("checked").state = St::Accepted;
        }
        self.pump(now, d);
        Ok(String::new())
    }

    fn set_option(
        &mut self,
        owner: u64,
        id: u64,
        level: i32,
        name: i32,
        value: &[u8],
    ) -> Result<String, CmErr> {
        let i = self.id_mut(owner, id)?;
        let int = || -> Result<i32, CmErr> {
            value
                .get(..4)
                .and_then(|b| b.try_into().ok())
                .map(i32::from_ne_bytes)
                .ok_or_else(|| err(libc::EINVAL, "option value too short"))
        };
        match (level, name) {
            // RDMA_OPTION_ID_TOS (u8)
            (0, 0) => {
                i.tos = *value.first().ok_or_else(|| err(libc::EINVAL, "no TOS"))?;
            }
            // RDMA_OPTION_ID_REUSEADDR
            (0, 1) => {
                if i.state != St::Idle {
                    return Err(err(libc::EINVAL, "REUSEADDR after bind"));
                }
                i.reuseaddr = int()? != 0;
            }
            // RDMA_OPTION_ID_AFONLY
            (0, 2) => {
                if i.state != St::Idle {
                    return Err(err(libc::EINVAL, "AFONLY after bind"));
                }
                i.afonly = int()? != 0;
            }
            // RDMA_OPTION_ID_ACK_TIMEOUT: the library applies it to the
            // QP; nothing on the wire changes.
            (0, 3) => {}
            // RDMA_OPTION_IB_PATH: on RoCE the route is resolved by it
            // (kernel rdma_set_ib_path + ucma's ROUTE_RESOLVED).
            (1, 1) => {
                if i.state != St::AddrResolved {
                    return Err(err(libc::EINVAL, "IB_PATH before the address is resolved"));
                }
                i.state = St::RouteResolved;
                self.emit(id, event::ROUTE_RESOLVED, 0, None);
            }
            _ => {
                return Err(err(
                    libc::ENOSYS,
                    format!("rdma_set_option level {level} name {name} is not supported"),
                ))
            }
        }
        Ok(String::new())
    }

    /// Move what endpoint `d` produced: MADs out, events to ids.
    fn pump(&mut self, now: Instant, d: usize) {
        while let Some(Transmit { dst_gid, mad }) = self.devices[d].ep.poll_transmit() {
            self.out.push_back(MadOut {
                device: self.devices[d].name.clone(),
                to: ip_of_gid(dst_gid),
                mad,
            });
        }
        while let Some(ev) = self.devices[d].ep.poll_event() {
            self.on_endpoint_event(now, d, ev);
        }
        // Answers to what we just did (REJ of an unknown listener).
        while let Some(Transmit { dst_gid, mad }) = self.devices[d].ep.poll_transmit() {
            self.out.push_back(MadOut {
                device: self.devices[d].name.clone(),
                to: ip_of_gid(dst_gid),
                mad,
            });
        }
    }

    fn id_of(&self, d: usize, c: ConnId) -> Option<u64> {
        self.conns
            .get(&(self.devices[d].name.clone(), c.0))
            .copied()
    }

    fn on_endpoint_event(&mut self, now: Instant, d: usize, ev: EpEvent) {
        match ev {
            EpEvent::ConnectRequest {
                id: c,
                remote_gid,
                req,
                ece_attr_mod,
            } => self.on_request(
                now,
                d,
                c,
                remote_gid,
                &req.private_data,
                req.service_id,
                |pd| ConnParam {
                    private_data: pd.to_vec(),
                    responder_resources: req.responder_resources,
                    initiator_depth: req.initiator_depth,
                    flow_control: u8::from(req.end_to_end_flow_control),
                    retry_count: req.retry_count,
                    rnr_retry_count: req.rnr_retry_count,
                    srq: req.srq,
                    qp_num: req.local_qpn,
                    psn: req.starting_psn,
                    qkey: 0,
                    ece_vendor_id: req.vendor_id,
                    ece_attr_mod,
                },
            ),
            EpEvent::SidrRequest {
                id: c,
                remote_gid,
                req,
            } => self.on_request(
                now,
                d,
                c,
                remote_gid,
                &req.private_data,
                req.service_id,
                |pd| ConnParam {
                    private_data: pd.to_vec(),
                    ..ConnParam::default()
                },
            ),
            EpEvent::ConnectReply {
                id: c,
                rep,
                ece_attr_mod,
            } => {
                let Some(id) = self.id_of(d, c) else { return };
                if let Some(i) = self.ids.get_mut(&id) {
                    i.state = St::RepRcvd;
                }
                // As kernel cma_ib_handler: a delayed MRA, sent only if
                // the REP comes again before the process answers.
                let _ = self.devices[d].ep.send_mra(c, CMA_CM_MRA_TIMEOUT, true);
                let p = ConnParam {
                    private_data: rep.private_data.to_vec(),
                    responder_resources: rep.responder_resources,
                    initiator_depth: rep.initiator_depth,
                    flow_control: u8::from(rep.end_to_end_flow_control),
                    retry_count: 0,
                    rnr_retry_count: rep.rnr_retry_count,
                    srq: rep.srq,
                    qp_num: rep.local_qpn,
                    psn: rep.starting_psn,
                    qkey: 0,
                    ece_vendor_id: rep.vendor_id,
                    ece_attr_mod,
                };
                self.emit(id, event::CONNECT_RESPONSE, 0, Some(p));
            }
            EpEvent::SidrReply {
                id: c,
                status,
                qpn,
                qkey,
                private_data,
                ..
            } => {
                let Some(id) = self.id_of(d, c) else { return };
                self.conns.remove(&(self.devices[d].name.clone(), c.0));
                if let Some(i) = self.ids.get_mut(&id) {
                    i.conn = None;
                    i.state = if status == SidrStatus::SUCCESS {
                        St::Established
                    } else {
                        St::Done
                    };
                }
                let p = ConnParam {
                    private_data: private_data.to_vec(),
                    qp_num: qpn,
                    qkey,
                    ..ConnParam::default()
                };
                if status == SidrStatus::SUCCESS {
                    self.emit(id, event::ESTABLISHED, 0, Some(p));
                } else {
                    // Kernel cma_sidr_rep_handler: UNREACHABLE with the
                    // SIDR status.
                    self.emit(id, event::UNREACHABLE, i32::from(status.0), Some(p));
                }
            }
            EpEvent::Established { id: c, .. } => {
                let Some(id) = self.id_of(d, c) else { return };
                let passive = self.ids.get(&id).is_some_and(|i| i.state == St::Accepted);
                if passive {
                    self.ids.get_mut(&id).expect("checked").state = St::Established;
                    self.emit(id, event::ESTABLISHED, 0, None);
                }
            }
            EpEvent::Rejected {
                id: c,
                reason,
                private_data,
                ..
            } => {
                let Some(id) = self.id_of(d, c) else { return };
                if let Some(i) = self.ids.get_mut(&id) {
                    i.state = St::Done;
                }
                let p = ConnParam {
                    private_data: private_data.to_vec(),
                    ..ConnParam::default()
                };
                self.emit(id, event::REJECTED, i32::from(reason.0), Some(p));
            }
            EpEvent::Unreachable { id: c, .. } => {
                let Some(id) = self.id_of(d, c) else { return };
                self.conns.remove(&(self.devices[d].name.clone(), c.0));
                if let Some(i) = self.ids.get_mut(&id) {
                    i.state = St::Done;
                    i.conn = None;
                }
                self.emit(id, event::UNREACHABLE, -libc::ETIMEDOUT, None);
            }
            EpEvent::Disconnected { id: c, .. } => {
                let Some(id) = self.id_of(d, c) else { return };
                if let Some(i) = self.ids.get_mut(&id) {
                    i.state = St::Done;
                }
                self.emit(id, event::DISCONNECTED, 0, None);
            }
            EpEvent::TimewaitExit { id: c } => {
                let Some(id) = self.id_of(d, c) else { return };
                self.conns.remove(&(self.devices[d].name.clone(), c.0));
                self.emit(id, event::TIMEWAIT_EXIT, 0, None);
            }
        }
    }

    /// A REQ or SIDR_REQ came: find the listener by service ID and the
    /// address in the rdma_cm header, make the new id, report
    /// CONNECT_REQUEST; or reject as kernel cm does for no listener.
    #[allow(clippy::too_many_arguments)]
    fn on_request(
        &mut self,
        now: Instant,
        d: usize,
        c: ConnId,
        remote_gid: [u8; 16],
        pd: &[u8],
        service_id: u64,
        param: impl FnOnce(&[u8]) -> ConnParam,
    ) {
        let hdr = cma::Packet::new_checked(pd)
            .ok()
            .and_then(|p| CmaHeaderRepr::parse(&p).ok());
        let target = cma::parse_ip_service_id(service_id).zip(hdr);
        let listener = target.and_then(|((ps, port), hdr)| {
            let devname = &self.devices[d].name;
            self.ids
                .iter()
                .filter(|(_, i)| i.state == St::Listen && i.ps == ps)
                .filter(|(_, i)| i.device.is_none() || i.device.as_ref() == Some(devname))
                .find(|(_, i)| {
                    i.src
                        .is_some_and(|(a, p)| p == port && (any(a) || canon(a) == canon(hdr.dst)))
                })
                .map(|(k, _)| (*k, port, hdr))
        });
        let ud = target.is_some_and(|((ps, _), _)| ps == PortSpace::Udp);
        let Some((lid, port, hdr)) = listener else {
            let ep = &mut self.devices[d].ep;
            if ud {
                let _ = ep.sidr_reply(c, SidrStatus::REJECT, 0, 0, &[]);
            } else {
                let _ = ep.reject(now, c, RejectReason::CONSUMER_DEFINED, &[]);
            }
            return;
        };
        let (owner, chan, ps, qp_type) = {
            let l = &self.ids[&lid];
            (l.owner, l.chan, l.ps, l.qp_type)
        };
        if self.ids.values().filter(|i| i.owner == owner).count() >= MAX_IDS {
            let ep = &mut self.devices[d].ep;
            if ud {
                let _ = ep.sidr_reply(c, SidrStatus::REJECT, 0, 0, &[]);
            } else {
                let _ = ep.reject(now, c, RejectReason::CONSUMER_DEFINED, &[]);
            }
            return;
        }
        let id = self.alloc();
        let local = (hdr.dst, port);
        let _ = remote_gid;
        self.ids.insert(
            id,
            Id {
                owner,
                chan,
                ps,
                qp_type,
                state: St::ReqRcvd,
                src: Some(local),
                child: true,
                dst: Some((hdr.src, hdr.src_port)),
                device: Some(self.devices[d].name.clone()),
                reuseaddr: false,
                afonly: false,
                tos: 0,
                conn: Some(c),
                mcast: Vec::new(),
            },
        );
        self.conns.insert((self.devices[d].name.clone(), c.0), id);
        if !ud {
            // As kernel cma_ib_req_handler: a delayed MRA, so a REQ that
            // comes again while the process decides is told to wait.
            let _ = self.devices[d].ep.send_mra(c, CMA_CM_MRA_TIMEOUT, true);
        }
        let consumer = pd.get(cma::HEADER_LEN..).unwrap_or(&[]);
        let p = param(consumer);
        self.emit_full(id, event::CONNECT_REQUEST, 0, Some(p), Some(lid), None);
    }
}

fn i_is_ud(i: &Id) -> bool {
    i.qp_type == QPT_UD
}

/// IPv4-mapped IPv6 addresses as IPv4, for comparisons.
fn canon(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    const A: &str = "10.0.0.1";
    const B: &str = "10.0.0.2";

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    /// Two daemons (one device each) joined by a wire that may drop.
    struct Net {
        a: CmService,
        b: CmService,
        now: Instant,
        drop_all: bool,
    }

    impl Net {
        fn new() -> Net {
            let mut a = CmService::new(1);
            a.add_device("rxe0", ip(A), 1500);
            let mut b = CmService::new(2);
            b.add_device("rxe0", ip(B), 1500);
            Net {
                a,
                b,
                now: Instant::now(),
                drop_all: false,
            }
        }

        fn side(&mut self, which: char) -> &mut CmService {
            if which == 'a' {
                &mut self.a
            } else {
                &mut self.b
            }
        }

        fn req(&mut self, which: char, owner: u64, r: Request) -> Result<String, CmErr> {
            let now = self.now;
            let src = if which == 'a' { ip(A) } else { ip(B) };
            let out = self
                .side(which)
                .request(now, owner, &r, &move |_| Some(src));
            self.deliver();
            out
        }

        fn deliver(&mut self) {
            loop {
                let mut moved = false;
                while let Some(m) = self.a.poll_transmit() {
                    moved = true;
                    if !self.drop_all {
                        let to = if m.to == ip(A) {
                            &mut self.a
                        } else {
                            &mut self.b
                        };
                        to.handle_mad(self.now, "rxe0", ip(A), &m.mad);
                    }
                }
                while let Some(m) = self.b.poll_transmit() {
                    moved = true;
                    if !self.drop_all {
                        let to = if m.to == ip(A) {
                            &mut self.a
                        } else {
                            &mut self.b
                        };
                        to.handle_mad(self.now, "rxe0", ip(B), &m.mad);
                    }
                }
                if !moved {
                    return;
                }
            }
        }

        fn events(&mut self, which: char) -> Vec<CmEvent> {
            let mut v = Vec::new();
            while let Some((_, e)) = self.side(which).poll_event() {
                v.push(e);
            }
            v
        }

        fn advance(&mut self, d: Duration) {
            self.now += d;
            let now = self.now;
            self.a.handle_timeout(now);
            self.b.handle_timeout(now);
            self.deliver();
        }

        /// A channel and an id for owner 1 on side `which`.
        fn id(&mut self, which: char, ps: u16) -> u64 {
            let chan = self.side(which).new_channel(1).unwrap();
            let r = self
                .req(
                    which,
                    1,
                    Request::Create {
                        chan,
                        ps,
                        qp_type: 2,
                    },
                )
                .unwrap();
            r.strip_prefix("id=").unwrap().parse().unwrap()
        }

        /// B listens on `port`; A resolves and returns its id.
        fn ready(&mut self, ps: u16, port: u16) -> (u64, u64) {
            let l = self.id('b', ps);
            self.req(
                'b',
                1,
                Request::Bind {
                    id: l,
                    addr: ip("0.0.0.0"),
                    port,
                },
            )
            .unwrap();
            self.req('b', 1, Request::Listen { id: l, backlog: 8 })
                .unwrap();
            let c = self.id('a', ps);
            self.req(
                'a',
                1,
                Request::ResolveAddr {
                    id: c,
                    src: None,
                    dst: (ip(B), port),
                    timeout_ms: 2000,
                },
            )
            .unwrap();
            let ev = self.events('a');
            assert_eq!(ev.len(), 1);
            assert_eq!(ev[0].event, event::ADDR_RESOLVED);
            assert_eq!(ev[0].addrs.device.as_deref(), Some("rxe0"));
            assert_eq!(ev[0].addrs.src.map(|s| s.0), Some(ip(A)));
            self.req(
                'a',
                1,
                Request::ResolveRoute {
                    id: c,
                    timeout_ms: 2000,
                },
            )
            .unwrap();
            let ev = self.events('a');
            assert_eq!(ev[0].event, event::ROUTE_RESOLVED);
            assert_eq!(ev[0].addrs.path_mtu, Some(3), "1500-byte netdev: 1024");
            assert_eq!(ev[0].addrs.dgid, Some(gid_of(ip(B))));
            (l, c)
        }
    }

    fn param(qpn: u32, pd: &[u8]) -> ConnParam {
        ConnParam {
            private_data: pd.to_vec(),
            responder_resources: 1,
            initiator_depth: 1,
            retry_count: 7,
            rnr_retry_count: 7,
            qp_num: qpn,
            psn: 0x1234,
            ..ConnParam::default()
        }
    }

    #[test]
    fn rc_connect_accept_establish_disconnect() {
        let mut n = Net::new();
        let (l, c) = n.ready(0x106, 7174);
        n.req(
            'a',
            1,
            Request::Connect {
                id: c,
                param: param(0x10011, b"hi"),
            },
        )
        .unwrap();
        let ev = n.events('b');
        assert_eq!(ev.len(), 1);
        let req = &ev[0];
        assert_eq!(req.event, event::CONNECT_REQUEST);
        assert_eq!(req.listen_id, Some(l));
        let p = req.param.as_ref().unwrap();
        assert_eq!(p.qp_num, 0x10011);
        assert_eq!(p.psn, 0x1234);
        assert_eq!(p.private_data.len(), 56);
        assert_eq!(&p.private_data[..2], b"hi");
        assert_eq!(req.addrs.src, Some((ip(B), 7174)));
        assert_eq!(req.addrs.dst.map(|d| d.0), Some(ip(A)));
        let child = req.id;
        n.req(
            'b',
            1,
            Request::Accept {
                id: child,
                param: param(0x20011, b"yes"),
            },
        )
        .unwrap();
        let ev = n.events('a');
        assert_eq!(ev.len(), 1);
        assert_eq!(ev[0].event, event::CONNECT_RESPONSE);
        let p = ev[0].param.as_ref().unwrap();
        assert_eq!((p.qp_num, &p.private_data[..3]), (0x20011, &b"yes"[..]));
        assert_eq!(p.private_data.len(), 196);
        n.req('a', 1, Request::Establish { id: c }).unwrap();
        assert!(n.events('a').is_empty(), "the library reports ESTABLISHED");
        let ev = n.events('b');
        assert_eq!(
            ev.iter().map(|e| e.event).collect::<Vec<_>>(),
            [event::ESTABLISHED]
        );
        n.req('a', 1, Request::Disconnect { id: c }).unwrap();
        assert_eq!(n.events('a')[0].event, event::DISCONNECTED);
        assert_eq!(n.events('b')[0].event, event::DISCONNECTED);
        // Disconnecting again is not an error (kernel rdma_disconnect).
        n.req('b', 1, Request::Disconnect { id: child }).unwrap();
        n.advance(Duration::from_secs(10));
        assert_eq!(n.events('a')[0].event, event::TIMEWAIT_EXIT);
        assert_eq!(n.events('b')[0].event, event::TIMEWAIT_EXIT);
    }

    #[test]
    fn an_accepted_child_owns_no_port() {
        // perftest -R: the server's first listener accepts, goes away, and
        // a second listener binds the same port while the child lives.
        let mut n = Net::new();
        let (l, c) = n.ready(0x106, 18515);
        n.req(
            'a',
            1,
            Request::Connect {
                id: c,
                param: param(0x10011, b""),
            },
        )
        .unwrap();
        let child = n.events('b')[0].id;
        n.req(
            'b',
            1,
            Request::Accept {
                id: child,
                param: param(0x20011, b""),
            },
        )
        .unwrap();
        n.req('b', 1, Request::Destroy { id: l }).unwrap();
        let l2 = n.id('b', 0x106);
        n.req(
            'b',
            1,
            Request::Bind {
                id: l2,
                addr: ip("0.0.0.0"),
                port: 18515,
            },
        )
        .unwrap();
    }

    #[test]
    fn reject_carries_private_data_and_reason() {
        let mut n = Net::new();
        let (_, c) = n.ready(0x106, 7000);
        n.req(
            'a',
            1,
            Request::Connect {
                id: c,
                param: param(0x10011, b""),
            },
        )
        .unwrap();
        let child = n.events('b')[0].id;
        n.req(
            'b',
            1,
            Request::Reject {
                id: child,
                private_data: b"go away".to_vec(),
                reason: 0,
            },
        )
        .unwrap();
        let ev = n.events('a');
        assert_eq!(ev[0].event, event::REJECTED);
        assert_eq!(ev[0].status, 28, "IB_CM_REJ_CONSUMER_DEFINED");
        assert_eq!(&ev[0].param.as_ref().unwrap().private_data[..7], b"go away");
        // Accepting what was rejected is refused.
        assert!(n
            .req(
                'b',
                1,
                Request::Accept {
                    id: child,
                    param: param(1, b"")
                }
            )
            .is_err());
    }

    #[test]
    fn no_listener_is_rejected_and_a_vanished_peer_is_unreachable() {
        let mut n = Net::new();
        let (_, c) = n.ready(0x106, 7001);
        // Another port: nobody listens there.
        let c2 = n.id('a', 0x106);
        n.req(
            'a',
            1,
            Request::ResolveAddr {
                id: c2,
                src: None,
                dst: (ip(B), 9999),
                timeout_ms: 1,
            },
        )
        .unwrap();
        n.req(
            'a',
            1,
            Request::ResolveRoute {
                id: c2,
                timeout_ms: 1,
            },
        )
        .unwrap();
        n.events('a');
        n.req(
            'a',
            1,
            Request::Connect {
                id: c2,
                param: param(5, b""),
            },
        )
        .unwrap();
        let ev = n.events('a');
        assert_eq!(ev[0].event, event::REJECTED);
        // The peer vanishes: the REQ is resent 15 times, then UNREACHABLE.
        n.drop_all = true;
        n.req(
            'a',
            1,
            Request::Connect {
                id: c,
                param: param(6, b""),
            },
        )
        .unwrap();
        for _ in 0..20 {
            n.advance(Duration::from_secs(10));
        }
        let ev = n.events('a');
        assert_eq!(ev.len(), 1);
        assert_eq!((ev[0].event, ev[0].status), (event::UNREACHABLE, -110));
    }

    #[test]
    fn ud_ids_resolve_with_sidr() {
        let mut n = Net::new();
        let (_, c) = n.ready(0x111, 7002);
        n.req(
            'a',
            1,
            Request::Connect {
                id: c,
                param: param(0, b"ud"),
            },
        )
        .unwrap();
        let ev = n.events('b');
        assert_eq!(ev[0].event, event::CONNECT_REQUEST);
        assert_eq!(&ev[0].param.as_ref().unwrap().private_data[..2], b"ud");
        let child = ev[0].id;
        n.req(
            'b',
            1,
            Request::Accept {
                id: child,
                param: param(0x20022, b""),
            },
        )
        .unwrap();
        let ev = n.events('a');
        assert_eq!(ev[0].event, event::ESTABLISHED);
        let p = ev[0].param.as_ref().unwrap();
        assert_eq!((p.qp_num, p.qkey), (0x20022, RDMA_UDP_QKEY));
        assert!(n.events('b').is_empty(), "UD accept has no ESTABLISHED");
    }

    #[test]
    fn ports_bind_like_the_kernel() {
        let mut n = Net::new();
        let x = n.id('b', 0x106);
        let y = n.id('b', 0x106);
        let z = n.id('b', 0x111);
        n.req(
            'b',
            1,
            Request::Bind {
                id: x,
                addr: ip(B),
                port: 5000,
            },
        )
        .unwrap();
        let e = n
            .req(
                'b',
                1,
                Request::Bind {
                    id: y,
                    addr: ip(B),
                    port: 5000,
                },
            )
            .unwrap_err();
        assert_eq!(e.errno, libc::EADDRINUSE);
        // Another port space is another port.
        n.req(
            'b',
            1,
            Request::Bind {
                id: z,
                addr: ip(B),
                port: 5000,
            },
        )
        .unwrap();
        // An address no device has.
        let w = n.id('b', 0x106);
        let e = n
            .req(
                'b',
                1,
                Request::Bind {
                    id: w,
                    addr: ip("10.9.9.9"),
                    port: 1,
                },
            )
            .unwrap_err();
        assert_eq!(e.errno, libc::EADDRNOTAVAIL);
        // A loopback address no device has: bound, to no device (kernel
        // rdma_cm does the same).
        let lo = n.id('b', 0x106);
        let r = n
            .req(
                'b',
                1,
                Request::Bind {
                    id: lo,
                    addr: ip("127.0.0.1"),
                    port: 0,
                },
            )
            .unwrap();
        assert!(!r.contains("device="), "{r}");
        // Port 0: an ephemeral one.
        let r = n
            .req(
                'b',
                1,
                Request::Bind {
                    id: w,
                    addr: ip("0.0.0.0"),
                    port: 0,
                },
            )
            .unwrap();
        let f = crate::cmproto::Fields::parse(r.split_whitespace()).unwrap();
        let p: u16 = f.num("sport").unwrap();
        assert!((EPHEMERAL.0..=EPHEMERAL.1).contains(&p));
        // Somebody else's id is not ours to touch.
        assert!(n.req('b', 2, Request::Destroy { id: x }).is_err());
    }

    #[test]
    fn a_process_that_goes_takes_its_ids_and_the_peer_hears() {
        let mut n = Net::new();
        let (_, c) = n.ready(0x106, 7003);
        n.req(
            'a',
            1,
            Request::Connect {
                id: c,
                param: param(7, b""),
            },
        )
        .unwrap();
        let child = n.events('b')[0].id;
        n.req(
            'b',
            1,
            Request::Accept {
                id: child,
                param: param(8, b""),
            },
        )
        .unwrap();
        n.events('a');
        n.req('a', 1, Request::Establish { id: c }).unwrap();
        n.events('b');
        let now = n.now;
        n.b.drop_owner(now, 1);
        n.deliver();
        // B's destroyed connection sent a DREQ: A is disconnected.
        assert_eq!(n.events('a')[0].event, event::DISCONNECTED);
        assert!(n.b.ids.is_empty() && n.b.chans.is_empty());
    }

    #[test]
    fn a_slow_accept_is_covered_by_an_mra() {
        let mut n = Net::new();
        let (_, c) = n.ready(0x106, 7004);
        n.req(
            'a',
            1,
            Request::Connect {
                id: c,
                param: param(9, b""),
            },
        )
        .unwrap();
        let child = n.events('b')[0].id;
        // The process takes 250 s to decide: longer than 16 REQs wait
        // (16 x 6144 ms), but the repeated REQ gets the delayed MRA.
        for _ in 0..50 {
            n.advance(Duration::from_secs(5));
        }
        assert!(n.events('a').is_empty(), "still waiting");
        n.req(
            'b',
            1,
            Request::Accept {
                id: child,
                param: param(10, b""),
            },
        )
        .unwrap();
        assert_eq!(n.events('a')[0].event, event::CONNECT_RESPONSE);
    }

    #[test]
    fn a_process_cannot_take_unbounded_channels() {
        let mut s = CmService::new(3);
        for _ in 0..MAX_CHANNELS {
            s.new_channel(7).unwrap();
        }
        assert_eq!(s.new_channel(7).unwrap_err().errno, libc::EMFILE);
        assert!(s.new_channel(8).is_ok(), "another process is not affected");
        s.drop_owner(Instant::now(), 7);
        assert!(s.new_channel(7).is_ok());
    }

    /// Whatever two processes ask, in any order, with any ids, and
    /// whatever the wire then carries, the service answers (OK or an
    /// error) and never panics: the daemon must outlive its clients.
    #[test]
    fn random_requests_never_panic_the_service() {
        let mut x: u64 = 0x2545_f491_4f6c_dd1d;
        let mut rnd = move |n: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % n
        };
        let mut n = Net::new();
        let addrs = [A, A, B, "0.0.0.0", "10.9.9.9", "224.1.1.1", "::"];
        let mut chans = vec![n.a.new_channel(1).unwrap(), n.a.new_channel(2).unwrap()];
        let (mut oks, mut seen) = (0u32, std::collections::BTreeSet::new());
        for step in 0..20_000u32 {
            let owner = 1 + rnd(2);
            // Mostly ids that exist (of either owner), sometimes any.
            let live: Vec<u64> = n.a.ids.keys().copied().collect();
            let id = if !live.is_empty() && rnd(10) < 8 {
                live[rnd(live.len() as u64) as usize]
            } else {
                rnd(1000)
            };
            let chan = chans[rnd(chans.len() as u64) as usize];
            let addr = ip(addrs[rnd(addrs.len() as u64) as usize]);
            let port = [0u16, 7000, 7001, 65535][rnd(4) as usize];
            let p = param(rnd(0x100_0000) as u32, &vec![7; rnd(80) as usize]);
            let r = match rnd(17) {
                0 => Request::Create {
                    chan,
                    ps: [0x106u16, 0x111, 0x13f, 2, 9][rnd(5) as usize],
                    qp_type: [2u32, 4, 9][rnd(3) as usize],
                },
                1 => Request::Destroy { id },
                2 => Request::Bind { id, addr, port },
                3 => Request::ResolveAddr {
                    id,
                    src: (rnd(2) == 0).then_some((addr, port)),
                    dst: (ip(addrs[rnd(addrs.len() as u64) as usize]), port),
                    timeout_ms: 1,
                },
                4 => Request::ResolveRoute { id, timeout_ms: 1 },
                5 => Request::Listen { id, backlog: 1 },
                6 => Request::Connect { id, param: p },
                7 => Request::Accept { id, param: p },
                8 => Request::Reject {
                    id,
                    private_data: p.private_data,
                    reason: rnd(256) as u8,
                },
                9 => Request::Establish { id },
                10 => Request::Disconnect { id },
                11 => Request::Notify { id, event: 9 },
                12 => Request::Migrate { id, chan },
                13 => Request::SetOption {
                    id,
                    level: rnd(3) as i32,
                    name: rnd(5) as i32,
                    value: vec![1; rnd(6) as usize],
                },
                14 => Request::Join { id, addr, flags: 0 },
                15 => Request::Leave { id, addr },
                _ => Request::Requeue {
                    chan,
                    event: CmEvent::default(),
                },
            };
            oks += u32::from(n.req('a', owner, r).is_ok());
            for e in n.events('a') {
                seen.insert(e.event);
            }
            if step % 500 == 0 {
                n.advance(Duration::from_secs(rnd(30)));
            }
            if step % 3000 == 0 {
                let now = n.now;
                n.a.drop_owner(now, owner);
                chans = vec![n.a.new_channel(1).unwrap(), n.a.new_channel(2).unwrap()];
            }
        }
        // It went beyond errors: ids were made, connected and reported.
        eprintln!("{oks} requests succeeded; events seen: {seen:?}");
        assert!(oks > 1000, "{oks}");
        for e in [event::ADDR_RESOLVED, event::ROUTE_RESOLVED] {
            assert!(seen.contains(&e), "event {e} never happened: {seen:?}");
        }
        assert!(
            seen.contains(&event::REJECTED) || seen.contains(&event::UNREACHABLE),
            "no REQ got an answer or ran out of retries: {seen:?}"
        );
    }

    #[test]
    fn path_mtu_follows_the_netdev() {
        assert_eq!(path_mtu(1500), 3);
        assert_eq!(path_mtu(9000), 5);
        assert_eq!(path_mtu(65536), 5);
        assert_eq!(path_mtu(300), 1);
        assert_eq!(flow_label(0xba00, 7174), 0x6a206, "rdmacm_rping.pcap");
    }
}
