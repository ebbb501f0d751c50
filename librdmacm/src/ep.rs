//! The convenience layer of librdmacm: `rdma_create_ep`/`rdma_destroy_ep`,
//! `rdma_get_request` on synchronous listeners, and `rdma_get_devices`.

use std::ffi::{c_int, c_void};

use emulator_daemon::cmproto::CmErr;

use crate::abi::*;
use crate::id::{self, cm, raw, CmId};
use crate::{err, event, qp};

/// librdmacm `rdma_destroy_ep`.
fn destroy_ep(c: &'static CmId) -> Result<(), CmErr> {
    if !c.qp().is_null() {
        qp::destroy_qp(c);
    }
    // SAFETY: the id is live.
    if unsafe { !(*raw(c)).srq.is_null() } {
        qp::destroy_srq(c);
    }
    c.st().qp_init_attr = None;
    // SAFETY: the program gives the id up.
    unsafe { id::destroy(c) }
}

/// # Safety
/// The arguments are valid as `rdma_create_ep(3)` says.
unsafe fn create_ep(
    out: *mut *mut rdma_cm_id,
    res: *const rdma_addrinfo,
    pd: *mut ibv_pd,
    attr: *mut ibv_qp_init_attr,
) -> Result<(), CmErr> {
    // SAFETY: NULL or the program's addrinfo.
    let Some(res) = (unsafe { res.as_ref() }) else {
        return Err(err(libc::EINVAL, "res is NULL"));
    };
    if out.is_null() {
        return Err(err(libc::EINVAL, "id is NULL"));
    }
    let c = id::create(
        std::ptr::null_mut(),
        std::ptr::null_mut(),
        res.ai_port_space,
        res.ai_qp_type,
        None,
    )?;
    let cid = raw(c);
    let setup = || -> Result<(), CmErr> {
        if res.ai_flags & RAI_PASSIVE != 0 {
            // SAFETY: the program's addresses.
            if unsafe { crate::id::rxe_rdma_bind_addr(cid, res.ai_src_addr) } != 0 {
                return Err(err(crate::errno(), "rdma_bind_addr"));
            }
            if !pd.is_null() {
                // SAFETY: the id is live.
                unsafe { (*cid).pd = pd };
            }
            if !attr.is_null() {
                let mut copy = Box::new([0u8; std::mem::size_of::<ibv_qp_init_attr>()]);
                // SAFETY: the program's attributes, copied whole.
                unsafe {
                    std::ptr::copy_nonoverlapping(attr as *const u8, copy.as_mut_ptr(), copy.len());
                    (*(copy.as_mut_ptr() as *mut ibv_qp_init_attr)).qp_type = res.ai_qp_type;
                }
                c.st().qp_init_attr = Some(copy);
            }
            return Ok(());
        }
        // SAFETY: the program's addresses.
        if unsafe { crate::id::rxe_rdma_resolve_addr(cid, res.ai_src_addr, res.ai_dst_addr, 2000) }
            != 0
        {
            return Err(err(crate::errno(), "rdma_resolve_addr"));
        }
        // SAFETY: the id is live.
        if unsafe { crate::id::rxe_rdma_resolve_route(cid, 2000) } != 0 {
            return Err(err(crate::errno(), "rdma_resolve_route"));
        }
        if !attr.is_null() {
            // SAFETY: the program's attributes.
            unsafe {
                (*attr).qp_type = res.ai_qp_type;
                qp::create_qp(c, pd, attr)?;
            }
        }
        if res.ai_connect_len > 0 && !res.ai_connect.is_null() {
            // SAFETY: the program's connect data.
            let data = unsafe {
                std::slice::from_raw_parts(res.ai_connect as *const u8, res.ai_connect_len)
            };
            c.st().connect_data = data.to_vec();
        }
        Ok(())
    };
    if let Err(e) = setup() {
        let _ = destroy_ep(c);
        return Err(e);
    }
    // SAFETY: the program's out pointer.
    unsafe { *out = cid };
    Ok(())
}

#[no_mangle]
pub unsafe extern "C" fn rxe_rdma_create_ep(
    id: *mut *mut rdma_cm_id,
    res: *mut rdma_addrinfo,
    pd: *mut ibv_pd,
    qp_init_attr: *mut ibv_qp_init_attr,
) -> c_int {
    crate::call("rdma_create_ep", || {
        // SAFETY: the program's arguments.
        unsafe { create_ep(id, res, pd, qp_init_attr) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn rxe_rdma_destroy_ep(id: *mut rdma_cm_id) {
    crate::guard("rdma_destroy_ep", (), || {
        // SAFETY: the program gives up an id we made.
        if let Ok(c) = unsafe { cm(id) } {
            // SAFETY: as above.
            if let Err(e) = destroy_ep(unsafe { &*(c as *const CmId) }) {
                crate::debug(|| format!("rdma_destroy_ep: {e}"));
            }
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn rxe_rdma_get_request(
    listen: *mut rdma_cm_id,
    id: *mut *mut rdma_cm_id,
) -> c_int {
    crate::call("rdma_get_request", || {
        // SAFETY: the program's listener.
        let l = unsafe { cm(listen)? };
        if !l.st().sync || id.is_null() {
            return Err(err(
                libc::EINVAL,
                "rdma_get_request needs a listener made without an event channel",
            ));
        }
        let lr = raw(l);
        // SAFETY: the listener is live; its event is ours to ack.
        let ev = unsafe {
            if !(*lr).event.is_null() {
                event::ack((*lr).event);
                (*lr).event = std::ptr::null_mut();
            }
            event::get((*lr).channel)?
        };
        // SAFETY: ev is the event we just made.
        let (kind, status, new) = unsafe { ((*ev).event, (*ev).status, (*ev).id) };
        let fail = |e: CmErr| {
            // SAFETY: as above; librdmacm leaves the event on the listener.
            unsafe { (*lr).event = ev };
            Err(e)
        };
        if kind == event::REJECTED {
            return fail(err(libc::ECONNREFUSED, "rejected"));
        }
        if status != 0 {
            return fail(err(
                status.abs(),
                format!("{} (status {status})", event::name(kind)),
            ));
        }
        if kind != emulator_daemon::cmproto::event::CONNECT_REQUEST as c_int {
            return fail(err(
                libc::EINVAL,
                format!("unexpected {}", event::name(kind)),
            ));
        }
        let attr = l.st().qp_init_attr.clone();
        if let Some(mut a) = attr {
            // SAFETY: the new id is live; the attributes are our copy.
            let r = unsafe {
                qp::create_qp(cm(new)?, (*lr).pd, a.as_mut_ptr() as *mut ibv_qp_init_attr)
            };
            if let Err(e) = r {
                return fail(e);
            }
        }
        // SAFETY: the new id is live; the event is now its to hold.
        unsafe {
            (*new).event = ev;
            *id = new;
        }
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn rxe_rdma_get_devices(num_devices: *mut c_int) -> *mut *mut ibv_context {
    crate::guard("rdma_get_devices", std::ptr::null_mut(), || {
        let devs = crate::device::open_all();
        // SAFETY: a malloc'd NULL-terminated array, freed by
        // rdma_free_devices.
        unsafe {
            let p = libc::calloc(devs.len() + 1, std::mem::size_of::<*mut ibv_context>())
                as *mut *mut ibv_context;
            if !num_devices.is_null() {
                *num_devices = if p.is_null() { 0 } else { devs.len() as c_int };
            }
            if p.is_null() {
                crate::set_errno(libc::ENOMEM);
                return p;
            }
            for (i, d) in devs.iter().enumerate() {
                *p.add(i) = *d;
            }
            p
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn rxe_rdma_free_devices(list: *mut *mut ibv_context) {
    // The contexts stay open for the process, as librdmacm's do.
    // SAFETY: the array from rdma_get_devices.
    crate::guard("rdma_free_devices", (), || unsafe {
        libc::free(list as *mut c_void)
    })
}
