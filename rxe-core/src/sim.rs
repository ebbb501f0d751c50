//! A deterministic network simulator: several engines joined by simulated
//! links with seeded loss, duplication, reordering, delay and bit corruption.
//!
//! Everything is driven by one seed, so a failure found by a test can be
//! replayed exactly. Time is simulated: nothing sleeps.
//!
//! For congestion control ([`crate::cc`]) a node's downlink can be a
//! [`Bottleneck`]: a switch egress queue served at a finite rate that
//! marks ECN-capable packets CE the way a switch with RED/ECN does (never
//! below Kmin bytes queued, with a probability rising linearly to Pmax at
//! Kmax, always above Kmax) and drops only when its buffer is full. Links
//! can also mark CE with a fixed probability ([`LinkConfig::ce_mark`]),
//! and each node can have an access link of its own delay
//! ([`Network::set_node_delay`]). Datagrams carry their ECN codepoint to
//! the receiving engine.

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
    /// Probability that an ECN-capable (ECT) datagram is marked CE on the
    /// way, whatever the queues hold.
    pub ce_mark: f64,
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
            ce_mark: 0.0,
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
    /// ECT datagrams marked CE (by a bottleneck's queue or `ce_mark`).
    pub ce_marked: u64,
    /// Datagrams a bottleneck dropped because its buffer was full.
    pub queue_dropped: u64,
}

/// A switch egress queue in front of one node (its downlink): FIFO,
/// served at `rate_mbps`, holding at most `buffer_bytes`. A datagram that
/// arrives with `q` bytes queued is marked CE, if it is ECN-capable, with
/// probability 0 for `q <= kmin_bytes`, `pmax · (q − kmin) / (kmax − kmin)`
/// up to `kmax_bytes`, and 1 above (RED with ECN as DCQCN's switches run
/// it: NVIDIA DOCA "DCQCN CC Algorithm"; the DCQCN author's simulator
/// marks every packet above Kmax). Not-ECT datagrams are never marked and
/// only dropped when the buffer is full (a lossless, PFC-like class would
/// pause instead; the simulator has no PFC). Sizes count the datagram on
/// the wire ([`crate::cc::WIRE_OVERHEAD`] + UDP payload).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Bottleneck {
    /// Service rate in Mb/s.
    pub rate_mbps: u64,
    /// Buffer in bytes.
    pub buffer_bytes: u64,
    /// RED Kmin in bytes.
    pub kmin_bytes: u64,
    /// RED Kmax in bytes.
    pub kmax_bytes: u64,
    /// RED marking probability at Kmax.
    pub pmax: f64,
}

impl Bottleneck {
    /// The marking probability with `queued` bytes in the queue.
    pub fn mark_probability(&self, queued: u64) -> f64 {
        if queued <= self.kmin_bytes {
            0.0
        } else if queued <= self.kmax_bytes {
            let span = self.kmax_bytes.saturating_sub(self.kmin_bytes).max(1) as f64;
            self.pmax * (queued - self.kmin_bytes) as f64 / span
        } else {
            1.0
        }
    }

    /// Why this is not a queue a real device should model, if it is not:
    /// a rate outside 1 Mb/s..=10 Tb/s, Kmin above Kmax, Pmax outside
    /// 0..=1, a buffer smaller than one 1500-byte packet, or one that
    /// would hold a datagram back longer than `max_hold` once full.
    pub fn check(&self, max_hold: Duration) -> Result<(), String> {
        if !(1..=10_000_000).contains(&self.rate_mbps) {
            return Err(format!(
                "queue rate {} Mb/s is outside 1..=10000000",
                self.rate_mbps
            ));
        }
        if self.kmin_bytes > self.kmax_bytes {
            return Err(format!(
                "queue Kmin {} bytes is above Kmax {} bytes",
                self.kmin_bytes, self.kmax_bytes
            ));
        }
        if !(0.0..=1.0).contains(&self.pmax) {
            return Err(format!(
                "queue Pmax {} is not a probability in 0..=1",
                self.pmax
            ));
        }
        if self.buffer_bytes < 1500 {
            return Err(format!(
                "queue buffer {} bytes cannot hold one packet (at least 1500)",
                self.buffer_bytes
            ));
        }
        let hold = Duration::from_nanos(self.tx_ns(self.buffer_bytes));
        if hold > max_hold {
            return Err(format!(
                "a full queue of {} bytes at {} Mb/s holds a datagram back {:.1} s (at most {:.1} s)",
                self.buffer_bytes,
                self.rate_mbps,
                hold.as_secs_f64(),
                max_hold.as_secs_f64()
            ));
        }
        Ok(())
    }

    /// Nanoseconds to serialise `bytes`.
    fn tx_ns(&self, bytes: u64) -> u64 {
        (u128::from(bytes) * 8_000 / u128::from(self.rate_mbps.max(1))) as u64
    }
}

/// What a [`BottleneckQueue`] did with a datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QueueVerdict {
    /// The buffer was full: the datagram is lost.
    Dropped,
    /// Queued: its last byte leaves the queue at `leaves`; `ce` says
    /// whether RED marked it (only an ECN-capable datagram is marked).
    Queued {
        /// When the queue has served it.
        leaves: Instant,
        /// Marked Congestion Experienced.
        ce: bool,
    },
}

/// A [`Bottleneck`] and what it holds: a FIFO served at `rate_mbps`.
/// Shared by the simulator and by the fault injection of real devices
/// (`verbs-api`'s `--queue`), so the RED arithmetic exists once.
#[derive(Debug, Clone)]
pub struct BottleneckQueue {
    cfg: Bottleneck,
    /// When the last queued byte will have left.
    busy_until: Instant,
}

impl BottleneckQueue {
    /// An empty queue.
    pub fn new(cfg: Bottleneck) -> Self {
        BottleneckQueue {
            cfg,
            busy_until: Instant::ZERO,
        }
    }

    /// Its configuration.
    pub fn config(&self) -> &Bottleneck {
        &self.cfg
    }

    /// Bytes still queued at `now`.
    pub fn backlog(&self, now: Instant) -> u64 {
        let ns = self.busy_until.0.saturating_sub(now.0);
        (u128::from(ns) * u128::from(self.cfg.rate_mbps) / 8_000) as u64
    }

    /// A datagram of `wire_bytes` (as [`crate::cc::WIRE_OVERHEAD`] counts
    /// them) arrives at `now`: drop it if the buffer cannot hold it,
    /// otherwise queue it behind what is there and, if it is ECN-capable
    /// (`ect`), mark it CE with RED's probability for the queue it found
    /// (drawn from `rng` only then).
    pub fn offer(
        &mut self,
        now: Instant,
        wire_bytes: u64,
        ect: bool,
        rng: &mut Rng,
    ) -> QueueVerdict {
        let queued = self.backlog(now);
        if queued + wire_bytes > self.cfg.buffer_bytes {
            return QueueVerdict::Dropped;
        }
        let p = self.cfg.mark_probability(queued);
        let start = self.busy_until.max(now);
        self.busy_until = Instant(start.0 + self.cfg.tx_ns(wire_bytes));
        QueueVerdict::Queued {
            leaves: self.busy_until,
            ce: ect && rng.chance(p),
        }
    }
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
    /// The ECN bits of the IP header.
    ecn: u8,
    /// Arriving at the bottleneck in front of `dst` (then delivered after
    /// `rest` more delay), not at `dst` itself.
    at_queue: Option<Duration>,
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
    /// Bottleneck queues, by the node they feed.
    queues: HashMap<usize, BottleneckQueue>,
    /// Extra one-way delay of each node's access link.
    node_delay: HashMap<usize, Duration>,
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
            queues: HashMap::new(),
            node_delay: HashMap::new(),
        }
    }

    /// Put a bottleneck queue in front of node `node`: every datagram to
    /// it waits there (see [`Bottleneck`]). The link's delay is split
    /// around the queue, half before and half after.
    pub fn set_bottleneck(&mut self, node: usize, b: Bottleneck) {
        self.queues.insert(node, BottleneckQueue::new(b));
    }

    /// Bytes queued now at the bottleneck in front of `node` (0 without one).
    pub fn queued_bytes(&self, node: usize) -> u64 {
        self.queues.get(&node).map_or(0, |q| q.backlog(self.now))
    }

    /// Give node `node` an access link with `delay` more one-way delay:
    /// added to every datagram it sends or receives.
    pub fn set_node_delay(&mut self, node: usize, delay: Duration) {
        self.node_delay.insert(node, delay);
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

    /// Everything node `from` has to send now, taken out of its engine
    /// and not delivered: a test then delivers it ([`Network::deliver_now`])
    /// in the order and at the moment it wants.
    pub fn take_transmits(&mut self, from: usize) -> Vec<Transmit> {
        std::iter::from_fn(|| self.nodes[from].poll_transmit()).collect()
    }

    /// Hand `ts` to node `to` at the current time, in order, none lost,
    /// with the IPv4 ID and ECN the link would give them (0, Not-ECT).
    pub fn deliver_now(&mut self, to: usize, ts: &[Transmit]) {
        for t in ts {
            let dg = RxDatagram {
                src: t.info.src,
                dst: t.info.dst,
                src_port: t.info.src_port,
                dst_port: t.info.dst_port,
                ipv4_id: Some(0),
                payload: &t.payload,
                ecn: wire::Ecn::NotEct,
            };
            let now = self.now;
            self.nodes[to].handle_datagram(now, &dg);
        }
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
        let src_node = self.by_ip.get(&t.info.src).copied();
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
                self.schedule_to(src_node, dst, &t);
            }
            return;
        }
        let Some(&dst) = self.by_ip.get(&t.info.dst) else {
            self.stats.unroutable += 1;
            return;
        };
        self.schedule_to(src_node, dst, &t);
    }

    /// Put `t` on the link to node `dst`, through the link's faults.
    fn schedule_to(&mut self, src: Option<usize>, dst: usize, t: &Transmit) {
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
            let extra = |n: Option<usize>| {
                n.and_then(|n| self.node_delay.get(&n).copied())
                    .unwrap_or_default()
            };
            let (before, after) = (extra(src), extra(Some(dst)));
            let mut ecn = t.ecn;
            if ecn.is_ect() && self.rng.chance(self.link.ce_mark) {
                self.stats.ce_marked += 1;
                ecn = crate::Ecn::Ce;
            }
            let (mut at, at_queue) = if self.queues.contains_key(&dst) {
                let half = self.link.delay / 2;
                (
                    self.now + before + half,
                    Some(self.link.delay - half + after),
                )
            } else {
                (self.now + self.link.delay + before + after, None)
            };
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
                ecn: ecn.bits(),
                at_queue,
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
            let Some(Reverse(mut f)) = self.queue.pop() else {
                return false;
            };
            self.now = self.now.max(f.at);
            if let Some(rest) = f.at_queue.take() {
                self.enqueue(f, rest);
                return true;
            }
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
                ecn: crate::Ecn::from_bits(f.ecn),
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

    /// `f` reached the bottleneck in front of its destination: drop it if
    /// the buffer is full, mark it by RED, and send it on when the queue
    /// has served everything before it.
    fn enqueue(&mut self, mut f: InFlight, rest: Duration) {
        let now = self.now;
        let Some(q) = self.queues.get_mut(&f.dst) else {
            return;
        };
        let bytes = (f.payload.len() + crate::cc::WIRE_OVERHEAD) as u64;
        let ect = crate::Ecn::from_bits(f.ecn).is_ect();
        let QueueVerdict::Queued { leaves: done, ce } = q.offer(now, bytes, ect, &mut self.rng)
        else {
            self.stats.queue_dropped += 1;
            return;
        };
        if ce {
            self.stats.ce_marked += 1;
            f.ecn = crate::Ecn::Ce.bits();
        }
        f.at = done + rest;
        self.seq += 1;
        f.seq = self.seq;
        self.queue.push(Reverse(f));
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

/// Options of a [`Dumbbell`]: `flows` senders, each with one RC QP writing
/// to its own QP on one receiver, through a [`Bottleneck`] in front of the
/// receiver.
#[derive(Debug, Clone)]
pub struct DumbbellOpts {
    /// Congestion control of every node.
    pub cc: crate::cc::CcConfig,
    /// The receiver's downlink.
    pub bottleneck: Bottleneck,
    /// Base link (delay, fixed CE marking...).
    pub link: LinkConfig,
    /// Per sender: extra one-way delay of its access link.
    pub sender_delay: Vec<Duration>,
    /// Per sender: when it starts writing, and when it stops (`None`: never).
    pub active: Vec<(Duration, Option<Duration>)>,
    /// Path MTU.
    pub mtu: crate::Mtu,
    /// Bytes per RDMA WRITE.
    pub msg_len: u32,
    /// WRITEs each sender keeps posted.
    pub depth: u32,
    /// The simulation's seed.
    pub seed: u64,
}

/// One flow of a [`Dumbbell`].
#[derive(Debug, Clone)]
pub struct Flow {
    /// The writing QP (the reaction point).
    pub sender: QpEnd,
    /// The QP written to (the notification point).
    pub receiver: QpEnd,
    lkey: u32,
    src: u64,
    rkey: u32,
    dst: u64,
    outstanding: u32,
    next_wr: u64,
}

/// What the wire showed of one flow, from a tap on every transmit.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FlowTrace {
    /// UDP payload bytes of the sender's data packets so far.
    pub data_bytes: u64,
    /// Data packets sent, and how many were ECN-capable.
    pub data_packets: u64,
    /// Of them, ECT(0).
    pub ect0_packets: u64,
    /// When each CNP for the sender's QP was sent.
    pub cnps: Vec<Instant>,
}

/// A sample of a [`Dumbbell`] run.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// When.
    pub t: Instant,
    /// Per flow: DCQCN's current rate (the line rate before any CNP, or on
    /// a kernel-rxe-like device), bits/s.
    pub rate_bps: Vec<u64>,
    /// Per flow: data bytes put on the wire since the previous sample, as
    /// bits/s.
    pub throughput_bps: Vec<f64>,
    /// Bytes queued at the bottleneck.
    pub queued_bytes: u64,
}

/// A dumbbell testbed for congestion control: senders `10.9.0.1`, `.2`, …
/// each write to their own QP on receiver `10.9.0.100` through a
/// bottleneck in front of it. Deterministic from the seed.
pub struct Dumbbell {
    /// The network (for counters, statistics and more work).
    pub net: Network,
    /// The flows, in sender order.
    pub flows: Vec<Flow>,
    opts: DumbbellOpts,
    trace: std::rc::Rc<std::cell::RefCell<Vec<FlowTrace>>>,
    receiver: usize,
}

impl Dumbbell {
    /// Build the network, connect the flows; nothing is sent yet.
    pub fn new(opts: DumbbellOpts) -> crate::Result<Dumbbell> {
        let n_flows = opts.active.len();
        let mut net = Network::new(opts.seed, opts.link);
        let mut senders = Vec::new();
        for i in 0..n_flows {
            let ip = IpAddr::from([10, 9, 0, 1 + i as u8]);
            let mut cfg = node_config(ip, opts.seed + i as u64);
            cfg.cc = opts.cc.clone();
            senders.push(net.add_node(cfg));
            if let Some(d) = opts.sender_delay.get(i) {
                net.set_node_delay(senders[i], *d);
            }
        }
        let mut rcfg = node_config(IpAddr::from([10, 9, 0, 100]), opts.seed + 100);
        rcfg.cc = opts.cc.clone();
        let receiver = net.add_node(rcfg);
        net.set_bottleneck(receiver, opts.bottleneck);
        let co = ConnectOpts {
            mtu: opts.mtu,
            timeout: 14,
            psn_a: 0,
            psn_b: 0,
            ..ConnectOpts::default()
        };
        let all = crate::AccessFlags::LOCAL_WRITE | crate::AccessFlags::REMOTE_WRITE;
        let mut flows = Vec::new();
        for &s in &senders {
            let a = net.create_endpoint(s, crate::QpType::Rc, None, None, opts.depth + 1)?;
            let b = net.create_endpoint(receiver, crate::QpType::Rc, None, None, 4)?;
            net.connect(&a, &b, &co)?;
            let len = opts.msg_len as usize;
            let src = net.node(s).mem_mut().alloc(len);
            let lkey = net.node(s).reg_mr(a.pd, src, len as u64, all)?.lkey;
            let dst = net.node(receiver).mem_mut().alloc(len);
            let rkey = net.node(receiver).reg_mr(b.pd, dst, len as u64, all)?.rkey;
            flows.push(Flow {
                sender: a,
                receiver: b,
                lkey,
                src,
                rkey,
                dst,
                outstanding: 0,
                next_wr: 0,
            });
        }
        let trace = std::rc::Rc::new(std::cell::RefCell::new(vec![FlowTrace::default(); n_flows]));
        let tap = trace.clone();
        let ids: Vec<(IpAddr, u32, u32)> = flows
            .iter()
            .map(|f| {
                (
                    IpAddr::from([10, 9, 0, 1 + f.sender.node as u8]),
                    f.receiver.qpn,
                    f.sender.qpn,
                )
            })
            .collect();
        net.set_tap(move |now, t| {
            let Some(&op) = t.payload.first() else {
                return;
            };
            let qpn = wire::bth::Packet::new_checked(&t.payload[..])
                .map(|b| b.dest_qpn())
                .unwrap_or(0);
            let mut tr = tap.borrow_mut();
            for (i, (ip, rqpn, sqpn)) in ids.iter().enumerate() {
                if op == wire::Opcode::CNP.0 && qpn == *sqpn && t.info.dst == *ip {
                    tr[i].cnps.push(now);
                } else if t.info.src == *ip && qpn == *rqpn {
                    if let Ok(p) = wire::PacketRepr::parse(&t.payload) {
                        if !p.payload.is_empty() {
                            tr[i].data_bytes += p.payload.len() as u64;
                            tr[i].data_packets += 1;
                            if t.ecn == crate::Ecn::Ect0 {
                                tr[i].ect0_packets += 1;
                            }
                        }
                    }
                }
            }
        });
        Ok(Dumbbell {
            net,
            flows,
            opts,
            trace,
            receiver,
        })
    }

    /// The receiver's node index.
    pub fn receiver(&self) -> usize {
        self.receiver
    }

    /// What the wire showed of each flow so far.
    pub fn trace(&self) -> Vec<FlowTrace> {
        self.trace.borrow().clone()
    }

    /// Keep each active flow's send queue full: reap completions, post
    /// WRITEs up to `depth`.
    fn feed(&mut self) -> crate::Result<()> {
        let now = self.net.now();
        for (i, f) in self.flows.iter_mut().enumerate() {
            let e = self.net.node(f.sender.node);
            for wc in e.poll_cq(f.sender.send_cq, 64)? {
                if wc.status != crate::WcStatus::Success {
                    return Err(crate::Error::Invalid(format!(
                        "flow {i}: WRITE failed with {}",
                        wc.status
                    )));
                }
                f.outstanding -= 1;
            }
            let (start, stop) = self.opts.active[i];
            let on = now >= Instant::ZERO + start && stop.is_none_or(|s| now < Instant::ZERO + s);
            while on && f.outstanding < self.opts.depth {
                let wr = crate::SendWr::new(
                    f.next_wr,
                    crate::SendOp::RdmaWrite {
                        remote_addr: f.dst,
                        rkey: f.rkey,
                    },
                    vec![crate::Sge {
                        addr: f.src,
                        length: self.opts.msg_len,
                        lkey: f.lkey,
                    }],
                );
                e.post_send(now, f.sender.qpn, wr)?;
                f.next_wr += 1;
                f.outstanding += 1;
            }
        }
        Ok(())
    }

    /// Run until `until`, feeding the flows and sampling every `every`.
    pub fn run(&mut self, until: Instant, every: Duration) -> crate::Result<Vec<Sample>> {
        let mut samples = Vec::new();
        let mut last = self.trace();
        let mut t = self.net.now();
        while t < until {
            let next = (t + every).min(until);
            // Feed at least every 10 µs of simulated time, so completions
            // are reaped and reposted promptly.
            while self.net.now() < next {
                self.feed()?;
                let stop = (self.net.now() + Duration::from_micros(10)).min(next);
                self.net.run_until(stop, |n| n.now() >= stop);
                if self.net.now() < stop {
                    // Nothing left to happen before `stop` (idle flows).
                    self.net.now = stop;
                }
            }
            let now_tr = self.trace();
            let secs = (next.0 - t.0) as f64 / 1e9;
            samples.push(Sample {
                t: next,
                rate_bps: self
                    .flows
                    .iter()
                    .map(|f| {
                        let e = &self.net.nodes()[f.sender.node];
                        e.qp_cc(f.sender.qpn).map_or(0, |s| s.current_rate_bps)
                    })
                    .collect(),
                throughput_bps: now_tr
                    .iter()
                    .zip(&last)
                    .map(|(a, b)| (a.data_bytes - b.data_bytes) as f64 * 8.0 / secs)
                    .collect(),
                queued_bytes: self.net.queued_bytes(self.receiver),
            });
            last = now_tr;
            t = next;
        }
        Ok(samples)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn red() -> Bottleneck {
        // 8 Mb/s: one byte per microsecond.
        Bottleneck {
            rate_mbps: 8,
            buffer_bytes: 10_000,
            kmin_bytes: 1_000,
            kmax_bytes: 3_000,
            pmax: 0.5,
        }
    }

    #[test]
    fn a_bottleneck_queue_delays_by_what_is_ahead_marks_by_red_and_drops_when_full() {
        let mut q = BottleneckQueue::new(red());
        let mut rng = Rng::new(1);
        let t0 = Instant::from_nanos(1_000_000);
        let us = |n: u64| Instant::from_nanos(t0.as_nanos() + n * 1_000);
        // Empty: served at once, leaves after its own 500 bytes (500 µs).
        assert_eq!(
            q.offer(t0, 500, true, &mut rng),
            QueueVerdict::Queued {
                leaves: us(500),
                ce: false
            }
        );
        assert_eq!(q.backlog(t0), 500);
        assert_eq!(q.backlog(us(200)), 300);
        // Below Kmin nothing is marked; above Kmax every ECT datagram is,
        // and a Not-ECT one never.
        for _ in 0..5 {
            q.offer(t0, 1_000, false, &mut rng);
        }
        assert_eq!(q.backlog(t0), 5_500);
        let QueueVerdict::Queued { leaves, ce } = q.offer(t0, 100, true, &mut rng) else {
            panic!("room left");
        };
        assert!(ce);
        assert_eq!(leaves, us(5_600));
        let QueueVerdict::Queued { ce, .. } = q.offer(t0, 100, false, &mut rng) else {
            panic!("room left");
        };
        assert!(!ce);
        // 5 700 bytes queued: the buffer (10 000) takes 4 300 more, not 4 301.
        assert_eq!(q.offer(t0, 4_301, true, &mut rng), QueueVerdict::Dropped);
        assert!(matches!(
            q.offer(t0, 4_300, true, &mut rng),
            QueueVerdict::Queued { .. }
        ));
        // Between Kmin and Kmax: probability pmax * (q - kmin) / span.
        assert_eq!(red().mark_probability(2_000), 0.25);
        assert_eq!(red().mark_probability(1_000), 0.0);
        assert_eq!(red().mark_probability(3_001), 1.0);
        // Sanity of a configuration: a full buffer drains in 10 ms here.
        let ms = Duration::from_millis(1);
        assert_eq!(red().check(10 * ms), Ok(()));
        assert!(red()
            .check(ms)
            .unwrap_err()
            .contains("holds a datagram back"));
        for bad in [
            Bottleneck {
                rate_mbps: 0,
                ..red()
            },
            Bottleneck {
                kmin_bytes: 4_000,
                ..red()
            },
            Bottleneck { pmax: 1.5, ..red() },
            Bottleneck {
                buffer_bytes: 100,
                ..red()
            },
        ] {
            assert!(bad.check(Duration::from_secs(10)).is_err(), "{bad:?}");
        }
        // Once drained, it serves at once again.
        let later = us(20_000);
        assert_eq!(q.backlog(later), 0);
        assert_eq!(
            q.offer(later, 8, true, &mut rng),
            QueueVerdict::Queued {
                leaves: Instant::from_nanos(later.as_nanos() + 8_000),
                ce: false
            }
        );
    }
}
