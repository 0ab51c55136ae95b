//! Start-up check that io_uring works here the way glommio needs it, so a container without the
//! right settings fails at once with a message naming the missing one (seccomp,
//! `kernel.io_uring_disabled`, RLIMIT_MEMLOCK) instead of a shard dying obscurely later.
//!
//! What glommio 0.9 does per shard: refuse to start when the RLIMIT_MEMLOCK soft limit is below
//! 512 KiB, create three rings, and register one buffer of `--io-memory-bytes` (rounded up to a
//! page, at least 64 KiB) in each of them. Without CAP_IPC_LOCK every registration is charged to
//! the user's locked memory (per uid, across processes) against RLIMIT_MEMLOCK; a registration
//! that does not fit is skipped with a warning and that shard runs without registered buffers.
//!
//! The probe: make CAP_IPC_LOCK effective if it is permitted, raise the memlock soft limit to the
//! hard limit (allowed without privileges), check glommio's minimum, `io_uring_setup` one small ring, register one shard's buffer, unregister,
//! close. Failures are fatal; a limit too small for every shard's buffers is a warning.

use std::io;

/// glommio 0.9 refuses to create an executor below this RLIMIT_MEMLOCK soft limit.
const GLOMMIO_MIN_MEMLOCK: u64 = 512 * 1024;
/// glommio registers the same buffer in its main, latency and poll rings.
const RINGS_PER_SHARD: u64 = 3;
const IORING_REGISTER_BUFFERS: libc::c_uint = 0;
const IORING_UNREGISTER_BUFFERS: libc::c_uint = 1;
const CAP_IPC_LOCK: u32 = 14;

/// What the probe was doing when it failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    Setup,
    Register,
}

/// Facts about the process and kernel that decide the explanation.
#[derive(Clone, Debug, Default)]
pub struct Env {
    /// `/proc/sys/kernel/io_uring_disabled` (absent before Linux 6.6).
    pub io_uring_disabled: Option<u32>,
    /// `Seccomp:` of `/proc/self/status` (0 none, 1 strict, 2 filter).
    pub seccomp_mode: Option<u32>,
    /// RLIMIT_MEMLOCK soft limit in bytes (`u64::MAX` = unlimited).
    pub memlock: u64,
    /// Bytes one shard's buffer registration needs (the probe's buffer).
    pub buffer_bytes: u64,
    pub kernel: String,
    /// The real user id, to which the kernel charges locked memory.
    pub uid: u32,
}

/// The sizes glommio actually registers: page-aligned, at least 64 KiB.
pub fn glommio_buffer_bytes(io_memory_bytes: usize) -> u64 {
    (io_memory_bytes as u64).div_ceil(4096).max(16) * 4096
}

fn mib(b: u64) -> String {
    if b == u64::MAX {
        "unlimited".into()
    } else {
        format!("{:.1} MiB", b as f64 / (1 << 20) as f64)
    }
}

fn memlock_fix(env: &Env) -> String {
    // The charge is per user id, summed over every process of that user on the machine: when
    // the buffer alone fits the limit, other processes of this uid hold the rest (in Kubernetes,
    // typically another broker pod with the same runAsUser on the same node).
    let shared = if env.memlock != u64::MAX && env.buffer_bytes <= env.memlock {
        format!(
            ", so other processes of user id {} on this machine already hold the rest: locked memory is charged \
             per user id, and several brokers with the same user id on one node (one Kubernetes node, the same \
             runAsUser) share one limit. Run one broker per node (Helm value podAntiAffinity=hard, the default), \
             or fix",
            env.uid
        )
    } else {
        ". Fix".into()
    };
    format!(
        "RLIMIT_MEMLOCK is too small: the limit is {} ({} bytes) and one shard's io_uring buffer needs {} ({} bytes){shared} \
         one of: give the container CAP_IPC_LOCK (Helm value ioUring.ipcLock=true), raise the memlock limit \
         (`ulimit -l`, or LimitMEMLOCK= for the container runtime's service), or lower --io-memory-bytes / KAAS_IO_MEMORY_BYTES",
        mib(env.memlock),
        env.memlock,
        mib(env.buffer_bytes),
        env.buffer_bytes
    )
}

fn blocked(env: &Env, syscall: &str, errno: i32) -> String {
    match env.io_uring_disabled {
        Some(2) => {
            return "sysctl kernel.io_uring_disabled is 2: io_uring is disabled for every process on this host. \
                    Set it to 0 on the node (sysctl -w kernel.io_uring_disabled=0)"
                .into()
        }
        Some(1) => {
            return "sysctl kernel.io_uring_disabled is 1: io_uring is allowed only for CAP_SYS_ADMIN or members of \
                    kernel.io_uring_group. Set it to 0 on the node, or run kaas in that group"
                .into()
        }
        _ => {}
    }
    let filter = env.seccomp_mode.unwrap_or(0) != 0;
    if errno == libc::ENOSYS && !filter {
        return format!(
            "{syscall} is not implemented by kernel {}: kaas needs Linux >= 5.8 built with io_uring (CONFIG_IO_URING)",
            env.kernel
        );
    }
    let state = match env.seccomp_mode {
        Some(m) if m != 0 => format!("this process runs under a seccomp filter (Seccomp: {m})"),
        Some(_) => "no seccomp filter is active, so a security module (SELinux, AppArmor) may be denying it".into(),
        None => "the seccomp state is unknown".into(),
    };
    format!(
        "{syscall} was refused ({state}). Default container seccomp profiles (containerd 2.x, Docker 25+) block io_uring: \
         use the profile in deploy/helm/kaas/files/kaas-io-uring.json (Helm: seccomp.type=Localhost, the default; \
         Docker: --security-opt seccomp=deploy/helm/kaas/files/kaas-io-uring.json) or an Unconfined profile. \
         kernel.io_uring_disabled is {}",
        env.io_uring_disabled
            .map_or("not present (kernel before 6.6)".to_string(), |v| v.to_string())
    )
}

/// Turns a failed probe step into a message that names the setting to change. Pure.
pub fn explain(stage: Stage, errno: i32, env: &Env) -> String {
    let call = match stage {
        Stage::Setup => "io_uring_setup",
        Stage::Register => "io_uring_register(IORING_REGISTER_BUFFERS)",
    };
    let err = io::Error::from_raw_os_error(errno);
    let why = match (stage, errno) {
        (_, libc::EPERM | libc::ENOSYS | libc::EACCES) => blocked(env, call, errno),
        // Before Linux 5.12 the rings themselves were charged to RLIMIT_MEMLOCK.
        (_, libc::ENOMEM) => memlock_fix(env),
        (Stage::Register, libc::EFAULT | libc::EINVAL | libc::EOVERFLOW) => format!(
            "the kernel rejected a {} buffer: lower --io-memory-bytes (at most 1 GiB)",
            mib(env.buffer_bytes)
        ),
        _ => "unexpected error".into(),
    };
    format!("io_uring is not usable ({call} failed: {err}): {why}")
}

/// The warning for a memlock limit that fits one shard's buffers but not every shard's.
pub fn shortfall(shards: usize, env: &Env, cap_ipc_lock: bool) -> Option<String> {
    let needed = env
        .buffer_bytes
        .saturating_mul(RINGS_PER_SHARD)
        .saturating_mul(shards as u64);
    if cap_ipc_lock || env.memlock == u64::MAX || env.memlock >= needed {
        return None;
    }
    let lower = match suggested_io_memory(env.memlock, shards) {
        s if s >= 65536 => format!(", or lower --io-memory-bytes to at most {s} bytes"),
        _ => ", or run fewer shards".to_string(),
    };
    Some(format!(
        "RLIMIT_MEMLOCK is {} but {shards} shards register {} of io_uring buffers ({} x 3 rings each, charged per \
         user id across processes): some shards will run without registered buffers (slower IO). Give the process \
         CAP_IPC_LOCK, raise the memlock limit{lower}",
        mib(env.memlock),
        mib(needed),
        mib(env.buffer_bytes),
    ))
}

/// The largest multiple of 64 KiB whose registrations fit `memlock` with 1 MiB left for the rings
/// (recent kernels charge them too) — the sizing the Helm chart uses.
fn suggested_io_memory(memlock: u64, shards: usize) -> u64 {
    (memlock.saturating_sub(1 << 20) / RINGS_PER_SHARD / shards.max(1) as u64) & !0xffff
}

/// Value of a `Name:\tvalue` line of /proc/self/status.
pub fn status_field<'a>(status: &'a str, name: &str) -> Option<&'a str> {
    status.lines().find_map(|l| {
        l.strip_prefix(name)
            .and_then(|r| r.strip_prefix(':'))
            .map(str::trim)
    })
}

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: i32,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

/// Makes CAP_IPC_LOCK effective when it is permitted (the image gives the binary the file
/// capability `cap_ipc_lock=p`, which yields it only where the container's bounding set has it)
/// and says whether it is effective now. Threads started later inherit it.
fn ensure_ipc_lock() -> bool {
    const LINUX_CAPABILITY_VERSION_3: u32 = 0x2008_0522;
    let mut header = CapHeader {
        version: LINUX_CAPABILITY_VERSION_3,
        pid: 0,
    };
    let mut data = [CapData::default(); 2];
    let bit = 1u32 << CAP_IPC_LOCK;
    // SAFETY: capget fills the two v3 data structs we own.
    if unsafe { libc::syscall(libc::SYS_capget, &mut header, data.as_mut_ptr()) } != 0
        || data[0].permitted & bit == 0
    {
        return false;
    }
    if data[0].effective & bit != 0 {
        return true;
    }
    data[0].effective |= bit;
    // SAFETY: capset reads the header and data we own; it only raises a permitted capability.
    unsafe { libc::syscall(libc::SYS_capset, &header, data.as_ptr()) == 0 }
}

fn read_trimmed(path: &str) -> Option<String> {
    std::fs::read_to_string(path)
        .ok()
        .map(|s| s.trim().to_string())
}

fn memlock_limit() -> libc::rlimit {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the struct we pass.
    unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut lim) };
    lim
}

/// Raises the memlock soft limit to the hard limit (no privilege needed).
fn raise_memlock_soft_limit() {
    let lim = memlock_limit();
    if lim.rlim_cur < lim.rlim_max {
        let raised = libc::rlimit {
            rlim_cur: lim.rlim_max,
            rlim_max: lim.rlim_max,
        };
        // SAFETY: setrlimit reads the struct we pass.
        if unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &raised) } == 0 {
            tracing::info!(
                from = lim.rlim_cur,
                to = lim.rlim_max,
                "raised the RLIMIT_MEMLOCK soft limit to the hard limit"
            );
        }
    }
}

fn last_errno() -> i32 {
    io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// Creates a ring and registers one buffer of `bytes`; returns the failing stage and errno.
fn probe(bytes: u64) -> Result<(), (Stage, i32)> {
    // struct io_uring_params is 120 bytes; zeroed means "no flags".
    let mut params = [0u64; 15];
    // SAFETY: io_uring_setup reads and writes the 120-byte params struct we own.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_io_uring_setup,
            4 as libc::c_uint,
            params.as_mut_ptr(),
        )
    };
    if fd < 0 {
        return Err((Stage::Setup, last_errno()));
    }
    let fd = fd as libc::c_int;
    let len = bytes as usize;
    // SAFETY: a fresh private anonymous mapping, unmapped below.
    let buf = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    let result = if buf == libc::MAP_FAILED {
        Err((Stage::Register, libc::ENOMEM))
    } else {
        let iov = libc::iovec {
            iov_base: buf,
            iov_len: len,
        };
        // SAFETY: registers (pins) our mapping with our ring; unregistered right after, so the
        // locked-memory charge is returned before the shards register theirs (closing the fd
        // alone releases it asynchronously).
        let r = unsafe {
            libc::syscall(
                libc::SYS_io_uring_register,
                fd,
                IORING_REGISTER_BUFFERS,
                &iov as *const libc::iovec,
                1 as libc::c_uint,
            )
        };
        let r = if r < 0 {
            Err((Stage::Register, last_errno()))
        } else {
            // SAFETY: as above; no arguments.
            unsafe {
                libc::syscall(
                    libc::SYS_io_uring_register,
                    fd,
                    IORING_UNREGISTER_BUFFERS,
                    std::ptr::null::<libc::c_void>(),
                    0 as libc::c_uint,
                )
            };
            Ok(())
        };
        // SAFETY: the mapping created above, no longer registered.
        unsafe { libc::munmap(buf, len) };
        r
    };
    // SAFETY: closing the ring fd we created.
    unsafe { libc::close(fd) };
    result
}

/// Runs the probe for `shards` shards with `io_memory_bytes` each; an error names the setting
/// that is missing.
pub fn check(io_memory_bytes: usize, shards: usize) -> anyhow::Result<()> {
    let ipc_lock = ensure_ipc_lock();
    raise_memlock_soft_limit();
    let lim = memlock_limit();
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let env = Env {
        io_uring_disabled: read_trimmed("/proc/sys/kernel/io_uring_disabled")
            .and_then(|s| s.parse().ok()),
        seccomp_mode: status_field(&status, "Seccomp").and_then(|s| s.parse().ok()),
        memlock: if lim.rlim_cur == libc::RLIM_INFINITY {
            u64::MAX
        } else {
            lim.rlim_cur
        },
        buffer_bytes: glommio_buffer_bytes(io_memory_bytes),
        kernel: read_trimmed("/proc/sys/kernel/osrelease").unwrap_or_else(|| "?".into()),
        // SAFETY: getuid has no preconditions and cannot fail.
        uid: unsafe { libc::getuid() },
    };
    if env.memlock < GLOMMIO_MIN_MEMLOCK {
        anyhow::bail!(
            "io_uring is not usable: the RLIMIT_MEMLOCK soft limit is {} bytes and glommio needs at least {} bytes \
             (even with CAP_IPC_LOCK). Raise the memlock limit of the container runtime (e.g. LimitMEMLOCK= in its \
             systemd unit) or `ulimit -l`",
            env.memlock,
            GLOMMIO_MIN_MEMLOCK
        );
    }
    if let Err((stage, errno)) = probe(env.buffer_bytes) {
        anyhow::bail!(explain(stage, errno, &env));
    }
    if let Some(w) = shortfall(shards, &env, ipc_lock) {
        tracing::warn!("{w}");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env() -> Env {
        Env {
            io_uring_disabled: Some(0),
            seccomp_mode: Some(0),
            memlock: 8 << 20,
            buffer_bytes: 2 << 20,
            kernel: "6.18.0".into(),
            uid: 10001,
        }
    }

    /// An EPERM from io_uring under a seccomp filter must say seccomp, not a generic failure.
    #[test]
    fn eperm_under_a_seccomp_filter_names_seccomp() {
        let e = Env {
            seccomp_mode: Some(2),
            ..env()
        };
        let m = explain(Stage::Setup, libc::EPERM, &e);
        assert!(m.contains("seccomp filter (Seccomp: 2)"), "{m}");
        assert!(m.contains("kaas-io-uring.json"), "{m}");
        assert!(m.contains("io_uring_disabled is 0"), "{m}");
    }

    /// ENOSYS is named as a kernel without io_uring or a filter that hides it.
    #[test]
    fn enosys_from_seccomp_or_kernel() {
        let e = Env {
            seccomp_mode: Some(2),
            ..env()
        };
        assert!(explain(Stage::Setup, libc::ENOSYS, &e).contains("seccomp"));
        let m = explain(Stage::Setup, libc::ENOSYS, &env());
        assert!(m.contains("not implemented by kernel 6.18.0"), "{m}");
        assert!(m.contains(">= 5.8"), "{m}");
    }

    /// kernel.io_uring_disabled is named with its value: the operator knows what to change.
    #[test]
    fn io_uring_disabled_sysctl_is_named_with_its_value() {
        for v in [1, 2] {
            let e = Env {
                io_uring_disabled: Some(v),
                seccomp_mode: Some(2),
                ..env()
            };
            let m = explain(Stage::Setup, libc::EPERM, &e);
            assert!(
                m.contains(&format!("kernel.io_uring_disabled is {v}")),
                "{m}"
            );
        }
        let e = Env {
            io_uring_disabled: None,
            seccomp_mode: Some(2),
            ..env()
        };
        assert!(explain(Stage::Setup, libc::EPERM, &e).contains("not present"));
    }

    /// ENOMEM on buffer registration names RLIMIT_MEMLOCK with the limit and what kaas needs.
    #[test]
    fn enomem_on_register_names_memlock_with_limit_and_need() {
        let e = Env {
            memlock: 1 << 20,
            ..env()
        };
        let m = explain(Stage::Register, libc::ENOMEM, &e);
        assert!(m.contains("RLIMIT_MEMLOCK"), "{m}");
        assert!(m.contains("1048576 bytes"), "{m}");
        assert!(m.contains("2097152 bytes"), "{m}");
        assert!(
            m.contains("CAP_IPC_LOCK") && m.contains("--io-memory-bytes"),
            "{m}"
        );
        assert!(!m.contains("other processes"), "{m}");
    }

    /// A 2 MiB buffer refused under an 8 MiB limit: the rest is held by other processes of the
    /// same user id (a second broker pod with the same runAsUser on the node). Found on a real
    /// kubelet (tests/test_chart_on_kubernetes.py), where the message only said the limit was
    /// too small although it was four times the buffer.
    #[test]
    fn enomem_below_the_limit_names_the_per_user_charge() {
        let m = explain(Stage::Register, libc::ENOMEM, &env());
        assert!(m.contains("other processes of user id 10001"), "{m}");
        assert!(m.contains("podAntiAffinity=hard"), "{m}");
        assert!(m.contains("ioUring.ipcLock=true"), "{m}");
    }

    #[test]
    fn shortfall_counts_three_rings_per_shard() {
        // 8 MiB fits one shard at 2 MiB (6 MiB) but not two (12 MiB).
        assert!(shortfall(1, &env(), false).is_none());
        let w = shortfall(2, &env(), false).unwrap();
        assert!(w.contains("12.0 MiB"), "{w}");
        assert!(w.contains("at most 1179648 bytes"), "{w}"); // (8 MiB - 1 MiB) / 6, 64 KiB-aligned
        assert!(shortfall(2, &env(), true).is_none());
        let small = Env {
            memlock: 1 << 20,
            buffer_bytes: 65536,
            ..env()
        };
        assert!(shortfall(8, &small, false)
            .unwrap()
            .ends_with("or run fewer shards"));
        let unlimited = Env {
            memlock: u64::MAX,
            ..env()
        };
        assert!(shortfall(64, &unlimited, false).is_none());
    }

    /// The memlock estimate and the /proc/self/status fields the diagnosis relies on parse right.
    #[test]
    fn rounding_and_proc_parsing() {
        assert_eq!(glommio_buffer_bytes(0), 65536);
        assert_eq!(glommio_buffer_bytes(2 << 20), 2 << 20);
        assert_eq!(glommio_buffer_bytes(100_000), 102_400);
        let status = "Name:\tkaas\nSeccomp:\t2\nSeccomp_filters:\t1\n";
        assert_eq!(status_field(status, "Seccomp"), Some("2"));
        assert_eq!(status_field(status, "Seccomp_filters"), Some("1"));
        assert_eq!(status_field(status, "CapEff"), None);
    }

    /// The start-up probe must pass where io_uring works, or the broker would refuse to start here.
    #[test]
    fn probe_succeeds_on_this_machine() {
        probe(glommio_buffer_bytes(2 << 20)).expect("io_uring works here");
        check(1 << 20, 1).expect("check passes");
    }
}
