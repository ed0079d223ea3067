//! The shared libraries an ELF executable names (`DT_NEEDED`), read from
//! its headers without running it: how the launcher tells, in microseconds,
//! that a QEMU was built with seccomp (it links libseccomp) instead of
//! starting it (tens of milliseconds). 64-bit little-endian ELF only
//! (x86_64, aarch64, riscv64); anything else answers `None` and the caller
//! asks the binary itself.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;

const PT_LOAD: u32 = 1;
const PT_DYNAMIC: u32 = 2;
const DT_NULL: u64 = 0;
const DT_NEEDED: u64 = 1;
const DT_STRTAB: u64 = 5;
const DT_STRSZ: u64 = 10;
/// Bounds on what is read from a hostile or broken file.
const MAX_PHNUM: usize = 256;
const MAX_DYN: usize = 4096;
const MAX_STRSZ: u64 = 1 << 20;
/// Longest library name read.
const MAX_NAME: u64 = 256;
/// Largest span of the string table read in one go for the names.
const MAX_WINDOW: u64 = 64 * 1024;

fn u16_at(b: &[u8], o: usize) -> Option<u16> {
    Some(u16::from_le_bytes(b.get(o..o + 2)?.try_into().ok()?))
}
fn u32_at(b: &[u8], o: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(o..o + 4)?.try_into().ok()?))
}
fn u64_at(b: &[u8], o: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(o..o + 8)?.try_into().ok()?))
}

fn read_at(f: &File, off: u64, len: usize) -> Option<Vec<u8>> {
    let mut b = vec![0u8; len];
    f.read_exact_at(&mut b, off).ok()?;
    Some(b)
}

/// `DT_NEEDED` names of the ELF file at `path`; `None` when it is not a
/// 64-bit little-endian dynamically linked ELF file (a script, a static
/// binary, another format) or cannot be read.
pub fn needed(path: &Path) -> Option<Vec<String>> {
    let f = File::open(path).ok()?;
    let eh = read_at(&f, 0, 64)?;
    if &eh[..4] != b"\x7fELF" || eh[4] != 2 || eh[5] != 1 {
        return None;
    }
    let phoff = u64_at(&eh, 0x20)?;
    let phentsize = u16_at(&eh, 0x36)? as usize;
    let phnum = u16_at(&eh, 0x38)? as usize;
    if phentsize < 56 || phnum == 0 || phnum > MAX_PHNUM {
        return None;
    }
    let ph = read_at(&f, phoff, phentsize * phnum)?;
    let mut loads = Vec::new();
    let mut dynamic = None;
    for i in 0..phnum {
        let p = &ph[i * phentsize..];
        let (ty, off, vaddr, filesz) =
            (u32_at(p, 0)?, u64_at(p, 8)?, u64_at(p, 16)?, u64_at(p, 32)?);
        match ty {
            PT_LOAD => loads.push((vaddr, off, filesz)),
            PT_DYNAMIC => dynamic = Some((off, filesz)),
            _ => {}
        }
    }
    let (doff, dsz) = dynamic?;
    let n = ((dsz / 16) as usize).min(MAX_DYN);
    let dy = read_at(&f, doff, n * 16)?;
    let (mut strtab, mut strsz, mut needed) = (None, None, Vec::new());
    for i in 0..n {
        let (tag, val) = (u64_at(&dy, i * 16)?, u64_at(&dy, i * 16 + 8)?);
        match tag {
            DT_NULL => break,
            DT_NEEDED => needed.push(val),
            DT_STRTAB => strtab = Some(val),
            DT_STRSZ => strsz = Some(val),
            _ => {}
        }
    }
    let (addr, size) = (strtab?, strsz?.min(MAX_STRSZ));
    // The string table's address is virtual: find the segment holding it.
    let file_off = loads
        .iter()
        .find(|(v, _, sz)| addr >= *v && addr < v + sz)
        .map(|(v, o, _)| addr - v + o)?;
    // Only the part of the string table that holds the names is read (a
    // QEMU's table is half a megabyte of symbol names; linkers put the
    // library names next to each other): one window from the first name to
    // the end of the last, or each name on its own if they lie far apart.
    let (lo, hi) = (*needed.iter().min()?, *needed.iter().max()?);
    let window_end = hi.checked_add(MAX_NAME)?.min(size);
    let window = (window_end.checked_sub(lo)? <= MAX_WINDOW)
        .then(|| read_at(&f, file_off + lo, usize::try_from(window_end - lo).ok()?))
        .flatten();
    needed
        .into_iter()
        .map(|o| {
            let owned;
            let s = match &window {
                Some(w) => w.get(usize::try_from(o - lo).ok()?..)?,
                None => {
                    let len = size.checked_sub(o)?.min(MAX_NAME);
                    owned = read_at(&f, file_off + o, usize::try_from(len).ok()?)?;
                    &owned[..]
                }
            };
            let end = s.iter().position(|c| *c == 0)?;
            Some(String::from_utf8_lossy(&s[..end]).into_owned())
        })
        .collect()
}

/// Does the executable link libseccomp? `None`: cannot tell from its
/// headers (not a dynamic 64-bit LE ELF file).
pub fn links_libseccomp(path: &Path) -> Option<bool> {
    needed(path).map(|libs| libs.iter().any(|l| l.starts_with("libseccomp.so")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_needed_libraries_of_this_test_binary() {
        // The test binary itself links libc dynamically on every target
        // vmwarden supports.
        let me = std::env::current_exe().unwrap();
        let libs = needed(&me).expect("a dynamic ELF");
        assert!(libs.iter().any(|l| l.starts_with("libc.so")), "{libs:?}");
        assert_eq!(links_libseccomp(&me), Some(false));
    }

    #[test]
    fn a_script_is_not_judged() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("qemu");
        std::fs::write(&p, "#!/bin/sh\nexit 0\n").unwrap();
        assert_eq!(needed(&p), None);
        assert_eq!(links_libseccomp(&p), None);
    }
}
