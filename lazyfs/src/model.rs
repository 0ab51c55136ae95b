//! The durability model, without FUSE: what the file system holds now (volatile over durable)
//! and what survives a power cut (durable only).
//!
//! Durable state is kept in the backing directory, keyed by inode number:
//!
//! - `i<ino>.data` — a regular file's contents as of its last `fsync`/`fdatasync`;
//! - `i<ino>.dir`  — a directory's entry table (`<ino> <d|f> <hex name>` per line) as of its
//!   last `fsync` of the directory.
//!
//! Everything else — written bytes, new sizes, created, renamed, linked and unlinked names —
//! lives only in this process's memory until the matching sync, and a power cut (the process
//! killed, a fresh one started on the same backing directory with [`Fs::load`]) loses it. This
//! is the weakest reading of POSIX, the one an application must be written for: a file's fsync
//! does not make its name durable, a directory's fsync does not make its files' contents
//! durable, and nothing is made durable by a sync of something else.
//!
//! The simulated cut kills this process, not the machine under it, so the backing files need
//! not reach the real disk: they are written without fsync. A directory table is replaced by
//! tmp + rename so that a process killed in the middle leaves the old table or the new one. A
//! file's contents are updated in place: a process killed during an `fsync` leaves a mix of old
//! and new bytes, which is what a real disk may hold after a cut during an fsync that had not
//! returned.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io::{ErrorKind, Write};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

/// The root directory's inode number (FUSE's `FUSE_ROOT_ID`).
pub const ROOT: u64 = 1;

/// Granularity of the in-memory overlay of unsynced writes.
const PAGE: u64 = 4096;

/// An errno, as FUSE replies carry them.
pub type Errno = i32;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    File,
    Dir,
}

/// A regular file: the durable bytes in `i<ino>.data` under an overlay of dirty pages.
#[derive(Debug, Default)]
struct FileBody {
    /// The size readers see now.
    size: u64,
    /// The length of `i<ino>.data` (0 if it does not exist).
    durable_size: u64,
    /// Bytes at or past this offset read as zeros unless a dirty page holds them: a truncation
    /// since the last sync hid the durable bytes there.
    zero_from: u64,
    /// Pages written since the last sync, whole (bytes past `size` are zero).
    dirty: BTreeMap<u64, Box<[u8]>>,
}

#[derive(Debug)]
enum Body {
    File(FileBody),
    Dir(BTreeMap<OsString, u64>),
}

#[derive(Debug)]
struct Inode {
    body: Body,
    nlink: u32,
    /// Open file handles: an unlinked inode stays readable and syncable while one is open.
    open: u32,
    perm: u16,
    uid: u32,
    gid: u32,
    mtime: SystemTime,
    ctime: SystemTime,
}

/// What `getattr` reports.
#[derive(Clone, Copy, Debug)]
pub struct Attr {
    pub ino: u64,
    pub kind: Kind,
    pub size: u64,
    pub nlink: u32,
    pub perm: u16,
    pub uid: u32,
    pub gid: u32,
    pub mtime: SystemTime,
    pub ctime: SystemTime,
}

/// What a `setattr` asks to change.
#[derive(Clone, Copy, Debug, Default)]
pub struct SetAttr {
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: Option<u64>,
    pub mtime: Option<SystemTime>,
}

/// The whole file system: volatile inodes in memory, durable ones in `backing`.
#[derive(Debug)]
pub struct Fs {
    backing: PathBuf,
    inodes: HashMap<u64, Inode>,
    next_ino: u64,
    /// Open read handles on `i<ino>.data`, so reads do not reopen it each time.
    data_files: HashMap<u64, File>,
}

fn data_path(backing: &Path, ino: u64) -> PathBuf {
    backing.join(format!("i{ino}.data"))
}

fn dir_path(backing: &Path, ino: u64) -> PathBuf {
    backing.join(format!("i{ino}.dir"))
}

fn hex(name: &OsStr) -> String {
    name.as_bytes().iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Option<OsString> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    let bytes: Option<Vec<u8>> = (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).ok())
        .collect();
    bytes.map(OsString::from_vec)
}

/// Reads a durable directory table; a missing one is an empty directory (created, its name
/// made durable in its parent, but never synced itself).
fn read_table(backing: &Path, ino: u64) -> std::io::Result<Vec<(OsString, u64, Kind)>> {
    let text = match std::fs::read_to_string(dir_path(backing, ino)) {
        Ok(t) => t,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let bad = || std::io::Error::new(ErrorKind::InvalidData, format!("bad table i{ino}.dir"));
    let mut out = Vec::new();
    for line in text.lines() {
        let mut parts = line.split(' ');
        let child: u64 = parts.next().and_then(|s| s.parse().ok()).ok_or_else(bad)?;
        let kind = match parts.next() {
            Some("d") => Kind::Dir,
            Some("f") => Kind::File,
            _ => return Err(bad()),
        };
        let name = parts.next().and_then(unhex).ok_or_else(bad)?;
        out.push((name, child, kind));
    }
    Ok(out)
}

fn inode_of_backing_name(name: &str) -> Option<u64> {
    let rest = name.strip_prefix('i')?;
    let digits = rest.split('.').next()?;
    digits.parse().ok()
}

impl Fs {
    /// Starts from the durable state in `backing` (created if missing) — what a machine holds
    /// after a power cut. Backing files no durable name reaches are deleted, as a real file
    /// system's recovery frees orphaned inodes.
    pub fn load(backing: &Path) -> std::io::Result<Fs> {
        std::fs::create_dir_all(backing)?;
        let now = SystemTime::now();
        let mut inodes = HashMap::new();
        let mut max_ino = ROOT;
        let mut queue = VecDeque::from([ROOT]);
        let mut seen_dirs = HashSet::from([ROOT]);
        let mut tables: HashMap<u64, BTreeMap<OsString, u64>> = HashMap::new();
        let mut files: HashMap<u64, u32> = HashMap::new();
        while let Some(dir) = queue.pop_front() {
            let mut entries = BTreeMap::new();
            for (name, child, kind) in read_table(backing, dir)? {
                max_ino = max_ino.max(child);
                match kind {
                    Kind::Dir => {
                        // A directory renamed from one durable table into another can be in
                        // both; directories have one name, so the first one found wins.
                        if !seen_dirs.insert(child) {
                            continue;
                        }
                        queue.push_back(child);
                    }
                    Kind::File => *files.entry(child).or_default() += 1,
                }
                entries.insert(name, child);
            }
            tables.insert(dir, entries);
        }
        for (ino, entries) in tables {
            inodes.insert(ino, Inode::new(Body::Dir(entries), 2, 0o755, now));
        }
        for (ino, nlink) in files {
            let durable_size = match std::fs::metadata(data_path(backing, ino)) {
                Ok(m) => m.len(),
                Err(e) if e.kind() == ErrorKind::NotFound => 0,
                Err(e) => return Err(e),
            };
            let body = FileBody {
                size: durable_size,
                durable_size,
                zero_from: u64::MAX,
                dirty: BTreeMap::new(),
            };
            inodes.insert(ino, Inode::new(Body::File(body), nlink, 0o644, now));
        }
        for entry in std::fs::read_dir(backing)? {
            let entry = entry?;
            let name = entry.file_name();
            let Some(ino) = name.to_str().and_then(inode_of_backing_name) else {
                continue;
            };
            max_ino = max_ino.max(ino);
            if !inodes.contains_key(&ino) || name.to_string_lossy().ends_with(".tmp") {
                std::fs::remove_file(entry.path())?;
            }
        }
        Ok(Fs {
            backing: backing.to_path_buf(),
            inodes,
            next_ino: max_ino + 1,
            data_files: HashMap::new(),
        })
    }

    /// The backing directory holding the durable state.
    pub fn backing(&self) -> &Path {
        &self.backing
    }

    fn inode(&self, ino: u64) -> Result<&Inode, Errno> {
        self.inodes.get(&ino).ok_or(libc::ENOENT)
    }

    fn inode_mut(&mut self, ino: u64) -> Result<&mut Inode, Errno> {
        self.inodes.get_mut(&ino).ok_or(libc::ENOENT)
    }

    fn entries(&self, dir: u64) -> Result<&BTreeMap<OsString, u64>, Errno> {
        match &self.inode(dir)?.body {
            Body::Dir(e) => Ok(e),
            Body::File(_) => Err(libc::ENOTDIR),
        }
    }

    fn entries_mut(&mut self, dir: u64) -> Result<&mut BTreeMap<OsString, u64>, Errno> {
        match &mut self.inode_mut(dir)?.body {
            Body::Dir(e) => Ok(e),
            Body::File(_) => Err(libc::ENOTDIR),
        }
    }

    pub fn attr(&self, ino: u64) -> Result<Attr, Errno> {
        let i = self.inode(ino)?;
        let (kind, size) = match &i.body {
            Body::File(f) => (Kind::File, f.size),
            Body::Dir(e) => (Kind::Dir, e.len() as u64),
        };
        Ok(Attr {
            ino,
            kind,
            size,
            nlink: i.nlink,
            perm: i.perm,
            uid: i.uid,
            gid: i.gid,
            mtime: i.mtime,
            ctime: i.ctime,
        })
    }

    pub fn lookup(&self, parent: u64, name: &OsStr) -> Result<Attr, Errno> {
        let ino = *self.entries(parent)?.get(name).ok_or(libc::ENOENT)?;
        self.attr(ino)
    }

    /// Entries of a directory in name order.
    pub fn list(&self, dir: u64) -> Result<Vec<(OsString, u64, Kind)>, Errno> {
        let entries = self.entries(dir)?;
        Ok(entries
            .iter()
            .map(|(name, ino)| {
                let kind = match self.inodes.get(ino).map(|i| &i.body) {
                    Some(Body::Dir(_)) => Kind::Dir,
                    _ => Kind::File,
                };
                (name.clone(), *ino, kind)
            })
            .collect())
    }

    fn make(&mut self, parent: u64, name: &OsStr, kind: Kind, mode: u32) -> Result<Attr, Errno> {
        if self.entries(parent)?.contains_key(name) {
            return Err(libc::EEXIST);
        }
        let ino = self.next_ino;
        self.next_ino += 1;
        let (body, nlink) = match kind {
            Kind::File => (
                Body::File(FileBody {
                    zero_from: u64::MAX,
                    ..FileBody::default()
                }),
                1,
            ),
            Kind::Dir => (Body::Dir(BTreeMap::new()), 2),
        };
        let now = SystemTime::now();
        self.inodes
            .insert(ino, Inode::new(body, nlink, (mode & 0o7777) as u16, now));
        self.entries_mut(parent)?.insert(name.to_os_string(), ino);
        self.touch(parent);
        self.attr(ino)
    }

    pub fn create(&mut self, parent: u64, name: &OsStr, mode: u32) -> Result<Attr, Errno> {
        self.make(parent, name, Kind::File, mode)
    }

    pub fn mkdir(&mut self, parent: u64, name: &OsStr, mode: u32) -> Result<Attr, Errno> {
        self.make(parent, name, Kind::Dir, mode)
    }

    fn touch(&mut self, ino: u64) {
        if let Some(i) = self.inodes.get_mut(&ino) {
            let now = SystemTime::now();
            i.mtime = now;
            i.ctime = now;
        }
    }

    /// Drops an inode nothing refers to any more. Its durable files stay: the durable tables
    /// may still name it, and [`Fs::load`] collects them if not.
    fn maybe_forget(&mut self, ino: u64) {
        if let Some(i) = self.inodes.get(&ino) {
            if i.nlink == 0 && i.open == 0 {
                self.inodes.remove(&ino);
                self.data_files.remove(&ino);
            }
        }
    }

    fn unref(&mut self, ino: u64) {
        if let Some(i) = self.inodes.get_mut(&ino) {
            i.nlink = match i.body {
                // A directory is removed whole.
                Body::Dir(_) => 0,
                Body::File(_) => i.nlink.saturating_sub(1),
            };
            i.ctime = SystemTime::now();
        }
        self.maybe_forget(ino);
    }

    pub fn unlink(&mut self, parent: u64, name: &OsStr) -> Result<(), Errno> {
        let ino = *self.entries(parent)?.get(name).ok_or(libc::ENOENT)?;
        if matches!(self.inode(ino)?.body, Body::Dir(_)) {
            return Err(libc::EISDIR);
        }
        self.entries_mut(parent)?.remove(name);
        self.touch(parent);
        self.unref(ino);
        Ok(())
    }

    pub fn rmdir(&mut self, parent: u64, name: &OsStr) -> Result<(), Errno> {
        let ino = *self.entries(parent)?.get(name).ok_or(libc::ENOENT)?;
        if !self.entries(ino)?.is_empty() {
            return Err(libc::ENOTEMPTY);
        }
        self.entries_mut(parent)?.remove(name);
        self.touch(parent);
        self.unref(ino);
        Ok(())
    }

    /// `rename(2)`; `noreplace` is `RENAME_NOREPLACE`.
    pub fn rename(
        &mut self,
        parent: u64,
        name: &OsStr,
        new_parent: u64,
        new_name: &OsStr,
        noreplace: bool,
    ) -> Result<(), Errno> {
        let ino = *self.entries(parent)?.get(name).ok_or(libc::ENOENT)?;
        let is_dir = matches!(self.inode(ino)?.body, Body::Dir(_));
        if let Some(&old) = self.entries(new_parent)?.get(new_name) {
            if noreplace {
                return Err(libc::EEXIST);
            }
            if old == ino {
                // Two names of one inode: rename(2) does nothing.
                return Ok(());
            }
            match (is_dir, &self.inode(old)?.body) {
                (true, Body::Dir(e)) if !e.is_empty() => return Err(libc::ENOTEMPTY),
                (true, Body::File(_)) => return Err(libc::ENOTDIR),
                (false, Body::Dir(_)) => return Err(libc::EISDIR),
                _ => {}
            }
            self.entries_mut(new_parent)?.remove(new_name);
            self.unref(old);
        }
        self.entries_mut(parent)?.remove(name);
        self.entries_mut(new_parent)?
            .insert(new_name.to_os_string(), ino);
        self.touch(parent);
        self.touch(new_parent);
        Ok(())
    }

    /// `link(2)`: fails with EEXIST if the name exists, which kaas's lock-free version chains
    /// rely on (`control/src/chain.rs`).
    pub fn link(&mut self, ino: u64, new_parent: u64, new_name: &OsStr) -> Result<Attr, Errno> {
        if matches!(self.inode(ino)?.body, Body::Dir(_)) {
            return Err(libc::EPERM);
        }
        if self.entries(new_parent)?.contains_key(new_name) {
            return Err(libc::EEXIST);
        }
        self.entries_mut(new_parent)?
            .insert(new_name.to_os_string(), ino);
        let i = self.inode_mut(ino)?;
        i.nlink += 1;
        i.ctime = SystemTime::now();
        self.touch(new_parent);
        self.attr(ino)
    }

    pub fn open(&mut self, ino: u64) -> Result<(), Errno> {
        self.inode_mut(ino)?.open += 1;
        Ok(())
    }

    pub fn release(&mut self, ino: u64) {
        if let Some(i) = self.inodes.get_mut(&ino) {
            i.open = i.open.saturating_sub(1);
        }
        self.maybe_forget(ino);
    }

    fn file(&self, ino: u64) -> Result<&FileBody, Errno> {
        match &self.inode(ino)?.body {
            Body::File(f) => Ok(f),
            Body::Dir(_) => Err(libc::EISDIR),
        }
    }

    /// Reads the durable bytes of page `idx` that no truncation hid, zeros elsewhere.
    fn durable_page(&mut self, ino: u64, idx: u64) -> Result<Box<[u8]>, Errno> {
        let (durable_size, zero_from) = {
            let f = self.file(ino)?;
            (f.durable_size, f.zero_from)
        };
        let mut page = vec![0u8; PAGE as usize].into_boxed_slice();
        let start = idx * PAGE;
        let end = ((idx + 1) * PAGE).min(durable_size).min(zero_from);
        if end > start {
            if !self.data_files.contains_key(&ino) {
                let f = File::open(data_path(&self.backing, ino)).map_err(|_| libc::EIO)?;
                self.data_files.insert(ino, f);
            }
            let f = &self.data_files[&ino];
            f.read_exact_at(&mut page[..(end - start) as usize], start)
                .map_err(|_| libc::EIO)?;
        }
        Ok(page)
    }

    pub fn read(&mut self, ino: u64, offset: u64, len: u32) -> Result<Vec<u8>, Errno> {
        let size = self.file(ino)?.size;
        let end = (offset + len as u64).min(size);
        let mut out = Vec::with_capacity(end.saturating_sub(offset) as usize);
        let mut pos = offset;
        while pos < end {
            let idx = pos / PAGE;
            let in_page = (pos % PAGE) as usize;
            let take = ((PAGE - pos % PAGE).min(end - pos)) as usize;
            if let Some(p) = self.file(ino)?.dirty.get(&idx) {
                out.extend_from_slice(&p[in_page..in_page + take]);
            } else {
                let p = self.durable_page(ino, idx)?;
                out.extend_from_slice(&p[in_page..in_page + take]);
            }
            pos += take as u64;
        }
        Ok(out)
    }

    pub fn write(&mut self, ino: u64, offset: u64, data: &[u8]) -> Result<u32, Errno> {
        self.file(ino)?;
        let mut pos = offset;
        let end = offset + data.len() as u64;
        while pos < end {
            let idx = pos / PAGE;
            let in_page = (pos % PAGE) as usize;
            let take = ((PAGE - pos % PAGE).min(end - pos)) as usize;
            let src = &data[(pos - offset) as usize..(pos - offset) as usize + take];
            let has = self.file(ino)?.dirty.contains_key(&idx);
            if !has {
                let p = self.durable_page(ino, idx)?;
                self.file_mut(ino)?.dirty.insert(idx, p);
            }
            let f = self.file_mut(ino)?;
            f.dirty.get_mut(&idx).expect("page just loaded")[in_page..in_page + take]
                .copy_from_slice(src);
            pos += take as u64;
        }
        let f = self.file_mut(ino)?;
        f.size = f.size.max(end);
        self.touch(ino);
        Ok(data.len() as u32)
    }

    fn file_mut(&mut self, ino: u64) -> Result<&mut FileBody, Errno> {
        match &mut self.inode_mut(ino)?.body {
            Body::File(f) => Ok(f),
            Body::Dir(_) => Err(libc::EISDIR),
        }
    }

    pub fn truncate(&mut self, ino: u64, new_size: u64) -> Result<(), Errno> {
        let f = self.file_mut(ino)?;
        let old = f.size;
        // Bytes past the smaller of the two sizes read as zeros from now on, durable or not.
        f.zero_from = f.zero_from.min(old.min(new_size));
        let keep_pages = new_size.div_ceil(PAGE);
        f.dirty.retain(|idx, _| *idx < keep_pages);
        if !new_size.is_multiple_of(PAGE) {
            if let Some(p) = f.dirty.get_mut(&(new_size / PAGE)) {
                p[(new_size % PAGE) as usize..].fill(0);
            }
        }
        f.size = new_size;
        self.touch(ino);
        Ok(())
    }

    pub fn setattr(&mut self, ino: u64, set: SetAttr) -> Result<Attr, Errno> {
        if let Some(size) = set.size {
            self.truncate(ino, size)?;
        }
        let i = self.inode_mut(ino)?;
        if let Some(mode) = set.mode {
            i.perm = (mode & 0o7777) as u16;
        }
        if let Some(uid) = set.uid {
            i.uid = uid;
        }
        if let Some(gid) = set.gid {
            i.gid = gid;
        }
        if let Some(t) = set.mtime {
            i.mtime = t;
        }
        i.ctime = SystemTime::now();
        self.attr(ino)
    }

    /// `fsync`/`fdatasync` of a file: its contents and size become durable — not its name.
    pub fn fsync_file(&mut self, ino: u64) -> Result<(), Errno> {
        let backing = self.backing.clone();
        let f = self.file_mut(ino)?;
        let io = |_| libc::EIO;
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(data_path(&backing, ino))
            .map_err(io)?;
        if f.zero_from < f.durable_size {
            file.set_len(f.zero_from).map_err(io)?;
        }
        for (idx, page) in &f.dirty {
            let start = idx * PAGE;
            let len = (f.size - start).min(PAGE) as usize;
            file.write_all_at(&page[..len], start).map_err(io)?;
        }
        file.set_len(f.size).map_err(io)?;
        f.durable_size = f.size;
        f.zero_from = u64::MAX;
        f.dirty.clear();
        Ok(())
    }

    /// A failed write-back, as a disk error makes one: the file's unsynced pages never reach
    /// the disk. They read back as what is durable there (or zeros) from now on; the size the
    /// kernel was told stays, so the lost range is a hole, not a shorter file. The caller
    /// answers the fsync that found out with EIO; the next fsync succeeds (as on Linux, where
    /// the error is reported once).
    pub fn lose_unsynced(&mut self, ino: u64) -> Result<(), Errno> {
        self.file_mut(ino)?.dirty.clear();
        Ok(())
    }

    /// `fsync` of a directory: its entry table (names → inodes) becomes durable. An entry for
    /// a file whose contents were never synced comes back as an empty file.
    pub fn fsync_dir(&mut self, ino: u64) -> Result<(), Errno> {
        let mut text = String::new();
        for (name, child, kind) in self.list(ino)? {
            let k = if kind == Kind::Dir { 'd' } else { 'f' };
            text.push_str(&format!("{child} {k} {}\n", hex(&name)));
        }
        let target = dir_path(&self.backing, ino);
        let tmp = target.with_extension("dir.tmp");
        (|| {
            let mut f = File::create(&tmp)?;
            f.write_all(text.as_bytes())?;
            std::fs::rename(&tmp, &target)
        })()
        .map_err(|_| libc::EIO)
    }

    /// `syncfs`/`sync`: everything becomes durable (every directory table, every file). Not
    /// reachable from a FUSE mount (see the crate docs); kept for tests and completeness.
    pub fn sync_all(&mut self) -> Result<(), Errno> {
        let mut inos: Vec<u64> = self.inodes.keys().copied().collect();
        inos.sort_unstable();
        for ino in inos {
            match self.inodes[&ino].body {
                Body::Dir(_) => self.fsync_dir(ino)?,
                Body::File(_) => self.fsync_file(ino)?,
            }
        }
        Ok(())
    }
}

impl Inode {
    fn new(body: Body, nlink: u32, perm: u16, now: SystemTime) -> Inode {
        Inode {
            body,
            nlink,
            open: 0,
            perm,
            // The daemon runs as root for the tests; ownership is not durable state here.
            uid: 0,
            gid: 0,
            mtime: now,
            ctime: now,
        }
    }
}

#[cfg(test)]
mod tests;
