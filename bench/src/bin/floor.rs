//! `kaas-floor`: what the kernel and one CRC cost per GiB on this machine when a program does
//! nothing else — the physical floor that issue 16 measures broker CPU per GiB against.
//!
//! The "broker" thread is pinned to one core and the "client" thread to another, as
//! `bench/compare.sh --pinned` pins kaas and its clients, and they talk over loopback TCP.
//! Only the broker thread's CPU (user + system, `getrusage(RUSAGE_THREAD)`) is reported, as
//! seconds per GiB moved; the kernel work a loopback send does for the receiver runs on the
//! sender's core, for kaas as for this program, so the two figures count the same things.
//!
//! Produce, each step adding to the one before (the broker thread receives `--chunk`-sized
//! record sets, as a producer's 16 KiB batches arrive):
//! - `recv`: read each chunk from the socket into one buffer;
//! - `recv+crc`: and CRC-32C it, as a broker validates a batch;
//! - `recv+crc+write`: and append it to a file in `--dir` (a buffered `write`: the copy into
//!   the page cache);
//! - `recv+crc+O_DIRECT write`: instead of a buffered write, receive into an aligned 1 MiB
//!   buffer and write each full one with `O_DIRECT` (no page cache: what a log written past
//!   the page cache would pay);
//! - `recv+crc+write+fdatasync`: a buffered write and `fdatasync` every `--sync-bytes`, as
//!   acks=all would.
//!
//! Consume (the broker thread sends the file the produce steps wrote, 1 MiB at a time, as a
//! fetch sends up to `max.partition.fetch.bytes` of a partition):
//! - `pread+send`: copy through a buffer (what kaas did before it used `sendfile`);
//! - `sendfile`: from the page cache;
//! - `sendfile from disk`: after `POSIX_FADV_DONTNEED` evicted the file's pages.
//!
//! ```text
//! kaas-floor --dir /tmp --gib 4                # every step, one JSON line each
//! kaas-floor --dir /tmp --gib 4 --chunk 65536  # record sets of 64 KiB
//! ```

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context};
use clap::Parser;

#[derive(Parser)]
#[command(about = "The physical floor of broker CPU per GiB on this machine (issue 16)")]
struct Args {
    /// Directory for the file the produce steps write (on the file system kaas would use).
    #[arg(long, default_value = "/tmp")]
    dir: PathBuf,
    /// GiB moved by each step.
    #[arg(long, default_value_t = 4)]
    gib: u64,
    /// Bytes per record set received (a producer's batch.size).
    #[arg(long, default_value_t = 16 * 1024)]
    chunk: usize,
    /// With fdatasync: bytes appended between syncs.
    #[arg(long, default_value_t = 1 << 20)]
    sync_bytes: u64,
    /// Core of the measured ("broker") thread.
    #[arg(long, default_value_t = 0)]
    broker_core: usize,
    /// Core of the other ("client") thread.
    #[arg(long, default_value_t = 1)]
    client_core: usize,
}

/// Bytes per `sendfile` or `pread` of the consume steps.
const SEND_BYTES: usize = 1 << 20;

#[derive(Clone, Copy, PartialEq)]
enum Produce {
    Recv,
    Crc,
    Write,
    Direct,
    Sync,
}

#[derive(Clone, Copy, PartialEq)]
enum Consume {
    Copy,
    Sendfile,
    SendfileFromDisk,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if args.chunk == 0 || args.gib == 0 {
        bail!("--chunk and --gib must be positive");
    }
    let path = args.dir.join(format!("kaas-floor-{}", std::process::id()));
    let result = run_all(&args, &path);
    let _ = std::fs::remove_file(&path);
    result
}

fn run_all(args: &Args, path: &Path) -> anyhow::Result<()> {
    let total = args.gib << 30;
    for (step, name) in [
        (Produce::Recv, "recv"),
        (Produce::Crc, "recv+crc"),
        (Produce::Write, "recv+crc+write"),
        (Produce::Direct, "recv+crc+O_DIRECT write"),
        (Produce::Sync, "recv+crc+write+fdatasync"),
    ] {
        let _ = std::fs::remove_file(path);
        let (cpu, wall) = produce(args, path, step, total).with_context(|| name.to_string())?;
        report("produce", name, args.chunk, total, cpu, wall);
    }
    // The last produce step left the file synced, so its pages are clean and can be evicted.
    for (step, name) in [
        (Consume::Copy, "pread+send"),
        (Consume::Sendfile, "sendfile"),
        (Consume::SendfileFromDisk, "sendfile from disk"),
    ] {
        let (cpu, wall) = consume(args, path, step).with_context(|| name.to_string())?;
        report("consume", name, SEND_BYTES, total, cpu, wall);
    }
    Ok(())
}

fn report(side: &str, step: &str, chunk: usize, bytes: u64, cpu: f64, wall: f64) {
    let gib = bytes as f64 / f64::from(1u32 << 30);
    println!(
        "{}",
        serde_json::json!({
            "floor": side,
            "step": step,
            "chunk_bytes": chunk,
            "gib": gib,
            "broker_cpu_s_per_gib": (cpu / gib * 1000.0).round() / 1000.0,
            "mib_per_s": (gib * 1024.0 / wall * 10.0).round() / 10.0,
        })
    );
}

/// A connected loopback pair: (the broker's end, the client's end).
fn pair() -> anyhow::Result<(TcpStream, TcpStream)> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let client = TcpStream::connect(listener.local_addr()?)?;
    let (broker, _) = listener.accept()?;
    broker.set_nodelay(true)?;
    client.set_nodelay(true)?;
    Ok((broker, client))
}

/// Runs `broker` on `--broker-core` and `client` on `--client-core` at once; returns the broker
/// thread's CPU seconds and wall seconds.
fn on_cores(
    args: &Args,
    broker: impl FnOnce() -> anyhow::Result<()> + Send,
    client: impl FnOnce() -> anyhow::Result<()> + Send,
) -> anyhow::Result<(f64, f64)> {
    std::thread::scope(|s| {
        let c = s.spawn(|| {
            pin(args.client_core)?;
            client()
        });
        let b = s
            .spawn(|| {
                pin(args.broker_core)?;
                let cpu0 = thread_cpu();
                let t0 = Instant::now();
                broker()?;
                anyhow::Ok((thread_cpu() - cpu0, t0.elapsed().as_secs_f64()))
            })
            .join()
            .map_err(|_| anyhow::anyhow!("broker thread panicked"))??;
        c.join()
            .map_err(|_| anyhow::anyhow!("client thread panicked"))??;
        Ok(b)
    })
}

fn produce(args: &Args, path: &Path, step: Produce, total: u64) -> anyhow::Result<(f64, f64)> {
    let (mut broker, mut client) = pair()?;
    let mut options = OpenOptions::new();
    options.create(true).append(true);
    if step == Produce::Direct {
        options.custom_flags(libc::O_DIRECT);
        if !DIRECT_BYTES.is_multiple_of(args.chunk) {
            bail!("--chunk must divide {DIRECT_BYTES} for the O_DIRECT step");
        }
    }
    let mut file = match step {
        Produce::Recv | Produce::Crc => None,
        _ => Some(
            options
                .open(path)
                .with_context(|| format!("opening {}", path.display()))?,
        ),
    };
    let chunk = args.chunk;
    // `move`: a side that fails drops its socket, so that the other side does not wait on it.
    on_cores(
        args,
        move || {
            if step == Produce::Direct {
                return receive_direct(&mut broker, file.as_mut().expect("opened"), chunk, total);
            }
            let mut buf = vec![0u8; chunk];
            let mut crc = 0u32;
            let (mut received, mut unsynced) = (0u64, 0u64);
            while received < total {
                broker.read_exact(&mut buf)?;
                received += chunk as u64;
                if step == Produce::Recv {
                    continue;
                }
                crc ^= crc32c::crc32c(&buf);
                if let Some(f) = file.as_mut() {
                    f.write_all(&buf)?;
                    unsynced += chunk as u64;
                    if step == Produce::Sync && unsynced >= args.sync_bytes {
                        f.sync_data()?;
                        unsynced = 0;
                    }
                }
            }
            if let Some(f) = file.as_mut() {
                f.sync_data()?;
            }
            std::hint::black_box(crc);
            Ok(())
        },
        move || {
            // Record-like bytes: not all zeros, so nothing downstream could special-case them.
            let buf: Vec<u8> = (0..chunk).map(|i| (i * 31 + 7) as u8).collect();
            let mut sent = 0u64;
            while sent < total {
                client.write_all(&buf)?;
                sent += chunk as u64;
            }
            Ok(())
        },
    )
}

/// Bytes per `O_DIRECT` write.
const DIRECT_BYTES: usize = 1 << 20;

/// The `O_DIRECT` step: each chunk is received straight into its place in an aligned buffer,
/// CRC-checked there, and every full buffer written past the page cache.
fn receive_direct(
    socket: &mut TcpStream,
    file: &mut File,
    chunk: usize,
    total: u64,
) -> anyhow::Result<()> {
    let mut raw = vec![0u8; DIRECT_BYTES + 4096];
    let start = raw.as_ptr().align_offset(4096);
    let buf = &mut raw[start..start + DIRECT_BYTES];
    let (mut received, mut fill, mut crc) = (0u64, 0usize, 0u32);
    while received < total {
        socket.read_exact(&mut buf[fill..fill + chunk])?;
        crc ^= crc32c::crc32c(&buf[fill..fill + chunk]);
        received += chunk as u64;
        fill += chunk;
        if fill == DIRECT_BYTES {
            file.write_all(buf)?;
            fill = 0;
        }
    }
    file.sync_data()?;
    std::hint::black_box(crc);
    Ok(())
}

fn consume(args: &Args, path: &Path, step: Consume) -> anyhow::Result<(f64, f64)> {
    let file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let len = file.metadata()?.len();
    if step == Consume::SendfileFromDisk {
        // SAFETY: advice on a descriptor this function owns, integer arguments.
        let rc = unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
        if rc != 0 {
            bail!("posix_fadvise(DONTNEED) failed: {rc}");
        }
    } else {
        // Warm the cache, so the copy and sendfile steps read from memory.
        let mut sink = vec![0u8; SEND_BYTES];
        let mut f = &file;
        while f.read(&mut sink)? > 0 {}
    }
    let (broker, mut client) = pair()?;
    on_cores(
        args,
        move || {
            let (socket, fd) = (broker.as_raw_fd(), file.as_raw_fd());
            let mut buf = vec![0u8; SEND_BYTES];
            let mut at = 0u64;
            while at < len {
                let want = SEND_BYTES.min((len - at) as usize);
                if step == Consume::Copy {
                    let n = read_at(&file, &mut buf[..want], at)?;
                    (&broker).write_all(&buf[..n])?;
                    at += n as u64;
                    continue;
                }
                let mut off = at as libc::off_t;
                // SAFETY: both descriptors are open for the call; `off` is a valid off_t.
                let n = unsafe { libc::sendfile(socket, fd, &mut off, want) };
                if n <= 0 {
                    bail!("sendfile: {}", std::io::Error::last_os_error());
                }
                at += n as u64;
            }
            Ok(())
        },
        move || {
            let mut buf = vec![0u8; SEND_BYTES];
            let mut got = 0u64;
            while got < len {
                let n = client.read(&mut buf)?;
                if n == 0 {
                    bail!("the sender closed after {got} of {len} bytes");
                }
                got += n as u64;
            }
            Ok(())
        },
    )
}

fn read_at(file: &File, buf: &mut [u8], at: u64) -> std::io::Result<usize> {
    use std::os::unix::fs::FileExt;
    file.read_at(buf, at)
}

fn pin(core: usize) -> anyhow::Result<()> {
    // SAFETY: a zeroed cpu_set_t is an empty set; CPU_SET and sched_setaffinity get valid
    // pointers to it, and 0 names the calling thread.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(core, &mut set);
        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            bail!(
                "pinning to core {core}: {}",
                std::io::Error::last_os_error()
            );
        }
    }
    Ok(())
}

/// User + system CPU seconds of the calling thread.
fn thread_cpu() -> f64 {
    // SAFETY: getrusage fills the zeroed struct it is given.
    let u = unsafe {
        let mut u: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_THREAD, &mut u);
        u
    };
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    secs(u.ru_utime) + secs(u.ru_stime)
}
