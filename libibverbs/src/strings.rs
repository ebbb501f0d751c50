//! Names and rate conversions (`ibv_wc_status_str`, `ibv_event_type_str`,
//! `ibv_node_type_str`, `ibv_port_state_str`, `ibv_rate_to_mult`, ...),
//! with the texts rdma-core prints.

use std::ffi::{c_char, c_int};

macro_rules! cstr_table {
    ($($s:literal),* $(,)?) => { [$(concat!($s, "\0")),*] };
}

fn as_c(s: &'static str) -> *const c_char {
    s.as_ptr() as *const c_char
}

#[no_mangle]
pub unsafe extern "C" fn rxe_ibv_wc_status_str(status: c_int) -> *const c_char {
    const T: [&str; 22] = cstr_table!(
        "success",
        "local length error",
        "local QP operation error",
        "local EE context operation error",
        "local protection error",
        "Work Request Flushed Error",
        "memory management operation error",
        "bad response error",
        "local access error",
        "remote invalid request error",
        "remote access error",
        "remote operation error",
        "transport retry counter exceeded",
        "RNR retry counter exceeded",
        "local RDD violation error",
        "remote invalid RD request",
        "operation aborted",
        "invalid EE context number",
        "invalid EE context state",
        "fatal error",
        "response timeout error",
        "general error",
    );
    match usize::try_from(status).ok().and_then(|i| T.get(i)) {
        Some(s) => as_c(s),
        None => as_c("unknown\0"),
    }
}

#[no_mangle]
pub unsafe extern "C" fn rxe_ibv_event_type_str(ev: c_int) -> *const c_char {
    const T: [&str; 19] = cstr_table!(
        "CQ error",
        "local work queue catastrophic error",
        "invalid request local work queue error",
        "local access violation work queue error",
        "communication established",
        "send queue drained",
        "path migrated",
        "path migration request error",
        "local catastrophic error",
        "port active",
        "port error",
        "LID change",
        "P_Key change",
        "SM change",
        "SRQ catastrophic error",
        "SRQ limit reached",
        "last WQE reached",
        "client reregistration",
        "GID table change",
    );
    match usize::try_from(ev).ok().and_then(|i| T.get(i)) {
        Some(s) => as_c(s),
        None if ev == 19 => as_c("WQ fatal\0"),
        None if ev == 20 => as_c("Device link speed change\0"),
        None => as_c("unknown\0"),
    }
}

/// `ibv_wr_opcode_str` (rdma-core 65, private node): rdma-core's names;
/// "unknown" outside `IBV_WR_RDMA_WRITE..=IBV_WR_ATOMIC_WRITE` and for
/// the two unnamed values 12 and 13 (where rdma-core's table has NULL).
#[no_mangle]
pub unsafe extern "C" fn rxe_ibv_wr_opcode_str(op: c_int) -> *const c_char {
    const T: [&str; 16] = cstr_table!(
        "rdma-write",
        "rdma-write-with-imm",
        "send",
        "send-with-imm",
        "rdma-read",
        "atomic-cmp-and-swp",
        "atomic-fetch-and-add",
        "local-inv",
        "bind-mw",
        "send-with-inv",
        "tso",
        "driver1",
        "unknown",
        "unknown",
        "flush",
        "atomic-write",
    );
    match usize::try_from(op).ok().and_then(|i| T.get(i)) {
        Some(s) => as_c(s),
        None => as_c("unknown\0"),
    }
}

#[no_mangle]
pub unsafe extern "C" fn rxe_ibv_node_type_str(t: c_int) -> *const c_char {
    const T: [&str; 7] = cstr_table!(
        "unknown",
        "InfiniBand channel adapter",
        "InfiniBand switch",
        "InfiniBand router",
        "iWARP NIC",
        "usNIC",
        "usNIC UDP",
    );
    match usize::try_from(t).ok().and_then(|i| T.get(i)) {
        Some(s) => as_c(s),
        None if t == 7 => as_c("unspecified\0"),
        None => as_c("unknown\0"),
    }
}

#[no_mangle]
pub unsafe extern "C" fn rxe_ibv_port_state_str(s: c_int) -> *const c_char {
    const T: [&str; 6] = cstr_table!(
        "no state change (NOP)",
        "down",
        "init",
        "armed",
        "active",
        "active deferred"
    );
    match usize::try_from(s).ok().and_then(|i| T.get(i)) {
        Some(x) => as_c(x),
        None => as_c("unknown\0"),
    }
}

/// `enum ibv_rate` values with their multiple of 2.5 Gb/s and their Mb/s.
const RATES: [(c_int, c_int, c_int); 21] = [
    (2, 1, 2500),
    (5, 2, 5000),
    (3, 4, 10000),
    (6, 8, 20000),
    (4, 12, 30000),
    (7, 16, 40000),
    (8, 24, 60000),
    (9, 32, 80000),
    (10, 48, 120000),
    (11, 6, 14062),
    (12, 22, 56250),
    (13, 45, 112500),
    (14, 67, 168750),
    (15, 10, 25781),
    (16, 40, 103125),
    (17, 81, 206250),
    (18, 121, 309375),
    (19, 20, 50000),
    (20, 160, 400000),
    (21, 240, 600000),
    (22, 320, 800000),
];

#[no_mangle]
pub unsafe extern "C" fn rxe_ibv_rate_to_mult(rate: c_int) -> c_int {
    RATES.iter().find(|r| r.0 == rate).map_or(-1, |r| r.1)
}

#[no_mangle]
pub unsafe extern "C" fn rxe_mult_to_ibv_rate(mult: c_int) -> c_int {
    RATES.iter().find(|r| r.1 == mult).map_or(0, |r| r.0)
}

#[no_mangle]
pub unsafe extern "C" fn rxe_ibv_rate_to_mbps(rate: c_int) -> c_int {
    RATES.iter().find(|r| r.0 == rate).map_or(-1, |r| r.2)
}

#[no_mangle]
pub unsafe extern "C" fn rxe_mbps_to_ibv_rate(mbps: c_int) -> c_int {
    RATES.iter().find(|r| r.2 == mbps).map_or(0, |r| r.0)
}
