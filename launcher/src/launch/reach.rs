//! A test seam, honoured only by builds with the `fault-injection`
//! feature: `VMWARDEN_TEST_REACH` (captured before the launcher clears its
//! environment) lists Unix sockets, one a line as `TYPE ADDRESS` (`TYPE`
//! as `/proc/net/unix` states it: 1 stream, 2 datagram, 5 seqpacket;
//! `ADDRESS` a path, or `@NAME` for an abstract one). Each helper of
//! vmwarden's own code (vmm-notify, the console relay), once confined and
//! before it serves anything, tries to connect to every one, and to an
//! abstract socket it binds itself (the control: its own answers), and
//! writes `REACH NAME "ADDRESS" ANSWERED` or `… refused ERRNO` per socket,
//! then `REACH-DONE NAME`, to stderr. Its code cannot be replaced by a
//! stand-in as an `execve`d helper's can, so this is how
//! `hostile_sockets.rs` shows what a compromised one could reach.

use std::os::fd::AsRawFd;
use std::sync::OnceLock;

use nix::errno::Errno;
use nix::sys::socket::{
    bind, connect, listen, socket, AddressFamily, Backlog, SockFlag, SockType, UnixAddr,
};

static TARGETS: OnceLock<String> = OnceLock::new();

/// Keep `VMWARDEN_TEST_REACH`'s value (a build without the feature keeps
/// nothing).
pub fn capture(value: Option<String>) {
    if cfg!(feature = "fault-injection") {
        if let Some(v) = value {
            let _ = TARGETS.set(v);
        }
    }
}

/// Try every socket captured, as helper `name` (see the module docs).
pub fn try_all(name: &str) {
    let Some(list) = TARGETS.get() else {
        return;
    };
    let mut out = String::new();
    let own = format!("@vmwt-reach-own-{}", std::process::id());
    let mine = socket(
        AddressFamily::Unix,
        SockType::Stream,
        SockFlag::SOCK_CLOEXEC,
        None,
    )
    .and_then(|s| {
        let a = UnixAddr::new_abstract(&own.as_bytes()[1..])?;
        bind(s.as_raw_fd(), &a)?;
        listen(&s, Backlog::new(8).unwrap_or(Backlog::MAXCONN))?;
        Ok(s)
    });
    let targets = list
        .lines()
        .filter_map(|l| l.split_once(' '))
        .chain(std::iter::once(("1", own.as_str())));
    for (kind, addr) in targets {
        let ty = match kind {
            "1" => SockType::Stream,
            "2" => SockType::Datagram,
            "5" => SockType::SeqPacket,
            _ => continue,
        };
        let r = match attempt(ty, addr) {
            Ok(()) | Err(Errno::EAGAIN) => "ANSWERED".to_string(),
            Err(e) => format!("refused {e:?}"),
        };
        out.push_str(&format!("REACH {name} {addr:?} {r}\n"));
    }
    out.push_str(&format!("REACH-DONE {name}\n"));
    drop(mine);
    let _ = nix::unistd::write(std::io::stderr(), out.as_bytes());
}

fn attempt(ty: SockType, addr: &str) -> Result<(), Errno> {
    let fd = socket(
        AddressFamily::Unix,
        ty,
        SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC,
        None,
    )?;
    let a = match addr.strip_prefix('@') {
        Some(n) => UnixAddr::new_abstract(n.as_bytes())?,
        None => UnixAddr::new(addr)?,
    };
    connect(fd.as_raw_fd(), &a)
}
