//! The verbs devices rdma_cm ids use: each opened once through
//! libibverbs and kept for the life of the process (as librdmacm keeps
//! its `cma_device`s), with a PD the library allocates for ids that are
//! given none, and the limits `rdma_connect`/`rdma_accept` check.

use std::ffi::{c_int, CStr};
use std::sync::Mutex;

use emulator_daemon::cmproto::CmErr;

use crate::abi::verbs::{ibv_device_attr, ibv_port_attr};
use crate::abi::{ibv_context, ibv_gid, ibv_pd};
use crate::{err, ffi};

/// What an id needs to know about its device.
#[derive(Clone, Copy, Debug)]
pub struct DevInfo {
    pub ctx: *mut ibv_context,
    pub pd: *mut ibv_pd,
    /// `max_qp_init_rd_atom`.
    pub max_initiator_depth: u8,
    /// `max_qp_rd_atom`.
    pub max_responder_resources: u8,
}

struct Dev {
    name: String,
    info: DevInfo,
    /// Port 1's GID table, read when first needed.
    gids: Vec<[u8; 16]>,
}

/// The raw pointers are libibverbs objects that live as long as the
/// process and are safe to use from any thread.
struct Devs(Vec<Dev>);
// SAFETY: see above; the Vec itself is only touched under the mutex.
unsafe impl Send for Devs {}

static DEVS: Mutex<Devs> = Mutex::new(Devs(Vec::new()));

/// The names of the devices libibverbs lists (this starts rxe-emud if
/// our libibverbs is loaded and none runs).
/// With `keep`, the list is not freed: the device structs it points to
/// must outlive the contexts opened from them.
fn device_names(keep: bool) -> Vec<(String, *mut crate::abi::ibv_device)> {
    let mut out = Vec::new();
    let mut n: c_int = 0;
    // SAFETY: plain libibverbs calls; the list is freed below, and the
    // device pointers stay valid for ibv_open_device until then.
    unsafe {
        let list = ffi::ibv_get_device_list(&mut n);
        if list.is_null() {
            return out;
        }
        for i in 0..n.max(0) as usize {
            let d = *list.add(i);
            if d.is_null() {
                break;
            }
            let name = CStr::from_ptr(ffi::ibv_get_device_name(d))
                .to_string_lossy()
                .into_owned();
            out.push((name, d));
        }
        if !keep || out.is_empty() {
            ffi::ibv_free_device_list(list);
        }
    }
    out
}

/// How many devices libibverbs sees.
pub fn count_devices() -> usize {
    device_names(false).len()
}

fn open_locked(devs: &mut Devs, name: &str) -> Result<DevInfo, CmErr> {
    if let Some(d) = devs.0.iter().find(|d| d.name == name) {
        return Ok(d.info);
    }
    let Some((_, dev)) = device_names(true).into_iter().find(|(n, _)| n == name) else {
        return Err(err(
            libc::ENODEV,
            format!("libibverbs has no device {name}"),
        ));
    };
    // SAFETY: dev is a device of the current list; the context we open is
    // kept for the life of the process.
    unsafe {
        let ctx = ffi::ibv_open_device(dev);
        if ctx.is_null() {
            return Err(err(
                crate::errno(),
                format!("ibv_open_device({name}) failed"),
            ));
        }
        let mut attr = ibv_device_attr::default();
        if ffi::ibv_query_device(ctx, &mut attr) != 0 {
            return Err(err(
                libc::ENODEV,
                format!("ibv_query_device({name}) failed"),
            ));
        }
        let pd = ffi::ibv_alloc_pd(ctx);
        if pd.is_null() {
            return Err(err(crate::errno(), format!("ibv_alloc_pd({name}) failed")));
        }
        let info = DevInfo {
            ctx,
            pd,
            max_initiator_depth: attr.max_qp_init_rd_atom.clamp(0, 255) as u8,
            max_responder_resources: attr.max_qp_rd_atom.clamp(0, 255) as u8,
        };
        devs.0.push(Dev {
            name: name.to_string(),
            info,
            gids: Vec::new(),
        });
        Ok(info)
    }
}

/// The device `name`, opened on first use.
pub fn open(name: &str) -> Result<DevInfo, CmErr> {
    let mut g = DEVS.lock().unwrap_or_else(|p| p.into_inner());
    open_locked(&mut g, name)
}

/// Every device, opened (for `rdma_get_devices`).
pub fn open_all() -> Vec<*mut ibv_context> {
    let names: Vec<String> = device_names(false).into_iter().map(|(n, _)| n).collect();
    let mut g = DEVS.lock().unwrap_or_else(|p| p.into_inner());
    names
        .iter()
        .filter_map(|n| open_locked(&mut g, n).ok().map(|i| i.ctx))
        .collect()
}

/// The index of `gid` in port 1's GID table of `ctx` (0 if absent).
pub fn gid_index(ctx: *mut ibv_context, gid: &[u8; 16]) -> u8 {
    let mut g = DEVS.lock().unwrap_or_else(|p| p.into_inner());
    let Some(d) = g.0.iter_mut().find(|d| d.info.ctx == ctx) else {
        return 0;
    };
    if d.gids.is_empty() {
        let mut pa = ibv_port_attr::default();
        // SAFETY: ctx is an open context; pa and the GID are ours.
        unsafe {
            let len = if ffi::ibv_query_port(ctx, 1, &mut pa) == 0 {
                pa.gid_tbl_len.clamp(0, 256)
            } else {
                16
            };
            for i in 0..len {
                let mut x = ibv_gid::default();
                if ffi::ibv_query_gid(ctx, 1, i, &mut x) != 0 {
                    break;
                }
                d.gids.push(x.raw);
            }
        }
    }
    d.gids
        .iter()
        .position(|g| g == gid)
        .map_or(0, |i| i.min(255) as u8)
}
