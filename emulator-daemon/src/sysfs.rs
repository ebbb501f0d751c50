//! A private view of `/sys/class/infiniband` for one command
//! (`rxe-emu exec --sysfs`): the entries kernel rxe has there, for the
//! daemon's devices, so tools that look a device up in sysfs rather than
//! through libibverbs find it too (rdma-core's Python tests read
//! `/sys/class/infiniband/<dev>/device/net/` to find a device's netdev and
//! its IP address).
//!
//! sysfs cannot be written, and `/sys/class/infiniband` does not exist on
//! a host without an RDMA driver, so the view is a mount namespace of the
//! calling process (a user namespace too when not root, mapping the user
//! to itself): a tmpfs holding a bind mount of every `/sys/class/*`
//! directory plus an `infiniband/` tree of our own, mounted over
//! `/sys/class`. Nothing outside the process (and what it starts) sees it.
//!
//! What each device gets (kernel rxe's names and formats):
//! `node_type` (`1: CA`), `node_guid`, `ports/1/{state, phys_state,
//! link_layer}`, and `device/net/<netdev>` linking to `/sys/class/net/`.

use std::fs;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use nix::mount::{mount, umount2, MntFlags, MsFlags};
use nix::sched::{unshare, CloneFlags};

/// A device as the view shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SysfsDevice {
    /// `rxe0`.
    pub name: String,
    /// Its address (for the node GUID).
    pub addr: IpAddr,
    /// The netdev that has the address, if any.
    pub netdev: Option<String>,
}

/// The devices of a daemon's `STATUS` reply.
pub fn devices_of_status(status: &str) -> Vec<SysfsDevice> {
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
            Some(SysfsDevice { name, addr, netdev })
        })
        .collect()
}

/// Node GUID as kernel rxe shows it (`node_guid`): the EUI-64 of the
/// device's MAC, in four groups of four hex digits.
fn node_guid(addr: IpAddr) -> String {
    let m = wire::frame::mac_for(addr);
    let g = [m[0] ^ 2, m[1], m[2], 0xff, 0xfe, m[3], m[4], m[5]];
    format!(
        "{:02x}{:02x}:{:02x}{:02x}:{:02x}{:02x}:{:02x}{:02x}",
        g[0], g[1], g[2], g[3], g[4], g[5], g[6], g[7]
    )
}

fn io(what: &Path, e: impl std::fmt::Display) -> String {
    format!("{}: {e}", what.display())
}

/// Write the `infiniband/` tree for `devs` under `root`.
pub fn write_tree(root: &Path, devs: &[SysfsDevice]) -> Result<(), String> {
    for d in devs {
        let dev = root.join("infiniband").join(&d.name);
        let port = dev.join("ports/1");
        fs::create_dir_all(&port).map_err(|e| io(&port, e))?;
        let files = [
            (dev.join("node_type"), "1: CA\n".to_string()),
            (dev.join("node_guid"), format!("{}\n", node_guid(d.addr))),
            (port.join("state"), "4: ACTIVE\n".into()),
            (port.join("phys_state"), "5: LinkUp\n".into()),
            (port.join("link_layer"), "Ethernet\n".into()),
        ];
        for (p, text) in files {
            fs::write(&p, text).map_err(|e| io(&p, e))?;
        }
        let net = dev.join("device/net");
        fs::create_dir_all(&net).map_err(|e| io(&net, e))?;
        if let Some(n) = &d.netdev {
            let link = net.join(n);
            std::os::unix::fs::symlink(Path::new("/sys/class/net").join(n), &link)
                .map_err(|e| io(&link, e))?;
        }
    }
    Ok(())
}

fn write_id_map(file: &str, id: u32) -> Result<(), String> {
    fs::write(file, format!("{id} {id} 1\n")).map_err(|e| format!("{file}: {e}"))
}

/// Enter a mount namespace in which `/sys/class/infiniband` lists `devs`
/// (see the module documentation). The calling process must be single
/// threaded (it is about to exec).
pub fn enter_view(devs: &[SysfsDevice]) -> Result<(), String> {
    let uid = nix::unistd::geteuid().as_raw();
    let gid = nix::unistd::getegid().as_raw();
    if uid == 0 {
        unshare(CloneFlags::CLONE_NEWNS).map_err(|e| format!("unshare(CLONE_NEWNS): {e}"))?;
    } else {
        unshare(CloneFlags::CLONE_NEWUSER | CloneFlags::CLONE_NEWNS).map_err(|e| {
            format!("unshare(CLONE_NEWUSER|CLONE_NEWNS): {e} (are unprivileged user namespaces off? sysctl kernel.unprivileged_userns_clone)")
        })?;
        fs::write("/proc/self/setgroups", "deny").map_err(|e| format!("setgroups: {e}"))?;
        write_id_map("/proc/self/uid_map", uid)?;
        write_id_map("/proc/self/gid_map", gid)?;
    }
    let none: Option<&str> = None;
    mount(none, "/", none, MsFlags::MS_REC | MsFlags::MS_PRIVATE, none)
        .map_err(|e| format!("making / private: {e}"))?;
    let class = Path::new("/sys/class");
    let entries: Vec<PathBuf> = fs::read_dir(class)
        .map_err(|e| io(class, e))?
        .filter_map(|e| e.ok().map(|e| e.file_name()))
        .filter(|n| n != "infiniband")
        .map(PathBuf::from)
        .collect();
    let stage = std::env::temp_dir().join(format!("rxe-emu-sysfs-{}", std::process::id()));
    fs::create_dir_all(&stage).map_err(|e| io(&stage, e))?;
    mount(
        Some("rxe-emu"),
        &stage,
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        Some("mode=0755"),
    )
    .map_err(|e| io(&stage, format!("mount tmpfs: {e}")))?;
    let result = (|| {
        for name in &entries {
            let (src, dst) = (class.join(name), stage.join(name));
            fs::create_dir(&dst).map_err(|e| io(&dst, e))?;
            mount(
                Some(&src),
                &dst,
                none,
                MsFlags::MS_BIND | MsFlags::MS_REC,
                none,
            )
            .map_err(|e| io(&src, format!("bind mount: {e}")))?;
        }
        write_tree(&stage, devs)?;
        mount(
            Some(&stage),
            class,
            none,
            MsFlags::MS_BIND | MsFlags::MS_REC,
            none,
        )
        .map_err(|e| io(class, format!("bind mount: {e}")))
    })();
    let _ = umount2(&stage, MntFlags::MNT_DETACH);
    let _ = fs::remove_dir(&stage);
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_lines_give_devices_and_the_tree_has_kernel_rxe_names() {
        let st = "rxe-emud pid 1 socket /x\n\
                  device rxe0 addr 10.0.0.1 netdev_mtu 1500 slots 0/63 dropped_no_owner 0 netdev eth0\n\
                  device rxe1 addr 127.0.0.5 netdev_mtu 65536 slots 1/63 netdev -\n  slot 1 pid 5\n";
        let devs = devices_of_status(st);
        assert_eq!(
            devs,
            [
                SysfsDevice {
                    name: "rxe0".into(),
                    addr: "10.0.0.1".parse().unwrap(),
                    netdev: Some("eth0".into())
                },
                SysfsDevice {
                    name: "rxe1".into(),
                    addr: "127.0.0.5".parse().unwrap(),
                    netdev: None
                }
            ]
        );
        let root = std::env::temp_dir().join(format!("rxe-sysfs-test-{}", std::process::id()));
        let _ = fs::remove_dir_all(&root);
        write_tree(&root, &devs).unwrap();
        let ib = root.join("infiniband");
        assert_eq!(
            fs::read_link(ib.join("rxe0/device/net/eth0")).unwrap(),
            Path::new("/sys/class/net/eth0")
        );
        assert_eq!(fs::read_dir(ib.join("rxe1/device/net")).unwrap().count(), 0);
        assert_eq!(
            fs::read_to_string(ib.join("rxe0/ports/1/state")).unwrap(),
            "4: ACTIVE\n"
        );
        let guid = fs::read_to_string(ib.join("rxe0/node_guid")).unwrap();
        assert_eq!(guid.len(), 20, "{guid:?}");
        fs::remove_dir_all(&root).unwrap();
    }
}
