//! FUSE requests onto [`crate::model::Fs`]. One mutex around the model: the session runs one
//! request at a time anyway, and the model is pure bookkeeping plus small backing-file IO.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, LockOwner,
    MountOption, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory,
    ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, Request, TimeOrNow, WriteFlags,
};

use crate::model::{Attr, Fs, Kind, SetAttr};

/// How long the kernel may cache attributes and names. Every change goes through this one
/// mount, so the kernel's caches cannot go stale; a cut ends the mount and its caches with it.
const TTL: Duration = Duration::from_secs(1);

pub struct LazyFs {
    fs: Mutex<Fs>,
    /// While this file exists, the next fsync of a file loses that file's unsynced pages and
    /// fails with EIO (the file is removed, so one fault per creation).
    fail_fsync_trigger: Option<PathBuf>,
}

/// Mounts `fs` at `mountpoint` and serves it until the mount goes away.
pub fn mount(
    fs: Fs,
    mountpoint: &Path,
    fail_fsync_trigger: Option<PathBuf>,
) -> std::io::Result<()> {
    let mut config = fuser::Config::default();
    config.mount_options = vec![
        MountOption::FSName("kaas-lazyfs".into()),
        MountOption::Subtype("kaas-lazyfs".into()),
    ];
    // No direct_io and no writeback cache: writes reach the daemon as they are made (so a cut
    // loses nothing the kernel held back), and reads and mmap go through the page cache.
    fuser::mount(
        LazyFs {
            fs: Mutex::new(fs),
            fail_fsync_trigger,
        },
        mountpoint,
        &config,
    )
}

fn err(e: i32) -> Errno {
    Errno::from_i32(e)
}

/// Answers a request that names an entry (lookup, mkdir, mknod, link) with it or the error.
fn entry(reply: ReplyEntry, r: Result<Attr, i32>) {
    match r {
        Ok(a) => reply.entry(&TTL, &file_attr(&a), Generation(0)),
        Err(e) => reply.error(err(e)),
    }
}

/// Answers an attribute request (getattr, setattr) with the attributes or the error.
fn attr(reply: ReplyAttr, r: Result<Attr, i32>) {
    match r {
        Ok(a) => reply.attr(&TTL, &file_attr(&a)),
        Err(e) => reply.error(err(e)),
    }
}

/// Answers a request with no payload (unlink, rename, fsync, …) with success or the error.
fn empty(reply: ReplyEmpty, r: Result<(), i32>) {
    match r {
        Ok(()) => reply.ok(),
        Err(e) => reply.error(err(e)),
    }
}

fn file_attr(a: &Attr) -> FileAttr {
    FileAttr {
        ino: INodeNo(a.ino),
        size: a.size,
        blocks: a.size.div_ceil(512),
        atime: a.mtime,
        mtime: a.mtime,
        ctime: a.ctime,
        crtime: a.ctime,
        kind: kind(a.kind),
        perm: a.perm,
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        rdev: 0,
        blksize: 4096,
        flags: 0,
    }
}

fn kind(k: Kind) -> FileType {
    match k {
        Kind::File => FileType::RegularFile,
        Kind::Dir => FileType::Directory,
    }
}

impl LazyFs {
    fn with<T>(&self, f: impl FnOnce(&mut Fs) -> T) -> T {
        let mut fs = self.fs.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut fs)
    }
}

impl Filesystem for LazyFs {
    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        entry(reply, self.with(|fs| fs.lookup(parent.0, name)))
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        attr(reply, self.with(|fs| fs.attr(ino.0)))
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let set = SetAttr {
            mode,
            uid,
            gid,
            size,
            mtime: mtime.map(|t| match t {
                TimeOrNow::SpecificTime(t) => t,
                TimeOrNow::Now => SystemTime::now(),
            }),
        };
        attr(reply, self.with(|fs| fs.setattr(ino.0, set)))
    }

    fn mkdir(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        entry(
            reply,
            self.with(|fs| fs.mkdir(parent.0, name, mode & !umask)),
        )
    }

    fn mknod(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        _rdev: u32,
        reply: ReplyEntry,
    ) {
        if mode & libc::S_IFMT != libc::S_IFREG {
            return reply.error(Errno::EPERM);
        }
        entry(
            reply,
            self.with(|fs| fs.create(parent.0, name, mode & !umask)),
        )
    }

    fn create(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let result = self.with(|fs| {
            let a = match fs.create(parent.0, name, mode & !umask) {
                Ok(a) => a,
                // The kernel asks to create only names it found missing; if one appeared
                // meanwhile, open(2) without O_EXCL opens it.
                Err(libc::EEXIST) if flags & libc::O_EXCL == 0 => {
                    let a = fs.lookup(parent.0, name)?;
                    if flags & libc::O_TRUNC != 0 {
                        fs.truncate(a.ino, 0)?;
                    }
                    fs.attr(a.ino)?
                }
                Err(e) => return Err(e),
            };
            fs.open(a.ino)?;
            Ok(a)
        });
        match result {
            Ok(a) => reply.created(
                &TTL,
                &file_attr(&a),
                Generation(0),
                FileHandle(0),
                FopenFlags::empty(),
            ),
            Err(e) => reply.error(err(e)),
        }
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        empty(reply, self.with(|fs| fs.unlink(parent.0, name)))
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        empty(reply, self.with(|fs| fs.rmdir(parent.0, name)))
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        if flags.intersects(RenameFlags::RENAME_EXCHANGE | RenameFlags::RENAME_WHITEOUT) {
            return reply.error(Errno::EINVAL);
        }
        let noreplace = flags.contains(RenameFlags::RENAME_NOREPLACE);
        empty(
            reply,
            self.with(|fs| fs.rename(parent.0, name, newparent.0, newname, noreplace)),
        )
    }

    fn link(
        &self,
        _req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        entry(reply, self.with(|fs| fs.link(ino.0, newparent.0, newname)))
    }

    fn open(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match self.with(|fs| fs.open(ino.0)) {
            Ok(()) => reply.opened(FileHandle(0), FopenFlags::empty()),
            Err(e) => reply.error(err(e)),
        }
    }

    fn release(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        self.with(|fs| fs.release(ino.0));
        reply.ok();
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        // close(2) makes nothing durable.
        reply.ok();
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        match self.with(|fs| fs.read(ino.0, offset, size)) {
            Ok(d) => reply.data(&d),
            Err(e) => reply.error(err(e)),
        }
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        match self.with(|fs| fs.write(ino.0, offset, data)) {
            Ok(n) => reply.written(n),
            Err(e) => reply.error(err(e)),
        }
    }

    fn fsync(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        if let Some(trigger) = &self.fail_fsync_trigger {
            if std::fs::remove_file(trigger).is_ok() {
                log::warn!(
                    "failing the fsync of inode {} with EIO: its unsynced pages are lost",
                    ino.0
                );
                let lost = self.with(|fs| fs.lose_unsynced(ino.0));
                return empty(reply, lost.and(Err(libc::EIO)));
            }
        }
        // fdatasync and fsync alike: the size is data here, and names are the directory's.
        empty(reply, self.with(|fs| fs.fsync_file(ino.0)))
    }

    fn opendir(&self, _req: &Request, _ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        reply.opened(FileHandle(0), FopenFlags::empty());
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let entries = match self.with(|fs| fs.list(ino.0)) {
            Ok(e) => e,
            Err(e) => return reply.error(err(e)),
        };
        // Offsets are positions in the name-ordered listing; "." and ".." come first.
        let dots = [
            (OsStr::new(".").to_os_string(), ino.0, Kind::Dir),
            (OsStr::new("..").to_os_string(), ino.0, Kind::Dir),
        ];
        for (i, (name, child, k)) in dots.into_iter().chain(entries).enumerate() {
            if (i as u64) < offset {
                continue;
            }
            if reply.add(INodeNo(child), i as u64 + 1, kind(k), &name) {
                break;
            }
        }
        reply.ok();
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        empty(reply, self.with(|fs| fs.fsync_dir(ino.0)))
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        // The backing disk's numbers: kaas's free-space checks (`shard/src/disk.rs`) see a
        // real volume's free space.
        let backing = self.with(|fs| fs.backing().to_path_buf());
        let Ok(path) = std::ffi::CString::new(backing.as_os_str().as_encoded_bytes()) else {
            return reply.error(Errno::EIO);
        };
        let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
        // SAFETY: `path` is NUL-terminated and `st` is a valid out-pointer.
        if unsafe { libc::statvfs(path.as_ptr(), &mut st) } != 0 {
            return reply.error(Errno::EIO);
        }
        reply.statfs(
            st.f_blocks,
            st.f_bfree,
            st.f_bavail,
            st.f_files,
            st.f_ffree,
            st.f_bsize as u32,
            255,
            st.f_frsize as u32,
        );
    }

    fn access(&self, _req: &Request, _ino: INodeNo, _mask: fuser::AccessFlags, reply: ReplyEmpty) {
        // Permissions are not modelled (the tests run as root).
        reply.ok();
    }

    fn fallocate(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _offset: u64,
        _length: u64,
        _mode: i32,
        reply: ReplyEmpty,
    ) {
        // kaas zero-fills ahead of its data instead (`PartitionLog::preallocate`).
        reply.error(Errno::EOPNOTSUPP);
    }

    fn getxattr(&self, _req: &Request, _ino: INodeNo, _n: &OsStr, _s: u32, r: fuser::ReplyXattr) {
        // ENOSYS tells the kernel to stop asking (it checks security.capability on writes).
        r.error(Errno::ENOSYS);
    }

    fn ioctl(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _flags: fuser::IoctlFlags,
        _cmd: u32,
        _in_data: &[u8],
        _out_size: u32,
        reply: fuser::ReplyIoctl,
    ) {
        // isatty(3) and friends ask; regular files answer ENOTTY.
        reply.error(Errno::ENOTTY);
    }

    fn listxattr(&self, _req: &Request, _ino: INodeNo, _size: u32, reply: fuser::ReplyXattr) {
        reply.error(Errno::ENOSYS);
    }
}
