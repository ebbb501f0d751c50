//! What rxe-emu provides around its devices, for the middleware that
//! looks past libibverbs: UCX, libfabric, Open MPI, rdma-core's tests.
//!
//! Kernel rxe is more than its verbs: it has entries in sysfs
//! (`/sys/class/infiniband/<dev>/...`, `/sys/class/infiniband_verbs/...`)
//! and character devices (`/dev/infiniband/uverbsN`), and middleware
//! reads them directly:
//!
//! | entry | who reads it | without it |
//! |---|---|---|
//! | `/dev/infiniband/uverbsN`, a character device one can read and write | UCX (`uct_ib_device_is_accessible`: `stat` + `access`) | UCX ignores the device: no `rc_verbs`, `ud_verbs` |
//! | `ports/1/gid_attrs/types/N` = `RoCE v2` | UCX (GID selection, RoCE version of its addresses), rdma-core's sysfs fallback | every GID is taken for RoCE v1 |
//! | `ports/1/gid_attrs/ndevs/N`, `device/net/<netdev>` | UCX (subnet of a GID), rdma-core's tests (the device's IP address) | UCX's subnet check and those tests cannot find the netdev |
//! | `ports/1/gids/N`, `node_guid`, `node_type`, `ports/1/{state,link_layer}` | rdma-core's tests, tools that list devices from sysfs | the device is not found |
//! | `/sys/class/infiniband` (the directory) | Open MPI (`opal_common_verbs_check_basics`) | Open MPI's verbs components stay off |
//! | `/sys/class/infiniband_verbs/uverbsN/{ibdev,abi_version,dev}` | rdma-core's device discovery (sysfs fallback) | |
//!
//! The [`view`] is a directory holding exactly those entries for the
//! daemon's devices. [`paths`] says which paths are redirected into it; the
//! preload library (`preload/`, `librxe_emu_preload.so`, which `rxe-emu
//! exec` puts in `LD_PRELOAD`) applies that to a program's `open`, `stat`,
//! `access`, `opendir`, `readlink`, `realpath`... so that the program sees
//! the view at the kernel's paths, with no root, no mount and no user
//! namespace. Nothing outside the program sees it.
//!
//! RDMA netlink: [`netlink`] answers what the kernel's RDMA core answers
//! on a `NETLINK_RDMA` socket about its devices (`rdma dev show`, `rdma
//! link show`; rdma-core's test suite asks `rdma link show -j` for a
//! port's netdev), from the view; the preload library gives a program's
//! `NETLINK_RDMA` socket to it. Other netlink families are untouched.

pub mod netlink;
pub mod paths;
pub mod view;
