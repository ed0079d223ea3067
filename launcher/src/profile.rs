//! Step timestamps for profiling a launch (the `step-profile` feature;
//! without it every call here compiles to nothing).
//!
//! [`mark`] records the process's CPU time (`CLOCK_PROCESS_CPUTIME_ID`:
//! since the `fork` that made it, so the first mark includes the `execve`,
//! the dynamic loader and Rust's start-up) and the monotonic clock at the
//! end of a step; [`report`] writes one line per mark to stderr:
//! `vmwarden-profile STEP CPU_NS WALL_NS AT_NS`, each the time since the
//! mark before (the first mark's CPU time is since the process started; its
//! wall time is not known, 0), and `AT_NS` the mark's `CLOCK_MONOTONIC`
//! (the journal's monotonic clock: the systemd suite lines a launch's
//! steps up with its unit's start and the hypervisor's). `cargo bench --bench
//! overhead -- --steps`, against a build with the feature, gathers them
//! over many launches into the per-step table (CPU time: on a machine whose
//! host steals time, wall clock says more about the neighbours).

#[cfg(feature = "step-profile")]
mod imp {
    use std::sync::Mutex;

    /// (step, process CPU ns, boot-time ns, monotonic ns): a few dozen
    /// per launch.
    static MARKS: Mutex<Vec<(&'static str, u64, u64, u64)>> = Mutex::new(Vec::new());

    fn now(clock: libc::clockid_t) -> u64 {
        let mut t = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: `t` is a valid timespec for the kernel to fill.
        unsafe { libc::clock_gettime(clock, &raw mut t) };
        u64::try_from(t.tv_sec).unwrap_or(0) * 1_000_000_000 + u64::try_from(t.tv_nsec).unwrap_or(0)
    }

    pub fn mark(step: &'static str) {
        let cpu = now(libc::CLOCK_PROCESS_CPUTIME_ID);
        let wall = now(libc::CLOCK_BOOTTIME);
        let at = now(libc::CLOCK_MONOTONIC);
        if let Ok(mut m) = MARKS.lock() {
            m.push((step, cpu, wall, at));
        }
    }

    pub fn report() {
        let Ok(m) = MARKS.lock() else { return };
        let mut cpu0 = 0;
        let mut wall0 = m.first().map_or(0, |f| f.2);
        let mut out = String::new();
        for (step, cpu, wall, at) in m.iter() {
            out.push_str(&format!(
                "vmwarden-profile {step} {} {} {at}\n",
                cpu.saturating_sub(cpu0),
                wall.saturating_sub(wall0)
            ));
            (cpu0, wall0) = (*cpu, *wall);
        }
        eprint!("{out}");
    }
}

/// The step `step` ends now.
#[inline]
pub fn mark(step: &'static str) {
    #[cfg(feature = "step-profile")]
    imp::mark(step);
    #[cfg(not(feature = "step-profile"))]
    let _ = step;
}

/// Write the marks so far to stderr (see the module's documentation).
#[inline]
pub fn report() {
    #[cfg(feature = "step-profile")]
    imp::report();
}
