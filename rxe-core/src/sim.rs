//! A deterministic network simulator: several engines joined by simulated
//! links with seeded loss, duplication, reordering, delay and bit corruption.
//!
//! Everything is driven by one seed, so a failure found by a test can be
//! replayed exactly. Time is simulated: nothing sleeps.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::net::IpAddr;
use std::time::Duration;

use crate::engine::{Engine, EngineConfig, RxDatagram, Transmit};
use crate::mem::VecMemory;
use crate::time::Instant;

/// SplitMix64: small, fast, good enough for fault injection, and stable
/// across platforms and releases (unlike `rand`'s default generators).
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator for `seed`.
    pub fn new(seed: u64) -> Self {
        Rng(seed ^ 0x9E37_79B9_7F4A_7C15)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, n)` (`n > 0`).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }

    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        p > 0.0 && (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64 <= p
    }
}

/// Link behaviour. Probabilities are per datagram.
#[derive(Debug, Clone, Copy)]
pub struct LinkConfig {
    /// Probability a datagram is lost.
    pub loss: f64,
    /// Probability a datagram arrives twice.
    pub duplicate: f64,
    /// Probability that a datagram is held back by an extra delay, so later
    /// ones overtake it.
    pub reorder: f64,
    /// Probability that one random bit of the datagram is flipped.
    pub corrupt: f64,
    /// One-way delay.
    pub delay: Duration,
    /// Extra delay of a reordered datagram.
    pub reorder_delay: Duration,
    /// Deliver datagrams without their IPv4 ID, as a UDP socket does, so
    /// the receiver must solve for it to check the ICRC.
    pub hide_ipv4_id: bool,
    /// At most this many datagrams leave each node per step (0: all it
    /// has). A small burst models a driver that receives faster than it
    /// sends, so requests reach a responder while its READ reply is still
    /// being built.
    pub tx_burst: usize,
}

impl LinkConfig {
    /// A perfect link with 10 µs latency.
    pub fn perfect() -> Self {
        LinkConfig {
            loss: 0.0,
            duplicate: 0.0,
            reorder: 0.0,
            corrupt: 0.0,
            delay: Duration::from_micros(10),
            reorder_delay: Duration::from_micros(50),
            hide_ipv4_id: false,
            tx_burst: 0,
        }
    }
}

/// What the links did, for assertions and reports.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LinkStats {
    /// Datagrams the nodes sent.
    pub sent: u64,
    /// Datagrams delivered to a node.
    pub delivered: u64,
    /// Datagrams dropped by the link.
    pub lost: u64,
    /// Datagrams delivered twice.
    pub duplicated: u64,
    /// Datagrams held back so later ones overtook them.
    pub reordered: u64,
    /// Datagrams with a flipped bit that the ICRC covers.
    pub corrupted: u64,
    /// Datagrams with a flipped bit in BTH byte 4 (FECN, BECN, reserved),
    /// which the ICRC masks out by design (IBTA A17.4.5.1): they arrive as
    /// valid packets.
    pub corrupted_masked: u64,
    /// Datagrams to an address no node has.
    pub unroutable: u64,
}

#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
struct InFlight {
    at: Instant,
    seq: u64,
    dst: usize,
    payload: Vec<u8>,
    src: IpAddr,
    dst_ip: IpAddr,
    src_port: u16,
    dst_port: u16,
}

/// An observer of every datagram put on a link.
type Tap = Box<dyn FnMut(Instant, &Transmit)>;

/// A simulated network of engines.
pub struct Network {
    nodes: Vec<Engine<VecMemory>>,
    by_ip: HashMap<IpAddr, usize>,
    queue: BinaryHeap<Reverse<InFlight>>,
    now: Instant,
    seq: u64,
    rng: Rng,
    /// Link behaviour, changeable between steps.
    pub link: LinkConfig,
    stats: LinkStats,
    /// Optional observer of every datagram put on the wire (before faults).
    tap: Option<Tap>,
}

impl Network {
    /// An empty network.
    pub fn new(seed: u64, link: LinkConfig) -> Self {
        Network {
            nodes: Vec::new(),
            by_ip: HashMap::new(),
            queue: BinaryHeap::new(),
            now: Instant::ZERO,
            seq: 0,
            rng: Rng::new(seed),
            link,
            stats: LinkStats::default(),
            tap: None,
        }
    }

    /// Add an engine; returns its index.
    pub fn add_node(&mut self, cfg: EngineConfig) -> usize {
        let idx = self.nodes.len();
        for ip in &cfg.gids {
            self.by_ip.insert(*ip, idx);
        }
        self.nodes.push(Engine::new(cfg, VecMemory::new()));
        idx
    }

    /// A node's engine.
    pub fn node(&mut self, i: usize) -> &mut Engine<VecMemory> {
        &mut self.nodes[i]
    }

    /// All engines.
    pub fn nodes(&self) -> &[Engine<VecMemory>] {
        &self.nodes
    }

    /// Current simulated time.
    pub fn now(&self) -> Instant {
        self.now
    }

    /// Link statistics so far.
    pub fn stats(&self) -> &LinkStats {
        &self.stats
    }

    /// Observe every datagram sent (for pcap traces).
    pub fn set_tap(&mut self, tap: impl FnMut(Instant, &Transmit) + 'static) {
        self.tap = Some(Box::new(tap));
    }

    fn schedule(&mut self, t: Transmit) {
        self.stats.sent += 1;
        if let Some(tap) = self.tap.as_mut() {
            tap(self.now, &t);
        }
        if t.info.dst.is_multicast() {
            // IP multicast: a copy to every node with a member of the group,
            // the sender included (as a host's multicast loopback does).
            let gid = crate::engine::ip_to_gid(t.info.dst);
            let dsts: Vec<usize> = (0..self.nodes.len())
                .filter(|&i| self.nodes[i].mcast_groups().contains(&gid))
                .collect();
            if dsts.is_empty() {
                self.stats.unroutable += 1;
            }
            for dst in dsts {
                self.schedule_to(dst, &t);
            }
            return;
        }
        let Some(&dst) = self.by_ip.get(&t.info.dst) else {
            self.stats.unroutable += 1;
            return;
        };
        self.schedule_to(dst, &t);
    }

    /// Put `t` on the link to node `dst`, through the link's faults.
    fn schedule_to(&mut self, dst: usize, t: &Transmit) {
        if self.rng.chance(self.link.loss) {
            self.stats.lost += 1;
            return;
        }
        let copies = if self.rng.chance(self.link.duplicate) {
            self.stats.duplicated += 1;
            2
        } else {
            1
        };
        for _ in 0..copies {
            let mut payload = t.payload.clone();
            if self.rng.chance(self.link.corrupt) && !payload.is_empty() {
                let bit = self.rng.below(payload.len() as u64 * 8);
                payload[(bit / 8) as usize] ^= 1 << (bit % 8);
                if bit / 8 == 4 {
                    self.stats.corrupted_masked += 1;
                } else {
                    self.stats.corrupted += 1;
                }
            }
            let mut at = self.now + self.link.delay;
            if self.rng.chance(self.link.reorder) {
                self.stats.reordered += 1;
                let extra = self
                    .rng
                    .below(self.link.reorder_delay.as_nanos().max(1) as u64);
                at = at + Duration::from_nanos(extra);
            }
            self.seq += 1;
            self.queue.push(Reverse(InFlight {
                at,
                seq: self.seq,
                dst,
                payload,
                src: t.info.src,
                dst_ip: t.info.dst,
                src_port: t.info.src_port,
                dst_port: t.info.dst_port,
            }));
        }
    }

    /// Move every pending transmit onto the links.
    pub fn flush_transmits(&mut self) {
        let burst = match self.link.tx_burst {
            0 => usize::MAX,
            b => b,
        };
        for i in 0..self.nodes.len() {
            for _ in 0..burst {
                let Some(t) = self.nodes[i].poll_transmit() else {
                    break;
                };
                self.schedule(t);
            }
        }
    }

    /// Advance to the next event (a delivery or a timer) and process it.
    /// Returns false when nothing is left to happen. Each step also checks
    /// that every engine's timer index agrees with its QPs' deadlines.
    pub fn step(&mut self) -> bool {
        assert!(
            self.nodes.iter().all(|n| n.timer_index_consistent()),
            "an engine's timer index disagrees with its QPs' deadlines"
        );
        self.flush_transmits();
        let next_pkt = self.queue.peek().map(|Reverse(p)| p.at);
        let next_timer = self
            .nodes
            .iter()
            .enumerate()
            .filter_map(|(i, n)| n.poll_timeout().map(|t| (t, i)))
            .min();
        let deliver = match (next_pkt, next_timer) {
            // Nothing in flight, no timer: done unless a node still has
            // datagrams its burst left behind.
            (None, None) => return self.nodes.iter().any(|n| n.has_transmit()),
            (Some(p), Some((t, _))) => p <= t,
            (Some(_), None) => true,
            (None, Some(_)) => false,
        };
        if deliver {
            let Some(Reverse(f)) = self.queue.pop() else {
                return false;
            };
            self.now = self.now.max(f.at);
            self.stats.delivered += 1;
            let dg = RxDatagram {
                src: f.src,
                dst: f.dst_ip,
                src_port: f.src_port,
                dst_port: f.dst_port,
                ipv4_id: if self.link.hide_ipv4_id {
                    None
                } else {
                    Some(0)
                },
                payload: &f.payload,
            };
            let now = self.now;
            self.nodes[f.dst].handle_datagram(now, &dg);
        } else if let Some((t, i)) = next_timer {
            self.now = self.now.max(t);
            let now = self.now;
            self.nodes[i].handle_timeout(now);
        }
        true
    }

    /// Step until `done` returns true, nothing is left to do, or simulated
    /// time passes `limit`. Returns whether `done` became true.
    pub fn run_until(
        &mut self,
        limit: Instant,
        mut done: impl FnMut(&mut Network) -> bool,
    ) -> bool {
        loop {
            if done(self) {
                return true;
            }
            if self.now > limit || !self.step() {
                return done(self);
            }
        }
    }
}

/// One end of a connection in a testbed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpEnd {
    /// Index of the node in the network.
    pub node: usize,
    /// QP number.
    pub qpn: u32,
    /// Its protection domain.
    pub pd: crate::PdHandle,
    /// Its send CQ.
    pub send_cq: crate::CqHandle,
    /// Its receive CQ.
    pub recv_cq: crate::CqHandle,
}

/// Connection parameters for [`Network::connect`].
#[derive(Debug, Clone, Copy)]
pub struct ConnectOpts {
    /// Path MTU of both sides.
    pub mtu: crate::Mtu,
    /// Local ACK timeout exponent (4.096 µs × 2^timeout).
    pub timeout: u8,
    /// Transport retries (7: forever).
    pub retry_cnt: u8,
    /// RNR retries (7: forever).
    pub rnr_retry: u8,
    /// RNR timer code the responders advertise.
    pub min_rnr_timer: u8,
    /// Outstanding READ/atomic requests each way.
    pub max_rd_atomic: u8,
    /// Remote access flags of both QPs.
    pub access: crate::AccessFlags,
    /// First PSN of side A and side B (to test wrap-around).
    pub psn_a: u32,
    /// First PSN of side B.
    pub psn_b: u32,
}

impl Default for ConnectOpts {
    fn default() -> Self {
        ConnectOpts {
            mtu: crate::Mtu::M1024,
            timeout: 10,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 1,
            max_rd_atomic: 16,
            access: crate::AccessFlags::LOCAL_WRITE
                | crate::AccessFlags::REMOTE_WRITE
                | crate::AccessFlags::REMOTE_READ
                | crate::AccessFlags::REMOTE_ATOMIC,
            psn_a: 0x00ff_fff0,
            psn_b: 0x0012_3456,
        }
    }
}

/// An EngineConfig for a simulated node at `ip` with MTU 4096 available.
pub fn node_config(ip: IpAddr, seed: u64) -> EngineConfig {
    let mut c = EngineConfig::new(ip);
    c.port_mtu = crate::Mtu::M4096;
    c.key_seed = seed;
    c
}

impl Network {
    /// Create a PD, a CQ (used for both queues) and a QP on `node`.
    pub fn create_endpoint(
        &mut self,
        node: usize,
        qp_type: crate::QpType,
        pd: Option<crate::PdHandle>,
        srq: Option<crate::SrqHandle>,
        depth: u32,
    ) -> crate::Result<QpEnd> {
        let e = &mut self.nodes[node];
        let pd = match pd {
            Some(p) => p,
            None => e.alloc_pd()?,
        };
        let cq = e.create_cq(depth * 4)?;
        let qpn = e.create_qp(crate::QpInitAttr {
            pd,
            qp_type,
            send_cq: cq,
            recv_cq: cq,
            srq,
            cap: crate::QpCap {
                max_send_wr: depth,
                max_recv_wr: depth,
                max_send_sge: 4,
                max_recv_sge: 4,
                max_inline_data: 256,
            },
            sq_sig_all: false,
        })?;
        Ok(QpEnd {
            node,
            qpn,
            pd,
            send_cq: cq,
            recv_cq: cq,
        })
    }

    fn gid_of(&self, node: usize) -> [u8; 16] {
        crate::engine::ip_to_gid(self.nodes[node].config().gids[0])
    }

    /// Bring a UD QP to RTS with `qkey`.
    pub fn activate_ud(&mut self, e: &QpEnd, qkey: u32, psn: u32) -> crate::Result<()> {
        use crate::{QpAttr, QpAttrMask, QpState};
        let now = self.now;
        let eng = &mut self.nodes[e.node];
        let a = QpAttr {
            qp_state: Some(QpState::Init),
            pkey_index: 0,
            port_num: 1,
            qkey,
            ..QpAttr::default()
        };
        eng.modify_qp(
            now,
            e.qpn,
            &a,
            QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::QKEY,
        )?;
        let a = QpAttr {
            qp_state: Some(QpState::Rtr),
            ..QpAttr::default()
        };
        eng.modify_qp(now, e.qpn, &a, QpAttrMask::STATE)?;
        let a = QpAttr {
            qp_state: Some(QpState::Rts),
            sq_psn: psn,
            ..QpAttr::default()
        };
        eng.modify_qp(now, e.qpn, &a, QpAttrMask::STATE | QpAttrMask::SQ_PSN)
    }

    /// Connect two RC or UC QPs: RESET -> INIT -> RTR -> RTS on both sides.
    pub fn connect(&mut self, a: &QpEnd, b: &QpEnd, o: &ConnectOpts) -> crate::Result<()> {
        let (ga, gb) = (self.gid_of(a.node), self.gid_of(b.node));
        self.bring_up(a, b.qpn, gb, o.psn_a, o.psn_b, o)?;
        self.bring_up(b, a.qpn, ga, o.psn_b, o.psn_a, o)
    }

    fn bring_up(
        &mut self,
        me: &QpEnd,
        dest_qpn: u32,
        dgid: [u8; 16],
        sq_psn: u32,
        rq_psn: u32,
        o: &ConnectOpts,
    ) -> crate::Result<()> {
        use crate::qp_attr::transition_masks;
        use crate::{AhAttr, QpAttr, QpAttrMask as M, QpState};
        let now = self.now;
        let eng = &mut self.nodes[me.node];
        let qp_type = eng.query_qp(me.qpn)?.1.qp_type;
        // What each transition requires of this QP type (kernel
        // qp_state_table), so RC, UC and both XRC halves come up alike.
        let required =
            |from, to| transition_masks(qp_type, from, to).map_or(M::empty(), |t| t.required);
        let a = QpAttr {
            qp_state: Some(QpState::Init),
            pkey_index: 0,
            port_num: 1,
            qp_access_flags: o.access.bits(),
            ..QpAttr::default()
        };
        eng.modify_qp(
            now,
            me.qpn,
            &a,
            M::STATE | required(QpState::Reset, QpState::Init),
        )?;
        let a = QpAttr {
            qp_state: Some(QpState::Rtr),
            path_mtu: Some(o.mtu),
            dest_qp_num: dest_qpn,
            rq_psn,
            max_dest_rd_atomic: o.max_rd_atomic,
            min_rnr_timer: o.min_rnr_timer,
            ah_attr: AhAttr {
                dgid,
                sgid_index: 0,
                is_global: true,
                hop_limit: 64,
                port_num: 1,
                ..AhAttr::default()
            },
            ..QpAttr::default()
        };
        eng.modify_qp(
            now,
            me.qpn,
            &a,
            M::STATE | required(QpState::Init, QpState::Rtr),
        )?;
        let a = QpAttr {
            qp_state: Some(QpState::Rts),
            sq_psn,
            timeout: o.timeout,
            retry_cnt: o.retry_cnt,
            rnr_retry: o.rnr_retry,
            max_rd_atomic: o.max_rd_atomic,
            ..QpAttr::default()
        };
        eng.modify_qp(
            now,
            me.qpn,
            &a,
            M::STATE | required(QpState::Rtr, QpState::Rts),
        )
    }
}
