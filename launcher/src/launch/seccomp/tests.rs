//! Unit tests of `launch/seccomp.rs`.

use super::*;

#[test]
fn the_filters_compile_for_this_architecture() {
    let p = programs().unwrap();
    assert_eq!(p.len(), 1);
    assert!(p.iter().all(|f| !f.is_empty()));
}

/// A classic-BPF interpreter for what the filters use: the answer of
/// `prog` for system call `nr` on `arch` with `args`.
pub(super) fn run(prog: &[sock_filter], arch: u32, nr: u32, args: [u64; 6]) -> u32 {
    let mut data = Vec::new();
    data.extend_from_slice(&nr.to_ne_bytes());
    data.extend_from_slice(&arch.to_ne_bytes());
    data.extend_from_slice(&0u64.to_ne_bytes());
    for a in args {
        data.extend_from_slice(&a.to_ne_bytes());
    }
    let (mut a, mut pc) = (0u32, 0usize);
    loop {
        let i = &prog[pc];
        pc += 1;
        let k = usize::try_from(i.k).unwrap();
        match i.code {
            0x20 => a = u32::from_ne_bytes(data[k..k + 4].try_into().unwrap()),
            0x54 => a &= i.k,
            0x05 => pc += k,
            0x06 => return i.k,
            0x15 | 0x25 | 0x35 | 0x45 => {
                let taken = match i.code {
                    0x15 => a == i.k,
                    0x25 => a > i.k,
                    0x35 => a >= i.k,
                    _ => a & i.k != 0,
                };
                pc += usize::from(if taken { i.jt } else { i.jf });
            }
            c => panic!("instruction {c:#x} not interpreted"),
        }
    }
}

#[test]
fn a_hypervisor_that_opens_taps_by_name_may_attach_but_not_persist() {
    let arch = match std::env::consts::ARCH {
        "x86_64" => 62 | 0x8000_0000 | 0x4000_0000,
        "aarch64" => 183 | 0x8000_0000 | 0x4000_0000,
        _ => return,
    };
    let nr = libc::SYS_ioctl as u32;
    let answer = |taps, cmd| {
        let p = &programs_for(taps).unwrap()[0];
        run(p, arch, nr, [3, cmd, 0, 0, 0, 0])
    };
    let eperm = libc::SECCOMP_RET_ERRNO | EPERM;
    let eexist = libc::SECCOMP_RET_ERRNO | EEXIST;
    assert_eq!(answer(Taps::Inherited, 0x4004_54ca), eexist);
    assert_eq!(answer(Taps::ByName, 0x4004_54ca), libc::SECCOMP_RET_ALLOW);
    for (name, cmd) in DENIED_IOCTLS.iter().filter(|(n, _)| *n != "TUNSETIFF") {
        assert_eq!(answer(Taps::ByName, *cmd), eperm, "{name}");
    }
}

#[test]
fn the_chained_filter_answers_as_the_stacked_ones() {
    let chained = &programs().unwrap()[0];
    let arch_x86 = 62 | 0x8000_0000 | 0x4000_0000;
    let arch = match std::env::consts::ARCH {
        "x86_64" => arch_x86,
        "aarch64" => 183 | 0x8000_0000 | 0x4000_0000,
        _ => return,
    };
    let stacked = separate().unwrap().0;
    assert!(stacked.len() >= 3);
    let mut nrs: Vec<u32> = (0..600).collect();
    nrs.extend([
        0x3fff_ffff,
        0x4000_0000,
        0x4000_0000 + 41,
        0x4000_0000 + 272,
    ]);
    nrs.extend([0x4000_0000 + 435, 0x7fff_ffff, 0xffff_ffff]);
    let mut argsets = vec![[0u64; 6], [1, 0, 0, 0, 0, 0], [2, 0, 0, 0, 0, 0]];
    for (_, bit) in NAMESPACE_FLAGS {
        argsets.push([*bit | 0x11, 0, 0, 0, 0, 0]);
    }
    argsets.push([CLONE_NEWTIME, 0, 0, 0, 0, 0]);
    for (_, cmd) in DENIED_IOCTLS {
        argsets.push([3, *cmd, 0, 0, 0, 0]);
    }
    argsets.push([3, 0x8004_54d2, 0, 0, 0, 0]); // TUNGETIFF: allowed
                                                // Modes in the second and third argument: set-id, sticky, plain.
    for mode in [0o4755, 0o2755, 0o6700, 0o1777, 0o755, 0o4000_0000] {
        argsets.push([3, mode, 0, 0, 0, 0]);
        argsets.push([3, 0, mode, 0, 0, 0]);
    }
    for a in [arch, arch ^ 0x4000_0000] {
        for nr in &nrs {
            for args in &argsets {
                let each: Vec<u32> = stacked.iter().map(|p| run(p, a, *nr, *args)).collect();
                let refusals: Vec<u32> = each
                    .iter()
                    .copied()
                    .filter(|r| *r != libc::SECCOMP_RET_ALLOW)
                    .collect();
                assert!(refusals.len() <= 1 || a != arch, "{nr}: {each:?}");
                let want = refusals.first().copied().unwrap_or(libc::SECCOMP_RET_ALLOW);
                assert_eq!(run(chained, a, *nr, *args), want, "nr {nr} args {args:?}");
            }
        }
    }
}

#[test]
fn set_id_modes_are_refused_and_every_other_mode_is_not() {
    let prog = &programs().unwrap()[0];
    let arch = match std::env::consts::ARCH {
        "x86_64" => 62 | 0x8000_0000 | 0x4000_0000,
        "aarch64" => 183 | 0x8000_0000 | 0x4000_0000,
        _ => return,
    };
    let eperm = libc::SECCOMP_RET_ERRNO | EPERM;
    assert!(CHMOD_SYSCALLS.iter().any(|(n, _, _)| *n == "fchmodat2"));
    for (name, nr, arg) in CHMOD_SYSCALLS {
        let nr = u32::try_from(*nr).unwrap();
        let at = usize::from(*arg);
        for (mode, want) in [
            (0o4755, eperm),
            (0o2755, eperm),
            (0o6755, eperm),
            (0o4000, eperm),
            (0o2000, eperm),
            (0o755, libc::SECCOMP_RET_ALLOW),
            (0o1777, libc::SECCOMP_RET_ALLOW),
            (0o777, libc::SECCOMP_RET_ALLOW),
            (0, libc::SECCOMP_RET_ALLOW),
        ] {
            let mut args = [3u64, 0, 0, 0, 0, 0];
            args[at] = mode;
            assert_eq!(run(prog, arch, nr, args), want, "{name} mode {mode:o}");
            // The set-id bits in another argument decide nothing.
            let mut other = [3u64, 0o4755, 0o4755, 0o4755, 0, 0];
            other[at] = mode;
            assert_eq!(run(prog, arch, nr, other), want, "{name} mode {mode:o}");
        }
    }
}

#[test]
fn creating_with_a_set_id_mode_is_refused_and_nothing_else_is() {
    let prog = &programs().unwrap()[0];
    let arch = match std::env::consts::ARCH {
        "x86_64" => 62 | 0x8000_0000 | 0x4000_0000,
        "aarch64" => 183 | 0x8000_0000 | 0x4000_0000,
        _ => return,
    };
    let eperm = libc::SECCOMP_RET_ERRNO | EPERM;
    let allow = libc::SECCOMP_RET_ALLOW;
    let o_tmpfile = u64::try_from(libc::O_TMPFILE).unwrap();
    let o_rdwr = u64::try_from(libc::O_RDWR).unwrap();
    assert!(CREATE_SYSCALLS.iter().any(|(n, ..)| *n == "openat"));
    for (name, nr, flags, mode_at) in CREATE_SYSCALLS {
        let nr = u32::try_from(*nr).unwrap();
        let flag_sets: Vec<(u64, bool)> = match flags {
            Some(_) => vec![(O_CREAT | o_rdwr, true), (o_tmpfile, true), (o_rdwr, false)],
            None => vec![(0, true)],
        };
        for (f, creates) in flag_sets {
            for (mode, setid) in [
                (0o104_755, true),
                (0o102_755, true),
                (0o6644, true),
                (0o100_644, false),
                (0o1777, false),
                (0o666, false),
            ] {
                let mut args = [3u64, 0, 0, 0, 0, 0];
                if let Some(fa) = flags {
                    args[usize::from(*fa)] = f;
                }
                args[usize::from(*mode_at)] = mode;
                let want = if creates && setid { eperm } else { allow };
                assert_eq!(
                    run(prog, arch, nr, args),
                    want,
                    "{name} flags {f:o} mode {mode:o}"
                );
            }
        }
    }
    let enosys = libc::SECCOMP_RET_ERRNO | ENOSYS;
    let openat2 = u32::try_from(libc::SYS_openat2).unwrap();
    assert_eq!(run(prog, arch, openat2, [3, 0, 0, 24, 0, 0]), enosys);
    // mkdirat's mode: the kernel ignores set-id bits there.
    let mkdirat = u32::try_from(libc::SYS_mkdirat).unwrap();
    assert_eq!(run(prog, arch, mkdirat, [3, 0, 0o2775, 0, 0, 0]), allow);
}

#[test]
fn the_numbers_are_the_kernels() {
    let flags = [
        libc::CLONE_NEWNS,
        libc::CLONE_NEWCGROUP,
        libc::CLONE_NEWUTS,
        libc::CLONE_NEWIPC,
        libc::CLONE_NEWUSER,
        libc::CLONE_NEWPID,
        libc::CLONE_NEWNET,
    ];
    for ((name, bit), want) in NAMESPACE_FLAGS.iter().zip(flags) {
        assert_eq!(Some(*bit), u64::try_from(want).ok(), "{name}");
    }
    assert_eq!(ALLOWED_FAMILIES, [u64::try_from(libc::AF_UNIX).unwrap()]);
    assert_eq!(SYS_FCHMODAT2, libc::SYS_fchmodat2);
    assert_eq!(S_ISUID, u64::from(libc::S_ISUID));
    assert_eq!(S_ISGID, u64::from(libc::S_ISGID));
    assert_eq!(O_CREAT, u64::try_from(libc::O_CREAT).unwrap());
    assert_eq!(
        O_TMPFILE_BIT,
        u64::try_from(libc::O_TMPFILE & !libc::O_DIRECTORY).unwrap()
    );
    assert_eq!(Ok(EPERM), u32::try_from(libc::EPERM));
    assert_eq!(Ok(EEXIST), u32::try_from(libc::EEXIST));
    assert_eq!(Ok(ENOSYS), u32::try_from(libc::ENOSYS));
    assert_eq!(Ok(EAFNOSUPPORT), u32::try_from(libc::EAFNOSUPPORT));
}

#[test]
fn an_owned_shares_processes_keep_every_rule_but_hand_setgid_chmods_on_and_make_no_process() {
    let arch = match std::env::consts::ARCH {
        "x86_64" => 62 | 0x8000_0000 | 0x4000_0000,
        "aarch64" => 183 | 0x8000_0000 | 0x4000_0000,
        _ => return,
    };
    let eperm = libc::SECCOMP_RET_ERRNO | EPERM;
    let allow = libc::SECCOMP_RET_ALLOW;
    let notif = libc::SECCOMP_RET_USER_NOTIF;
    let fchmodat = u32::try_from(libc::SYS_fchmodat).unwrap();
    let clone = u32::try_from(libc::SYS_clone).unwrap();
    let vm_readv = u32::try_from(libc::SYS_process_vm_readv).unwrap();
    let getfd = u32::try_from(libc::SYS_pidfd_getfd).unwrap();
    let ptrace = u32::try_from(libc::SYS_ptrace).unwrap();
    let thread = CLONE_THREAD | 0x0000_0100 | 0x0000_0800; // | CLONE_VM | CLONE_SIGHAND
    for role in [Role::OwnedVirtiofsd, Role::Broker] {
        let p = &programs_as(Taps::Inherited, role).unwrap()[0];
        // Set-user-ID: refused here; set-group-ID: left to the notifier.
        assert_eq!(run(p, arch, fchmodat, [3, 0, 0o4755, 0, 0, 0]), eperm);
        assert_eq!(run(p, arch, fchmodat, [3, 0, 0o2755, 0, 0, 0]), allow);
        // No new process; threads as before.
        assert_eq!(run(p, arch, clone, [0x11, 0, 0, 0, 0, 0]), eperm);
        assert_eq!(run(p, arch, clone, [thread, 0, 0, 0, 0, 0]), allow);
        let broker = role == Role::Broker;
        let want = if broker { allow } else { eperm };
        assert_eq!(run(p, arch, vm_readv, [0; 6]), want, "{role:?}");
        assert_eq!(run(p, arch, getfd, [0; 6]), want, "{role:?}");
        assert_eq!(run(p, arch, ptrace, [0; 6]), eperm, "{role:?}");
    }
    let default = &programs().unwrap()[0];
    assert_eq!(run(default, arch, fchmodat, [3, 0, 0o2755, 0, 0, 0]), eperm);
    assert_eq!(run(default, arch, clone, [0x11, 0, 0, 0, 0, 0]), allow);
    // The notifier: set-user-ID refused, set-group-ID notified, per call
    // and mode argument; nothing else touched.
    let n = notify::program();
    for (name, nr, arg) in CHMOD_SYSCALLS {
        let nr = u32::try_from(*nr).unwrap();
        for (mode, want) in [
            (0o4755, eperm),
            (0o6755, eperm),
            (0o2755, notif),
            (0o755, allow),
        ] {
            let mut args = [3u64, 0o4000, 0o4000, 0, 0, 0];
            args[usize::from(*arg)] = mode;
            args[usize::from(3 - *arg)] = 0; // the other argument: no bits
            assert_eq!(run(&n, arch, nr, args), want, "{name} {mode:o}");
        }
    }
    let openat = u32::try_from(libc::SYS_openat).unwrap();
    assert_eq!(run(&n, arch, openat, [3, 0, 0o2755, 0o2755, 0, 0]), allow);
    assert_eq!(run(&n, arch ^ 1, fchmodat, [3, 0, 0o2755, 0, 0, 0]), allow);
}
