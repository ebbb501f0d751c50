//! The RDMA CM protocol between `rxe-emud` and `librdmacm.so.1`: what the
//! kernel's `/dev/infiniband/rdma_cm` (ucma) is to rdma-core's librdmacm.
//!
//! The daemon runs the connection manager (the IB CM on QP1 of each
//! device, rdma_cm's port spaces and ids); the library keeps the
//! `struct rdma_cm_id`s and moves its QPs through their states itself, as
//! librdmacm does with the attributes ucma gives it.
//!
//! A process opens one **command connection** to the daemon's control
//! socket and sends `CM` (reply `OK`). From then on each request is one
//! line, answered by one line, in order:
//!
//! ```text
//! CHANNEL                                  -> OK chan=3           (+ SCM_RIGHTS: the event socket)
//! CREATE chan=3 ps=262 qp_type=2           -> OK id=17
//! BIND id=17 addr=0.0.0.0 port=7174        -> OK src=0.0.0.0 sport=7174 [device=rxe0]
//! RESOLVE_ADDR id=17 dst=10.0.0.2 dport=7174 [src=.. sport=..] timeout_ms=2000 -> OK
//! ...
//!                                          -> ERR errno=98 port 7174 is in use
//! ```
//!
//! An **event channel** is a `SOCK_SEQPACKET` socket the daemon hands out
//! with `CHANNEL`: each event is one message, a line `EV id=.. event=..
//! status=.. ...`, so the channel's fd is a real pollable fd, and
//! `rdma_get_cm_event` is one `recv`. When the command connection closes
//! (the process exits or crashes) the daemon destroys every id the
//! process made, as the kernel does when ucma's file is released.
//!
//! Numbers are decimal unless written `0x..`; private data is hex;
//! addresses are `IpAddr` strings with their ports in a separate key.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::net::IpAddr;

/// librdmacm's `enum rdma_cm_event_type`, in its order.
pub mod event {
    /// `RDMA_CM_EVENT_ADDR_RESOLVED`
    pub const ADDR_RESOLVED: u32 = 0;
    /// `RDMA_CM_EVENT_ADDR_ERROR`
    pub const ADDR_ERROR: u32 = 1;
    /// `RDMA_CM_EVENT_ROUTE_RESOLVED`
    pub const ROUTE_RESOLVED: u32 = 2;
    /// `RDMA_CM_EVENT_ROUTE_ERROR`
    pub const ROUTE_ERROR: u32 = 3;
    /// `RDMA_CM_EVENT_CONNECT_REQUEST`
    pub const CONNECT_REQUEST: u32 = 4;
    /// `RDMA_CM_EVENT_CONNECT_RESPONSE`: a REP arrived; the library
    /// brings its QP to RTR and RTS, sends `ESTABLISH`, and reports
    /// ESTABLISHED (or hands CONNECT_RESPONSE to an id without a QP).
    pub const CONNECT_RESPONSE: u32 = 5;
    /// `RDMA_CM_EVENT_CONNECT_ERROR`
    pub const CONNECT_ERROR: u32 = 6;
    /// `RDMA_CM_EVENT_UNREACHABLE`
    pub const UNREACHABLE: u32 = 7;
    /// `RDMA_CM_EVENT_REJECTED`
    pub const REJECTED: u32 = 8;
    /// `RDMA_CM_EVENT_ESTABLISHED`
    pub const ESTABLISHED: u32 = 9;
    /// `RDMA_CM_EVENT_DISCONNECTED`
    pub const DISCONNECTED: u32 = 10;
    /// `RDMA_CM_EVENT_DEVICE_REMOVAL`
    pub const DEVICE_REMOVAL: u32 = 11;
    /// `RDMA_CM_EVENT_MULTICAST_JOIN`
    pub const MULTICAST_JOIN: u32 = 12;
    /// `RDMA_CM_EVENT_MULTICAST_ERROR`
    pub const MULTICAST_ERROR: u32 = 13;
    /// `RDMA_CM_EVENT_ADDR_CHANGE`
    pub const ADDR_CHANGE: u32 = 14;
    /// `RDMA_CM_EVENT_TIMEWAIT_EXIT`
    pub const TIMEWAIT_EXIT: u32 = 15;
    /// `RDMA_CM_EVENT_ADDRINFO_RESOLVED` (rdma-core v60+): the library
    /// posts it itself (with [`Request::Requeue`](super::Request::Requeue))
    /// when `rdma_resolve_addrinfo` has its answer.
    pub const ADDRINFO_RESOLVED: u32 = 16;
    /// `RDMA_CM_EVENT_ADDRINFO_ERROR` (rdma-core v60+).
    pub const ADDRINFO_ERROR: u32 = 17;
    /// `RDMA_CM_EVENT_USER` (rdma-core v60+): `rdma_write_cm_event`'s
    /// event, with the program's status and `arg`.
    pub const USER: u32 = 18;
}

/// The connection parameters of `struct rdma_conn_param` (and of the
/// UD `struct rdma_ud_param`'s QPN and Q_Key), as sent with CONNECT and
/// ACCEPT and as reported with CONNECT_REQUEST, CONNECT_RESPONSE,
/// ESTABLISHED (UD) and REJECTED.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ConnParam {
    /// Private data (for events: the whole fixed-size field the message
    /// carries, as the kernel reports it).
    pub private_data: Vec<u8>,
    /// Responder resources (RDMA READ/atomic depth offered).
    pub responder_resources: u8,
    /// Initiator depth.
    pub initiator_depth: u8,
    /// End-to-end flow control.
    pub flow_control: u8,
    /// Transport retries (7 = unlimited as on rxe).
    pub retry_count: u8,
    /// RNR retries.
    pub rnr_retry_count: u8,
    /// The QP uses an SRQ.
    pub srq: bool,
    /// QPN (the sender's own QP; for events the remote QP).
    pub qp_num: u32,
    /// The starting PSN of the REQ or REP (kernel cm's convention: the
    /// PSN the sender's receive queue expects first, which the peer's
    /// send queue starts at).
    pub psn: u32,
    /// UD Q_Key.
    pub qkey: u32,
    /// ECE vendor ID.
    pub ece_vendor_id: u32,
    /// ECE attribute modifier.
    pub ece_attr_mod: u32,
}

/// A request on the command connection.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Request {
    /// Make an event channel: `OK chan=N` plus its socket.
    Channel,
    /// `rdma_create_id`: `OK id=N`.
    Create {
        /// Channel events go to.
        chan: u64,
        /// Port space (`RDMA_PS_TCP` 0x106, `RDMA_PS_UDP` 0x111, ...).
        ps: u16,
        /// `enum ibv_qp_type` (2 RC, 4 UD).
        qp_type: u32,
    },
    /// `rdma_destroy_id`: `OK`.
    Destroy {
        /// The id.
        id: u64,
    },
    /// `rdma_bind_addr`: `OK src= sport= [device=]`.
    Bind {
        /// The id.
        id: u64,
        /// Address (unspecified: any).
        addr: IpAddr,
        /// Port (0: pick one).
        port: u16,
    },
    /// `rdma_resolve_addr`: `OK`, then ADDR_RESOLVED or ADDR_ERROR.
    ResolveAddr {
        /// The id.
        id: u64,
        /// Source address and port, if the caller gave one.
        src: Option<(IpAddr, u16)>,
        /// Destination.
        dst: (IpAddr, u16),
        /// Timeout.
        timeout_ms: u32,
    },
    /// `rdma_resolve_route`: `OK`, then ROUTE_RESOLVED or ROUTE_ERROR.
    ResolveRoute {
        /// The id.
        id: u64,
        /// Timeout.
        timeout_ms: u32,
    },
    /// `rdma_listen`: `OK src= sport= [device=]`.
    Listen {
        /// The id.
        id: u64,
        /// Backlog.
        backlog: i32,
    },
    /// `rdma_connect`: `OK`; a REQ (RC) or SIDR_REQ (UD) goes out.
    Connect {
        /// The id.
        id: u64,
        /// Our side's parameters (our QPN and starting PSN).
        param: ConnParam,
    },
    /// `rdma_accept`: `OK`; a REP (RC) or SIDR_REP (UD) goes out.
    Accept {
        /// The id (from CONNECT_REQUEST).
        id: u64,
        /// Our side's parameters.
        param: ConnParam,
    },
    /// `rdma_reject`: `OK`; a REJ (consumer reject) goes out.
    Reject {
        /// The id (from CONNECT_REQUEST).
        id: u64,
        /// Private data for the REJ.
        private_data: Vec<u8>,
        /// ECE to reject with (`rdma_reject_ece`), 0 for none.
        reason: u8,
    },
    /// The active side's QP is at RTS: send the RTU (`rdma_establish`).
    Establish {
        /// The id.
        id: u64,
    },
    /// `rdma_disconnect`: `OK`; a DREQ (or DREP) goes out.
    Disconnect {
        /// The id.
        id: u64,
    },
    /// `rdma_notify` (`IBV_EVENT_COMM_EST` = 9): `OK`.
    Notify {
        /// The id.
        id: u64,
        /// The `enum ibv_event_type`.
        event: u32,
    },
    /// `rdma_migrate_id`: `OK`; later events go to `chan`.
    Migrate {
        /// The id.
        id: u64,
        /// New channel.
        chan: u64,
    },
    /// `rdma_set_option`: `OK`, or `ERR errno=..` for what rxe lacks.
    SetOption {
        /// The id.
        id: u64,
        /// `RDMA_OPTION_ID` (0) or `RDMA_OPTION_IB` (1).
        level: i32,
        /// The option.
        name: i32,
        /// Its value.
        value: Vec<u8>,
    },
    /// `rdma_join_multicast`: `OK`, then MULTICAST_JOIN.
    Join {
        /// The id.
        id: u64,
        /// The group.
        addr: IpAddr,
        /// Join flags (`RDMA_MC_JOIN_FLAG_*`).
        flags: u32,
    },
    /// `rdma_leave_multicast`: `OK`.
    Leave {
        /// The id.
        id: u64,
        /// The group.
        addr: IpAddr,
    },
    /// Deliver `event` again, on `chan`: `rdma_migrate_id` hands the
    /// events of the id that were already in the old channel's socket to
    /// the new one (as the kernel moves them between ucma files), so the
    /// new channel's fd shows them to `poll`. The library also posts its
    /// own events this way (what the kernel's `WRITE_CM_EVENT` does for
    /// rdma-core): `rdma_write_cm_event`'s USER event and
    /// `rdma_resolve_addrinfo`'s ADDRINFO_RESOLVED. The daemon sends the
    /// event to the channel's socket before the `OK` (unless the socket
    /// is full; then it follows as the process reads).
    Requeue {
        /// The channel.
        chan: u64,
        /// The event, as it was received.
        event: CmEvent,
    },
}

/// Parse errors and ERR replies: an errno and words.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CmErr {
    /// Positive errno.
    pub errno: i32,
    /// Why.
    pub message: String,
}

impl CmErr {
    /// An error with `errno` and `message`.
    pub fn new(errno: i32, message: impl Into<String>) -> CmErr {
        CmErr {
            errno,
            message: message.into(),
        }
    }

    /// The `ERR errno=N message` line (without newline).
    pub fn to_line(&self) -> String {
        format!(
            "ERR errno={} {}",
            self.errno,
            self.message.replace('\n', " ")
        )
    }
}

impl std::fmt::Display for CmErr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} (errno {})", self.message, self.errno)
    }
}

fn bad(what: impl Into<String>) -> CmErr {
    CmErr::new(libc::EINVAL, what)
}

/// Hex of bytes.
pub fn hex(b: &[u8]) -> String {
    let mut s = String::with_capacity(b.len() * 2);
    for x in b {
        let _ = write!(s, "{x:02x}");
    }
    s
}

/// Bytes of hex.
pub fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

/// The `key=value` words of a line after its verb.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Fields(HashMap<String, String>);

impl Fields {
    /// Parse the words after the verb.
    pub fn parse<'a>(words: impl Iterator<Item = &'a str>) -> Result<Fields, CmErr> {
        let mut m = HashMap::new();
        for w in words {
            let (k, v) = w
                .split_once('=')
                .ok_or_else(|| bad(format!("{w:?} is not key=value")))?;
            m.insert(k.to_string(), v.to_string());
        }
        Ok(Fields(m))
    }

    /// The raw value.
    pub fn get(&self, k: &str) -> Option<&str> {
        self.0.get(k).map(String::as_str)
    }

    /// A required raw value.
    pub fn req(&self, k: &str) -> Result<&str, CmErr> {
        self.get(k).ok_or_else(|| bad(format!("{k}= missing")))
    }

    fn num_of(k: &str, v: &str) -> Result<u64, CmErr> {
        let r = match v.strip_prefix("0x") {
            Some(h) => u64::from_str_radix(h, 16),
            None => v.parse(),
        };
        r.map_err(|_| bad(format!("{k}={v:?} is not a number")))
    }

    /// A required unsigned number.
    pub fn u64(&self, k: &str) -> Result<u64, CmErr> {
        Self::num_of(k, self.req(k)?)
    }

    /// An optional unsigned number (absent: `default`).
    pub fn u64_or(&self, k: &str, default: u64) -> Result<u64, CmErr> {
        self.get(k).map_or(Ok(default), |v| Self::num_of(k, v))
    }

    /// A required number that fits `T`.
    pub fn num<T: TryFrom<u64>>(&self, k: &str) -> Result<T, CmErr> {
        T::try_from(self.u64(k)?).map_err(|_| bad(format!("{k} out of range")))
    }

    /// An optional number that fits `T`.
    pub fn num_or<T: TryFrom<u64>>(&self, k: &str, default: T) -> Result<T, CmErr> {
        match self.get(k) {
            None => Ok(default),
            Some(v) => {
                T::try_from(Self::num_of(k, v)?).map_err(|_| bad(format!("{k} out of range")))
            }
        }
    }

    /// A required signed number.
    pub fn i64(&self, k: &str) -> Result<i64, CmErr> {
        let v = self.req(k)?;
        v.parse()
            .map_err(|_| bad(format!("{k}={v:?} is not a number")))
    }

    /// A required address.
    pub fn ip(&self, k: &str) -> Result<IpAddr, CmErr> {
        let v = self.req(k)?;
        v.parse()
            .map_err(|_| bad(format!("{k}={v:?} is not an address")))
    }

    /// An optional address.
    pub fn ip_opt(&self, k: &str) -> Result<Option<IpAddr>, CmErr> {
        self.get(k).map(|_| self.ip(k)).transpose()
    }

    /// Hex bytes (absent: empty).
    pub fn bytes(&self, k: &str) -> Result<Vec<u8>, CmErr> {
        match self.get(k) {
            None | Some("") => Ok(Vec::new()),
            Some(v) => unhex(v).ok_or_else(|| bad(format!("{k}= is not hex"))),
        }
    }

    /// A 16-byte GID in hex.
    pub fn gid(&self, k: &str) -> Result<Option<[u8; 16]>, CmErr> {
        match self.get(k) {
            None => Ok(None),
            Some(v) => unhex(v)
                .and_then(|b| <[u8; 16]>::try_from(b).ok())
                .map(Some)
                .ok_or_else(|| bad(format!("{k}= is not a GID"))),
        }
    }
}

impl ConnParam {
    fn write(&self, s: &mut String) {
        let _ = write!(
            s,
            " rr={} ini={} flow={} retry={} rnr={} srq={} qpn={:#x} psn={:#x} qkey={:#x} ece_vendor={:#x} ece_attr={:#x} pd={}",
            self.responder_resources,
            self.initiator_depth,
            self.flow_control,
            self.retry_count,
            self.rnr_retry_count,
            u8::from(self.srq),
            self.qp_num,
            self.psn,
            self.qkey,
            self.ece_vendor_id,
            self.ece_attr_mod,
            hex(&self.private_data)
        );
    }

    fn read(f: &Fields) -> Result<ConnParam, CmErr> {
        Ok(ConnParam {
            private_data: f.bytes("pd")?,
            responder_resources: f.num_or("rr", 0)?,
            initiator_depth: f.num_or("ini", 0)?,
            flow_control: f.num_or("flow", 0)?,
            retry_count: f.num_or("retry", 0)?,
            rnr_retry_count: f.num_or("rnr", 0)?,
            srq: f.num_or::<u8>("srq", 0)? != 0,
            qp_num: f.num_or("qpn", 0)?,
            psn: f.num_or("psn", 0)?,
            qkey: f.num_or("qkey", 0)?,
            ece_vendor_id: f.num_or("ece_vendor", 0)?,
            ece_attr_mod: f.num_or("ece_attr", 0)?,
        })
    }
}

impl Request {
    /// The request line (without newline).
    pub fn to_line(&self) -> String {
        let mut s = String::new();
        match self {
            Request::Channel => s.push_str("CHANNEL"),
            Request::Create { chan, ps, qp_type } => {
                let _ = write!(s, "CREATE chan={chan} ps={ps} qp_type={qp_type}");
            }
            Request::Destroy { id } => {
                let _ = write!(s, "DESTROY id={id}");
            }
            Request::Bind { id, addr, port } => {
                let _ = write!(s, "BIND id={id} addr={addr} port={port}");
            }
            Request::ResolveAddr {
                id,
                src,
                dst,
                timeout_ms,
            } => {
                let _ = write!(
                    s,
                    "RESOLVE_ADDR id={id} dst={} dport={} timeout_ms={timeout_ms}",
                    dst.0, dst.1
                );
                if let Some((a, p)) = src {
                    let _ = write!(s, " src={a} sport={p}");
                }
            }
            Request::ResolveRoute { id, timeout_ms } => {
                let _ = write!(s, "RESOLVE_ROUTE id={id} timeout_ms={timeout_ms}");
            }
            Request::Listen { id, backlog } => {
                let _ = write!(s, "LISTEN id={id} backlog={backlog}");
            }
            Request::Connect { id, param } => {
                let _ = write!(s, "CONNECT id={id}");
                param.write(&mut s);
            }
            Request::Accept { id, param } => {
                let _ = write!(s, "ACCEPT id={id}");
                param.write(&mut s);
            }
            Request::Reject {
                id,
                private_data,
                reason,
            } => {
                let _ = write!(s, "REJECT id={id} reason={reason} pd={}", hex(private_data));
            }
            Request::Establish { id } => {
                let _ = write!(s, "ESTABLISH id={id}");
            }
            Request::Disconnect { id } => {
                let _ = write!(s, "DISCONNECT id={id}");
            }
            Request::Notify { id, event } => {
                let _ = write!(s, "NOTIFY id={id} event={event}");
            }
            Request::Migrate { id, chan } => {
                let _ = write!(s, "MIGRATE id={id} chan={chan}");
            }
            Request::SetOption {
                id,
                level,
                name,
                value,
            } => {
                let _ = write!(
                    s,
                    "SET_OPTION id={id} level={level} name={name} value={}",
                    hex(value)
                );
            }
            Request::Join { id, addr, flags } => {
                let _ = write!(s, "JOIN id={id} addr={addr} flags={flags}");
            }
            Request::Leave { id, addr } => {
                let _ = write!(s, "LEAVE id={id} addr={addr}");
            }
            Request::Requeue { chan, event } => {
                let _ = write!(
                    s,
                    "REQUEUE chan={chan} ev={}",
                    hex(event.to_line().as_bytes())
                );
            }
        }
        s
    }

    /// Parse a request line.
    pub fn parse(line: &str) -> Result<Request, CmErr> {
        let mut words = line.split_whitespace();
        let verb = words.next().ok_or_else(|| bad("empty request"))?;
        let f = Fields::parse(words)?;
        let id = || f.u64("id");
        Ok(match verb {
            "CHANNEL" => Request::Channel,
            "CREATE" => Request::Create {
                chan: f.u64("chan")?,
                ps: f.num("ps")?,
                qp_type: f.num("qp_type")?,
            },
            "DESTROY" => Request::Destroy { id: id()? },
            "BIND" => Request::Bind {
                id: id()?,
                addr: f.ip("addr")?,
                port: f.num("port")?,
            },
            "RESOLVE_ADDR" => Request::ResolveAddr {
                id: id()?,
                src: match f.ip_opt("src")? {
                    Some(a) => Some((a, f.num_or("sport", 0)?)),
                    None => None,
                },
                dst: (f.ip("dst")?, f.num_or("dport", 0)?),
                timeout_ms: f.num_or("timeout_ms", 2000)?,
            },
            "RESOLVE_ROUTE" => Request::ResolveRoute {
                id: id()?,
                timeout_ms: f.num_or("timeout_ms", 2000)?,
            },
            "LISTEN" => Request::Listen {
                id: id()?,
                backlog: i32::try_from(f.i64("backlog")?).map_err(|_| bad("backlog"))?,
            },
            "CONNECT" => Request::Connect {
                id: id()?,
                param: ConnParam::read(&f)?,
            },
            "ACCEPT" => Request::Accept {
                id: id()?,
                param: ConnParam::read(&f)?,
            },
            "REJECT" => Request::Reject {
                id: id()?,
                private_data: f.bytes("pd")?,
                reason: f.num_or("reason", 0)?,
            },
            "ESTABLISH" => Request::Establish { id: id()? },
            "DISCONNECT" => Request::Disconnect { id: id()? },
            "NOTIFY" => Request::Notify {
                id: id()?,
                event: f.num("event")?,
            },
            "MIGRATE" => Request::Migrate {
                id: id()?,
                chan: f.u64("chan")?,
            },
            "SET_OPTION" => Request::SetOption {
                id: id()?,
                level: i32::try_from(f.i64("level")?).map_err(|_| bad("level"))?,
                name: i32::try_from(f.i64("name")?).map_err(|_| bad("name"))?,
                value: f.bytes("value")?,
            },
            "JOIN" => Request::Join {
                id: id()?,
                addr: f.ip("addr")?,
                flags: f.num_or("flags", 0)?,
            },
            "LEAVE" => Request::Leave {
                id: id()?,
                addr: f.ip("addr")?,
            },
            "REQUEUE" => Request::Requeue {
                chan: f.u64("chan")?,
                event: CmEvent::parse(&String::from_utf8_lossy(&f.bytes("ev")?))?,
            },
            other => {
                let shown: String = other.chars().take(30).collect();
                return Err(bad(format!("unknown CM request {shown:?}")));
            }
        })
    }
}

/// Where an id is bound or connected, as reported by `BIND`/`LISTEN`
/// replies and by events.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Addrs {
    /// Local address and port.
    pub src: Option<(IpAddr, u16)>,
    /// Remote address and port.
    pub dst: Option<(IpAddr, u16)>,
    /// The device the id is bound to.
    pub device: Option<String>,
    /// Local GID (route resolved / connection request).
    pub sgid: Option<[u8; 16]>,
    /// Remote GID.
    pub dgid: Option<[u8; 16]>,
    /// Path MTU (`enum ibv_mtu`, 1..=5).
    pub path_mtu: Option<u8>,
}

impl Addrs {
    /// Append as `key=value` words.
    pub fn write(&self, s: &mut String) {
        if let Some((a, p)) = self.src {
            let _ = write!(s, " src={a} sport={p}");
        }
        if let Some((a, p)) = self.dst {
            let _ = write!(s, " dst={a} dport={p}");
        }
        if let Some(d) = &self.device {
            let _ = write!(s, " device={d}");
        }
        if let Some(g) = self.sgid {
            let _ = write!(s, " sgid={}", hex(&g));
        }
        if let Some(g) = self.dgid {
            let _ = write!(s, " dgid={}", hex(&g));
        }
        if let Some(m) = self.path_mtu {
            let _ = write!(s, " mtu={m}");
        }
    }

    /// Read from fields.
    pub fn read(f: &Fields) -> Result<Addrs, CmErr> {
        let pair = |a: &str, p: &str| -> Result<Option<(IpAddr, u16)>, CmErr> {
            match f.ip_opt(a)? {
                Some(ip) => Ok(Some((ip, f.num_or(p, 0)?))),
                None => Ok(None),
            }
        };
        Ok(Addrs {
            src: pair("src", "sport")?,
            dst: pair("dst", "dport")?,
            device: f.get("device").map(str::to_string),
            sgid: f.gid("sgid")?,
            dgid: f.gid("dgid")?,
            path_mtu: f.get("mtu").map(|_| f.num("mtu")).transpose()?,
        })
    }
}

/// A reply on the command connection.
pub type Reply = Result<Fields, CmErr>;

/// Parse a reply line: `OK k=v ...` or `ERR errno=N words`.
pub fn parse_reply(line: &str) -> Reply {
    let line = line.trim_end();
    if line == "OK" {
        return Ok(Fields::default());
    }
    if let Some(rest) = line.strip_prefix("OK ") {
        return Fields::parse(rest.split_whitespace());
    }
    if let Some(rest) = line.strip_prefix("ERR ") {
        let (first, msg) = rest.split_once(' ').unwrap_or((rest, ""));
        if let Some(n) = first.strip_prefix("errno=").and_then(|n| n.parse().ok()) {
            return Err(CmErr::new(n, msg));
        }
        return Err(CmErr::new(libc::EIO, rest));
    }
    Err(CmErr::new(
        libc::EPROTO,
        format!("unexpected reply from rxe-emud: {line:?}"),
    ))
}

/// One event on an event channel.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CmEvent {
    /// The id the event is for (CONNECT_REQUEST: the new id).
    pub id: u64,
    /// CONNECT_REQUEST: the listening id it came to.
    pub listen_id: Option<u64>,
    /// [`event`] number.
    pub event: u32,
    /// Status as the kernel reports it: 0, a negative errno, or a REJ
    /// reason.
    pub status: i32,
    /// The peer's parameters (connection events; for UD ESTABLISHED the
    /// QPN and Q_Key to send to).
    pub param: Option<ConnParam>,
    /// Addresses (ADDR_RESOLVED, ROUTE_RESOLVED, CONNECT_REQUEST,
    /// MULTICAST_JOIN: `dst` is the group, `dgid` its MGID).
    pub addrs: Addrs,
    /// USER: the program's value for `param.arg` (key `arg`, written
    /// only when not 0).
    pub arg: u64,
}

impl CmEvent {
    /// The message (without newline).
    pub fn to_line(&self) -> String {
        let mut s = format!(
            "EV id={} event={} status={}",
            self.id, self.event, self.status
        );
        if let Some(l) = self.listen_id {
            let _ = write!(s, " listen_id={l}");
        }
        if let Some(p) = &self.param {
            s.push_str(" param=1");
            p.write(&mut s);
        }
        self.addrs.write(&mut s);
        if self.arg != 0 {
            let _ = write!(s, " arg={:#x}", self.arg);
        }
        s
    }

    /// Parse a message.
    pub fn parse(line: &str) -> Result<CmEvent, CmErr> {
        let mut words = line.split_whitespace();
        if words.next() != Some("EV") {
            return Err(CmErr::new(libc::EPROTO, "not an event message"));
        }
        let f = Fields::parse(words)?;
        Ok(CmEvent {
            id: f.u64("id")?,
            listen_id: f.get("listen_id").map(|_| f.u64("listen_id")).transpose()?,
            event: f.num("event")?,
            status: i32::try_from(f.i64("status")?).map_err(|_| bad("status"))?,
            param: if f.get("param").is_some() {
                Some(ConnParam::read(&f)?)
            } else {
                None
            },
            addrs: Addrs::read(&f)?,
            arg: f.u64_or("arg", 0)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_round_trip() {
        let p = ConnParam {
            private_data: vec![1, 2, 0xff],
            responder_resources: 4,
            initiator_depth: 3,
            flow_control: 1,
            retry_count: 7,
            rnr_retry_count: 6,
            srq: true,
            qp_num: 0x31011,
            psn: 0xabcdef,
            qkey: 0x1234_5678,
            ece_vendor_id: 0x15b3,
            ece_attr_mod: 9,
        };
        let all = [
            Request::Channel,
            Request::Create {
                chan: 3,
                ps: 0x106,
                qp_type: 2,
            },
            Request::Destroy { id: 9 },
            Request::Bind {
                id: 1,
                addr: "::".parse().unwrap(),
                port: 0,
            },
            Request::ResolveAddr {
                id: 1,
                src: Some(("10.0.0.1".parse().unwrap(), 5)),
                dst: ("10.0.0.2".parse().unwrap(), 7174),
                timeout_ms: 2000,
            },
            Request::ResolveAddr {
                id: 1,
                src: None,
                dst: ("fe80::1".parse().unwrap(), 1),
                timeout_ms: 1,
            },
            Request::ResolveRoute {
                id: 2,
                timeout_ms: 100,
            },
            Request::Listen { id: 2, backlog: -1 },
            Request::Connect {
                id: 2,
                param: p.clone(),
            },
            Request::Accept { id: 3, param: p },
            Request::Reject {
                id: 3,
                private_data: vec![],
                reason: 0,
            },
            Request::Establish { id: 3 },
            Request::Disconnect { id: 3 },
            Request::Notify { id: 3, event: 9 },
            Request::Migrate { id: 3, chan: 4 },
            Request::SetOption {
                id: 3,
                level: 0,
                name: 1,
                value: vec![0, 1],
            },
            Request::Join {
                id: 3,
                addr: "224.1.2.3".parse().unwrap(),
                flags: 0,
            },
            Request::Leave {
                id: 3,
                addr: "224.1.2.3".parse().unwrap(),
            },
            Request::Requeue {
                chan: 4,
                event: CmEvent {
                    id: 3,
                    event: event::DISCONNECTED,
                    ..CmEvent::default()
                },
            },
            Request::Requeue {
                chan: 4,
                event: CmEvent {
                    id: 3,
                    event: event::USER,
                    status: -5,
                    arg: u64::MAX,
                    ..CmEvent::default()
                },
            },
        ];
        for r in all {
            assert_eq!(Request::parse(&r.to_line()), Ok(r.clone()), "{r:?}");
        }
    }

    #[test]
    fn nonsense_is_an_error_not_a_panic() {
        for l in [
            "",
            "FOO",
            "BIND id=x addr=1.2.3.4 port=1",
            "BIND id=1 addr=nope port=1",
            "BIND id=1 addr=1.2.3.4 port=70000",
            "CONNECT id=1 pd=abc",
            "CONNECT id=1 rr=300",
            "CREATE chan",
        ] {
            assert!(Request::parse(l).is_err(), "{l:?}");
        }
        assert!(CmEvent::parse("EV id=1").is_err());
        assert!(CmEvent::parse("XX").is_err());
    }

    #[test]
    fn events_and_replies_round_trip() {
        let e = CmEvent {
            id: 5,
            listen_id: Some(2),
            event: event::CONNECT_REQUEST,
            status: -110,
            param: Some(ConnParam {
                private_data: vec![9; 56],
                qp_num: 17,
                ..ConnParam::default()
            }),
            addrs: Addrs {
                src: Some(("10.0.0.1".parse().unwrap(), 7174)),
                dst: Some(("10.0.0.2".parse().unwrap(), 40000)),
                device: Some("rxe0".into()),
                sgid: Some([1; 16]),
                dgid: Some([2; 16]),
                path_mtu: Some(3),
            },
            arg: 0x1234_5678_9abc_def0,
        };
        assert_eq!(CmEvent::parse(&e.to_line()), Ok(e));
        let plain = CmEvent {
            id: 1,
            event: event::DISCONNECTED,
            ..CmEvent::default()
        };
        assert_eq!(CmEvent::parse(&plain.to_line()), Ok(plain));
        assert_eq!(parse_reply("OK").unwrap(), Fields::default());
        assert_eq!(parse_reply("OK id=3").unwrap().u64("id"), Ok(3));
        assert_eq!(
            parse_reply("ERR errno=98 port 7174 is in use"),
            Err(CmErr::new(98, "port 7174 is in use"))
        );
        assert_eq!(
            parse_reply(&CmErr::new(22, "bad\nthing").to_line()),
            Err(CmErr::new(22, "bad thing"))
        );
        assert!(parse_reply("what").is_err());
    }
}
