//! Shared receive queues.

use std::collections::VecDeque;

use crate::qp::RecvWqe;
use crate::{CqHandle, PdHandle, XrcdHandle};

#[derive(Debug)]
pub(crate) struct Srq {
    pub pd: PdHandle,
    /// An XRC SRQ (`IBV_SRQT_XRC`): its XRC domain and the CQ its
    /// receives complete on (XRC target QPs have none of their own).
    pub xrc: Option<(XrcdHandle, CqHandle)>,
    pub queue: VecDeque<RecvWqe>,
    pub max_wr: u32,
    pub max_sge: u32,
    /// SRQ_LIMIT_REACHED fires once when the queue drops below this (0 = disarmed).
    pub limit: u32,
    pub users: u32,
}

impl Srq {
    /// Take the next WQE; returns it and whether the limit event fires.
    pub fn take(&mut self) -> Option<(RecvWqe, bool)> {
        let wqe = self.queue.pop_front()?;
        let fire = self.limit > 0 && (self.queue.len() as u32) < self.limit;
        if fire {
            // IBTA 10.2.9.2: the limit is disarmed once the event fires.
            self.limit = 0;
        }
        Some((wqe, fire))
    }
}
