//! The in-process device: one engine, a UDP socket on `<addr>:4791`, and a
//! progress thread that feeds it packets and timers.

use rustc_hash::FxHashMap;
use std::io::{self, Read};
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixDatagram;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use rxe_core::sim::Rng;
use rxe_core::{Engine, EngineConfig, Instant, Mtu, RxDatagram, Transmit};
use socket2::{Domain, Protocol, Socket, Type};

use crate::hostmem::HostMemory;
use crate::{Error, Result};

/// Seeded fault injection on the device's transmit path, for tests that
/// must survive a bad network. `Default` injects nothing.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct FaultConfig {
    /// Seed of the fault generator: the same seed gives the same faults
    /// for the same sequence of datagrams.
    pub seed: u64,
    /// Probability a datagram is dropped.
    pub loss: f64,
    /// Probability a datagram is sent twice.
    pub duplicate: f64,
    /// Probability a datagram is held back and sent after the next one.
    pub reorder: f64,
    /// Probability one random bit of a datagram is flipped after its ICRC
    /// was computed (the receiver counts an ICRC error and drops it).
    pub corrupt: f64,
    /// Every datagram that survives the faults above leaves this much
    /// later than the engine produced it, in order (a longer link). A delay
    /// longer than the QP's ACK timeout makes the requester retransmit.
    pub delay: Duration,
    /// Probability an ECN-capable datagram (ECT(0) or ECT(1), as a
    /// ConnectX-like device sends) is marked CE, as a congested switch
    /// marks it. Not-ECT datagrams (a kernel-rxe-like device's) are left
    /// alone, as a switch leaves them.
    pub ce: f64,
    /// A bottleneck link in front of the network: a queue served at the
    /// bottleneck's rate that holds what this process sends faster, delays
    /// each datagram by the queue ahead of it, marks ECN-capable ones CE
    /// by queue depth (RED between Kmin and Kmax) and drops what does not
    /// fit its buffer; the arithmetic is the simulator's
    /// ([`rxe_core::sim::BottleneckQueue`]). Each process has its own
    /// queue, shared by all of its QPs. `delay` is added after it.
    pub queue: Option<rxe_core::sim::Bottleneck>,
}

/// The longest delay `FaultConfig::delay` accepts: far beyond any RoCE
/// path, short enough that queued datagrams cannot pile up for minutes.
pub const MAX_FAULT_DELAY: Duration = Duration::from_secs(10);

impl FaultConfig {
    /// `drop=P dup=P reorder=P corrupt=P ce=P delay_ns=N
    /// queue=RATE_MBPS:KMIN:KMAX:PMAX:BUFFER seed=N` (probabilities 0..=1,
    /// sizes in bytes; any subset): the form `rxe-emu fault` sends to each
    /// process.
    pub fn parse(spec: &str) -> std::result::Result<FaultConfig, String> {
        let mut f = FaultConfig::default();
        for kv in spec.split_whitespace() {
            let (k, v) = kv
                .split_once('=')
                .ok_or_else(|| format!("fault: {kv:?} is not key=value"))?;
            if k == "queue" {
                f.queue = parse_queue(v)?;
                continue;
            }
            if k == "seed" {
                f.seed = v.parse().map_err(|_| format!("fault: bad seed {v:?}"))?;
                continue;
            }
            if k == "delay_ns" {
                f.delay = v
                    .parse()
                    .ok()
                    .map(Duration::from_nanos)
                    .filter(|d| *d <= MAX_FAULT_DELAY)
                    .ok_or_else(|| {
                        format!("fault: delay_ns={v} is not a number of nanoseconds up to 10 s")
                    })?;
                continue;
            }
            let p: f64 = v
                .parse()
                .ok()
                .filter(|p: &f64| (0.0..=1.0).contains(p))
                .ok_or_else(|| format!("fault: {k}={v} is not a probability in 0..=1"))?;
            match k {
                "drop" => f.loss = p,
                "dup" => f.duplicate = p,
                "reorder" => f.reorder = p,
                "corrupt" => f.corrupt = p,
                "ce" => f.ce = p,
                _ => {
                    return Err(format!(
                        "fault: unknown key {k:?} (drop, dup, reorder, corrupt, ce, delay_ns, queue, seed)"
                    ))
                }
            }
        }
        Ok(f)
    }

    /// Whether it injects nothing.
    pub fn is_off(&self) -> bool {
        self.loss == 0.0
            && self.duplicate == 0.0
            && self.reorder == 0.0
            && self.corrupt == 0.0
            && self.ce == 0.0
            && self.delay.is_zero()
            && self.queue.is_none()
    }
}

/// `queue=RATE_MBPS:KMIN:KMAX:PMAX:BUFFER` (or `off`). A buffer that
/// would take longer than [`MAX_FAULT_DELAY`] to drain is refused.
fn parse_queue(v: &str) -> std::result::Result<Option<rxe_core::sim::Bottleneck>, String> {
    if v == "off" {
        return Ok(None);
    }
    let bad = || {
        format!(
            "fault: queue={v} is not RATE_MBPS:KMIN:KMAX:PMAX:BUFFER (Mb/s, bytes, bytes, probability, bytes)"
        )
    };
    let f: Vec<&str> = v.split(':').collect();
    let [rate, kmin, kmax, pmax, buffer] = f[..] else {
        return Err(bad());
    };
    let int = |x: &str| x.parse::<u64>().map_err(|_| bad());
    let b = rxe_core::sim::Bottleneck {
        rate_mbps: int(rate)?,
        kmin_bytes: int(kmin)?,
        kmax_bytes: int(kmax)?,
        pmax: pmax.parse().map_err(|_| bad())?,
        buffer_bytes: int(buffer)?,
    };
    b.check(MAX_FAULT_DELAY)
        .map_err(|e| format!("fault: {e}"))?;
    Ok(Some(b))
}

/// How to open a device.
#[derive(Debug, Clone)]
pub struct DeviceConfig {
    /// The local address the device owns (UDP port 4791 on it).
    pub addr: IpAddr,
    /// Device name, as `ibv_get_device_name` reports it.
    pub name: String,
    /// MTU of the network device; the path MTU follows kernel rxe's rule
    /// (the largest IB MTU <= netdev MTU - 80, at most 4096).
    pub netdev_mtu: u32,
    /// Fault injection (None: a faithful device).
    pub fault: Option<FaultConfig>,
    /// Congestion behaviour: kernel rxe's (the default: Not-ECT, no CNPs)
    /// or ConnectX's (`CcModel::Mlx5Like`: ECT(0) on the wire, the ECN
    /// codepoint read from each received datagram, CNPs and DCQCN), with
    /// its parameters.
    pub cc: rxe_core::CcConfig,
    /// The kernel rxe release it behaves as where releases differ
    /// (`rxe_core::RxeRelease`; default the newest).
    pub release: rxe_core::RxeRelease,
}

impl DeviceConfig {
    /// A device on `addr` named `rxe0`; loopback addresses get the loopback
    /// MTU (65536, so path MTU 4096), others 1500 (path MTU 1024).
    pub fn new(addr: IpAddr) -> Self {
        DeviceConfig {
            addr,
            name: "rxe0".into(),
            netdev_mtu: if addr.is_loopback() { 65536 } else { 1500 },
            fault: None,
            cc: rxe_core::CcConfig::default(),
            release: rxe_core::RxeRelease::default(),
        }
    }

    /// Behave as `like` (`--like`, `RXE_EMU_LIKE`): its congestion model
    /// and kernel rxe release.
    pub fn set_like(&mut self, like: rxe_core::Like) {
        self.cc.model = like.cc;
        self.release = like.release;
    }
}

/// How long after an application's last `poll` the progress thread keeps
/// off the socket and the core. Arming a CQ (`req_notify`) ends it at
/// once, and so does a poll after which the application may stop polling
/// (see [`Inner::note_app_poll`]); an application that stops polling
/// without either leaves incoming packets and timers waiting at most this
/// long. 1 ms, not 50 µs: in the TCG guest an application's polls are
/// often more than 50 µs apart (its vCPU is preempted, or a poll takes
/// that long), and each time the progress thread took over, every post
/// and every datagram from then on woke it, on a CPU the applications
/// spin on: ib_send_lat typical 43-66 µs with 50 µs, 28-35 µs with 1 ms
/// (interleaved runs in one guest, 2026-11-26); no change on the host.
const APP_POLL_GRACE: Duration = Duration::from_millis(1);

/// How often a polling application's stamp (`last_app_poll`, the inbox's
/// last poll) is renewed while nothing else changes: a fiftieth of the
/// shortest windows they are read against ([`APP_POLL_GRACE`] and
/// `local_link::POLL_STALE`, 1 ms; [`APP_ACTIVE`] is 20 ms).
const STAMP_EVERY: Duration = Duration::from_micros(20);
/// How long after an application's last poll the progress thread, which
/// sleeps while it polls, looks whether it still does (each look preempts
/// a spinning thread on a small machine): its look timer, which the polls
/// push on (`Inner::push_look`), so that an application that keeps
/// polling is not looked at.
/// What arrives after the application stopped polling (without arming a
/// CQ, and with work outstanding) does not wait for that look: a sender
/// on this host kicks a process whose application has not polled for
/// [`local_link::POLL_STALE`] ([`local_link::LEFT_GRACE`] once it said it
/// may stop), a UDP datagram wakes the thread (while UDP
/// is in use the application reads it and the look is
/// [`MAX_SPIN_WAIT_UDP`]), held responses are sent within
/// [`APP_POLL_GRACE`]. The engine's timers are the polling application's
/// to fire: the wait ends at the earliest of them only for an application
/// that may have left (`app_left`), and one that says so while a timer is
/// set wakes the thread to watch it (`Inner::left_with_timers`). A timer
/// of an application that stops polling without saying so (nor arming a
/// CQ) fires at this look: up to 200 ms late, where only a lost packet
/// (fault injection) or a receiver not ready makes it matter.
/// History, in the TCG guest (2 vCPUs, each look 100-300 µs of a CPU an
/// application spins on): 1 ms looks measured the bench's 8-byte
/// ping-pong at 1.66-2.31x raw UDP on the 2-core VM, 2 ms at 1.23-1.89x;
/// 20 ms, with the kicks, perftest averages 23-27 / 34-38 / 35-37 µs
/// against 30-37 / 57-77 / 42-45 (send / write / read lat). 200 ms
/// rather than 20 (ftrace, 2026-11-28): 3-4 looks per `ib_write_lat -n
/// 5000` instead of 8-13 (in a ping-pong the wait mostly ends at the
/// 67 ms retransmission deadline); four interleaved rounds, medians of the
/// 99.9th percentiles: `ib_read_lat` 187 µs instead of 297 (kernel rxe
/// 194), `ib_send_lat` 155 instead of 227 (kernel 138), `ib_write_lat`
/// 220 instead of 242 (kernel 92). On the host no change beyond noise.
/// The retransmission deadline left out while the application polls
/// (2026-11-29, tracefs, 8 traced `-n 5000` pairs of each build in one
/// guest): 2.0-2.5 timed wakes of the two threads per run instead of 3.1;
/// the others are these looks. Looks pushed on by polls, with kicks to an
/// application that may stop polling deferred by `LEFT_GRACE`
/// (2026-12-07, 20 alternated `ib_write_lat -n 5000` rounds with kernel
/// rxe in one guest): 99.9th percentile median 397 µs instead of 601
/// (kernel 302), typical unchanged (21.98 µs).
const MAX_SPIN_WAIT: Duration = Duration::from_millis(200);
/// While the progress thread finds datagrams by spinning on its inbox, how
/// often it still reads its wake pipe and the daemon's connection (each a
/// system call).
const HOUSEKEEPING: Duration = Duration::from_millis(1);
/// [`MAX_SPIN_WAIT`] while UDP datagrams came or went within
/// [`UDP_RECENT`] or a multicast group is joined: the application reads
/// those sockets itself while it polls, the progress thread does not watch
/// them meanwhile, and no sender kicks for them.
const MAX_SPIN_WAIT_UDP: Duration = Duration::from_millis(2);

/// The most responses a flush holds back (see [`Inner::flush_with`]).
const HOLD_MAX: usize = 16;

struct Faults {
    cfg: FaultConfig,
    rng: Rng,
    held: Option<Transmit>,
    /// Datagrams waiting out `cfg.delay` or the queue, with the time each
    /// is due (in order: the delay is the same for all, and a FIFO queue
    /// serves them in order).
    delayed: std::collections::VecDeque<(Instant, Transmit)>,
    /// `cfg.queue`'s state.
    queue: Option<rxe_core::sim::BottleneckQueue>,
}

impl Faults {
    fn new(cfg: FaultConfig) -> Faults {
        Faults {
            cfg,
            rng: Rng::new(cfg.seed),
            held: None,
            delayed: std::collections::VecDeque::new(),
            queue: cfg.queue.map(rxe_core::sim::BottleneckQueue::new),
        }
    }

    /// Whether datagrams go through the `delayed` FIFO.
    fn holds_back(&self) -> bool {
        !self.cfg.delay.is_zero() || self.queue.is_some()
    }
}

/// Where a CQ's notifications go (its completion channel).
pub(crate) struct ChannelTx {
    pub tx: UnixDatagram,
}

/// [`Inner::drain_local`] reads the clock once per this many datagrams.
const CLOCK_EVERY: usize = 4;

/// One round of [`Inner::progress`]: who runs it (an application's poll
/// or the progress thread), the CQ whose completion ends it, and how many
/// datagrams it handled.
struct Round {
    app: bool,
    polled: Option<rxe_core::CqHandle>,
    handled: usize,
}

pub(crate) struct Inner {
    pub engine: Mutex<Engine<HostMemory>>,
    /// Asynchronous events not yet taken by the application, and the fd
    /// pair that signals them (one byte per event).
    pub events: Mutex<std::collections::VecDeque<rxe_core::AsyncEvent>>,
    pub event_tx: UnixDatagram,
    pub event_rx: UnixDatagram,
    /// Completion channel of each CQ created with one.
    pub channels: Mutex<FxHashMap<rxe_core::CqHandle, Arc<ChannelTx>>>,
    pub cfg: DeviceConfig,
    pub mtu: Mtu,
    socket: UdpSocket,
    /// Responses (ACKs, NAKs, READ and atomic responses) held back so that
    /// an application polling a CQ gets its completion before the
    /// acknowledgement is sent, as kernel rxe's responder completes before
    /// it acknowledges. Touched only with the engine locked; sent by the
    /// application's next poll or post, or, if it stopped polling without
    /// arming a CQ, by the progress thread within about [`APP_POLL_GRACE`].
    deferred: Mutex<Vec<Transmit>>,
    /// `deferred` is not empty: a poll looks at this, not the mutex.
    deferred_any: AtomicBool,
    /// How many times the engine was locked: a poll that found its CQ idle
    /// at one count finds it idle again, without the lock, while the count
    /// stays (`CompletionQueue::poll_into`).
    lock_count: std::sync::atomic::AtomicU64,
    senders: Mutex<FxHashMap<u16, Option<UdpSocket>>>,
    /// One socket per multicast group a QP of this device is attached to,
    /// bound to the group's address and port 4791 and joined on the
    /// device's interface. Every socket so bound on the host gets its own
    /// copy of a group datagram, so each process receives the group's
    /// traffic itself: the daemon never carries it.
    mcast: Mutex<Vec<(IpAddr, UdpSocket)>>,
    /// `mcast` is not empty: the receive path and the progress loop look
    /// at the mutex only then (it is touched on every poll).
    mcast_on: AtomicBool,
    faults: Mutex<Option<Faults>>,
    /// `faults` is `Some`: the transmit path takes its lock only then.
    faults_on: AtomicBool,
    /// `faults` was ever `Some` in this process: until then no datagram
    /// can have been changed after it was built, so those handed to a
    /// peer through its inbox go with their ICRC vouched for
    /// (`local_link::Inbox::push_intact`). Set before `faults_on`, never
    /// cleared: a datagram corrupted while faults were on may still wait
    /// in a queue after they are off.
    faults_ever: AtomicBool,
    /// CLOCK_MONOTONIC (`local_link::monotonic_ns`) when the device was
    /// opened: `now` counts from it.
    epoch: u64,
    stop: AtomicBool,
    /// When the progress thread will wake on its own (ns since `epoch`;
    /// 0 while it is awake). A flush wakes it only for an earlier deadline.
    sleeping_until: std::sync::atomic::AtomicU64,
    /// When an application thread last polled a CQ (ns since `epoch`).
    /// While one polls, it receives datagrams itself and the progress
    /// thread leaves the socket alone instead of competing for a core.
    pub(crate) last_app_poll: std::sync::atomic::AtomicU64,
    /// The progress thread sleeps because an application polls.
    spin_sleeping: AtomicBool,
    /// The progress thread's look at whether the application still polls
    /// ([`MAX_SPIN_WAIT`]): a CLOCK_MONOTONIC timer that the application's
    /// polls push on (`Inner::push_look`), so that it fires only once
    /// they stop. `None` if no timerfd could be made: the thread's wait
    /// then ends by itself every [`MAX_SPIN_WAIT`], as a look's did before.
    look_timer: Option<nix::sys::timerfd::TimerFd>,
    /// When `look_timer` fires (CLOCK_MONOTONIC ns); 0 while the progress
    /// thread is not waiting on it.
    look_due: std::sync::atomic::AtomicU64,
    /// An application armed a CQ ([`Inner::hand_off`]) and has not polled
    /// an unarmed one since: it may sleep on a completion channel, so its
    /// posts do not tell senders to leave the inbox to it
    /// (`Inbox::app_active`).
    app_armed: AtomicBool,
    /// The application's last poll returned a completion after which it
    /// has no reason to poll again (see [`Inner::note_app_poll`]): the
    /// progress thread watches the socket. Any other poll says it is
    /// waiting for a completion and will take the datagrams itself.
    app_left: AtomicBool,
    /// The progress thread keeps off for an application that may have
    /// left but posted within [`APP_POLL_GRACE`] (`left_but_posting`), its
    /// inbox marked for kicks. Until that application polls again, its
    /// posts leave the mark: they would otherwise stop the kicks while
    /// nobody polls.
    left_spin: AtomicBool,
    /// The daemon connection of a daemon device; end-of-file on it means
    /// the daemon is gone.
    control: Option<std::os::unix::net::UnixStream>,
    /// Bytes from the daemon not yet making a whole line.
    control_buf: Mutex<Vec<u8>>,
    /// Lines for the daemon not yet written (the connection is
    /// non-blocking; whole lines only, so nothing interleaves).
    control_out: Mutex<Vec<u8>>,
    /// `rxe-emu trace` is watching: every datagram sent and received, QP
    /// state changes and events go to the daemon, tagged.
    tracing: AtomicBool,
    trace_tag: Mutex<String>,
    /// Why the device failed, once it has.
    pub(crate) failed: Mutex<Option<String>>,
    wake_tx: UnixDatagram,
    wake_rx: UnixDatagram,
    /// The same-host path (a daemon device whose daemon gave it an inbox).
    local: Option<crate::local::LocalLink>,
    /// When a datagram last came or went by UDP on the data socket (ns
    /// since `epoch`). With the same-host path, an application's poll
    /// reads the UDP socket only while UDP is in use (see
    /// [`UDP_RECENT`]), so a conversation through inboxes costs no system
    /// call per poll; the progress thread watches the socket meanwhile.
    udp_seen: std::sync::atomic::AtomicU64,
    /// When this process's inbox last gave a datagram (ns since `epoch`).
    local_rx: std::sync::atomic::AtomicU64,
    /// When an application thread last posted work (ns since `epoch`).
    last_app_post: std::sync::atomic::AtomicU64,
    /// Datagrams handed to an inbox (the same-host path) and to UDP:
    /// `rxe-emu stat`'s `sent_inbox_pkts` and `sent_udp_pkts`.
    sent_inbox: std::sync::atomic::AtomicU64,
    sent_udp: std::sync::atomic::AtomicU64,
    /// What woke the progress thread, for `rxe-emu stat`: its waits that
    /// something ended before their time (`progress_wakeups`: a kick of
    /// the inbox, a datagram, the wake pipe or the daemon), and this
    /// process's own requests through the wake pipe (`wake_requests`: a
    /// post that armed an earlier timer, a CQ armed to sleep, held
    /// responses). Each costs a context switch; in a small VM, tens of
    /// microseconds of a CPU (`docs/performance.md`).
    progress_wakeups: std::sync::atomic::AtomicU64,
    wake_requests: std::sync::atomic::AtomicU64,
    /// The progress thread's looks at whether a polling application still
    /// polls that found it had not ended any other way (`progress_looks`:
    /// its `look_timer` fired, or its wait timed out).
    progress_looks: std::sync::atomic::AtomicU64,
    /// Placed WRITEs (a peer wrote their payload into our memory,
    /// `local_link::PlacingRun::place_and_push`) that the engine did not
    /// accept where they lay: `rxe-emu stat`'s `placed_refused`.
    placed_refused: std::sync::atomic::AtomicU64,
    /// The data socket reports each datagram's TOS (`IP_RECVTOS` /
    /// `IPV6_RECVTCLASS`), so the engine sees its ECN codepoint: on a
    /// ConnectX-like device only; a kernel-rxe-like one ignores marks and
    /// keeps the cheaper `recv_from`.
    recv_tos: bool,
    /// Fault injection's marks and drops (`rxe-emu stat`'s
    /// `fault_ce_marked` and `fault_queue_dropped`).
    fault_ce: std::sync::atomic::AtomicU64,
    fault_queue_drops: std::sync::atomic::AtomicU64,
}

/// How long the progress thread keeps looking at its inbox after the
/// last datagram before it sleeps, when no application thread of the
/// process is active (see [`Inner::spin_for_inbox`] for why 1 ms).
const INBOX_SPIN: Duration = Duration::from_millis(1);

/// An application thread that posted or polled within this long is
/// taken to be running (it may be spinning on memory): the progress
/// thread then does not spin beside it ([`Inner::spin_for_inbox`]).
/// 20 ms, not 1 ms: an application spinning on memory (ib_write_lat's,
/// waiting for its peer's WRITE) neither posts nor polls while its peer
/// is held up, and in the TCG guest that is often 1-3 ms (the host takes
/// a vCPU away). With 1 ms the kicked progress thread then spun its 1 ms
/// on the CPU of an application that was about to go on, as the sched
/// trace showed (`sched_yield` does not help: the thread that slept has
/// far less CPU time than the one that spins, and CFS picks it again).
const APP_ACTIVE: Duration = Duration::from_millis(20);

/// How long after the last UDP datagram an application's poll still
/// reads the UDP socket (devices with the same-host path only).
const UDP_RECENT: Duration = Duration::from_millis(20);

/// How often the progress thread retries datagrams that wait for room
/// in a full inbox (an application's poll retries at every poll).
const PENDING_RETRY: Duration = Duration::from_micros(100);

/// While an application thread posted within this long, the progress
/// thread sleeps at most this long. A post that arms a timer due later
/// than that then needs no wake (`after_transmit`): retransmission timers
/// are tens of milliseconds (perftest's timeout 14: 67 ms). Measured in
/// the TCG guest, `ib_write_lat` woke its progress threads for those
/// posts in one iteration in five; with this bound, 46-52 -> 34-42 µs
/// typical (average 171-192 -> 88-116).
const APP_TICK: Duration = Duration::from_millis(10);

/// What the progress thread's last wait found not readable (all false:
/// nothing known).
#[derive(Debug, Default, Clone, Copy)]
struct Quiet {
    /// The wake pipe.
    pipe: bool,
    /// The daemon connection.
    control: bool,
    /// The device's UDP socket.
    socket: bool,
    /// The inbox's kick eventfd.
    kick: bool,
}

/// Attributes of the device's one port (`ibv_query_port`, port 1), as kernel
/// rxe reports them for the same netdev.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortAttr {
    /// Always active: the device exists only while its socket is bound
    /// (`IBV_PORT_ACTIVE`).
    pub active: bool,
    /// Largest MTU the port supports: 4096 (`RXE_PORT_MAX_MTU`).
    pub max_mtu: Mtu,
    /// Path MTU in use: the largest IB MTU <= netdev MTU - 80.
    pub active_mtu: Mtu,
    /// GID table size (`RXE_PORT_GID_TBL_LEN`, 1024); the entries in use
    /// are [`Device::gid_table`].
    pub gid_tbl_len: u32,
    /// Largest message (`RXE_PORT_MAX_MSG_SZ`, 8 MiB on Linux 6.1).
    pub max_msg_sz: u32,
    /// P_Key table size: one entry, 0xffff (`RXE_PORT_PKEY_TBL_LEN`).
    pub pkey_tbl_len: u16,
    /// LID: 0, as on every RoCE port.
    pub lid: u16,
    /// Link layer: Ethernet (`IBV_LINK_LAYER_ETHERNET`), so programs use
    /// GIDs, not LIDs.
    pub link_layer_ethernet: bool,
}

/// The devices open in this process, in the order they were opened
/// (`ibv_get_device_list` for in-process devices). A device stays listed
/// until its last handle is dropped.
pub fn device_list() -> Vec<Device> {
    let mut reg = registry();
    reg.retain(|(w, _)| w.strong_count() > 0);
    reg.iter()
        .filter_map(|(w, t)| {
            Some(Device {
                inner: w.upgrade()?,
                _thread: t.upgrade()?,
            })
        })
        .collect()
}

type Registry = Vec<(std::sync::Weak<Inner>, std::sync::Weak<ThreadGuard>)>;

fn registry() -> MutexGuard<'static, Registry> {
    static REG: Mutex<Registry> = Mutex::new(Vec::new());
    REG.lock().unwrap_or_else(|p| p.into_inner())
}

/// Open device `name` as the environment says (`RXE_EMU_MODE`):
///
/// - `daemon`: the device of the `rxe-emud` at `$RXE_EMU_SOCKET` (or the
///   user's default socket); an error if it is not running.
/// - `inprocess`: an in-process device on `$RXE_EMU_ADDR`, or `fallback`,
///   kernel-rxe-like unless `$RXE_EMU_LIKE` is `mlx5` (ConnectX-like:
///   ECN, CNPs and DCQCN; see [`DeviceConfig::cc`]).
/// - unset (the default): the daemon's device if `rxe-emud` answers,
///   else in-process as above.
pub fn open_device(name: &str, fallback: IpAddr) -> Result<Device> {
    let mode = std::env::var("RXE_EMU_MODE").unwrap_or_default();
    let in_process = || {
        let addr = match std::env::var("RXE_EMU_ADDR") {
            Ok(a) if !a.is_empty() => a
                .parse()
                .map_err(|_| Error::Config(format!("RXE_EMU_ADDR={a:?} is not an IP address")))?,
            _ => fallback,
        };
        let mut cfg = DeviceConfig::new(addr);
        cfg.name = name.to_string();
        cfg.set_like(like_from_env()?);
        Device::open(cfg)
    };
    match mode.as_str() {
        "daemon" => Device::open_daemon(name, None),
        "inprocess" => in_process(),
        "" => {
            let path = emulator_daemon::default_socket_path();
            if std::os::unix::net::UnixStream::connect(&path).is_ok() {
                Device::open_daemon(name, None)
            } else {
                in_process()
            }
        }
        m => Err(Error::Config(format!(
            "RXE_EMU_MODE={m:?}: expected daemon or inprocess"
        ))),
    }
}

/// `RXE_EMU_LIKE`: `rxe` (or unset: the newest kernel rxe), `6.1`,
/// `6.12`, `7.2` (that kernel rxe) or `mlx5` (ConnectX's ECN, CNPs and
/// DCQCN), for in-process devices.
pub fn like_from_env() -> Result<rxe_core::Like> {
    match std::env::var("RXE_EMU_LIKE") {
        Ok(v) if !v.is_empty() => rxe_core::Like::from_name(&v).ok_or_else(|| {
            Error::Config(format!(
                "RXE_EMU_LIKE={v:?}: expected {}",
                rxe_core::Like::NAMES
            ))
        }),
        _ => Ok(rxe_core::Like::default()),
    }
}

/// An open device. Cheap to clone; the progress thread stops when the last
/// clone is dropped.
#[derive(Clone)]
pub struct Device {
    pub(crate) inner: Arc<Inner>,
    _thread: Arc<ThreadGuard>,
}

struct ThreadGuard {
    inner: Arc<Inner>,
    handle: Mutex<Option<JoinHandle<()>>>,
}

impl Drop for ThreadGuard {
    fn drop(&mut self) {
        // Responses a poll held back (the ACK of the last message received)
        // leave now: the peer is waiting for them.
        {
            let mut e = self.inner.lock();
            self.inner.flush(&mut e);
        }
        self.inner.stop.store(true, Ordering::SeqCst);
        self.inner.wake();
        if let Some(h) = self.handle.lock().ok().and_then(|mut h| h.take()) {
            let _ = h.join();
        }
    }
}

fn bind_udp(addr: SocketAddr) -> io::Result<UdpSocket> {
    let s = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))?;
    // Large buffers: a burst of 128 unacknowledged 4 KiB packets per QP.
    let _ = s.set_recv_buffer_size(8 << 20);
    let _ = s.set_send_buffer_size(8 << 20);
    if addr.is_ipv6() {
        s.set_only_v6(true)?;
    } else {
        // DF set, so Linux sends IP ID 0 on this unconnected socket: the ID
        // our ICRC was computed over.
        crate::sys::set_dont_fragment(s.as_raw_fd())?;
    }
    s.bind(&addr.into())?;
    s.set_nonblocking(true)?;
    set_multicast_if(&s, addr.ip());
    Ok(s.into())
}

/// Send multicast out of the interface that holds `local` (without it, a
/// host with no multicast route could not send a group datagram at all).
fn set_multicast_if(s: &Socket, local: IpAddr) {
    let _ = match local {
        IpAddr::V4(v4) if !v4.is_unspecified() => s.set_multicast_if_v4(&v4),
        IpAddr::V6(_) => match crate::sys::ifindex_of(local) {
            Some(i) => s.set_multicast_if_v6(i),
            None => Ok(()),
        },
        _ => Ok(()),
    };
}

/// A socket that receives multicast group `group` on the interface of
/// `local`: bound to the group's address and 4791 with SO_REUSEADDR, so
/// that every process on the host that joins gets a copy.
fn join_group(group: IpAddr, local: IpAddr) -> io::Result<UdpSocket> {
    let addr = SocketAddr::new(group, wire::ROCEV2_UDP_PORT);
    let s = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))?;
    let _ = s.set_recv_buffer_size(8 << 20);
    s.set_reuse_address(true)?;
    match (group, local) {
        (IpAddr::V4(g), IpAddr::V4(l)) => {
            s.bind(&addr.into())?;
            s.join_multicast_v4(&g, &l)?;
        }
        (IpAddr::V6(g), IpAddr::V6(_)) => {
            s.set_only_v6(true)?;
            s.bind(&addr.into())?;
            s.join_multicast_v6(&g, crate::sys::ifindex_of(local).unwrap_or(0))?;
        }
        _ => {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("group {group} and device address {local} are of different IP versions"),
            ))
        }
    }
    s.set_nonblocking(true)?;
    Ok(s.into())
}

impl Inner {
    pub(crate) fn now(&self) -> Instant {
        let mono = local_link::monotonic_ns();
        if let Some(l) = &self.local {
            l.note_time(mono);
        }
        self.at(mono)
    }

    /// The engine's time of a CLOCK_MONOTONIC reading.
    pub(crate) fn at(&self, monotonic_ns: u64) -> Instant {
        Instant::from_nanos(monotonic_ns.saturating_sub(self.epoch))
    }

    /// MR `mr` was registered (or changed): peers on this host may place
    /// WRITEs into it (`local_link::place`).
    pub(crate) fn publish_mr(&self, mr: &rxe_core::mr::Mr) {
        if let Some(ll) = &self.local {
            ll.publish_mr(mr);
        }
    }

    /// An MR of `len` bytes at `host` with `access` is about to be
    /// registered: with `may_move` (memory the caller manages, no Rust
    /// reference to it), its pages move into shared memory if peers may
    /// place into it and that is safe now (`local_link::shared_mr`).
    /// Every MR is noted, so that no move touches another's pages; pair
    /// with [`Inner::forget_mr_range`].
    pub(crate) fn note_mr_range(
        &self,
        host: u64,
        len: u64,
        access: rxe_core::AccessFlags,
        may_move: bool,
    ) {
        let share = may_move && self.local.as_ref().is_some_and(|l| l.shares(access));
        local_link::shared_mr::register(host, len, share);
    }

    /// The MR of `len` bytes at `host` is gone (or moved elsewhere).
    pub(crate) fn forget_mr_range(&self, host: u64, len: u64) {
        local_link::shared_mr::deregister(host, len);
    }

    /// MR `rkey` is about to be deregistered or changed: returns once no
    /// peer can still be placing into it.
    pub(crate) fn unpublish_mr(&self, rkey: u32) {
        // No peer places a READ's responses into it from now on.
        self.end_read_hints();
        if self.local.as_ref().is_some_and(|ll| ll.unpublish_mr(rkey)) {
            // Peers placed into it until now; their packets are in the
            // inbox. The engine takes them while the MR is still there:
            // the application may have seen a payload, and deregistered
            // on that, before a thread of ours read its packet, and the
            // WRITE must then succeed (kernel rxe checks the rkey before
            // the payload lands), not fail on a key gone since.
            self.catch_up();
        }
    }

    /// No peer places the responses of a READ this process asked for
    /// until now once this returns (`LocalLink::end_read_hints`).
    pub(crate) fn end_read_hints(&self) {
        if let Some(ll) = &self.local {
            ll.end_read_hints();
        }
    }

    /// QP `qpn` changed (or is gone): say again whether peers may place
    /// WRITEs for it.
    pub(crate) fn publish_qp(&self, e: &Engine<HostMemory>, qpn: u32) {
        if let Some(ll) = &self.local {
            ll.publish_qp(e, qpn);
        }
    }

    fn wake(&self) {
        self.wake_requests.fetch_add(1, Ordering::Relaxed);
        let _ = self.wake_tx.send(&[1]);
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, Engine<HostMemory>> {
        // A panic while holding the lock would be a bug in rxe-core; the
        // engine state is still structurally valid, so keep going.
        let e = self.engine.lock().unwrap_or_else(|p| p.into_inner());
        self.count_lock();
        e
    }

    /// Count a lock of the engine (with it held: no other writer).
    fn count_lock(&self) {
        let n = self.lock_count.load(Ordering::Relaxed).wrapping_add(1);
        self.lock_count.store(n, Ordering::Release);
    }

    /// [`Inner::lock_count`] now: with the engine locked, the count of this
    /// lock.
    pub(crate) fn lock_count(&self) -> u64 {
        self.lock_count.load(Ordering::Acquire)
    }

    /// Send what the engine has queued, responses held back earlier
    /// included. Called with the engine locked.
    pub(crate) fn flush(&self, eng: &mut Engine<HostMemory>) {
        self.flush_with(eng, false)
    }

    /// Send what the engine has queued. Requests leave first, then the
    /// responses: each of the two streams keeps the engine's order (they
    /// are independent on the wire, IBTA 9.7). With `hold`, the responses
    /// that leave by UDP are kept for a later flush instead: the
    /// latency-critical path of an application's poll or post_recv then
    /// carries no acknowledgement syscall. Responses to another process's
    /// inbox are never held: they cost no system call to send (only a
    /// kick if that process sleeps), and holding one made the poll wake
    /// this process's progress thread whenever it slept (guest
    /// `ib_send_lat` 31-34 -> 19-23 µs typical without it). Only a few are
    /// ever held back: past [`HOLD_MAX`] (a READ reply, a burst of ACKs)
    /// responses stream out as the engine builds them, so a long READ
    /// reply starts leaving at once.
    pub(crate) fn flush_with(&self, eng: &mut Engine<HostMemory>, hold: bool) {
        if let Some(ll) = &self.local {
            ll.publish_after_errors(eng);
        }
        // Nothing to send or deliver (the flush after a poll that handled
        // an ACK, or a post_recv's): two of the four flushes of an
        // ib_send_lat iteration, about 200 instructions each otherwise.
        if !eng.has_output()
            && !self.faults_on.load(Ordering::Acquire)
            && !self.deferred_any.load(Ordering::Acquire)
            && self.local.as_ref().is_none_or(|l| !l.has_pending())
        {
            return;
        }
        self.send_due(eng);
        let mut any = false;
        // The held responses' lock is taken only when some are held or
        // one is to be: most flushes hold none (every response into an
        // inbox leaves at once). `deferred_any` is written only here, with
        // the engine locked, so it is exact under that lock.
        let lock = || self.deferred.lock().unwrap_or_else(|p| p.into_inner());
        let had_deferred = self.deferred_any.load(Ordering::Acquire);
        let mut deferred = had_deferred.then(lock);
        let mut streaming = false;
        // What leaves now, in order, handed to the kernel in as few
        // system calls as it takes (`send_all`). The thread's vector is
        // reused: two allocations per message less (ib_send_lat).
        thread_local! {
            static OUT: std::cell::Cell<Vec<Transmit>> = const { std::cell::Cell::new(Vec::new()) };
        }
        // (A flush at process exit finds the thread's storage gone.)
        let mut out = OUT.try_with(|c| c.take()).unwrap_or_default();
        while let Some(t) = eng.poll_transmit() {
            any = true;
            if streaming || !is_response(&t.payload) || self.to_inbox(&t) {
                self.transmit(t, &mut out);
                continue;
            }
            let held = deferred.get_or_insert_with(lock);
            if held.len() < HOLD_MAX {
                // Held past this flush: whole.
                let mut t = t;
                crate::hostmem::fill_gathered(&mut t);
                held.push(t);
            } else {
                streaming = true;
                for h in std::mem::take(&mut **held) {
                    self.transmit(h, &mut out);
                }
                self.transmit(t, &mut out);
            }
        }
        if let Some(mut held) = deferred {
            if hold && !held.is_empty() {
                // A progress thread in a long sleep would not send them if
                // the application stops polling: wake it.
                let until = self.sleeping_until.load(Ordering::Acquire);
                let soon = (self.now() + APP_POLL_GRACE).as_nanos();
                if until != 0 && until > soon {
                    self.wake();
                }
            } else {
                for t in std::mem::take(&mut *held) {
                    self.transmit(t, &mut out);
                }
            }
            self.deferred_any.store(!held.is_empty(), Ordering::Release);
        }
        self.send_all(eng, &mut out);
        let _ = OUT.try_with(move |c| c.set(out));
        if any || had_deferred {
            self.after_transmit(eng);
        }
        self.deliver_notifications(eng);
    }

    /// Whether `t` goes into another process's inbox (shared memory: no
    /// system call to hold back).
    fn to_inbox(&self, t: &Transmit) -> bool {
        self.local
            .as_ref()
            .is_some_and(|l| l.takes(t, self.cfg.addr))
    }

    /// A connected QP of this process now talks to QP `dest_qpn` at
    /// `dst`: run the engine's data path once if this process has not
    /// ([`crate::warmup`]), and if that is a QP of this device (another
    /// process's, or ours), ready the same-host path to it now rather than
    /// at the first message ([`crate::local::LocalLink::warm`]).
    pub(crate) fn warm_path(&self, dst: IpAddr, dest_qpn: u32) {
        crate::warmup::once(self.cfg.addr, self.cfg.release, self.local.is_some());
        if let Some(l) = &self.local {
            if dst == self.cfg.addr {
                l.warm((dest_qpn >> 16) as usize, &|| self.now());
            }
        }
    }

    /// Whether responses are waiting for a flush.
    fn has_deferred(&self) -> bool {
        self.deferred_any.load(Ordering::Acquire)
    }

    /// One datagram through fault injection (if configured): what is to
    /// leave now is appended to `out`, a delayed one goes to the delay
    /// queue.
    fn transmit(&self, t: Transmit, out: &mut Vec<Transmit>) {
        if !self.faults_on.load(Ordering::Acquire) {
            return out.push(t);
        }
        let mut faults = self.faults.lock().unwrap_or_else(|p| p.into_inner());
        let Some(f) = faults.as_mut() else {
            return out.push(t);
        };
        // What faults do (corrupt a bit, hold it back) is done to the
        // whole packet, as on a wire.
        let mut t = t;
        crate::hostmem::fill_gathered(&mut t);
        t.write_icrc();
        if f.rng.chance(f.cfg.loss) {
            return;
        }
        if f.rng.chance(f.cfg.corrupt) && !t.payload.is_empty() {
            let bit = f.rng.below(t.payload.len() as u64 * 8);
            t.payload[(bit / 8) as usize] ^= 1 << (bit % 8);
        }
        // Drawn only for ECT datagrams, so a kernel-rxe-like device's
        // faults are the same sequence with or without `ce`.
        if t.ecn.is_ect() && f.rng.chance(f.cfg.ce) {
            t.ecn = rxe_core::Ecn::Ce;
            self.fault_ce.fetch_add(1, Ordering::Relaxed);
        }
        let dup = f.rng.chance(f.cfg.duplicate);
        if f.rng.chance(f.cfg.reorder) && f.held.is_none() {
            f.held = Some(t);
            return;
        }
        let mut now_out = Vec::with_capacity(3);
        if dup {
            now_out.push(t.clone());
        }
        now_out.push(t);
        now_out.extend(f.held.take());
        if !f.holds_back() {
            return out.extend(now_out);
        }
        let now = self.now();
        for mut t in now_out {
            let mut due = now;
            if let Some(q) = f.queue.as_mut() {
                let bytes = (t.payload.len() + rxe_core::cc::WIRE_OVERHEAD) as u64;
                match q.offer(now, bytes, t.ecn.is_ect(), &mut f.rng) {
                    rxe_core::sim::QueueVerdict::Dropped => {
                        self.fault_queue_drops.fetch_add(1, Ordering::Relaxed);
                        continue;
                    }
                    rxe_core::sim::QueueVerdict::Queued { leaves, ce } => {
                        if ce {
                            t.ecn = rxe_core::Ecn::Ce;
                            self.fault_ce.fetch_add(1, Ordering::Relaxed);
                        }
                        due = leaves;
                    }
                }
            }
            f.delayed.push_back((due + f.cfg.delay, t));
        }
    }

    /// Send the delayed datagrams whose time has come.
    fn send_due(&self, eng: &mut Engine<HostMemory>) {
        if !self.faults_on.load(Ordering::Acquire) {
            return;
        }
        let now = self.now();
        let mut due: Vec<Transmit> = {
            let mut faults = self.faults.lock().unwrap_or_else(|p| p.into_inner());
            let Some(f) = faults.as_mut() else { return };
            let n = f.delayed.iter().take_while(|(d, _)| *d <= now).count();
            f.delayed.drain(..n).map(|(_, t)| t).collect()
        };
        if !due.is_empty() {
            self.send_all(eng, &mut due);
        }
    }

    /// When the oldest delayed datagram is due.
    fn next_due(&self) -> Option<Instant> {
        if !self.faults_on.load(Ordering::Acquire) {
            return None;
        }
        let faults = self.faults.lock().unwrap_or_else(|p| p.into_inner());
        faults.as_ref()?.delayed.front().map(|(due, _)| *due)
    }

    /// Wake the progress thread only if the engine now has a deadline
    /// before the one it sleeps towards (a wake costs a syscall and, on a
    /// small machine, a context switch).
    fn after_transmit(&self, eng: &mut Engine<HostMemory>) {
        let until = self.sleeping_until.load(Ordering::Acquire);
        let next = match (eng.poll_timeout(), self.next_due()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        if until != 0 && next.is_some_and(|d| d.as_nanos() < until) {
            self.wake();
        }
    }

    fn deliver_notifications(&self, eng: &mut Engine<HostMemory>) {
        // Asynchronous events: queue them and signal the event fd.
        if self.tracing.load(Ordering::Relaxed) {
            while let Some(n) = eng.poll_note() {
                self.trace_line('N', &n);
            }
        }
        while let Some(ev) = eng.poll_event() {
            if self.tracing.load(Ordering::Relaxed) {
                self.trace_line('E', &format!("{:?}: {}", ev.kind, ev.reason));
            }
            self.events
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push_back(ev);
            let _ = self.event_tx.send(&[1]);
        }
        // Armed CQs whose notification fired: one datagram on the channel
        // carrying the CQ's handle (what ibv_get_cq_event returns).
        while let Some(cq) = eng.poll_cq_notification() {
            let ch = self
                .channels
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get(&cq)
                .cloned();
            if let Some(ch) = ch {
                let _ = ch.tx.send(&cq.0.to_ne_bytes());
            }
        }
    }

    fn send(&self, eng: &mut Engine<HostMemory>, t: Transmit) {
        self.send_all(eng, &mut vec![t]);
    }

    /// Hand datagrams to the kernel in order, consecutive ones from the
    /// same socket in one `sendmmsg` (a 64 KiB WRITE at path MTU 4096 is
    /// 16 datagrams: one system call instead of 16).
    /// Takes (drains) every datagram of `ts`.
    fn send_all(&self, eng: &mut Engine<HostMemory>, ts: &mut Vec<Transmit>) {
        let mut udp;
        let ts = if let Some(ll) = &self.local {
            if ts.is_empty() && !ll.has_pending() {
                return;
            }
            // Fault injection may drop, duplicate or reorder what leaves:
            // a payload is placed only when the packet surely follows it.
            let place = !self.faults_on.load(Ordering::Acquire);
            // Read after the transmit path read `faults_on` for these
            // datagrams: had it found faults on, this finds them ever on.
            let intact = !self.faults_ever.load(Ordering::SeqCst);
            // Counted once per batch: a locked increment per datagram
            // waited each time for the datagram just copied into the
            // inbox to leave the store buffer (x86).
            let mut n = 0;
            let sent = ll.send(ts, self.cfg.addr, &|| self.now(), place, intact, |t| {
                n += 1;
                self.note_sent(&t);
                eng.recycle(t.payload);
            });
            if n > 0 {
                self.sent_inbox.fetch_add(n, Ordering::Relaxed);
            }
            for _ in 0..sent.dropped {
                eng.note_send_error();
            }
            udp = sent.udp;
            &mut udp
        } else {
            ts
        };
        if ts.is_empty() {
            return;
        }
        // On the wire a packet carries its payload and its ICRC
        // (Engine::defer_gather, Engine::defer_icrc).
        for t in ts.iter_mut() {
            crate::hostmem::fill_gathered(t);
            t.write_icrc();
        }
        self.udp_seen
            .store(self.now().as_nanos().max(1), Ordering::Relaxed);
        let mut senders = self.senders.lock().unwrap_or_else(|p| p.into_inner());
        let mut i = 0;
        let mut fd = self.sender_fd(&mut senders, &mut ts[0]);
        while i < ts.len() {
            // ts[i..j] leave from `fd`; ts[j] (if any) from `next`.
            let mut j = i + 1;
            let mut next = fd;
            while j < ts.len() {
                next = self.sender_fd(&mut senders, &mut ts[j]);
                if next != fd {
                    break;
                }
                j += 1;
            }
            let mut k = i;
            while k < j {
                let sent = match crate::sys::send_many(fd, &ts[k..j], |t| {
                    (
                        &t.payload[..],
                        SocketAddr::new(t.info.dst, t.info.dst_port),
                        t.ecn.tos(t.dscp),
                    )
                }) {
                    Ok(n) => n,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(_) => 0,
                };
                for t in &ts[k..k + sent] {
                    self.note_sent(t);
                }
                self.sent_udp.fetch_add(sent as u64, Ordering::Relaxed);
                k += sent;
                if k < j {
                    // The first datagram not taken: a full socket buffer or
                    // an unreachable peer is packet loss to the transport;
                    // retransmission recovers. The rest are tried again.
                    eng.note_send_error();
                    k += 1;
                }
            }
            i = j;
            fd = next;
        }
        drop(senders);
        for t in ts.drain(..) {
            eng.recycle(t.payload);
        }
    }

    /// The socket `t` leaves from. Kernel rxe sends each QP's packets
    /// from its own UDP source port; bind one socket per port we use,
    /// once (a port another socket holds, e.g. another process on the
    /// same daemon device, is remembered as unavailable rather than
    /// retried per packet, and its datagrams leave from 4791).
    fn sender_fd(
        &self,
        senders: &mut FxHashMap<u16, Option<UdpSocket>>,
        t: &mut Transmit,
    ) -> std::os::fd::RawFd {
        let port = t.info.src_port;
        let sock = senders
            .entry(port)
            .or_insert_with(|| bind_udp(SocketAddr::new(self.cfg.addr, port)).ok());
        match sock {
            Some(s) => s.as_raw_fd(),
            None => {
                // The port is taken on this host: send from 4791 and
                // recompute the ICRC, which covers the source port.
                t.info.src_port = wire::ROCEV2_UDP_PORT;
                wire::icrc::write(&t.info, &mut t.payload);
                self.socket.as_raw_fd()
            }
        }
    }

    /// A datagram left: the tracer sees it.
    fn note_sent(&self, t: &Transmit) {
        if self.tracing.load(Ordering::Relaxed) {
            // The tracer shows the packet whole, also one whose ICRC was
            // left to its receiver (Engine::defer_icrc).
            if t.icrc && t.gathered.is_none() {
                self.trace_packet('t', &t.info, &t.payload, t.ecn.tos(t.dscp));
            } else {
                let mut whole = t.clone();
                crate::hostmem::fill_gathered(&mut whole);
                whole.write_icrc();
                self.trace_packet('t', &t.info, &whole.payload, t.ecn.tos(t.dscp));
            }
        }
    }

    /// Queue a line for the daemon and write what the connection takes.
    /// Past 8 MiB queued (a stalled reader) lines are dropped, never the
    /// data path.
    fn to_daemon(&self, line: &str) {
        let Some(c) = &self.control else { return };
        let mut out = self.control_out.lock().unwrap_or_else(|p| p.into_inner());
        if out.len() + line.len() > 8 << 20 {
            return;
        }
        out.extend_from_slice(line.as_bytes());
        Self::write_out(c, &mut out);
    }

    fn write_out(c: &std::os::unix::net::UnixStream, out: &mut Vec<u8>) {
        while !out.is_empty() {
            // Never SIGPIPE: a daemon that went away is seen as the end of
            // the connection (DEVICE_FATAL), not a signal that kills the
            // application.
            match emulator_daemon::send_nosignal(c, out) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    out.drain(..n);
                }
            }
        }
    }

    /// Whether no line waits for the daemon's connection to take it.
    fn control_out_empty(&self) -> bool {
        self.control_out
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_empty()
    }

    /// Write what is queued for the daemon.
    fn flush_control_out(&self) {
        let Some(c) = &self.control else { return };
        let mut out = self.control_out.lock().unwrap_or_else(|p| p.into_inner());
        if !out.is_empty() {
            Self::write_out(c, &mut out);
        }
    }

    /// `<kind> <tag> <wall-clock ns> <text>` to the tracer.
    fn trace_line(&self, kind: char, text: &str) {
        let tag = self
            .trace_tag
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let ns = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        self.to_daemon(&format!("{kind} {tag} {ns} {}\n", text.replace('\n', " ")));
    }

    /// A datagram sent (`t`) or received (`r`), for the tracer, with its
    /// IP TOS (DSCP and ECN) after the payload when it is not 0 (never on
    /// a kernel-rxe-like device).
    fn trace_packet(&self, dir: char, info: &wire::icrc::IpUdpInfo, payload: &[u8], tos: u8) {
        let mut hex = String::with_capacity(payload.len() * 2);
        for b in payload {
            hex += &format!("{b:02x}");
        }
        let tos = if tos == 0 {
            String::new()
        } else {
            format!(" {tos}")
        };
        self.trace_line(
            'P',
            &format!(
                "{dir} {} {} {} {} {hex}{tos}",
                info.src, info.src_port, info.dst, info.dst_port
            ),
        );
    }

    /// Handle what has arrived (datagrams, due timers) before an
    /// application changes or destroys a QP. Kernel rxe handles a packet
    /// as it arrives; here it waits in the socket until someone polls, and
    /// a QP moved to ERR or destroyed first would drop it unanswered: a
    /// peer's last SEND that came just before our `rdma_disconnect` then
    /// never gets its ACK, and the peer retries for ever (seen against
    /// kernel rxe with `ib_send_bw -z`).
    pub(crate) fn catch_up(&self) {
        with_rx_buf(|b| self.progress(b, false, None));
    }

    /// Read every datagram waiting on the socket into the engine, and fire
    /// due timers. The engine lock is held across `recv` so datagrams are
    /// handled in the order the socket delivered them, whichever thread
    /// (the progress thread or an application polling a CQ) gets there.
    ///
    /// `app`: called from an application's poll. Responses produced here
    /// are held until the next flush (see [`Inner::flush_with`]), and the
    /// ones held by the previous poll go out first.
    ///
    /// `polled`: the CQ an application polls. Reading stops as soon as it
    /// holds a completion, so the application gets it without first
    /// reading what else came (typically the acknowledgement of its own
    /// last send) and one more `recv` that finds the socket empty: both
    /// wait for its next poll, or the progress thread.
    pub(crate) fn progress(&self, buf: &mut [u8], app: bool, polled: Option<rxe_core::CqHandle>) {
        self.progress_quiet(buf, app, polled, false);
    }

    /// [`Inner::progress`]; `socket_quiet`: a wait just found the UDP
    /// socket not readable, so this round does not read it.
    fn progress_quiet(
        &self,
        buf: &mut [u8],
        app: bool,
        polled: Option<rxe_core::CqHandle>,
        socket_quiet: bool,
    ) {
        if let Some(ll) = &self.local {
            ll.rekick();
        }
        let mut e = self.lock();
        if app && self.has_deferred() {
            self.flush(&mut e);
        }
        // Each datagram handled is followed by a flush; a last one is
        // needed only if none was handled (what waits for room, delayed
        // datagrams, notifications) or a timer fired since.
        let mut r = Round {
            app,
            polled,
            handled: 0,
        };
        let mut done = self.drain_local(&mut e, buf, &mut r);
        let drained = r.handled;
        let mut now = self.now();
        if !done && !socket_quiet && (!app || self.udp_in_use(now)) {
            done = self.drain_socket(&mut e, &self.socket, self.cfg.addr, buf, &mut r);
        }
        if !done {
            self.progress_multicast(&mut e, buf, &mut r);
        }
        if r.handled > drained {
            now = self.now();
        }
        let mut flushed = r.handled > 0;
        if e.poll_timeout().is_some_and(|d| d <= now) {
            e.handle_timeout(now);
            flushed = false;
        }
        if !flushed {
            self.flush_with(&mut e, app);
        }
    }

    /// Whether an application's poll of an empty CQ would find nothing to
    /// do in [`Inner::progress`]: no datagram in the inbox, no UDP to read
    /// (polls read the socket only while UDP is in use), no multicast,
    /// nothing held back, waiting for room or for a kick, no fault
    /// injection, no timer due. Called with the engine locked. Such a
    /// poll then costs one lock and a few loads, not three locks, a
    /// flush and clock reads: a spinning application notices what comes
    /// next sooner (in the TCG guest each empty poll took microseconds).
    pub(crate) fn idle_for_poll(&self, e: &Engine<HostMemory>) -> bool {
        let now = self.now();
        self.nothing_to_drive(now) && e.poll_timeout().is_none_or(|d| d > now)
    }

    /// The conditions of [`Inner::idle_for_poll`] that need no engine: all
    /// but the timers.
    pub(crate) fn nothing_to_drive(&self, now: Instant) -> bool {
        let Some(l) = &self.local else { return false };
        !(l.own.has_data()
            || l.has_pending()
            || l.rekick_due(now.as_nanos() + self.epoch)
            || self.has_deferred()
            || self.mcast_on.load(Ordering::Acquire)
            || self.faults_on.load(Ordering::Acquire)
            || self.udp_in_use_at(now))
    }

    /// An application thread posted work; returns the time it did.
    pub(crate) fn note_app_post(&self) -> Instant {
        let mono = local_link::monotonic_ns();
        if let Some(l) = &self.local {
            l.note_time(mono);
        }
        let now = self.at(mono);
        self.last_app_post
            .store(now.as_nanos().max(1), Ordering::Relaxed);
        // It will poll for what it posted, most likely: senders need not
        // kick the progress thread (see `note_app_poll`), unless that
        // thread keeps off only because they kick (`left_spin`), nor one
        // asleep on the inbox, unless the application may sleep on a
        // completion channel (`app_armed`). In the TCG guest the first
        // iterations of `ib_write_lat` kicked the threads, asleep since
        // the connection's setup, at nearly every message: the peer saw a
        // placed WRITE and answered before this process's post returned
        // and it polled. Each kick woke a thread on a spinning
        // application's CPU to contend for the engine's lock (tracefs,
        // six pairs: 22 switches to progress threads in the first 20 ms
        // instead of 9, iterations 2-4 0.4-0.8 ms instead of 0.1-0.4).
        if let Some(l) = &self.local {
            if !self.left_spin.load(Ordering::SeqCst) {
                l.own.polling_again();
                if !self.app_armed.load(Ordering::Relaxed) {
                    l.own.app_active(mono, STAMP_EVERY.as_nanos() as u64);
                }
            }
        }
        now
    }

    /// Before sleeping: keep looking at the inbox for [`INBOX_SPIN`] after
    /// its last datagram, when this thread is the only one serving it (no
    /// application thread posted or polled for [`APP_ACTIVE`]: a server
    /// process waiting on something else, as ib_read_lat's responder).
    /// Waking a thread costs tens of microseconds on a small VM whose idle
    /// CPU halts; the next request of a conversation usually comes sooner.
    /// Beside an active application (which may spin on memory, as
    /// ib_write_lat does) a spinning progress thread would take its CPU
    /// instead: measured on the 2-CPU host, ib_read_lat 31 -> 3.7 µs with
    /// the spin, ib_write_lat 7 -> 31-68 µs had it spun there too.
    /// The window is 1 ms because a wake costs about 100 µs in the TCG
    /// guest and its requests come further apart than on the host: there
    /// a 50 µs window left the responder of a 64 KiB stream asleep between
    /// packets (ib_write/send/read_bw 47/33/20 MB/s), 1 ms keeps it awake
    /// (65/60/61 MB/s; kernel rxe 28-39). The cost is at most 1 ms of one
    /// CPU after the last datagram of a burst, and only for a process whose
    /// application is not using the device. Making the window adapt to the
    /// gaps it missed was tried and lost (guest ib_read_lat no better,
    /// ib_write_lat 130 µs -> 2.2 ms).
    /// Returns whether a datagram came (then do not sleep).
    fn spin_for_inbox(&self) -> bool {
        let Some(l) = &self.local else { return false };
        let recent = |t: &std::sync::atomic::AtomicU64, d: Duration, now: u64| {
            let t = t.load(Ordering::Relaxed);
            t != 0 && now.saturating_sub(t) < d.as_nanos() as u64
        };
        let app_active = |now: u64| {
            recent(&self.last_app_post, APP_ACTIVE, now)
                || recent(&self.last_app_poll, APP_ACTIVE, now)
        };
        let now = self.now().as_nanos();
        if !recent(&self.local_rx, INBOX_SPIN, now) || app_active(now) {
            return false;
        }
        let until = self.local_rx.load(Ordering::Relaxed) + INBOX_SPIN.as_nanos() as u64;
        loop {
            let now = self.now().as_nanos();
            if now >= until || self.stop.load(Ordering::Relaxed) || app_active(now) {
                return false;
            }
            if l.own.has_data() {
                return true;
            }
            std::hint::spin_loop();
        }
    }

    /// Whether an application's poll must read the UDP socket: always,
    /// unless the device has the same-host path and no datagram came or
    /// went by UDP for [`UDP_RECENT`].
    fn udp_in_use(&self, now: Instant) -> bool {
        self.local.is_none() || self.udp_in_use_at(now)
    }

    /// [`Inner::udp_in_use`] at `now`, for a device with the same-host
    /// path.
    fn udp_in_use_at(&self, now: Instant) -> bool {
        let seen = self.udp_seen.load(Ordering::Relaxed);
        seen != 0 && now.as_nanos().saturating_sub(seen) < UDP_RECENT.as_nanos() as u64
    }

    /// Read what this process's inbox holds into the engine, like
    /// [`Inner::drain_socket`]. Returns whether it stopped because `polled`
    /// holds a completion.
    fn drain_local(&self, e: &mut Engine<HostMemory>, buf: &mut [u8], r: &mut Round) -> bool {
        let Some(ll) = &self.local else { return false };
        // The clock is read for the first datagram and every
        // CLOCK_EVERY-th after it, not for each: a few microseconds of
        // staleness mean nothing to the engine's timers (milliseconds,
        // RNR's tens of microseconds at least), and a read per datagram
        // was 2-3% of a receiver's time in a stream (host, perf).
        let mut clock: Option<(Instant, usize)> = None;
        while let Some(p) = ll.own.pop_aligned(buf) {
            r.handled += 1;
            // The datagram, placed with the alignment it had in the ring.
            let buf = &mut buf[p.at..];
            let tracing = self.tracing.load(Ordering::Relaxed);
            if let (Some((at, n)), Some(from), true) = (p.elided, p.placed, tracing) {
                // The tracer shows the packet whole: its payload, left out
                // of the record, is where its sender placed it in our
                // memory (zeros if that address is not readable).
                if !HostMemory::read_checked(from, &mut buf[at..at + n]) {
                    buf[at..at + n].fill(0);
                }
            }
            if p.icrc == local_link::Icrc::Unwritten && tracing {
                // The tracer shows the packet whole: write the ICRC its
                // sender left out, with the addresses it would have used.
                let info = wire::icrc::IpUdpInfo {
                    src: self.cfg.addr,
                    dst: self.cfg.addr,
                    src_port: p.src_port,
                    dst_port: wire::ROCEV2_UDP_PORT,
                    ipv4_id: 0,
                    ipv4_flags_frag: 0x4000,
                };
                wire::icrc::write(&info, &mut buf[..p.len]);
            }
            let now = match clock {
                Some((t, n)) if n < CLOCK_EVERY => {
                    clock = Some((t, n + 1));
                    t
                }
                _ => {
                    let t = self.now();
                    self.local_rx.store(t.as_nanos(), Ordering::Relaxed);
                    clock = Some((t, 1));
                    t
                }
            };
            let dg = RxDatagram {
                src: self.cfg.addr,
                dst: self.cfg.addr,
                src_port: p.src_port,
                dst_port: wire::ROCEV2_UDP_PORT,
                ipv4_id: None,
                payload: &buf[..p.len],
                ecn: rxe_core::Ecn::from_tos(p.tos),
            };
            if tracing {
                self.trace_packet('r', &rx_info(&dg), dg.payload, p.tos);
            }
            if let Some(h) = p.hint {
                // A READ request whose responses we may place into its
                // requester (taken as new by our engine).
                ll.note_read_request(e, dg.payload, p.ring, h);
            }
            if let Some(at) = p.placed {
                let len = wire::PacketRepr::parse(dg.payload).map_or(0, |p| p.payload.len());
                if p.elided.is_some() {
                    e.mem_mut().expect_placed_elided(at, len);
                } else {
                    e.mem_mut().expect_placed(at, len);
                }
            }
            if p.icrc == local_link::Icrc::Unchecked {
                e.handle_datagram(now, &dg);
            } else {
                e.handle_intact_datagram(now, &dg);
            }
            if p.placed.is_some() && !e.mem_mut().end_placed() {
                // Checked and refused (or not written where it was
                // placed): the bytes are in memory the sender was allowed
                // to write, as after a WRITE that failed (IBTA: the
                // target's contents are then undefined).
                self.placed_refused.fetch_add(1, Ordering::Relaxed);
            }
            ll.publish_responder(e, &buf[..p.len]);
            self.flush_with(e, r.app);
            if r.polled.is_some_and(|cq| e.cq_len(cq) > 0) {
                return true;
            }
        }
        let bad = ll.own.take_dropped();
        if bad > 0 {
            e.note_malformed(bad);
        }
        false
    }

    /// Read every datagram `sock` holds into the engine; `dst` is the
    /// address they were sent to (the device's, or a multicast group's,
    /// which selects the group's members).
    /// Returns whether it stopped because `polled` holds a completion.
    fn drain_socket(
        &self,
        e: &mut Engine<HostMemory>,
        sock: &UdpSocket,
        dst: IpAddr,
        buf: &mut [u8],
        r: &mut Round,
    ) -> bool {
        // The device's own socket reports each datagram's TOS on a
        // ConnectX-like device; multicast sockets never (packets delivered
        // by multicast draw no CNP).
        let with_tos = self.recv_tos && std::ptr::eq(sock, &self.socket);
        loop {
            let got = if with_tos {
                crate::sys::recv_with_tos(sock.as_raw_fd(), buf)
            } else {
                sock.recv_from(buf).map(|(n, src)| (n, src, 0))
            };
            let (n, src, tos) = match got {
                Ok(x) => x,
                Err(err) if err.kind() == io::ErrorKind::Interrupted => continue,
                // WouldBlock: nothing more. Other errors (ICMP reports on
                // some paths) are loss to the transport.
                Err(_) => return false,
            };
            r.handled += 1;
            let dg = RxDatagram {
                src: src.ip(),
                dst,
                src_port: src.port(),
                dst_port: wire::ROCEV2_UDP_PORT,
                ipv4_id: None,
                payload: &buf[..n],
                ecn: rxe_core::Ecn::from_tos(tos),
            };
            if dst == self.cfg.addr {
                self.udp_seen
                    .store(self.now().as_nanos().max(1), Ordering::Relaxed);
            }
            if self.tracing.load(Ordering::Relaxed) {
                self.trace_packet('r', &rx_info(&dg), dg.payload, tos);
            }
            e.handle_datagram(self.now(), &dg);
            // Send what it produced before reading more, so a burst of
            // requests cannot pile up responses in memory.
            self.flush_with(e, r.app);
            if r.polled.is_some_and(|cq| e.cq_len(cq) > 0) {
                return true;
            }
        }
    }

    /// Read what the multicast sockets hold into the engine.
    fn progress_multicast(&self, e: &mut Engine<HostMemory>, buf: &mut [u8], r: &mut Round) {
        if !self.mcast_on.load(Ordering::Acquire) {
            return;
        }
        let groups = self.mcast.lock().unwrap_or_else(|p| p.into_inner());
        for (group, sock) in groups.iter() {
            if self.drain_socket(e, sock, *group, buf, r) {
                return;
            }
        }
    }

    /// Start receiving multicast group `gid` (its first QP here attached).
    pub(crate) fn join_mcast(&self, gid: [u8; 16]) -> Result<()> {
        let group = rxe_core::gid_to_ip(gid);
        let sock = join_group(group, self.cfg.addr).map_err(|e| {
            Error::Io(format!(
                "cannot receive multicast group {group} on {}: {e}",
                self.cfg.addr
            ))
        })?;
        let mut groups = self.mcast.lock().unwrap_or_else(|p| p.into_inner());
        groups.push((group, sock));
        self.mcast_on.store(true, Ordering::Release);
        drop(groups);
        // The progress thread waits on the new socket from its next round.
        self.wake();
        Ok(())
    }

    /// Stop receiving group `gid` (its last QP here detached).
    pub(crate) fn leave_mcast(&self, gid: [u8; 16]) {
        let group = rxe_core::gid_to_ip(gid);
        let mut groups = self.mcast.lock().unwrap_or_else(|p| p.into_inner());
        groups.retain(|(g, _)| *g != group);
        self.mcast_on.store(!groups.is_empty(), Ordering::Release);
    }

    /// The application polls: it drives the device itself until
    /// [`APP_POLL_GRACE`] after this call.
    ///
    /// `may_leave`: the poll returned a completion of a QP that has no
    /// other work outstanding (no send WR in flight, no receive posted),
    /// so the application has no reason to poll again and may now wait
    /// for something else: ib_write_lat's next step is to watch memory
    /// for the peer's WRITE, which nobody would place while this thread
    /// sleeps off the socket. The progress thread then goes back to the
    /// socket at once (it is woken if it sleeps off it). Measured on the
    /// 2-core host: ib_write_lat 160 µs typical before, 27-31 µs after;
    /// ib_read_lat 34 µs before, 6.5-7 µs after; ib_send_lat unchanged
    /// (4.6-4.9 µs):
    /// its completions belong to a QP with receives posted, so no wake.
    ///
    /// With an inbox, the thread is not woken: the inbox asks senders to
    /// kick it ([`local_link::Inbox::kick_me`]) and the thread, sleeping
    /// off the socket, watches the kick. A datagram then wakes it, and an
    /// application that posts or polls again first (ib_read_lat's next
    /// step is its next READ) costs no wake at all: in the TCG guest,
    /// where a wake is about 100 µs of a CPU the applications spin on,
    /// ib_read_lat went from 41-64 µs typical (avg 124-148) to 33-36
    /// (avg 53-75) in interleaved runs (2026-11-26).
    ///
    /// Returns whether this poll is the one after which the application
    /// may have stopped polling (`may_leave`, not said before).
    pub(crate) fn note_app_poll(&self, may_leave: bool) -> bool {
        self.note_app_poll_at(may_leave, local_link::monotonic_ns())
    }

    /// [`Inner::note_app_poll`] at `mono` (CLOCK_MONOTONIC). A poll that
    /// changes nothing (the application still polls) within
    /// [`STAMP_EVERY`] of the last stamp writes nothing: its readers look
    /// at 1 ms windows, and each stamp was a locked store here and a cache
    /// line every sender then read from this process.
    pub(crate) fn note_app_poll_at(&self, may_leave: bool, mono: u64) -> bool {
        let stamp = self.at(mono).as_nanos().max(1);
        let last = self.last_app_poll.load(Ordering::Relaxed);
        if !may_leave
            && last != 0
            && stamp.saturating_sub(last) < STAMP_EVERY.as_nanos() as u64
            && !self.app_left.load(Ordering::Relaxed)
        {
            return false;
        }
        self.last_app_poll.store(stamp, Ordering::SeqCst);
        self.app_armed.store(false, Ordering::Relaxed);
        self.push_look(mono);
        let was_left = self.app_left.swap(may_leave, Ordering::SeqCst);
        let left_now = may_leave && !was_left;
        if let Some(l) = &self.local {
            // Senders kick this process once its application has not
            // polled for `POLL_STALE`, so that the progress thread, which
            // keeps off while it polls, need not look often.
            if may_leave {
                l.own.note_poll(mono);
            } else {
                self.left_spin.store(false, Ordering::SeqCst);
                // It takes what comes: no kicks for a thread that went to
                // sleep on the inbox before it polled (`note_app_post`).
                l.own.app_active(mono, 0);
            }
            if left_now {
                // Kicks this process owes for datagrams its peers have
                // taken since are not: its progress thread need not wake
                // for them once this application stops polling.
                l.forget_taken();
                if !l.own.kick_me() {
                    // A datagram came before the inbox asked for kicks:
                    // this poll takes it (in a ping-pong, the peer's next
                    // message, which the application is about to see).
                    // Waking the progress thread instead cost a context
                    // switch on a CPU the applications spin on.
                    crate::device::with_rx_buf(|b| self.progress(b, true, None));
                }
                // Those still owed go when due, by the progress thread.
                if let Some(at) = l.left_due() {
                    self.left_with_kicks_owed(at);
                }
            } else if !may_leave && was_left {
                l.own.polling_again();
            }
            // A datagram by UDP (a peer on another device) still needs
            // the thread on the socket: wake it if it sleeps off it.
            if !(left_now && self.udp_in_use(self.now())) {
                return left_now;
            }
        }
        if left_now && self.spin_sleeping.load(Ordering::SeqCst) {
            self.wake();
        }
        left_now
    }

    /// An application polled at `mono` (CLOCK_MONOTONIC ns): the progress
    /// thread, keeping off while it polls, need not look whether it still
    /// does until [`MAX_SPIN_WAIT`] after this poll. Once less than half
    /// of that is left on the look timer, the poll sets it again (a system
    /// call every 100 ms or more of polling, on the application's own
    /// CPU). Looks at fixed times preempted the application they looked
    /// at, in the TCG guest 0.3-0.5 ms each, two or three per
    /// `ib_write_lat -n 5000`; an application that stops polling is looked
    /// at as late as before, at most [`MAX_SPIN_WAIT`] after its last poll.
    fn push_look(&self, mono: u64) {
        let due = self.look_due.load(Ordering::Relaxed);
        let span = MAX_SPIN_WAIT.as_nanos() as u64;
        if due == 0 || due.saturating_sub(mono) > span / 2 {
            return;
        }
        let next = mono + span;
        if self
            .look_due
            .compare_exchange(due, next, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
        {
            // Should the timer not take it, it fires when it was set to:
            // a look that finds the application still polling.
            let _ = self.set_look_timer(next);
        }
    }

    /// Set the look timer to fire at `mono` (CLOCK_MONOTONIC ns). Setting
    /// it also clears an expiry nobody read.
    fn set_look_timer(&self, mono: u64) -> Option<std::os::fd::RawFd> {
        use nix::sys::time::TimeSpec;
        use nix::sys::timerfd::{Expiration, TimerSetTimeFlags};
        use std::os::fd::{AsFd, AsRawFd};
        let t = self.look_timer.as_ref()?;
        let at = TimeSpec::from_duration(Duration::from_nanos(mono));
        t.set(
            Expiration::OneShot(at),
            TimerSetTimeFlags::TFD_TIMER_ABSTIME,
        )
        .ok()?;
        Some(t.as_fd().as_raw_fd())
    }

    /// The progress thread is about to wait while an application polls,
    /// for nothing but its look ([`Inner::push_look`]): returns the look
    /// timer's fd, set [`MAX_SPIN_WAIT`] from now, or `None` if there is
    /// no timer (the wait then times out as before).
    fn arm_look(&self) -> Option<std::os::fd::RawFd> {
        let due = local_link::monotonic_ns() + MAX_SPIN_WAIT.as_nanos() as u64;
        let fd = self.set_look_timer(due)?;
        self.look_due.store(due, Ordering::SeqCst);
        Some(fd)
    }

    /// The application may have stopped polling while kicks this process
    /// owes consumers that may have stopped polling too wait for their
    /// time (`LocalLink::left_due`, `at` CLOCK_MONOTONIC ns): nobody but
    /// the progress thread sends them now. A thread that keeps off for
    /// the application, or sleeps past `at`, waits without them in view,
    /// so it is woken (it then waits until `at`).
    fn left_with_kicks_owed(&self, at: u64) {
        let until = self.sleeping_until.load(Ordering::Acquire);
        if self.spin_sleeping.load(Ordering::SeqCst)
            || (until != 0 && self.at(at).as_nanos() < until)
        {
            self.wake();
        }
    }

    /// The application may have stopped polling (its last completion left
    /// nothing to wait for on its QP) with an engine timer set (another
    /// QP's): a progress thread that keeps off for a polling application
    /// does not watch the engine's timers (the application fires them),
    /// so it is woken to watch them now.
    pub(crate) fn left_with_timers(&self) {
        if self.spin_sleeping.load(Ordering::SeqCst) {
            self.wake();
        }
    }

    /// The progress thread, about to keep off for an application that may
    /// have left ([`Inner::left_but_posting`]): mark its inbox so that
    /// senders kick, and its posts leave the mark. Returns false if a
    /// datagram is already waiting, which nobody will take but this thread.
    fn mark_left_spin(&self) -> bool {
        let Some(l) = &self.local else { return true };
        self.left_spin.store(true, Ordering::SeqCst);
        let quiet = l.own.kick_me();
        if !self.app_left.load(Ordering::SeqCst) {
            // It polled meanwhile: its polls take what comes.
            self.left_spin.store(false, Ordering::SeqCst);
            l.own.polling_again();
            return true;
        }
        quiet
    }

    /// See [`Inner::app_spinning`].
    fn left_but_posting(&self, now: Instant) -> bool {
        let posted = self.last_app_post.load(Ordering::Relaxed);
        self.local.is_some()
            && !self.udp_in_use_at(now)
            && !self.mcast_on.load(Ordering::Acquire)
            && posted != 0
            && now.as_nanos().saturating_sub(posted) < APP_POLL_GRACE.as_nanos() as u64
    }

    /// The application is about to sleep (it armed a CQ): the progress
    /// thread takes the socket back at once.
    pub(crate) fn hand_off(&self) {
        self.app_armed.store(true, Ordering::Relaxed);
        self.last_app_poll.store(0, Ordering::SeqCst);
        if self.spin_sleeping.load(Ordering::SeqCst) {
            self.wake();
        } else if let Some(l) = &self.local {
            // A thread asleep on the inbox while the application was
            // active (`Inbox::app_active`) is kicked again from now on.
            if self.sleeping_until.load(Ordering::Acquire) != 0 && !l.own.app_sleeps() {
                self.wake();
            }
        }
    }

    /// Whether an application polled within the grace period.
    /// One whose last poll may have been its last (`app_left`) is taken to
    /// poll on while it posted within [`APP_POLL_GRACE`], on a device whose
    /// traffic all goes through inboxes: in a ping-pong it comes back at
    /// once (ib_write_lat's spins on memory for its peer's WRITE, then posts
    /// and polls). Its inbox asks for kicks meanwhile (`Inbox::kick_me`), so
    /// what comes before it is back still wakes this thread. Taking such an
    /// application for gone sent this thread to sleep on its inbox, and the
    /// next datagram of the ping-pong kicked it: in the TCG guest most of
    /// `ib_write_lat`'s progress-thread wakes, each 100-300 µs of a CPU an
    /// application spins on. UDP (which the thread watches only while the
    /// application is gone) and multicast keep the rule strict.
    fn app_spinning(&self, now: Instant) -> Option<Instant> {
        if self.app_left.load(Ordering::SeqCst) && !self.left_but_posting(now) {
            return None;
        }
        let polled = self.last_app_poll.load(Ordering::SeqCst);
        let until = Instant::from_nanos(polled) + APP_POLL_GRACE;
        (polled != 0 && now < until).then_some(until)
    }

    /// Whether the daemon connection ended (or sent something it should
    /// not): then fail the device once.
    fn check_control(&self) {
        let Some(c) = &self.control else { return };
        if self
            .failed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_some()
        {
            return;
        }
        let mut gone;
        let mut lines = Vec::new();
        {
            let mut buf = self.control_buf.lock().unwrap_or_else(|p| p.into_inner());
            let mut b = [0u8; 1024];
            loop {
                match (&*c).read(&mut b) {
                    Ok(0) => {
                        gone = true;
                        break;
                    }
                    Ok(n) => buf.extend_from_slice(&b[..n]),
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) => {
                        gone = e.kind() != io::ErrorKind::WouldBlock;
                        break;
                    }
                }
            }
            while let Some(nl) = buf.iter().position(|&x| x == b'\n') {
                let l: Vec<u8> = buf.drain(..=nl).collect();
                lines.push(String::from_utf8_lossy(&l).trim().to_string());
            }
            if buf.len() > 65536 {
                // Whole lines were taken above: what is left is one line
                // longer than any request the daemon sends.
                gone = true; // not the daemon we know
            }
        }
        let mut why =
            "rxe-emud, which hosts this device, stopped or closed the connection".to_string();
        for l in lines {
            // The daemon says why before it ends the connection (the
            // device was deleted).
            if let Some(reason) = l.strip_prefix("GONE ") {
                why = format!("rxe-emud: {reason}");
                gone = true;
                continue;
            }
            self.daemon_request(&l);
        }
        if gone {
            *self.failed.lock().unwrap_or_else(|p| p.into_inner()) = Some(why.clone());
            let mut e = self.lock();
            e.fail_device(&why);
            self.flush(&mut e);
        }
    }

    /// Answer a request of the daemon (for `rxe-emu stat`, `qp show` and
    /// `fault`): `R <tag> ...` lines, then `R <tag> END`. Unknown requests
    /// (a newer daemon) are answered with END alone.
    fn daemon_request(&self, line: &str) {
        let mut w = line.splitn(3, ' ');
        let (kind, tag, rest) = (w.next().unwrap_or(""), w.next().unwrap_or("0"), w.next());
        let mut out = Vec::new();
        match kind {
            "STAT" => {
                // The device's counters, then each QP's share of them.
                let e = self.lock();
                let mut l = format!("pid={}", std::process::id());
                for (k, v) in e.counters().iter() {
                    l += &format!(" {k}={v}");
                }
                // Which way the datagrams went: this process's inbox path
                // to the device's other processes (and how many of their
                // inboxes it has open), or UDP.
                l += &format!(
                    " sent_inbox_pkts={} sent_udp_pkts={} peer_inboxes={} fault_ce_marked={} fault_queue_dropped={}",
                    self.sent_inbox.load(Ordering::Relaxed),
                    self.sent_udp.load(Ordering::Relaxed),
                    self.local.as_ref().map_or(0, |l| l.peer_inboxes()),
                    self.fault_ce.load(Ordering::Relaxed),
                    self.fault_queue_drops.load(Ordering::Relaxed)
                );
                // Who woke whom: this process's progress thread, and its
                // kicks to the device's processes (itself included).
                l += &format!(
                    " progress_wakeups={} wake_requests={} progress_looks={} inbox_kicks={}",
                    self.progress_wakeups.load(Ordering::Relaxed),
                    self.wake_requests.load(Ordering::Relaxed),
                    self.progress_looks.load(Ordering::Relaxed),
                    self.local.as_ref().map_or(0, |l| l.kicks())
                );
                // WRITEs whose payload this process wrote into a peer's
                // memory itself (of them, how many by a copy into the
                // peer's shared MR pages), placed WRITEs to this process
                // that its engine then refused, and the bytes of this
                // process's MR pages in shared memory.
                l += &format!(
                    " placed_writes={} placed_reads={} placed_shared={} placed_refused={} placed_via={} shared_mr_bytes={}",
                    self.local.as_ref().map_or(0, |l| l.placed()),
                    self.local.as_ref().map_or(0, |l| l.placed_reads()),
                    local_link::placed_shared(),
                    self.placed_refused.load(Ordering::Relaxed),
                    local_link::placement_way(),
                    local_link::shared_mr::shared_bytes()
                );
                out.push(l);
                for q in e.qp_summaries() {
                    let mut l = format!("qp={:#x} type={:?}", q.qpn, q.qp_type);
                    for (k, v) in q.counters.iter() {
                        l += &format!(" {k}={v}");
                    }
                    out.push(l);
                }
            }
            "QPS" => {
                let e = self.lock();
                let mlx5 = e.cc_config().model == rxe_core::CcModel::Mlx5Like;
                for q in e.qp_summaries() {
                    // A ConnectX-like device's DCQCN state of the QP.
                    let cc = e.qp_cc(q.qpn).filter(|_| mlx5).map_or(String::new(), |c| {
                        format!(
                            " rate_mbps={:.3} target_mbps={:.3} alpha={:.3} dcqcn={}",
                            c.current_rate_bps as f64 / 1e6,
                            c.target_rate_bps as f64 / 1e6,
                            f64::from(c.alpha) / 1024.0,
                            if c.reacting { "reacting" } else { "idle" }
                        )
                    });
                    out.push(format!(
                        "pid={} qpn={:#x} type={:?} state={:?} dqpn={:#x} peer={} sq_psn={:#x} unacked_psn={:#x} rq_psn={:#x} send_wrs={} recv_wrs={}{cc}{}",
                        std::process::id(),
                        q.qpn,
                        q.qp_type,
                        q.state,
                        q.dest_qpn,
                        q.peer.map_or("-".to_string(), |p| p.to_string()),
                        q.sq_psn,
                        q.unacked_psn,
                        q.rq_psn,
                        q.send_wrs,
                        q.recv_wrs,
                        q.error.map_or(String::new(), |e| format!(" error={e}"))
                    ));
                }
            }
            "CC" => {
                // The device's whole parameter set: the defaults with
                // these `name=value` overrides, in order.
                let parsed: std::result::Result<Vec<(&str, u64)>, String> = rest
                    .unwrap_or("")
                    .split_whitespace()
                    .map(|kv| {
                        let (k, v) = kv
                            .split_once('=')
                            .ok_or_else(|| format!("cc: {kv:?} is not name=value"))?;
                        let v = v
                            .parse()
                            .map_err(|_| format!("cc: {k}={v} is not a number"))?;
                        Ok((k, v))
                    })
                    .collect();
                match parsed.and_then(|o| {
                    rxe_core::CcParams::with_overrides(o).map_err(|e| format!("cc: {e}"))
                }) {
                    Ok(p) => {
                        self.lock().set_cc_params(p);
                        out.push("OK".into());
                    }
                    Err(e) => out.push(format!("ERR {e}")),
                }
            }
            "TRACE" => {
                let on = rest == Some("on");
                *self.trace_tag.lock().unwrap_or_else(|p| p.into_inner()) = tag.to_string();
                self.tracing.store(on, Ordering::SeqCst);
                if let Some(ll) = &self.local {
                    ll.set_tracing(on);
                }
                self.lock().set_tracing(on);
                return;
            }
            "FAULT" => match FaultConfig::parse(rest.unwrap_or("")) {
                Ok(f) => {
                    let mut eng = self.lock();
                    let old = {
                        let mut faults = self.faults.lock().unwrap_or_else(|p| p.into_inner());
                        let mut new = (!f.is_off()).then(|| Faults::new(f));
                        let mut old = faults.take();
                        // Datagrams already delayed keep their due time
                        // under a new delay or queue, and leave now
                        // without one: a change of faults loses nothing by
                        // itself.
                        if let (Some(n), Some(o)) = (new.as_mut(), old.as_mut()) {
                            if n.holds_back() {
                                n.delayed = std::mem::take(&mut o.delayed);
                            }
                        }
                        if new.is_some() {
                            self.faults_ever.store(true, Ordering::SeqCst);
                        }
                        self.faults_on.store(new.is_some(), Ordering::Release);
                        *faults = new;
                        old
                    };
                    if let Some(o) = old {
                        for t in o.delayed.into_iter().map(|(_, t)| t).chain(o.held) {
                            self.send(&mut eng, t);
                        }
                    }
                    drop(eng);
                    out.push("OK".into());
                }
                Err(e) => out.push(format!("ERR {e}")),
            },
            _ => {}
        }
        let mut text = String::new();
        for l in out {
            text += &format!("R {tag} {l}\n");
        }
        text += &format!("R {tag} END\n");
        self.to_daemon(&text);
    }

    /// Which of `fds`, just waited on, the wait found not readable
    /// (`mask`: [`crate::sys::wait_readable_mask`]'s answer; `None` knows
    /// nothing).
    fn quiet_after(&self, fds: &[std::os::fd::RawFd], mask: Option<u64>) -> Quiet {
        let Some(mask) = mask else {
            return Quiet::default();
        };
        let quiet = |fd: std::os::fd::RawFd| {
            fds.iter()
                .take(64)
                .enumerate()
                .any(|(i, f)| *f == fd && mask & 1 << i == 0)
        };
        Quiet {
            pipe: quiet(self.wake_rx.as_raw_fd()),
            control: self.control.as_ref().is_some_and(|c| quiet(c.as_raw_fd())),
            socket: quiet(self.socket.as_raw_fd()),
            kick: self.local.as_ref().is_some_and(|l| quiet(l.own.event_fd())),
        }
    }

    /// The fds to wait on: the wake pipe, the daemon connection until it
    /// has ended (after that it is always readable) and, with `data`, the
    /// socket and the multicast sockets.
    fn watched(&self, data: bool) -> Vec<std::os::fd::RawFd> {
        let mut fds = vec![self.wake_rx.as_raw_fd()];
        let failed = self
            .failed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_some();
        if let Some(c) = self.control.as_ref().filter(|_| !failed) {
            fds.push(c.as_raw_fd());
        }
        if data {
            fds.push(self.socket.as_raw_fd());
            if let Some(ll) = &self.local {
                fds.push(ll.own.event_fd());
            }
        } else if self.local.is_some() && !self.udp_in_use(self.now()) {
            // An application polls, but reads only its inbox: UDP is
            // this thread's to watch.
            fds.push(self.socket.as_raw_fd());
        }
        if data && self.mcast_on.load(Ordering::Acquire) {
            let groups = self.mcast.lock().unwrap_or_else(|p| p.into_inner());
            fds.extend(groups.iter().map(|(_, s)| s.as_raw_fd()));
        }
        fds
    }

    /// `Err` once the device has failed (its daemon is gone).
    pub(crate) fn check_alive(&self) -> Result<()> {
        match &*self.failed.lock().unwrap_or_else(|p| p.into_inner()) {
            Some(why) => Err(Error::Io(format!("device {}: {why}", self.cfg.name))),
            None => Ok(()),
        }
    }

    fn progress_loop(self: Arc<Self>) {
        let mut buf = vec![0u8; RX_BUF];
        let mut wbuf = [0u8; 64];
        crate::sys::set_timer_slack_1ns();
        // Set when the last round ended with a datagram found by spinning
        // on the inbox (the thread never slept), and when this thread last
        // read its wake pipe and the daemon's connection.
        let mut spun = false;
        let mut looked = self.now();
        // What the last wait found not readable: this round does not read
        // it (each read that finds nothing is a system call, tens of
        // microseconds of a woken thread in the TCG guest). What became
        // readable since ends the next wait at once.
        let mut quiet = Quiet::default();
        while !self.stop.load(Ordering::SeqCst) {
            let q = std::mem::take(&mut quiet);
            // Two system calls each round: a responder that serves a
            // datagram per round (ib_read_lat's server, a stream's
            // receiver) makes them only every HOUSEKEEPING while it spins.
            // A wake left in the pipe ends a later wait early, once.
            let now = self.now();
            if !spun || now.saturating_duration_since(looked) >= HOUSEKEEPING {
                looked = now;
                if !q.pipe {
                    while self.wake_rx.recv(&mut wbuf).is_ok() {}
                }
                if !q.control {
                    self.check_control();
                }
                self.flush_control_out();
            }
            spun = false;
            // While an application spins on poll it reads the socket, fires
            // timers and sends held responses itself: stay off the core and
            // the lock (a wake preempts a spinning thread on a small
            // machine), and look again when its grace period ends or when
            // it arms a CQ to sleep.
            if let Some(until) = self.app_spinning(self.now()) {
                self.spin_sleeping.store(true, Ordering::SeqCst);
                // A hand-off between the check above and the flag's store
                // saw no flag and sent no wake: check again after it.
                let mut woken = false;
                // What an application that may have left leaves in its
                // inbox is this thread's to take.
                let mut waiting = false;
                if self.app_spinning(self.now()).is_none() || self.stop.load(Ordering::SeqCst) {
                    // Not polling any more: the loop serves it.
                } else if self.app_left.load(Ordering::SeqCst) && !self.mark_left_spin() {
                    waiting = true;
                    woken = true;
                } else {
                    let now = self.now();
                    // UDP that the application reads itself while it
                    // polls, and multicast, are not watched here: nothing
                    // kicks for them, so look as often as before.
                    let longest =
                        if self.udp_in_use(self.now()) || self.mcast_on.load(Ordering::Acquire) {
                            MAX_SPIN_WAIT_UDP
                        } else {
                            MAX_SPIN_WAIT
                        };
                    let wait = until.saturating_duration_since(now).max(longest);
                    let wait = if self.local.as_ref().is_some_and(|l| l.has_pending()) {
                        wait.min(PENDING_RETRY)
                    } else {
                        wait
                    };
                    // Should the application stop polling now, what it
                    // would have sent is not late by a whole
                    // MAX_SPIN_WAIT: held responses.
                    let wait = if self.has_deferred() {
                        wait.min(APP_POLL_GRACE)
                    } else {
                        wait
                    };
                    // The engine's timers are the application's to fire
                    // while it polls: a wake at a retransmission deadline
                    // (which each acknowledgement then moves) found it
                    // fired or moved, and took the CPU from a spinning
                    // application (ftrace, TCG guest: one wake per
                    // process every 67 ms of `ib_write_lat`, 300-600 µs
                    // each). Only one that may have left has them watched
                    // here; one that leaves with a timer set wakes this
                    // thread (`Inner::left_with_timers`).
                    // So are the kicks this process owes consumers whose
                    // applications may have stopped polling
                    // (`LocalLink::left_due`): its polls send them.
                    let timers = if self.app_left.load(Ordering::SeqCst) {
                        let left_due = self
                            .local
                            .as_ref()
                            .and_then(|l| l.left_due())
                            .map(|at| self.at(at));
                        match (self.lock().poll_timeout(), left_due) {
                            (Some(a), Some(b)) => Some(a.min(b)),
                            (a, b) => a.or(b),
                        }
                    } else {
                        None
                    };
                    let deadline = match (timers, self.next_due()) {
                        (Some(a), Some(b)) => Some(a.min(b)),
                        (a, b) => a.or(b),
                    };
                    let wait = match deadline {
                        Some(d) => wait.min(d.saturating_duration_since(now).max(APP_POLL_GRACE)),
                        None => wait,
                    };
                    let mut fds = self.watched(false);
                    // Kicks, once the application may have stopped
                    // polling (`note_app_poll`); none come before.
                    let kick = self.local.as_ref().map(|l| l.own.event_fd());
                    fds.extend(kick);
                    // A wait that only a look would end ends at the look
                    // timer, which the application's polls push on
                    // (`Inner::push_look`). Lines for the daemon that its
                    // connection did not take are written at a look.
                    let look = if wait >= MAX_SPIN_WAIT && self.control_out_empty() {
                        self.arm_look()
                    } else {
                        None
                    };
                    fds.extend(look);
                    let timeout = if look.is_some() { None } else { Some(wait) };
                    let mask = crate::sys::wait_readable_mask(&fds, timeout);
                    if look.is_some() {
                        self.look_due.store(0, Ordering::SeqCst);
                    }
                    let look_bit = look.map_or(0, |_| 1u64 << (fds.len() - 1));
                    let ready = mask.unwrap_or(0) & !look_bit;
                    if ready != 0 {
                        self.progress_wakeups.fetch_add(1, Ordering::Relaxed);
                    } else if mask.is_some() {
                        self.progress_looks.fetch_add(1, Ordering::Relaxed);
                    }
                    quiet = self.quiet_after(&fds, mask);
                    let is_ready = |fd: std::os::fd::RawFd| {
                        fds.iter()
                            .enumerate()
                            .any(|(i, f)| *f == fd && ready & 1 << i != 0)
                    };
                    if let (Some(fd), Some(l)) = (kick, &self.local) {
                        if is_ready(fd) {
                            l.own.sleep_end();
                            woken = true;
                        }
                    }
                    // A UDP datagram the polling application leaves to us
                    // (it reads only its inbox). Nothing else here takes
                    // the engine lock from the application.
                    woken |= is_ready(self.socket.as_raw_fd());
                    // A wake request (`Inner::wake`): an application
                    // that may have left with a timer set, responses held
                    // for a poll that may not come, a group joined.
                    woken |= is_ready(self.wake_rx.as_raw_fd());
                }
                self.spin_sleeping.store(false, Ordering::SeqCst);
                self.left_spin.store(false, Ordering::SeqCst);
                if let Some(l) = &self.local {
                    l.note_time(local_link::monotonic_ns());
                    l.rekick();
                }
                if woken {
                    // The socket is read only if the wait said it is
                    // readable, or did not watch it (the application
                    // reads it while it polls). An inbox found waiting
                    // comes with no UDP in use (`left_but_posting`): the
                    // socket is watched, and a datagram ends the next wait.
                    self.progress_quiet(&mut buf, false, None, quiet.socket || waiting);
                }
                continue;
            }
            self.progress_quiet(&mut buf, false, None, q.socket);
            let deadline = match (self.lock().poll_timeout(), self.next_due()) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            // Check `stop` only after draining the wake pipe: a wake sent
            // after this check stays in the pipe and ends the wait below.
            if self.stop.load(Ordering::SeqCst) {
                break;
            }
            let now = self.now();
            let wait = deadline
                .map_or(Duration::from_secs(1), |d| d.saturating_duration_since(now))
                .min(Duration::from_secs(1));
            if wait == Duration::ZERO {
                continue;
            }
            // Responses held by an application's poll go out at its next
            // poll, or here if it stopped polling.
            let wait = if self.has_deferred() {
                wait.min(APP_POLL_GRACE)
            } else {
                wait
            };
            let wait = if self.local.as_ref().is_some_and(|l| l.has_pending()) {
                wait.min(PENDING_RETRY)
            } else {
                wait
            };
            // Kicks owed to consumers whose applications may have
            // stopped polling (`LocalLink::left_due`).
            let wait = match self.local.as_ref().and_then(|l| l.left_due()) {
                Some(at) => wait.min(self.at(at).saturating_duration_since(now)),
                None => wait,
            };
            let posted = self.last_app_post.load(Ordering::Relaxed);
            let wait = if posted != 0
                && now.as_nanos().saturating_sub(posted) < APP_TICK.as_nanos() as u64
            {
                wait.min(APP_TICK)
            } else {
                wait
            };
            self.sleeping_until
                .store((now + wait).as_nanos().max(1), Ordering::Release);
            // A deadline set after `deadline` was read but before
            // `sleeping_until` was published did not wake us: look once more.
            // Producers kick this process's inbox only while it says it
            // sleeps; a datagram that came before it said so is read now.
            if self.spin_for_inbox() {
                self.sleeping_until.store(0, Ordering::Release);
                spun = true;
                continue;
            }
            let inbox_quiet = self.local.as_ref().is_none_or(|l| l.own.sleep_begin());
            if inbox_quiet && self.lock().poll_timeout().is_none_or(|d| d >= now + wait) {
                let fds = self.watched(true);
                let mask = crate::sys::wait_readable_mask(&fds, Some(wait));
                if mask.is_some_and(|m| m != 0) {
                    self.progress_wakeups.fetch_add(1, Ordering::Relaxed);
                }
                quiet = self.quiet_after(&fds, mask);
            }
            if let Some(l) = &self.local {
                if inbox_quiet {
                    if quiet.kick {
                        // Not kicked when the wait ended: nothing to read
                        // from the eventfd (a kick since ends the next
                        // wait at once, and is read then).
                        l.own.sleep_end_unkicked();
                    } else {
                        l.own.sleep_end();
                    }
                }
            }
            self.sleeping_until.store(0, Ordering::Release);
        }
    }
}

/// The addresses of a received datagram, for the tracer.
fn rx_info(dg: &RxDatagram<'_>) -> wire::icrc::IpUdpInfo {
    wire::icrc::IpUdpInfo {
        src: dg.src,
        dst: dg.dst,
        src_port: dg.src_port,
        dst_port: dg.dst_port,
        ipv4_id: 0,
        ipv4_flags_frag: 0x4000,
    }
}

/// Whether a datagram built by the engine is a response (ACK, NAK, READ
/// response, atomic ACK): an opcode without the request flag.
fn is_response(payload: &[u8]) -> bool {
    payload
        .first()
        .and_then(|&op| wire::Opcode(op).info())
        .is_some_and(|i| !i.flags.contains(wire::OpFlags::REQ))
}

pub use rxe_core::gid_table;

impl Device {
    /// Open a device on `cfg.addr`, owning UDP port 4791 there.
    pub fn open(cfg: DeviceConfig) -> Result<Device> {
        let mtu = Mtu::for_netdev_mtu(cfg.netdev_mtu).ok_or_else(|| {
            Error::Config(format!(
                "netdev MTU {} is too small for RoCEv2 (needs 336)",
                cfg.netdev_mtu
            ))
        })?;
        let socket = bind_udp(SocketAddr::new(cfg.addr, wire::ROCEV2_UDP_PORT)).map_err(|e| {
            Error::Io(format!(
                "cannot bind UDP {}:{}: {e} (is another RoCE device or rdma_rxe using it?)",
                cfg.addr,
                wire::ROCEV2_UDP_PORT
            ))
        })?;
        let mut ecfg = EngineConfig::new(cfg.addr);
        ecfg.key_seed = std::process::id() as u64 ^ 0x5eed;
        Self::start(cfg, mtu, socket, ecfg, None, None)
    }

    /// Open device `name` of the `rxe-emud` daemon listening at `socket`
    /// (default: [`emulator_daemon::default_socket_path`]). The daemon
    /// gives this process a slot of the device: the UDP socket its QPNs
    /// are steered to, a QPN range and a key space of its own. The engine
    /// runs here, on this process's memory; other processes that open the
    /// same device reach these QPs as they would on kernel rxe. If the
    /// daemon stops, the device raises `DEVICE_FATAL` and every QP goes to
    /// ERR.
    pub fn open_daemon(name: &str, socket: Option<&std::path::Path>) -> Result<Device> {
        let path = socket.map_or_else(emulator_daemon::default_socket_path, |p| p.to_path_buf());
        let o = emulator_daemon::client::open(&path, name).map_err(Error::Io)?;
        let info = o.info;
        let params = rxe_core::CcParams::with_overrides(
            info.cc_params
                .iter()
                .map(|(k, v)| (k.as_str(), u64::from(*v))),
        )
        .map_err(|e| Error::Config(format!("rxe-emud's parameters for {}: {e}", info.name)))?;
        let cfg = DeviceConfig {
            addr: info.addr,
            name: info.name.clone(),
            netdev_mtu: info.netdev_mtu,
            fault: None,
            cc: rxe_core::CcConfig {
                model: info.like.cc,
                params,
            },
            release: info.like.release,
        };
        let mtu = Mtu::for_netdev_mtu(cfg.netdev_mtu).ok_or_else(|| {
            Error::Config(format!(
                "netdev MTU {} is too small for RoCEv2 (needs 336)",
                cfg.netdev_mtu
            ))
        })?;
        if info.addr.is_ipv4() {
            crate::sys::set_dont_fragment(o.socket.as_raw_fd())
                .map_err(|e| Error::Io(format!("slot socket: {e}")))?;
        }
        set_multicast_if(&socket2::SockRef::from(&o.socket), info.addr);
        let mut ecfg = EngineConfig::new(cfg.addr);
        ecfg.key_seed = info.key_seed;
        ecfg.qpn_range = (info.qpn_lo, info.qpn_hi);
        ecfg.qpn_first = Some(info.qpn_first);
        ecfg.key_space = rxe_core::KeySpace::for_slot(info.slot);
        o.control
            .set_nonblocking(true)
            .map_err(|e| Error::Io(e.to_string()))?;
        // RXE_EMU_LOCAL_LINK=off: every datagram by UDP (to compare, or
        // to see the device's traffic with tcpdump on the host).
        let inbox = o
            .inbox
            .filter(|_| std::env::var("RXE_EMU_LOCAL_LINK").as_deref() != Ok("off"));
        let local = inbox.and_then(|(m, e)| match local_link::Inbox::open(m, e) {
            Ok(i) => Some(crate::local::LocalLink::new(
                i,
                info.slot as usize,
                path.clone(),
                info.name.clone(),
                !info.any_user,
            )),
            Err(e) => {
                eprintln!(
                    "rxe-emu: device {}: same-host inbox unusable ({e}); using UDP only",
                    info.name
                );
                None
            }
        });
        Self::start(cfg, mtu, o.socket, ecfg, Some(o.control), local)
    }

    fn start(
        cfg: DeviceConfig,
        mtu: Mtu,
        socket: UdpSocket,
        mut ecfg: EngineConfig,
        control: Option<std::os::unix::net::UnixStream>,
        local: Option<crate::local::LocalLink>,
    ) -> Result<Device> {
        let (wake_tx, wake_rx) = UnixDatagram::pair().map_err(|e| Error::Io(e.to_string()))?;
        let (event_tx, event_rx) = UnixDatagram::pair().map_err(|e| Error::Io(e.to_string()))?;
        event_tx
            .set_nonblocking(true)
            .map_err(|e| Error::Io(e.to_string()))?;
        wake_rx
            .set_nonblocking(true)
            .map_err(|e| Error::Io(e.to_string()))?;
        wake_tx
            .set_nonblocking(true)
            .map_err(|e| Error::Io(e.to_string()))?;
        ecfg.gids = gid_table(cfg.addr);
        ecfg.port_mtu = mtu;
        ecfg.cc = cfg.cc.clone();
        ecfg.set_release(cfg.release);
        // A ConnectX-like device reads the ECN codepoint of what it
        // receives; a kernel-rxe-like one ignores it (and keeps recv_from).
        let recv_tos = cfg.cc.model == rxe_core::CcModel::Mlx5Like;
        if recv_tos {
            let s = socket2::SockRef::from(&socket);
            let r = if cfg.addr.is_ipv6() {
                s.set_recv_tclass_v6(true)
            } else {
                s.set_recv_tos_v4(true)
            };
            r.map_err(|e| Error::Io(format!("IP_RECVTOS on the device's socket: {e}")))?;
        }
        let faults = cfg.fault.map(Faults::new);
        let mut engine = Engine::new(ecfg, HostMemory::default());
        // With an inbox most packets go to processes of this host, which
        // need no ICRC from a process that never injected faults: it is
        // written only where it is looked at (UDP, faults, tracers).
        engine.defer_icrc(local.is_some());
        // Each flush completes or sends what the engine left in memory
        // before the engine is unlocked (`hostmem::fill_gathered`).
        engine.defer_gather(local.is_some());
        // READ requests say where their responses go, for peers that place
        // them (`local_link::place`).
        engine.hint_reads(local.as_ref().is_some_and(|l| l.placement()));
        let inner = Arc::new(Inner {
            engine: Mutex::new(engine),
            channels: Mutex::new(FxHashMap::default()),
            events: Mutex::new(std::collections::VecDeque::new()),
            event_tx,
            event_rx,
            cfg,
            mtu,
            socket,
            senders: Mutex::new(FxHashMap::default()),
            mcast: Mutex::new(Vec::new()),
            mcast_on: AtomicBool::new(false),
            faults_on: AtomicBool::new(faults.is_some()),
            faults_ever: AtomicBool::new(faults.is_some()),
            faults: Mutex::new(faults),
            epoch: local_link::monotonic_ns(),
            stop: AtomicBool::new(false),
            sleeping_until: std::sync::atomic::AtomicU64::new(0),
            last_app_poll: std::sync::atomic::AtomicU64::new(0),
            spin_sleeping: AtomicBool::new(false),
            look_timer: nix::sys::timerfd::TimerFd::new(
                nix::sys::timerfd::ClockId::CLOCK_MONOTONIC,
                nix::sys::timerfd::TimerFlags::TFD_NONBLOCK
                    | nix::sys::timerfd::TimerFlags::TFD_CLOEXEC,
            )
            .ok(),
            look_due: std::sync::atomic::AtomicU64::new(0),
            app_armed: AtomicBool::new(false),
            app_left: AtomicBool::new(false),
            left_spin: AtomicBool::new(false),
            wake_tx,
            wake_rx,
            deferred: Mutex::new(Vec::new()),
            deferred_any: AtomicBool::new(false),
            lock_count: std::sync::atomic::AtomicU64::new(0),
            control,
            control_buf: Mutex::new(Vec::new()),
            control_out: Mutex::new(Vec::new()),
            tracing: AtomicBool::new(false),
            trace_tag: Mutex::new(String::new()),
            failed: Mutex::new(None),
            local,
            udp_seen: std::sync::atomic::AtomicU64::new(0),
            local_rx: std::sync::atomic::AtomicU64::new(0),
            last_app_post: std::sync::atomic::AtomicU64::new(0),
            sent_inbox: std::sync::atomic::AtomicU64::new(0),
            placed_refused: std::sync::atomic::AtomicU64::new(0),
            sent_udp: std::sync::atomic::AtomicU64::new(0),
            progress_wakeups: std::sync::atomic::AtomicU64::new(0),
            wake_requests: std::sync::atomic::AtomicU64::new(0),
            progress_looks: std::sync::atomic::AtomicU64::new(0),
            recv_tos,
            fault_ce: std::sync::atomic::AtomicU64::new(0),
            fault_queue_drops: std::sync::atomic::AtomicU64::new(0),
        });
        let worker = inner.clone();
        // The thread is noted as the library's own (it writes only into
        // registered MRs, so an MR's pages may move while it runs:
        // `local_link::shared_mr`) before the device is handed out.
        let (noted, is_noted) = std::sync::mpsc::sync_channel(1);
        let handle = std::thread::Builder::new()
            .name(format!("rxe-emu {}", inner.cfg.name))
            .spawn(move || {
                struct Own;
                impl Drop for Own {
                    fn drop(&mut self) {
                        local_link::shared_mr::forget_own_thread();
                    }
                }
                local_link::shared_mr::note_own_thread();
                let _own = Own;
                let _ = noted.send(());
                worker.progress_loop()
            })
            .map_err(|e| Error::Io(e.to_string()))?;
        let _ = is_noted.recv();
        let dev = Device {
            _thread: Arc::new(ThreadGuard {
                inner: inner.clone(),
                handle: Mutex::new(Some(handle)),
            }),
            inner,
        };
        registry().push((Arc::downgrade(&dev.inner), Arc::downgrade(&dev._thread)));
        Ok(dev)
    }

    /// An open device of this process by name (`ibv_open_device` on an
    /// entry of [`device_list`]); several devices may share a name, the
    /// first opened wins.
    pub fn by_name(name: &str) -> Option<Device> {
        device_list().into_iter().find(|d| d.name() == name)
    }

    /// `ibv_query_port` for port 1.
    pub fn query_port(&self) -> PortAttr {
        let caps = self.query_device();
        PortAttr {
            active: true,
            max_mtu: Mtu::M4096,
            active_mtu: self.inner.mtu,
            gid_tbl_len: caps.gid_table_len,
            max_msg_sz: caps.max_msg_sz,
            pkey_tbl_len: 1,
            lid: 0,
            link_layer_ethernet: true,
        }
    }

    /// The device name.
    pub fn name(&self) -> &str {
        &self.inner.cfg.name
    }

    /// The address the device owns.
    pub fn addr(&self) -> IpAddr {
        self.inner.cfg.addr
    }

    /// Active path MTU of the port.
    pub fn port_mtu(&self) -> Mtu {
        self.inner.mtu
    }

    /// The GID of the device's address (IPv4-mapped for IPv4): what peers
    /// put in their address vectors.
    pub fn gid(&self) -> [u8; 16] {
        rxe_core::ip_to_gid(self.inner.cfg.addr)
    }

    /// Index of [`Device::gid`] in the GID table (1 for an IPv4 address, as
    /// on kernel rxe): the `sgid_index` to use in address vectors.
    pub fn gid_index(&self) -> u8 {
        (self.gid_table().len() - 1) as u8
    }

    /// The port's GID table, in kernel rxe's order (see [`gid_table`]).
    pub fn gid_table(&self) -> Vec<[u8; 16]> {
        gid_table(self.inner.cfg.addr)
            .into_iter()
            .map(rxe_core::ip_to_gid)
            .collect()
    }

    /// Device limits (`ibv_query_device`): kernel rxe's values.
    pub fn query_device(&self) -> rxe_core::DeviceCaps {
        self.inner.lock().config().caps.clone()
    }

    /// Send now the responses an application's poll held back (as closing
    /// the device does), for a process that exits without closing it: a
    /// peer waits for the ACK of the last message this process received
    /// (`ib_send_bw -z` against kernel rxe: the kernel retried its last
    /// SEND for ever and never answered our DREQ). Does nothing if another
    /// thread holds the engine (an exit must not wait for it).
    pub fn flush_held(&self) {
        if let Ok(mut e) = self.inner.engine.try_lock() {
            self.inner.count_lock();
            self.inner.flush(&mut e);
        }
    }

    /// Protocol counters.
    pub fn counters(&self) -> rxe_core::Counters {
        self.inner.lock().counters().clone()
    }

    /// The kernel rxe release the device behaves as where releases differ.
    pub fn release(&self) -> rxe_core::RxeRelease {
        self.inner.cfg.release
    }

    /// The device's congestion behaviour (kernel rxe's or ConnectX's) and
    /// its parameters now.
    pub fn cc_config(&self) -> rxe_core::CcConfig {
        self.inner.lock().cc_config().clone()
    }

    /// Set one congestion-control parameter (an mlx5 name, e.g.
    /// `rpg_ai_rate`); an unknown name or an out-of-range value is refused.
    pub fn set_cc_param(&self, name: &str, value: u64) -> Result<()> {
        self.inner
            .lock()
            .set_cc_param(name, value)
            .map_err(|e| Error::Config(e.to_string()))
    }
}

/// Bytes of a receive buffer: the largest datagram, at any alignment
/// (`local_link::Inbox::pop_aligned`).
pub(crate) const RX_BUF: usize = 65536 + 64;

/// A receive buffer of this thread, big enough for any UDP datagram;
/// reused, never zeroed again.
pub(crate) fn with_rx_buf<R>(f: impl FnOnce(&mut [u8]) -> R) -> R {
    thread_local! {
        static BUF: std::cell::RefCell<Vec<u8>> = std::cell::RefCell::new(vec![0; RX_BUF]);
    }
    // (A catch-up at process exit finds the thread's storage gone; a call
    // made inside another finds the buffer taken: both get a new one.)
    let mut f = Some(f);
    BUF.try_with(|b| {
        let mut b = b.try_borrow_mut().ok()?;
        f.take().map(|f| f(&mut b))
    })
    .ok()
    .flatten()
    .unwrap_or_else(|| (f.take().expect("not run"))(&mut vec![0; RX_BUF]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fault_specs_with_ce_and_a_queue_parse_and_nonsense_is_refused() {
        let f = FaultConfig::parse("ce=0.05 queue=10000:40000:160000:0.2:640000 seed=7").unwrap();
        assert_eq!(f.ce, 0.05);
        assert_eq!(
            f.queue,
            Some(rxe_core::sim::Bottleneck {
                rate_mbps: 10_000,
                buffer_bytes: 640_000,
                kmin_bytes: 40_000,
                kmax_bytes: 160_000,
                pmax: 0.2,
            })
        );
        assert!(!f.is_off());
        assert!(FaultConfig::parse("ce=0 queue=off").unwrap().is_off());
        for (bad, why) in [
            ("ce=2", "ce=2 is not a probability"),
            ("queue=10", "is not RATE_MBPS:KMIN:KMAX:PMAX:BUFFER"),
            ("queue=0:1:2:0.1:2000", "queue rate 0 Mb/s"),
            ("queue=10:1:2:1.5:2000", "Pmax 1.5"),
            ("queue=1:1:2:0.1:10000000", "holds a datagram back 80.0 s"),
            ("mark=1", "unknown key \"mark\""),
        ] {
            let e = FaultConfig::parse(bad).unwrap_err();
            assert!(e.contains(why), "{bad}: {e}");
        }
    }
}
