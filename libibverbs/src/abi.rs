//! The C structs of `<infiniband/verbs.h>` (rdma-core 65, x86_64) that
//! programs and our library share, as `#[repr(C)]` Rust structs.
//!
//! rdma-core grows structs only compatibly: `ibv_port_attr` (49:
//! `active_speed_ex`) and `ibv_qp_ex` (45: `wr_flush`) at their end,
//! `verbs_context` (59, 65: the buffer, DMA-handle and `reg_mr_ex` ops) at
//! its start, so every field keeps its distance from the `ibv_context` at
//! its end and `sz` tells a program which fields exist. Our structs have
//! rdma-core 65's layout, which serves programs built against 44 as well.
//!
//! Every size and offset a program can observe is checked at compile time
//! below against the values measured with rdma-core 65's headers
//! (`layout.txt`); `tests/c_layout.rs` compiles a C program against the
//! installed headers (Debian 12's rdma-core 44) and checks the same
//! numbers by those rules, and `tests/debian_sid.rs` against Debian sid's
//! (rdma-core 65), exactly.

#![allow(non_camel_case_types, missing_docs)]

use std::ffi::{c_char, c_int, c_uint, c_void};

pub type pthread_mutex_t = libc::pthread_mutex_t;
pub type pthread_cond_t = libc::pthread_cond_t;

/// `IBV_SYSFS_NAME_MAX` and `IBV_SYSFS_PATH_MAX`.
pub const SYSFS_NAME_MAX: usize = 64;
pub const SYSFS_PATH_MAX: usize = 256;

#[repr(C)]
pub struct _ibv_device_ops {
    pub _dummy1: Option<unsafe extern "C" fn()>,
    pub _dummy2: Option<unsafe extern "C" fn()>,
}

#[repr(C)]
pub struct ibv_device {
    pub _ops: _ibv_device_ops,
    pub node_type: c_int,
    pub transport_type: c_int,
    pub name: [c_char; SYSFS_NAME_MAX],
    pub dev_name: [c_char; SYSFS_NAME_MAX],
    pub dev_path: [c_char; SYSFS_PATH_MAX],
    pub ibdev_path: [c_char; SYSFS_PATH_MAX],
}

/// The head of libibverbs' private `struct verbs_device`: providers such as
/// libmlx5 and libefa read `ops` (offset 664) to tell whether a device is
/// theirs.
#[repr(C)]
pub struct verbs_device_head {
    pub device: ibv_device,
    pub ops: *const c_void,
}

pub type PollCqFn = unsafe extern "C" fn(*mut ibv_cq, c_int, *mut ibv_wc) -> c_int;
pub type ReqNotifyFn = unsafe extern "C" fn(*mut ibv_cq, c_int) -> c_int;
pub type PostSendFn =
    unsafe extern "C" fn(*mut ibv_qp, *mut ibv_send_wr, *mut *mut ibv_send_wr) -> c_int;
pub type PostRecvFn =
    unsafe extern "C" fn(*mut ibv_qp, *mut ibv_recv_wr, *mut *mut ibv_recv_wr) -> c_int;
pub type PostSrqRecvFn =
    unsafe extern "C" fn(*mut ibv_srq, *mut ibv_recv_wr, *mut *mut ibv_recv_wr) -> c_int;
pub type AllocMwFn = unsafe extern "C" fn(*mut ibv_pd, c_int) -> *mut ibv_mw;
pub type BindMwFn = unsafe extern "C" fn(*mut ibv_qp, *mut ibv_mw, *mut ibv_mw_bind) -> c_int;
pub type DeallocMwFn = unsafe extern "C" fn(*mut ibv_mw) -> c_int;
type Compat = Option<unsafe extern "C" fn()>;

#[repr(C)]
pub struct ibv_context_ops {
    pub _compat_query_device: Compat,
    pub _compat_query_port: Compat,
    pub _compat_alloc_pd: Compat,
    pub _compat_dealloc_pd: Compat,
    pub _compat_reg_mr: Compat,
    pub _compat_rereg_mr: Compat,
    pub _compat_dereg_mr: Compat,
    pub alloc_mw: Option<AllocMwFn>,
    pub bind_mw: Option<BindMwFn>,
    pub dealloc_mw: Option<DeallocMwFn>,
    pub _compat_create_cq: Compat,
    pub poll_cq: Option<PollCqFn>,
    pub req_notify_cq: Option<ReqNotifyFn>,
    pub _compat_cq_event: Compat,
    pub _compat_resize_cq: Compat,
    pub _compat_destroy_cq: Compat,
    pub _compat_create_srq: Compat,
    pub _compat_modify_srq: Compat,
    pub _compat_query_srq: Compat,
    pub _compat_destroy_srq: Compat,
    pub post_srq_recv: Option<PostSrqRecvFn>,
    pub _compat_create_qp: Compat,
    pub _compat_query_qp: Compat,
    pub _compat_modify_qp: Compat,
    pub _compat_destroy_qp: Compat,
    pub post_send: Option<PostSendFn>,
    pub post_recv: Option<PostRecvFn>,
    pub _compat_create_ah: Compat,
    pub _compat_destroy_ah: Compat,
    pub _compat_attach_mcast: Compat,
    pub _compat_detach_mcast: Compat,
    pub _compat_async_event: Compat,
}

#[repr(C)]
pub struct ibv_context {
    pub device: *mut ibv_device,
    pub ops: ibv_context_ops,
    pub cmd_fd: c_int,
    pub async_fd: c_int,
    pub num_comp_vectors: c_int,
    pub mutex: pthread_mutex_t,
    pub abi_compat: *mut c_void,
}

/// `__VERBS_ABI_IS_EXTENDED`: `abi_compat` says a `verbs_context` precedes
/// the `ibv_context`.
pub const VERBS_ABI_IS_EXTENDED: *mut c_void = usize::MAX as *mut c_void;

pub type QueryPortFn =
    unsafe extern "C" fn(*mut ibv_context, u8, *mut ibv_port_attr, usize) -> c_int;
pub type CreateCqExFn =
    unsafe extern "C" fn(*mut ibv_context, *mut ibv_cq_init_attr_ex) -> *mut ibv_cq_ex;
pub type QueryDeviceExFn = unsafe extern "C" fn(
    *mut ibv_context,
    *const ibv_query_device_ex_input,
    *mut ibv_device_attr_ex,
    usize,
) -> c_int;
pub type CreateQpExFn =
    unsafe extern "C" fn(*mut ibv_context, *mut ibv_qp_init_attr_ex) -> *mut ibv_qp;
pub type CreateSrqExFn =
    unsafe extern "C" fn(*mut ibv_context, *mut ibv_srq_init_attr_ex) -> *mut ibv_srq;
pub type OpenQpFn = unsafe extern "C" fn(*mut ibv_context, *mut c_void) -> *mut ibv_qp;
pub type GetSrqNumFn = unsafe extern "C" fn(*mut ibv_srq, *mut u32) -> c_int;
pub type AllocTdFn = unsafe extern "C" fn(*mut ibv_context, *mut c_void) -> *mut ibv_td;
pub type DeallocTdFn = unsafe extern "C" fn(*mut ibv_td) -> c_int;
pub type AllocParentDomainFn =
    unsafe extern "C" fn(*mut ibv_context, *mut ibv_parent_domain_init_attr) -> *mut ibv_pd;
pub type ModifyCqFn = unsafe extern "C" fn(*mut ibv_cq, *mut c_void) -> c_int;
pub type AllocNullMrFn = unsafe extern "C" fn(*mut ibv_pd) -> *mut ibv_mr;
pub type QueryRtValuesFn = unsafe extern "C" fn(*mut ibv_context, *mut c_void) -> c_int;
pub type OpenXrcdFn =
    unsafe extern "C" fn(*mut ibv_context, *mut ibv_xrcd_init_attr) -> *mut ibv_xrcd;
pub type CloseXrcdFn = unsafe extern "C" fn(*mut ibv_xrcd) -> c_int;

/// `struct ibv_xrcd`.
#[repr(C)]
pub struct ibv_xrcd {
    pub context: *mut ibv_context,
}

/// `struct verbs_xrcd`.
#[repr(C)]
pub struct verbs_xrcd {
    pub xrcd: ibv_xrcd,
    pub comp_mask: u32,
    pub handle: u32,
}

/// `struct ibv_xrcd_init_attr`.
#[repr(C)]
pub struct ibv_xrcd_init_attr {
    pub comp_mask: u32,
    pub fd: c_int,
    pub oflags: c_int,
}

pub type AdviseMrFn = unsafe extern "C" fn(*mut ibv_pd, c_uint, u32, *mut ibv_sge, u32) -> c_int;
pub type AllocDmFn = unsafe extern "C" fn(*mut ibv_context, *mut ibv_alloc_dm_attr) -> *mut ibv_dm;
pub type FreeDmFn = unsafe extern "C" fn(*mut ibv_dm) -> c_int;
pub type RegDmMrFn =
    unsafe extern "C" fn(*mut ibv_pd, *mut ibv_dm, u64, usize, c_uint) -> *mut ibv_mr;

pub type FreeBufFn = unsafe extern "C" fn(*mut ibv_buf);
pub type AllocBufFn = unsafe extern "C" fn(*mut ibv_pd, usize, *mut *mut ibv_buf) -> *mut c_void;
pub type DmExportDmabufFdFn = unsafe extern "C" fn(*mut ibv_dm) -> c_int;
pub type RegMrExFn = unsafe extern "C" fn(*mut ibv_pd, *mut ibv_mr_init_attr) -> *mut ibv_mr;
pub type DeallocDmahFn = unsafe extern "C" fn(*mut ibv_dmah) -> c_int;
pub type AllocDmahFn =
    unsafe extern "C" fn(*mut ibv_context, *mut ibv_dmah_init_attr) -> *mut ibv_dmah;

#[repr(C)]
pub struct verbs_context {
    // rdma-core 65 (the newest first: the struct grows up).
    pub free_buf: Option<FreeBufFn>,
    pub alloc_buf: Option<AllocBufFn>,
    pub dm_export_dmabuf_fd: Option<DmExportDmabufFdFn>,
    pub reg_mr_ex: Option<RegMrExFn>,
    pub dealloc_dmah: Option<DeallocDmahFn>,
    pub alloc_dmah: Option<AllocDmahFn>,
    // rdma-core 44.
    pub query_port: Option<QueryPortFn>,
    pub advise_mr: Option<AdviseMrFn>,
    pub alloc_null_mr: Option<AllocNullMrFn>,
    pub read_counters: Compat,
    pub attach_counters_point_flow: Compat,
    pub create_counters: Compat,
    pub destroy_counters: Compat,
    pub reg_dm_mr: Option<RegDmMrFn>,
    pub alloc_dm: Option<AllocDmFn>,
    pub free_dm: Option<FreeDmFn>,
    pub modify_flow_action_esp: Compat,
    pub destroy_flow_action: Compat,
    pub create_flow_action_esp: Compat,
    pub modify_qp_rate_limit: Compat,
    pub alloc_parent_domain: Option<AllocParentDomainFn>,
    pub dealloc_td: Option<DeallocTdFn>,
    pub alloc_td: Option<AllocTdFn>,
    pub modify_cq: Option<ModifyCqFn>,
    pub post_srq_ops: Compat,
    pub destroy_rwq_ind_table: Compat,
    pub create_rwq_ind_table: Compat,
    pub destroy_wq: Compat,
    pub modify_wq: Compat,
    pub create_wq: Compat,
    pub query_rt_values: Option<QueryRtValuesFn>,
    pub create_cq_ex: Option<CreateCqExFn>,
    pub priv_: *mut c_void,
    pub query_device_ex: Option<QueryDeviceExFn>,
    pub ibv_destroy_flow: Compat,
    pub abi_placeholder2: Compat,
    pub ibv_create_flow: Compat,
    pub abi_placeholder1: Compat,
    pub open_qp: Option<OpenQpFn>,
    pub create_qp_ex: Option<CreateQpExFn>,
    pub get_srq_num: Option<GetSrqNumFn>,
    pub create_srq_ex: Option<CreateSrqExFn>,
    pub open_xrcd: Option<OpenXrcdFn>,
    pub close_xrcd: Option<CloseXrcdFn>,
    pub _abi_placeholder3: u64,
    pub sz: usize,
    pub context: ibv_context,
}

#[repr(C)]
pub struct ibv_comp_channel {
    pub context: *mut ibv_context,
    pub fd: c_int,
    pub refcnt: c_int,
}

#[repr(C)]
pub struct ibv_pd {
    pub context: *mut ibv_context,
    pub handle: u32,
}

#[repr(C)]
pub struct ibv_td {
    pub context: *mut ibv_context,
}

#[repr(C)]
pub struct ibv_parent_domain_init_attr {
    pub pd: *mut ibv_pd,
    pub td: *mut ibv_td,
    pub comp_mask: u32,
    pub alloc:
        Option<unsafe extern "C" fn(*mut ibv_pd, *mut c_void, usize, usize, u64) -> *mut c_void>,
    pub free: Option<unsafe extern "C" fn(*mut ibv_pd, *mut c_void, *mut c_void, u64)>,
    pub pd_context: *mut c_void,
}

#[repr(C)]
pub struct ibv_mr {
    pub context: *mut ibv_context,
    pub pd: *mut ibv_pd,
    pub addr: *mut c_void,
    pub length: usize,
    pub handle: u32,
    pub lkey: u32,
    pub rkey: u32,
}

#[repr(C)]
pub struct ibv_mw {
    pub context: *mut ibv_context,
    pub pd: *mut ibv_pd,
    pub rkey: u32,
    pub handle: u32,
    pub type_: c_int,
}

#[repr(C)]
pub struct ibv_mw_bind_info {
    pub mr: *mut ibv_mr,
    pub addr: u64,
    pub length: u64,
    pub mw_access_flags: c_uint,
}

#[repr(C)]
pub struct ibv_mw_bind {
    pub wr_id: u64,
    pub send_flags: c_uint,
    pub bind_info: ibv_mw_bind_info,
}

#[repr(C)]
pub struct ibv_alloc_dm_attr {
    pub length: usize,
    pub log_align_req: u32,
    pub comp_mask: u32,
}

/// `struct ibv_dmah` (rdma-core 65): a DMA handle (TPH steering).
#[repr(C)]
pub struct ibv_dmah {
    pub context: *mut ibv_context,
}

#[repr(C)]
pub struct ibv_dmah_init_attr {
    pub comp_mask: u32,
    pub cpu_id: u32,
    pub ph: u8,
    pub tph_mem_type: u8,
}

/// `struct ibv_mr_init_attr` (rdma-core 65), for `ibv_reg_mr_ex`.
#[repr(C)]
pub struct ibv_mr_init_attr {
    pub length: usize,
    pub access: c_int,
    pub comp_mask: u64,
    pub iova: u64,
    pub addr: *mut c_void,
    pub fd: c_int,
    pub fd_offset: u64,
    pub dmah: *mut ibv_dmah,
    pub buf: *mut ibv_buf,
}

/// `struct ibv_buf` (rdma-core 65's `driver.h`; opaque to programs): a
/// buffer `ibv_alloc_buf` allocated.
#[repr(C)]
pub struct ibv_buf {
    pub addr: *mut c_void,
    pub size: usize,
    pub pd: *mut ibv_pd,
    pub dmabuf_fd: c_int,
}

/// `struct ibv_comp_cntr_caps` (rdma-core 65).
#[repr(C)]
pub struct ibv_comp_cntr_caps {
    pub max_value: u64,
    pub max_counters: u32,
    pub supported_qp_attach_ops: u32,
}

#[repr(C)]
pub struct ibv_dm {
    pub context: *mut ibv_context,
    pub memcpy_to_dm: Option<unsafe extern "C" fn(*mut ibv_dm, u64, *const c_void, usize) -> c_int>,
    pub memcpy_from_dm: Option<unsafe extern "C" fn(*mut c_void, *mut ibv_dm, u64, usize) -> c_int>,
    pub comp_mask: u32,
    pub handle: u32,
}

#[repr(C)]
pub struct ibv_cq {
    pub context: *mut ibv_context,
    pub channel: *mut ibv_comp_channel,
    pub cq_context: *mut c_void,
    pub handle: u32,
    pub cqe: c_int,
    pub mutex: pthread_mutex_t,
    pub cond: pthread_cond_t,
    pub comp_events_completed: u32,
    pub async_events_completed: u32,
}

#[repr(C)]
pub struct ibv_poll_cq_attr {
    pub comp_mask: u32,
}

type CqExFn<T> = Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> T>;

#[repr(C)]
pub struct ibv_cq_ex {
    pub context: *mut ibv_context,
    pub channel: *mut ibv_comp_channel,
    pub cq_context: *mut c_void,
    pub handle: u32,
    pub cqe: c_int,
    pub mutex: pthread_mutex_t,
    pub cond: pthread_cond_t,
    pub comp_events_completed: u32,
    pub async_events_completed: u32,
    pub comp_mask: u32,
    pub status: c_int,
    pub wr_id: u64,
    pub start_poll: Option<unsafe extern "C" fn(*mut ibv_cq_ex, *mut ibv_poll_cq_attr) -> c_int>,
    pub next_poll: CqExFn<c_int>,
    pub end_poll: Option<unsafe extern "C" fn(*mut ibv_cq_ex)>,
    pub read_opcode: CqExFn<c_int>,
    pub read_vendor_err: CqExFn<u32>,
    pub read_byte_len: CqExFn<u32>,
    pub read_imm_data: CqExFn<u32>,
    pub read_qp_num: CqExFn<u32>,
    pub read_src_qp: CqExFn<u32>,
    pub read_wc_flags: CqExFn<c_uint>,
    pub read_slid: CqExFn<u32>,
    pub read_sl: CqExFn<u8>,
    pub read_dlid_path_bits: CqExFn<u8>,
    pub read_completion_ts: CqExFn<u64>,
    pub read_cvlan: CqExFn<u16>,
    pub read_flow_tag: CqExFn<u32>,
    pub read_tm_info: Option<unsafe extern "C" fn(*mut ibv_cq_ex, *mut c_void)>,
    pub read_completion_wallclock_ns: CqExFn<u64>,
}

#[repr(C)]
pub struct ibv_cq_init_attr_ex {
    pub cqe: u32,
    pub cq_context: *mut c_void,
    pub channel: *mut ibv_comp_channel,
    pub comp_vector: u32,
    pub wc_flags: u64,
    pub comp_mask: u32,
    pub flags: u32,
    pub parent_domain: *mut ibv_pd,
}

#[repr(C)]
pub struct ibv_srq {
    pub context: *mut ibv_context,
    pub srq_context: *mut c_void,
    pub pd: *mut ibv_pd,
    pub handle: u32,
    pub mutex: pthread_mutex_t,
    pub cond: pthread_cond_t,
    pub events_completed: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_srq_attr {
    pub max_wr: u32,
    pub max_sge: u32,
    pub srq_limit: u32,
}

#[repr(C)]
pub struct ibv_srq_init_attr {
    pub srq_context: *mut c_void,
    pub attr: ibv_srq_attr,
}

#[repr(C)]
pub struct ibv_tm_cap {
    pub max_num_tags: u32,
    pub max_ops: u32,
}

#[repr(C)]
pub struct ibv_srq_init_attr_ex {
    pub srq_context: *mut c_void,
    pub attr: ibv_srq_attr,
    pub comp_mask: u32,
    pub srq_type: c_int,
    pub pd: *mut ibv_pd,
    pub xrcd: *mut c_void,
    pub cq: *mut ibv_cq,
    pub tm_cap: ibv_tm_cap,
}

#[repr(C)]
pub struct ibv_qp {
    pub context: *mut ibv_context,
    pub qp_context: *mut c_void,
    pub pd: *mut ibv_pd,
    pub send_cq: *mut ibv_cq,
    pub recv_cq: *mut ibv_cq,
    pub srq: *mut ibv_srq,
    pub handle: u32,
    pub qp_num: u32,
    pub state: c_int,
    pub qp_type: c_int,
    pub mutex: pthread_mutex_t,
    pub cond: pthread_cond_t,
    pub events_completed: u32,
}

#[repr(C)]
pub struct ibv_data_buf {
    pub addr: *mut c_void,
    pub length: usize,
}

type QpExFn<A> = Option<A>;

#[repr(C)]
pub struct ibv_qp_ex {
    pub qp_base: ibv_qp,
    pub comp_mask: u64,
    pub wr_id: u64,
    pub wr_flags: c_uint,
    pub wr_atomic_cmp_swp: QpExFn<unsafe extern "C" fn(*mut ibv_qp_ex, u32, u64, u64, u64)>,
    pub wr_atomic_fetch_add: QpExFn<unsafe extern "C" fn(*mut ibv_qp_ex, u32, u64, u64)>,
    pub wr_bind_mw:
        QpExFn<unsafe extern "C" fn(*mut ibv_qp_ex, *mut ibv_mw, u32, *const ibv_mw_bind_info)>,
    pub wr_local_inv: QpExFn<unsafe extern "C" fn(*mut ibv_qp_ex, u32)>,
    pub wr_rdma_read: QpExFn<unsafe extern "C" fn(*mut ibv_qp_ex, u32, u64)>,
    pub wr_rdma_write: QpExFn<unsafe extern "C" fn(*mut ibv_qp_ex, u32, u64)>,
    pub wr_rdma_write_imm: QpExFn<unsafe extern "C" fn(*mut ibv_qp_ex, u32, u64, u32)>,
    pub wr_send: QpExFn<unsafe extern "C" fn(*mut ibv_qp_ex)>,
    pub wr_send_imm: QpExFn<unsafe extern "C" fn(*mut ibv_qp_ex, u32)>,
    pub wr_send_inv: QpExFn<unsafe extern "C" fn(*mut ibv_qp_ex, u32)>,
    pub wr_send_tso: QpExFn<unsafe extern "C" fn(*mut ibv_qp_ex, *mut c_void, u16, u16)>,
    pub wr_set_ud_addr: QpExFn<unsafe extern "C" fn(*mut ibv_qp_ex, *mut ibv_ah, u32, u32)>,
    pub wr_set_xrc_srqn: QpExFn<unsafe extern "C" fn(*mut ibv_qp_ex, u32)>,
    pub wr_set_inline_data: QpExFn<unsafe extern "C" fn(*mut ibv_qp_ex, *mut c_void, usize)>,
    pub wr_set_inline_data_list:
        QpExFn<unsafe extern "C" fn(*mut ibv_qp_ex, usize, *const ibv_data_buf)>,
    pub wr_set_sge: QpExFn<unsafe extern "C" fn(*mut ibv_qp_ex, u32, u64, u32)>,
    pub wr_set_sge_list: QpExFn<unsafe extern "C" fn(*mut ibv_qp_ex, usize, *const ibv_sge)>,
    pub wr_start: QpExFn<unsafe extern "C" fn(*mut ibv_qp_ex)>,
    pub wr_complete: QpExFn<unsafe extern "C" fn(*mut ibv_qp_ex) -> c_int>,
    pub wr_abort: QpExFn<unsafe extern "C" fn(*mut ibv_qp_ex)>,
    pub wr_atomic_write: QpExFn<unsafe extern "C" fn(*mut ibv_qp_ex, u32, u64, *const c_void)>,
    /// rdma-core 45.
    pub wr_flush: QpExFn<unsafe extern "C" fn(*mut ibv_qp_ex, u32, u64, usize, u8, u8)>,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_qp_cap {
    pub max_send_wr: u32,
    pub max_recv_wr: u32,
    pub max_send_sge: u32,
    pub max_recv_sge: u32,
    pub max_inline_data: u32,
}

#[repr(C)]
pub struct ibv_qp_init_attr {
    pub qp_context: *mut c_void,
    pub send_cq: *mut ibv_cq,
    pub recv_cq: *mut ibv_cq,
    pub srq: *mut ibv_srq,
    pub cap: ibv_qp_cap,
    pub qp_type: c_int,
    pub sq_sig_all: c_int,
}

#[repr(C)]
pub struct ibv_rx_hash_conf {
    pub rx_hash_function: u8,
    pub rx_hash_key_len: u8,
    pub rx_hash_key: *mut u8,
    pub rx_hash_fields_mask: u64,
}

#[repr(C)]
pub struct ibv_qp_init_attr_ex {
    pub qp_context: *mut c_void,
    pub send_cq: *mut ibv_cq,
    pub recv_cq: *mut ibv_cq,
    pub srq: *mut ibv_srq,
    pub cap: ibv_qp_cap,
    pub qp_type: c_int,
    pub sq_sig_all: c_int,
    pub comp_mask: u32,
    pub pd: *mut ibv_pd,
    pub xrcd: *mut c_void,
    pub create_flags: u32,
    pub max_tso_header: u16,
    pub rwq_ind_tbl: *mut c_void,
    pub rx_hash_conf: ibv_rx_hash_conf,
    pub source_qpn: u32,
    pub send_ops_flags: u64,
}

#[repr(C, align(8))]
#[derive(Clone, Copy, Default)]
pub struct ibv_gid {
    pub raw: [u8; 16],
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_global_route {
    pub dgid: ibv_gid,
    pub flow_label: u32,
    pub sgid_index: u8,
    pub hop_limit: u8,
    pub traffic_class: u8,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_ah_attr {
    pub grh: ibv_global_route,
    pub dlid: u16,
    pub sl: u8,
    pub src_path_bits: u8,
    pub static_rate: u8,
    pub is_global: u8,
    pub port_num: u8,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_qp_attr {
    pub qp_state: c_int,
    pub cur_qp_state: c_int,
    pub path_mtu: c_int,
    pub path_mig_state: c_int,
    pub qkey: u32,
    pub rq_psn: u32,
    pub sq_psn: u32,
    pub dest_qp_num: u32,
    pub qp_access_flags: c_uint,
    pub cap: ibv_qp_cap,
    pub ah_attr: ibv_ah_attr,
    pub alt_ah_attr: ibv_ah_attr,
    pub pkey_index: u16,
    pub alt_pkey_index: u16,
    pub en_sqd_async_notify: u8,
    pub sq_draining: u8,
    pub max_rd_atomic: u8,
    pub max_dest_rd_atomic: u8,
    pub min_rnr_timer: u8,
    pub port_num: u8,
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
    pub alt_port_num: u8,
    pub alt_timeout: u8,
    pub rate_limit: u32,
}

#[repr(C)]
pub struct ibv_ah {
    pub context: *mut ibv_context,
    pub pd: *mut ibv_pd,
    pub handle: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_sge {
    pub addr: u64,
    pub length: u32,
    pub lkey: u32,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct wr_rdma {
    pub remote_addr: u64,
    pub rkey: u32,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct wr_atomic {
    pub remote_addr: u64,
    pub compare_add: u64,
    pub swap: u64,
    pub rkey: u32,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct wr_ud {
    pub ah: *mut ibv_ah,
    pub remote_qpn: u32,
    pub remote_qkey: u32,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub union wr_union {
    pub rdma: wr_rdma,
    pub atomic: wr_atomic,
    pub ud: wr_ud,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct wr_bind_mw {
    pub mw: *mut ibv_mw,
    pub rkey: u32,
    pub bind_info: ibv_mw_bind_info,
}

impl Clone for ibv_mw_bind_info {
    fn clone(&self) -> Self {
        *self
    }
}
impl Copy for ibv_mw_bind_info {}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct wr_tso {
    pub hdr: *mut c_void,
    pub hdr_sz: u16,
    pub mss: u16,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub union wr_last {
    pub bind_mw: wr_bind_mw,
    pub tso: wr_tso,
}

#[repr(C)]
pub struct ibv_send_wr {
    pub wr_id: u64,
    pub next: *mut ibv_send_wr,
    pub sg_list: *mut ibv_sge,
    pub num_sge: c_int,
    pub opcode: c_int,
    pub send_flags: c_uint,
    /// `imm_data` (big-endian) or `invalidate_rkey`.
    pub imm_data: u32,
    pub wr: wr_union,
    /// `qp_type.xrc.remote_srqn`.
    pub remote_srqn: u32,
    pub last: wr_last,
}

#[repr(C)]
pub struct ibv_recv_wr {
    pub wr_id: u64,
    pub next: *mut ibv_recv_wr,
    pub sg_list: *mut ibv_sge,
    pub num_sge: c_int,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_wc {
    pub wr_id: u64,
    pub status: c_int,
    pub opcode: c_int,
    pub vendor_err: u32,
    pub byte_len: u32,
    /// `imm_data` (big-endian) or `invalidated_rkey`.
    pub imm_data: u32,
    pub qp_num: u32,
    pub src_qp: u32,
    pub wc_flags: c_uint,
    pub pkey_index: u16,
    pub slid: u16,
    pub sl: u8,
    pub dlid_path_bits: u8,
}

#[repr(C)]
pub union ibv_async_element {
    pub cq: *mut ibv_cq,
    pub qp: *mut ibv_qp,
    pub srq: *mut ibv_srq,
    pub wq: *mut c_void,
    pub port_num: c_int,
}

#[repr(C)]
pub struct ibv_async_event {
    pub element: ibv_async_element,
    pub event_type: c_int,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_device_attr {
    pub fw_ver: [c_char; 64],
    pub node_guid: u64,
    pub sys_image_guid: u64,
    pub max_mr_size: u64,
    pub page_size_cap: u64,
    pub vendor_id: u32,
    pub vendor_part_id: u32,
    pub hw_ver: u32,
    pub max_qp: c_int,
    pub max_qp_wr: c_int,
    pub device_cap_flags: c_uint,
    pub max_sge: c_int,
    pub max_sge_rd: c_int,
    pub max_cq: c_int,
    pub max_cqe: c_int,
    pub max_mr: c_int,
    pub max_pd: c_int,
    pub max_qp_rd_atom: c_int,
    pub max_ee_rd_atom: c_int,
    pub max_res_rd_atom: c_int,
    pub max_qp_init_rd_atom: c_int,
    pub max_ee_init_rd_atom: c_int,
    pub atomic_cap: c_int,
    pub max_ee: c_int,
    pub max_rdd: c_int,
    pub max_mw: c_int,
    pub max_raw_ipv6_qp: c_int,
    pub max_raw_ethy_qp: c_int,
    pub max_mcast_grp: c_int,
    pub max_mcast_qp_attach: c_int,
    pub max_total_mcast_qp_attach: c_int,
    pub max_ah: c_int,
    pub max_fmr: c_int,
    pub max_map_per_fmr: c_int,
    pub max_srq: c_int,
    pub max_srq_wr: c_int,
    pub max_srq_sge: c_int,
    pub max_pkeys: u16,
    pub local_ca_ack_delay: u8,
    pub phys_port_cnt: u8,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_odp_caps {
    pub general_caps: u64,
    pub rc_odp_caps: u32,
    pub uc_odp_caps: u32,
    pub ud_odp_caps: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_tso_caps {
    pub max_tso: u32,
    pub supported_qpts: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_rss_caps {
    pub supported_qpts: u32,
    pub max_rwq_indirection_tables: u32,
    pub max_rwq_indirection_table_size: u32,
    pub rx_hash_fields_mask: u64,
    pub rx_hash_function: u8,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_packet_pacing_caps {
    pub qp_rate_limit_min: u32,
    pub qp_rate_limit_max: u32,
    pub supported_qpts: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_tm_caps {
    pub max_rndv_hdr_size: u32,
    pub max_num_tags: u32,
    pub flags: u32,
    pub max_ops: u32,
    pub max_sge: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_cq_moderation_caps {
    pub max_cq_count: u16,
    pub max_cq_period: u16,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_pci_atomic_caps {
    pub fetch_add: u16,
    pub swap: u16,
    pub compare_swap: u16,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_device_attr_ex {
    pub orig_attr: ibv_device_attr,
    pub comp_mask: u32,
    pub odp_caps: ibv_odp_caps,
    pub completion_timestamp_mask: u64,
    pub hca_core_clock: u64,
    pub device_cap_flags_ex: u64,
    pub tso_caps: ibv_tso_caps,
    pub rss_caps: ibv_rss_caps,
    pub max_wq_type_rq: u32,
    pub packet_pacing_caps: ibv_packet_pacing_caps,
    pub raw_packet_caps: u32,
    pub tm_caps: ibv_tm_caps,
    pub cq_mod_caps: ibv_cq_moderation_caps,
    pub max_dm_size: u64,
    pub pci_atomic_caps: ibv_pci_atomic_caps,
    pub xrc_odp_caps: u32,
    pub phys_port_cnt_ex: u32,
}

#[repr(C)]
pub struct ibv_query_device_ex_input {
    pub comp_mask: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_port_attr {
    pub state: c_int,
    pub max_mtu: c_int,
    pub active_mtu: c_int,
    pub gid_tbl_len: c_int,
    pub port_cap_flags: u32,
    pub max_msg_sz: u32,
    pub bad_pkey_cntr: u32,
    pub qkey_viol_cntr: u32,
    pub pkey_tbl_len: u16,
    pub lid: u16,
    pub sm_lid: u16,
    pub lmc: u8,
    pub max_vl_num: u8,
    pub sm_sl: u8,
    pub subnet_timeout: u8,
    pub init_type_reply: u8,
    pub active_width: u8,
    pub active_speed: u8,
    pub phys_state: u8,
    pub link_layer: u8,
    pub flags: u8,
    pub port_cap_flags2: u16,
    /// rdma-core 49.
    pub active_speed_ex: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_gid_entry {
    pub gid: ibv_gid,
    pub gid_index: u32,
    pub port_num: u32,
    pub gid_type: u32,
    pub ndev_ifindex: u32,
}

impl Default for ibv_device_attr {
    fn default() -> Self {
        // SAFETY: integers and a char array: all zeroes is valid.
        unsafe { std::mem::zeroed() }
    }
}

impl Default for ibv_device_attr_ex {
    fn default() -> Self {
        // SAFETY: integers and a char array: all zeroes is valid.
        unsafe { std::mem::zeroed() }
    }
}

// ---------------------------------------------------------------------------
// Compile-time checks: every line of `layout.txt` (the numbers of rdma-core
// 65's headers) is an assertion here.

include!(concat!(env!("OUT_DIR"), "/layout_checks.rs"));

// `struct ibv_buf` is in rdma-core 65's driver.h, not verbs.h.
const _: () = assert!(std::mem::size_of::<ibv_buf>() == 32);
const _: () = assert!(std::mem::offset_of!(ibv_buf, pd) == 16);
const _: () = assert!(std::mem::offset_of!(ibv_buf, dmabuf_fd) == 24);

// libibverbs' private `struct verbs_device` puts the provider ops pointer
// right after the public `ibv_device`.
const _: () = assert!(std::mem::offset_of!(verbs_device_head, ops) == 664);
