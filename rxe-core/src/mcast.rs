//! Multicast groups of UD QPs (kernel `rxe_mcast.c`, and the checks of
//! `ib_attach_mcast` in the IB core).
//!
//! A group is named by its GID: on RoCEv2 an IPv4-mapped GID of a class D
//! address (`::ffff:239.1.2.3`) or an IPv6 multicast GID (`ff0e::..`). A
//! datagram whose BTH destination QPN is 0xFFFFFF and whose IP destination
//! is the group's address goes to every QP attached to the group, each
//! consuming its own receive WQE (IBTA 10.5.2.3); `recv.rs` does that.
//! Joining the group on the network (IGMP/MLD, a socket bound to the
//! group's address) is the driver's job: `attach` and `detach` say when a
//! group starts and stops having members here.

use std::collections::BTreeMap;
use std::net::Ipv6Addr;

use crate::caps::DeviceCaps;
use crate::error::{Error, Result};

/// The multicast QPN (IBTA 9.2): a BTH destination QPN that names a group.
pub const MULTICAST_QPN: u32 = 0x00ff_ffff;

/// Whether `gid` names a multicast group (kernel `rdma_is_multicast_addr`:
/// an IPv4-mapped class D address, or an IPv6 address in ff00::/8).
pub fn is_multicast_gid(gid: [u8; 16]) -> bool {
    match Ipv6Addr::from(gid).to_ipv4_mapped() {
        Some(v4) => v4.is_multicast(),
        None => gid[0] == 0xff,
    }
}

/// The device's multicast groups: for each group GID, the QPNs attached,
/// in the order they attached (deliveries go in that order).
#[derive(Debug, Default)]
pub(crate) struct Groups {
    groups: BTreeMap<[u8; 16], Vec<u32>>,
    /// Attachments over all groups (`max_total_mcast_qp_attach`).
    total: u32,
}

impl Groups {
    /// Attach `qpn` to `gid`. `Ok(true)` when the group is new on this
    /// device (the driver must join it). Attaching twice is not an error
    /// and changes nothing (kernel `__rxe_init_mca` finds the QP listed).
    pub fn attach(&mut self, caps: &DeviceCaps, qpn: u32, gid: [u8; 16]) -> Result<bool> {
        if !is_multicast_gid(gid) {
            return Err(Error::Invalid(format!(
                "{} is not a multicast GID (an IPv4-mapped 224.0.0.0/4 address or ff00::/8)",
                Ipv6Addr::from(gid)
            )));
        }
        if let Some(members) = self.groups.get(&gid) {
            if members.contains(&qpn) {
                return Ok(false);
            }
            if members.len() as u32 >= caps.max_mcast_qp_attach {
                return Err(Error::NoMemory(format!(
                    "multicast group {} already has {} QPs (max_mcast_qp_attach)",
                    Ipv6Addr::from(gid),
                    caps.max_mcast_qp_attach
                )));
            }
        } else if self.groups.len() as u32 >= caps.max_mcast_grp {
            return Err(Error::NoMemory(format!(
                "the device has {} multicast groups (max_mcast_grp)",
                caps.max_mcast_grp
            )));
        }
        let max_total = caps.max_mcast_grp.saturating_mul(caps.max_mcast_qp_attach);
        if self.total >= max_total {
            return Err(Error::NoMemory(format!(
                "the device has {max_total} multicast attachments (max_total_mcast_qp_attach)"
            )));
        }
        let members = self.groups.entry(gid).or_default();
        members.push(qpn);
        self.total += 1;
        Ok(members.len() == 1)
    }

    /// Detach `qpn` from `gid`. `Ok(true)` when the group has no member
    /// left (the driver may leave it). Not attached: EINVAL, as the kernel.
    pub fn detach(&mut self, qpn: u32, gid: [u8; 16]) -> Result<bool> {
        let not_attached = || {
            Error::Invalid(format!(
                "QP {qpn:#x} is not attached to multicast group {}",
                Ipv6Addr::from(gid)
            ))
        };
        let members = self.groups.get_mut(&gid).ok_or_else(not_attached)?;
        let i = members
            .iter()
            .position(|&q| q == qpn)
            .ok_or_else(not_attached)?;
        members.remove(i);
        self.total -= 1;
        if members.is_empty() {
            self.groups.remove(&gid);
            return Ok(true);
        }
        Ok(false)
    }

    /// Detach `qpn` from every group; the groups left without members.
    pub fn detach_all(&mut self, qpn: u32) -> Vec<[u8; 16]> {
        let mine: Vec<[u8; 16]> = self
            .groups
            .iter()
            .filter(|(_, m)| m.contains(&qpn))
            .map(|(g, _)| *g)
            .collect();
        mine.into_iter()
            .filter(|g| self.detach(qpn, *g).unwrap_or(false))
            .collect()
    }

    /// The groups `qpn` is attached to.
    pub fn of_qp(&self, qpn: u32) -> Vec<[u8; 16]> {
        self.groups
            .iter()
            .filter(|(_, m)| m.contains(&qpn))
            .map(|(g, _)| *g)
            .collect()
    }

    /// The QPs attached to `gid`, in attach order.
    pub fn members(&self, gid: &[u8; 16]) -> &[u32] {
        self.groups.get(gid).map_or(&[], |m| m.as_slice())
    }

    /// Every group with at least one member.
    pub fn gids(&self) -> Vec<[u8; 16]> {
        self.groups.keys().copied().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v4(a: [u8; 4]) -> [u8; 16] {
        std::net::Ipv4Addr::from(a).to_ipv6_mapped().octets()
    }

    #[test]
    fn multicast_gids_are_class_d_mapped_or_ff() {
        assert!(is_multicast_gid(v4([239, 1, 2, 3])));
        assert!(is_multicast_gid(v4([224, 0, 0, 1])));
        assert!(!is_multicast_gid(v4([10, 0, 0, 1])));
        assert!(is_multicast_gid(
            "ff0e::1".parse::<Ipv6Addr>().unwrap().octets()
        ));
        assert!(!is_multicast_gid(
            "fe80::1".parse::<Ipv6Addr>().unwrap().octets()
        ));
    }

    #[test]
    fn attach_detach_limits_and_errors() {
        let caps = DeviceCaps {
            max_mcast_grp: 2,
            max_mcast_qp_attach: 2,
            ..DeviceCaps::default()
        };
        let mut g = Groups::default();
        let (a, b, c) = (v4([239, 0, 0, 1]), v4([239, 0, 0, 2]), v4([239, 0, 0, 3]));
        assert!(g.attach(&caps, 0x11, a).unwrap());
        assert!(!g.attach(&caps, 0x11, a).unwrap(), "twice: no change");
        assert!(!g.attach(&caps, 0x12, a).unwrap());
        assert_eq!(g.members(&a), &[0x11, 0x12]);
        assert!(matches!(g.attach(&caps, 0x13, a), Err(Error::NoMemory(_))));
        assert!(g.attach(&caps, 0x11, b).unwrap());
        assert!(matches!(g.attach(&caps, 0x11, c), Err(Error::NoMemory(_))));
        assert!(matches!(
            g.attach(&caps, 0x11, v4([10, 0, 0, 1])),
            Err(Error::Invalid(_))
        ));
        assert!(matches!(g.detach(0x13, a), Err(Error::Invalid(_))));
        assert!(matches!(g.detach(0x11, c), Err(Error::Invalid(_))));
        assert_eq!(g.of_qp(0x11), vec![a, b]);
        assert!(!g.detach(0x12, a).unwrap());
        assert_eq!(g.detach_all(0x11), vec![a, b]);
        assert!(g.gids().is_empty());
        assert_eq!(g.total, 0);
    }
}
