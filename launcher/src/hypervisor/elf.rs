//! What an ELF executable says about its build, read without running it:
//! the shared libraries it names (`DT_NEEDED`: a QEMU built with seccomp
//! links libseccomp) and whether its loaded, read-only data holds a string
//! (a cloud-hypervisor built with the `fw_cfg` feature holds its option's
//! name). The launcher tells a feature this way in well under a
//! millisecond, without starting a binary root is about to hand a VM.
//! 64-bit little-endian ELF only (x86_64, aarch64, riscv64); anything else
//! answers `None` and the caller asks the binary itself, in the sandbox
//! (`launch::probe`).

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;

const PT_LOAD: u32 = 1;
const PT_DYNAMIC: u32 = 2;
/// `p_flags`: the segment is writable (no string constant lives there).
const PF_W: u32 = 2;
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
/// Bytes of read-only segments searched by [`contains`] (a
/// cloud-hypervisor's are 6 MiB; the string is found in its first).
const MAX_SCAN: u64 = 256 << 20;
/// [`contains`] reads this much at a time.
const SCAN_CHUNK: usize = 1 << 20;

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

/// One program header: type, flags, file offset, virtual address, size in
/// the file.
struct Segment {
    ty: u32,
    flags: u32,
    off: u64,
    vaddr: u64,
    filesz: u64,
}

/// The program headers of the 64-bit little-endian ELF file `f`; `None`
/// when it is not one (a script, another format) or cannot be read.
fn segments(f: &File) -> Option<Vec<Segment>> {
    let eh = read_at(f, 0, 64)?;
    if &eh[..4] != b"\x7fELF" || eh[4] != 2 || eh[5] != 1 {
        return None;
    }
    let phoff = u64_at(&eh, 0x20)?;
    let phentsize = u16_at(&eh, 0x36)? as usize;
    let phnum = u16_at(&eh, 0x38)? as usize;
    if phentsize < 56 || phnum == 0 || phnum > MAX_PHNUM {
        return None;
    }
    let ph = read_at(f, phoff, phentsize * phnum)?;
    (0..phnum)
        .map(|i| {
            let p = &ph[i * phentsize..];
            Some(Segment {
                ty: u32_at(p, 0)?,
                flags: u32_at(p, 4)?,
                off: u64_at(p, 8)?,
                vaddr: u64_at(p, 16)?,
                filesz: u64_at(p, 32)?,
            })
        })
        .collect()
}

/// Does the ELF file at `path` hold the bytes `needle` in a loaded segment
/// that is not writable (where a program's string constants are)? `None`
/// when it is not a 64-bit little-endian ELF file or cannot be read. Reads
/// the segments in file order, a chunk at a time, and stops at the first
/// match (at most `MAX_SCAN` bytes).
pub fn contains(path: &Path, needle: &[u8]) -> Option<bool> {
    if needle.is_empty() || needle.len() > SCAN_CHUNK {
        return None;
    }
    let f = File::open(path).ok()?;
    let mut read_only: Vec<Segment> = segments(&f)?
        .into_iter()
        .filter(|s| s.ty == PT_LOAD && s.flags & PF_W == 0)
        .collect();
    read_only.sort_by_key(|s| s.off);
    let finder = memchr::memmem::Finder::new(needle);
    let overlap = needle.len() - 1;
    let mut budget = MAX_SCAN;
    let mut buf = vec![0u8; SCAN_CHUNK + overlap];
    for s in read_only {
        let end = s.off.checked_add(s.filesz)?;
        let mut at = s.off;
        // Bytes carried over from the previous chunk, so that a match
        // across the boundary is found.
        let mut kept = 0usize;
        while at < end && budget > 0 {
            let want = usize::try_from((end - at).min(budget).min(SCAN_CHUNK as u64)).ok()?;
            f.read_exact_at(&mut buf[kept..kept + want], at).ok()?;
            if finder.find(&buf[..kept + want]).is_some() {
                return Some(true);
            }
            let have = kept + want;
            kept = overlap.min(have);
            buf.copy_within(have - kept..have, 0);
            at += want as u64;
            budget -= want as u64;
        }
    }
    Some(false)
}

/// `DT_NEEDED` names of the ELF file at `path`; `None` when it is not a
/// 64-bit little-endian dynamically linked ELF file (a script, a static
/// binary, another format) or cannot be read.
pub fn needed(path: &Path) -> Option<Vec<String>> {
    let f = File::open(path).ok()?;
    let mut loads = Vec::new();
    let mut dynamic = None;
    for s in segments(&f)? {
        match s.ty {
            PT_LOAD => loads.push((s.vaddr, s.off, s.filesz)),
            PT_DYNAMIC => dynamic = Some((s.off, s.filesz)),
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

    /// A string constant of this test, as the compiled binary holds it.
    const MARKER: &str = "vmwarden-elf-contains-marker-7f3a";

    #[test]
    fn finds_a_string_constant_of_this_test_binary_and_not_an_absent_one() {
        let me = std::env::current_exe().unwrap();
        assert_eq!(contains(&me, MARKER.as_bytes()), Some(true));
        // Built at run time: the bytes are in no segment of the file.
        let absent: String = MARKER.chars().rev().collect::<String>() + "-absent";
        assert_eq!(contains(&me, absent.as_bytes()), Some(false));
    }

    #[test]
    fn a_script_is_not_judged() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("qemu");
        std::fs::write(&p, "#!/bin/sh\nexit 0\n").unwrap();
        assert_eq!(needed(&p), None);
        assert_eq!(links_libseccomp(&p), None);
        assert_eq!(contains(&p, b"exit"), None);
    }
}
