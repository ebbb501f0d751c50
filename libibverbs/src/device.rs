//! Devices and contexts: `ibv_get_device_list`, `ibv_open_device`, the
//! query verbs and asynchronous events.
//!
//! Which devices exist is the daemon's answer (`RXE_EMU_MODE` unset or
//! `daemon`): each device of the running `rxe-emud`. If none is running,
//! the library starts one (`rxe-emud` found through `RXE_EMU_DAEMON`, next
//! to this library, or on `PATH`) hosting `rxe0` on 127.0.0.1, unless
//! `RXE_EMU_AUTOSTART=0`. With `RXE_EMU_MODE=inprocess` there is one
//! device inside the process, on `$RXE_EMU_ADDR` (default 127.0.0.1).

use rustc_hash::FxHashMap;
use std::ffi::{c_char, c_int, c_void, CStr};
use std::net::IpAddr;
use std::sync::Mutex;

use verbs_api::Device;

use crate::abi::*;
use crate::{debug, fail, guard, set_errno};

/// One device as programs see it. Entries live for the whole process (as
/// rdma-core's device list does), so `ibv_device` pointers stay valid.
#[repr(C)]
pub struct DevEntry {
    pub head: verbs_device_head,
    pub name: String,
    pub addr: IpAddr,
    pub netdev_mtu: u32,
    pub index: c_int,
}

// SAFETY: an entry's raw pointer is its `ops` tag, a pointer to static
// data that is never written; entries are only changed under DEVICES' lock.
unsafe impl Send for DevEntry {}

/// Providers compare a device's ops pointer with their own; ours points
/// here, so theirs never match.
static RXE_EMU_DEVICE_OPS: [u8; 8] = *b"rxe-emu\0";

/// Every device discovered so far, by name. Never freed.
static DEVICES: Mutex<Vec<&'static mut DevEntry>> = Mutex::new(Vec::new());

fn copy_cstr(dst: &mut [c_char], s: &str) {
    let n = s.len().min(dst.len() - 1);
    for (d, b) in dst.iter_mut().zip(s.bytes().take(n)) {
        *d = b as c_char;
    }
    dst[n] = 0;
}

fn in_process() -> bool {
    std::env::var("RXE_EMU_MODE").is_ok_and(|m| m == "inprocess")
}

fn inprocess_addr() -> IpAddr {
    std::env::var("RXE_EMU_ADDR")
        .ok()
        .and_then(|a| a.parse().ok())
        .unwrap_or(IpAddr::from([127, 0, 0, 1]))
}

/// Where our library file is (to find `rxe-emud` beside it).
fn library_dir() -> Option<std::path::PathBuf> {
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: dladdr only reads the address of one of our functions and
    // fills `info`, whose strings point into the loader's own tables.
    let ok = unsafe { libc::dladdr(library_dir as *const c_void, &mut info) };
    if ok == 0 || info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: dladdr succeeded, so dli_fname is a NUL-terminated path.
    let p = unsafe { CStr::from_ptr(info.dli_fname) };
    let p = std::path::PathBuf::from(p.to_string_lossy().into_owned());
    let p = std::fs::canonicalize(&p).unwrap_or(p);
    p.parent().map(|d| d.to_path_buf())
}

fn find_daemon_exe() -> std::path::PathBuf {
    if let Some(p) = std::env::var_os("RXE_EMU_DAEMON").filter(|p| !p.is_empty()) {
        return p.into();
    }
    if let Some(dir) = library_dir() {
        for d in [Some(dir.as_path()), dir.parent()].into_iter().flatten() {
            let c = d.join("rxe-emud");
            if c.exists() {
                return c;
            }
        }
    }
    "rxe-emud".into()
}

/// The daemon's devices: `(name, addr, netdev_mtu)`; starts the daemon
/// when none answers and autostart is allowed.
fn daemon_devices() -> Vec<(String, IpAddr, u32)> {
    let path = emulator_daemon::default_socket_path();
    let mut status = emulator_daemon::client::request(&path, "STATUS");
    if status.is_err() && std::env::var("RXE_EMU_AUTOSTART").map_or(true, |v| v != "0") {
        let exe = find_daemon_exe();
        match emulator_daemon::client::spawn_daemon(&exe, &path, &[], false, !crate::debug_on()) {
            Ok(pid) => debug(|| format!("started {} (pid {pid})", exe.display())),
            Err(e) => debug(|| format!("no rxe-emud running and starting one failed: {e}")),
        }
        status = emulator_daemon::client::request(&path, "STATUS");
    }
    let text = match status {
        Ok(t) => t,
        Err(e) => {
            debug(|| format!("no devices: {e}"));
            return Vec::new();
        }
    };
    let mut out = Vec::new();
    for line in text.lines() {
        let mut w = line.split_whitespace();
        if w.next() != Some("device") {
            continue;
        }
        let f: Vec<&str> = w.collect();
        let get = |k: &str| f.iter().position(|x| *x == k).and_then(|i| f.get(i + 1));
        let (Some(name), Some(addr)) = (f.first(), get("addr")) else {
            continue;
        };
        let Ok(addr) = addr.parse() else { continue };
        let mtu = get("netdev_mtu")
            .and_then(|m| m.parse().ok())
            .unwrap_or(1500);
        out.push((name.to_string(), addr, mtu));
    }
    out
}

fn entry_for(name: &str, addr: IpAddr, netdev_mtu: u32) -> *mut ibv_device {
    let mut devs = DEVICES.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(e) = devs.iter_mut().find(|e| e.name == name) {
        e.addr = addr;
        e.netdev_mtu = netdev_mtu;
        return &mut e.head.device;
    }
    // SAFETY: ibv_device is plain C data (integers, chars, fn pointers that
    // may be NULL): all zeroes is a valid value.
    let mut dev: ibv_device = unsafe { std::mem::zeroed() };
    dev.node_type = 1; // IBV_NODE_CA
    dev.transport_type = 0; // IBV_TRANSPORT_IB
    copy_cstr(&mut dev.name, name);
    copy_cstr(&mut dev.dev_name, &format!("uverbs{}", devs.len()));
    copy_cstr(
        &mut dev.dev_path,
        &format!("/sys/class/infiniband_verbs/uverbs{}", devs.len()),
    );
    copy_cstr(
        &mut dev.ibdev_path,
        &format!("/sys/class/infiniband/{name}"),
    );
    let e = Box::leak(Box::new(DevEntry {
        head: verbs_device_head {
            device: dev,
            ops: RXE_EMU_DEVICE_OPS.as_ptr() as *const c_void,
        },
        name: name.to_string(),
        addr,
        netdev_mtu,
        index: devs.len() as c_int,
    }));
    let p: *mut ibv_device = &mut e.head.device;
    devs.push(e);
    p
}

/// `DevEntry` of a device pointer we handed out.
///
/// # Safety
/// `dev` must come from `ibv_get_device_list`.
pub(crate) unsafe fn entry(dev: *mut ibv_device) -> &'static DevEntry {
    // SAFETY: ibv_device is the first field of the repr(C) DevEntry, and
    // entries are never freed.
    unsafe { &*(dev as *const DevEntry) }
}

#[no_mangle]
pub unsafe extern "C" fn rxe_ibv_get_device_list(num: *mut c_int) -> *mut *mut ibv_device {
    guard("ibv_get_device_list", std::ptr::null_mut(), || {
        let found: Vec<(String, IpAddr, u32)> = if in_process() {
            let name = std::env::var("RXE_EMU_DEVICE").unwrap_or_else(|_| "rxe0".into());
            vec![(
                name,
                inprocess_addr(),
                if inprocess_addr().is_loopback() {
                    65536
                } else {
                    1500
                },
            )]
        } else {
            daemon_devices()
        };
        let mut list: Vec<*mut ibv_device> =
            found.iter().map(|(n, a, m)| entry_for(n, *a, *m)).collect();
        if !num.is_null() {
            // SAFETY: the caller passes a valid int pointer (or NULL).
            unsafe { *num = list.len() as c_int };
        }
        list.push(std::ptr::null_mut());
        let boxed = list.into_boxed_slice();
        // The length is recovered by scanning for the NULL at free time.
        Box::into_raw(boxed) as *mut *mut ibv_device
    })
}

#[no_mangle]
pub unsafe extern "C" fn rxe_ibv_free_device_list(list: *mut *mut ibv_device) {
    if list.is_null() {
        return;
    }
    let mut n = 0;
    // SAFETY: the list came from ibv_get_device_list: NULL-terminated.
    while unsafe { !(*list.add(n)).is_null() } {
        n += 1;
    }
    // SAFETY: rebuilds the boxed slice of n + 1 pointers we leaked.
    drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(list, n + 1)) });
}

#[no_mangle]
pub unsafe extern "C" fn rxe_ibv_get_device_name(dev: *mut ibv_device) -> *const c_char {
    if dev.is_null() {
        return std::ptr::null();
    }
    // SAFETY: a device pointer from our list.
    unsafe { (*dev).name.as_ptr() }
}

#[no_mangle]
pub unsafe extern "C" fn rxe_ibv_get_device_index(dev: *mut ibv_device) -> c_int {
    if dev.is_null() {
        return -1;
    }
    // SAFETY: a device pointer from our list.
    unsafe { entry(dev).index }
}

/// Node GUID as kernel rxe makes it: the EUI-64 of the netdev's MAC (for
/// us, the interface id of the device's link-local GID), in network order.
fn node_guid(addr: IpAddr) -> u64 {
    let gids = verbs_api::gid_table(addr);
    let ll = match gids.first() {
        Some(IpAddr::V6(v)) => v.octets(),
        _ => [0; 16],
    };
    u64::from_ne_bytes(ll[8..16].try_into().expect("8 bytes"))
}

#[no_mangle]
pub unsafe extern "C" fn rxe_ibv_get_device_guid(dev: *mut ibv_device) -> u64 {
    if dev.is_null() {
        return 0;
    }
    // SAFETY: a device pointer from our list.
    node_guid(unsafe { entry(dev).addr })
}

// ---------------------------------------------------------------------------
// Contexts

/// Objects of a context that asynchronous and completion events name.
#[derive(Default)]
pub struct Registry {
    pub qps: FxHashMap<u32, usize>,
    pub cqs: FxHashMap<u32, usize>,
    pub srqs: FxHashMap<u32, usize>,
}

/// An open device: `verbs_context` (with `ibv_context` at its end) first.
#[repr(C)]
pub struct Ctx {
    pub vctx: verbs_context,
    pub dev: Device,
    pub reg: Mutex<Registry>,
}

const CTX_OFFSET: usize = std::mem::offset_of!(verbs_context, context);

/// Our context behind an `ibv_context` pointer we handed out.
///
/// # Safety
/// `c` must come from `ibv_open_device` and not be closed.
pub(crate) unsafe fn ctx<'a>(c: *mut ibv_context) -> &'a Ctx {
    // SAFETY: ibv_context is the last field of verbs_context, the first
    // field of the repr(C) Ctx; the context is alive.
    unsafe { &*((c as *mut u8).sub(CTX_OFFSET) as *const Ctx) }
}

/// The command fds of open contexts: `(context, st_dev, st_ino, device)`.
/// `ibv_import_device` finds the device of a (duplicated) command fd by the
/// file it refers to.
static CMD_FDS: Mutex<Vec<(usize, u64, u64, Device)>> = Mutex::new(Vec::new());

/// The file identity of `fd`, if it is open.
fn fd_identity(fd: c_int) -> Option<(u64, u64)> {
    // SAFETY: fstat writes only into the stat buffer we pass.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: as above; a bad fd makes fstat fail with EBADF.
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return None;
    }
    Some((st.st_dev, st.st_ino))
}

/// Build a context on an opened device whose command fd is `cmd_fd`.
fn new_context(dev: *mut ibv_device, d: Device, cmd_fd: c_int) -> *mut ibv_context {
    let async_fd = d.async_fd();
    // SAFETY: verbs_context is C data: NULL pointers, zero integers and
    // an all-zero pthread mutex (PTHREAD_MUTEX_INITIALIZER) are valid.
    let mut vctx: verbs_context = unsafe { std::mem::zeroed() };
    crate::objects::fill_ops(&mut vctx);
    // Every field of rdma-core 65's verbs_context exists (abi.rs).
    vctx.sz = std::mem::size_of::<verbs_context>();
    vctx.context.device = dev;
    vctx.context.cmd_fd = cmd_fd;
    vctx.context.async_fd = async_fd;
    vctx.context.num_comp_vectors =
        std::thread::available_parallelism().map_or(1, |n| n.get() as c_int);
    vctx.context.abi_compat = VERBS_ABI_IS_EXTENDED;
    let c = Box::leak(Box::new(Ctx {
        vctx,
        dev: d.clone(),
        reg: Mutex::new(Registry::default()),
    }));
    // Responses held back by the last poll leave when the process exits
    // with the context still open (closing it sends them too).
    static AT_EXIT: std::sync::Once = std::sync::Once::new();
    AT_EXIT.call_once(|| {
        // SAFETY: registers a handler with no arguments that touches only
        // our statics; glibc runs it at exit, or at dlclose of this library
        // (atexit in a shared object is __cxa_atexit with its handle).
        unsafe { libc::atexit(flush_at_exit) };
    });
    if let Some((sd, si)) = fd_identity(cmd_fd) {
        let key = c as *const Ctx as usize;
        CMD_FDS
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((key, sd, si, d));
    }
    &mut c.vctx.context
}

/// At exit: every open context sends what its polls held back.
extern "C" fn flush_at_exit() {
    if let Ok(open) = CMD_FDS.try_lock() {
        for (_, _, _, d) in open.iter() {
            d.flush_held();
        }
    }
}

fn open(entry: &DevEntry) -> verbs_api::Result<Device> {
    if in_process() {
        let mut cfg = verbs_api::DeviceConfig::new(entry.addr);
        cfg.name = entry.name.clone();
        cfg.netdev_mtu = entry.netdev_mtu;
        Device::open(cfg)
    } else {
        Device::open_daemon(&entry.name, None)
    }
}

#[no_mangle]
pub unsafe extern "C" fn rxe_ibv_open_device(dev: *mut ibv_device) -> *mut ibv_context {
    guard("ibv_open_device", std::ptr::null_mut(), || {
        if dev.is_null() {
            set_errno(libc::EINVAL);
            return std::ptr::null_mut();
        }
        // SAFETY: a device pointer from our list.
        let e = unsafe { entry(dev) };
        let d = match open(e) {
            Ok(d) => d,
            Err(err) => {
                set_errno(fail(&format!("ibv_open_device({})", e.name), &err));
                return std::ptr::null_mut();
            }
        };
        // The command fd: an anonymous file that names this context's
        // device, so a duplicate of it can be imported (ibv_import_device).
        // SAFETY: memfd_create takes a NUL-terminated name and flags.
        let cmd_fd = unsafe { libc::memfd_create(c"rxe-emu-cmd".as_ptr(), libc::MFD_CLOEXEC) };
        new_context(dev, d, cmd_fd)
    })
}

#[no_mangle]
pub unsafe extern "C" fn rxe_ibv_close_device(c: *mut ibv_context) -> c_int {
    if c.is_null() {
        return libc::EINVAL;
    }
    guard("ibv_close_device", libc::EIO, || {
        // SAFETY: a context from ibv_open_device, closed once: rebuild the
        // Box we leaked. Objects the program did not destroy are released
        // with the device, as closing the kernel's fd does.
        let b = unsafe { Box::from_raw((c as *mut u8).sub(CTX_OFFSET) as *mut Ctx) };
        let key = &*b as *const Ctx as usize;
        CMD_FDS
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|e| e.0 != key);
        let cmd_fd = b.vctx.context.cmd_fd;
        drop(b);
        if cmd_fd >= 0 {
            // SAFETY: the context owned its command fd.
            unsafe { libc::close(cmd_fd) };
        }
        0
    })
}

/// `ibv_import_device`: a new context on the device whose command fd
/// `cmd_fd` duplicates (in this process). The new context owns `cmd_fd`.
#[no_mangle]
pub unsafe extern "C" fn rxe_ibv_import_device(cmd_fd: c_int) -> *mut ibv_context {
    guard("ibv_import_device", std::ptr::null_mut(), || {
        let Some((sd, si)) = fd_identity(cmd_fd) else {
            set_errno(libc::EBADF);
            return std::ptr::null_mut();
        };
        let found = CMD_FDS
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .find(|e| (e.1, e.2) == (sd, si))
            // SAFETY: the entry's context is alive (removed on close).
            .map(|e| {
                (
                    unsafe { (*(e.0 as *const Ctx)).vctx.context.device },
                    e.3.clone(),
                )
            });
        match found {
            Some((dev, d)) => new_context(dev, d, cmd_fd),
            None => {
                debug(|| {
                    format!("ibv_import_device: fd {cmd_fd} is not the command fd of an rxe-emu context")
                });
                set_errno(libc::EOPNOTSUPP);
                std::ptr::null_mut()
            }
        }
    })
}

/// `device_cap_flags` of Linux 6.1 rxe (`RXE_DEVICE_CAP_FLAGS`): bad P_Key
/// and Q_Key counters, automatic path migration, change phy port, UD AV
/// port enforce, port active event, system image GUID, RC RNR NAK
/// generation, SRQ resize, memory management extensions, memory windows
/// and type 2B windows.
const RXE_DEVICE_CAP_FLAGS: u32 = 0x0122_3c76;
/// `IB_UVERBS_DEVICE_FLUSH_GLOBAL`.
const FLUSH_GLOBAL: u64 = 1 << 38;
/// `IB_UVERBS_DEVICE_FLUSH_PERSISTENT`.
const FLUSH_PERSISTENT: u64 = 1 << 39;
/// `IB_UVERBS_DEVICE_ATOMIC_WRITE`.
const ATOMIC_WRITE: u64 = 1 << 40;

fn fill_device_attr(c: &Ctx, a: &mut ibv_device_attr) {
    // SAFETY: the context's device pointer is one of our entries.
    let e = unsafe { entry(c.vctx.context.device) };
    let caps = c.dev.query_device();
    let clamp = |v: u32| v.min(i32::MAX as u32) as c_int;
    *a = ibv_device_attr::default();
    copy_cstr(&mut a.fw_ver, "0.0.0");
    a.node_guid = node_guid(e.addr);
    a.sys_image_guid = a.node_guid;
    a.max_mr_size = caps.max_mr_size;
    a.page_size_cap = caps.page_size_cap;
    a.vendor_id = caps.vendor_id;
    a.vendor_part_id = caps.vendor_part_id;
    a.hw_ver = caps.hw_ver;
    a.max_qp = clamp(caps.max_qp);
    a.max_qp_wr = clamp(caps.max_qp_wr);
    a.device_cap_flags = RXE_DEVICE_CAP_FLAGS;
    a.max_sge = clamp(caps.max_send_sge);
    a.max_sge_rd = clamp(caps.max_sge_rd);
    a.max_cq = clamp(caps.max_cq);
    a.max_cqe = clamp(caps.max_cqe);
    a.max_mr = clamp(caps.max_mr);
    a.max_pd = clamp(caps.max_pd);
    a.max_qp_rd_atom = clamp(caps.max_qp_rd_atom);
    a.max_res_rd_atom = clamp(caps.max_res_rd_atom);
    a.max_qp_init_rd_atom = clamp(caps.max_qp_init_rd_atom);
    a.atomic_cap = 1; // IBV_ATOMIC_HCA
    a.max_mw = clamp(caps.max_mw);
    a.max_mcast_grp = clamp(caps.max_mcast_grp);
    a.max_mcast_qp_attach = clamp(caps.max_mcast_qp_attach);
    a.max_total_mcast_qp_attach = clamp(caps.max_mcast_grp * caps.max_mcast_qp_attach);
    a.max_ah = clamp(caps.max_ah);
    a.max_srq = clamp(caps.max_srq);
    a.max_srq_wr = clamp(caps.max_srq_wr);
    a.max_srq_sge = clamp(caps.max_srq_sge);
    a.max_pkeys = caps.max_pkeys;
    a.local_ca_ack_delay = caps.local_ca_ack_delay;
    a.phys_port_cnt = 1;
}

#[no_mangle]
pub unsafe extern "C" fn rxe_ibv_query_device(
    c: *mut ibv_context,
    attr: *mut ibv_device_attr,
) -> c_int {
    if c.is_null() || attr.is_null() {
        return libc::EINVAL;
    }
    guard("ibv_query_device", libc::EIO, || {
        // SAFETY: live context and a caller-provided attr struct.
        unsafe { fill_device_attr(ctx(c), &mut *attr) };
        0
    })
}

/// `verbs_context.query_device_ex`.
pub unsafe extern "C" fn query_device_ex(
    c: *mut ibv_context,
    input: *const ibv_query_device_ex_input,
    attr: *mut ibv_device_attr_ex,
    attr_size: usize,
) -> c_int {
    if c.is_null() || attr.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: a non-NULL input is a caller-provided struct.
    if !input.is_null() && unsafe { (*input).comp_mask } != 0 {
        return libc::EINVAL;
    }
    guard("ibv_query_device_ex", libc::EIO, || {
        let mut ex = ibv_device_attr_ex::default();
        // SAFETY: live context.
        fill_device_attr(unsafe { ctx(c) }, &mut ex.orig_attr);
        // Kernel rxe reports no extended capabilities beyond the basic
        // attributes (no ODP, TSO, RSS, pacing, tag matching, DM; rxe-emu
        // adds DM and ODP below); the
        // port count is repeated in phys_port_cnt_ex. The 64-bit flags
        // repeat device_cap_flags, plus what rxe reports since Linux 6.2
        // (RXE_DEVICE_CAP_FLAGS): IB_UVERBS_DEVICE_FLUSH_GLOBAL (bit 38),
        // IB_UVERBS_DEVICE_FLUSH_PERSISTENT (bit 39; kernel rxe reports it
        // although only pmem can be registered for it, as here none can)
        // and IB_UVERBS_DEVICE_ATOMIC_WRITE (bit 40).
        ex.phys_port_cnt_ex = 1;
        // A device like kernel rxe 6.1 reports none of the three.
        ex.device_cap_flags_ex = u64::from(RXE_DEVICE_CAP_FLAGS);
        // SAFETY: live context.
        if unsafe { ctx(c) }.dev.release().has_flush_and_atomic_write() {
            ex.device_cap_flags_ex |= FLUSH_GLOBAL | FLUSH_PERSISTENT | ATOMIC_WRITE;
        }
        // Device memory, which kernel rxe lacks: process memory owned by
        // the library (see dm.rs).
        ex.max_dm_size = crate::dm::MAX_DM_SIZE;
        // On-demand paging, which kernel rxe 6.1 lacks: an ODP MR's pages
        // are checked as they are touched (verbs-api HostMemory), and an
        // implicit MR covers the whole address space; XRC as RC, its
        // receives always from an SRQ.
        const SEND: u32 = 1;
        const RECV: u32 = 1 << 1;
        const WRITE: u32 = 1 << 2;
        const READ: u32 = 1 << 3;
        const ATOMIC: u32 = 1 << 4;
        const SRQ_RECV: u32 = 1 << 5;
        ex.odp_caps.general_caps = 1 | (1 << 1); // IBV_ODP_SUPPORT | _IMPLICIT
        ex.odp_caps.rc_odp_caps = SEND | RECV | WRITE | READ | ATOMIC | SRQ_RECV;
        // FLUSH and ATOMIC WRITE on ODP memory, as kernel rxe since 6.16
        // (rdma-core 65's test_odp runs them when these bits are set).
        const ODP_FLUSH: u32 = 1 << 6;
        const ODP_ATOMIC_WRITE: u32 = 1 << 7;
        // SAFETY: live context.
        if unsafe { ctx(c) }.dev.release().has_flush_and_atomic_write() {
            ex.odp_caps.rc_odp_caps |= ODP_FLUSH | ODP_ATOMIC_WRITE;
        }
        ex.odp_caps.uc_odp_caps = SEND | RECV | WRITE | SRQ_RECV;
        ex.odp_caps.ud_odp_caps = SEND | RECV | SRQ_RECV;
        ex.xrc_odp_caps = SEND | WRITE | READ | ATOMIC | SRQ_RECV;
        let n = attr_size.min(std::mem::size_of::<ibv_device_attr_ex>());
        // SAFETY: the caller's struct has attr_size bytes; we copy at most
        // that many from ours.
        unsafe {
            std::ptr::copy_nonoverlapping(
                &ex as *const ibv_device_attr_ex as *const u8,
                attr as *mut u8,
                n,
            )
        };
        0
    })
}

/// `IB_PORT_CM_SUP` (`RXE_PORT_PORT_CAP_FLAGS`): what `ibv_query_port`
/// reports for a kernel rxe port on 6.1, 6.12 and 7.2 (the interop suite's
/// `facts` run compares it).
const RXE_PORT_CAP_FLAGS: u32 = 1 << 16;

fn port_attr(c: &Ctx) -> ibv_port_attr {
    let p = c.dev.query_port();
    ibv_port_attr {
        state: if p.active { 4 } else { 1 }, // IBV_PORT_ACTIVE / DOWN
        max_mtu: p.max_mtu.ibv() as c_int,
        active_mtu: p.active_mtu.ibv() as c_int,
        gid_tbl_len: p.gid_tbl_len as c_int,
        port_cap_flags: RXE_PORT_CAP_FLAGS,
        max_msg_sz: p.max_msg_sz,
        bad_pkey_cntr: 0,
        qkey_viol_cntr: 0,
        pkey_tbl_len: p.pkey_tbl_len,
        lid: p.lid,
        sm_lid: 0,
        lmc: 0,
        max_vl_num: 1,
        sm_sl: 0,
        subnet_timeout: 0,
        init_type_reply: 0,
        active_width: ACTIVE_WIDTH,
        active_speed: ACTIVE_SPEED,
        phys_state: 5, // LinkUp
        link_layer: if p.link_layer_ethernet { 2 } else { 1 },
        flags: 0,
        port_cap_flags2: 0,
        // uverbs reports the speed here as well (Linux 6.7+).
        active_speed_ex: ACTIVE_SPEED as u32,
    }
}

/// The attributes of port `port` of context `c`, or the errno.
///
/// # Safety
/// `c` must be NULL or a live context.
unsafe fn port_attr_of(c: *mut ibv_context, port: u32, what: &str) -> Result<ibv_port_attr, c_int> {
    if c.is_null() {
        return Err(libc::EINVAL);
    }
    if port != 1 {
        debug(|| format!("{what}: port {port} does not exist (rxe has port 1)"));
        return Err(libc::EINVAL);
    }
    guard(what, Err(libc::EIO), || {
        // SAFETY: live context.
        Ok(port_attr(unsafe { ctx(c) }))
    })
}

/// `IBV_WIDTH_4X`, as rxe reports for most netdevs.
const ACTIVE_WIDTH: u8 = 2;
/// `IBV_SPEED_EDR` (25 Gb/s lanes).
const ACTIVE_SPEED: u8 = 32;

/// The bandwidth of a port of `width` lanes (`IBV_WIDTH_*`) at `speed`
/// (`IBV_SPEED_*`, or rdma-core 65's `active_speed_ex`), in units of
/// 100 Mb/s (`ibv_query_port_speed`'s): lanes times the data rate of one
/// lane. `None` for a value verbs.h does not define.
fn port_speed_100mbps(width: u8, speed: u32) -> Option<u64> {
    let lanes = match width {
        1 => 1,
        2 => 4,
        4 => 8,
        8 => 12,
        16 => 2,
        _ => return None,
    };
    // SDR 2.5, DDR 5, QDR 10, FDR10 10, FDR 14, EDR 25, HDR 50, NDR 100,
    // XDR 200 Gb/s per lane.
    let lane = match speed {
        1 => 25,
        2 => 50,
        4 | 8 => 100,
        16 => 140,
        32 => 250,
        64 => 500,
        128 => 1000,
        256 => 2000,
        _ => return None,
    };
    Some(lanes * lane)
}

/// `ibv_query_port_speed` (rdma-core 65): the port's bandwidth in units of
/// 100 Mb/s, from the same width and speed `ibv_query_port` reports (4X
/// EDR: 1000, 100 Gb/s). Returns 0 or an errno.
#[no_mangle]
pub unsafe extern "C" fn rxe_ibv_query_port_speed(
    c: *mut ibv_context,
    port: u32,
    speed: *mut u64,
) -> c_int {
    if speed.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: forwarded caller contract.
    let a = match unsafe { port_attr_of(c, port, "ibv_query_port_speed") } {
        Ok(a) => a,
        Err(e) => return e,
    };
    match port_speed_100mbps(a.active_width, a.active_speed_ex) {
        Some(s) => {
            // SAFETY: the caller's output.
            unsafe { *speed = s };
            0
        }
        None => libc::EINVAL,
    }
}

/// `verbs_context.query_port` (what the inline `ibv_query_port` calls).
pub unsafe extern "C" fn query_port(
    c: *mut ibv_context,
    port: u8,
    attr: *mut ibv_port_attr,
    attr_len: usize,
) -> c_int {
    if attr.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: forwarded caller contract.
    let a = match unsafe { port_attr_of(c, port as u32, "ibv_query_port") } {
        Ok(a) => a,
        Err(e) => return e,
    };
    guard("ibv_query_port", libc::EIO, || {
        let n = attr_len.min(std::mem::size_of::<ibv_port_attr>());
        // SAFETY: the caller's struct has attr_len bytes.
        unsafe {
            std::ptr::copy_nonoverlapping(
                &a as *const ibv_port_attr as *const u8,
                attr as *mut u8,
                n,
            )
        };
        0
    })
}

/// The exported `ibv_query_port` (older programs, and the inline one's
/// fallback): the `_compat_ibv_port_attr` layout, which is the current
/// one without the fields after `link_layer`... it has the same first 47
/// bytes, and we fill what the caller's struct can hold.
#[no_mangle]
pub unsafe extern "C" fn rxe_ibv_query_port(
    c: *mut ibv_context,
    port: u8,
    attr: *mut ibv_port_attr,
) -> c_int {
    // SAFETY: as query_port; the compat struct is 48 bytes (link_layer
    // ends at 47, then padding), all of which we may write.
    unsafe { query_port(c, port, attr, 48) }
}

fn gid_at(c: &Ctx, index: usize) -> [u8; 16] {
    c.dev.gid_table().get(index).copied().unwrap_or([0; 16])
}

#[no_mangle]
pub unsafe extern "C" fn rxe_ibv_query_gid(
    c: *mut ibv_context,
    port: u8,
    index: c_int,
    gid: *mut ibv_gid,
) -> c_int {
    if c.is_null() || gid.is_null() || port != 1 || index < 0 {
        return -1;
    }
    guard("ibv_query_gid", -1, || {
        // SAFETY: live context.
        let c = unsafe { ctx(c) };
        if index as u32 >= c.dev.query_port().gid_tbl_len {
            return -1;
        }
        // Unused entries read as zero, as the kernel's sysfs shows them.
        // SAFETY: caller-provided gid.
        unsafe { (*gid).raw = gid_at(c, index as usize) };
        0
    })
}

/// `IBV_GID_TYPE_ROCE_V2`.
const GID_TYPE_ROCE_V2: u32 = 2;

fn gid_entry(c: &Ctx, index: u32) -> Option<ibv_gid_entry> {
    let t = c.dev.gid_table();
    let raw = *t.get(index as usize)?;
    Some(ibv_gid_entry {
        gid: ibv_gid { raw },
        gid_index: index,
        port_num: 1,
        gid_type: GID_TYPE_ROCE_V2,
        ndev_ifindex: 1,
    })
}

#[no_mangle]
pub unsafe extern "C" fn rxe__ibv_query_gid_ex(
    c: *mut ibv_context,
    port: u32,
    index: u32,
    entry: *mut ibv_gid_entry,
    flags: u32,
    entry_size: usize,
) -> c_int {
    if c.is_null() || entry.is_null() || flags != 0 || entry_size < 32 {
        return libc::EINVAL;
    }
    if port != 1 {
        return libc::EINVAL;
    }
    guard("ibv_query_gid_ex", libc::EIO, || {
        // SAFETY: live context.
        match gid_entry(unsafe { ctx(c) }, index) {
            Some(e) => {
                // SAFETY: the caller's entry has entry_size >= 32 bytes.
                unsafe { *entry = e };
                0
            }
            None => libc::ENODATA,
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn rxe__ibv_query_gid_table(
    c: *mut ibv_context,
    entries: *mut ibv_gid_entry,
    max: usize,
    flags: u32,
    entry_size: usize,
) -> isize {
    if c.is_null() || flags != 0 || entry_size < 32 || (entries.is_null() && max > 0) {
        return -(libc::EINVAL as isize);
    }
    guard("ibv_query_gid_table", -(libc::EIO as isize), || {
        // SAFETY: live context.
        let c = unsafe { ctx(c) };
        let n = c.dev.gid_table().len();
        if n > max {
            return -(libc::EINVAL as isize);
        }
        for i in 0..n {
            let e = gid_entry(c, i as u32).expect("index in table");
            // SAFETY: entries has room for max >= n entries of entry_size.
            unsafe {
                std::ptr::write(
                    (entries as *mut u8).add(i * entry_size) as *mut ibv_gid_entry,
                    e,
                )
            };
        }
        n as isize
    })
}

#[no_mangle]
pub unsafe extern "C" fn rxe_ibv_query_gid_type(
    c: *mut ibv_context,
    port: u8,
    index: u32,
    gid_type: *mut u32,
) -> c_int {
    if c.is_null() || gid_type.is_null() || port != 1 {
        return libc::EINVAL;
    }
    // The private interface numbers GID types as driver.h does
    // (IB/RoCE v1 = 0, RoCE v2 = 1), unlike `ibv_gid_entry.gid_type`.
    // SAFETY: caller-provided output.
    unsafe { *gid_type = 1 };
    let _ = index;
    0
}

#[no_mangle]
pub unsafe extern "C" fn rxe_ibv_query_pkey(
    c: *mut ibv_context,
    port: u8,
    index: c_int,
    pkey: *mut u16,
) -> c_int {
    if c.is_null() || pkey.is_null() || port != 1 {
        return -1;
    }
    // rxe's P_Key table has one entry, the default P_Key 0xffff.
    if index != 0 {
        return -1;
    }
    // SAFETY: caller-provided output (__be16).
    unsafe { *pkey = 0xffffu16.to_be() };
    0
}

#[no_mangle]
pub unsafe extern "C" fn rxe_ibv_get_pkey_index(c: *mut ibv_context, port: u8, pkey: u16) -> c_int {
    if c.is_null() || port != 1 {
        return -1;
    }
    // Full and limited membership of the default partition both match.
    if u16::from_be(pkey) & 0x7fff == 0x7fff {
        0
    } else {
        set_errno(libc::ENOENT);
        -1
    }
}

// ---------------------------------------------------------------------------
// Asynchronous events

#[no_mangle]
pub unsafe extern "C" fn rxe_ibv_get_async_event(
    c: *mut ibv_context,
    event: *mut ibv_async_event,
) -> c_int {
    if c.is_null() || event.is_null() {
        set_errno(libc::EINVAL);
        return -1;
    }
    guard("ibv_get_async_event", -1, || {
        // SAFETY: live context.
        let cx = unsafe { ctx(c) };
        let nonblocking = {
            // SAFETY: fcntl on our own async fd.
            let fl = unsafe { libc::fcntl(cx.vctx.context.async_fd, libc::F_GETFL) };
            fl >= 0 && fl & libc::O_NONBLOCK != 0
        };
        loop {
            let ev = if nonblocking {
                cx.dev.poll_async_event()
            } else {
                cx.dev.get_async_event(None)
            };
            let Some(ev) = ev else {
                set_errno(libc::EAGAIN);
                return -1;
            };
            debug(|| format!("async event: {ev}"));
            let reg = cx.reg.lock().unwrap_or_else(|p| p.into_inner());
            let element = match ev.object {
                rxe_core::EventObject::Qp(n) => match reg.qps.get(&n) {
                    Some(p) => ibv_async_element {
                        qp: *p as *mut ibv_qp,
                    },
                    None => continue, // destroyed since: nobody to tell
                },
                rxe_core::EventObject::Cq(h) => match reg.cqs.get(&h.0) {
                    Some(p) => ibv_async_element {
                        cq: *p as *mut ibv_cq,
                    },
                    None => continue,
                },
                rxe_core::EventObject::Srq(h) => match reg.srqs.get(&h.0) {
                    Some(p) => ibv_async_element {
                        srq: *p as *mut ibv_srq,
                    },
                    None => continue,
                },
                rxe_core::EventObject::Port(n) => ibv_async_element {
                    port_num: n as c_int,
                },
                rxe_core::EventObject::Device => ibv_async_element { port_num: 0 },
            };
            // SAFETY: caller-provided event struct.
            unsafe {
                (*event).element = element;
                (*event).event_type = ev.kind as c_int;
            }
            return 0;
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn rxe_ibv_ack_async_event(event: *mut ibv_async_event) {
    // Events are values here; nothing waits for their acknowledgement.
    let _ = event;
}

#[cfg(test)]
mod tests {
    #[test]
    fn port_speed_is_lanes_times_lane_rate() {
        use super::port_speed_100mbps as s;
        assert_eq!(s(2, 32), Some(1000)); // 4X EDR: 100 Gb/s
        assert_eq!(s(1, 1), Some(25)); // 1X SDR: 2.5 Gb/s
        assert_eq!(s(8, 256), Some(24000)); // 12X XDR
        assert_eq!(s(3, 32), None);
        assert_eq!(s(2, 3), None);
    }
}
