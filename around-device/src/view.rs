//! The view: a directory that holds, for rxe-emu's devices, the entries
//! kernel rxe has in sysfs and `/dev`, laid out as the kernel lays them
//! out, so that a path under [`crate::paths::REDIRECTED`] means the same
//! below the view as it would on a machine with kernel rxe:
//!
//! ```text
//! sys/class/infiniband/rxe0 -> ../../devices/virtual/infiniband/rxe0
//! sys/devices/virtual/infiniband/rxe0/
//!     node_type            "1: CA"
//!     node_guid            "0200:00ff:fe7f:0001" (the EUI-64 of GID 0)
//!     sys_image_guid       the same
//!     ports/1/state        "4: ACTIVE"            phys_state  "5: LinkUp"
//!     ports/1/link_layer   "Ethernet"             lid, sm_lid "0x0", lid_mask_count "0"
//!     ports/1/gids/N       every entry of the GID table, unused ones as zeroes
//!     ports/1/gid_attrs/types/N  "RoCE v2" for each used entry
//!     ports/1/gid_attrs/ndevs/N  the netdev that holds the address
//!     ports/1/pkeys/0      "0xffff"
//!     device/net/<netdev>  -> /sys/class/net/<netdev>
//! sys/class/infiniband_verbs/abi_version "6"
//! sys/class/infiniband_verbs/uverbs0 -> ../../devices/virtual/infiniband_verbs/uverbs0
//! sys/devices/virtual/infiniband_verbs/uverbs0/{ibdev "rxe0", abi_version "1", dev "231:192"}
//! dev/infiniband/uverbs0 -> /dev/null     dev/infiniband/rdma_cm -> /dev/null
//! ```
//!
//! Why each is there: see the crate documentation. The character devices
//! are `/dev/null`: a character device every user may open for reading
//! and writing, which is all middleware checks (UCX skips a device whose
//! `/dev/infiniband/uverbsN` is not one); nothing is ever done with it,
//! since our libibverbs does not use a command fd.
//!
//! A view depends only on the devices, so it is written once to a
//! directory named after them (`view-<hash>`) and shared by every program
//! that sees the same devices; a new one is written beside it and renamed
//! into place, so a program never sees half a view.

use std::fmt::Write as _;
use std::fs;
use std::net::IpAddr;
use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::{Path, PathBuf};

/// Bumped when the layout changes, so an old view is not reused.
const LAYOUT: u32 = 1;

/// A device as the view shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ViewDevice {
    /// `rxe0`.
    pub name: String,
    /// Its address (the GID table follows from it).
    pub addr: IpAddr,
    /// The netdev it was created on, if any (else the one that holds the
    /// address, if any).
    pub netdev: Option<String>,
}

/// The devices of a daemon's `STATUS` reply (`device NAME ... addr A ...
/// netdev N|-` lines), in its order: the order in which our libibverbs
/// lists them, so `uverbsN` is the same device for both.
pub fn devices_of_status(status: &str) -> Vec<ViewDevice> {
    status
        .lines()
        .filter_map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            if w.first() != Some(&"device") {
                return None;
            }
            let name = w.get(1)?.to_string();
            let field = |k: &str| w.iter().position(|x| *x == k).and_then(|i| w.get(i + 1));
            let addr = field("addr")?.parse().ok()?;
            let netdev = field("netdev")
                .filter(|n| **n != "-")
                .map(|n| n.to_string());
            Some(ViewDevice { name, addr, netdev })
        })
        .collect()
}

/// The netdev that holds `addr`: the interface with that address, else,
/// for a loopback address, the loopback interface (127.0.0.0/8 is all
/// `lo`'s).
pub fn netdev_of(addr: IpAddr) -> Option<String> {
    let ifs: Vec<_> = nix::ifaddrs::getifaddrs().ok()?.collect();
    let has = |i: &nix::ifaddrs::InterfaceAddress| {
        i.address.as_ref().is_some_and(|a| {
            a.as_sockaddr_in().map(|s| IpAddr::V4(s.ip())) == Some(addr)
                || a.as_sockaddr_in6().map(|s| IpAddr::V6(s.ip())) == Some(addr)
        })
    };
    if let Some(i) = ifs.iter().find(|i| has(i)) {
        return Some(i.interface_name.clone());
    }
    if addr.is_loopback() {
        return ifs
            .iter()
            .find(|i| {
                i.flags
                    .contains(nix::net::if_::InterfaceFlags::IFF_LOOPBACK)
            })
            .map(|i| i.interface_name.clone());
    }
    None
}

/// The view for `devs` below `base`, written if it is not there yet.
pub fn ensure(base: &Path, devs: &[ViewDevice]) -> Result<PathBuf, String> {
    let dir = base.join(format!("view-{:016x}", fingerprint(devs)));
    if dir.join("complete").exists() {
        return Ok(dir);
    }
    fs::create_dir_all(base).map_err(|e| io(base, e))?;
    let tmp = base.join(format!(
        ".view-{}-{:x}",
        std::process::id(),
        fingerprint(devs)
    ));
    let _ = fs::remove_dir_all(&tmp);
    let written = write(&tmp, devs)
        .and_then(|()| fs::write(tmp.join("complete"), "").map_err(|e| io(&tmp, e)));
    if let Err(e) = written {
        let _ = fs::remove_dir_all(&tmp);
        return Err(e);
    }
    if let Err(e) = fs::rename(&tmp, &dir) {
        let _ = fs::remove_dir_all(&tmp);
        // Another program wrote the same view first: use theirs.
        if !dir.join("complete").exists() {
            return Err(io(&dir, e));
        }
    }
    Ok(dir)
}

/// FNV-1a over the layout version and the devices: the view's name.
fn fingerprint(devs: &[ViewDevice]) -> u64 {
    let mut text = format!("layout {LAYOUT}\n");
    for d in devs {
        let _ = writeln!(
            text,
            "{} {} {}",
            d.name,
            d.addr,
            d.netdev.as_deref().unwrap_or("-")
        );
    }
    text.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

fn io(what: &Path, e: impl std::fmt::Display) -> String {
    format!("{}: {e}", what.display())
}

/// A GID as sysfs prints it: eight groups of four hex digits.
fn gid_text(gid: &[u8; 16]) -> String {
    let mut s = String::with_capacity(40);
    for (i, pair) in gid.chunks(2).enumerate() {
        if i > 0 {
            s.push(':');
        }
        let _ = write!(s, "{:02x}{:02x}", pair[0], pair[1]);
    }
    s
}

/// The node GUID as sysfs prints it: the interface identifier of GID 0
/// (kernel rxe: the EUI-64 of the netdev's MAC, which is also what its
/// link-local GID carries), in four groups of four hex digits.
fn guid_text(gid0: &[u8; 16]) -> String {
    let g = &gid0[8..16];
    format!(
        "{:02x}{:02x}:{:02x}{:02x}:{:02x}{:02x}:{:02x}{:02x}",
        g[0], g[1], g[2], g[3], g[4], g[5], g[6], g[7]
    )
}

/// Write the whole view for `devs` into `root` (which must not exist).
pub fn write(root: &Path, devs: &[ViewDevice]) -> Result<(), String> {
    let put = |p: PathBuf, text: &str| -> Result<(), String> {
        if let Some(d) = p.parent() {
            fs::create_dir_all(d).map_err(|e| io(d, e))?;
        }
        fs::write(&p, text).map_err(|e| io(&p, e))?;
        // Read-only, as sysfs attributes are to a program.
        fs::set_permissions(&p, fs::Permissions::from_mode(0o444)).map_err(|e| io(&p, e))
    };
    let link = |target: &Path, at: PathBuf| -> Result<(), String> {
        if let Some(d) = at.parent() {
            fs::create_dir_all(d).map_err(|e| io(d, e))?;
        }
        symlink(target, &at).map_err(|e| io(&at, e))
    };
    let table_len = rxe_core::DeviceCaps::default().gid_table_len as usize;
    fs::create_dir_all(root.join("sys/class/infiniband")).map_err(|e| io(root, e))?;
    put(root.join("sys/class/infiniband_verbs/abi_version"), "6\n")?;
    fs::create_dir_all(root.join("dev/infiniband")).map_err(|e| io(root, e))?;
    link(Path::new("/dev/null"), root.join("dev/infiniband/rdma_cm"))?;
    for (i, d) in devs.iter().enumerate() {
        let dev = root.join("sys/devices/virtual/infiniband").join(&d.name);
        link(
            &Path::new("../../devices/virtual/infiniband").join(&d.name),
            root.join("sys/class/infiniband").join(&d.name),
        )?;
        let gids: Vec<[u8; 16]> = rxe_core::gid_table(d.addr)
            .into_iter()
            .map(rxe_core::ip_to_gid)
            .collect();
        let guid = guid_text(&gids[0]);
        put(dev.join("node_type"), "1: CA\n")?;
        put(dev.join("node_guid"), &format!("{guid}\n"))?;
        put(dev.join("sys_image_guid"), &format!("{guid}\n"))?;
        let port = dev.join("ports/1");
        put(port.join("state"), "4: ACTIVE\n")?;
        put(port.join("phys_state"), "5: LinkUp\n")?;
        put(port.join("link_layer"), "Ethernet\n")?;
        put(port.join("lid"), "0x0\n")?;
        put(port.join("sm_lid"), "0x0\n")?;
        put(port.join("lid_mask_count"), "0\n")?;
        put(port.join("pkeys/0"), "0xffff\n")?;
        let netdev = d.netdev.clone().or_else(|| netdev_of(d.addr));
        for n in 0..table_len {
            let gid = gids.get(n).copied().unwrap_or([0; 16]);
            put(
                port.join(format!("gids/{n}")),
                &format!("{}\n", gid_text(&gid)),
            )?;
            if n < gids.len() {
                put(port.join(format!("gid_attrs/types/{n}")), "RoCE v2\n")?;
                if let Some(nd) = &netdev {
                    put(
                        port.join(format!("gid_attrs/ndevs/{n}")),
                        &format!("{nd}\n"),
                    )?;
                }
            }
        }
        fs::create_dir_all(dev.join("device/net")).map_err(|e| io(&dev, e))?;
        if let Some(nd) = &netdev {
            link(
                &Path::new("/sys/class/net").join(nd),
                dev.join("device/net").join(nd),
            )?;
        }
        let uverbs = format!("uverbs{i}");
        let uv = root
            .join("sys/devices/virtual/infiniband_verbs")
            .join(&uverbs);
        link(
            &Path::new("../../devices/virtual/infiniband_verbs").join(&uverbs),
            root.join("sys/class/infiniband_verbs").join(&uverbs),
        )?;
        put(uv.join("ibdev"), &format!("{}\n", d.name))?;
        put(uv.join("abi_version"), "1\n")?;
        put(uv.join("dev"), &format!("231:{}\n", 192 + i))?;
        link(
            Path::new("/dev/null"),
            root.join("dev/infiniband").join(&uverbs),
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dev(name: &str, addr: &str, netdev: Option<&str>) -> ViewDevice {
        ViewDevice {
            name: name.into(),
            addr: addr.parse().unwrap(),
            netdev: netdev.map(str::to_string),
        }
    }

    fn scratch(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("rxe-view-{}-{tag}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn status_lines_give_the_devices_in_order() {
        let s = "device rxe1 addr 10.0.0.1 netdev eth1 mtu 1500\nslot 1 pid 7\ndevice rxe0 addr 127.0.0.1 netdev - mtu 65536\n";
        assert_eq!(
            devices_of_status(s),
            [
                dev("rxe1", "10.0.0.1", Some("eth1")),
                dev("rxe0", "127.0.0.1", None)
            ]
        );
    }

    #[test]
    fn the_view_has_kernel_rxes_entries_and_formats() {
        let base = scratch("layout");
        let devs = [
            dev("rxe0", "127.0.55.1", None),
            dev("rxe1", "10.9.0.1", Some("veth9")),
        ];
        let v = ensure(&base, &devs).unwrap();
        let read = |p: &str| fs::read_to_string(v.join(p)).unwrap();
        let ib = "sys/class/infiniband/rxe0/";
        assert_eq!(read(&format!("{ib}node_type")), "1: CA\n");
        assert_eq!(read(&format!("{ib}ports/1/state")), "4: ACTIVE\n");
        assert_eq!(read(&format!("{ib}ports/1/link_layer")), "Ethernet\n");
        assert_eq!(
            read(&format!("{ib}ports/1/gids/1")),
            "0000:0000:0000:0000:0000:ffff:7f00:3701\n"
        );
        assert_eq!(
            read(&format!("{ib}ports/1/gids/2")),
            "0000:0000:0000:0000:0000:0000:0000:0000\n"
        );
        assert!(v.join(format!("{ib}ports/1/gids/1023")).exists());
        assert!(!v.join(format!("{ib}ports/1/gids/1024")).exists());
        let gid0 = read(&format!("{ib}ports/1/gids/0"));
        assert!(gid0.starts_with("fe80:0000:0000:0000:"), "{gid0}");
        // node_guid is GID 0's interface identifier.
        assert_eq!(
            read(&format!("{ib}node_guid")).trim(),
            gid0.trim()[20..].to_string()
        );
        assert_eq!(read(&format!("{ib}ports/1/gid_attrs/types/0")), "RoCE v2\n");
        assert_eq!(read(&format!("{ib}ports/1/gid_attrs/types/1")), "RoCE v2\n");
        assert!(!v.join(format!("{ib}ports/1/gid_attrs/types/2")).exists());
        assert_eq!(read(&format!("{ib}ports/1/gid_attrs/ndevs/1")), "lo\n");
        assert_eq!(
            read("sys/class/infiniband/rxe1/ports/1/gid_attrs/ndevs/0"),
            "veth9\n"
        );
        assert_eq!(
            fs::read_link(v.join("sys/class/infiniband/rxe1/device/net/veth9")).unwrap(),
            Path::new("/sys/class/net/veth9")
        );
        // The class entry is a link into devices/, as in sysfs.
        assert_eq!(
            fs::read_link(v.join("sys/class/infiniband/rxe0")).unwrap(),
            Path::new("../../devices/virtual/infiniband/rxe0")
        );
        assert_eq!(read("sys/class/infiniband_verbs/abi_version"), "6\n");
        assert_eq!(read("sys/class/infiniband_verbs/uverbs1/ibdev"), "rxe1\n");
        assert_eq!(read("sys/class/infiniband_verbs/uverbs1/dev"), "231:193\n");
        // The character devices are ones anybody can open.
        use std::os::unix::fs::FileTypeExt;
        let m = fs::metadata(v.join("dev/infiniband/uverbs0")).unwrap();
        assert!(m.file_type().is_char_device());
        assert!(fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(v.join("dev/infiniband/uverbs1"))
            .is_ok());
        // The same devices give the same view; others another.
        assert_eq!(ensure(&base, &devs).unwrap(), v);
        assert_ne!(ensure(&base, &devs[..1]).unwrap(), v);
        fs::remove_dir_all(&base).unwrap();
    }
}
