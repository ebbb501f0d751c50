//! # rdma-cm-core: the InfiniBand Communication Manager, sans IO
//!
//! The connection state machine of Linux `drivers/infiniband/core/cm.c`
//! (IBTA Vol. 1, chapter 12), for the CM MADs that kernel rdma_cm
//! exchanges over QP1: REQ, MRA, REJ, REP, RTU, DREQ, DREP. It never
//! touches a socket, a thread or a clock, in the manner of quinn-proto:
//!
//! - input: [`Endpoint::handle_mad`] (a MAD received on QP1, with the
//!   sender's GID), [`Endpoint::handle_timeout`], and the consumer's calls
//!   ([`Endpoint::listen`], [`Endpoint::connect`], [`Endpoint::accept`],
//!   [`Endpoint::reject`], [`Endpoint::ready_to_use`],
//!   [`Endpoint::disconnect`], [`Endpoint::destroy`], ...);
//! - output: [`Endpoint::poll_transmit`] (256-byte MADs to send from QP1
//!   to QP1 of a GID, with the GSI Q_Key), [`Endpoint::poll_timeout`], and
//!   [`Endpoint::poll_event`] ([`Event`]).
//!
//! The states are the kernel's (`enum ib_cm_state`, [`State`]). The
//! active side goes IDLE → REQ_SENT → (MRA_REQ_RCVD) → REP_RCVD →
//! ESTABLISHED, the passive side LISTEN → REQ_RCVD → (MRA_REQ_SENT) →
//! REP_SENT → ESTABLISHED, and both DREQ_SENT / DREQ_RCVD → TIMEWAIT →
//! IDLE. REQ, REP and DREQ are retransmitted as the kernel's MAD layer
//! does for them (`msg->timeout_ms`, `msg->retries = max_cm_retries`,
//! the same timeout each time); when the retries run out the consumer is
//! told ([`Event::Unreachable`], [`Event::Disconnected`]), never left
//! waiting. Duplicates are answered as `cm_dup_req_handler`,
//! `cm_dup_rep_handler`, `cm_issue_rej` and `cm_issue_drep` answer them.
//!
//! What rdma_cm adds on top (the IP service ID and the `cma_hdr` in the
//! REQ's private data, answering a DREQ at once) is the caller's
//! business: [`wire::cma`] has the formats; this crate answers DREQ
//! immediately, as `cma_ib_handler` does.

#![forbid(unsafe_code)]
#![warn(missing_docs)]
#![cfg_attr(
    not(test),
    deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)
)]

mod endpoint;
pub mod timing;

pub use endpoint::{
    AcceptParams, CmError, Config, ConnId, ConnectParams, Endpoint, Event, Gid, SentMessage,
    SidrParams, SidrReplyParams, State, Transmit,
};
