//! Symbols that must exist for programs to load, but that rxe-emu does not
//! implement: the provider interface of `IBVERBS_PRIVATE_34` (rdma-core
//! 44 to 56) and `IBVERBS_PRIVATE_65` (`ibv_cmd_*`, `verbs_*`,
//! `ibv_dmabuf_heap_*`), which only genuine providers (libmlx5, libefa)
//! call, after registering a driver that never finds a device here, and
//! verbs kernel rxe does not support either. Each fails cleanly with
//! `EOPNOTSUPP` (or does nothing) and says so under `RXE_EMU_DEBUG`.

use std::ffi::{c_char, c_int, c_uint, c_void};

use crate::debug;

/// Provider commands: int-returning, any arguments (ignored; the x86-64
/// calling convention lets a callee ignore arguments it does not name).
macro_rules! unsupported_cmd {
    ($($name:ident),* $(,)?) => {
        $(
            #[no_mangle]
            pub unsafe extern "C" fn $name() -> c_int {
                debug(|| format!("{}: provider interface, not supported by rxe-emu",
                    stringify!($name).trim_start_matches("rxe_")));
                libc::EOPNOTSUPP
            }
        )*
    };
}

unsupported_cmd!(
    rxe_execute_ioctl,
    rxe_ibv_cmd_advise_mr,
    rxe_ibv_cmd_alloc_dm,
    rxe_ibv_cmd_alloc_mw,
    rxe_ibv_cmd_alloc_pd,
    rxe_ibv_cmd_attach_mcast,
    rxe_ibv_cmd_close_xrcd,
    rxe_ibv_cmd_create_ah,
    rxe_ibv_cmd_create_counters,
    rxe_ibv_cmd_create_cq,
    rxe_ibv_cmd_create_cq_ex,
    rxe_ibv_cmd_create_cq_ex2,
    rxe_ibv_cmd_create_flow,
    rxe_ibv_cmd_create_flow_action_esp,
    rxe_ibv_cmd_create_qp,
    rxe_ibv_cmd_create_qp_ex,
    rxe_ibv_cmd_create_qp_ex2,
    rxe_ibv_cmd_create_rwq_ind_table,
    rxe_ibv_cmd_create_srq,
    rxe_ibv_cmd_create_srq_ex,
    rxe_ibv_cmd_create_wq,
    rxe_ibv_cmd_dealloc_mw,
    rxe_ibv_cmd_dealloc_pd,
    rxe_ibv_cmd_dereg_mr,
    rxe_ibv_cmd_destroy_ah,
    rxe_ibv_cmd_destroy_counters,
    rxe_ibv_cmd_destroy_cq,
    rxe_ibv_cmd_destroy_flow,
    rxe_ibv_cmd_destroy_flow_action,
    rxe_ibv_cmd_destroy_qp,
    rxe_ibv_cmd_destroy_rwq_ind_table,
    rxe_ibv_cmd_destroy_srq,
    rxe_ibv_cmd_destroy_wq,
    rxe_ibv_cmd_detach_mcast,
    rxe_ibv_cmd_free_dm,
    rxe_ibv_cmd_get_context,
    rxe_ibv_cmd_modify_cq,
    rxe_ibv_cmd_modify_flow_action_esp,
    rxe_ibv_cmd_modify_qp,
    rxe_ibv_cmd_modify_qp_ex,
    rxe_ibv_cmd_modify_srq,
    rxe_ibv_cmd_modify_wq,
    rxe_ibv_cmd_open_qp,
    rxe_ibv_cmd_open_xrcd,
    rxe_ibv_cmd_query_context,
    rxe_ibv_cmd_query_device_any,
    rxe_ibv_cmd_query_mr,
    rxe_ibv_cmd_query_port,
    rxe_ibv_cmd_query_qp,
    rxe_ibv_cmd_query_srq,
    rxe_ibv_cmd_read_counters,
    rxe_ibv_cmd_reg_dmabuf_mr,
    rxe_ibv_cmd_reg_dm_mr,
    rxe_ibv_cmd_reg_mr,
    rxe_ibv_cmd_rereg_mr,
    rxe_ibv_cmd_resize_cq,
    // IBVERBS_PRIVATE_65 only (rdma-core 65's providers).
    rxe_ibv_cmd_alloc_dmah,
    rxe_ibv_cmd_free_dmah,
    rxe_ibv_cmd_reg_mr_ex,
    rxe_ibv_cmd_query_port_speed,
    rxe_ibv_cmd_req_notify_cq,
    rxe_ibv_cmd_post_send,
    rxe_ibv_cmd_post_recv,
    rxe_ibv_cmd_post_srq_recv,
    rxe_ibv_cmd_query_comp_cntr_caps,
    rxe_ibv_cmd_create_comp_cntr,
    rxe_ibv_cmd_destroy_comp_cntr,
    rxe_ibv_cmd_inc_comp_cntr,
    rxe_ibv_cmd_inc_err_comp_cntr,
    rxe_ibv_cmd_read_comp_cntr,
    rxe_ibv_cmd_read_err_comp_cntr,
    rxe_ibv_cmd_set_comp_cntr,
    rxe_ibv_cmd_set_err_comp_cntr,
    rxe_ibv_cmd_qp_attach_comp_cntr,
);

/// Provider commands that return a count or an fd: -1 with errno
/// `EOPNOTSUPP`, as rdma-core's do when the kernel refuses.
macro_rules! unsupported_cmd_minus_one {
    ($($name:ident),* $(,)?) => {
        $(
            #[no_mangle]
            pub unsafe extern "C" fn $name() -> c_int {
                debug(|| format!("{}: provider interface, not supported by rxe-emu",
                    stringify!($name).trim_start_matches("rxe_")));
                crate::set_errno(libc::EOPNOTSUPP);
                -1
            }
        )*
    };
}

unsupported_cmd_minus_one!(rxe_ibv_cmd_poll_cq, rxe_ibv_cmd_export_dmabuf_fd);

/// `__ioctl_final_num_attrs(num_attrs, link)`: `num_attrs` plus the
/// attributes filled in each command buffer linked from `link` (what a
/// provider's `DECLARE_COMMAND_BUFFER_LINK_FINAL` sizes its buffer with),
/// as cmd_ioctl.c counts them. rdma-core 65's `struct ibv_command_buffer`
/// (cmd_ioctl.h, x86-64): `next` at 0, `next_attr` at 8, `hdr` (24 bytes,
/// 8-aligned) at 32, so `hdr.attrs` at 56; an attribute is 16 bytes.
#[no_mangle]
pub unsafe extern "C" fn rxe___ioctl_final_num_attrs(
    num_attrs: c_uint,
    mut link: *const c_void,
) -> c_uint {
    const NEXT_ATTR: usize = 8;
    const ATTRS: usize = 56;
    const ATTR_SIZE: usize = 16;
    let mut n = num_attrs;
    while !link.is_null() {
        // SAFETY: `link` is a live `struct ibv_command_buffer` of the
        // calling provider (its list ends with NULL); both fields are
        // pointers at the offsets above.
        let (next, next_attr) = unsafe {
            (
                *(link as *const *const c_void),
                *((link as *const u8).add(NEXT_ATTR) as *const usize),
            )
        };
        let first = link as usize + ATTRS;
        n = n.wrapping_add((next_attr.saturating_sub(first) / ATTR_SIZE) as c_uint);
        link = next;
    }
    n
}

/// rdma-core 65's DMA-buf heaps (the confidential-computing shared heap
/// libmlx5 allocates from): none exists here; `cc_shared_init` fails as
/// rdma-core's does when `/dev/dma_heap/` has no such heap.
#[no_mangle]
pub unsafe extern "C" fn rxe_ibv_dmabuf_heap_cc_shared_init() -> *mut c_void {
    debug(|| "ibv_dmabuf_heap_cc_shared_init: no DMA-buf heap in rxe-emu".into());
    crate::set_errno(libc::EOPNOTSUPP);
    std::ptr::null_mut()
}
#[no_mangle]
pub unsafe extern "C" fn rxe_ibv_dmabuf_heap_alloc(
    _heap: *mut c_void,
    _size: usize,
    _fd: *mut c_int,
) -> *mut c_void {
    crate::set_errno(libc::EOPNOTSUPP);
    std::ptr::null_mut()
}
/// No heap and no heap buffer is ever handed out: nothing to free.
#[no_mangle]
pub unsafe extern "C" fn rxe_ibv_dmabuf_heap_destroy(_heap: *mut c_void) {}
#[no_mangle]
pub unsafe extern "C" fn rxe_ibv_dmabuf_heap_free(_buf: *mut c_void, _size: usize, _fd: c_int) {}

/// `ibv_read_ibdev_sysfs_file`: rxe-emu devices have no sysfs directory;
/// -1 with errno ENOENT, as rdma-core's for a missing file.
#[no_mangle]
pub unsafe extern "C" fn rxe_ibv_read_ibdev_sysfs_file(
    _buf: *mut c_char,
    _size: usize,
    _dev: *mut c_void,
    _fmt: *const c_char,
) -> c_int {
    crate::set_errno(libc::ENOENT);
    -1
}

/// `verbs_allow_disassociate_destroy`: a flag providers read.
#[no_mangle]
pub static mut rxe_verbs_allow_disassociate_destroy: bool = false;

/// A provider registering itself (libmlx5 and libefa do so when loaded):
/// accepted and ignored; rxe-emu devices are the only devices.
#[no_mangle]
pub unsafe extern "C" fn rxe_verbs_register_driver_34(_ops: *const c_void) {}
/// rdma-core 65's providers (`lib*-rdmav65.so`, libmlx5 of Debian sid).
#[no_mangle]
pub unsafe extern "C" fn rxe_verbs_register_driver_65(_ops: *const c_void) {}

#[no_mangle]
pub unsafe extern "C" fn rxe_verbs_open_device(
    _dev: *mut c_void,
    _priv: *mut c_void,
) -> *mut c_void {
    crate::set_errno(libc::EOPNOTSUPP);
    std::ptr::null_mut()
}

#[no_mangle]
pub unsafe extern "C" fn rxe__verbs_init_and_alloc_context() -> *mut c_void {
    crate::set_errno(libc::EOPNOTSUPP);
    std::ptr::null_mut()
}

#[no_mangle]
pub unsafe extern "C" fn rxe_verbs_init_cq() {}
#[no_mangle]
pub unsafe extern "C" fn rxe_verbs_set_ops() {}
#[no_mangle]
pub unsafe extern "C" fn rxe_verbs_uninit_context() {}
#[no_mangle]
pub unsafe extern "C" fn rxe___verbs_log(_ctx: *mut c_void, _level: u32, _fmt: *const c_char) {}

// --- public verbs rxe does not support --------------------------------------

/// ECE (enhanced connection establishment) is an mlx5 feature; kernel rxe
/// answers EOPNOTSUPP.
#[no_mangle]
pub unsafe extern "C" fn rxe_ibv_query_ece(_qp: *mut c_void, _ece: *mut c_void) -> c_int {
    libc::EOPNOTSUPP
}
#[no_mangle]
pub unsafe extern "C" fn rxe_ibv_set_ece(_qp: *mut c_void, _ece: *mut c_void) -> c_int {
    libc::EOPNOTSUPP
}

/// DMA handles (rdma-core 65: PCIe TPH steering hints for a CPU) need a
/// device with TPH; rdma-core's default for a provider without them
/// (rxe): NULL with EOPNOTSUPP. No handle is ever handed out, so freeing
/// one is refused the same way.
#[no_mangle]
pub unsafe extern "C" fn rxe_ibv_alloc_dmah(
    c: *mut crate::abi::ibv_context,
    attr: *mut crate::abi::ibv_dmah_init_attr,
) -> *mut crate::abi::ibv_dmah {
    crate::set_errno(if c.is_null() || attr.is_null() {
        libc::EINVAL
    } else {
        debug(|| "ibv_alloc_dmah: rxe has no TPH steering (DMA handles)".into());
        libc::EOPNOTSUPP
    });
    std::ptr::null_mut()
}
#[no_mangle]
pub unsafe extern "C" fn rxe_ibv_dealloc_dmah(d: *mut crate::abi::ibv_dmah) -> c_int {
    if d.is_null() {
        libc::EINVAL
    } else {
        libc::EOPNOTSUPP
    }
}

/// Completion counters (rdma-core 65, an EFA feature): rdma-core's
/// defaults for a provider without them (rxe). The capability query
/// zeroes the caller's struct first, as rdma-core's does.
#[no_mangle]
pub unsafe extern "C" fn rxe__ibv_query_comp_cntr_caps(
    c: *mut crate::abi::ibv_context,
    caps: *mut c_void,
    caps_size: usize,
) -> c_int {
    if c.is_null() || (caps.is_null() && caps_size > 0) {
        return libc::EINVAL;
    }
    // SAFETY: the caller's struct of caps_size bytes.
    unsafe { std::ptr::write_bytes(caps as *mut u8, 0, caps_size) };
    libc::EOPNOTSUPP
}
#[no_mangle]
pub unsafe extern "C" fn rxe_ibv_create_comp_cntr(
    c: *mut crate::abi::ibv_context,
    attr: *mut c_void,
) -> *mut c_void {
    crate::set_errno(if c.is_null() || attr.is_null() {
        libc::EINVAL
    } else {
        debug(|| "ibv_create_comp_cntr: rxe has no completion counters".into());
        libc::EOPNOTSUPP
    });
    std::ptr::null_mut()
}

/// The calls on a completion counter: none is ever created here.
macro_rules! no_comp_cntr {
    ($($name:ident($($arg:ident: $t:ty),*)),* $(,)?) => {
        $(
            #[no_mangle]
            pub unsafe extern "C" fn $name(cntr: *mut c_void $(, $arg: $t)*) -> c_int {
                $(let _ = $arg;)*
                if cntr.is_null() { libc::EINVAL } else { libc::EOPNOTSUPP }
            }
        )*
    };
}

no_comp_cntr!(
    rxe_ibv_destroy_comp_cntr(),
    rxe_ibv_set_comp_cntr(v: u64),
    rxe_ibv_set_err_comp_cntr(v: u64),
    rxe_ibv_inc_comp_cntr(v: u64),
    rxe_ibv_inc_err_comp_cntr(v: u64),
    rxe_ibv_read_comp_cntr(v: *mut u64),
    rxe_ibv_read_err_comp_cntr(v: *mut u64),
);

/// `ibv_qp_attach_comp_cntr(qp, cntr, attr)`: no counter exists here.
#[no_mangle]
pub unsafe extern "C" fn rxe_ibv_qp_attach_comp_cntr(
    qp: *mut c_void,
    cntr: *mut c_void,
    attr: *mut c_void,
) -> c_int {
    if qp.is_null() || cntr.is_null() || attr.is_null() {
        libc::EINVAL
    } else {
        libc::EOPNOTSUPP
    }
}

#[no_mangle]
pub unsafe extern "C" fn rxe_ibv_resolve_eth_l2_from_gid() -> c_int {
    libc::EOPNOTSUPP
}

// --- fork support ---------------------------------------------------------------
// Registered memory is read and written by this process itself, so a
// fork() child sharing pages copy-on-write cannot corrupt RDMA: fork is
// always safe (as with IBV_FORK_UNNEEDED on modern kernels).

#[no_mangle]
pub unsafe extern "C" fn rxe_ibv_fork_init() -> c_int {
    0
}
#[no_mangle]
pub unsafe extern "C" fn rxe_ibv_is_fork_initialized() -> c_int {
    // IBV_FORK_UNNEEDED
    2
}
#[no_mangle]
pub unsafe extern "C" fn rxe_ibv_dontfork_range(_base: *mut c_void, _size: usize) -> c_int {
    0
}
#[no_mangle]
pub unsafe extern "C" fn rxe_ibv_dofork_range(_base: *mut c_void, _size: usize) -> c_int {
    0
}

// --- sysfs and kernel-ABI helpers -----------------------------------------------

#[no_mangle]
pub unsafe extern "C" fn rxe_ibv_get_sysfs_path() -> *const c_char {
    c"/sys".as_ptr()
}
#[no_mangle]
pub unsafe extern "C" fn rxe_ibv_read_sysfs_file(
    _dir: *const c_char,
    _file: *const c_char,
    _buf: *mut c_char,
    _size: usize,
) -> c_int {
    -1
}
#[no_mangle]
pub unsafe extern "C" fn rxe_ibv_copy_qp_attr_from_kern(_dst: *mut c_void, _src: *const c_void) {}
#[no_mangle]
pub unsafe extern "C" fn rxe_ibv_copy_ah_attr_from_kern(_dst: *mut c_void, _src: *const c_void) {}
#[no_mangle]
pub unsafe extern "C" fn rxe_ibv_copy_path_rec_from_kern(_dst: *mut c_void, _src: *const c_void) {}
#[no_mangle]
pub unsafe extern "C" fn rxe_ibv_copy_path_rec_to_kern(_dst: *mut c_void, _src: *const c_void) {}
