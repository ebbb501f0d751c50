//! Completion queues.

use std::collections::VecDeque;

use crate::wr::{WcStatus, WorkCompletion};

/// How a CQ is armed for one notification (`ibv_req_notify_cq`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Arm {
    None,
    /// Notify on the next completion.
    Next,
    /// Notify on the next solicited or error completion.
    Solicited,
}

#[derive(Debug)]
pub(crate) struct Cq {
    pub entries: VecDeque<WorkCompletion>,
    /// Capacity (`cqe` as created).
    pub cqe: u32,
    pub arm: Arm,
    /// Set when a completion was lost because the CQ was full (IBTA 11.4.2.1:
    /// CQ overrun is an error; the CQ is unusable afterwards).
    pub overrun: bool,
    /// QPs using this CQ, to refuse destroying it while in use.
    pub users: u32,
}

/// Result of posting a completion.
pub(crate) enum CqPost {
    Posted { notify: bool },
    Overrun { first: bool },
}

impl Cq {
    pub fn new(cqe: u32) -> Self {
        Cq {
            entries: VecDeque::new(),
            cqe,
            arm: Arm::None,
            overrun: false,
            users: 0,
        }
    }

    /// Post a completion; `solicited` is true for a receive completion of a
    /// message with the SE bit.
    pub fn post(&mut self, wc: WorkCompletion, solicited: bool) -> CqPost {
        if self.overrun || self.entries.len() >= self.cqe as usize {
            let first = !self.overrun;
            self.overrun = true;
            return CqPost::Overrun { first };
        }
        self.entries.push_back(wc);
        let notify = match self.arm {
            Arm::None => false,
            Arm::Next => true,
            Arm::Solicited => solicited || wc.status != WcStatus::Success,
        };
        if notify {
            self.arm = Arm::None;
        }
        CqPost::Posted { notify }
    }
}
