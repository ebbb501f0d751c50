//! XRC domains (`ibv_open_xrcd`/`ibv_close_xrcd`, verbs_context ops), which
//! kernel rxe lacks.
//!
//! As with the kernel's uverbs, an XRC domain opened with a file
//! descriptor is named by that file's inode: opening the same file again
//! (in this process, on this device) yields another `ibv_xrcd` of the same
//! domain; `O_CREAT` creates it when it does not exist, `O_EXCL` refuses
//! one that does. Each `ibv_close_xrcd` drops one reference; the last one
//! fails with EBUSY while XRC SRQs or XRC_RECV QPs still use the domain.
//! A domain cannot span processes: each process runs its own engine.

use std::collections::HashMap;
use std::ffi::c_int;
use std::sync::{Arc, Mutex};

use verbs_api::XrcDomain;

use crate::abi::{ibv_context, ibv_xrcd, ibv_xrcd_init_attr, verbs_xrcd};
use crate::device::ctx;
use crate::{debug, fail, guard, set_errno};

/// `IBV_XRCD_INIT_ATTR_FD`, `_OFLAGS`, and the first reserved bit.
const ATTR_FD: u32 = 1;
const ATTR_OFLAGS: u32 = 2;
const ATTR_RESERVED: u32 = 4;

/// One domain, shared by every `ibv_xrcd` opened on its inode.
pub struct Shared {
    pub domain: Mutex<Option<XrcDomain>>,
    /// The registry key of a domain named by an inode.
    key: Option<Key>,
}

/// (context, st_dev, st_ino).
type Key = (usize, u64, u64);

fn registry() -> std::sync::MutexGuard<'static, HashMap<Key, Arc<Shared>>> {
    static R: std::sync::OnceLock<Mutex<HashMap<Key, Arc<Shared>>>> = std::sync::OnceLock::new();
    R.get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner())
}

/// What an `ibv_xrcd` pointer we hand out points to.
#[repr(C)]
pub struct Xrcd {
    pub ibv: verbs_xrcd,
    pub shared: Arc<Shared>,
}

/// # Safety
/// `x` must be an XRCD we handed out and not closed.
pub unsafe fn xrcd<'a>(x: *mut std::ffi::c_void) -> &'a Xrcd {
    // SAFETY: ibv_xrcd is the first field of verbs_xrcd, the first of Xrcd.
    unsafe { &*(x as *const Xrcd) }
}

fn null_with(e: c_int) -> *mut ibv_xrcd {
    set_errno(e);
    std::ptr::null_mut()
}

/// `verbs_context.open_xrcd`.
pub unsafe extern "C" fn open_xrcd(
    c: *mut ibv_context,
    a: *mut ibv_xrcd_init_attr,
) -> *mut ibv_xrcd {
    if c.is_null() || a.is_null() {
        return null_with(libc::EINVAL);
    }
    guard("ibv_open_xrcd", std::ptr::null_mut(), || {
        // SAFETY: the caller's attributes and live context.
        let (a, cx) = unsafe { (&*a, ctx(c)) };
        if a.comp_mask >= ATTR_RESERVED {
            debug(|| format!("ibv_open_xrcd: unknown comp_mask bits {:#x}", a.comp_mask));
            return null_with(libc::EOPNOTSUPP);
        }
        if a.comp_mask & (ATTR_FD | ATTR_OFLAGS) != ATTR_FD | ATTR_OFLAGS {
            debug(|| "ibv_open_xrcd: comp_mask must have IBV_XRCD_INIT_ATTR_FD and _OFLAGS".into());
            return null_with(libc::EINVAL);
        }
        let key = if a.fd == -1 {
            None
        } else {
            // SAFETY: `st` is written by fstat on success only.
            let mut st: libc::stat = unsafe { std::mem::zeroed() };
            // SAFETY: fstat on the caller's fd, writing into `st`.
            if unsafe { libc::fstat(a.fd, &mut st) } != 0 {
                let e = std::io::Error::last_os_error()
                    .raw_os_error()
                    .unwrap_or(libc::EBADF);
                debug(|| format!("ibv_open_xrcd: fd {} is not an open file", a.fd));
                return null_with(e);
            }
            Some((c as usize, st.st_dev, st.st_ino))
        };
        let mut reg = registry();
        let existing = key.and_then(|k| reg.get(&k).cloned());
        let shared = match existing {
            Some(_) if a.oflags & libc::O_EXCL != 0 => {
                debug(|| "ibv_open_xrcd: O_EXCL and the file already names a domain".into());
                return null_with(libc::EINVAL);
            }
            Some(s) => s,
            None if key.is_some() && a.oflags & libc::O_CREAT == 0 => {
                debug(|| "ibv_open_xrcd: no domain for this file and no O_CREAT".into());
                return null_with(libc::EINVAL);
            }
            None => match cx.dev.alloc_xrcd() {
                Ok(d) => {
                    let s = Arc::new(Shared {
                        domain: Mutex::new(Some(d)),
                        key,
                    });
                    if let Some(k) = key {
                        reg.insert(k, s.clone());
                    }
                    s
                }
                Err(e) => return null_with(fail("ibv_open_xrcd", &e)),
            },
        };
        let b = Box::new(Xrcd {
            ibv: verbs_xrcd {
                xrcd: ibv_xrcd { context: c },
                comp_mask: 0,
                handle: 0,
            },
            shared,
        });
        Box::into_raw(b) as *mut ibv_xrcd
    })
}

/// `verbs_context.close_xrcd`.
pub unsafe extern "C" fn close_xrcd(x: *mut ibv_xrcd) -> c_int {
    if x.is_null() {
        return libc::EINVAL;
    }
    guard("ibv_close_xrcd", libc::EIO, || {
        // SAFETY: an XRCD we handed out.
        let xo = unsafe { xrcd(x as *mut std::ffi::c_void) };
        let mut reg = registry();
        // Our Arc, plus the registry's for a domain named by an inode.
        let others = Arc::strong_count(&xo.shared) - 1 - usize::from(xo.shared.key.is_some());
        if others == 0 {
            let mut slot = xo.shared.domain.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(d) = slot.take() {
                if let Err((d, e)) = d.close() {
                    *slot = Some(d);
                    return fail("ibv_close_xrcd", &e);
                }
            }
            if let Some(k) = xo.shared.key {
                reg.remove(&k);
            }
        }
        drop(reg);
        // SAFETY: ownership comes back; the caller must not use `x` again.
        drop(unsafe { Box::from_raw(x as *mut Xrcd) });
        0
    })
}
