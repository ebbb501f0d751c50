//! RDMA netlink answers: what the kernel's RDMA core says on a
//! `NETLINK_RDMA` socket about its devices (the `RDMA_NL_NLDEV` client),
//! said here about rxe-emu's devices, from the view.
//!
//! Programs ask it for the devices and their ports: iproute2's `rdma`
//! (`rdma dev show`, `rdma link show`, with `-j` for JSON), and through
//! it rdma-core's own test suite (v56 on: `tests/base.py` takes a port's
//! netdev from `rdma link show -j`), and scripts that look for `rxe0` in
//! `rdma link show`. The preload library gives such a program a socket
//! whose requests [`answer`] answers; this module is the protocol, pure
//! and tested here.
//!
//! Answered: `RDMA_NLDEV_CMD_GET` and `RDMA_NLDEV_CMD_PORT_GET`, each as a
//! dump (every device, or every port of one device) or for one device
//! (and port), with the attributes the kernel gives a RoCE port (device
//! index and name, port count, node GUID, system image GUID, node type,
//! protocol `roce`; port index, state, physical state, netdev name and
//! index). Not answered: every other command (resources, statistics,
//! `rdma link add`, system settings): an `NLMSG_ERROR` with
//! `-EOPNOTSUPP`, which the tools print as "Operation not supported".
//! Nor `RDMA_NLDEV_ATTR_CAP_FLAGS` and `RDMA_NLDEV_ATTR_FW_VERSION` (kernel
//! rxe has no firmware version; its capability flags are kernel-internal):
//! `rdma dev show -d` shows no `caps` line.

use std::fs;
use std::path::Path;

/// `NETLINK_RDMA` (`linux/netlink.h`).
pub const NETLINK_RDMA: i32 = 20;

/// `RDMA_NL_NLDEV`: the client number in the message type's top bits
/// (`RDMA_NL_GET_TYPE(client, op)` = `client << 10 | op`).
const NLDEV: u16 = 5;
const CMD_GET: u16 = 1;
const CMD_PORT_GET: u16 = 5;

const ATTR_DEV_INDEX: u16 = 1;
const ATTR_DEV_NAME: u16 = 2;
const ATTR_PORT_INDEX: u16 = 3;
const ATTR_NODE_GUID: u16 = 6;
const ATTR_SYS_IMAGE_GUID: u16 = 7;
const ATTR_PORT_STATE: u16 = 12;
const ATTR_PORT_PHYS_STATE: u16 = 13;
const ATTR_DEV_NODE_TYPE: u16 = 14;
const ATTR_NDEV_INDEX: u16 = 50;
const ATTR_NDEV_NAME: u16 = 51;
const ATTR_DEV_PROTOCOL: u16 = 67;

const NLMSG_HDRLEN: usize = 16;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const NLM_F_REQUEST: u16 = 1;
const NLM_F_MULTI: u16 = 2;
const NLM_F_ACK: u16 = 4;
const NLM_F_DUMP: u16 = 0x300;

/// A device as RDMA netlink describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NlDevice {
    /// The kernel's device index (1, 2, ... in the view's `uverbsN` order).
    pub index: u32,
    /// `rxe0`.
    pub name: String,
    /// Node GUID as a number (`0200:00ff:fe7f:0001` is 0x020000fffe7f0001).
    pub node_guid: u64,
    /// System image GUID, likewise.
    pub sys_image_guid: u64,
    /// `node_type`: 1, a CA.
    pub node_type: u8,
    /// Its one port (rxe devices have port 1 only).
    pub port: NlPort,
}

/// Port 1 of a device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NlPort {
    /// `enum ib_port_state`: 4, ACTIVE.
    pub state: u8,
    /// Physical state: 5, LinkUp.
    pub phys_state: u8,
    /// The netdev under it and its interface index, if any.
    pub netdev: Option<(String, u32)>,
}

/// The devices of a view directory (`view::write`'s layout), in
/// `uverbsN` order; the netdev's index comes from `ifindex` (0 if the
/// netdev is gone). Devices whose files cannot be read are left out.
pub fn devices_from_view(view: &Path, ifindex: impl Fn(&str) -> u32) -> Vec<NlDevice> {
    let verbs = view.join("sys/devices/virtual/infiniband_verbs");
    let mut uverbs: Vec<(u32, String)> = fs::read_dir(&verbs)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let n = e
                .file_name()
                .to_str()?
                .strip_prefix("uverbs")?
                .parse()
                .ok()?;
            let ibdev = fs::read_to_string(e.path().join("ibdev")).ok()?;
            Some((n, ibdev.trim().to_string()))
        })
        .collect();
    uverbs.sort();
    uverbs
        .into_iter()
        .filter_map(|(n, name)| {
            let d = view.join("sys/devices/virtual/infiniband").join(&name);
            let read = |f: &str| fs::read_to_string(d.join(f)).ok();
            let num = |f: &str| -> Option<u8> { read(f)?.split(':').next()?.trim().parse().ok() };
            let netdev = fs::read_dir(d.join("device/net"))
                .ok()
                .and_then(|mut r| r.next())
                .and_then(|e| e.ok())
                .and_then(|e| e.file_name().into_string().ok())
                .map(|n| {
                    let i = ifindex(&n);
                    (n, i)
                });
            Some(NlDevice {
                index: n + 1,
                node_guid: parse_guid(&read("node_guid")?)?,
                sys_image_guid: parse_guid(&read("sys_image_guid")?)?,
                node_type: num("node_type")?,
                port: NlPort {
                    state: num("ports/1/state")?,
                    phys_state: num("ports/1/phys_state")?,
                    netdev,
                },
                name,
            })
        })
        .collect()
}

/// `0200:00ff:fe7f:0001` -> 0x020000fffe7f0001.
fn parse_guid(s: &str) -> Option<u64> {
    let hex: String = s.trim().split(':').collect();
    (hex.len() == 16)
        .then(|| u64::from_str_radix(&hex, 16).ok())
        .flatten()
}

/// One request message of a buffer.
struct Request<'a> {
    ty: u16,
    flags: u16,
    seq: u32,
    header: &'a [u8],
    attrs: &'a [u8],
}

fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_ne_bytes(b.get(at..at + 2)?.try_into().ok()?))
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_ne_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

const fn align4(n: usize) -> usize {
    (n + 3) & !3
}

/// The messages of a request buffer; stops at the first one that does
/// not fit (its length field past the buffer or below the header).
fn requests(buf: &[u8]) -> Vec<Request<'_>> {
    let mut out = Vec::new();
    let mut at = 0;
    while let Some(len) = u32_at(buf, at) {
        let len = len as usize;
        if len < NLMSG_HDRLEN || at + len > buf.len() {
            break;
        }
        let m = &buf[at..at + len];
        out.push(Request {
            ty: u16_at(m, 4).unwrap_or(0),
            flags: u16_at(m, 6).unwrap_or(0),
            seq: u32_at(m, 8).unwrap_or(0),
            header: &m[..NLMSG_HDRLEN],
            attrs: &m[NLMSG_HDRLEN..],
        });
        at += align4(len);
    }
    out
}

/// The u32 attribute `ty` of an attribute list.
fn attr_u32(attrs: &[u8], ty: u16) -> Option<u32> {
    let mut at = 0;
    while let (Some(len), Some(t)) = (u16_at(attrs, at), u16_at(attrs, at + 2)) {
        let len = usize::from(len);
        if len < 4 || at + len > attrs.len() {
            return None;
        }
        if t & 0x3fff == ty && len == 8 {
            return u32_at(attrs, at + 4);
        }
        at += align4(len);
    }
    None
}

/// A reply message being built.
struct Msg(Vec<u8>);

impl Msg {
    fn new(ty: u16, flags: u16, seq: u32, portid: u32) -> Msg {
        let mut b = Vec::with_capacity(256);
        b.extend_from_slice(&0u32.to_ne_bytes());
        b.extend_from_slice(&ty.to_ne_bytes());
        b.extend_from_slice(&flags.to_ne_bytes());
        b.extend_from_slice(&seq.to_ne_bytes());
        b.extend_from_slice(&portid.to_ne_bytes());
        Msg(b)
    }

    fn attr(&mut self, ty: u16, data: &[u8]) {
        let len = 4 + data.len();
        self.0.extend_from_slice(&(len as u16).to_ne_bytes());
        self.0.extend_from_slice(&ty.to_ne_bytes());
        self.0.extend_from_slice(data);
        self.0.resize(align4(self.0.len()), 0);
    }

    fn u8(&mut self, ty: u16, v: u8) {
        self.attr(ty, &[v]);
    }

    fn u32(&mut self, ty: u16, v: u32) {
        self.attr(ty, &v.to_ne_bytes());
    }

    fn u64(&mut self, ty: u16, v: u64) {
        self.attr(ty, &v.to_ne_bytes());
    }

    fn str(&mut self, ty: u16, s: &str) {
        let mut z = s.as_bytes().to_vec();
        z.push(0);
        self.attr(ty, &z);
    }

    fn done(mut self) -> Vec<u8> {
        let len = self.0.len() as u32;
        self.0[..4].copy_from_slice(&len.to_ne_bytes());
        self.0
    }
}

fn dev_msg(d: &NlDevice, ty: u16, flags: u16, seq: u32, portid: u32) -> Vec<u8> {
    let mut m = Msg::new(ty, flags, seq, portid);
    m.u32(ATTR_DEV_INDEX, d.index);
    m.str(ATTR_DEV_NAME, &d.name);
    m.u32(ATTR_PORT_INDEX, 1); // the number of ports
    m.u64(ATTR_NODE_GUID, d.node_guid);
    m.u64(ATTR_SYS_IMAGE_GUID, d.sys_image_guid);
    m.u8(ATTR_DEV_NODE_TYPE, d.node_type);
    m.str(ATTR_DEV_PROTOCOL, "roce");
    m.done()
}

fn port_msg(d: &NlDevice, ty: u16, flags: u16, seq: u32, portid: u32) -> Vec<u8> {
    let mut m = Msg::new(ty, flags, seq, portid);
    m.u32(ATTR_DEV_INDEX, d.index);
    m.str(ATTR_DEV_NAME, &d.name);
    m.u32(ATTR_PORT_INDEX, 1);
    m.u8(ATTR_PORT_STATE, d.port.state);
    m.u8(ATTR_PORT_PHYS_STATE, d.port.phys_state);
    if let Some((name, index)) = &d.port.netdev {
        m.u32(ATTR_NDEV_INDEX, *index);
        m.str(ATTR_NDEV_NAME, name);
    }
    m.done()
}

/// `NLMSG_ERROR` for `req` with `errno` (0: an acknowledgement).
fn error_msg(req: &Request<'_>, errno: i32, portid: u32) -> Vec<u8> {
    let mut m = Msg::new(NLMSG_ERROR, 0, req.seq, portid);
    m.0.extend_from_slice(&(-errno).to_ne_bytes());
    m.0.extend_from_slice(req.header);
    m.done()
}

/// The reply messages to a buffer of requests, in order, one `Vec` per
/// message (each a datagram of its own, as the kernel's fit the reader's
/// buffer). `portid`: the socket's, which replies carry.
pub fn answer(buf: &[u8], portid: u32, devs: &[NlDevice]) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    for r in requests(buf) {
        if r.flags & NLM_F_REQUEST == 0 {
            continue;
        }
        let (client, op) = (r.ty >> 10, r.ty & 0x3ff);
        if client != NLDEV || !matches!(op, CMD_GET | CMD_PORT_GET) {
            out.push(error_msg(&r, nix::libc::EOPNOTSUPP, portid));
            continue;
        }
        let want_dev = attr_u32(r.attrs, ATTR_DEV_INDEX);
        let want_port = attr_u32(r.attrs, ATTR_PORT_INDEX);
        let make = |d: &NlDevice, flags| {
            if op == CMD_GET {
                dev_msg(d, r.ty, flags, r.seq, portid)
            } else {
                port_msg(d, r.ty, flags, r.seq, portid)
            }
        };
        if r.flags & NLM_F_DUMP == NLM_F_DUMP {
            for d in devs
                .iter()
                .filter(|d| op == CMD_GET || want_dev.is_none_or(|i| i == d.index))
            {
                out.push(make(d, NLM_F_MULTI));
            }
            let mut done = Msg::new(NLMSG_DONE, NLM_F_MULTI, r.seq, portid);
            done.0.extend_from_slice(&0i32.to_ne_bytes());
            out.push(done.done());
            continue;
        }
        // One object: the device must be named, and for a port, the port.
        let found = want_dev.and_then(|i| devs.iter().find(|d| d.index == i));
        let errno = match (found, op) {
            (None, _) => nix::libc::ENODEV,
            (Some(_), CMD_PORT_GET) if want_port != Some(1) => nix::libc::EINVAL,
            (Some(d), _) => {
                out.push(make(d, 0));
                0
            }
        };
        if errno != 0 || r.flags & NLM_F_ACK != 0 {
            out.push(error_msg(&r, errno, portid));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dev(index: u32, name: &str, netdev: Option<(&str, u32)>) -> NlDevice {
        NlDevice {
            index,
            name: name.into(),
            node_guid: 0x0200_00ff_fe7f_0001,
            sys_image_guid: 0x0200_00ff_fe7f_0001,
            node_type: 1,
            port: NlPort {
                state: 4,
                phys_state: 5,
                netdev: netdev.map(|(n, i)| (n.to_string(), i)),
            },
        }
    }

    fn req(op: u16, flags: u16, seq: u32, attrs: &[(u16, u32)]) -> Vec<u8> {
        let mut m = Msg::new(NLDEV << 10 | op, flags, seq, 0);
        for (t, v) in attrs {
            m.u32(*t, *v);
        }
        m.done()
    }

    /// (type, flags, seq, pid, attributes as (type, bytes)).
    type Parsed = (u16, u16, u32, u32, Vec<(u16, Vec<u8>)>);

    fn parse(m: &[u8]) -> Parsed {
        let len = u32_at(m, 0).unwrap() as usize;
        assert_eq!(len, m.len(), "length field");
        let mut attrs = Vec::new();
        let mut at = NLMSG_HDRLEN;
        while at < m.len() {
            let l = usize::from(u16_at(m, at).unwrap());
            attrs.push((u16_at(m, at + 2).unwrap(), m[at + 4..at + l].to_vec()));
            at += align4(l);
        }
        (
            u16_at(m, 4).unwrap(),
            u16_at(m, 6).unwrap(),
            u32_at(m, 8).unwrap(),
            u32_at(m, 12).unwrap(),
            attrs,
        )
    }

    fn get(a: &[(u16, Vec<u8>)], t: u16) -> Option<&[u8]> {
        a.iter().find(|(x, _)| *x == t).map(|(_, v)| v.as_slice())
    }

    #[test]
    fn device_dump_then_done() {
        let devs = [dev(1, "rxe0", Some(("lo", 1))), dev(2, "rxe1", None)];
        let out = answer(&req(CMD_GET, NLM_F_REQUEST | NLM_F_DUMP, 7, &[]), 99, &devs);
        assert_eq!(out.len(), 3);
        for (m, d) in out.iter().zip(&devs) {
            let (ty, flags, seq, pid, a) = parse(m);
            assert_eq!(
                (ty, flags, seq, pid),
                (NLDEV << 10 | CMD_GET, NLM_F_MULTI, 7, 99)
            );
            assert_eq!(get(&a, ATTR_DEV_INDEX), Some(&d.index.to_ne_bytes()[..]));
            assert_eq!(
                get(&a, ATTR_DEV_NAME),
                Some(format!("{}\0", d.name).as_bytes())
            );
            assert_eq!(get(&a, ATTR_PORT_INDEX), Some(&1u32.to_ne_bytes()[..]));
            assert_eq!(
                get(&a, ATTR_NODE_GUID),
                Some(&d.node_guid.to_ne_bytes()[..])
            );
            assert_eq!(get(&a, ATTR_DEV_NODE_TYPE), Some(&[1u8][..]));
            assert_eq!(get(&a, ATTR_DEV_PROTOCOL), Some(&b"roce\0"[..]));
        }
        let done = &out[2];
        assert_eq!(done.len(), NLMSG_HDRLEN + 4);
        assert_eq!(u32_at(done, 0), Some(20));
        assert_eq!(
            (u16_at(done, 4), u16_at(done, 6), u32_at(done, 8)),
            (Some(NLMSG_DONE), Some(NLM_F_MULTI), Some(7))
        );
    }

    #[test]
    fn port_of_one_device_with_ack_and_dump_by_device() {
        let devs = [dev(1, "rxe0", Some(("eth0", 2))), dev(2, "rxe1", None)];
        let r = req(
            CMD_PORT_GET,
            NLM_F_REQUEST | NLM_F_ACK,
            3,
            &[(ATTR_DEV_INDEX, 1), (ATTR_PORT_INDEX, 1)],
        );
        let out = answer(&r, 5, &devs);
        assert_eq!(out.len(), 2, "the port, then the acknowledgement");
        let (_, _, _, _, a) = parse(&out[0]);
        assert_eq!(get(&a, ATTR_PORT_STATE), Some(&[4u8][..]));
        assert_eq!(get(&a, ATTR_PORT_PHYS_STATE), Some(&[5u8][..]));
        assert_eq!(get(&a, ATTR_NDEV_NAME), Some(&b"eth0\0"[..]));
        assert_eq!(get(&a, ATTR_NDEV_INDEX), Some(&2u32.to_ne_bytes()[..]));
        // ACK: NLMSG_ERROR, error 0, the request's header.
        let ack = &out[1];
        assert_eq!(u16_at(ack, 4), Some(NLMSG_ERROR));
        assert_eq!(u32_at(ack, 16), Some(0));
        assert_eq!(&ack[20..36], &r[..16]);
        // A dump of the ports of device 2 only; no netdev attributes there.
        let out = answer(
            &req(
                CMD_PORT_GET,
                NLM_F_REQUEST | NLM_F_DUMP,
                4,
                &[(ATTR_DEV_INDEX, 2)],
            ),
            5,
            &devs,
        );
        assert_eq!(out.len(), 2);
        let (_, _, _, _, a) = parse(&out[0]);
        assert_eq!(get(&a, ATTR_DEV_NAME), Some(&b"rxe1\0"[..]));
        assert!(get(&a, ATTR_NDEV_NAME).is_none());
    }

    #[test]
    fn unknown_device_port_and_command_are_errors() {
        let devs = [dev(1, "rxe0", None)];
        let errno = |out: &[Vec<u8>]| u32_at(&out[0], 16).map(|e| -(e as i32));
        let out = answer(
            &req(CMD_GET, NLM_F_REQUEST, 1, &[(ATTR_DEV_INDEX, 9)]),
            1,
            &devs,
        );
        assert_eq!(errno(&out), Some(nix::libc::ENODEV));
        let out = answer(
            &req(
                CMD_PORT_GET,
                NLM_F_REQUEST,
                1,
                &[(ATTR_DEV_INDEX, 1), (ATTR_PORT_INDEX, 2)],
            ),
            1,
            &devs,
        );
        assert_eq!(errno(&out), Some(nix::libc::EINVAL));
        // RDMA_NLDEV_CMD_RES_GET (9), and another client's message.
        for ty in [NLDEV << 10 | 9, 1 << 10] {
            let mut r = req(CMD_GET, NLM_F_REQUEST, 2, &[]);
            r[4..6].copy_from_slice(&ty.to_ne_bytes());
            let out = answer(&r, 1, &devs);
            assert_eq!(errno(&out), Some(nix::libc::EOPNOTSUPP));
        }
        // Garbage: no answer, no panic.
        assert!(answer(&[1, 2, 3], 1, &devs).is_empty());
        assert!(answer(&[0xff; 40], 1, &devs).is_empty());
        let mut short = req(CMD_GET, NLM_F_REQUEST | NLM_F_DUMP, 1, &[]);
        short[..4].copy_from_slice(&200u32.to_ne_bytes());
        assert!(answer(&short, 1, &devs).is_empty());
    }

    #[test]
    fn devices_read_from_a_written_view() {
        let dir = std::env::temp_dir().join(format!("rxe-nl-view-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let devs = [
            crate::view::ViewDevice {
                name: "rxe0".into(),
                addr: "127.0.0.1".parse().unwrap(),
                netdev: Some("lo".into()),
            },
            crate::view::ViewDevice {
                name: "rxe1".into(),
                addr: "10.9.9.9".parse().unwrap(),
                netdev: None,
            },
        ];
        crate::view::write(&dir, &devs).unwrap();
        let got = devices_from_view(&dir, |n| if n == "lo" { 1 } else { 0 });
        let _ = fs::remove_dir_all(&dir);
        assert_eq!(got.len(), 2);
        assert_eq!((got[0].index, got[0].name.as_str()), (1, "rxe0"));
        assert_eq!((got[1].index, got[1].name.as_str()), (2, "rxe1"));
        assert_eq!(got[0].port.netdev, Some(("lo".into(), 1)));
        assert_eq!(
            (got[0].port.state, got[0].port.phys_state, got[0].node_type),
            (4, 5, 1)
        );
        assert_ne!(got[0].node_guid, 0);
    }
}
