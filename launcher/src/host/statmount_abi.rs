//! `statmount(2)` and `listmount(2)` as the kernel publishes them
//! (include/uapi/linux/mount.h), declared once for every caller: the
//! `libc` crate has neither's structures nor, on x86_64, their numbers
//! (the same on every architecture but alpha and mips, which the launcher
//! does not build for).

pub const SYS_STATMOUNT: libc::c_long = 457;
pub const SYS_LISTMOUNT: libc::c_long = 458;

/// `LSMT_ROOT`: list from the namespace's root mount.
pub const LSMT_ROOT: u64 = u64::MAX;

/// `STATMOUNT_*`: what `statmount` is asked for.
pub const SB_BASIC: u64 = 0x1;
pub const MNT_BASIC: u64 = 0x2;
pub const MNT_POINT: u64 = 0x10;
pub const FS_TYPE: u64 = 0x20;
pub const MNT_OPTS: u64 = 0x80;
pub const SB_SOURCE: u64 = 0x200;

/// `sizeof(struct statmount)`: its strings start here.
pub const HEADER: usize = 512;

/// Byte offsets of the fields read in `struct statmount`.
pub const OFF_MNT_OPTS: usize = 4;
pub const OFF_MASK: usize = 8;
pub const OFF_SB_MAGIC: usize = 24;
pub const OFF_SB_FLAGS: usize = 32;
pub const OFF_FS_TYPE: usize = 36;
pub const OFF_MNT_PARENT_ID: usize = 48;
pub const OFF_MNT_ID_OLD: usize = 56;
pub const OFF_MNT_ATTR: usize = 64;
pub const OFF_MNT_POINT: usize = 108;
pub const OFF_SB_SOURCE: usize = 124;

/// `struct mnt_id_req` with the namespace id (`MNT_ID_REQ_SIZE_VER1`).
#[derive(Debug)]
#[repr(C)]
pub struct MntIdReq {
    size: u32,
    spare: u32,
    mnt_id: u64,
    param: u64,
    mnt_ns_id: u64,
}

/// `MNT_ID_REQ_SIZE_VER0`: the first published size, without the
/// namespace id (the caller's own namespace); Linux 6.8 takes no more.
const SIZE_VER0: u32 = 24;

impl MntIdReq {
    /// A request about mount `mnt_id` (or under it) in namespace
    /// `mnt_ns_id` (Linux 6.11).
    pub fn in_ns(mnt_id: u64, param: u64, mnt_ns_id: u64) -> MntIdReq {
        MntIdReq {
            size: size_of::<MntIdReq>() as u32,
            spare: 0,
            mnt_id,
            param,
            mnt_ns_id,
        }
    }

    /// A request about mount `mnt_id` in the caller's own namespace, of
    /// the first published size (the kernel reads no further).
    pub fn own_ns(mnt_id: u64, param: u64) -> MntIdReq {
        MntIdReq {
            size: SIZE_VER0,
            spare: 0,
            mnt_id,
            param,
            mnt_ns_id: 0,
        }
    }
}
