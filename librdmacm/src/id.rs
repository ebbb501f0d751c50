//! Event channels and `rdma_cm_id`s: creation, destruction, and the calls
//! that are one request to the daemon (bind, resolve, listen, connect,
//! accept, reject, disconnect, options, migrate).
//!
//! Each C `struct rdma_cm_id` is the first field of a [`CmId`] the
//! library owns; the daemon knows the id by its number (`handle`). Ids
//! created without a channel are *synchronous*, as in librdmacm: they get
//! a private channel, and the calls that produce an event wait for it
//! ([`complete`]).

use std::cell::UnsafeCell;
use std::collections::HashMap;
use std::ffi::{c_int, c_void};
use std::net::IpAddr;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::{Condvar, Mutex, MutexGuard};

use emulator_daemon::cmproto::{CmErr, ConnParam, Request};

use crate::abi::*;
use crate::device::DevInfo;
use crate::{conn, debug, err, event, qp, sockaddr};

/// `struct rdma_event_channel` and the daemon's channel it stands for.
#[repr(C)]
pub struct Channel {
    pub ch: rdma_event_channel,
    pub handle: u64,
    pub sock: OwnedFd,
}

/// Which end of a connection an id is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Role {
    #[default]
    None,
    Active,
    Passive,
}

/// A multicast group an id joined.
pub struct Mc {
    pub addr: IpAddr,
    pub context: *mut c_void,
    pub join_flags: u32,
    pub mgid: Option<[u8; 16]>,
}

/// What the library knows about an id besides its C struct.
#[derive(Default)]
pub struct IdState {
    /// Created without a channel: calls wait for their events.
    pub sync: bool,
    pub dev: Option<DevInfo>,
    pub role: Role,
    /// A CM connection exists (REQ received, or REP received): kernel
    /// `cm_init_qp_init_attr` then grants remote access.
    pub cm: bool,
    /// Our starting PSN: sent in the REQ/REP as kernel rdma_cm sends its
    /// `seq_num`, and our receive queue's PSN (kernel
    /// `rdma_init_qp_attr`: `rq_psn = id_priv->seq_num`).
    pub seq_num: u32,
    /// The peer's starting PSN: our send queue's PSN.
    pub remote_psn: u32,
    pub remote_qpn: u32,
    pub responder_resources: u8,
    pub initiator_depth: u8,
    pub retry_count: u8,
    pub rnr_retry_count: u8,
    /// `enum ibv_mtu` of the path.
    pub path_mtu: u8,
    pub sgid: [u8; 16],
    pub dgid: [u8; 16],
    pub tos: u8,
    /// `RDMA_OPTION_ID_ACK_TIMEOUT`.
    pub ack_timeout: Option<u8>,
    /// CONNECT_RESPONSE could not bring the QP up (librdmacm
    /// `connect_error`): later REJECTED/DISCONNECTED are not reported.
    pub connect_error: bool,
    /// `rdma_create_ep` on a passive endpoint: the QP each request gets.
    pub qp_init_attr: Option<Box<[u8; std::mem::size_of::<ibv_qp_init_attr>()]>>,
    /// `rai->ai_connect` of `rdma_create_ep`, sent before the private data.
    pub connect_data: Vec<u8>,
    pub local_ece: ibv_ece,
    pub remote_ece: ibv_ece,
    pub mcs: Vec<Mc>,
    /// `rdma_resolve_addrinfo` was called and its answer not yet queried
    /// (librdmacm `resolving_ai`): another call is EBUSY.
    pub resolving_ai: bool,
    /// Its answer, until `rdma_query_addrinfo` takes it; freed with the id.
    pub resolved_ai: crate::addrinfo::AiList,
}

/// Events handed to the program for an id and not yet acked.
#[derive(Default)]
pub struct EventCount {
    pub delivered: u64,
    pub acked: u64,
}

/// An `rdma_cm_id` as the library owns it.
#[repr(C)]
pub struct CmId {
    /// The program's struct: it reads and writes fields (`context`, ...),
    /// so we reach it only through raw pointers ([`raw`]).
    pub id: UnsafeCell<rdma_cm_id>,
    pub handle: u64,
    pub state: Mutex<IdState>,
    pub events: Mutex<EventCount>,
    pub acked: Condvar,
}

impl CmId {
    /// `id->qp`.
    pub fn qp(&self) -> *mut ibv_qp {
        // SAFETY: the id is live; a plain field read.
        unsafe { (*self.id.get()).qp }
    }

    /// `id->ps`.
    pub fn ps(&self) -> c_int {
        // SAFETY: as above.
        unsafe { (*self.id.get()).ps }
    }

    /// `id->qp_type`.
    pub fn qp_type(&self) -> c_int {
        // SAFETY: as above.
        unsafe { (*self.id.get()).qp_type }
    }

    /// `id->verbs`.
    pub fn verbs(&self) -> *mut ibv_context {
        // SAFETY: as above.
        unsafe { (*self.id.get()).verbs }
    }

    /// `id->pd`.
    pub fn pd(&self) -> *mut ibv_pd {
        // SAFETY: as above.
        unsafe { (*self.id.get()).pd }
    }

    pub fn st(&self) -> MutexGuard<'_, IdState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// One more event for this id handed to the program.
    pub fn delivered(&self) {
        self.events
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .delivered += 1;
    }

    /// One event for this id acked (or dropped before the program saw it).
    pub fn ack(&self) {
        let mut g = self.events.lock().unwrap_or_else(|p| p.into_inner());
        g.acked += 1;
        self.acked.notify_all();
    }
}

/// Live ids by daemon number, as addresses of their `CmId`. An event for
/// a number not here (destroyed, or never ours) is skipped.
static IDS: Mutex<Option<HashMap<u64, usize>>> = Mutex::new(None);

/// Look up an id and count an event as delivered to it, atomically with
/// respect to [`destroy_id`]'s removal (so the id outlives the event).
pub fn lookup_for_event(handle: u64) -> Option<&'static CmId> {
    let g = IDS.lock().unwrap_or_else(|p| p.into_inner());
    let p = *g.as_ref()?.get(&handle)?;
    // SAFETY: registered ids are live CmIds; destroy_id removes them
    // here before it waits for their events and frees them.
    let id = unsafe { &*(p as *const CmId) };
    id.delivered();
    Some(id)
}

/// The addresses of the live ids: a pointer the program hands us is used
/// only if it is one of them (see [`cm`]).
static LIVE: Mutex<Option<std::collections::HashSet<usize>>> = Mutex::new(None);

fn register(id: &CmId) {
    let mut g = IDS.lock().unwrap_or_else(|p| p.into_inner());
    g.get_or_insert_with(HashMap::new)
        .insert(id.handle, id as *const CmId as usize);
    LIVE.lock()
        .unwrap_or_else(|p| p.into_inner())
        .get_or_insert_with(Default::default)
        .insert(id as *const CmId as usize);
}

fn unregister(handle: u64) {
    let mut g = IDS.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(addr) = g.as_mut().and_then(|m| m.remove(&handle)) {
        if let Some(l) = LIVE.lock().unwrap_or_else(|p| p.into_inner()).as_mut() {
            l.remove(&addr);
        }
    }
}

/// The `CmId` of a C id pointer.
///
/// # Safety
/// `id` is NULL or an id this library made and has not freed.
pub unsafe fn cm<'a>(id: *mut rdma_cm_id) -> Result<&'a CmId, CmErr> {
    if id.is_null() {
        return Err(err(libc::EINVAL, "rdma_cm_id is NULL"));
    }
    // An id the program already destroyed (perftest 25.01's client calls
    // rdma_resolve_addr again on the id it destroyed after a REJECT) is
    // refused instead of read: its memory is freed.
    let live = LIVE
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .as_ref()
        .is_some_and(|l| l.contains(&(id as usize)));
    if !live {
        return Err(err(
            libc::EINVAL,
            "not a live rdma_cm_id (destroyed, or not made by this library)",
        ));
    }
    // SAFETY: a registered id: the rdma_cm_id is the first field of a live
    // repr(C) CmId.
    Ok(unsafe { &*(id as *const CmId) })
}

/// The mutable C struct of an id. The C struct is the program's as much
/// as ours (it reads and writes fields such as `context`), so it is
/// reached through the raw pointer, never through a Rust `&mut`
/// that could alias.
pub fn raw(id: &CmId) -> *mut rdma_cm_id {
    id.id.get()
}

// ---------------------------------------------------------------- channels

pub fn new_channel() -> Result<*mut Channel, CmErr> {
    let (handle, sock) = conn::channel()?;
    let fd = sock.as_raw_fd();
    Ok(Box::into_raw(Box::new(Channel {
        ch: rdma_event_channel { fd },
        handle,
        sock,
    })))
}

/// # Safety
/// `ch` is a channel from [`new_channel`], not used after.
pub unsafe fn free_channel(ch: *mut rdma_event_channel) {
    if !ch.is_null() {
        // SAFETY: as the caller promises; dropping closes the socket.
        drop(unsafe { Box::from_raw(ch as *mut Channel) });
    }
}

#[no_mangle]
pub extern "C" fn rxe_rdma_create_event_channel() -> *mut rdma_event_channel {
    crate::guard(
        "rdma_create_event_channel",
        std::ptr::null_mut(),
        || match new_channel() {
            Ok(c) => c as *mut rdma_event_channel,
            Err(e) => {
                crate::fail("rdma_create_event_channel", &e);
                std::ptr::null_mut()
            }
        },
    )
}

#[no_mangle]
pub unsafe extern "C" fn rxe_rdma_destroy_event_channel(channel: *mut rdma_event_channel) {
    // SAFETY: the program hands back a channel we made.
    crate::guard("rdma_destroy_event_channel", (), || unsafe {
        free_channel(channel)
    })
}

// ---------------------------------------------------------------- ids

fn random_psn() -> u32 {
    let mut b = [0u8; 4];
    // SAFETY: getrandom fills our 4-byte buffer.
    let n = unsafe { libc::getrandom(b.as_mut_ptr() as *mut c_void, 4, 0) };
    if n != 4 {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        b = t.to_le_bytes();
    }
    u32::from_le_bytes(b) & 0x00ff_ffff
}

/// Create an id on `channel` (NULL: a private channel, synchronous id)
/// with the daemon's number `handle` if given (a connection request's new
/// id), else a new one.
pub fn create(
    channel: *mut rdma_event_channel,
    context: *mut c_void,
    ps: c_int,
    qp_type: c_int,
    handle: Option<u64>,
) -> Result<&'static CmId, CmErr> {
    let (chan, sync) = if channel.is_null() {
        (new_channel()?, true)
    } else {
        (channel as *mut Channel, false)
    };
    // SAFETY: chan is a Channel we made (the program's or the new one).
    let chan_handle = unsafe { (*chan).handle };
    let handle = match handle {
        Some(h) => Ok(h),
        None => conn::request(&Request::Create {
            chan: chan_handle,
            ps: u16::try_from(ps).map_err(|_| err(libc::EINVAL, format!("port space {ps:#x}")))?,
            qp_type: u32::try_from(qp_type).unwrap_or(0),
        })
        .and_then(|f| f.u64("id")),
    };
    let handle = match handle {
        Ok(h) => h,
        Err(e) => {
            if sync {
                // SAFETY: the private channel is ours and unused.
                unsafe { free_channel(chan as *mut rdma_event_channel) };
            }
            return Err(e);
        }
    };
    // SAFETY: all-zero is a valid rdma_cm_id (NULL pointers, zero numbers).
    let mut cid: rdma_cm_id = unsafe { std::mem::zeroed() };
    cid.channel = chan as *mut rdma_event_channel;
    cid.context = context;
    cid.ps = ps;
    cid.qp_type = qp_type;
    let st = IdState {
        sync,
        seq_num: random_psn(),
        ..IdState::default()
    };
    let id = Box::leak(Box::new(CmId {
        id: UnsafeCell::new(cid),
        handle,
        state: Mutex::new(st),
        events: Mutex::new(EventCount::default()),
        acked: Condvar::new(),
    }));
    register(id);
    Ok(id)
}

#[no_mangle]
pub unsafe extern "C" fn rxe_rdma_create_id(
    channel: *mut rdma_event_channel,
    id: *mut *mut rdma_cm_id,
    context: *mut c_void,
    ps: c_int,
) -> c_int {
    crate::call("rdma_create_id", || {
        if id.is_null() {
            return Err(err(libc::EINVAL, "id is NULL"));
        }
        let qp_type = if ps == RDMA_PS_IPOIB || ps == RDMA_PS_UDP {
            IBV_QPT_UD
        } else {
            IBV_QPT_RC
        };
        let c = create(channel, context, ps, qp_type, None)?;
        // SAFETY: the program's out pointer.
        unsafe { *id = raw(c) };
        Ok(())
    })
}

/// Free what an id owns and the id itself, after its events are acked.
///
/// # Safety
/// `c` is a live id; nothing uses it after.
pub unsafe fn destroy(c: &'static CmId) -> Result<(), CmErr> {
    let r = conn::request(&Request::Destroy { id: c.handle });
    match &r {
        // The daemon is gone, and the id with it: free ours.
        Err(e) if e.errno == libc::ENODEV => {}
        Err(e) => return Err(e.clone()),
        Ok(_) => {}
    }
    unregister(c.handle);
    let cid = raw(c);
    // SAFETY: the id is live until freed below.
    unsafe {
        if !(*cid).event.is_null() {
            event::ack((*cid).event);
            (*cid).event = std::ptr::null_mut();
        }
    }
    // librdmacm's rdma_destroy_id blocks until every event reported for
    // the id has been acked: the program may still be reading one.
    {
        let mut g = c.events.lock().unwrap_or_else(|p| p.into_inner());
        while g.acked < g.delivered {
            g = c.acked.wait(g).unwrap_or_else(|p| p.into_inner());
        }
    }
    let sync = c.st().sync;
    // SAFETY: nothing refers to the id any more: it is unregistered and
    // all its events are acked; path_rec and the private channel are ours.
    unsafe {
        if !(*cid).route.path_rec.is_null() {
            drop(Box::from_raw((*cid).route.path_rec));
        }
        if sync {
            free_channel((*cid).channel);
        }
        drop(Box::from_raw(c as *const CmId as *mut CmId));
    }
    Ok(())
}

#[no_mangle]
pub unsafe extern "C" fn rxe_rdma_destroy_id(id: *mut rdma_cm_id) -> c_int {
    crate::call("rdma_destroy_id", || {
        // SAFETY: the program hands back an id we made.
        let c = unsafe { cm(id)? };
        // SAFETY: the program gives the id up.
        unsafe { destroy(&*(c as *const CmId)) }
    })
}

// ---------------------------------------------------------------- addresses

/// Take the device `name` for the id (once): `verbs`, `pd`, `port_num`.
pub fn acquire_device(c: &CmId, name: &str) -> Result<(), CmErr> {
    if c.st().dev.is_some() {
        return Ok(());
    }
    let d = crate::device::open(name)?;
    let cid = raw(c);
    // SAFETY: the id is live; these fields are librdmacm's to set.
    unsafe {
        (*cid).verbs = d.ctx;
        if (*cid).pd.is_null() {
            (*cid).pd = d.pd;
        }
        (*cid).port_num = 1;
        (*cid).route.addr.ibaddr.pkey = 0xffffu16.to_be();
    }
    c.st().dev = Some(d);
    Ok(())
}

/// Record what the daemon says about where the id is.
pub fn apply_addrs(c: &CmId, a: &emulator_daemon::cmproto::Addrs) -> Result<(), CmErr> {
    let cid = raw(c);
    // SAFETY: the id is live; route is librdmacm's to fill.
    unsafe {
        if let Some((ip, port)) = a.src {
            sockaddr::write(&mut (*cid).route.addr.src_storage, ip, port);
            if a.sgid.is_none() && !ip.is_unspecified() {
                (*cid).route.addr.ibaddr.sgid.raw = sockaddr::ip_gid(ip);
                c.st().sgid = sockaddr::ip_gid(ip);
            }
        }
        if let Some((ip, port)) = a.dst {
            sockaddr::write(&mut (*cid).route.addr.dst_storage, ip, port);
        }
        if let Some(g) = a.sgid {
            (*cid).route.addr.ibaddr.sgid.raw = g;
            c.st().sgid = g;
        }
        if let Some(g) = a.dgid {
            (*cid).route.addr.ibaddr.dgid.raw = g;
            c.st().dgid = g;
        }
    }
    if let Some(m) = a.path_mtu {
        c.st().path_mtu = m;
    }
    if let Some(d) = &a.device {
        acquire_device(c, d)?;
    }
    Ok(())
}

/// What kernel rdma_cm puts in a RoCE path record (`cma_resolve_iboe_route`):
/// one path, exactly this MTU and packet life time, P_Key 0xffff.
pub fn set_path_rec(c: &CmId) {
    let st = c.st();
    let rec = ibv_sa_path_rec {
        dgid: ibv_gid { raw: st.dgid },
        sgid: ibv_gid { raw: st.sgid },
        hop_limit: qp::HOP_LIMIT,
        traffic_class: st.tos,
        reversible: 1,
        numb_path: 1,
        pkey: 0xffffu16.to_be(),
        mtu_selector: 2,
        mtu: st.path_mtu,
        rate_selector: 2,
        rate: 0,
        packet_life_time_selector: 2,
        packet_life_time: qp::CMA_IBOE_PACKET_LIFETIME,
        ..ibv_sa_path_rec::default()
    };
    drop(st);
    let cid = raw(c);
    // SAFETY: the id is live; its path_rec is a Box we own (or NULL).
    unsafe {
        if !(*cid).route.path_rec.is_null() {
            drop(Box::from_raw((*cid).route.path_rec));
        }
        (*cid).route.path_rec = Box::into_raw(Box::new(rec));
        (*cid).route.num_paths = 1;
    }
}

/// For a synchronous id: ack its last event, wait for the next, and turn
/// its status into an error as librdmacm's `ucma_complete` does.
pub fn complete(c: &CmId) -> Result<(), CmErr> {
    if !c.st().sync {
        return Ok(());
    }
    let cid = raw(c);
    // SAFETY: the id is live; id->event is the last event we gave it.
    unsafe {
        if !(*cid).event.is_null() {
            event::ack((*cid).event);
            (*cid).event = std::ptr::null_mut();
        }
        let ev = event::get((*cid).channel)?;
        (*cid).event = ev;
        let status = (*ev).status;
        if status != 0 {
            let e = if (*ev).event == event::REJECTED {
                libc::ECONNREFUSED
            } else {
                status.abs()
            };
            return Err(err(
                e,
                format!("{} (status {status})", event::name((*ev).event)),
            ));
        }
    }
    Ok(())
}

fn cm_id<'a>(id: *mut rdma_cm_id) -> Result<&'a CmId, CmErr> {
    // SAFETY: the program hands us an id we made.
    unsafe { cm(id) }
}

/// Where a BIND or LISTEN reply says the id is: `src= sport=` as in
/// events (what rxe-emud sends), or `addr= port=` (cmproto's example).
fn bound_addrs(
    f: &emulator_daemon::cmproto::Fields,
) -> Result<emulator_daemon::cmproto::Addrs, CmErr> {
    let mut a = emulator_daemon::cmproto::Addrs::read(f)?;
    if let Some(ip) = f.ip_opt("addr")? {
        a.src = Some((ip, f.num_or("port", 0)?));
    }
    Ok(a)
}

#[no_mangle]
pub unsafe extern "C" fn rxe_rdma_bind_addr(
    id: *mut rdma_cm_id,
    addr: *mut libc::sockaddr,
) -> c_int {
    crate::call("rdma_bind_addr", || {
        let c = cm_id(id)?;
        // SAFETY: the program's address, readable as its family says.
        let (ip, port) = unsafe { sockaddr::read(addr)? };
        let f = conn::request(&Request::Bind {
            id: c.handle,
            addr: ip,
            port,
        })?;
        apply_addrs(c, &bound_addrs(&f)?)
    })
}

#[no_mangle]
pub unsafe extern "C" fn rxe_rdma_resolve_addr(
    id: *mut rdma_cm_id,
    src_addr: *mut libc::sockaddr,
    dst_addr: *mut libc::sockaddr,
    timeout_ms: c_int,
) -> c_int {
    crate::call("rdma_resolve_addr", || {
        let c = cm_id(id)?;
        // SAFETY: the program's addresses, readable as their family says.
        let dst = unsafe { sockaddr::read(dst_addr)? };
        let src = if src_addr.is_null() {
            None
        } else {
            // SAFETY: as above.
            Some(unsafe { sockaddr::read(src_addr)? })
        };
        conn::request(&Request::ResolveAddr {
            id: c.handle,
            src,
            dst,
            timeout_ms: u32::try_from(timeout_ms).unwrap_or(0),
        })?;
        // SAFETY: the id is live.
        unsafe { sockaddr::write(&mut (*raw(c)).route.addr.dst_storage, dst.0, dst.1) };
        complete(c)
    })
}

#[no_mangle]
pub unsafe extern "C" fn rxe_rdma_resolve_route(id: *mut rdma_cm_id, timeout_ms: c_int) -> c_int {
    crate::call("rdma_resolve_route", || {
        let c = cm_id(id)?;
        if c.st().dev.is_none() {
            return Err(err(libc::EINVAL, "the address is not resolved (no device)"));
        }
        conn::request(&Request::ResolveRoute {
            id: c.handle,
            timeout_ms: u32::try_from(timeout_ms).unwrap_or(0),
        })?;
        complete(c)
    })
}

#[no_mangle]
pub unsafe extern "C" fn rxe_rdma_listen(id: *mut rdma_cm_id, backlog: c_int) -> c_int {
    crate::call("rdma_listen", || {
        let c = cm_id(id)?;
        let f = conn::request(&Request::Listen {
            id: c.handle,
            backlog,
        })?;
        apply_addrs(c, &bound_addrs(&f)?)
    })
}

// ---------------------------------------------------------------- connecting

/// librdmacm `ucma_valid_param`.
fn valid_param(c: &CmId, p: Option<&rdma_conn_param>) -> Result<(), CmErr> {
    if c.ps() != RDMA_PS_TCP {
        return Ok(());
    }
    if c.qp().is_null() && p.is_none() {
        return Err(err(libc::EINVAL, "no QP on the id and no rdma_conn_param"));
    }
    let Some(p) = p else { return Ok(()) };
    let Some(d) = c.st().dev else {
        return Err(err(libc::EINVAL, "the id has no device yet"));
    };
    if p.responder_resources != RDMA_MAX_RESP_RES
        && p.responder_resources > d.max_responder_resources
    {
        return Err(err(
            libc::EINVAL,
            format!(
                "responder_resources {} > the device's max_qp_rd_atom {}",
                p.responder_resources, d.max_responder_resources
            ),
        ));
    }
    if p.initiator_depth != RDMA_MAX_INIT_DEPTH && p.initiator_depth > d.max_initiator_depth {
        return Err(err(
            libc::EINVAL,
            format!(
                "initiator_depth {} > the device's max_qp_init_rd_atom {}",
                p.initiator_depth, d.max_initiator_depth
            ),
        ));
    }
    Ok(())
}

/// The program's private data.
///
/// # Safety
/// `p`'s private_data is readable for private_data_len bytes.
unsafe fn private_data(p: Option<&rdma_conn_param>) -> Vec<u8> {
    match p {
        Some(p) if !p.private_data.is_null() && p.private_data_len > 0 => {
            // SAFETY: as the caller promises.
            unsafe {
                std::slice::from_raw_parts(p.private_data as *const u8, p.private_data_len as usize)
            }
            .to_vec()
        }
        _ => Vec::new(),
    }
}

fn check_len(what: &str, len: usize, max: usize) -> Result<(), CmErr> {
    if len > max {
        return Err(err(
            libc::EINVAL,
            format!("{what}: {len} bytes of private data, at most {max}"),
        ));
    }
    Ok(())
}

fn is_ud(c: &CmId) -> bool {
    c.qp_type() == IBV_QPT_UD
}

#[no_mangle]
pub unsafe extern "C" fn rxe_rdma_connect(
    id: *mut rdma_cm_id,
    conn_param: *mut rdma_conn_param,
) -> c_int {
    crate::call("rdma_connect", || {
        let c = cm_id(id)?;
        // SAFETY: NULL or the program's parameters.
        let p = unsafe { conn_param.as_ref() };
        valid_param(c, p)?;
        let dev = c.st().dev;
        let (max_ini, max_rr) = dev.map_or((0, 0), |d| {
            (d.max_initiator_depth, d.max_responder_resources)
        });
        let ini = p
            .filter(|p| p.initiator_depth != RDMA_MAX_INIT_DEPTH)
            .map_or(max_ini, |p| p.initiator_depth);
        let rr = p
            .filter(|p| p.responder_resources != RDMA_MAX_RESP_RES)
            .map_or(max_rr, |p| p.responder_resources);
        let (mut qp_num, mut srq) = p.map_or((0, false), |p| (p.qp_num, p.srq != 0));
        if !c.qp().is_null() {
            // SAFETY: the id's QP is live.
            unsafe {
                qp_num = (*c.qp()).qp_num;
                srq = !(*c.qp()).srq.is_null();
            }
        }
        // Kernel rdma_cm (`cma_connect_ib`) caps both at 7, the width of
        // the REQ's fields; libfabric asks for retry_count 15.
        let (retry, rnr) = p.map_or((7, 7), |p| (p.retry_count.min(7), p.rnr_retry_count.min(7)));
        let mut pd = std::mem::take(&mut c.st().connect_data);
        // SAFETY: the program's private data.
        pd.extend(unsafe { private_data(p) });
        // rdma_cm's 36-byte cma_hdr leaves 56 bytes of a REQ's 92 (and 180
        // of a SIDR_REQ's 216) to the program.
        check_len("rdma_connect", pd.len(), if is_ud(c) { 180 } else { 56 })?;
        let param = {
            let mut st = c.st();
            st.role = Role::Active;
            st.initiator_depth = ini;
            st.responder_resources = rr;
            st.retry_count = retry;
            st.rnr_retry_count = rnr;
            ConnParam {
                private_data: pd,
                responder_resources: rr,
                initiator_depth: ini,
                flow_control: p.map_or(0, |p| p.flow_control),
                retry_count: retry,
                rnr_retry_count: rnr,
                srq,
                qp_num,
                psn: st.seq_num,
                qkey: 0,
                ece_vendor_id: st.local_ece.vendor_id,
                ece_attr_mod: st.local_ece.options,
            }
        };
        conn::request(&Request::Connect {
            id: c.handle,
            param,
        })?;
        complete(c)
    })
}

#[no_mangle]
pub unsafe extern "C" fn rxe_rdma_accept(
    id: *mut rdma_cm_id,
    conn_param: *mut rdma_conn_param,
) -> c_int {
    crate::call("rdma_accept", || {
        let c = cm_id(id)?;
        if c.st().role == Role::Active {
            // An active id that took CONNECT_RESPONSE without a QP: the
            // kernel's rdma_accept then only sends the RTU.
            return establish(c);
        }
        // SAFETY: NULL or the program's parameters.
        let p = unsafe { conn_param.as_ref() };
        valid_param(c, p)?;
        let (qp_num, srq) = if !c.qp().is_null() {
            // SAFETY: the id's QP is live.
            unsafe { ((*c.qp()).qp_num, !(*c.qp()).srq.is_null()) }
        } else if let Some(p) = p {
            (p.qp_num, p.srq != 0)
        } else {
            return Err(err(libc::EINVAL, "no QP on the id and no rdma_conn_param"));
        };
        let (ini, rr) = {
            let mut st = c.st();
            let d = st.dev;
            let (max_ini, max_rr) = d.map_or((0, 0), |d| {
                (d.max_initiator_depth, d.max_responder_resources)
            });
            st.initiator_depth = match p {
                Some(p) if p.initiator_depth != RDMA_MAX_INIT_DEPTH => p.initiator_depth,
                _ => st.initiator_depth.min(max_ini),
            };
            st.responder_resources = match p {
                Some(p) if p.responder_resources != RDMA_MAX_RESP_RES => p.responder_resources,
                _ => st.responder_resources.min(max_rr),
            };
            (st.initiator_depth, st.responder_resources)
        };
        if !is_ud(c) {
            qp::modify_rtr(c, rr)?;
            qp::modify_rts(c, ini)?;
        }
        // SAFETY: the program's private data.
        let pd = unsafe { private_data(p) };
        check_len("rdma_accept", pd.len(), if is_ud(c) { 136 } else { 196 })?;
        let param = {
            let st = c.st();
            ConnParam {
                private_data: pd,
                responder_resources: rr,
                initiator_depth: ini,
                flow_control: p.map_or(0, |p| p.flow_control),
                // Capped at 7 as kernel rdma_cm caps them (`cma_accept_ib`).
                retry_count: p.map_or(7, |p| p.retry_count.min(7)),
                rnr_retry_count: p.map_or(7, |p| p.rnr_retry_count.min(7)),
                srq,
                qp_num,
                psn: st.seq_num,
                qkey: if is_ud(c) { qp::qkey_of(c) } else { 0 },
                ece_vendor_id: st.remote_ece.vendor_id,
                ece_attr_mod: st.local_ece.options,
            }
        };
        if let Err(e) = conn::request(&Request::Accept {
            id: c.handle,
            param,
        }) {
            qp::modify_err(c);
            return Err(e);
        }
        if is_ud(c) {
            if c.st().sync {
                let cid = raw(c);
                // SAFETY: the id is live; its event is ours to ack.
                unsafe {
                    if !(*cid).event.is_null() {
                        event::ack((*cid).event);
                        (*cid).event = std::ptr::null_mut();
                    }
                }
            }
            return Ok(());
        }
        complete(c)
    })
}

/// Send the RTU of an active connection (kernel `cma_rep_recv` without
/// the QP part).
pub fn establish(c: &CmId) -> Result<(), CmErr> {
    conn::request(&Request::Establish { id: c.handle }).map(|_| ())
}

#[no_mangle]
pub unsafe extern "C" fn rxe_rdma_establish(id: *mut rdma_cm_id) -> c_int {
    crate::call("rdma_establish", || {
        let c = cm_id(id)?;
        if !c.qp().is_null() {
            return Err(err(
                libc::EINVAL,
                "the id has a QP: the library established it with CONNECT_RESPONSE",
            ));
        }
        establish(c)
    })
}

fn reject(id: *mut rdma_cm_id, data: *const c_void, len: u8, reason: u8) -> Result<(), CmErr> {
    let c = cm_id(id)?;
    let pd = if data.is_null() || len == 0 {
        Vec::new()
    } else {
        // SAFETY: the program's private data of len bytes.
        unsafe { std::slice::from_raw_parts(data as *const u8, len as usize) }.to_vec()
    };
    check_len("rdma_reject", pd.len(), 148)?;
    conn::request(&Request::Reject {
        id: c.handle,
        private_data: pd,
        reason,
    })
    .map(|_| ())
}

#[no_mangle]
pub unsafe extern "C" fn rxe_rdma_reject(
    id: *mut rdma_cm_id,
    private_data: *const c_void,
    private_data_len: u8,
) -> c_int {
    crate::call("rdma_reject", || {
        reject(id, private_data, private_data_len, 0)
    })
}

#[no_mangle]
pub unsafe extern "C" fn rxe_rdma_reject_ece(
    id: *mut rdma_cm_id,
    private_data: *const c_void,
    private_data_len: u8,
) -> c_int {
    // IBTA: CM_REJ_VENDOR_OPTION_NOT_SUPPORTED is 35.
    crate::call("rdma_reject_ece", || {
        reject(id, private_data, private_data_len, 35)
    })
}

#[no_mangle]
pub unsafe extern "C" fn rxe_rdma_disconnect(id: *mut rdma_cm_id) -> c_int {
    crate::call("rdma_disconnect", || {
        let c = cm_id(id)?;
        if c.verbs().is_null() {
            return Err(err(libc::EINVAL, "the id has no device"));
        }
        // librdmacm `ucma_shutdown`: an IB-transport QP goes to ERR first.
        qp::modify_err_checked(c)?;
        conn::request(&Request::Disconnect { id: c.handle })?;
        complete(c)
    })
}

#[no_mangle]
pub unsafe extern "C" fn rxe_rdma_notify(id: *mut rdma_cm_id, event: c_int) -> c_int {
    crate::call("rdma_notify", || {
        let c = cm_id(id)?;
        conn::request(&Request::Notify {
            id: c.handle,
            event: u32::try_from(event).map_err(|_| err(libc::EINVAL, "event"))?,
        })
        .map(|_| ())
    })
}

#[no_mangle]
pub unsafe extern "C" fn rxe_rdma_set_option(
    id: *mut rdma_cm_id,
    level: c_int,
    optname: c_int,
    optval: *mut c_void,
    optlen: usize,
) -> c_int {
    crate::call("rdma_set_option", || {
        let c = cm_id(id)?;
        if optval.is_null() {
            return Err(err(libc::EINVAL, "optval is NULL"));
        }
        // SAFETY: the program's option value of optlen bytes.
        let value = unsafe { std::slice::from_raw_parts(optval as *const u8, optlen) }.to_vec();
        let want = |n: usize| {
            if optlen == n {
                Ok(())
            } else {
                Err(err(libc::EINVAL, format!("optlen {optlen}, expected {n}")))
            }
        };
        match (level, optname) {
            (RDMA_OPTION_ID, RDMA_OPTION_ID_TOS) => want(1)?,
            (RDMA_OPTION_ID, RDMA_OPTION_ID_REUSEADDR | RDMA_OPTION_ID_AFONLY) => {
                want(std::mem::size_of::<c_int>())?
            }
            (RDMA_OPTION_ID, RDMA_OPTION_ID_ACK_TIMEOUT) => want(1)?,
            (RDMA_OPTION_IB, RDMA_OPTION_IB_PATH) => {
                return Err(err(
                    libc::ENOSYS,
                    "RDMA_OPTION_IB_PATH: IB path records are not supported on rxe-emu (RoCE resolves routes itself)",
                ))
            }
            _ => {}
        }
        conn::request(&Request::SetOption {
            id: c.handle,
            level,
            name: optname,
            value: value.clone(),
        })?;
        let mut st = c.st();
        match (level, optname) {
            (RDMA_OPTION_ID, RDMA_OPTION_ID_TOS) => st.tos = value[0],
            (RDMA_OPTION_ID, RDMA_OPTION_ID_ACK_TIMEOUT) => st.ack_timeout = Some(value[0].min(31)),
            _ => {}
        }
        Ok(())
    })
}

/// Move an id to `channel` (NULL: a new private channel).
pub fn migrate(c: &CmId, channel: *mut rdma_event_channel) -> Result<(), CmErr> {
    let was_sync = c.st().sync;
    if was_sync && channel.is_null() {
        return Err(err(libc::EINVAL, "the id is synchronous already"));
    }
    let (chan, sync) = if channel.is_null() {
        (new_channel()?, true)
    } else {
        (channel as *mut Channel, false)
    };
    // SAFETY: chan is a Channel we made.
    let handle = unsafe { (*chan).handle };
    if let Err(e) = conn::request(&Request::Migrate {
        id: c.handle,
        chan: handle,
    }) {
        if sync {
            // SAFETY: our new, unused channel.
            unsafe { free_channel(chan as *mut rdma_event_channel) };
        }
        return Err(e);
    }
    let cid = raw(c);
    // Events of the id already in the old channel's socket move to the
    // new channel, as the kernel moves them between ucma files; the
    // others go back on the old channel, in their order.
    // SAFETY: the id is live and its channel is one of ours.
    let old = unsafe { (*cid).channel as *mut Channel };
    if !old.is_null() {
        // SAFETY: `old` is a live Channel until freed below.
        let (old_handle, waiting) = unsafe {
            (
                (*old).handle,
                emulator_daemon::cm_client::drain_events((*old).sock.as_fd()),
            )
        };
        for ev in waiting {
            let mine = ev.id == c.handle || ev.listen_id == Some(c.handle);
            let to = if mine { handle } else { old_handle };
            if !mine && was_sync {
                continue;
            }
            let r = conn::request(&Request::Requeue {
                chan: to,
                event: ev,
            });
            if let Err(e) = r {
                debug(|| format!("rdma_migrate_id: an event was lost: {e}"));
            }
        }
    }
    // SAFETY: the id is live; the old private channel is ours.
    unsafe {
        if was_sync {
            if !(*cid).event.is_null() {
                event::ack((*cid).event);
                (*cid).event = std::ptr::null_mut();
            }
            free_channel((*cid).channel);
        }
        (*cid).channel = chan as *mut rdma_event_channel;
    }
    c.st().sync = sync;
    Ok(())
}

#[no_mangle]
pub unsafe extern "C" fn rxe_rdma_migrate_id(
    id: *mut rdma_cm_id,
    channel: *mut rdma_event_channel,
) -> c_int {
    crate::call("rdma_migrate_id", || migrate(cm_id(id)?, channel))
}

#[no_mangle]
pub unsafe extern "C" fn rxe_rdma_get_src_port(id: *mut rdma_cm_id) -> u16 {
    crate::guard("rdma_get_src_port", 0, || {
        cm_id(id).ok().map_or(0, |c| {
            sockaddr::read_storage(unsafe { &(*raw(c)).route.addr.src_storage })
                .map_or(0, |(_, p)| p.to_be())
        })
    })
}

#[no_mangle]
pub unsafe extern "C" fn rxe_rdma_get_dst_port(id: *mut rdma_cm_id) -> u16 {
    crate::guard("rdma_get_dst_port", 0, || {
        cm_id(id).ok().map_or(0, |c| {
            sockaddr::read_storage(unsafe { &(*raw(c)).route.addr.dst_storage })
                .map_or(0, |(_, p)| p.to_be())
        })
    })
}

#[no_mangle]
pub unsafe extern "C" fn rxe_rdma_set_local_ece(id: *mut rdma_cm_id, ece: *mut ibv_ece) -> c_int {
    crate::call("rdma_set_local_ece", || {
        let c = cm_id(id)?;
        // SAFETY: NULL or the program's ece.
        let e = unsafe { ece.as_ref() };
        match e {
            Some(e) if c.qp().is_null() && e.vendor_id != 0 && e.comp_mask == 0 => {
                let mut st = c.st();
                st.local_ece.vendor_id = e.vendor_id;
                st.local_ece.options = e.options;
                Ok(())
            }
            _ => Err(err(libc::EINVAL, "bad ece, or the id has a QP")),
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn rxe_rdma_get_remote_ece(id: *mut rdma_cm_id, ece: *mut ibv_ece) -> c_int {
    crate::call("rdma_get_remote_ece", || {
        let c = cm_id(id)?;
        if !c.qp().is_null() || ece.is_null() {
            return Err(err(libc::EINVAL, "ece is NULL, or the id has a QP"));
        }
        let r = c.st().remote_ece;
        // SAFETY: the program's ece.
        unsafe {
            *ece = ibv_ece {
                vendor_id: r.vendor_id,
                options: r.options,
                comp_mask: 0,
            }
        };
        Ok(())
    })
}

/// Log a skipped event (debug only).
pub fn skipped(why: &str) {
    debug(|| format!("event skipped: {why}"));
}
