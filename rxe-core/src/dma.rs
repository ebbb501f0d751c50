//! Moving bytes between SGE lists and packets, through checked keys.

use crate::mem::Memory;
use crate::mr::{AccessFlags, KeyTable};
use crate::wr::Sge;
use crate::PdHandle;

/// Walk the SGE list from byte `offset`, calling `f(sge, offset_in_sge,
/// len, position_in_chunk)` for each piece of the `len` bytes. Errors if the
/// list is shorter than `offset + len`.
fn walk(
    sges: &[Sge],
    mut offset: u64,
    len: usize,
    mut f: impl FnMut(&Sge, u64, usize, usize) -> Result<(), String>,
) -> Result<(), String> {
    let mut done = 0usize;
    for s in sges {
        if done == len {
            break;
        }
        let sl = u64::from(s.length);
        if offset >= sl {
            offset -= sl;
            continue;
        }
        let take = ((sl - offset) as usize).min(len - done);
        f(s, offset, take, done)?;
        done += take;
        offset = 0;
    }
    if done < len {
        return Err(format!(
            "the scatter/gather list is {} bytes short",
            len - done
        ));
    }
    Ok(())
}

/// Copy `out.len()` bytes starting at message offset `offset` out of the
/// local SGEs (requester payload, or responder READ data via one range).
pub(crate) fn gather<M: Memory>(
    mem: &M,
    keys: &KeyTable,
    pd: PdHandle,
    sges: &[Sge],
    offset: u64,
    out: &mut [u8],
) -> Result<(), String> {
    let len = out.len();
    walk(sges, offset, len, |s, off, take, pos| {
        let r = keys
            .check_local(
                pd,
                s.lkey,
                s.addr.wrapping_add(off),
                take as u64,
                AccessFlags::empty(),
            )
            .map_err(|e| format!("local SGE (addr {:#x}, lkey {:#x}): {e}", s.addr, s.lkey))?;
        mem.read(r.host_addr, &mut out[pos..pos + take])
            .map_err(|e| e.to_string())
    })
}

/// Where the `len` bytes at message offset `offset` of the local SGEs
/// are, if they lie in one SGE: that SGE checked for `needed` access as
/// [`gather`] (no access) or [`scatter`] (LOCAL_WRITE) checks it (the same
/// errors), its host address. `None`: they span several SGEs (nothing
/// checked; [`gather`] or [`scatter`] does it).
pub(crate) fn one_range(
    keys: &KeyTable,
    pd: PdHandle,
    sges: &[Sge],
    offset: u64,
    len: usize,
    needed: AccessFlags,
) -> Result<Option<u64>, String> {
    let mut pieces = 0;
    let mut at = None;
    walk(sges, offset, len, |s, off, take, _| {
        pieces += 1;
        if pieces == 1 && take == len {
            at = Some((s.addr, s.lkey, off));
        }
        Ok(())
    })?;
    let Some((addr, lkey, off)) = at.filter(|_| pieces == 1) else {
        return Ok(None);
    };
    let r = keys
        .check_local(pd, lkey, addr.wrapping_add(off), len as u64, needed)
        .map_err(|e| format!("local SGE (addr {addr:#x}, lkey {lkey:#x}): {e}"))?;
    Ok(Some(r.host_addr))
}

/// Copy `data` into the local SGEs at message offset `offset`; the MRs
/// must grant LOCAL_WRITE.
pub(crate) fn scatter<M: Memory>(
    mem: &mut M,
    keys: &KeyTable,
    pd: PdHandle,
    sges: &[Sge],
    offset: u64,
    data: &[u8],
) -> Result<(), ScatterError> {
    let total: u64 = sges.iter().map(|s| u64::from(s.length)).sum();
    if offset + data.len() as u64 > total {
        return Err(ScatterError::TooLong);
    }
    // Check every piece before writing any, so a failed scatter leaves the
    // receive buffer untouched.
    // The first pieces on the stack: a message to one SGE allocates
    // nothing.
    let mut first = [(0u64, 0usize, 0usize); 4];
    let mut n = 0;
    let mut more = Vec::new();
    walk(sges, offset, data.len(), |s, off, take, pos| {
        let r = keys
            .check_local(
                pd,
                s.lkey,
                s.addr.wrapping_add(off),
                take as u64,
                AccessFlags::LOCAL_WRITE,
            )
            .map_err(|e| format!("local SGE (addr {:#x}, lkey {:#x}): {e}", s.addr, s.lkey))?;
        match first.get_mut(n) {
            Some(p) => {
                *p = (r.host_addr, pos, take);
                n += 1;
            }
            None => more.push((r.host_addr, pos, take)),
        }
        Ok(())
    })
    .map_err(ScatterError::Protection)?;
    for &(addr, pos, take) in first[..n].iter().chain(&more) {
        mem.write(addr, &data[pos..pos + take])
            .map_err(|e| ScatterError::Protection(e.to_string()))?;
    }
    Ok(())
}

/// Why a scatter failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ScatterError {
    /// The data does not fit in the SGEs.
    TooLong,
    /// An SGE failed its key check.
    Protection(String),
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mem::VecMemory;

    #[test]
    fn gather_scatter_across_sges() {
        let mut mem = VecMemory::new();
        let mut keys = KeyTable::new(1);
        let pd = PdHandle(1);
        let a = mem.alloc(10);
        let b = mem.alloc(10);
        let ka = keys
            .reg_mr(pd, a, 10, AccessFlags::LOCAL_WRITE)
            .unwrap()
            .lkey;
        let kb = keys.reg_mr(pd, b, 10, AccessFlags::empty()).unwrap().lkey;
        let sges = [
            Sge {
                addr: a + 2,
                length: 5,
                lkey: ka,
            },
            Sge {
                addr: b,
                length: 0,
                lkey: 0xdead,
            },
            Sge {
                addr: b + 1,
                length: 6,
                lkey: kb,
            },
        ];
        mem.write(a, &[0, 1, 2, 3, 4, 5, 6, 7, 8, 9]).unwrap();
        mem.write(b, &[10, 11, 12, 13, 14, 15, 16, 17, 18, 19])
            .unwrap();
        let mut out = [0u8; 7];
        gather(&mem, &keys, pd, &sges, 2, &mut out).unwrap();
        assert_eq!(out, [4, 5, 6, 11, 12, 13, 14]);
        let mut out = [0u8; 10];
        assert!(gather(&mem, &keys, pd, &sges, 2, &mut out).is_err());
        // b's MR has no LOCAL_WRITE.
        assert!(matches!(
            scatter(&mut mem, &keys, pd, &sges, 4, &[1, 2]),
            Err(ScatterError::Protection(_))
        ));
        assert_eq!(
            scatter(&mut mem, &keys, pd, &sges, 0, &[9; 12]),
            Err(ScatterError::TooLong)
        );
        scatter(&mut mem, &keys, pd, &sges, 1, &[7, 7]).unwrap();
        assert_eq!(mem.slice(a, 10).unwrap(), &[0, 1, 2, 7, 7, 5, 6, 7, 8, 9]);
    }
}
