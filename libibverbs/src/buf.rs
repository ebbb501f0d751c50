//! rdma-core 65's registration by attributes (`ibv_reg_mr_ex`) and
//! library-allocated buffers (`ibv_alloc_buf`, `ibv_free_buf`,
//! `ibv_reg_buf_mr`, `ibv_export_buf_dmabuf_fd`), as libibverbs 65 runs
//! them for the rxe provider, which has neither a `reg_mr_ex` nor an
//! `alloc_buf` op of its own: verbs.c's checks and translation of a
//! buffer into an address, then `dummy_ops.c`'s defaults (a page-aligned
//! heap buffer; an address registration through `reg_mr`, a dma-buf one
//! through `reg_dmabuf_mr`, which rxe refuses with EOPNOTSUPP, and
//! EOPNOTSUPP for anything else, a DMA handle included).

use std::ffi::{c_int, c_void};

use crate::abi::*;
use crate::objects::null_with;
use crate::{debug, guard};

/// `enum ibv_mr_init_attr_mask`.
const MASK_IOVA: u64 = 1 << 0;
const MASK_ADDR: u64 = 1 << 1;
const MASK_FD: u64 = 1 << 2;
const MASK_FD_OFFSET: u64 = 1 << 3;
const MASK_DMAH: u64 = 1 << 4;
const MASK_BUF: u64 = 1 << 5;

/// What `ibv_reg_mr_ex` registers, once a buffer is translated.
#[derive(Debug, PartialEq)]
enum Reg {
    /// `reg_mr(addr, length, iova)`.
    Addr(usize),
    /// `reg_dmabuf_mr` (refused: rxe has no dma-buf).
    Dmabuf,
}

/// The fields of an `ibv_mr_init_attr` that `ibv_reg_mr_ex` reads (those
/// its `comp_mask` names), with the buffer's as `(addr, size, pd,
/// dmabuf_fd)`.
struct Attr {
    comp_mask: u64,
    length: usize,
    addr: usize,
    buf: Option<(usize, usize, usize, c_int)>,
}

/// verbs.c `fill_mr_init_attr_from_buf` then dummy_ops.c `reg_mr_ex`:
/// what to register, or the errno. `pd` is the registering PD.
fn plan(a: &Attr, pd: usize) -> Result<Reg, c_int> {
    let mut mask = a.comp_mask;
    if mask & MASK_BUF != 0 {
        let Some((base, size, buf_pd, dmabuf_fd)) = a.buf else {
            return Err(libc::EINVAL);
        };
        if pd != buf_pd || mask & MASK_ADDR == 0 || a.addr < base {
            return Err(libc::EINVAL);
        }
        let off = a.addr - base;
        if off > size || a.length > size - off {
            return Err(libc::EINVAL);
        }
        if mask & (MASK_FD | MASK_FD_OFFSET) != 0 {
            return Err(libc::EINVAL);
        }
        mask &= !MASK_BUF;
        if dmabuf_fd != -1 {
            // Our buffers are never dma-buf backed; rdma-core would
            // register this one through the fd.
            if mask & MASK_IOVA != 0 {
                return Err(libc::EINVAL);
            }
            return Ok(Reg::Dmabuf);
        }
    }
    if mask & !(MASK_IOVA | MASK_ADDR | MASK_FD | MASK_FD_OFFSET) != 0 {
        // A DMA handle, or bits this version does not know.
        return Err(libc::EOPNOTSUPP);
    }
    if mask & MASK_FD != 0 {
        if mask & MASK_ADDR != 0 || mask & MASK_FD_OFFSET == 0 || mask & MASK_IOVA == 0 {
            return Err(libc::EINVAL);
        }
        return Ok(Reg::Dmabuf);
    }
    if mask & MASK_ADDR == 0 || mask & MASK_FD_OFFSET != 0 {
        return Err(libc::EINVAL);
    }
    Ok(Reg::Addr(a.addr))
}

#[no_mangle]
pub unsafe extern "C" fn rxe_ibv_reg_mr_ex(
    p: *mut ibv_pd,
    a: *mut ibv_mr_init_attr,
) -> *mut ibv_mr {
    if p.is_null() || a.is_null() {
        return null_with(libc::EINVAL);
    }
    // SAFETY: the caller's attributes, read only (rdma-core copies them).
    let a = unsafe { &*a };
    let mask = a.comp_mask;
    let buf = if mask & MASK_BUF != 0 && !a.buf.is_null() {
        // SAFETY: a buffer from ibv_alloc_buf, not yet freed.
        let b = unsafe { &*a.buf };
        Some((b.addr as usize, b.size, b.pd as usize, b.dmabuf_fd))
    } else {
        None
    };
    let attr = Attr {
        comp_mask: mask,
        length: a.length,
        addr: if mask & MASK_ADDR != 0 {
            a.addr as usize
        } else {
            0
        },
        buf,
    };
    match plan(&attr, p as usize) {
        Err(e) => {
            debug(|| {
                format!(
                    "ibv_reg_mr_ex: comp_mask {mask:#x}: {}",
                    if e == libc::EOPNOTSUPP && mask & MASK_DMAH != 0 {
                        "a DMA handle, which rxe does not support"
                    } else if e == libc::EOPNOTSUPP {
                        "an attribute rdma-core 65 does not define"
                    } else {
                        "invalid combination or range"
                    }
                )
            });
            null_with(e)
        }
        // SAFETY: forwarded caller contract; reg_dmabuf_mr reads nothing.
        Ok(Reg::Dmabuf) => unsafe {
            crate::objects::rxe_ibv_reg_dmabuf_mr(p, a.fd_offset, a.length, a.iova, a.fd, a.access)
        },
        Ok(Reg::Addr(addr)) => {
            let iova = (mask & MASK_IOVA != 0).then_some(a.iova);
            // SAFETY: forwarded caller contract (the range is the
            // program's memory, or within its ibv_alloc_buf buffer).
            unsafe { crate::objects::reg_mr(p, addr as *mut c_void, a.length, iova, a.access) }
        }
    }
}

/// `ibv_alloc_buf` (dummy_ops.c `alloc_buf`): `size` bytes, page-aligned,
/// from the heap; `*buf` gets the handle for `ibv_free_buf` and
/// `ibv_reg_buf_mr`.
#[no_mangle]
pub unsafe extern "C" fn rxe_ibv_alloc_buf(
    p: *mut ibv_pd,
    size: usize,
    buf: *mut *mut ibv_buf,
) -> *mut c_void {
    if p.is_null() || buf.is_null() {
        return null_with(libc::EINVAL);
    }
    guard("ibv_alloc_buf", std::ptr::null_mut(), || {
        // SAFETY: sysconf has no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as usize;
        let mut ptr: *mut c_void = std::ptr::null_mut();
        // SAFETY: posix_memalign writes the new block's address to ptr;
        // the alignment is a power of two and a multiple of a pointer.
        let r = unsafe { libc::posix_memalign(&mut ptr, page, size) };
        if r != 0 {
            debug(|| format!("ibv_alloc_buf: {size} bytes: out of memory"));
            return null_with(r);
        }
        let b = Box::into_raw(Box::new(ibv_buf {
            addr: ptr,
            size,
            pd: p,
            dmabuf_fd: -1,
        }));
        // SAFETY: the caller's output pointer (checked non-NULL).
        unsafe { *buf = b };
        ptr
    })
}

/// `ibv_free_buf`: the buffer and its handle.
#[no_mangle]
pub unsafe extern "C" fn rxe_ibv_free_buf(buf: *mut ibv_buf) {
    if buf.is_null() {
        return;
    }
    // SAFETY: a handle from ibv_alloc_buf, freed once: its Box and its
    // posix_memalign block come back here.
    let b = unsafe { Box::from_raw(buf) };
    // SAFETY: as above.
    unsafe { libc::free(b.addr) };
}

/// `ibv_reg_buf_mr`: `ibv_reg_mr_ex` of `[addr, addr + length)` within the
/// buffer.
#[no_mangle]
pub unsafe extern "C" fn rxe_ibv_reg_buf_mr(
    p: *mut ibv_pd,
    buf: *mut ibv_buf,
    addr: *mut c_void,
    length: usize,
    access: c_int,
) -> *mut ibv_mr {
    if buf.is_null() {
        return null_with(libc::EINVAL);
    }
    let mut a = ibv_mr_init_attr {
        length,
        access,
        comp_mask: MASK_BUF | MASK_ADDR,
        iova: 0,
        addr,
        fd: -1,
        fd_offset: 0,
        dmah: std::ptr::null_mut(),
        buf,
    };
    // SAFETY: forwarded caller contract.
    unsafe { rxe_ibv_reg_mr_ex(p, &mut a) }
}

/// `ibv_export_buf_dmabuf_fd`: our buffers are heap memory, never dma-buf
/// backed: -1 with ENODATA, as rdma-core for such a buffer.
#[no_mangle]
pub unsafe extern "C" fn rxe_ibv_export_buf_dmabuf_fd(buf: *mut ibv_buf) -> c_int {
    crate::set_errno(if buf.is_null() {
        libc::EINVAL
    } else {
        libc::ENODATA
    });
    -1
}

/// `verbs_context.alloc_buf` / `free_buf` / `reg_mr_ex`: the same.
pub fn fill_ops(v: &mut verbs_context) {
    v.alloc_buf = Some(rxe_ibv_alloc_buf);
    v.free_buf = Some(rxe_ibv_free_buf);
    v.reg_mr_ex = Some(rxe_ibv_reg_mr_ex);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attr(comp_mask: u64, addr: usize, length: usize) -> Attr {
        Attr {
            comp_mask,
            length,
            addr,
            buf: Some((0x10000, 0x2000, 7, -1)),
        }
    }

    #[test]
    fn a_buffer_range_is_registered_by_address_and_must_lie_within() {
        let ok = attr(MASK_BUF | MASK_ADDR, 0x11000, 0x1000);
        assert_eq!(plan(&ok, 7), Ok(Reg::Addr(0x11000)));
        // Another PD, no address, before, past the end, an fd as well.
        assert_eq!(plan(&ok, 8), Err(libc::EINVAL));
        assert_eq!(plan(&attr(MASK_BUF, 0, 0x1000), 7), Err(libc::EINVAL));
        assert_eq!(
            plan(&attr(MASK_BUF | MASK_ADDR, 0xf000, 0x10), 7),
            Err(libc::EINVAL)
        );
        assert_eq!(
            plan(&attr(MASK_BUF | MASK_ADDR, 0x11000, 0x1001), 7),
            Err(libc::EINVAL)
        );
        assert_eq!(
            plan(&attr(MASK_BUF | MASK_ADDR | MASK_FD, 0x11000, 1), 7),
            Err(libc::EINVAL)
        );
    }

    #[test]
    fn dummy_ops_rules_for_address_fd_and_dma_handle() {
        let plain = |m| Attr {
            comp_mask: m,
            length: 4096,
            addr: 0x1000,
            buf: None,
        };
        assert!(matches!(plan(&plain(MASK_ADDR), 1), Ok(Reg::Addr(0x1000))));
        assert!(matches!(
            plan(&plain(MASK_ADDR | MASK_IOVA), 1),
            Ok(Reg::Addr(0x1000))
        ));
        assert_eq!(
            plan(&plain(MASK_ADDR | MASK_DMAH), 1),
            Err(libc::EOPNOTSUPP)
        );
        assert_eq!(plan(&plain(MASK_ADDR | 1 << 6), 1), Err(libc::EOPNOTSUPP));
        assert_eq!(plan(&plain(0), 1), Err(libc::EINVAL));
        assert_eq!(
            plan(&plain(MASK_ADDR | MASK_FD_OFFSET), 1),
            Err(libc::EINVAL)
        );
        assert_eq!(
            plan(&plain(MASK_FD | MASK_FD_OFFSET | MASK_IOVA), 1),
            Ok(Reg::Dmabuf)
        );
        assert_eq!(plan(&plain(MASK_FD | MASK_IOVA), 1), Err(libc::EINVAL));
        assert_eq!(
            plan(&plain(MASK_FD | MASK_FD_OFFSET | MASK_IOVA | MASK_ADDR), 1),
            Err(libc::EINVAL)
        );
    }
}
