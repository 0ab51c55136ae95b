//! kaas-lazyfs: a FUSE file system for power-loss tests, in the spirit of Jepsen's LazyFS. It
//! keeps everything written but not yet synced in the daemon's memory and loses it when the
//! daemon is killed, so a test can cut the power under kaas and see what its fsync discipline
//! really saved (SIGKILL of kaas alone keeps the page cache and proves nothing about fsync).
//!
//! Runs as its own process (`kaas-lazyfs --backing DIR MOUNTPOINT`), one FUSE request at a
//! time on one thread; [`model`] is the durability model, [`fuse`] maps FUSE requests onto it.
//!
//! What becomes durable, and when:
//! - `fsync`/`fdatasync` of a file: that file's contents and size — not its directory entry.
//! - `fsync` of a directory: that directory's entry table (names → inodes). A durable entry
//!   naming an inode whose contents were never synced names an empty (or older) file.
//! - Nothing else. A power cut is `SIGKILL` of the daemon, a forced lazy unmount (so none of
//!   the kernel's page cache survives: it belongs to the dead mount), and a fresh daemon on
//!   the same backing directory, which loads only the durable state.
//!
//! **`syncfs(2)` cannot be observed.** fuser 0.18 has no callback for `FUSE_SYNCFS`, and the
//! kernel does not send it to a `/dev/fuse` server anyway (only virtiofs enables it): on this
//! machine's 6.18 kernel a `syncfs` or `sync` on the mount reaches the daemon as no request at
//! all — not even an unknown opcode, which it would log (`KAAS_LAZYFS_LOG=debug` shows every
//! request). So on this file system `syncfs` succeeds and makes nothing durable, and kaas's
//! default `--sync-scope syncfs` cannot be tested here: the power-loss test
//! (`tests/test_power_loss.py`) runs kaas with `--sync-scope file` (fdatasync of the segment,
//! fsync of files and directories). [`model::Fs::sync_all`] is what a forwarded syncfs would do.
//!
//! Fault injection: with `--fail-fsync-trigger PATH`, while PATH exists the next fsync of a
//! file fails with EIO and loses the file's unsynced pages ([`model::Fs::lose_unsynced`]), as a
//! disk's failed write-back does; the daemon removes PATH, so each creation is one fault.
//!
//! Not modelled: `fallocate` (refused with EOPNOTSUPP; kaas zero-fills instead), symlinks,
//! extended attributes, and durable ownership or permissions (everything comes back as root,
//! 0644/0755). `flock` and POSIX locks are not implemented here, so the kernel keeps them
//! locally for the mount, which is what kaas's `File::lock` needs.

pub mod fuse;
pub mod model;
