//! A failed sync is final: once an `fdatasync` or `syncfs` has reported an error, no later sync
//! of this process counts as making anything durable, and no partition accepts writes.
//!
//! Why: a sync error means some write-back since the last successful sync did not reach the
//! disk, and the kernel reports it once (per open file, through its error sequence). The next
//! sync of the same file or filesystem returns success although those bytes are still missing
//! — the data the kernel holds may even read back correctly from the page cache. A log that
//! went on would acknowledge writes behind a hole: a client retrying the refused batch gets it
//! appended again (or, idempotent, answered as a duplicate of the lost one) and acknowledged
//! by that next, successful sync, and the recovery after the next restart cuts the log at the
//! hole, taking every later acknowledged batch with it. PostgreSQL stops on a failed fsync for
//! the same reason; Kafka takes the log directory offline (with one directory, the broker
//! stops).
//!
//! So the first failure is recorded here for the whole process: appends and durability waits
//! fail with KAFKA_STORAGE_ERROR and this message, `/healthz` reports the broker as failed (the
//! chart's liveness probe then restarts it) and the operator is told once what to do. A restart
//! recovers each log from what the files hold.
//!
//! Not covered: a watchdog timeout (the sync has not failed, only not yet returned) and sync
//! errors of files that are not log data (manifests, snapshots), which fail their own operation.

use std::sync::OnceLock;

use crate::StorageError;

static FAILED: OnceLock<String> = OnceLock::new();

/// Records that a sync of log data failed (`what`: the operation and path, `error`: what the
/// kernel said). The first failure is logged; later ones keep the first message.
pub(crate) fn record(what: &str, error: &str) {
    let mut first = false;
    FAILED.get_or_init(|| {
        first = true;
        format!(
            "{what} failed ({error}): writes since the last successful sync may not be on \
             disk, so this broker accepts no more writes. Check the data volume (kernel log: \
             dmesg), then restart the broker; it recovers each log from what is on disk"
        )
    });
    if first {
        tracing::error!("{}", failure().unwrap_or_default());
    }
}

/// Why this process's storage stopped accepting writes, if it has.
pub fn failure() -> Option<&'static str> {
    FAILED.get().map(String::as_str)
}

/// `fdatasync` of a segment file, recorded here if it fails; refused once storage has failed
/// (a success then would say nothing about the bytes the failed sync lost).
pub(crate) async fn fdatasync_segment(
    file: &glommio::io::BufferedFile,
    path: &std::path::Path,
) -> Result<(), StorageError> {
    use std::os::fd::AsRawFd;
    check(path)?;
    let what = || format!("fdatasync of {}", path.display());
    file.fdatasync().await.map_err(|e| {
        record(&what(), &e.to_string());
        StorageError::io("fsyncing segment", path, e)
    })?;
    still_writable(file.as_raw_fd()).map_err(|e| {
        record(&what(), &e);
        StorageError::io("fsyncing segment", path, e)
    })
}

/// After a sync returned success: `Err` if the filesystem under `fd` is read-only now.
///
/// Why: ext4 remounts itself read-only after a failed write (errors=remount-ro, or an aborted
/// journal), and on a read-only ext4 both `fdatasync` and `syncfs` return 0 at once, without
/// writing the dirty pages that appends left in the page cache. Reading the mount flags costs
/// no IO and takes no inode lock, so it runs on the shard's thread after every fdatasync.
pub(crate) fn still_writable(fd: std::os::fd::RawFd) -> Result<(), String> {
    let mut st = std::mem::MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: fstatvfs fills a statvfs for an open descriptor and touches nothing else.
    if unsafe { libc::fstatvfs(fd, st.as_mut_ptr()) } != 0 {
        // Not a verdict on the data: the sync itself succeeded.
        return Ok(());
    }
    // SAFETY: fstatvfs returned 0, so it filled the struct.
    let st = unsafe { st.assume_init() };
    if st.f_flag & libc::ST_RDONLY != 0 {
        return Err(
            "the sync returned, but the filesystem is read-only now: the kernel \
                    remounts it so after a failed write (see dmesg)"
                .to_string(),
        );
    }
    Ok(())
}

/// After a `syncfs` returned success: `Err` if the filesystem no longer accepts changes, asked
/// through `probe` (`__meta/sync-probe`, whose first 4 KiB are written and synced when it is
/// created, see `fs_sync`).
///
/// Why: when ext4's own background journal commit fails (a failing disk, a thin-provisioned
/// volume whose pool ran out) it aborts the journal, and a later `syncfs` returns 0 at once —
/// no transaction is left to wait for, and the abort sets no write-back error — while the
/// page cache still holds appends that never reached the disk; the read-only flag follows
/// only later, from a work item. Measured on a loop-mounted ext4 whose backing tmpfs filled up
/// (tests/test_full_disk.py): in 18 of 40 runs the next `syncfs` returned 0 and one produce
/// request, 242 acknowledged records, was lost. A change of times does not report the abort
/// (the inode is dirtied without an error path), but `fallocate` over blocks the file already
/// has starts a journal handle, so it fails on an aborted journal; otherwise it allocates
/// nothing (it does update the probe's times). The abort is sticky, so one before the probe is
/// always seen; one after it came after the sync's own commit, which then covered the data.
/// Only EIO, EROFS and EUCLEAN (corruption) count as failures; a filesystem without
/// `fallocate` cannot be probed, which is said once.
pub(crate) fn probe_accepts_changes(probe: std::os::fd::RawFd) -> Result<(), String> {
    // SAFETY: fallocate with KEEP_SIZE over the probe's allocated first block changes no data
    // and no size.
    if unsafe { libc::fallocate(probe, libc::FALLOC_FL_KEEP_SIZE, 0, 4096) } == 0 {
        return Ok(());
    }
    let e = std::io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::EIO | libc::EROFS | libc::EUCLEAN) => Err(format!(
            "the sync returned, but the filesystem then refused a change ({e}): the kernel stops \
             a filesystem after a failed write (see dmesg)"
        )),
        _ => {
            static SAID: std::sync::Once = std::sync::Once::new();
            SAID.call_once(|| {
                tracing::warn!(error = %e, "the data filesystem cannot be probed after a syncfs \
                    (fallocate refused); a journal abort that syncfs does not report would go \
                    unnoticed until the filesystem turns read-only");
            });
            Ok(())
        }
    }
}

/// A write to a segment failed with `e`: EIO and EROFS mean the filesystem failed (not that it
/// is full, which the free-space floor handles and which passes), so they are recorded as a
/// failed sync would be — the page cache may hold earlier appends that will never reach the
/// disk.
pub(crate) fn note_write_error(path: &std::path::Path, e: &std::io::Error) {
    if matches!(e.raw_os_error(), Some(libc::EIO | libc::EROFS)) {
        record(&format!("writing {}", path.display()), &e.to_string());
    }
}

/// The error an append or a durability wait gets once storage has failed.
pub(crate) fn check(dir: &std::path::Path) -> Result<(), StorageError> {
    match failure() {
        None => Ok(()),
        Some(why) => Err(StorageError::io("refused", dir, why)),
    }
}
