//! Reading history past the page cache: record sets that are not in the page cache are read
//! with `O_DIRECT` into a few reusable buffers per shard, and written to the socket from there.
//!
//! A fetch's record sets are slices of segment mappings, sent with `sendfile` (`shard::conn`).
//! `sendfile` reads what is not in the page cache into the page cache first. In a pod with a
//! memory limit the page cache is charged to the broker's cgroup, so once history filled it,
//! every page read had to reclaim one first, on the thread that read it: reading 5 GiB back in
//! a 1 GiB cgroup spent 0.90-0.98 broker CPU s/GiB, a fifth of it in the cgroup's reclaim,
//! and ran at 36-39% of the same read from an unlimited page cache (bench/README.md, "Cold
//! history past the page cache"). History read once by a consumer catching up is rarely read
//! again soon, so caching it buys nothing and evicts the tail that other consumers do read.
//!
//! A window of a record set (at most [`WINDOW_BYTES`]) that is not wholly in the page cache
//! is therefore read here: from a second descriptor of the segment's file opened with
//! `O_DIRECT` (`resident::reopen`, so it is the same file whatever happened to its name),
//! on the shard's blocking threads ([`crate::resident::off_shard`], which bounds how many run
//! at once), into one of [`BUFFERS_PER_SHARD`] buffers that live as long as the shard and are
//! reused, so a read neither allocates nor faults in fresh memory. The kernel writes back any
//! dirty page of the range before a direct read, so the bytes are those the mapping shows.
//! The connection reads the next windows while it writes this one (`shard::conn`).
//!
//! Only while the page cache has no room to keep what is read: under a memory limit the
//! broker is close to (`crate::memory_limit`, `--cold-reads auto`). Elsewhere history read once
//! stays in the page cache for the next reader, as with Kafka: reading past it there made a
//! second read of the same history go to the disk again, at less than half the rate
//! (bench/README.md, "Cold reads go past the page cache only under a tight limit").
//!
//! [`read`] answers `None` — the caller sends the window with `sendfile` as before — when the
//! page cache has room, when no buffer is free (they bound the memory: a connection whose
//! client stopped reading holds its buffers until it closes), when the window is not a slice
//! of a live segment's mapping, or when the file system refuses `O_DIRECT` (tmpfs on old
//! kernels, some FUSE file systems); the last is said once and remembered for the process.

use std::alloc::Layout;
use std::cell::RefCell;
use std::marker::PhantomData;
use std::os::unix::fs::FileExt;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, Ordering};

use bytes::Bytes;

/// The largest window one read takes; the connection cuts record sets into windows this size.
pub const WINDOW_BYTES: usize = 1 << 20;
/// Buffers per shard: at 1 MiB each, what a shard holds for cold reads at most.
pub const BUFFERS_PER_SHARD: usize = 8;
/// `O_DIRECT` offset, length and memory alignment: the page size, which is a multiple of every
/// logical block size in use (a device with larger blocks refuses the read: see [`read`]).
const ALIGN: usize = 4096;
/// A window starts anywhere in its first block and ends anywhere in its last.
const BUFFER_BYTES: usize = WINDOW_BYTES + 2 * ALIGN;

/// Set once the data directory's file system refused `O_DIRECT`.
static UNSUPPORTED: AtomicBool = AtomicBool::new(false);

/// One aligned buffer of [`BUFFER_BYTES`], owned; moves to a blocking thread for the read.
struct Buffer(NonNull<u8>);

// SAFETY: the buffer is plain memory owned by this value alone.
unsafe impl Send for Buffer {}

impl Buffer {
    fn layout() -> Layout {
        Layout::from_size_align(BUFFER_BYTES, ALIGN).expect("a valid layout")
    }

    fn new() -> Self {
        // Zeroed, so that the memory is initialised as a `&mut [u8]` requires.
        // SAFETY: the layout has a non-zero size.
        let p = unsafe { std::alloc::alloc_zeroed(Self::layout()) };
        Buffer(NonNull::new(p).unwrap_or_else(|| std::alloc::handle_alloc_error(Self::layout())))
    }

    fn bytes(&self) -> &[u8] {
        // SAFETY: BUFFER_BYTES initialised bytes owned by self.
        unsafe { std::slice::from_raw_parts(self.0.as_ptr(), BUFFER_BYTES) }
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as above, borrowed mutably through self.
        unsafe { std::slice::from_raw_parts_mut(self.0.as_ptr(), BUFFER_BYTES) }
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout.
        unsafe { std::alloc::dealloc(self.0.as_ptr(), Self::layout()) }
    }
}

/// A shard's buffers: those free, and how many are lent out.
#[derive(Default)]
struct Pool {
    free: Vec<Buffer>,
    lent: usize,
}

thread_local! {
    static POOL: RefCell<Pool> = RefCell::new(Pool::default());
}

/// The right to one of this shard's [`BUFFERS_PER_SHARD`] buffers, given back when dropped —
/// also when a read is abandoned while its buffer is on a blocking thread (the connection
/// closed): the buffer is then freed there, and a later read allocates another. Counting the
/// buffer itself instead lost a slot for good with each abandoned read.
struct Slot {
    _shard_local: PhantomData<std::rc::Rc<()>>,
}

impl Slot {
    /// A slot and a buffer for it, `None` when all are lent.
    fn take() -> Option<(Slot, Buffer)> {
        POOL.with(|pool| {
            let mut pool = pool.borrow_mut();
            if pool.lent == BUFFERS_PER_SHARD {
                return None;
            }
            pool.lent += 1;
            let buf = pool.free.pop().unwrap_or_else(Buffer::new);
            let slot = Slot {
                _shard_local: PhantomData,
            };
            Some((slot, buf))
        })
    }

    /// Gives the slot back with its buffer, for the next read to reuse.
    fn give_back(self, buf: Buffer) {
        let _ = POOL.try_with(|pool| pool.borrow_mut().free.push(buf));
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let _ = POOL.try_with(|pool| {
            let mut pool = pool.borrow_mut();
            debug_assert!(pool.lent > 0, "a slot given back that was not lent");
            pool.lent -= 1;
        });
    }
}

/// Bytes read past the page cache: derefs to the window's bytes. Gives its buffer back to the
/// shard when dropped, which must be on the shard that read it (it is not `Send`).
pub struct DirectRead {
    slot: Option<(Slot, Buffer)>,
    start: usize,
    len: usize,
}

impl std::ops::Deref for DirectRead {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        let (_, buf) = self.slot.as_ref().expect("held until dropped");
        &buf.bytes()[self.start..self.start + self.len]
    }
}

impl Drop for DirectRead {
    fn drop(&mut self) {
        if let Some((slot, buf)) = self.slot.take() {
            slot.give_back(buf);
        }
    }
}

/// Reads `window` (a slice of a segment mapping, at most [`WINDOW_BYTES`]) from its file past
/// the page cache, on this shard's blocking threads. `None` when it cannot be read this way
/// (see the module docs; the caller sends it as before); an error when the file cannot give
/// the bytes (it is shorter than the slice — something truncated it — or the disk failed).
pub async fn read(window: &Bytes) -> Option<std::io::Result<DirectRead>> {
    if UNSUPPORTED.load(Ordering::Relaxed)
        || window.is_empty()
        || window.len() > WINDOW_BYTES
        || !crate::memory_limit::read_past_page_cache()
    {
        return None;
    }
    // Opened while the segment guarantees its descriptor open, and owned: the read then runs
    // even if the segment lets go of its file meanwhile (retention deleting it).
    let (file, offset) = crate::resident::with_file_backing(window, |fd, offset| {
        (crate::resident::reopen(fd, libc::O_DIRECT), offset)
    })?;
    let file = match file {
        Ok(file) => file,
        // No descriptor to spare: this window goes the old way.
        Err(e) if matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE)) => return None,
        // No O_DIRECT on this file system (or no /proc to reopen the file through).
        Err(e) => return unsupported(e),
    };
    let (slot, mut buf) = Slot::take()?;
    let (at, skip) = align_down(offset);
    let want = (skip + window.len()).next_multiple_of(ALIGN);
    let (buf, got) = crate::resident::off_shard(move || {
        let got = read_direct(&file, at, &mut buf.bytes_mut()[..want]);
        (buf, got)
    })
    .await;
    let failed = match got {
        Ok(n) if n >= skip + window.len() => {
            return Some(Ok(DirectRead {
                slot: Some((slot, buf)),
                start: skip,
                len: window.len(),
            }))
        }
        Ok(_) => Some(Err(std::io::ErrorKind::UnexpectedEof.into())),
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => unsupported(e),
        Err(e) => Some(Err(e)),
    };
    slot.give_back(buf);
    failed
}

/// Remembers (and says, once) that the data directory's file system refuses `O_DIRECT`.
fn unsupported<T>(e: std::io::Error) -> Option<T> {
    if !UNSUPPORTED.swap(true, Ordering::Relaxed) {
        tracing::info!(error = %e, "the data directory's file system refuses O_DIRECT reads; history that is not in the page cache is read through it instead");
    }
    None
}

/// `offset` rounded down to [`ALIGN`], and how far below `offset` that is.
fn align_down(offset: u64) -> (u64, usize) {
    let skip = (offset % ALIGN as u64) as usize;
    (offset - skip as u64, skip)
}

/// Reads `buf.len()` bytes (a multiple of [`ALIGN`], as `at` is) at `at` of `file`, open with
/// `O_DIRECT`; the bytes read, fewer only at the end of the file. For a blocking thread.
fn read_direct(file: &std::fs::File, at: u64, buf: &mut [u8]) -> std::io::Result<usize> {
    debug_assert!(at.is_multiple_of(ALIGN as u64) && buf.len().is_multiple_of(ALIGN));
    let mut done = 0;
    while done < buf.len() {
        match file.read_at(&mut buf[done..], at + done as u64) {
            Ok(0) => break,
            // A read that ends off a block boundary reached the end of the file.
            Ok(n) if !n.is_multiple_of(ALIGN) => return Ok(done + n),
            Ok(n) => done += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(done)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;

    // Proves: a direct read returns exactly the file's bytes for windows at any offset and
    // length (not block-aligned, ending at the file's end), and reports a file shorter than
    // the window as such.
    #[test]
    fn direct_reads_return_the_files_bytes_at_any_alignment() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("00000000000000000000.log");
        let data: Vec<u8> = (0..(3 << 20) + 1234u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        std::fs::write(&path, &data).unwrap();
        let plain = std::fs::File::open(&path).unwrap();
        let file = match crate::resident::reopen(plain.as_raw_fd(), libc::O_DIRECT) {
            Ok(file) => file,
            Err(e) => {
                eprintln!("not checked: the temporary directory refuses O_DIRECT ({e})");
                return;
            }
        };
        let mut buf = Buffer::new();
        let cases = [
            (0, WINDOW_BYTES),
            (1, 4095),
            (4095, 2),
            (5000, WINDOW_BYTES),
            (data.len() - 10, 10),
            (data.len() - WINDOW_BYTES, WINDOW_BYTES),
        ];
        for (offset, len) in cases {
            let (at, skip) = align_down(offset as u64);
            let want = (skip + len).next_multiple_of(ALIGN);
            let got = match read_direct(&file, at, &mut buf.bytes_mut()[..want]) {
                Ok(n) => n,
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                    eprintln!("not checked: the temporary directory refuses O_DIRECT ({e})");
                    return;
                }
                Err(e) => panic!("{e:?}"),
            };
            assert!(got >= skip + len, "{offset}+{len}: read {got}");
            assert_eq!(
                &buf.bytes()[skip..skip + len],
                &data[offset..offset + len],
                "{offset}+{len}"
            );
        }
        // Past the end of the file: fewer bytes than the window needs.
        let (at, skip) = align_down(data.len() as u64 - 100);
        let want = (skip + 200).next_multiple_of(ALIGN);
        let got = read_direct(&file, at, &mut buf.bytes_mut()[..want]).unwrap();
        assert!(got < skip + 200, "{got}");
    }

    // Proves: a shard lends at most BUFFERS_PER_SHARD buffers and reuses those given back; a
    // DirectRead gives its buffer back when dropped; a read abandoned with its buffer away
    // (dropped on another thread) still gives its slot back.
    #[test]
    fn a_shard_lends_a_bounded_number_of_buffers() {
        let mut lent: Vec<_> = std::iter::from_fn(Slot::take)
            .take(BUFFERS_PER_SHARD + 1)
            .collect();
        assert_eq!(lent.len(), BUFFERS_PER_SHARD);
        let first = lent.pop().unwrap();
        let addr = first.1 .0;
        let read = DirectRead {
            slot: Some(first),
            start: 0,
            len: 10,
        };
        assert!(Slot::take().is_none());
        drop(read);
        let (slot, buf) = Slot::take().expect("given back on drop");
        assert_eq!(buf.0, addr, "reused");
        // Abandoned: the buffer is dropped elsewhere, the slot here.
        std::thread::spawn(move || drop(buf)).join().unwrap();
        drop(slot);
        assert!(Slot::take().is_some_and(|(s, b)| {
            s.give_back(b);
            true
        }));
        lent.into_iter().for_each(|(s, b)| s.give_back(b));
        POOL.with(|p| assert_eq!(p.borrow().lent, 0));
    }
}
