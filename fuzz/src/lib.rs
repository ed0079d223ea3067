//! The checks the fuzz targets run (one per parser of input that others
//! control), kept here so each target in `fuzz_targets/` is one line.
//!
//! Every check asserts more than "no panic": a property of the parser's
//! answer, and that parsing allocated at most a bound linear in the input
//! (which is first cut to what the real reader would read). Allocation is
//! measured by the counting global allocator below.

use std::alloc::{GlobalAlloc, Layout, System};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use serde_json::Value;
use vmwarden::config::extra_args;
use vmwarden::config::spec::{HypervisorKind, Spec, SpecError, MAX_SPEC_BYTES};
use vmwarden::host::peer::{self, PeerError, MAX_CONNECTION_MESSAGES, MAX_MESSAGE};
use vmwarden::host::{mountinfo, procs};
use vmwarden::hypervisor::api;
use vmwarden::hypervisor::qmp::{self, Message};
use vmwarden::hypervisor::vmm_notify::{self, Shutdown, MAX_MESSAGE as NOTIFY_MAX};
use vmwarden::identity::accounts::Accounts;
use vmwarden::instance::intent::{Intent, IntentError, MAX_INTENT_BYTES};

/// The HTTP client's cap on a reply (`hypervisor::api`): one message.
const MAX_RESPONSE: usize = MAX_MESSAGE as usize;

/// The system allocator, counting the bytes live and their high-water mark.
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

fn grew(n: usize) {
    let now = LIVE.fetch_add(n, Ordering::Relaxed) + n;
    PEAK.fetch_max(now, Ordering::Relaxed);
}

fn shrank(n: usize) {
    LIVE.fetch_sub(n, Ordering::Relaxed);
}

// SAFETY: every call is forwarded unchanged to the system allocator; the
// counters only observe sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract for `alloc` is passed on as is.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            grew(layout.size());
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract for `alloc_zeroed` is passed on as is.
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            grew(layout.size());
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract for `dealloc` is passed on as is.
        unsafe { System.dealloc(ptr, layout) };
        shrank(layout.size());
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller's contract for `realloc` is passed on as is.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            shrank(layout.size());
            grew(new_size);
        }
        p
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Run `f`, asserting that the bytes it had allocated at its peak (above
/// what was live before) stay within `per_byte * len + fixed`.
fn bounded<T>(what: &str, len: usize, per_byte: usize, fixed: usize, f: impl FnOnce() -> T) -> T {
    let base = LIVE.load(Ordering::Relaxed);
    PEAK.store(base, Ordering::Relaxed);
    let out = f();
    let peak = PEAK.load(Ordering::Relaxed).saturating_sub(base);
    let bound = per_byte * len + fixed;
    assert!(
        peak <= bound,
        "{what}: allocated {peak} bytes at peak for {len} bytes of input (bound {bound})"
    );
    out
}

/// At most `max` bytes: what a reader capped at `max` gets to parse.
fn cap(data: &[u8], max: u64) -> &[u8] {
    &data[..data.len().min(usize::try_from(max).unwrap_or(usize::MAX))]
}

/// Bytes a VM writes are not bounded by the fuzzer's input length: an input
/// starting with 0xff stands for its rest repeated to `to` bytes, so the
/// size limits are reached too.
fn stretched(data: &[u8], to: usize) -> Vec<u8> {
    match data.split_first() {
        Some((0xff, rest)) if !rest.is_empty() => rest.iter().copied().cycle().take(to).collect(),
        _ => data.to_vec(),
    }
}

/// The top-level keys of a spec: a refusal's field starts with one.
const SPEC_KEYS: &[&str] = &[
    "version",
    "name",
    "principal",
    "hypervisor",
    "vcpus",
    "memory_mib",
    "kernel",
    "initrd",
    "cmdline",
    "credentials",
    "disks",
    "interfaces",
    "landlock",
    "keep_on_purge",
    "shares",
    "virtiofsd",
    "vsock",
];

fn names_a_field(field: &str) -> bool {
    let top = field.split(['.', '[']).next().unwrap_or("");
    SPEC_KEYS.contains(&top)
}

/// A refusal: `Invalid` naming a spec field, or a JSON error that says
/// where in the text it is (line and column).
fn assert_refusal_says_where(e: &SpecError) {
    match e {
        SpecError::Invalid { field, .. } => {
            assert!(names_a_field(field), "refusal names no spec field: {e}");
        }
        SpecError::Parse { source, .. } => {
            assert!(source.line() > 0, "parse refusal says not where: {e}");
        }
        other => panic!("parsing bytes refused with a reading error: {other}"),
    }
}

/// The outcome of validating, comparable across two specs.
fn verdict(spec: &Spec, path: &Path) -> Result<(), String> {
    let control = Path::new("/run/vmwarden/fuzz/control");
    spec.validate(path, &spec.name)
        .and_then(|()| spec.validate_extra_args(path, control))
        .map_err(|e| {
            assert!(
                matches!(e, SpecError::Invalid { .. }),
                "validation refused without naming a field: {e}"
            );
            assert_refusal_says_where(&e);
            e.to_string()
        })
}

/// The spec parser and validator: bytes to a `Spec` or a refusal that names
/// a field (or a position in the text); a spec that parses re-serialises to
/// one that parses equal and validates the same.
pub fn spec(data: &[u8]) {
    let data = cap(data, MAX_SPEC_BYTES);
    let path = Path::new("/etc/vmwarden/vms/fuzz.json");
    let parsed = bounded("spec", data.len(), 48, 64 << 10, || Spec::parse(path, data));
    let spec = match parsed {
        Ok(s) => s,
        Err(e) => return assert_refusal_says_where(&e),
    };
    let first = bounded("spec validation", data.len(), 16, 64 << 10, || {
        verdict(&spec, path)
    });
    let again = serde_json::to_vec(&spec).expect("a parsed spec serialises");
    let reparsed = Spec::parse(path, &again).expect("a re-serialised spec parses");
    assert_eq!(reparsed, spec, "re-serialising changed the spec");
    assert_eq!(
        verdict(&reparsed, path),
        first,
        "re-serialised spec validates differently"
    );
}

/// The launched-spec reader: the copy a launch kept, read capped and
/// parsed as `status`, `stop` and cleanup do (without validation: it was
/// validated when it was written); one that parses round-trips.
pub fn launched_spec(data: &[u8]) {
    let data = cap(data, MAX_SPEC_BYTES);
    let path = Path::new("/run/vmwarden/fuzz/launched-spec.json");
    match bounded("launched spec", data.len(), 48, 64 << 10, || {
        Spec::parse(path, data)
    }) {
        Ok(spec) => {
            let again = serde_json::to_vec_pretty(&spec).expect("a parsed spec serialises");
            assert_eq!(
                Spec::parse(path, &again).expect("re-serialised copy parses"),
                spec
            );
        }
        Err(e) => assert_refusal_says_where(&e),
    }
}

/// The intent-record reader: a record that parses round-trips and answers
/// what the teardown asks of it; one that does not names its path.
pub fn intent(data: &[u8]) {
    let data = cap(data, MAX_INTENT_BYTES);
    let path = PathBuf::from("/run/vmwarden/fuzz/instance.json");
    match bounded("intent", data.len(), 48, 64 << 10, || {
        Intent::parse(path.clone(), data)
    }) {
        Ok(i) => {
            let _ = i.launched_spec();
            for tap in i.taps() {
                assert!(!tap.as_str().is_empty());
            }
            let again = serde_json::to_vec_pretty(&i).expect("a parsed record serialises");
            let back = Intent::parse(path, &again).expect("a re-serialised record parses");
            assert_eq!(back, i, "re-serialising changed the record");
        }
        Err(e) => {
            assert!(matches!(e, IntentError::Parse { .. }), "{e}");
            assert!(e.to_string().contains("instance.json"), "{e}");
        }
    }
}

/// The mountinfo parser: `last_at` finds exactly what `parse` lists last at
/// the same mount point.
pub fn mountinfo(data: &[u8]) {
    let data = cap(data, 1 << 20);
    let mounts = bounded("mountinfo", data.len(), 16, 4 << 10, || {
        mountinfo::parse(data)
    });
    for m in mounts.iter().take(8) {
        let want = mounts.iter().rev().find(|n| n.mount_point == m.mount_point);
        let got = mountinfo::last_at(data, &m.mount_point);
        assert_eq!(got.as_ref(), want, "last_at disagrees with parse");
    }
    let absent = Path::new("/nonexistent/\n/mount point");
    let want = mounts.iter().rev().find(|n| n.mount_point == absent);
    assert_eq!(mountinfo::last_at(data, absent).as_ref(), want);
}

/// `/proc/PID/status`: parsed without allocating, and only from the lines
/// it needs (a task names itself: `Name:` is any bytes).
pub fn proc_status(data: &[u8]) {
    let data = cap(data, 64 << 10);
    let st = bounded("proc status", data.len(), 0, 0, || {
        procs::parse_status(data)
    });
    if let Some(st) = st {
        let has = |key: &[u8]| data.split(|b| *b == b'\n').any(|l| l.starts_with(key));
        assert!(
            has(b"State:") && has(b"Uid:"),
            "status parsed without State: and Uid:"
        );
        assert!(
            has(b"Threads:") || st.threads == 1,
            "threads without Threads:"
        );
    }
}

/// passwd and group files: every entry parsed is well-formed, and written
/// back as one line it parses to itself.
pub fn accounts(data: &[u8]) {
    let data = cap(data, 1 << 20);
    // passwd first, group after a NUL byte (neither file has one).
    let mut halves = data.splitn(2, |b| *b == 0);
    let passwd = String::from_utf8_lossy(halves.next().unwrap_or_default()).into_owned();
    let group = String::from_utf8_lossy(halves.next().unwrap_or_default()).into_owned();
    let a = bounded("accounts", passwd.len() + group.len(), 16, 4 << 10, || {
        Accounts::from_text(&passwd, &group)
    });
    for u in &a.users {
        assert!(!u.name.is_empty() && !u.name.contains([':', '\n']), "{u:?}");
        let line = format!("{}:x:{}:{}::/:{}", u.name, u.uid, u.gid, u.shell);
        let back = Accounts::from_text(&line, "");
        assert_eq!(back.users.as_slice(), std::slice::from_ref(u), "{line:?}");
        let _ = a.supplementary_gids(u);
    }
    for g in &a.groups {
        assert!(!g.name.is_empty() && !g.name.contains([':', '\n']), "{g:?}");
        assert!(g.members.iter().all(|m| !m.is_empty() && !m.contains(',')));
        assert!(a.group_name(g.gid).is_some());
    }
}

/// The QMP reader: the connection's bytes cut into lines as the client
/// cuts them (`peer::take_line`, each bounded by `MAX_MESSAGE`, at most
/// `MAX_CONNECTION_MESSAGES` of them), each parsed and typed
/// (`qmp::parse_message`).
pub fn qmp(data: &[u8]) {
    let mut pending = stretched(data, usize::try_from(MAX_MESSAGE).unwrap_or(0) * 2 + 7);
    let max = usize::try_from(MAX_MESSAGE).unwrap_or(usize::MAX);
    bounded("qmp", max, 24, 64 << 10, || {
        let mut messages = 0u32;
        loop {
            match peer::take_line(&mut pending) {
                Ok(Some(line)) => {
                    assert!(
                        line.len() <= max && line.ends_with(b"\n"),
                        "{} bytes",
                        line.len()
                    );
                    messages += 1;
                    if messages > MAX_CONNECTION_MESSAGES {
                        break;
                    }
                    if let Ok(Message::Event { name, msg }) = qmp::parse_message(&line) {
                        assert_eq!(msg.get("event").and_then(Value::as_str).unwrap_or(""), name);
                    }
                }
                Ok(None) => break,
                Err(PeerError::TooLong) => break,
                Err(e) => panic!("cutting lines from bytes failed otherwise: {e}"),
            }
        }
    });
}

/// The HTTP reply reader for cloud-hypervisor and Firecracker: fed in the
/// chunks a socket might deliver (the first byte picks their size), capped
/// as the client caps it; a reply found complete at some point is the
/// reply the whole stream gives at its end, and its body is read as
/// `vm_state` reads it.
pub fn http(data: &[u8]) {
    let Some((&step, rest)) = data.split_first() else {
        return;
    };
    let data = stretched(rest, MAX_RESPONSE + 7);
    // Chunks of 64 bytes and up: every chunk re-parses the buffer here
    // (the client itself looks only at new bytes; its unit test cuts a reply
    // at every byte), so one-byte chunks of a 64 KiB input would spend the
    // run's time limit in this harness rather than in the parser.
    let step = usize::from(step % 64) * 61 + 64;
    let mut buf = Vec::new();
    let found = bounded("http", MAX_RESPONSE, 6, 64 << 10, || {
        for chunk in data.chunks(step) {
            buf.extend_from_slice(chunk);
            if buf.len() > MAX_RESPONSE {
                return None;
            }
            match api::parse_response(&buf, false) {
                Ok(Some(r)) => return Some(Ok(r)),
                Ok(None) => {}
                Err(e) => return Some(Err(e)),
            }
        }
        if buf.len() > MAX_RESPONSE {
            return None;
        }
        api::parse_response(&buf, true).ok().flatten().map(Ok)
    });
    if let Some(Ok(r)) = found {
        assert!(
            r.body.len() <= 3 * buf.len(),
            "body larger than what was read"
        );
        let at_end = api::parse_response(&buf, true).expect("a complete reply stays complete");
        assert_eq!(
            at_end.as_ref(),
            Some(&r),
            "more bytes changed a complete reply"
        );
        if let Ok(v) = serde_json::from_str::<Value>(&r.body) {
            let _ = v.get("state").and_then(Value::as_str);
        }
    }
}

/// The `extra_args` checker: every refusal points at an argument, in
/// order, starts with that argument as written (JSON-quoted), and has its
/// reason filled in (no placeholder left, unless an argument itself
/// spells one: arguments are shown verbatim).
pub fn extra_args(data: &[u8]) {
    let Some((&k, rest)) = data.split_first() else {
        return;
    };
    let kind = match k % 3 {
        0 => HypervisorKind::Qemu,
        1 => HypervisorKind::CloudHypervisor,
        _ => HypervisorKind::Firecracker,
    };
    let args: Vec<String> = rest
        .split(|b| *b == 0)
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    let control = Path::new("/run/vmwarden/fuzz/control");
    let found = bounded("extra_args", rest.len(), 64, 16 << 10, || {
        extra_args::problems(kind, &args, control)
    });
    let spelled = args.iter().any(|a| a.contains("@control@"));
    let mut last = None;
    for (i, why) in &found {
        assert!(*i < args.len() && last < Some(*i), "index {i} out of order");
        last = Some(*i);
        let shown = serde_json::to_string(&args[*i]).expect("a string serialises");
        assert!(
            why.starts_with(&shown),
            "{why:?} does not start with {shown}"
        );
        assert!(spelled || !why.contains("@control@"), "{why}");
    }
}

/// The guest's notify messages (`hypervisor::vmm_notify`, what the helper
/// `vmm-notify` reads from a firecracker guest): fed in the chunks a
/// socket delivers (the first byte picks their size, and whether the
/// sender then ended), kept to `MAX_MESSAGE` bytes whatever the guest
/// sends, and the guest's end read only from a whole line of what was
/// kept: `X_SYSTEMD_SHUTDOWN=` and a value systemd writes, ended by a
/// newline, or the last line of a message that ended within its bound.
pub fn vmm_notify(data: &[u8]) {
    let Some((&first, rest)) = data.split_first() else {
        return;
    };
    let data = stretched(rest, NOTIFY_MAX * 2 + 7);
    let step = usize::from(first >> 1) * 67 + 1;
    let ended = first & 1 == 1;
    let (m, said) = bounded("vmm_notify", NOTIFY_MAX, 3, 1 << 10, || {
        let mut m = vmm_notify::Message::new();
        for chunk in data.chunks(step) {
            if !m.push(chunk) {
                break;
            }
        }
        let said = m.shutdown(ended);
        (m, said)
    });
    let kept = m.bytes();
    assert_eq!(kept, &data[..data.len().min(NOTIFY_MAX)], "kept bytes");
    assert_eq!(m.overflowed(), data.len() > NOTIFY_MAX, "overflow");
    // The lines that count, last first, and what the last known one says.
    let mut lines = kept.rsplit(|b| *b == b'\n');
    let last = lines.next().filter(|_| ended && !m.overflowed());
    let want = last.into_iter().chain(lines).find_map(|l| {
        let v = l.strip_prefix(b"X_SYSTEMD_SHUTDOWN=")?;
        [
            Shutdown::Poweroff,
            Shutdown::Halt,
            Shutdown::Exit,
            Shutdown::Reboot,
            Shutdown::Kexec,
        ]
        .into_iter()
        .find(|s| s.as_str().as_bytes() == v)
    });
    assert_eq!(said, want, "what the message says");
}
