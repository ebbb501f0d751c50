//! Symbols that must exist for programs to load, but that rxe-emu does not
//! implement: the `IBVERBS_PRIVATE_34` provider interface (`ibv_cmd_*`,
//! `verbs_*`), which only genuine providers (libmlx5, libefa) call, and
//! verbs kernel rxe does not support either. Each fails cleanly with
//! `EOPNOTSUPP` (or does nothing) and says so under `RXE_EMU_DEBUG`.

use std::ffi::{c_char, c_int, c_void};

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
);

/// `verbs_allow_disassociate_destroy`: a flag providers read.
#[no_mangle]
pub static mut rxe_verbs_allow_disassociate_destroy: bool = false;

/// A provider registering itself (libmlx5 and libefa do so when loaded):
/// accepted and ignored; rxe-emu devices are the only devices.
#[no_mangle]
pub unsafe extern "C" fn rxe_verbs_register_driver_34(_ops: *const c_void) {}

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
