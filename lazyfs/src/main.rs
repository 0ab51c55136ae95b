//! `kaas-lazyfs --backing DIR MOUNTPOINT`: mounts the power-loss test file system and serves
//! it until it is unmounted or killed. Killing it (SIGKILL) is the power cut: start it again
//! on the same backing directory after a forced unmount (`umount -l MOUNTPOINT`).

use std::path::PathBuf;

use anyhow::Context;
use clap::Parser;

#[derive(Parser, Debug)]
#[command(about = "FUSE file system that loses unsynced data on a simulated power cut")]
struct Args {
    /// Directory on a real disk holding the durable state (created if missing).
    #[arg(long)]
    backing: PathBuf,
    /// Fault injection: while this file exists, the next fsync of a file loses the file's
    /// unsynced pages and fails with EIO, as a disk's failed write-back does (the daemon
    /// removes the file, so each creation is one fault).
    #[arg(long)]
    fail_fsync_trigger: Option<PathBuf>,
    /// Where to mount.
    mountpoint: PathBuf,
}

/// Prints fuser's warnings and errors to stderr, so unknown opcodes (FUSE_SYNCFS among them)
/// and unimplemented operations show up in the test's log.
struct StderrLog;

impl log::Log for StderrLog {
    fn enabled(&self, m: &log::Metadata<'_>) -> bool {
        m.level() <= log::max_level()
    }
    fn log(&self, r: &log::Record<'_>) {
        if self.enabled(r.metadata()) {
            eprintln!("kaas-lazyfs {} {}: {}", r.level(), r.target(), r.args());
        }
    }
    fn flush(&self) {}
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    log::set_logger(&StderrLog).expect("the only logger");
    let level = match std::env::var("KAAS_LAZYFS_LOG").as_deref() {
        Ok("debug") => log::LevelFilter::Debug,
        Ok("info") => log::LevelFilter::Info,
        _ => log::LevelFilter::Warn,
    };
    log::set_max_level(level);
    let fs = kaas_lazyfs::model::Fs::load(&args.backing)
        .with_context(|| format!("loading durable state from {}", args.backing.display()))?;
    kaas_lazyfs::fuse::mount(fs, &args.mountpoint, args.fail_fsync_trigger)
        .with_context(|| format!("serving {}", args.mountpoint.display()))
}
