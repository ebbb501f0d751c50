//! Protocol counters, named as kernel rxe names them (`rxe_hw_counters.c`),
//! followed by rxe-emu's own counters for drops the kernel does not count.

/// Protocol counters: the device's, or one QP's (each QP keeps the share
/// of the device's counters that it caused).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Counters {
    /// Packets sent (requests, responses, ACKs).
    pub sent_pkts: u64,
    /// Packets received that passed the ICRC, parsed and reached a QP in a
    /// state to take them (kernel rxe_rcv: after hdr_check and the ICRC).
    pub rcvd_pkts: u64,
    /// Requests that arrived with an already-seen PSN (IBTA 9.7.5.1.1).
    pub duplicate_request: u64,
    /// Requests that arrived ahead of the expected PSN (a gap: packets lost).
    pub out_of_seq_request: u64,
    /// RNR NAKs received by our requesters.
    pub rcvd_rnr_err: u64,
    /// RNR NAKs sent by our responders (no receive WQE was posted).
    pub send_rnr_err: u64,
    /// PSN sequence error NAKs received.
    pub rcvd_seq_err: u64,
    /// ACKs the responder deferred (rxe-emu never defers; kept for parity).
    pub ack_deferred: u64,
    /// Send queues that ran out of `retry_cnt` (RETRY_EXC_ERR).
    pub retry_exceeded_err: u64,
    /// Send queues that ran out of `rnr_retry` (RNR_RETRY_EXC_ERR).
    pub retry_rnr_exceeded_err: u64,
    /// Times the completer restarted the send queue (go-back-N).
    pub completer_retry_err: u64,
    /// Packets that could not be built or sent.
    pub send_err: u64,
    /// Link down events (always 0: the UDP socket has no link state).
    pub link_downed: u64,
    /// SEND WQEs completed (success or error; not flushed) on the
    /// requester, as kernel rxe counts them.
    pub rdma_sends: u64,
    /// Receive WQEs completed.
    pub rdma_recvs: u64,
    // rxe-emu counters (no kernel equivalent):
    /// Packets dropped for a bad ICRC.
    pub rcvd_icrc_err: u64,
    /// Packets dropped because they did not parse (truncated, unknown opcode, bad pad...).
    pub rcvd_malformed: u64,
    /// Packets for a QP that does not exist, is of another type, or is not ready.
    pub rcvd_bad_qp: u64,
    /// Packets from an address that is not the QP's peer, or with a wrong P_Key.
    pub rcvd_bad_path: u64,
    /// UD packets dropped for a Q_Key mismatch.
    pub rcvd_qkey_err: u64,
    /// UC/UD messages dropped silently (no receive WQE, out of sequence, too long).
    pub rcvd_dropped_msgs: u64,
    /// Response packets the completer ignored (stale, duplicate or unexpected).
    pub rcvd_ignored_resp: u64,
    /// Completions lost because a CQ was full.
    pub cq_overflow: u64,
    /// Retransmission timer expiries.
    pub retrans_timeouts: u64,
    /// Requests dropped because too many waited behind a READ reply.
    pub resp_deferred_drops: u64,
    // Congestion control, named as mlx5 names them (`hw_counters`,
    // QUERY_CONG_STATISTICS); all 0 on a kernel-rxe-like device except
    // `rp_cnp_ignored`:
    /// CE-marked data packets received (ConnectX-like device; not
    /// acknowledgements or CNPs).
    pub np_ecn_marked_roce_packets: u64,
    /// CNPs sent (ConnectX-like device).
    pub np_cnp_sent: u64,
    /// CNPs that reached a QP and drove its DCQCN (ConnectX-like device).
    pub rp_cnp_handled: u64,
    /// CNPs received and dropped: every CNP on a kernel-rxe-like device
    /// (kernel rxe drops opcode 0x81 and counts nothing), and on a
    /// ConnectX-like one a CNP for no QP, a QP that does not send, or from
    /// an address that is not the QP's peer.
    pub rp_cnp_ignored: u64,
}

impl Counters {
    /// Name/value pairs in the kernel's order, then ours.
    pub fn iter(&self) -> impl Iterator<Item = (&'static str, u64)> {
        [
            ("sent_pkts", self.sent_pkts),
            ("rcvd_pkts", self.rcvd_pkts),
            ("duplicate_request", self.duplicate_request),
            ("out_of_seq_request", self.out_of_seq_request),
            ("rcvd_rnr_err", self.rcvd_rnr_err),
            ("send_rnr_err", self.send_rnr_err),
            ("rcvd_seq_err", self.rcvd_seq_err),
            ("ack_deferred", self.ack_deferred),
            ("retry_exceeded_err", self.retry_exceeded_err),
            ("retry_rnr_exceeded_err", self.retry_rnr_exceeded_err),
            ("completer_retry_err", self.completer_retry_err),
            ("send_err", self.send_err),
            ("link_downed", self.link_downed),
            ("rdma_sends", self.rdma_sends),
            ("rdma_recvs", self.rdma_recvs),
            ("rcvd_icrc_err", self.rcvd_icrc_err),
            ("rcvd_malformed", self.rcvd_malformed),
            ("rcvd_bad_qp", self.rcvd_bad_qp),
            ("rcvd_bad_path", self.rcvd_bad_path),
            ("rcvd_qkey_err", self.rcvd_qkey_err),
            ("rcvd_dropped_msgs", self.rcvd_dropped_msgs),
            ("rcvd_ignored_resp", self.rcvd_ignored_resp),
            ("cq_overflow", self.cq_overflow),
            ("retrans_timeouts", self.retrans_timeouts),
            ("resp_deferred_drops", self.resp_deferred_drops),
            (
                "np_ecn_marked_roce_packets",
                self.np_ecn_marked_roce_packets,
            ),
            ("np_cnp_sent", self.np_cnp_sent),
            ("rp_cnp_handled", self.rp_cnp_handled),
            ("rp_cnp_ignored", self.rp_cnp_ignored),
        ]
        .into_iter()
    }
}

/// Count a protocol event of QP `$qp` on the device and on the QP itself
/// (`rxe-emu stat` shows both).
macro_rules! count {
    ($ctx:expr, $qp:expr, $field:ident) => {{
        $ctx.counters.$field += 1;
        $qp.counters.$field += 1;
    }};
}
pub(crate) use count;
