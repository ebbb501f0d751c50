//! Events: one `recv` on the channel's socket per daemon event, turned
//! into a `struct rdma_cm_event` the way librdmacm's `rdma_get_cm_event`
//! turns ucma's: a connection request makes the new id, a connect
//! response brings the QP to RTS and sends the RTU (and becomes
//! ESTABLISHED), a multicast join attaches the QP. Events for ids that
//! are gone are skipped.

use std::ffi::{c_char, c_int, c_void};
use std::os::fd::BorrowedFd;

use emulator_daemon::cm_client::recv_event;
use emulator_daemon::cmproto::{event as ev, CmErr, CmEvent, ConnParam, Request};

use crate::abi::*;
use crate::id::{self, CmId, Role};
use crate::{err, qp};

pub const REJECTED: c_int = ev::REJECTED as c_int;

/// What we hand the program: the C event, the private data it points
/// to, and the id whose events it counts against.
#[repr(C)]
struct EventBox {
    ev: rdma_cm_event,
    private_data: [u8; 256],
    owner: *const CmId,
}

/// rdma-core's names; RDMA_CM_EVENT_USER and _INTERNAL have none there
/// ("UNKNOWN EVENT").
static NAMES: [&str; 18] = [
    "RDMA_CM_EVENT_ADDR_RESOLVED",
    "RDMA_CM_EVENT_ADDR_ERROR",
    "RDMA_CM_EVENT_ROUTE_RESOLVED",
    "RDMA_CM_EVENT_ROUTE_ERROR",
    "RDMA_CM_EVENT_CONNECT_REQUEST",
    "RDMA_CM_EVENT_CONNECT_RESPONSE",
    "RDMA_CM_EVENT_CONNECT_ERROR",
    "RDMA_CM_EVENT_UNREACHABLE",
    "RDMA_CM_EVENT_REJECTED",
    "RDMA_CM_EVENT_ESTABLISHED",
    "RDMA_CM_EVENT_DISCONNECTED",
    "RDMA_CM_EVENT_DEVICE_REMOVAL",
    "RDMA_CM_EVENT_MULTICAST_JOIN",
    "RDMA_CM_EVENT_MULTICAST_ERROR",
    "RDMA_CM_EVENT_ADDR_CHANGE",
    "RDMA_CM_EVENT_TIMEWAIT_EXIT",
    "RDMA_CM_EVENT_ADDRINFO_RESOLVED",
    "RDMA_CM_EVENT_ADDRINFO_ERROR",
];

/// `rdma_event_str`'s words for an event number.
pub fn name(e: c_int) -> &'static str {
    usize::try_from(e)
        .ok()
        .and_then(|i| NAMES.get(i))
        .copied()
        .unwrap_or("UNKNOWN EVENT")
}

#[no_mangle]
pub extern "C" fn rxe_rdma_event_str(event: c_int) -> *const c_char {
    static C_NAMES: std::sync::OnceLock<Vec<std::ffi::CString>> = std::sync::OnceLock::new();
    let names = C_NAMES.get_or_init(|| {
        NAMES
            .iter()
            .chain(std::iter::once(&"UNKNOWN EVENT"))
            .map(|s| std::ffi::CString::new(*s).unwrap_or_default())
            .collect()
    });
    let i = usize::try_from(event)
        .ok()
        .filter(|&i| i < NAMES.len())
        .unwrap_or(NAMES.len());
    names[i].as_ptr()
}

/// Ack an event we made.
///
/// # Safety
/// `e` came from [`get`] and is not used after.
pub unsafe fn ack(e: *mut rdma_cm_event) {
    // SAFETY: every event we hand out is the head of a boxed EventBox,
    // whose owner outlives it (destroy waits for the ack).
    unsafe {
        let b = Box::from_raw(e as *mut EventBox);
        (*b.owner).ack();
    }
}

#[no_mangle]
pub unsafe extern "C" fn rxe_rdma_ack_cm_event(event: *mut rdma_cm_event) -> c_int {
    crate::call("rdma_ack_cm_event", || {
        if event.is_null() {
            return Err(err(libc::EINVAL, "event is NULL"));
        }
        // SAFETY: the program hands back an event we made.
        unsafe { ack(event) };
        Ok(())
    })
}

/// Fill `param.conn` from the daemon's parameters.
fn conn_param(b: &mut EventBox, p: &ConnParam) {
    let n = p.private_data.len().min(b.private_data.len()).min(255);
    b.private_data[..n].copy_from_slice(&p.private_data[..n]);
    b.ev.param.conn = rdma_conn_param {
        private_data: if n > 0 {
            b.private_data.as_ptr() as *const c_void
        } else {
            std::ptr::null()
        },
        private_data_len: n as u8,
        responder_resources: p.responder_resources,
        initiator_depth: p.initiator_depth,
        flow_control: p.flow_control,
        retry_count: p.retry_count,
        rnr_retry_count: p.rnr_retry_count,
        srq: u8::from(p.srq),
        qp_num: p.qp_num,
    };
}

/// Fill `param.ud` from the daemon's parameters and the id's address
/// vector to the peer.
fn ud_param(b: &mut EventBox, c: &CmId, p: Option<&ConnParam>) {
    let empty = ConnParam::default();
    let p = p.unwrap_or(&empty);
    let n = p.private_data.len().min(b.private_data.len()).min(255);
    b.private_data[..n].copy_from_slice(&p.private_data[..n]);
    let ah_attr = if c.verbs().is_null() {
        ibv_ah_attr::default()
    } else {
        qp::ah_attr(c)
    };
    b.ev.param.ud = rdma_ud_param {
        private_data: if n > 0 {
            b.private_data.as_ptr() as *const c_void
        } else {
            std::ptr::null()
        },
        private_data_len: n as u8,
        ah_attr,
        qp_num: p.qp_num,
        qkey: p.qkey,
    };
}

fn is_ud(c: &CmId) -> bool {
    c.qp_type() == IBV_QPT_UD
}

/// A connection request: the new id, on the listener's channel with the
/// listener's context (librdmacm `ucma_process_conn_req`).
fn new_conn_id(listener: &CmId, e: &CmEvent) -> Result<&'static CmId, CmErr> {
    // SAFETY: the listener is live (counted event).
    let (chan, context) = unsafe {
        let l = id::raw(listener);
        ((*l).channel, (*l).context)
    };
    let c = id::create(chan, context, listener.ps(), listener.qp_type(), Some(e.id))?;
    let setup = (|| {
        if let Some(p) = &e.param {
            qp::note_request(c, p);
        } else {
            c.st().role = Role::Passive;
        }
        id::apply_addrs(c, &e.addrs)?;
        id::set_path_rec(c);
        if listener.st().sync {
            id::migrate(c, std::ptr::null_mut())?;
        }
        Ok(())
    })();
    if let Err(err) = setup {
        // SAFETY: the new id was never handed out.
        let _ = unsafe { id::destroy(c) };
        return Err(err);
    }
    Ok(c)
}

/// Turn a daemon event into a C event, or None to skip it.
fn process(mut e: CmEvent) -> Option<Box<EventBox>> {
    // The daemon reports the peer's REQ/REP values; kernel cm reports
    // them from the receiver's side (`cm_format_req_event`,
    // `cm_format_rep_event`: our responder resources are the peer's
    // initiator depth), and so do we, to the program and to our QP.
    if e.event == ev::CONNECT_REQUEST || e.event == ev::CONNECT_RESPONSE {
        if let Some(p) = e.param.as_mut() {
            std::mem::swap(&mut p.responder_resources, &mut p.initiator_depth);
        }
    }
    let listener = if e.event == ev::CONNECT_REQUEST {
        match e.listen_id {
            Some(l) => Some(id::lookup_for_event(l)?),
            None => return None,
        }
    } else {
        None
    };
    let (owner, target): (&CmId, &CmId) = match listener {
        Some(l) => match new_conn_id(l, &e) {
            Ok(c) => (l, c),
            Err(err) => {
                id::skipped(&format!("connection request: {err}"));
                let _ = crate::conn::request(&emulator_daemon::cmproto::Request::Reject {
                    id: e.id,
                    private_data: Vec::new(),
                    reason: 0,
                });
                l.ack();
                return None;
            }
        },
        None => match id::lookup_for_event(e.id) {
            Some(c) => (c, c),
            None => {
                id::skipped(&format!("event {} for id {} that is gone", e.event, e.id));
                return None;
            }
        },
    };
    let mut b = Box::new(EventBox {
        // SAFETY: all-zero is a valid rdma_cm_event (NULL pointers).
        ev: unsafe { std::mem::zeroed() },
        private_data: [0; 256],
        owner,
    });
    b.ev.id = id::raw(target);
    b.ev.listen_id = listener.map_or(std::ptr::null_mut(), id::raw);
    b.ev.event = e.event as c_int;
    b.ev.status = e.status;
    let c = target;
    let skip = |c: &CmId| {
        c.ack();
        None
    };
    match e.event {
        ev::ADDR_RESOLVED => {
            if let Err(er) = id::apply_addrs(c, &e.addrs) {
                b.ev.event = ev::ADDR_ERROR as c_int;
                b.ev.status = -er.errno;
            } else if c.verbs().is_null() {
                b.ev.event = ev::ADDR_ERROR as c_int;
                b.ev.status = -libc::ENODEV;
            }
        }
        ev::ROUTE_RESOLVED => match id::apply_addrs(c, &e.addrs) {
            Ok(()) => id::set_path_rec(c),
            Err(er) => {
                b.ev.event = ev::ROUTE_ERROR as c_int;
                b.ev.status = -er.errno;
            }
        },
        ev::CONNECT_REQUEST => {
            if is_ud(c) {
                ud_param(&mut b, c, e.param.as_ref());
            } else if let Some(p) = &e.param {
                conn_param(&mut b, p);
            }
        }
        ev::CONNECT_RESPONSE => {
            let p = e.param.clone().unwrap_or_default();
            qp::note_reply(c, &p);
            conn_param(&mut b, &p);
            if !c.qp().is_null() {
                let r = qp::modify_rtr(c, RDMA_MAX_RESP_RES)
                    .and_then(|()| qp::modify_rts(c, RDMA_MAX_INIT_DEPTH))
                    .and_then(|()| id::establish(c));
                match r {
                    Ok(()) => b.ev.event = ev::ESTABLISHED as c_int,
                    Err(er) => {
                        crate::debug(|| format!("connect response: {er}"));
                        qp::modify_err(c);
                        b.ev.event = ev::CONNECT_ERROR as c_int;
                        b.ev.status = -er.errno;
                        c.st().connect_error = true;
                    }
                }
            }
        }
        ev::ESTABLISHED => {
            if is_ud(c) {
                if let Some(p) = &e.param {
                    c.st().remote_qpn = p.qp_num;
                }
                let _ = id::apply_addrs(c, &e.addrs);
                ud_param(&mut b, c, e.param.as_ref());
            } else if let Some(p) = &e.param {
                conn_param(&mut b, p);
            }
        }
        ev::REJECTED => {
            if c.st().connect_error {
                return skip(owner);
            }
            if let Some(p) = &e.param {
                conn_param(&mut b, p);
            }
            qp::modify_err(c);
        }
        ev::DISCONNECTED => {
            if c.st().connect_error {
                return skip(owner);
            }
            if let Some(p) = &e.param {
                conn_param(&mut b, p);
            }
        }
        ev::MULTICAST_JOIN | ev::MULTICAST_ERROR => {
            crate::mcast::process(c, &e, &mut b.ev, &mut b.private_data);
        }
        // The library's own events (rdma_write_cm_event,
        // rdma_resolve_addrinfo): status as posted, no parameters but
        // USER's value.
        ev::USER => b.ev.param.arg = e.arg,
        ev::ADDRINFO_RESOLVED | ev::ADDRINFO_ERROR => {}
        _ => {
            if is_ud(c) {
                ud_param(&mut b, c, e.param.as_ref());
            } else if let Some(p) = &e.param {
                conn_param(&mut b, p);
            }
        }
    }
    // The private data pointer must follow the box: it moved into place
    // above already (Box keeps its address), nothing to fix up.
    Some(b)
}

/// `rdma_get_cm_event` on a channel: the next event that is for a live
/// id (EAGAIN on a non-blocking channel with none waiting; ENODEV when
/// the daemon is gone).
///
/// # Safety
/// `channel` is a channel we made.
pub unsafe fn get(channel: *mut rdma_event_channel) -> Result<*mut rdma_cm_event, CmErr> {
    if channel.is_null() {
        return Err(err(libc::EINVAL, "channel is NULL"));
    }
    // SAFETY: the channel's fd stays open while the program uses it.
    let fd = unsafe { BorrowedFd::borrow_raw((*channel).fd) };
    loop {
        let e = recv_event(fd)?;
        if let Some(b) = process(e) {
            return Ok(Box::into_raw(b) as *mut rdma_cm_event);
        }
    }
}

/// Put an event of the library's own for `c` on the id's channel, as
/// rdma-core does with the kernel's `WRITE_CM_EVENT`: it goes through the
/// daemon, so the channel's fd shows it to `poll`, in order with the
/// daemon's events, and it moves with the id on `rdma_migrate_id`.
pub fn post(c: &CmId, event: u32, status: c_int, arg: u64) -> Result<(), CmErr> {
    // SAFETY: the id is live; its channel is one we made.
    let chan = unsafe { (*id::raw(c)).channel as *const id::Channel };
    if chan.is_null() {
        return Err(err(libc::EINVAL, "the id has no event channel"));
    }
    // SAFETY: as above.
    let chan = unsafe { (*chan).handle };
    crate::conn::request(&Request::Requeue {
        chan,
        event: CmEvent {
            id: c.handle,
            event,
            status,
            arg,
            ..CmEvent::default()
        },
    })
    .map(|_| ())
}

/// rdma-core v60+ `rdma_write_cm_event`: only RDMA_CM_EVENT_USER may be
/// written (EINVAL else); the program reads it back with its `status`
/// and `arg` in `param.arg`.
#[no_mangle]
pub unsafe extern "C" fn rxe_rdma_write_cm_event(
    id: *mut rdma_cm_id,
    event: c_int,
    status: c_int,
    arg: u64,
) -> c_int {
    crate::call("rdma_write_cm_event", || {
        // SAFETY: the program hands us an id we made (or NULL: EINVAL).
        let c = unsafe { id::cm(id)? };
        if event != ev::USER as c_int {
            return Err(err(
                libc::EINVAL,
                format!("event {event} is not RDMA_CM_EVENT_USER (18)"),
            ));
        }
        post(c, ev::USER, status, arg)
    })
}

#[no_mangle]
pub unsafe extern "C" fn rxe_rdma_get_cm_event(
    channel: *mut rdma_event_channel,
    event: *mut *mut rdma_cm_event,
) -> c_int {
    crate::guard("rdma_get_cm_event", -1, || {
        if event.is_null() {
            crate::set_errno(libc::EINVAL);
            return -1;
        }
        // SAFETY: the program's channel and out pointer.
        match unsafe { get(channel) } {
            Ok(e) => {
                // SAFETY: as above.
                unsafe { *event = e };
                0
            }
            // A non-blocking channel with nothing waiting is not worth a
            // debug message.
            Err(e) if e.errno == libc::EAGAIN => {
                crate::set_errno(libc::EAGAIN);
                -1
            }
            Err(e) => crate::fail("rdma_get_cm_event", &e),
        }
    })
}
