//! Inboxes as the daemon creates them and processes use them.

use std::io::Read;
use std::os::fd::OwnedFd;
use std::os::unix::fs::FileExt;

use local_link::{Icrc, Inbox, InboxFile, PushError, DEFAULT_RING_SIZE, MAX_DATAGRAM};

const RING: usize = 128 << 10;

fn fds(f: &InboxFile) -> (OwnedFd, OwnedFd) {
    (
        f.memfd().try_clone_to_owned().unwrap(),
        f.eventfd().try_clone_to_owned().unwrap(),
    )
}

fn open(f: &InboxFile) -> Inbox {
    let (m, e) = fds(f);
    Inbox::open(m, e).unwrap()
}

/// A datagram whose bytes say which it is.
fn datagram(seq: u32, len: usize) -> Vec<u8> {
    let mut d = vec![0u8; len.max(4)];
    d[..4].copy_from_slice(&seq.to_le_bytes());
    for (i, b) in d.iter_mut().enumerate().skip(4) {
        *b = (seq as usize * 31 + i) as u8;
    }
    d
}

#[test]
fn datagrams_arrive_whole_in_order_with_their_port_and_ring() {
    let f = InboxFile::create("t", 4, RING).unwrap();
    let (tx, rx) = (open(&f), open(&f));
    let mut buf = vec![0u8; MAX_DATAGRAM];
    assert!(rx.pop(&mut buf).is_none());
    assert!(!rx.has_data());
    for i in 0..10u32 {
        tx.push(
            2,
            49152 + i as u16,
            i as u8,
            &datagram(i, 13 + i as usize * 7),
        )
        .unwrap();
    }
    assert!(rx.has_data());
    for i in 0..10u32 {
        let p = rx.pop(&mut buf).unwrap();
        assert_eq!((p.ring, p.src_port, p.tos), (2, 49152 + i as u16, i as u8));
        assert_eq!(&buf[..p.len], &datagram(i, 13 + i as usize * 7)[..]);
    }
    assert!(rx.pop(&mut buf).is_none());
    assert_eq!(rx.take_dropped(), 0);
}

#[test]
fn rings_are_served_in_turn() {
    let f = InboxFile::create("t", 4, RING).unwrap();
    let (a, b, rx) = (open(&f), open(&f), open(&f));
    for i in 0..3 {
        a.push(1, 1, 0, &datagram(i, 64)).unwrap();
        b.push(3, 3, 0, &datagram(100 + i, 64)).unwrap();
    }
    let mut buf = vec![0u8; MAX_DATAGRAM];
    let rings: Vec<usize> = (0..6).map(|_| rx.pop(&mut buf).unwrap().ring).collect();
    assert_eq!(rings, [1, 3, 1, 3, 1, 3]);
}

#[test]
fn a_full_ring_refuses_until_the_consumer_takes_and_laps_wrap_cleanly() {
    let f = InboxFile::create("t", 2, RING).unwrap();
    let (tx, rx) = (open(&f), open(&f));
    let mut buf = vec![0u8; MAX_DATAGRAM];
    let mut sent = 0u32;
    let mut got = 0u32;
    // Sizes that do not divide the ring: records straddle the end of a
    // lap and the wrap marker is used, many times over.
    let len = |i: u32| 1000 + (i as usize * 37) % 3000;
    let mut fulls = 0;
    while got < 2000 {
        match tx.push(1, 7, 0, &datagram(sent, len(sent))) {
            Ok(()) => sent += 1,
            Err(PushError::Full) => {
                fulls += 1;
                for _ in 0..5 {
                    let Some(p) = rx.pop(&mut buf) else { break };
                    assert_eq!(&buf[..p.len], &datagram(got, len(got))[..]);
                    got += 1;
                }
            }
            Err(e) => panic!("{e:?}"),
        }
    }
    assert!(fulls > 10, "the ring never filled ({fulls})");
    assert_eq!(rx.take_dropped(), 0);
}

#[test]
fn a_closed_inbox_refuses_and_oversized_or_unknown_rings_are_invalid() {
    let f = InboxFile::create("t", 2, RING).unwrap();
    let tx = open(&f);
    assert_eq!(tx.push(2, 1, 0, b"x"), Err(PushError::Invalid));
    assert_eq!(
        tx.push(1, 1, 0, &vec![0; MAX_DATAGRAM + 1]),
        Err(PushError::Invalid)
    );
    tx.push(1, 1, 0, &vec![0; MAX_DATAGRAM]).unwrap();
    assert!(!tx.is_closed());
    f.close();
    assert!(tx.is_closed());
    assert_eq!(tx.push(1, 1, 0, b"x"), Err(PushError::Closed));
}

#[test]
fn words_scribbled_by_another_process_are_counted_and_dropped_not_trusted() {
    let f = InboxFile::create("t", 2, RING).unwrap();
    let (tx, rx) = (open(&f), open(&f));
    let file = std::fs::File::from(f.memfd().try_clone_to_owned().unwrap());
    let ctrl = 4096 + 256; // ring 1's control block
                           // Ring 1's data: after page 0, the control blocks (page 1) and the
                           // 64 KiB of placement tables, and after ring 0.
    let data = 8192 + 65536 + RING as u64;
    let mut buf = vec![0u8; MAX_DATAGRAM];

    // A tail beyond a ring's worth past the head.
    tx.push(0, 1, 0, b"x").unwrap();
    tx.push(1, 1, 0, b"y").unwrap();
    file.write_at(&(RING as u64 * 3).to_le_bytes(), ctrl)
        .unwrap();
    let mut seen = Vec::new();
    while let Some(p) = rx.pop(&mut buf) {
        seen.push(p.ring);
    }
    assert_eq!(seen, [0]);
    assert_eq!(rx.take_dropped(), 1);
    // The producer of ring 1 sees the inconsistency too.
    file.write_at(&(RING as u64 * 3 - 8).to_le_bytes(), ctrl)
        .unwrap();
    assert_eq!(tx.push(1, 1, 0, b"z"), Err(PushError::Corrupt));

    // A record whose length runs past the tail.
    let f = InboxFile::create("t", 2, RING).unwrap();
    let (tx, rx) = (open(&f), open(&f));
    let file = std::fs::File::from(f.memfd().try_clone_to_owned().unwrap());
    tx.push(1, 1, 0, &[5; 16]).unwrap();
    file.write_at(&4000u32.to_le_bytes(), data).unwrap();
    assert!(rx.pop(&mut buf).is_none());
    assert_eq!(rx.take_dropped(), 1);
    // The ring is usable again after the discard.
    tx.push(1, 1, 0, &[6; 16]).unwrap();
    let p = rx.pop(&mut buf).unwrap();
    assert_eq!(&buf[..p.len], &[6; 16]);

    // A lead (bits 24-29 of the length word: bytes before the datagram)
    // that runs the record past the tail, or that no producer writes.
    for lead in [40u32, 64, 255] {
        tx.push(1, 1, 0, &[5; 16]).unwrap();
        let head = {
            let mut w = [0u8; 8];
            file.read_at(&mut w, 4096 + 256 + 128).unwrap();
            u64::from_le_bytes(w)
        };
        file.write_at(&(16 | lead << 24).to_le_bytes(), data + head % RING as u64)
            .unwrap();
        assert!(rx.pop(&mut buf).is_none(), "lead {lead}");
        assert_eq!(rx.take_dropped(), 1);
    }
    // One that adds up is read past.
    tx.push(1, 1, 0, &[9; 48]).unwrap();
    let mut w = [0u8; 8];
    file.read_at(&mut w, 4096 + 256 + 128).unwrap();
    let head = u64::from_le_bytes(w);
    file.write_at(&(16u32 | 32 << 24).to_le_bytes(), data + head % RING as u64)
        .unwrap();
    let p = rx.pop(&mut buf).unwrap();
    assert_eq!(&buf[..p.len], &[9; 16]);
    assert_eq!(rx.take_dropped(), 0);

    // Something that is not an inbox.
    let m = local_link_memfd_like();
    let e = f.eventfd().try_clone_to_owned().unwrap();
    assert!(Inbox::open(m, e).is_err());
}

/// A file of the right size with no inbox in it.
fn local_link_memfd_like() -> OwnedFd {
    let path = std::env::temp_dir().join(format!("ll-not-inbox-{}", std::process::id()));
    let f = std::fs::File::create(&path).unwrap();
    f.set_len(1 << 20).unwrap();
    let _ = std::fs::remove_file(&path);
    f.into()
}

/// A record may say its datagram's payload was left out (its sender
/// placed it): the consumer trusts no such record that does not add up.
#[test]
fn an_elided_record_that_does_not_add_up_is_dropped() {
    let data = 8192 + 65536 + RING as u64; // ring 1's data
    let mut buf = vec![0u8; MAX_DATAGRAM];
    // The flags byte of ring 1's first record, rewritten.
    let mut scribbled = |flags: u8, word: Option<[u8; 8]>| {
        let f = InboxFile::create("t", 2, RING).unwrap();
        let (tx, rx) = (open(&f), open(&f));
        let file = std::fs::File::from(f.memfd().try_clone_to_owned().unwrap());
        tx.push_with(1, 1, 0, &[7; 32], Icrc::Right).unwrap();
        file.write_at(&[flags], data + 7).unwrap();
        if let Some(w) = word {
            file.write_at(&w, data + 8).unwrap();
        }
        let got = rx.pop(&mut vec![0u8; MAX_DATAGRAM]);
        // The ring is usable again after a discard.
        tx.push_with(1, 1, 0, &[6; 16], Icrc::Right).unwrap();
        let next = rx.pop(&mut buf).unwrap();
        assert_eq!(&buf[..next.len], &[6; 16]);
        (got, rx.take_dropped())
    };
    let elided = 8u8;
    let (placed, right, unchecked) = (1u8, 2u8, 0u8);
    let word = |at: u32, n: u32| {
        let mut w = [0u8; 8];
        w[..4].copy_from_slice(&at.to_le_bytes());
        w[4..].copy_from_slice(&n.to_le_bytes());
        w
    };
    // Elided without a placed address.
    assert_eq!(scribbled(elided | right, Some(word(8, 8))), (None, 1));
    // Elided with an ICRC to be checked (the bytes are not there).
    assert_eq!(
        scribbled(elided | placed | unchecked, Some(word(8, 8))),
        (None, 1)
    );
    // A payload past the datagram's end, or a word that is not one.
    assert_eq!(
        scribbled(elided | placed | right, Some(word(30, 8))),
        (None, 1)
    );
    assert_eq!(scribbled(elided | placed | right, None), (None, 1));
    // One that adds up (16 of the 32 bytes left out, so that the record's
    // size is that of the 32 it held): taken.
    let (got, dropped) = scribbled(elided | placed | right, Some(word(8, 16)));
    assert_eq!(dropped, 0);
    let got = got.unwrap();
    assert_eq!(
        (got.len, got.elided, got.icrc),
        (32, Some((8, 16)), Icrc::Right)
    );
}

#[test]
fn a_sleeping_consumer_is_kicked_once_and_an_awake_one_never() {
    let f = InboxFile::create("t", 2, RING).unwrap();
    let (tx, rx) = (open(&f), open(&f));
    let mut ev = std::fs::File::from(f.eventfd().try_clone_to_owned().unwrap());
    let mut b = [0u8; 8];
    tx.push(1, 1, 0, b"a").unwrap();
    tx.kick();
    assert!(ev.read(&mut b).is_err(), "awake: no kick");
    assert!(!rx.sleep_begin(), "data waiting: do not sleep");
    let mut buf = vec![0u8; MAX_DATAGRAM];
    rx.pop(&mut buf).unwrap();
    assert!(rx.sleep_begin());
    tx.push(1, 1, 0, b"b").unwrap();
    tx.kick();
    tx.kick();
    assert_eq!(ev.read(&mut b).unwrap(), 8);
    assert_eq!(u64::from_ne_bytes(b), 1, "one kick per sleep");
    rx.sleep_end();
    assert!(rx.pop(&mut buf).is_some());
}

#[test]
fn an_application_that_stops_polling_is_kicked_until_it_polls_again() {
    let f = InboxFile::create("t", 2, RING).unwrap();
    let (tx, rx) = (open(&f), open(&f));
    let mut ev = std::fs::File::from(f.eventfd().try_clone_to_owned().unwrap());
    let mut b = [0u8; 8];
    let mut buf = vec![0u8; MAX_DATAGRAM];
    // It said it may stop polling: the next datagram kicks, once.
    assert!(rx.kick_me(), "nothing waiting");
    tx.push(1, 1, 0, b"a").unwrap();
    tx.kick();
    tx.kick();
    assert_eq!(ev.read(&mut b).unwrap(), 8);
    assert_eq!(u64::from_ne_bytes(b), 1, "one kick");
    rx.sleep_end();
    // A datagram already waiting drew no kick: kick_me says so.
    assert!(!rx.kick_me(), "a datagram is waiting");
    assert!(rx.pop(&mut buf).is_some());
    // It polls again: no kicks.
    rx.polling_again();
    tx.push(1, 1, 0, b"b").unwrap();
    tx.kick();
    assert!(ev.read(&mut b).is_err(), "polling: no kick");
    assert!(rx.pop(&mut buf).is_some());
    // Neither touches a sleeping consumer's state: it is kicked.
    assert!(rx.sleep_begin());
    assert!(rx.kick_me());
    rx.polling_again();
    tx.push(1, 1, 0, b"c").unwrap();
    tx.kick();
    assert_eq!(ev.read(&mut b).unwrap(), 8, "asleep: kicked");
    rx.sleep_end();
}

#[test]
fn an_active_application_leaves_its_sleeping_thread_unkicked_until_it_sleeps_itself() {
    let f = InboxFile::create("t", 2, RING).unwrap();
    let (tx, rx) = (open(&f), open(&f));
    let mut ev = std::fs::File::from(f.eventfd().try_clone_to_owned().unwrap());
    let mut b = [0u8; 8];
    let mut buf = vec![0u8; MAX_DATAGRAM];
    let now = local_link::monotonic_ns();
    // The progress thread went to sleep on the inbox; then the application
    // posted or polled: it takes what comes, no kick.
    assert!(rx.sleep_begin());
    rx.app_active(now, 0);
    tx.push(1, 1, 0, b"a").unwrap();
    assert!(!tx.kick_at(now), "the application is active: no kick");
    assert!(ev.read(&mut b).is_err());
    // Its last post or poll is stamped: once POLL_STALE old, senders kick.
    let stale = now + local_link::POLL_STALE.as_nanos() as u64 + 1;
    assert_eq!(tx.kick_due().map(|d| d.at), Some(stale));
    assert!(tx.kick_at(stale), "stopped: kicked");
    assert_eq!(ev.read(&mut b).unwrap(), 8);
    rx.sleep_end();
    assert!(rx.pop(&mut buf).is_some());
    // A stamp newer than `every` ago is not rewritten.
    rx.app_active(now + 10, 100);
    assert_eq!(tx.kick_due().map(|d| d.at), Some(stale));
    rx.app_active(now + 100, 100);
    assert_eq!(tx.kick_due().map(|d| d.at), Some(stale + 100));
    // Asleep again, the application active, then about to sleep on a
    // completion channel: senders kick again.
    assert!(rx.sleep_begin());
    rx.app_active(now + 200, 0);
    assert!(rx.app_sleeps(), "nothing waiting");
    tx.push(1, 1, 0, b"b").unwrap();
    assert!(tx.kick_at(now + 200), "the application sleeps: kicked");
    assert_eq!(ev.read(&mut b).unwrap(), 8);
    rx.sleep_end();
    assert!(rx.pop(&mut buf).is_some());
    // What came while the application was active drew no kick: it says
    // so as it goes to sleep.
    assert!(rx.sleep_begin());
    rx.app_active(now + 300, 0);
    tx.push(1, 1, 0, b"c").unwrap();
    assert!(!tx.kick_at(now + 300));
    assert!(!rx.app_sleeps(), "a datagram is waiting");
    assert!(rx.pop(&mut buf).is_some());
    // Neither touches an awake consumer that asked for kicks, nor one
    // already kicked.
    rx.sleep_end();
    assert!(rx.kick_me());
    rx.app_active(now + 400, 0);
    tx.push(1, 1, 0, b"d").unwrap();
    // Asked for kicks just after a poll: LEFT_GRACE later (its
    // application may be back before).
    let grace = local_link::LEFT_GRACE.as_nanos() as u64;
    assert!(
        !tx.kick_at(now + 400 + grace),
        "asked for kicks, polled just now"
    );
    assert_eq!(
        tx.kick_due(),
        Some(local_link::KickDue {
            at: now + 400 + grace + 1,
            left: true
        })
    );
    assert!(tx.kick_at(now + 401 + grace), "asked for kicks: kicked");
    assert!(rx.app_sleeps(), "kicked already: nothing to undo");
    assert_eq!(ev.read(&mut b).unwrap(), 8);
    rx.sleep_end();
    assert!(rx.pop(&mut buf).is_some());
}

#[test]
fn two_threads_move_a_million_bytes_with_kicks_and_lose_nothing() {
    let f = InboxFile::create("t", 3, RING).unwrap();
    let (tx, rx) = (open(&f), open(&f));
    let n = 20_000u32;
    let len = |i: u32| 1 + (i as usize * 97) % 4200;
    let producer = std::thread::spawn(move || {
        let mut i = 0;
        while i < n {
            match tx.push(2, 9, 0, &datagram(i, len(i))) {
                Ok(()) => {
                    i += 1;
                    tx.kick();
                }
                Err(PushError::Full) => std::thread::yield_now(),
                Err(e) => panic!("{e:?}"),
            }
        }
    });
    let mut buf = vec![0u8; MAX_DATAGRAM];
    let mut got = 0;
    let mut ev = std::fs::File::from(f.eventfd().try_clone_to_owned().unwrap());
    while got < n {
        match rx.pop(&mut buf) {
            Some(p) => {
                assert_eq!(
                    &buf[..p.len],
                    &datagram(got, len(got))[..],
                    "datagram {got}"
                );
                got += 1;
            }
            None => {
                if rx.sleep_begin() {
                    // Wait for the kick the way a poller would, briefly.
                    let mut b = [0u8; 8];
                    for _ in 0..1000 {
                        if ev.read(&mut b).is_ok() || rx.has_data() {
                            break;
                        }
                        std::thread::sleep(std::time::Duration::from_micros(50));
                    }
                    rx.sleep_end();
                }
            }
        }
    }
    producer.join().unwrap();
    assert_eq!(rx.take_dropped(), 0);
}

#[test]
fn the_default_layout_is_accepted_and_mostly_unbacked() {
    let f = InboxFile::create("t", 64, DEFAULT_RING_SIZE).unwrap();
    let rx = open(&f);
    assert_eq!(rx.rings(), 64);
    assert!(rx.mapped_len() >= 64 * DEFAULT_RING_SIZE);
    assert!(InboxFile::create("t", 65, DEFAULT_RING_SIZE).is_err());
    assert!(InboxFile::create("t", 2, 4096).is_err());
}

#[test]
fn a_conversation_of_small_datagrams_stays_in_the_first_pages_of_its_ring() {
    use std::os::unix::fs::MetadataExt;
    let f = InboxFile::create("t", 2, DEFAULT_RING_SIZE).unwrap();
    let (tx, rx) = (open(&f), open(&f));
    let mut buf = vec![0u8; MAX_DATAGRAM];
    // 50,000 datagrams of 100 bytes, each taken before the next: 5.6 MB
    // of records, more than a lap of the ring.
    for i in 0..50_000u32 {
        let d = datagram(i, 100);
        tx.push(1, 4791, 0, &d).unwrap();
        let p = rx.pop(&mut buf).unwrap();
        assert_eq!((p.ring, p.len), (1, 100));
        assert_eq!(&buf[..p.len], &d[..]);
    }
    assert!(rx.pop(&mut buf).is_none());
    assert_eq!(rx.take_dropped(), 0);
    // The memfd is sparse: only pages written hold memory.
    let memfd = std::fs::File::from(f.memfd().try_clone_to_owned().unwrap());
    let held = memfd.metadata().unwrap().blocks() * 512;
    assert!(held <= 256 << 10, "{held} bytes of the inbox were touched");
    // A ring that is not empty still fills past that point in order.
    for i in 0..2_000u32 {
        tx.push(1, 4791, 0, &datagram(i, 100)).unwrap();
    }
    for i in 0..2_000u32 {
        let p = rx.pop(&mut buf).unwrap();
        assert_eq!(&buf[..p.len], &datagram(i, 100)[..]);
    }
    assert!(rx.pop(&mut buf).is_none());
}

#[test]
fn what_a_sender_says_of_the_icrc_reaches_the_consumer() {
    use local_link::Icrc;
    let f = InboxFile::create("t", 2, RING).unwrap();
    let (tx, rx) = (open(&f), open(&f));
    let mut buf = vec![0u8; MAX_DATAGRAM];
    tx.push(1, 1, 0, b"checked").unwrap();
    tx.push_with(1, 2, 3, b"vouched", Icrc::Right).unwrap();
    tx.push_with(1, 4, 5, b"unwritten", Icrc::Unwritten)
        .unwrap();
    let p = rx.pop(&mut buf).unwrap();
    assert_eq!(
        (&buf[..p.len], p.icrc, p.placed),
        (&b"checked"[..], Icrc::Unchecked, None)
    );
    let p = rx.pop(&mut buf).unwrap();
    assert_eq!((&buf[..p.len], p.src_port, p.tos), (&b"vouched"[..], 2, 3));
    assert_eq!((p.icrc, p.placed), (Icrc::Right, None));
    let p = rx.pop(&mut buf).unwrap();
    assert_eq!(
        (&buf[..p.len], p.src_port, p.tos),
        (&b"unwritten"[..], 4, 5)
    );
    assert_eq!((p.icrc, p.placed), (Icrc::Unwritten, None));
}

#[test]
fn warming_a_ring_backs_its_first_pages_and_no_more() {
    use std::os::unix::fs::MetadataExt;
    let f = InboxFile::create("t", 4, DEFAULT_RING_SIZE).unwrap();
    let tx = open(&f);
    let memfd = std::fs::File::from(f.memfd().try_clone_to_owned().unwrap());
    let held = || memfd.metadata().unwrap().blocks() * 512;
    let before = held();
    tx.warm(2, true);
    let warmed = held() - before;
    // Twice the early wrap's 64 KiB, in one call. Kernels before 5.14
    // lack MADV_POPULATE_WRITE: nothing is warmed there.
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    let mut v = release.split(|c: char| !c.is_ascii_digit());
    let (major, minor): (u32, u32) = (
        v.next().unwrap().parse().unwrap(),
        v.next().unwrap().parse().unwrap(),
    );
    let want = if (major, minor) >= (5, 14) {
        128 << 10
    } else {
        0
    };
    assert_eq!(warmed, want, "bytes backed by warming one ring");
    // A ring past the last is no ring: nothing happens.
    tx.warm(4, true);
    tx.warm(64, false);
    assert_eq!(held() - before, warmed);
    // The warmed pages are still the ring's: datagrams pass as before.
    let rx = open(&f);
    let mut buf = vec![0u8; MAX_DATAGRAM];
    tx.push(2, 7, 0, &datagram(1, 100)).unwrap();
    let p = rx.pop(&mut buf).unwrap();
    assert_eq!(&buf[..p.len], &datagram(1, 100)[..]);
}

#[test]
fn a_datagram_whose_payload_is_elsewhere_arrives_whole() {
    let f = InboxFile::create("t", 4, RING).unwrap();
    let (tx, rx) = (open(&f), open(&f));
    let file = std::fs::File::from(f.memfd().try_clone_to_owned().unwrap());
    // Ring 2's control block and data (see the scribbling test).
    let (ctrl, data) = (4096 + 2 * 256, 8192 + 65536 + 2 * RING as u64);
    let word = |off: u64| {
        let mut w = [0u8; 8];
        file.read_at(&mut w, off).unwrap();
        u64::from_le_bytes(w)
    };
    // (Room for the largest datagram at any alignment: pop_aligned.)
    let mut buf = vec![0u8; MAX_DATAGRAM + 64];
    // Around the ring's end too: records of several sizes, many laps.
    for (i, len) in [4136usize, 300, 1100, 4136, 60]
        .iter()
        .cycle()
        .take(200)
        .enumerate()
    {
        let whole = datagram(i as u32, *len);
        let (at, n) = (12.min(len - 4), len - 16.min(*len) - 4.min(*len));
        // The datagram as its sender holds it: the gap holds other bytes.
        let mut shell = whole.clone();
        shell[at..at + n].fill(0xee);
        let payload = whole[at..at + n].to_vec();
        let tail = word(ctrl);
        // SAFETY: `payload` holds `n` readable bytes for the call.
        let r =
            unsafe { tx.push_gathered(2, 7, 0, &shell, at, payload.as_ptr(), n, Icrc::Unwritten) };
        assert_eq!(r, Ok(()));
        // The record's payload starts on a cache line of the ring: after
        // its header (a length word whose bits 24-29 are the lead) and
        // the lead. (Where the lap was cut short, the record is at 0.)
        let mut off = data + tail % RING as u64;
        let mut head = word(off) as u32;
        if head == u32::MAX {
            off = data;
            head = word(off) as u32;
        }
        let lead = u64::from(head >> 24);
        assert_eq!((head & 0xff_ffff) as usize, *len);
        assert_eq!((off + 8 + lead + at as u64) % 64, 0, "datagram {i}");
        // Popped as it lies in the ring (the payload on a cache line of
        // the buffer too), or at the buffer's start.
        let p = if i % 2 == 0 {
            rx.pop_aligned(&mut buf).expect("a record")
        } else {
            rx.pop(&mut buf).expect("a record")
        };
        assert_eq!((p.ring, p.src_port, p.icrc), (2, 7, Icrc::Unwritten));
        assert_eq!(&buf[p.at..p.at + p.len], &whole[..], "datagram {i}");
        if i % 2 == 0 {
            assert!(p.at < 64);
            assert_eq!((buf.as_ptr() as usize + p.at + at) % 64, 0, "datagram {i}");
        } else {
            assert_eq!(p.at, 0);
        }
    }
    assert!(rx.pop(&mut buf).is_none());
    // A gap past the datagram's end is refused, and nothing is pushed.
    let d = datagram(1, 100);
    // SAFETY: `d` holds 100 readable bytes.
    let r = unsafe { tx.push_gathered(2, 7, 0, &d[..50], 40, d.as_ptr(), 20, Icrc::Unwritten) };
    assert_eq!(r, Err(PushError::Invalid));
    assert!(rx.pop(&mut buf).is_none());
}
