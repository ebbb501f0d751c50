//! Placement: a producer writes a WRITE ONLY's payload into the consumer's
//! memory only where the consumer's tables allow it, and a consumer that
//! withdraws an MR waits for a placement in flight. The consumer here is
//! this process (a producer may place into its own process too), its
//! "memory" a buffer of the test.

use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use local_link::{
    Inbox, InboxFile, PlaceError, PlaceableMr, PlaceableQp, Placement, PushError, MAX_DATAGRAM,
};

const RING: usize = 128 << 10;
const QPN: u32 = 0x1_0011;
const RKEY: u32 = 0x1234_5601;
const IOVA: u64 = 0x7000_0000;

fn open(f: &InboxFile) -> Inbox {
    Inbox::open(
        f.memfd().try_clone_to_owned().unwrap(),
        f.eventfd().try_clone_to_owned().unwrap(),
    )
    .unwrap()
}

/// What the memory at `p` holds now (written behind the compiler's back
/// by `process_vm_writev`).
fn bytes(p: *const u8, len: usize) -> Vec<u8> {
    // SAFETY: `p..p+len` lies in a live buffer of the test; volatile reads
    // because the kernel wrote it, not Rust code.
    (0..len)
        .map(|i| unsafe { std::ptr::read_volatile(p.add(i)) })
        .collect()
}

struct Target {
    mem: Box<[u8; 64]>,
}

impl Target {
    fn addr(&self) -> u64 {
        self.mem.as_ptr() as u64
    }

    fn now(&self) -> Vec<u8> {
        bytes(self.mem.as_ptr(), 64)
    }
}

fn tables(rx: &Inbox, t: &Target, epsn: u32, pd: u32) {
    tables_at(rx, t.addr(), epsn, pd);
}

/// The MR (64 bytes at IOVA, held at `host_addr`) and the QP, published.
fn tables_at(rx: &Inbox, host_addr: u64, epsn: u32, pd: u32) {
    assert!(rx.publish_mr(&PlaceableMr {
        rkey: RKEY,
        pd: 1,
        iova: IOVA,
        len: 64,
        host_addr,
        shared: None,
    }));
    rx.publish_qp(
        QPN,
        Some(&PlaceableQp {
            qpn: QPN,
            pd,
            epsn,
            mid_write: false,
        }),
    );
}

fn try_place(tx: &Inbox, rx: &Inbox, psn: u32, va: u64, data: &[u8]) -> Result<u64, PlaceError> {
    let packet = [0xabu8; 40]; // the bytes the inbox carries, unread here
    let p = Placement {
        qpn: QPN,
        psn,
        rkey: RKEY,
        va,
        data,
        ..Default::default()
    };
    let r = tx
        .placing_run(1)
        .unwrap()
        .place_and_push(4791, 0, &packet, &p, local_link::Icrc::Unchecked)
        .unwrap();
    // The packet follows either way, marked with where it was placed.
    let mut buf = vec![0u8; MAX_DATAGRAM];
    let got = rx.pop(&mut buf).unwrap();
    assert_eq!(&buf[..got.len], &packet);
    assert_eq!(got.placed, r.ok());
    r
}

#[test]
fn a_payload_is_placed_only_where_the_consumers_tables_allow_it() {
    let f = InboxFile::create("t", 2, RING).unwrap();
    let (tx, rx) = (open(&f), open(&f));
    let t = Target {
        mem: Box::new([0u8; 64]),
    };
    tables(&rx, &t, 7, 1);
    // The consumer offers no placement yet.
    assert_eq!(
        try_place(&tx, &rx, 7, IOVA, &[1; 8]),
        Err(PlaceError::Refused)
    );
    assert!(rx.offer_placement());
    assert_eq!(try_place(&tx, &rx, 7, IOVA + 8, &[1; 16]), Ok(t.addr() + 8));
    let mut want = vec![0u8; 64];
    want[8..24].fill(1);
    assert_eq!(t.now(), want);

    // Each check of the responder's own, one at a time: nothing written.
    let no = Err(PlaceError::NotNow);
    assert_eq!(try_place(&tx, &rx, 8, IOVA, &[2; 8]), no, "another PSN");
    assert_eq!(
        try_place(&tx, &rx, 7, IOVA + 60, &[2; 8]),
        no,
        "past the end"
    );
    assert_eq!(
        try_place(&tx, &rx, 7, IOVA - 1, &[2; 8]),
        no,
        "before the start"
    );
    assert_eq!(try_place(&tx, &rx, 7, IOVA, &[]), no, "no payload");
    rx.publish_qp(
        QPN,
        Some(&PlaceableQp {
            qpn: QPN,
            pd: 2,
            epsn: 7,
            mid_write: false,
        }),
    );
    assert_eq!(try_place(&tx, &rx, 7, IOVA, &[2; 8]), no, "another PD");
    rx.publish_qp(QPN, None);
    assert_eq!(try_place(&tx, &rx, 7, IOVA, &[2; 8]), no, "responder busy");
    rx.publish_qp(
        QPN,
        Some(&PlaceableQp {
            qpn: QPN,
            pd: 1,
            epsn: 7,
            mid_write: false,
        }),
    );
    rx.unpublish_mr(RKEY);
    assert_eq!(try_place(&tx, &rx, 7, IOVA, &[2; 8]), no, "MR withdrawn");
    assert_eq!(t.now(), want);

    // Published again; then the consumer withdraws placement altogether.
    tables(&rx, &t, 7, 1);
    assert_eq!(try_place(&tx, &rx, 7, IOVA, &[3; 8]), Ok(t.addr()));
    want[..8].fill(3);
    assert_eq!(t.now(), want);
    rx.withdraw_placement();
    assert_eq!(
        try_place(&tx, &rx, 7, IOVA, &[4; 8]),
        Err(PlaceError::Refused)
    );
    assert_eq!(t.now(), want);

    // An entry another MR holds is not taken over.
    let other = PlaceableMr {
        rkey: RKEY,
        pd: 1,
        iova: 0,
        len: 8,
        host_addr: t.addr(),
        shared: None,
    };
    assert!(
        rx.publish_mr(&other),
        "the same rkey may be published again"
    );
    let mut taken = 0;
    for k in 0..4096u32 {
        let r = rx.publish_mr(&PlaceableMr {
            rkey: k << 8,
            ..other
        });
        taken += usize::from(!r);
    }
    assert!(taken > 0, "4096 MRs in 512 entries: some collide");
}

#[test]
fn nothing_is_placed_unless_the_packet_fits_in_the_ring_after_it() {
    let f = InboxFile::create("t", 2, RING).unwrap();
    let (tx, rx) = (open(&f), open(&f));
    let t = Target {
        mem: Box::new([0u8; 64]),
    };
    tables(&rx, &t, 0, 1);
    assert!(rx.offer_placement());
    let big = vec![0u8; 60_000];
    while tx.push(1, 1, 0, &big).is_ok() {}
    let p = Placement {
        qpn: QPN,
        psn: 0,
        rkey: RKEY,
        va: IOVA,
        data: &[9; 8],
        ..Default::default()
    };
    assert_eq!(
        tx.placing_run(1)
            .unwrap()
            .place_and_push(1, 0, &big, &p, local_link::Icrc::Unchecked),
        Err(PushError::Full)
    );
    assert_eq!(t.now(), vec![0u8; 64], "nothing placed");
}

/// Ring 1's control block: its `placing` counter and producer PID.
fn fake_placement_in_flight(f: &InboxFile, counter: u64, pid: u32) {
    let file = std::fs::File::from(f.memfd().try_clone_to_owned().unwrap());
    let ctrl = 4096 + 256;
    file.write_at(&counter.to_le_bytes(), ctrl + 64).unwrap();
    file.write_at(&pid.to_le_bytes(), ctrl + 72).unwrap();
}

/// `withdraw`, run on another thread while ring 1's producer (this
/// process) is in the middle of a placement (its counter `counter`, odd),
/// returns only once that placement has ended.
fn waits_for_the_placement_in_flight(
    f: &InboxFile,
    rx: &Arc<Inbox>,
    counter: u64,
    withdraw: fn(&Inbox),
) {
    fake_placement_in_flight(f, counter, std::process::id());
    let done = Arc::new(AtomicBool::new(false));
    let waiter = {
        let (rx, done) = (rx.clone(), done.clone());
        std::thread::spawn(move || {
            withdraw(&rx);
            done.store(true, Ordering::SeqCst);
        })
    };
    std::thread::sleep(Duration::from_millis(50));
    assert!(
        !done.load(Ordering::SeqCst),
        "returned while a producer may still write"
    );
    fake_placement_in_flight(f, counter + 1, std::process::id());
    waiter.join().unwrap();
    assert!(done.load(Ordering::SeqCst));
}

#[test]
fn withdrawing_an_mr_waits_for_a_placement_in_flight_but_not_for_a_dead_producer() {
    let f = InboxFile::create("t", 2, RING).unwrap();
    let rx = Arc::new(open(&f));
    let t = Target {
        mem: Box::new([0u8; 64]),
    };
    tables(&rx, &t, 0, 1);
    // A live producer (this process) in the middle of a placement.
    waits_for_the_placement_in_flight(&f, &rx, 5, |rx| {
        rx.unpublish_mr(RKEY);
    });

    // A producer that died mid-placement is not waited for.
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let dead = child.id();
    child.wait().unwrap();
    tables(&rx, &t, 0, 1);
    fake_placement_in_flight(&f, 7, dead);
    rx.unpublish_mr(RKEY);
}

#[test]
fn a_placement_into_memory_the_owner_cannot_write_is_a_fault_and_writes_nothing() {
    let f = InboxFile::create("t", 2, RING).unwrap();
    let (tx, rx) = (open(&f), open(&f));
    assert!(rx.offer_placement());
    // A shared mapping the owner maps read-only: the write, whichever of
    // its two ways this process uses now (each is checked alone in shm's
    // tests), may not go into it.
    let name = std::ffi::CString::new("ro").unwrap();
    // SAFETY: plain system calls on a new memfd and a new mapping that no
    // Rust object aliases; both are released below.
    let (fd, page) = unsafe {
        let fd = libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC);
        assert!(fd >= 0);
        assert_eq!(libc::ftruncate(fd, 4096), 0);
        let p = libc::mmap(
            std::ptr::null_mut(),
            4096,
            libc::PROT_READ,
            libc::MAP_SHARED,
            fd,
            0,
        );
        assert_ne!(p, libc::MAP_FAILED);
        (fd, p)
    };
    tables_at(&rx, page as u64, 7, 1);
    assert_eq!(
        try_place(&tx, &rx, 7, IOVA, &[5; 8]),
        Err(PlaceError::Fault)
    );
    assert_eq!(bytes(page as *const u8, 8), vec![0u8; 8]);
    // Writable memory takes the next one, through the same producer.
    let t = Target {
        mem: Box::new([0u8; 64]),
    };
    tables(&rx, &t, 7, 1);
    assert_eq!(try_place(&tx, &rx, 7, IOVA, &[5; 8]), Ok(t.addr()));
    assert_eq!(&t.now()[..8], &[5; 8]);
    // SAFETY: the mapping and the fd made above, no longer used.
    unsafe {
        libc::munmap(page, 4096);
        libc::close(fd);
    }
}

/// Two pages of a memfd of this process, mapped shared: the requester's
/// READ destination, as `shared_mr` would have moved it.
struct Pages {
    fd: std::os::fd::OwnedFd,
    addr: *mut u8,
}

impl Pages {
    const LEN: usize = 8192;

    fn new() -> Pages {
        use std::os::fd::FromRawFd;
        // SAFETY: a name and flags; the fd returned is ours.
        let raw = unsafe { libc::memfd_create(c"read-dest".as_ptr(), libc::MFD_CLOEXEC) };
        assert!(raw >= 0);
        // SAFETY: `raw` is a new descriptor nothing else owns.
        let fd = unsafe { std::os::fd::OwnedFd::from_raw_fd(raw) };
        std::fs::File::from(fd.try_clone().unwrap())
            .set_len(Self::LEN as u64)
            .unwrap();
        use std::os::fd::AsRawFd;
        // SAFETY: a fresh shared mapping of the whole memfd.
        let addr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                Self::LEN,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        assert_ne!(addr, libc::MAP_FAILED);
        Pages {
            fd,
            addr: addr.cast(),
        }
    }

    fn now(&self) -> Vec<u8> {
        bytes(self.addr, Self::LEN)
    }

    /// A hint for a READ of `len` bytes at offset `at` of the pages.
    fn hint(&self, rx: &Inbox, at: u64, len: u64, mtu: u32) -> local_link::ReadHint {
        use std::os::fd::AsRawFd;
        use std::os::unix::fs::MetadataExt;
        let ino = std::fs::File::from(self.fd.try_clone().unwrap())
            .metadata()
            .unwrap()
            .ino();
        local_link::ReadHint {
            host: self.addr as u64 + at,
            len,
            pages: local_link::SharedPages {
                fd: self.fd.as_raw_fd(),
                ino,
                off: at,
            },
            mtu,
            epoch: rx.read_epoch(),
        }
    }
}

impl Drop for Pages {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`, no longer used.
        unsafe { libc::munmap(self.addr.cast(), Self::LEN) };
    }
}

/// Response `k` of the hinted READ, with a 12-byte header and an ICRC.
fn place_response(
    tx: &Inbox,
    rx: &Inbox,
    hint: &local_link::ReadHint,
    k: u32,
    fill: u8,
    n: usize,
) -> Result<u64, PlaceError> {
    // The payload is elsewhere (the responder's MR): the datagram's bytes
    // there are not its.
    let packet = vec![0xab; 12 + n + 4];
    let payload = vec![fill; n];
    // SAFETY: `payload` holds `n` bytes for the whole call.
    let r = unsafe {
        tx.placing_run(1).unwrap().place_read_and_push(
            4791,
            0,
            &packet,
            hint,
            k,
            12,
            payload.as_ptr(),
            n,
            local_link::Icrc::Right,
        )
    }
    .unwrap();
    let mut whole = packet.clone();
    whole[12..12 + n].fill(fill);
    let packet = whole;
    // The packet follows either way; placed, without its payload.
    let mut buf = vec![0u8; MAX_DATAGRAM];
    let got = rx.pop(&mut buf).unwrap();
    assert_eq!(got.len, packet.len());
    assert_eq!(got.placed, r.ok());
    match r {
        Ok(_) => {
            assert_eq!(got.elided, Some((12, n)));
            assert_eq!(&buf[..12], &packet[..12]);
            assert_eq!(&buf[12 + n..got.len], &packet[12 + n..]);
        }
        Err(_) => {
            assert_eq!(got.elided, None);
            assert_eq!(&buf[..got.len], &packet[..]);
        }
    }
    r
}

#[test]
fn a_read_request_carries_its_hint_to_the_responder() {
    let f = InboxFile::create("t", 2, RING).unwrap();
    let (tx, rx) = (open(&f), open(&f));
    let pages = Pages::new();
    let hint = pages.hint(&rx, 100, 5000, 1024);
    let request = [0x0cu8; 32];
    tx.push_hinted(1, 4791, 0, &request, local_link::Icrc::Right, &hint)
        .unwrap();
    tx.push(1, 4791, 0, &request).unwrap();
    let mut buf = vec![0u8; MAX_DATAGRAM];
    let got = rx.pop(&mut buf).unwrap();
    assert_eq!((&buf[..got.len], got.hint), (&request[..], Some(hint)));
    let got = rx.pop(&mut buf).unwrap();
    assert_eq!((&buf[..got.len], got.hint), (&request[..], None));
}

#[test]
fn read_responses_are_placed_where_the_hint_says_while_its_epoch_lasts() {
    let f = InboxFile::create("t", 2, RING).unwrap();
    let (tx, rx) = (open(&f), open(&f));
    let pages = Pages::new();
    // 5000 bytes at offset 100, path MTU 1024: four full responses and
    // one of 904 bytes.
    let hint = pages.hint(&rx, 100, 5000, 1024);
    // Nothing is placed for a consumer that does not offer placement.
    assert_eq!(
        place_response(&tx, &rx, &hint, 0, 1, 1024),
        Err(PlaceError::Refused)
    );
    assert!(rx.offer_placement());
    assert_eq!(place_response(&tx, &rx, &hint, 0, 1, 1024), Ok(hint.host));
    assert_eq!(
        place_response(&tx, &rx, &hint, 4, 5, 904),
        Ok(hint.host + 4096)
    );
    // Not the size the requester takes there, or past the READ's end.
    for (k, n) in [(1, 1000), (4, 1024), (5, 8), (1, 0)] {
        assert_eq!(
            place_response(&tx, &rx, &hint, k, 9, n),
            Err(PlaceError::NotNow),
            "response {k} of {n} bytes"
        );
    }
    let mut want = vec![0u8; Pages::LEN];
    want[100..1124].fill(1);
    want[4196..5100].fill(5);
    assert_eq!(pages.now(), want);
    // Once the requester ended its hints, nothing more lands.
    rx.end_read_hints();
    assert_eq!(
        place_response(&tx, &rx, &hint, 1, 2, 1024),
        Err(PlaceError::NotNow)
    );
    assert_eq!(pages.now(), want);
    let hint = pages.hint(&rx, 100, 5000, 1024);
    assert_eq!(
        place_response(&tx, &rx, &hint, 1, 2, 1024),
        Ok(hint.host + 1024)
    );
    // A hint naming another file than the memfd at that number.
    let mut wrong = hint;
    wrong.pages.ino += 1;
    assert_eq!(
        place_response(&tx, &rx, &wrong, 2, 3, 1024),
        Err(PlaceError::NotNow)
    );
    want[1124..2148].fill(2);
    assert_eq!(pages.now(), want);
}

#[test]
fn ending_read_hints_waits_for_a_placement_in_flight() {
    let f = InboxFile::create("t", 2, RING).unwrap();
    let rx = Arc::new(open(&f));
    waits_for_the_placement_in_flight(&f, &rx, 7, |rx| rx.end_read_hints());
}

#[test]
fn a_run_of_placements_holds_off_the_end_of_read_hints_until_it_ends() {
    let f = InboxFile::create("t", 2, RING).unwrap();
    let tx = open(&f);
    let rx = Arc::new(open(&f));
    assert!(rx.offer_placement());
    let pages = Pages::new();
    let hint = pages.hint(&rx, 0, 4096, 1024);
    let packet = vec![0xab; 12 + 1024 + 4];
    let payload = [vec![1u8; 1024], vec![2u8; 1024]];
    let mut run = tx.placing_run(1).unwrap();
    // SAFETY (both): `payload[k]` holds 1024 bytes for the whole call.
    let place = |run: &mut local_link::PlacingRun<'_>, k: u32| unsafe {
        run.place_read_and_push(
            4791,
            0,
            &packet,
            &hint,
            k,
            12,
            payload[k as usize].as_ptr(),
            1024,
            local_link::Icrc::Right,
        )
        .unwrap()
    };
    assert_eq!(place(&mut run, 0), Ok(hint.host));
    let done = Arc::new(AtomicBool::new(false));
    let ender = {
        let (rx, done) = (rx.clone(), done.clone());
        std::thread::spawn(move || {
            rx.end_read_hints();
            done.store(true, Ordering::SeqCst);
        })
    };
    // The epoch moves on first; a placement of the run after that sees it.
    while rx.read_epoch() == hint.epoch {
        std::thread::yield_now();
    }
    assert_eq!(place(&mut run, 1), Err(PlaceError::NotNow));
    std::thread::sleep(Duration::from_millis(50));
    assert!(
        !done.load(Ordering::SeqCst),
        "end_read_hints returned while a run was open"
    );
    drop(run);
    ender.join().unwrap();
    assert!(done.load(Ordering::SeqCst));
    let mut want = vec![0u8; Pages::LEN];
    want[..1024].fill(1);
    assert_eq!(pages.now(), want);
    // Both packets are in the ring, in order: the first placed (payload
    // left out), the second whole.
    let mut buf = vec![0u8; MAX_DATAGRAM];
    let got = rx.pop(&mut buf).unwrap();
    assert_eq!(
        (got.placed, got.elided),
        (Some(hint.host), Some((12, 1024)))
    );
    let got = rx.pop(&mut buf).unwrap();
    assert_eq!((got.placed, got.elided), (None, None));
    assert_eq!(&buf[12..12 + 1024], &payload[1][..]);
    assert!(rx.pop(&mut buf).is_none());
}
