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
        .place_and_push(1, 4791, 0, &packet, &p, local_link::Icrc::Unchecked)
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
        tx.place_and_push(1, 1, 0, &big, &p, local_link::Icrc::Unchecked),
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

#[test]
fn withdrawing_an_mr_waits_for_a_placement_in_flight_but_not_for_a_dead_producer() {
    let f = InboxFile::create("t", 2, RING).unwrap();
    let rx = Arc::new(open(&f));
    let t = Target {
        mem: Box::new([0u8; 64]),
    };
    tables(&rx, &t, 0, 1);
    // A live producer (this process) in the middle of a placement.
    fake_placement_in_flight(&f, 5, std::process::id());
    let done = Arc::new(AtomicBool::new(false));
    let (rx2, done2) = (rx.clone(), done.clone());
    let waiter = std::thread::spawn(move || {
        rx2.unpublish_mr(RKEY);
        done2.store(true, Ordering::SeqCst);
    });
    std::thread::sleep(Duration::from_millis(50));
    assert!(
        !done.load(Ordering::SeqCst),
        "returned while a producer may still write"
    );
    fake_placement_in_flight(&f, 6, std::process::id());
    waiter.join().unwrap();
    assert!(done.load(Ordering::SeqCst));

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
