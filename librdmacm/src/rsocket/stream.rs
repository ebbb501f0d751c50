//! A stream rsocket (`SOCK_STREAM`): one RC QP on a synchronous
//! `rdma_cm_id`, as rdma-core's `rsocket.c` builds it, speaking its
//! protocol (see [`super::proto`]).
//!
//! Where we differ from rsocket.c, invisibly on the wire:
//! - No service threads. rsocket.c accepts connections and watches CM
//!   events of connected sockets in background threads; we do that work
//!   when the program calls in (`raccept`, `rpoll`, `rrecv`, ...), and a
//!   connected socket waits on two fds: its CQ channel and its CM event
//!   channel (so a peer's DREQ ends a blocked `rrecv` with EOF).
//! - The CQ channel and CM channel fds are always non-blocking; a
//!   blocking call waits in `poll(2)` on them (waking at least every
//!   [`WAKE_MS`] to re-check), so no call sleeps inside librdmacm.
//! - Keepalive messages are not sent (the options are kept and
//!   reported); receivers ignore them anyway.

use std::collections::VecDeque;
use std::ffi::{c_int, c_void};
use std::sync::{Mutex, MutexGuard};

use emulator_daemon::cmproto::CmErr;

use super::proto::{self, ConnData, RsSge};
use super::verbs;
use crate::abi::verbs::{ibv_device_attr, ibv_mr, ibv_recv_wr, ibv_send_wr, ibv_sge, ibv_wc};
use crate::abi::*;
use crate::{err, ffi};

/// rsocket.c's `enum rs_state` (the same bits, so that `<` orders
/// passive, connecting, connected, disconnected as there).
pub mod state {
    pub const INIT: u32 = 0;
    pub const BOUND: u32 = 0x0001;
    pub const LISTENING: u32 = 0x0002;
    pub const OPENING: u32 = 0x0004;
    pub const RESOLVING_ADDR: u32 = OPENING | 0x0010;
    pub const RESOLVING_ROUTE: u32 = OPENING | 0x0020;
    pub const CONNECTING: u32 = OPENING | 0x0040;
    pub const ACCEPTING: u32 = OPENING | 0x0080;
    pub const CONNECTED: u32 = 0x0100;
    pub const WRITABLE: u32 = 0x0200;
    pub const READABLE: u32 = 0x0400;
    pub const CONNECT_RDWR: u32 = CONNECTED | READABLE | WRITABLE;
    pub const CONNECT_ERROR: u32 = 0x0800;
    pub const DISCONNECTED: u32 = 0x1000;
    pub const ERROR: u32 = 0x2000;
}
use state::*;

/// `RS_OPT_SWAP_SGL`: the peer's byte order differs from ours.
const OPT_SWAP_SGL: u32 = 1 << 0;
/// `RS_OPT_KEEPALIVE`.
pub const OPT_KEEPALIVE: u32 = 1 << 3;

/// A blocked call re-checks the socket at least this often (ms).
pub const WAKE_MS: c_int = 50;

/// Page-aligned, zeroed memory registered with the device.
struct Region {
    ptr: *mut u8,
    layout: std::alloc::Layout,
    mr: *mut ibv_mr,
}

impl Region {
    fn new(pd: *mut ibv_pd, len: usize, access: c_int) -> Result<Region, CmErr> {
        let layout = std::alloc::Layout::from_size_align(len.max(1), 4096)
            .map_err(|_| err(libc::ENOMEM, "buffer size"))?;
        // SAFETY: a non-zero size layout.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        if ptr.is_null() {
            return Err(err(libc::ENOMEM, "out of memory for an rsocket buffer"));
        }
        // SAFETY: the PD is the id's; the buffer is ours for the MR's life.
        let mr = unsafe { verbs::ibv_reg_mr(pd, ptr as *mut c_void, len, access) };
        if mr.is_null() {
            let e = crate::errno();
            // SAFETY: allocated above with this layout.
            unsafe { std::alloc::dealloc(ptr, layout) };
            return Err(err(
                if e == 0 { libc::ENOMEM } else { e },
                "ibv_reg_mr failed",
            ));
        }
        Ok(Region { ptr, layout, mr })
    }

    fn lkey(&self) -> u32 {
        // SAFETY: a live MR.
        unsafe { (*self.mr).lkey }
    }

    fn rkey(&self) -> u32 {
        // SAFETY: a live MR.
        unsafe { (*self.mr).rkey }
    }

    fn addr(&self) -> u64 {
        self.ptr as u64
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: our MR over our buffer; nothing uses either after.
        unsafe {
            verbs::ibv_dereg_mr(self.mr);
            std::alloc::dealloc(self.ptr, self.layout);
        }
    }
}

/// Everything of one stream rsocket (rsocket.c `struct rsocket`).
pub struct Stream {
    pub cm_id: *mut rdma_cm_id,
    pub state: u32,
    pub fd_flags: c_int,
    /// `SO_ERROR`.
    pub err: c_int,
    pub opts: u32,
    retries: u32,
    pub so_opts: u64,
    pub tcp_opts: u64,
    pub ipv6_opts: u64,
    pub keepalive_time: u32,

    pub sbuf_size: u32,
    pub rbuf_size: u32,
    pub sq_size: u16,
    pub rq_size: u16,
    pub sq_inline: u16,
    pub target_iomap_size: u16,

    ctrl_seqno: u32,
    ctrl_max_seqno: u32,
    sseq_no: u16,
    sseq_comp: u16,
    rseq_no: u16,
    rseq_comp: u16,

    /// The peer's target SGL array and which of its entries we fill next.
    remote_sgl: RsSge,
    remote_sge: u32,
    /// Our target SGL array (written by the peer) and the entry we send
    /// into.
    target: Option<Region>,
    target_sge: usize,

    rbuf: Option<Region>,
    rbuf_bytes_avail: u32,
    rbuf_free_offset: u32,
    rbuf_offset: u32,
    /// Lengths of received messages not yet read (rsocket.c `rmsg`).
    rmsg: VecDeque<u32>,

    sbuf: Option<Region>,
    sbuf_bytes_avail: u32,
    /// Where the next copy into the send buffer goes.
    sbuf_head: u32,
    sqe_avail: u32,

    cq_armed: bool,
    unack_cqe: u32,
    /// The connection ended without the peer's DISCONNECT message (its
    /// CM disconnected, or our sends failed).
    aborted: bool,
}

// SAFETY: the raw pointers are to objects this socket owns; every use
// holds the socket's mutex.
unsafe impl Send for Stream {}

/// A stream rsocket shared by the calls that name its fd.
pub struct RSocket {
    pub inner: Mutex<Stream>,
}

impl RSocket {
    pub fn lock(&self) -> MutexGuard<'_, Stream> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }
}

type Test = fn(&Stream) -> bool;

pub fn set_nonblock(fd: c_int) {
    // SAFETY: fcntl on an fd we own.
    unsafe {
        let fl = libc::fcntl(fd, libc::F_GETFL);
        if fl >= 0 {
            libc::fcntl(fd, libc::F_SETFL, fl | libc::O_NONBLOCK);
        }
    }
}

fn errno_err(what: &str) -> CmErr {
    let e = crate::errno();
    err(if e == 0 { libc::EIO } else { e }, what.to_string())
}

impl Stream {
    /// rsocket.c `rs_alloc`: defaults, or those of the listener.
    pub fn new(cm_id: *mut rdma_cm_id, from: Option<&Stream>) -> Stream {
        let (sbuf_size, rbuf_size, sq_inline, sq_size, rq_size, ctrl_max, iomap) = match from {
            Some(l) => (
                l.sbuf_size,
                l.rbuf_size,
                l.sq_inline,
                l.sq_size,
                l.rq_size,
                l.ctrl_max_seqno,
                l.target_iomap_size,
            ),
            None => (
                proto::DEF_WMEM,
                proto::DEF_MEM,
                proto::DEF_INLINE,
                proto::DEF_SQSIZE,
                proto::DEF_RQSIZE,
                proto::RS_QP_CTRL_SIZE,
                0,
            ),
        };
        Stream {
            cm_id,
            state: INIT,
            fd_flags: 0,
            err: 0,
            opts: 0,
            retries: 0,
            so_opts: 0,
            tcp_opts: 0,
            ipv6_opts: 0,
            keepalive_time: 0,
            sbuf_size,
            rbuf_size,
            sq_size,
            rq_size,
            sq_inline,
            target_iomap_size: iomap,
            ctrl_seqno: 0,
            ctrl_max_seqno: ctrl_max,
            sseq_no: 0,
            sseq_comp: 0,
            rseq_no: 0,
            rseq_comp: 0,
            remote_sgl: RsSge::default(),
            remote_sge: 0,
            target: None,
            target_sge: 0,
            rbuf: None,
            rbuf_bytes_avail: 0,
            rbuf_free_offset: 0,
            rbuf_offset: 0,
            rmsg: VecDeque::new(),
            sbuf: None,
            sbuf_bytes_avail: 0,
            sbuf_head: 0,
            sqe_avail: 0,
            cq_armed: false,
            unack_cqe: 0,
            aborted: false,
        }
    }

    fn cm(&self) -> Result<&'static crate::id::CmId, CmErr> {
        // SAFETY: cm_id is the live id this socket owns.
        unsafe { crate::id::cm(self.cm_id) }
    }

    /// The fd of the id's CM event channel (the socket's number).
    pub fn cm_fd(&self) -> c_int {
        // SAFETY: the id and its channel are live.
        unsafe { (*(*self.cm_id).channel).fd }
    }

    /// The fd of the CQ's completion channel, once there is one.
    pub fn cq_fd(&self) -> Option<c_int> {
        // SAFETY: the id is live; its channel is ours.
        unsafe {
            let ch = (*self.cm_id).recv_cq_channel;
            (!ch.is_null()).then(|| (*ch).fd)
        }
    }

    fn qp(&self) -> *mut ibv_qp {
        // SAFETY: the id is live.
        unsafe { (*self.cm_id).qp }
    }

    fn cq(&self) -> *mut ibv_cq {
        // SAFETY: the id is live.
        unsafe { (*self.cm_id).recv_cq }
    }

    // ------------------------------------------------------------ target SGL

    fn target_ptr(&self, i: usize) -> *mut u8 {
        match &self.target {
            // SAFETY: i < RS_SGL_SIZE entries of 16 bytes in the region.
            Some(t) => unsafe { t.ptr.add(i * RsSge::LEN) },
            None => std::ptr::null_mut(),
        }
    }

    /// Entry `i` of our target SGL array. The peer RDMA-writes it, so it
    /// is read afresh each time (rsocket.c: `volatile`).
    fn target_get(&self, i: usize) -> RsSge {
        let p = self.target_ptr(i);
        if p.is_null() {
            return RsSge::default();
        }
        // SAFETY: 16 readable bytes of the registered array, 8-aligned
        // (page-aligned region, 16-byte entries).
        unsafe {
            RsSge {
                addr: std::ptr::read_volatile(p as *const u64),
                key: std::ptr::read_volatile(p.add(8) as *const u32),
                length: std::ptr::read_volatile(p.add(12) as *const u32),
            }
        }
    }

    fn target_set(&self, i: usize, s: RsSge) {
        let p = self.target_ptr(i);
        if p.is_null() {
            return;
        }
        // SAFETY: as in target_get.
        unsafe {
            std::ptr::write_volatile(p as *mut u64, s.addr);
            std::ptr::write_volatile(p.add(8) as *mut u32, s.key);
            std::ptr::write_volatile(p.add(12) as *mut u32, s.length);
        }
    }

    // ------------------------------------------------------------ setup

    /// rsocket.c `rs_set_qp_size`.
    fn set_qp_size(&mut self) {
        let mut attr: ibv_device_attr = unsafe_zeroed();
        // SAFETY: the id has a device once its address is resolved.
        let max_wr = if unsafe { ffi::ibv_query_device((*self.cm_id).verbs, &mut attr) } == 0 {
            attr.max_qp_wr.clamp(0, 0xFFFF) as u16
        } else {
            proto::RS_QP_MAX_SIZE
        };
        let max = max_wr.min(proto::RS_QP_MAX_SIZE);
        self.sq_size = self.sq_size.clamp(proto::RS_QP_MIN_SIZE, max.max(1));
        self.rq_size = self.rq_size.clamp(proto::RS_QP_MIN_SIZE, max.max(1));
    }

    /// rsocket.c `rs_create_cq`: one CQ for both directions, with a
    /// completion channel, armed.
    fn create_cq(&mut self) -> Result<(), CmErr> {
        let id = self.cm_id;
        // SAFETY: the id is live with a device; the objects made here are
        // recorded on the id, which destroys them with its QP.
        unsafe {
            let ctx = (*id).verbs;
            let ch = ffi::ibv_create_comp_channel(ctx);
            if ch.is_null() {
                return Err(errno_err("ibv_create_comp_channel"));
            }
            let cq = ffi::ibv_create_cq(
                ctx,
                c_int::from(self.sq_size) + c_int::from(self.rq_size),
                id as *mut c_void,
                ch,
                0,
            );
            if cq.is_null() {
                let e = errno_err("ibv_create_cq");
                ffi::ibv_destroy_comp_channel(ch);
                return Err(e);
            }
            set_nonblock((*ch).fd);
            verbs::req_notify_cq(cq);
            (*id).recv_cq_channel = ch;
            (*id).recv_cq = cq;
            (*id).send_cq_channel = ch;
            (*id).send_cq = cq;
        }
        Ok(())
    }

    /// rsocket.c `rs_create_ep`: CQ, QP, buffers, and a full receive
    /// queue.
    fn create_ep(&mut self) -> Result<(), CmErr> {
        self.set_qp_size();
        self.create_cq()?;
        // SAFETY: the id is live.
        let (scq, rcq) = unsafe { ((*self.cm_id).send_cq, (*self.cm_id).recv_cq) };
        let mut attr = ibv_qp_init_attr {
            qp_context: std::ptr::null_mut(),
            send_cq: scq,
            recv_cq: rcq,
            srq: std::ptr::null_mut(),
            cap: crate::abi::verbs::ibv_qp_cap {
                max_send_wr: u32::from(self.sq_size),
                max_recv_wr: u32::from(self.rq_size),
                max_send_sge: 2,
                max_recv_sge: 1,
                max_inline_data: u32::from(self.sq_inline),
            },
            qp_type: IBV_QPT_RC,
            sq_sig_all: 1,
        };
        // SAFETY: our id and attributes.
        if unsafe { crate::qp::rxe_rdma_create_qp(self.cm_id, std::ptr::null_mut(), &mut attr) }
            != 0
        {
            return Err(errno_err("rdma_create_qp"));
        }
        self.sq_inline = attr.cap.max_inline_data.min(0xFFFF) as u16;
        self.init_bufs()?;
        for _ in 0..self.rq_size {
            self.post_recv()?;
        }
        Ok(())
    }

    /// rsocket.c `rs_init_bufs`.
    fn init_bufs(&mut self) -> Result<(), CmErr> {
        // SAFETY: the id is live; its PD was set by rdma_create_qp.
        let pd = unsafe { (*self.cm_id).pd };
        let mut total_sbuf = self.sbuf_size;
        if u32::from(self.sq_inline) < proto::RS_MAX_CTRL_MSG {
            total_sbuf += proto::RS_MAX_CTRL_MSG * proto::RS_QP_CTRL_SIZE;
        }
        self.sbuf = Some(Region::new(
            pd,
            total_sbuf as usize,
            verbs::IBV_ACCESS_LOCAL_WRITE,
        )?);
        let tlen =
            RsSge::LEN * proto::RS_SGL_SIZE as usize + 32 * usize::from(self.target_iomap_size);
        let rw = verbs::IBV_ACCESS_LOCAL_WRITE | verbs::IBV_ACCESS_REMOTE_WRITE;
        self.target = Some(Region::new(pd, tlen, rw)?);
        self.rbuf = Some(Region::new(pd, self.rbuf_size as usize, rw)?);
        self.sbuf_head = 0;
        self.sbuf_bytes_avail = self.sbuf_size;
        self.rbuf_free_offset = self.rbuf_size >> 1;
        self.rbuf_bytes_avail = self.rbuf_size >> 1;
        self.sqe_avail = u32::from(self.sq_size).saturating_sub(self.ctrl_max_seqno);
        self.rseq_comp = self.rq_size >> 1;
        Ok(())
    }

    /// rsocket.c `rs_format_conn_data`.
    fn conn_data(&self) -> ConnData {
        let (tgt_addr, tgt_key) = self
            .target
            .as_ref()
            .map_or((0, 0), |t| (t.addr(), t.rkey()));
        let (rb_addr, rb_key) = self.rbuf.as_ref().map_or((0, 0), |r| (r.addr(), r.rkey()));
        ConnData {
            version: proto::RS_CONN_VERSION,
            flags: proto::RS_CONN_FLAG_IOMAP
                | if proto::host_is_net() {
                    proto::RS_CONN_FLAG_NET
                } else {
                    0
                },
            credits: self.rq_size,
            target_iomap_size: proto::value_to_scale(u32::from(self.target_iomap_size), 8) as u8,
            target_sgl: RsSge {
                addr: tgt_addr,
                key: tgt_key,
                length: proto::RS_SGL_SIZE,
            },
            data_buf: RsSge {
                addr: rb_addr,
                key: rb_key,
                length: self.rbuf_size >> 1,
            },
        }
    }

    /// rsocket.c `rs_save_conn_data`.
    fn save_conn_data(&mut self, c: &ConnData) {
        self.remote_sgl = c.target_sgl;
        self.remote_sge = 1;
        if (c.flags & proto::RS_CONN_FLAG_NET != 0) != proto::host_is_net() {
            self.opts = OPT_SWAP_SGL;
        }
        self.target_set(0, c.data_buf);
        self.sseq_comp = c.credits;
    }

    // ------------------------------------------------------------ posting

    fn post_recv(&mut self) -> Result<(), CmErr> {
        let mut wr = ibv_recv_wr {
            wr_id: proto::WR_ID_RECV,
            next: std::ptr::null_mut(),
            sg_list: std::ptr::null_mut(),
            num_sge: 0,
        };
        // SAFETY: our QP and a WR with no SGE.
        let r = unsafe { verbs::post_recv(self.qp(), &mut wr) };
        if r != 0 {
            return Err(err(r, "ibv_post_recv"));
        }
        Ok(())
    }

    /// An RDMA WRITE WITH IMMEDIATE of `sgl` to `addr`/`rkey` (rsocket.c
    /// `rs_post_write_msg`; `rs_post_msg` with no SGE).
    fn post_write_msg(
        &mut self,
        sgl: &mut [ibv_sge],
        imm: u32,
        flags: u32,
        addr: u64,
        rkey: u32,
    ) -> Result<(), CmErr> {
        // SAFETY: all-zero is a valid ibv_send_wr (NULL pointers).
        let mut wr: ibv_send_wr = unsafe_zeroed();
        wr.wr_id = u64::from(imm);
        wr.sg_list = if sgl.is_empty() {
            std::ptr::null_mut()
        } else {
            sgl.as_mut_ptr()
        };
        wr.num_sge = sgl.len() as c_int;
        wr.opcode = verbs::IBV_WR_RDMA_WRITE_WITH_IMM;
        wr.send_flags = flags;
        wr.imm_data = imm.to_be();
        wr.wr.rdma = crate::abi::verbs::wr_rdma {
            remote_addr: addr,
            rkey,
        };
        // SAFETY: our QP; the WR and SGEs live across the call (inline
        // data is copied at post time, other data stays in our MRs).
        let r = unsafe { verbs::post_send(self.qp(), &mut wr) };
        if r != 0 {
            return Err(err(r, "ibv_post_send"));
        }
        Ok(())
    }

    fn post_msg(&mut self, imm: u32) -> Result<(), CmErr> {
        self.post_write_msg(&mut [], imm, 0, 0, 0)
    }

    /// rsocket.c `rs_write_data`: claim the bytes of the current target
    /// SGE, then write them with a DATA immediate.
    fn write_data(&mut self, sgl: &mut [ibv_sge], length: u32, flags: u32) -> Result<(), CmErr> {
        self.sseq_no = self.sseq_no.wrapping_add(1);
        self.sqe_avail -= 1;
        self.sbuf_bytes_avail -= length;
        let mut t = self.target_get(self.target_sge);
        let (addr, rkey) = (t.addr, t.key);
        t.addr += u64::from(length);
        t.length -= length;
        self.target_set(self.target_sge, t);
        if t.length == 0 {
            self.target_sge = (self.target_sge + 1) % proto::RS_SGL_SIZE as usize;
        }
        self.post_write_msg(
            sgl,
            proto::msg(proto::RS_OP_DATA, length),
            flags,
            addr,
            rkey,
        )
    }

    // ------------------------------------------------------------ credits

    fn ctrl_avail(&self) -> bool {
        self.ctrl_seqno != self.ctrl_max_seqno
    }

    /// rsocket.c `rs_give_credits`.
    fn give_credits(&self) -> bool {
        (self.rbuf_bytes_avail >= (self.rbuf_size >> 1)
            || (self.rseq_no.wrapping_sub(self.rseq_comp) as i16) >= 0)
            && self.ctrl_avail()
            && self.state & CONNECTED != 0
    }

    /// rsocket.c `rs_send_credits`: grant the free half of the receive
    /// buffer (written into the peer's target SGL array) and/or more
    /// message credits.
    fn send_credits(&mut self) {
        self.ctrl_seqno = self.ctrl_seqno.wrapping_add(1);
        self.rseq_comp = self.rseq_no.wrapping_add(self.rq_size >> 1);
        let credits = u32::from(self.rseq_no) + u32::from(self.rq_size);
        let imm = proto::msg(proto::RS_OP_SGL, credits);
        let half = self.rbuf_size >> 1;
        if self.rbuf_bytes_avail >= half {
            let Some((rb_addr, rb_key)) = self.rbuf.as_ref().map(|r| (r.addr(), r.rkey())) else {
                return;
            };
            let sge = RsSge {
                addr: rb_addr + u64::from(self.rbuf_free_offset),
                key: rb_key,
                length: half,
            };
            let bytes = sge.to_target(self.opts & OPT_SWAP_SGL != 0);
            let (mut ib, flags) = if u32::from(self.sq_inline) < proto::RS_MAX_CTRL_MSG {
                // Not inline: from the control area after the send buffer.
                let Some(sb) = self.sbuf.as_ref() else { return };
                let off = self.sbuf_size
                    + proto::RS_MAX_CTRL_MSG * (self.ctrl_seqno & (proto::RS_QP_CTRL_SIZE - 1));
                // SAFETY: the control area is inside the send region.
                unsafe {
                    std::ptr::copy_nonoverlapping(bytes.as_ptr(), sb.ptr.add(off as usize), 16)
                };
                (
                    ibv_sge {
                        addr: sb.addr() + u64::from(off),
                        length: 16,
                        lkey: sb.lkey(),
                    },
                    0,
                )
            } else {
                (
                    ibv_sge {
                        addr: bytes.as_ptr() as u64,
                        length: 16,
                        lkey: 0,
                    },
                    verbs::IBV_SEND_INLINE,
                )
            };
            let dst = self.remote_sgl.addr + u64::from(self.remote_sge) * RsSge::LEN as u64;
            let key = self.remote_sgl.key;
            if let Err(e) = self.post_write_msg(std::slice::from_mut(&mut ib), imm, flags, dst, key)
            {
                crate::debug(|| format!("rsocket: sending credits: {e}"));
            }
            self.rbuf_bytes_avail -= half;
            self.rbuf_free_offset += half;
            if self.rbuf_free_offset >= self.rbuf_size {
                self.rbuf_free_offset = 0;
            }
            self.remote_sge += 1;
            if self.remote_sge >= self.remote_sgl.length.max(1) {
                self.remote_sge = 0;
            }
        } else if let Err(e) = self.post_msg(imm) {
            crate::debug(|| format!("rsocket: sending credits: {e}"));
        }
    }

    fn update_credits(&mut self) {
        if self.give_credits() {
            self.send_credits();
        }
    }

    // ------------------------------------------------------------ completions

    /// rsocket.c `rs_poll_cq`: take every completion, then repost as many
    /// receives as were consumed.
    fn poll_cq(&mut self) -> Result<(), CmErr> {
        let cq = self.cq();
        if cq.is_null() {
            return Ok(());
        }
        let mut rcnt = 0u32;
        let mut wcs = [ibv_wc::default(); 16];
        loop {
            // SAFETY: our live CQ.
            let n = unsafe { verbs::poll_cq(cq, &mut wcs) };
            if n <= 0 {
                break;
            }
            for wc in &wcs[..n as usize] {
                if wc.wr_id & proto::WR_ID_RECV != 0 {
                    if wc.status != verbs::IBV_WC_SUCCESS {
                        continue;
                    }
                    rcnt += 1;
                    if wc.wc_flags & verbs::IBV_WC_WITH_IMM == 0 {
                        continue;
                    }
                    let imm = u32::from_be(wc.imm_data);
                    match proto::msg_op(imm) {
                        proto::RS_OP_SGL => self.sseq_comp = proto::msg_data(imm) as u16,
                        proto::RS_OP_IOMAP_SGL | proto::RS_OP_WRITE => {}
                        proto::RS_OP_CTRL => match proto::msg_data(imm) {
                            proto::RS_CTRL_DISCONNECT => {
                                self.state = DISCONNECTED;
                                return Ok(());
                            }
                            // Keepalives only prove the peer is there.
                            proto::RS_CTRL_KEEPALIVE => {}
                            proto::RS_CTRL_SHUTDOWN => {
                                if self.state & WRITABLE != 0 {
                                    self.state &= !READABLE;
                                } else {
                                    self.state = DISCONNECTED;
                                    return Ok(());
                                }
                            }
                            _ => {}
                        },
                        _ => self.rmsg.push_back(proto::msg_data(imm)),
                    }
                } else {
                    let data = wc.wr_id as u32;
                    match proto::msg_op(data) {
                        proto::RS_OP_SGL => {
                            self.ctrl_max_seqno = self.ctrl_max_seqno.wrapping_add(1)
                        }
                        proto::RS_OP_CTRL => {
                            self.ctrl_max_seqno = self.ctrl_max_seqno.wrapping_add(1);
                            if proto::msg_data(data) == proto::RS_CTRL_DISCONNECT {
                                self.state = DISCONNECTED;
                            }
                        }
                        proto::RS_OP_IOMAP_SGL => {
                            self.sqe_avail += 1;
                            self.sbuf_bytes_avail += 32;
                        }
                        _ => {
                            self.sqe_avail += 1;
                            self.sbuf_bytes_avail += proto::msg_data(data);
                        }
                    }
                    if wc.status != verbs::IBV_WC_SUCCESS && self.state & CONNECTED != 0 {
                        crate::debug(|| {
                            format!(
                                "rsocket: send completion status {}: connection lost",
                                wc.status
                            )
                        });
                        self.state = ERROR;
                        self.err = libc::EIO;
                        self.aborted = true;
                    }
                }
            }
        }
        if self.state & CONNECTED != 0 {
            for _ in 0..rcnt {
                if let Err(e) = self.post_recv() {
                    self.state = ERROR;
                    self.err = e.errno;
                    return Err(e);
                }
            }
        }
        Ok(())
    }

    /// Read one completion event if the CQ was armed (rsocket.c
    /// `rs_get_cq_event`, non-blocking).
    pub fn get_cq_event(&mut self) {
        if !self.cq_armed {
            return;
        }
        let Some(_) = self.cq_fd() else { return };
        let mut cq: *mut ibv_cq = std::ptr::null_mut();
        let mut ctx: *mut c_void = std::ptr::null_mut();
        // SAFETY: our channel (non-blocking) and out pointers.
        let r =
            unsafe { verbs::ibv_get_cq_event((*self.cm_id).recv_cq_channel, &mut cq, &mut ctx) };
        if r == 0 {
            self.unack_cqe += 1;
            if self.unack_cqe >= u32::from(self.sq_size) + u32::from(self.rq_size) {
                // SAFETY: our CQ; these events were read.
                unsafe { verbs::ibv_ack_cq_events(self.cq(), self.unack_cqe) };
                self.unack_cqe = 0;
            }
            self.cq_armed = false;
        } else {
            let e = crate::errno();
            if e != libc::EAGAIN && e != libc::EINTR {
                self.state = ERROR;
                self.err = e;
            }
        }
    }

    /// CM events of a connected socket: a DISCONNECTED (the peer's DREQ)
    /// ends the connection (rsocket.c `rs_handle_cm_event`).
    pub fn cm_events(&mut self) {
        if self.state & CONNECTED == 0 {
            return;
        }
        let Ok(c) = self.cm() else { return };
        loop {
            match crate::id::complete(c) {
                Ok(()) => {
                    // SAFETY: complete left the event on the id.
                    let ev = unsafe { (*self.cm_id).event };
                    // SAFETY: a live event.
                    if !ev.is_null()
                        && unsafe { (*ev).event }
                            == emulator_daemon::cmproto::event::DISCONNECTED as c_int
                    {
                        crate::debug(|| "rsocket: the peer disconnected".into());
                        self.state = DISCONNECTED;
                        self.aborted = true;
                        return;
                    }
                }
                Err(e) if e.errno == libc::EAGAIN => return,
                Err(e) => {
                    crate::debug(|| format!("rsocket: CM event: {e}"));
                    self.state = DISCONNECTED;
                    return;
                }
            }
        }
    }
}

fn unsafe_zeroed<T>() -> T {
    // SAFETY: used only for C structs whose all-zero value is valid
    // (numbers and NULL pointers).
    unsafe { std::mem::zeroed() }
}

// ---------------------------------------------------------------- tests

pub fn can_send(s: &Stream) -> bool {
    s.sqe_avail > 0
        && s.sbuf_bytes_avail >= proto::RS_SNDLOWAT
        && s.sseq_no != s.sseq_comp
        && s.target_get(s.target_sge).length != 0
}

fn conn_can_send(s: &Stream) -> bool {
    can_send(s) || s.state & WRITABLE == 0
}

fn conn_can_send_ctrl(s: &Stream) -> bool {
    s.ctrl_avail() || s.state & CONNECTED == 0
}

pub fn have_rdata(s: &Stream) -> bool {
    !s.rmsg.is_empty()
}

pub fn conn_have_rdata(s: &Stream) -> bool {
    have_rdata(s) || s.state & READABLE == 0
}

fn conn_all_sends_done(s: &Stream) -> bool {
    (s.ctrl_max_seqno.wrapping_sub(s.ctrl_seqno) as i32 + s.sqe_avail as i32)
        == i32::from(s.sq_size)
        || s.state & CONNECTED == 0
}

pub fn poll_all(_: &Stream) -> bool {
    true
}

pub fn is_cq_armed(s: &Stream) -> bool {
    s.cq_armed
}

// ---------------------------------------------------------------- waiting

/// Wait until the socket's CQ channel or CM channel has something (or
/// [`WAKE_MS`] passed), with the socket unlocked meanwhile.
fn wait<'a>(rs: &'a RSocket, g: MutexGuard<'a, Stream>, cm_only: bool) -> MutexGuard<'a, Stream> {
    let mut fds = [libc::pollfd {
        fd: g.cm_fd(),
        events: libc::POLLIN,
        revents: 0,
    }; 2];
    let mut n = 1;
    if !cm_only {
        if let Some(fd) = g.cq_fd() {
            fds[1].fd = fd;
            n = 2;
        }
    }
    drop(g);
    // SAFETY: poll on our array of n pollfds.
    unsafe { libc::poll(fds.as_mut_ptr(), n, WAKE_MS) };
    rs.lock()
}

/// rsocket.c `rs_process_cq`: take completions (and credit updates)
/// until `test` holds; non-blocking: EWOULDBLOCK instead of waiting.
pub fn process_cq<'a>(
    rs: &'a RSocket,
    mut g: MutexGuard<'a, Stream>,
    nonblock: bool,
    test: Test,
) -> (MutexGuard<'a, Stream>, Result<(), CmErr>) {
    let r = loop {
        g.update_credits();
        let polled = g.poll_cq();
        if test(&g) {
            break Ok(());
        }
        if let Err(e) = polled {
            break Err(e);
        }
        if nonblock {
            g.cm_events();
            if test(&g) {
                break Ok(());
            }
            break Err(err(libc::EWOULDBLOCK, "would block"));
        }
        if !g.cq_armed {
            // SAFETY: our live CQ.
            unsafe { verbs::req_notify_cq(g.cq()) };
            g.cq_armed = true;
            continue;
        }
        g.update_credits();
        g = wait(rs, g, false);
        g.get_cq_event();
        g.cm_events();
    };
    g.update_credits();
    (g, r)
}

// ---------------------------------------------------------------- connect

/// rsocket.c `rs_do_connect`: advance an opening socket one step as far
/// as events allow; `EINPROGRESS` while the CM has not answered.
pub fn do_connect(g: &mut Stream) -> Result<(), CmErr> {
    let opening = g.state == INIT || g.state == BOUND || g.state & OPENING != 0;
    let r = do_connect_step(g);
    if let Err(e) = &r {
        if in_progress(e) {
            return Err(err(libc::EINPROGRESS, "connection in progress"));
        }
        if opening {
            crate::debug(|| format!("rsocket connect: {e}"));
            g.state = CONNECT_ERROR;
            g.err = e.errno;
        }
    }
    r
}

/// Steps of [`do_connect_step`] that follow at once (never left in
/// `state` when it returns: each either moves on or fails).
const STEP_RESOLVE_ROUTE: u32 = 0x8000_0000 | RESOLVING_ROUTE;
const STEP_CONNECT: u32 = 0x8000_0000 | CONNECTING;

fn in_progress(e: &CmErr) -> bool {
    e.errno == libc::EAGAIN || e.errno == libc::EWOULDBLOCK
}

fn do_connect_step(g: &mut Stream) -> Result<(), CmErr> {
    let c = g.cm()?;
    let id = g.cm_id;
    loop {
        match g.state {
            INIT | BOUND => {
                let to = 1000 << g.retries.min(20);
                g.retries += 1;
                // SAFETY: our id; the destination stored by rconnect.
                let r = unsafe {
                    crate::id::rxe_rdma_resolve_addr(
                        id,
                        std::ptr::null_mut(),
                        &mut (*id).route.addr.dst_storage as *mut _ as *mut libc::sockaddr,
                        to,
                    )
                };
                if r != 0 {
                    let e = errno_err("rdma_resolve_addr");
                    if in_progress(&e) {
                        g.state = RESOLVING_ADDR;
                    }
                    return Err(e);
                }
                g.retries = 0;
                g.state = STEP_RESOLVE_ROUTE;
            }
            RESOLVING_ADDR => {
                if let Err(e) = crate::id::complete(c) {
                    if e.errno == libc::ETIMEDOUT && g.retries <= proto::RS_CONN_RETRIES {
                        g.state = INIT;
                        continue;
                    }
                    return Err(e);
                }
                g.retries = 0;
                g.state = STEP_RESOLVE_ROUTE;
            }
            STEP_RESOLVE_ROUTE => {
                let to = 1000 << g.retries.min(20);
                g.retries += 1;
                // SAFETY: our id.
                if unsafe { crate::id::rxe_rdma_resolve_route(id, to) } != 0 {
                    let e = errno_err("rdma_resolve_route");
                    g.state = RESOLVING_ROUTE;
                    return Err(e);
                }
                g.state = STEP_CONNECT;
            }
            RESOLVING_ROUTE => {
                if let Err(e) = crate::id::complete(c) {
                    if e.errno == libc::ETIMEDOUT && g.retries <= proto::RS_CONN_RETRIES {
                        g.state = STEP_RESOLVE_ROUTE;
                        continue;
                    }
                    return Err(e);
                }
                g.state = STEP_CONNECT;
            }
            STEP_CONNECT => {
                g.create_ep()?;
                let pd = g.conn_data().emit();
                let mut param = rdma_conn_param {
                    private_data: pd.as_ptr() as *const c_void,
                    private_data_len: pd.len() as u8,
                    flow_control: 1,
                    retry_count: 7,
                    rnr_retry_count: 7,
                    ..Default::default()
                };
                param.responder_resources = 0;
                param.initiator_depth = 0;
                g.retries = 0;
                g.state = CONNECTING;
                // SAFETY: our id; the parameters live across the call.
                if unsafe { crate::id::rxe_rdma_connect(id, &mut param) } != 0 {
                    return Err(errno_err("rdma_connect"));
                }
                return connected(g);
            }
            CONNECTING => {
                crate::id::complete(c)?;
                return connected(g);
            }
            ACCEPTING => {
                crate::id::complete(c)?;
                g.state = CONNECT_RDWR;
                return Ok(());
            }
            CONNECT_ERROR | DISCONNECTED | ERROR => {
                return Err(err(libc::ENOTCONN, "not connected"));
            }
            s => {
                return if s & CONNECTED != 0 {
                    Ok(())
                } else {
                    Err(err(libc::EINVAL, "not connecting"))
                };
            }
        }
    }
}

/// The reply arrived (ESTABLISHED with the peer's connection data).
fn connected(g: &mut Stream) -> Result<(), CmErr> {
    // SAFETY: complete left the event on the id; its private data lives
    // until the event is acked.
    let data = unsafe {
        let ev = (*g.cm_id).event;
        if ev.is_null() {
            Vec::new()
        } else {
            let p = (*ev).param.conn;
            if p.private_data.is_null() {
                Vec::new()
            } else {
                std::slice::from_raw_parts(p.private_data as *const u8, p.private_data_len.into())
                    .to_vec()
            }
        }
    };
    match ConnData::parse(&data) {
        Some(cd) if cd.version == proto::RS_CONN_VERSION => {
            g.save_conn_data(&cd);
            g.state = CONNECT_RDWR;
            Ok(())
        }
        _ => Err(err(
            libc::ENOTSUP,
            format!(
                "the peer's reply is not rsocket connection data (version 1): {} bytes",
                data.len()
            ),
        )),
    }
}

/// Blocking connect/accept completion: wait on the CM channel until the
/// socket is connected or failed.
pub fn finish_connect<'a>(
    rs: &'a RSocket,
    mut g: MutexGuard<'a, Stream>,
) -> (MutexGuard<'a, Stream>, Result<(), CmErr>) {
    loop {
        match do_connect(&mut g) {
            Err(e) if e.errno == libc::EINPROGRESS => g = wait(rs, g, true),
            r => return (g, r),
        }
    }
}

/// rsocket.c `rs_accept`, for one connection request already taken by
/// `rdma_get_request` (`new_id`): check the peer's data, build the QP
/// and buffers, and accept with ours.
pub fn accept_request(listener: &Stream, new_id: *mut rdma_cm_id) -> Result<Stream, CmErr> {
    let mut s = Stream::new(new_id, Some(listener));
    // SAFETY: rdma_get_request left the CONNECT_REQUEST event on the id.
    let (param, data) = unsafe {
        let ev = (*new_id).event;
        if ev.is_null() {
            return Err(err(libc::EINVAL, "no connection request on the id"));
        }
        let p = (*ev).param.conn;
        let data = if p.private_data.is_null() {
            Vec::new()
        } else {
            std::slice::from_raw_parts(p.private_data as *const u8, p.private_data_len.into())
                .to_vec()
        };
        (p, data)
    };
    let creq = match ConnData::parse(&data) {
        Some(c) if c.version == proto::RS_CONN_VERSION => c,
        _ => {
            return Err(err(
                libc::ENOTSUP,
                format!(
                    "connection request without rsocket data (version 1): {} bytes",
                    data.len()
                ),
            ))
        }
    };
    set_nonblock(s.cm_fd());
    s.create_ep()?;
    s.save_conn_data(&creq);
    let pd = s.conn_data().emit();
    let mut p = param;
    p.private_data = pd.as_ptr() as *const c_void;
    p.private_data_len = pd.len() as u8;
    // SAFETY: the new id; the parameters live across the call.
    if unsafe { crate::id::rxe_rdma_accept(new_id, &mut p) } == 0 {
        s.state = CONNECT_RDWR;
    } else {
        let e = errno_err("rdma_accept");
        if !in_progress(&e) {
            return Err(e);
        }
        s.state = ACCEPTING;
    }
    Ok(s)
}

/// Free what the socket owns: buffers, QP (with its CQ and channel), id.
pub fn free(g: &mut Stream) {
    if g.cm_id.is_null() {
        return;
    }
    g.sbuf = None;
    g.rbuf = None;
    g.target = None;
    let id = g.cm_id;
    // SAFETY: our id; rdma_destroy_qp destroys the QP, the CQ and the
    // channel recorded on the id (after we ack the CQ's events).
    unsafe {
        if !(*id).recv_cq.is_null() && g.unack_cqe > 0 {
            verbs::ibv_ack_cq_events((*id).recv_cq, g.unack_cqe);
            g.unack_cqe = 0;
        }
        if !(*id).qp.is_null() || !(*id).recv_cq.is_null() {
            crate::qp::rxe_rdma_destroy_qp(id);
        }
        crate::id::rxe_rdma_destroy_id(id);
    }
    g.cm_id = std::ptr::null_mut();
}

// ---------------------------------------------------------------- data

/// rsocket.c `rrecv` for a connected stream socket.
pub fn recv(rs: &RSocket, buf: *mut u8, len: usize, flags: c_int) -> Result<usize, CmErr> {
    let mut g = rs.lock();
    if g.state & OPENING != 0 {
        if let Err(e) = do_connect(&mut g) {
            return Err(if e.errno == libc::EINPROGRESS {
                err(libc::EAGAIN, "connection in progress")
            } else {
                e
            });
        }
    }
    if g.cq().is_null() {
        return Err(err(libc::ENOTCONN, "not connected"));
    }
    let nonblock = g.fd_flags & libc::O_NONBLOCK != 0 || flags & libc::MSG_DONTWAIT != 0;
    let mut left = len;
    let mut out = buf;
    let mut last_err = None;
    loop {
        if !have_rdata(&g) {
            let (g2, r) = get_comp(rs, g, nonblock, conn_have_rdata);
            g = g2;
            if let Err(e) = r {
                last_err = Some(e);
                break;
            }
        }
        if flags & libc::MSG_PEEK != 0 {
            left -= peek(&g, out, left);
            break;
        }
        while left > 0 {
            let Some(&head) = g.rmsg.front() else { break };
            let rsize = if (left as u64) < u64::from(head) {
                if let Some(h) = g.rmsg.front_mut() {
                    *h -= left as u32;
                }
                left as u32
            } else {
                g.rseq_no = g.rseq_no.wrapping_add(1);
                g.rmsg.pop_front();
                head
            };
            copy_out(&mut g, out, rsize);
            // SAFETY: rsize <= left bytes remain in the caller's buffer.
            out = unsafe { out.add(rsize as usize) };
            left -= rsize as usize;
        }
        if !(left > 0 && flags & libc::MSG_WAITALL != 0 && g.state & READABLE != 0) {
            break;
        }
    }
    if left == len && len > 0 && last_err.is_none() && flags & libc::MSG_PEEK == 0 {
        // End of stream. rrecv returns 0, and errno says why: programs
        // such as rstream retry a 0 while errno still holds an EAGAIN of
        // an earlier call, and would spin for ever on a peer that is gone.
        crate::set_errno(if g.aborted {
            libc::ECONNRESET
        } else {
            libc::ENOTCONN
        });
    }
    drop(g);
    match last_err {
        Some(e) if left == len => Err(e),
        _ => Ok(len - left),
    }
}

/// Copy `n` bytes from the receive buffer at the read offset (wrapping
/// at its end) and free them.
fn copy_out(g: &mut Stream, out: *mut u8, n: u32) {
    let Some(rb) = g.rbuf.as_ref() else { return };
    let base = rb.ptr;
    let mut n = n;
    let mut out = out;
    let end = g.rbuf_size - g.rbuf_offset;
    // SAFETY: offsets stay inside the receive region; out has room for n.
    unsafe {
        if n > end {
            std::ptr::copy_nonoverlapping(base.add(g.rbuf_offset as usize), out, end as usize);
            out = out.add(end as usize);
            n -= end;
            g.rbuf_offset = 0;
            g.rbuf_bytes_avail += end;
        }
        std::ptr::copy_nonoverlapping(base.add(g.rbuf_offset as usize), out, n as usize);
    }
    g.rbuf_offset += n;
    g.rbuf_bytes_avail += n;
}

/// rsocket.c `rs_peek`: copy without consuming.
fn peek(g: &Stream, out: *mut u8, len: usize) -> usize {
    let Some(rb) = g.rbuf.as_ref() else { return 0 };
    let mut left = len;
    let mut off = g.rbuf_offset;
    let mut out = out;
    for &m in g.rmsg.iter() {
        if left == 0 {
            break;
        }
        let mut rsize = (m as usize).min(left) as u32;
        left -= rsize as usize;
        let end = g.rbuf_size - off;
        // SAFETY: as in copy_out.
        unsafe {
            if rsize > end {
                std::ptr::copy_nonoverlapping(rb.ptr.add(off as usize), out, end as usize);
                out = out.add(end as usize);
                rsize -= end;
                off = 0;
            }
            std::ptr::copy_nonoverlapping(rb.ptr.add(off as usize), out, rsize as usize);
            out = out.add(rsize as usize);
        }
        off += rsize;
    }
    len - left
}

/// rsocket.c `rs_get_comp`: a short non-blocking try, then (blocking
/// sockets) wait.
fn get_comp<'a>(
    rs: &'a RSocket,
    g: MutexGuard<'a, Stream>,
    nonblock: bool,
    test: Test,
) -> (MutexGuard<'a, Stream>, Result<(), CmErr>) {
    let (g, r) = process_cq(rs, g, true, test);
    match r {
        Err(e) if !nonblock && e.errno == libc::EWOULDBLOCK => process_cq(rs, g, false, test),
        r => (g, r),
    }
}

/// rsocket.c `rsendv` (and `rsend`, one buffer): copy into the send
/// buffer (or inline) and write it into the peer's receive buffer.
pub fn send(rs: &RSocket, iov: &[(*const u8, usize)], flags: c_int) -> Result<usize, CmErr> {
    let mut g = rs.lock();
    if g.state & OPENING != 0 {
        if let Err(e) = do_connect(&mut g) {
            return Err(if e.errno == libc::EINPROGRESS {
                err(libc::EAGAIN, "connection in progress")
            } else {
                e
            });
        }
    }
    if g.cq().is_null() {
        return Err(err(libc::ENOTCONN, "not connected"));
    }
    if g.state & WRITABLE == 0 {
        return Err(err(
            libc::ECONNRESET,
            "the connection is closed for writing",
        ));
    }
    let nonblock = g.fd_flags & libc::O_NONBLOCK != 0 || flags & libc::MSG_DONTWAIT != 0;
    let len: usize = iov.iter().map(|v| v.1).sum();
    let mut left = len;
    let mut olen = proto::RS_OLAP_START_SIZE;
    let mut cur = IovCursor { iov, i: 0, off: 0 };
    let mut last_err = None;
    while left > 0 {
        if !can_send(&g) {
            let (g2, r) = get_comp(rs, g, nonblock, conn_can_send);
            g = g2;
            if let Err(e) = r {
                last_err = Some(e);
                break;
            }
            if g.state & WRITABLE == 0 {
                last_err = Some(err(libc::ECONNRESET, "the peer closed the connection"));
                break;
            }
        }
        let mut xfer = if (olen as usize) < left {
            let x = olen;
            if olen < proto::RS_MAX_TRANSFER {
                olen <<= 1;
            }
            x
        } else {
            left as u32
        };
        xfer = xfer
            .min(g.sbuf_bytes_avail)
            .min(g.target_get(g.target_sge).length);
        let r = if xfer <= u32::from(g.sq_inline) {
            // Inline: the provider copies at post time.
            let mut tmp = vec![0u8; xfer as usize];
            cur.copy(tmp.as_mut_ptr(), xfer as usize);
            let mut sge = ibv_sge {
                addr: tmp.as_ptr() as u64,
                length: xfer,
                lkey: 0,
            };
            g.write_data(std::slice::from_mut(&mut sge), xfer, verbs::IBV_SEND_INLINE)
        } else {
            let Some((base, lkey)) = g.sbuf.as_ref().map(|s| (s.ptr, s.lkey())) else {
                break;
            };
            let head = g.sbuf_head;
            let room = g.sbuf_size - head;
            let mut sgl = [ibv_sge::default(); 2];
            let n = if xfer <= room {
                // SAFETY: head + xfer <= sbuf_size inside the region.
                cur.copy(unsafe { base.add(head as usize) }, xfer as usize);
                sgl[0] = ibv_sge {
                    addr: base as u64 + u64::from(head),
                    length: xfer,
                    lkey,
                };
                g.sbuf_head = if xfer < room { head + xfer } else { 0 };
                1
            } else {
                // SAFETY: room bytes to the end, then the rest from 0.
                unsafe {
                    cur.copy(base.add(head as usize), room as usize);
                    cur.copy(base, (xfer - room) as usize);
                }
                sgl[0] = ibv_sge {
                    addr: base as u64 + u64::from(head),
                    length: room,
                    lkey,
                };
                sgl[1] = ibv_sge {
                    addr: base as u64,
                    length: xfer - room,
                    lkey,
                };
                g.sbuf_head = xfer - room;
                2
            };
            g.write_data(&mut sgl[..n], xfer, 0)
        };
        if let Err(e) = r {
            last_err = Some(e);
            break;
        }
        left -= xfer as usize;
    }
    drop(g);
    match last_err {
        Some(e) if left == len => Err(e),
        _ => Ok(len - left),
    }
}

/// Reads a list of (pointer, length) buffers in order.
struct IovCursor<'a> {
    iov: &'a [(*const u8, usize)],
    i: usize,
    off: usize,
}

impl IovCursor<'_> {
    /// Copy the next `n` bytes to `dst`.
    fn copy(&mut self, dst: *mut u8, n: usize) {
        let mut n = n;
        let mut dst = dst;
        while n > 0 && self.i < self.iov.len() {
            let (p, l) = self.iov[self.i];
            let take = (l - self.off).min(n);
            // SAFETY: the caller's buffer has l bytes; dst has room for n.
            unsafe {
                std::ptr::copy_nonoverlapping(p.add(self.off), dst, take);
                dst = dst.add(take);
            }
            n -= take;
            self.off += take;
            if self.off == l {
                self.i += 1;
                self.off = 0;
            }
        }
    }
}

// ---------------------------------------------------------------- shutdown

/// rsocket.c `rshutdown`: tell the peer (CTRL DISCONNECT or SHUTDOWN),
/// wait for our sends to complete, and flush the QP once disconnected.
pub fn shutdown(rs: &RSocket, how: c_int) -> Result<(), CmErr> {
    let mut g = rs.lock();
    let mut result = Ok(());
    'out: {
        if g.state & CONNECTED != 0 {
            let ctrl = if how == libc::SHUT_RDWR {
                g.state &= !(READABLE | WRITABLE);
                proto::RS_CTRL_DISCONNECT
            } else if how == libc::SHUT_WR {
                g.state &= !WRITABLE;
                if g.state & READABLE != 0 {
                    proto::RS_CTRL_SHUTDOWN
                } else {
                    proto::RS_CTRL_DISCONNECT
                }
            } else {
                g.state &= !READABLE;
                if g.state & WRITABLE != 0 {
                    break 'out;
                }
                proto::RS_CTRL_DISCONNECT
            };
            if !g.ctrl_avail() {
                let (g2, r) = process_cq(rs, g, false, conn_can_send_ctrl);
                g = g2;
                if let Err(e) = r {
                    result = Err(e);
                    break 'out;
                }
            }
            if g.state & CONNECTED != 0 && g.ctrl_avail() {
                g.ctrl_seqno = g.ctrl_seqno.wrapping_add(1);
                if let Err(e) = g.post_msg(proto::msg(proto::RS_OP_CTRL, ctrl)) {
                    result = Err(e);
                }
            }
        }
        if g.state & CONNECTED != 0 {
            let (g2, _) = process_cq(rs, g, false, conn_all_sends_done);
            g = g2;
        }
    }
    if g.state & DISCONNECTED != 0 {
        // rsocket.c `ucma_shutdown`: the QP to ERR flushes our receives.
        if let Ok(c) = g.cm() {
            crate::qp::modify_err(c);
        }
    }
    result
}
