//! Unit tests of the self-sandboxing helper's filter (`launch/seccomp.rs`).

use super::tests::run;
use super::*;

#[test]
fn a_self_sandboxing_helper_may_make_its_own_sandbox_and_ip_sockets_only() {
    let arch = match std::env::consts::ARCH {
        "x86_64" => 62 | 0x8000_0000 | 0x4000_0000,
        "aarch64" => 183 | 0x8000_0000 | 0x4000_0000,
        _ => return,
    };
    let own = &self_sandboxing_programs().unwrap()[0];
    let hv = &programs().unwrap()[0];
    let (allow, eperm, eafns) = (
        libc::SECCOMP_RET_ALLOW,
        libc::SECCOMP_RET_ERRNO | EPERM,
        libc::SECCOMP_RET_ERRNO | EAFNOSUPPORT,
    );
    let nr = |n: i64| u32::try_from(n).unwrap();
    let flag = |f: libc::c_int| u64::try_from(f).unwrap();
    let passt = flag(
        libc::CLONE_NEWUSER
            | libc::CLONE_NEWNS
            | libc::CLONE_NEWIPC
            | libc::CLONE_NEWUTS
            | libc::CLONE_NEWPID,
    );
    for (what, sysno, args, want_own, want_hv) in [
        (
            "unshare(user)",
            libc::SYS_unshare,
            [flag(libc::CLONE_NEWUSER), 0, 0],
            allow,
            eperm,
        ),
        (
            "unshare(passt's prefork set)",
            libc::SYS_unshare,
            [passt, 0, 0],
            allow,
            eperm,
        ),
        (
            "unshare(net)",
            libc::SYS_unshare,
            [flag(libc::CLONE_NEWNET), 0, 0],
            eperm,
            eperm,
        ),
        (
            "unshare(user|net)",
            libc::SYS_unshare,
            [flag(libc::CLONE_NEWUSER | libc::CLONE_NEWNET), 0, 0],
            eperm,
            eperm,
        ),
        (
            "unshare(cgroup)",
            libc::SYS_unshare,
            [flag(libc::CLONE_NEWCGROUP), 0, 0],
            eperm,
            eperm,
        ),
        (
            "unshare(time)",
            libc::SYS_unshare,
            [CLONE_NEWTIME, 0, 0],
            eperm,
            eperm,
        ),
        (
            "clone(user)",
            libc::SYS_clone,
            [flag(libc::CLONE_NEWUSER), 0, 0],
            eperm,
            eperm,
        ),
        ("setns", libc::SYS_setns, [3, 0, 0], eperm, eperm),
        (
            "socket(inet, tcp)",
            libc::SYS_socket,
            [2, 1, 0],
            allow,
            eafns,
        ),
        (
            "socket(inet6, udp)",
            libc::SYS_socket,
            [10, 2, 0],
            allow,
            eafns,
        ),
        (
            "socket(netlink, route)",
            libc::SYS_socket,
            [16, 3, 0],
            allow,
            eafns,
        ),
        (
            "socket(netlink, audit)",
            libc::SYS_socket,
            [16, 3, 9],
            eafns,
            eafns,
        ),
        ("socket(packet)", libc::SYS_socket, [17, 3, 0], eafns, eafns),
        ("socket(vsock)", libc::SYS_socket, [40, 1, 0], eafns, eafns),
        ("socket(unix)", libc::SYS_socket, [1, 1, 0], allow, allow),
    ] {
        let args = [args[0], args[1], args[2], 0, 0, 0];
        assert_eq!(run(own, arch, nr(sysno), args), want_own, "passt: {what}");
        assert_eq!(
            run(hv, arch, nr(sysno), args),
            want_hv,
            "hypervisor: {what}"
        );
    }
    // The rest is the hypervisor's filter.
    let fchmod = nr(libc::SYS_fchmod);
    assert_eq!(run(own, arch, fchmod, [3, 0o4755, 0, 0, 0, 0]), eperm);
    assert_eq!(run(own, arch, nr(libc::SYS_ptrace), [0; 6]), eperm);
    assert_eq!(
        SELF_SANDBOXING_FAMILIES,
        [
            libc::AF_UNIX,
            libc::AF_INET,
            libc::AF_INET6,
            libc::AF_NETLINK
        ]
        .map(flag)
    );
    assert_eq!(u64::try_from(libc::NETLINK_ROUTE).unwrap(), NETLINK_ROUTE);
}

/// A QEMU given a USB device may open the uevent socket libusb starts
/// with, and no other netlink or IP socket; without a USB device, none.
#[test]
fn a_usb_device_s_hypervisor_may_open_a_uevent_socket_only() {
    let arch = match std::env::consts::ARCH {
        "x86_64" => 62 | 0x8000_0000 | 0x4000_0000,
        "aarch64" => 183 | 0x8000_0000 | 0x4000_0000,
        _ => return,
    };
    let usb = &programs_for_usb(Taps::Inherited).unwrap()[0];
    let hv = &programs().unwrap()[0];
    let (allow, eafns) = (
        libc::SECCOMP_RET_ALLOW,
        libc::SECCOMP_RET_ERRNO | EAFNOSUPPORT,
    );
    let socket = u32::try_from(libc::SYS_socket).unwrap();
    let uevent = u64::try_from(libc::NETLINK_KOBJECT_UEVENT).unwrap();
    assert_eq!(uevent, NETLINK_KOBJECT_UEVENT);
    for (what, args, want_usb, want_hv) in [
        ("socket(netlink, uevent)", [16, 3, uevent], allow, eafns),
        ("socket(netlink, route)", [16, 3, 0], eafns, eafns),
        ("socket(inet, tcp)", [2, 1, 0], eafns, eafns),
        ("socket(unix)", [1, 1, 0], allow, allow),
    ] {
        let args = [args[0], args[1], args[2], 0, 0, 0];
        assert_eq!(run(usb, arch, socket, args), want_usb, "usb: {what}");
        assert_eq!(run(hv, arch, socket, args), want_hv, "hypervisor: {what}");
    }
    // The rest is the hypervisor's filter.
    let ptrace = u32::try_from(libc::SYS_ptrace).unwrap();
    assert_eq!(
        run(usb, arch, ptrace, [0; 6]),
        libc::SECCOMP_RET_ERRNO | EPERM
    );
}
