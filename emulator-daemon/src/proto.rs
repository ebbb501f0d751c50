//! The control protocol between `rxe-emud` and its clients: one line per
//! request and per reply over a Unix stream socket. An `OPEN` reply
//! carries the slot's UDP socket as `SCM_RIGHTS`.
//!
//! ```text
//! OPEN <device>            -> OK name=rxe0 addr=127.0.0.1 netdev_mtu=65536 slot=3
//!                                qpn_lo=0x30011 qpn_hi=0x3ffff qpn_first=0x31011 key_seed=...
//!                                [like=6.1|6.12|mlx5 [cc=rpg_ai_rate:10,min_time_between_cnps:8]]
//!                             ERR <message>
//! STATUS                   -> OK <n> followed by n lines
//! STOP                     -> OK stopping
//! ```
//!
//! The connection that opened a device stays open for the device's life:
//! its end is how the daemon learns the client is gone, and how the client
//! learns the daemon is.

use std::net::IpAddr;
use std::path::PathBuf;

/// Environment variable naming the daemon's control socket.
pub const SOCKET_ENV: &str = "RXE_EMU_SOCKET";

/// Where the per-user daemon listens: `$RXE_EMU_SOCKET`, else
/// `$XDG_RUNTIME_DIR/rxe-emu/rxe-emud.sock`, else
/// `/tmp/rxe-emu-<uid>/rxe-emud.sock`. The directory is private to the
/// user (mode 0700) and the socket is mode 0600.
pub fn default_socket_path() -> PathBuf {
    if let Some(p) = std::env::var_os(SOCKET_ENV).filter(|p| !p.is_empty()) {
        return PathBuf::from(p);
    }
    let dir = match std::env::var_os("XDG_RUNTIME_DIR").filter(|d| !d.is_empty()) {
        Some(d) => PathBuf::from(d).join("rxe-emu"),
        None => PathBuf::from(format!("/tmp/rxe-emu-{}", nix::unistd::getuid())),
    };
    dir.join("rxe-emud.sock")
}

/// What a client needs to run a device's engine in its own process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    /// Device name (`rxe0`).
    pub name: String,
    /// The address the device owns (UDP 4791 on it).
    pub addr: IpAddr,
    /// MTU of the netdev that has the address.
    pub netdev_mtu: u32,
    /// The client's slot.
    pub slot: u32,
    /// The slot's QPN range, inclusive.
    pub qpn_lo: u32,
    /// Last QPN of the slot.
    pub qpn_hi: u32,
    /// The first QPN to hand out (moves on each time the slot changes
    /// owner).
    pub qpn_first: u32,
    /// Seed for the client's key bytes.
    pub key_seed: u64,
    /// What the device is like: the newest kernel rxe (`like=` absent), an
    /// older one or ConnectX.
    pub like: rxe_core::Like,
    /// Congestion-control parameters that differ from the defaults, in
    /// `CcParams::specs` order (`rxe-emu cc set`).
    pub cc_params: Vec<(String, u32)>,
    /// The daemon serves other users too (`--any-user`): the device's
    /// shared memory is then writable by processes of other users, so its
    /// processes must not trust each other's placement tables
    /// (`local_link`'s placement is off).
    pub any_user: bool,
}

impl DeviceInfo {
    /// The `OK ...` reply line (without newline).
    pub fn to_line(&self) -> String {
        let mut l = format!(
            "OK name={} addr={} netdev_mtu={} slot={} qpn_lo={:#x} qpn_hi={:#x} qpn_first={:#x} key_seed={}",
            self.name,
            self.addr,
            self.netdev_mtu,
            self.slot,
            self.qpn_lo,
            self.qpn_hi,
            self.qpn_first,
            self.key_seed
        );
        if self.like != rxe_core::Like::default() {
            l += &format!(" like={}", self.like.name());
        }
        if !self.cc_params.is_empty() {
            let kv: Vec<String> = self
                .cc_params
                .iter()
                .map(|(k, v)| format!("{k}:{v}"))
                .collect();
            l += &format!(" cc={}", kv.join(","));
        }
        if self.any_user {
            l += " any_user=1";
        }
        l
    }

    /// Parse an `OK ...` reply line.
    pub fn from_line(line: &str) -> Result<DeviceInfo, String> {
        let rest = line
            .trim_end()
            .strip_prefix("OK ")
            .ok_or_else(|| format!("unexpected reply from rxe-emud: {line:?}"))?;
        let mut get = std::collections::HashMap::new();
        for kv in rest.split_whitespace() {
            if let Some((k, v)) = kv.split_once('=') {
                get.insert(k, v);
            }
        }
        let field = |k: &str| -> Result<&str, String> {
            get.get(k)
                .copied()
                .ok_or_else(|| format!("rxe-emud reply lacks {k}: {line:?}"))
        };
        let num = |k: &str| -> Result<u64, String> {
            let v = field(k)?;
            let r = match v.strip_prefix("0x") {
                Some(h) => u64::from_str_radix(h, 16),
                None => v.parse(),
            };
            r.map_err(|_| format!("rxe-emud reply has a bad {k}: {v:?}"))
        };
        let u32_of = |k: &str| -> Result<u32, String> {
            u32::try_from(num(k)?).map_err(|_| format!("rxe-emud reply: {k} out of range"))
        };
        Ok(DeviceInfo {
            name: field("name")?.to_string(),
            addr: field("addr")?
                .parse()
                .map_err(|_| format!("rxe-emud reply has a bad addr: {line:?}"))?,
            netdev_mtu: u32_of("netdev_mtu")?,
            slot: u32_of("slot")?,
            qpn_lo: u32_of("qpn_lo")?,
            qpn_hi: u32_of("qpn_hi")?,
            qpn_first: u32_of("qpn_first")?,
            key_seed: num("key_seed")?,
            like: match get.get("like") {
                None => rxe_core::Like::default(),
                Some(m) => rxe_core::Like::from_name(m)
                    .ok_or_else(|| format!("rxe-emud reply has an unknown like={m}: {line:?}"))?,
            },
            cc_params: match get.get("cc") {
                None => Vec::new(),
                Some(list) => list
                    .split(',')
                    .map(|kv| {
                        let (k, v) = kv.split_once(':')?;
                        Some((k.to_string(), v.parse().ok()?))
                    })
                    .collect::<Option<Vec<_>>>()
                    .ok_or_else(|| format!("rxe-emud reply has a bad cc={list}: {line:?}"))?,
            },
            any_user: get.get("any_user") == Some(&"1"),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_info_round_trips_and_bad_lines_are_errors() {
        let d = DeviceInfo {
            name: "rxe0".into(),
            addr: "::1".parse().unwrap(),
            netdev_mtu: 65536,
            slot: 5,
            qpn_lo: 0x50011,
            qpn_hi: 0x5ffff,
            qpn_first: 0x51011,
            key_seed: 77,
            like: rxe_core::Like::default(),
            cc_params: Vec::new(),
            any_user: false,
        };
        assert_eq!(DeviceInfo::from_line(&d.to_line()).unwrap(), d);
        let shared = DeviceInfo {
            any_user: true,
            ..d.clone()
        };
        assert!(shared.to_line().ends_with(" any_user=1"));
        assert_eq!(DeviceInfo::from_line(&shared.to_line()).unwrap(), shared);
        // A kernel-rxe-like device's reply is what it always was.
        assert!(!d.to_line().contains("like=") && !d.to_line().contains("cc="));
        let mlx5 = DeviceInfo {
            like: rxe_core::Like::from_name("mlx5").unwrap(),
            cc_params: vec![("rpg_ai_rate".into(), 10), ("rpg_gd".into(), 9)],
            ..d.clone()
        };
        assert!(mlx5
            .to_line()
            .ends_with(" like=mlx5 cc=rpg_ai_rate:10,rpg_gd:9"));
        assert_eq!(DeviceInfo::from_line(&mlx5.to_line()).unwrap(), mlx5);
        assert!(DeviceInfo::from_line(&(d.to_line() + " like=cx9")).is_err());
        let v61 = DeviceInfo {
            like: rxe_core::Like::from_name("6.1").unwrap(),
            ..d.clone()
        };
        assert!(v61.to_line().ends_with(" like=6.1"));
        assert_eq!(DeviceInfo::from_line(&v61.to_line()).unwrap(), v61);
        assert!(DeviceInfo::from_line(&(d.to_line() + " cc=rpg_gd")).is_err());
        assert!(DeviceInfo::from_line("ERR no such device").is_err());
        assert!(DeviceInfo::from_line("OK name=rxe0").is_err());
        assert!(DeviceInfo::from_line(&d.to_line().replace("slot=5", "slot=x")).is_err());
    }
}
