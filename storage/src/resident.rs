//! How much of the segments' memory mappings stays resident in the broker's address space:
//! bounded per shard.
//!
//! Fetches are served from memory-mapped segments without copying (`PartitionLog::read`).
//! Every page a read touches stays mapped, and counts in the process's VmRSS, for as long as
//! the mapping lives — a sealed segment's mapping lives as long as the segment. Reading 12 GB
//! of history left a VmRSS of 12 GB (issue 16). Those are clean page-cache pages the kernel may
//! drop at any time, but an operator reads a leak, and a pod's memory accounting sees them.
//!
//! So each read records the byte range it sliced, and when the ranges recorded on this shard
//! exceed [`BUDGET_BYTES`], the oldest are released with `MADV_DONTNEED` (widened to whole
//! folios, [`RELEASE_ALIGN_BYTES`]): the pages leave this process's page tables (VmRSS falls)
//! and stay in the page cache, and a later access faults them back in from the file. That is
//! sound because these are shared (`MAP_SHARED`), read-only mappings: `MADV_DONTNEED` only
//! drops this process's page-table entries, and the mapping always shows the page cache, before
//! and after — so a slice still on its way to a socket reads the same bytes (the readers only
//! ever slice verified batches, which nothing rewrites: a sealed segment is never modified in
//! place, and the active segment's appends land past its data).
//!
//! One [`Ranges`] per shard thread: nothing here is shared between threads. The bookkeeping is
//! pure ([`Ranges::record`] says what to release) and tested apart from the `madvise`.
//!
//! Each mapping is also listed, by address, in a process-wide table with the descriptor of the
//! segment file it maps, so that the connection writing a response can hand a slice of it to
//! the socket with `sendfile` instead of copying it out of the mapping ([`with_file_backing`]).
//! Most of what a fetch sends then never enters this process's page tables; what still does
//! (the batch headers a read walks, record sets too small for `sendfile`) stays within the
//! budget above, which counts every range read.
//!
//! The descriptor is the segment's own (no descriptor is added per mapping: the shard's
//! open-file budget counts segments), so a slice can outlive it — a response still being
//! written when retention deletes the segment or an idle log is closed. Each segment therefore
//! shares a [`SendableFd`] with its mappings' entries: `Some(fd)` while the segment holds the
//! file open, read-locked around each `sendfile`, and set to `None` before the segment lets go
//! ([`revoke`]; when a send on another thread holds the lock, the file is kept open until it
//! ends instead of waiting for it). A slice whose segment is gone is copied from the mapping,
//! which stays valid. The table is shared between threads because a slice may be written by
//! another shard than the one that mapped it (a fetch of partitions owned elsewhere).
//! Measured in bench/README.md ("Consume with sendfile").

use std::cell::RefCell;
use std::collections::{BTreeMap, VecDeque};
use std::os::fd::{AsRawFd, RawFd};
use std::path::Path;
use std::rc::Rc;
use std::sync::{Arc, Mutex, RwLock, Weak};

use bytes::Bytes;
use memmap2::Mmap;

use crate::StorageError;

/// What a shard keeps resident of the ranges its reads touched. A consumer reading history
/// sequentially needs only the pages in flight; 128 MiB leaves room for many partitions' tails
/// being read at once (a page released too early costs a minor fault, not a disk read).
pub const BUDGET_BYTES: usize = 128 << 20;

/// Contiguous reads of one mapping are recorded as one range up to this size, so releasing
/// goes in steps of a few MiB rather than a whole 1 GiB segment at once.
const MAX_RANGE_BYTES: usize = 8 << 20;

/// How many of the newest ranges a read looks through for the one it continues. Consumers of
/// many partitions interleave their reads: with only the newest range tried, 100 partitions
/// read round robin recorded one range per read, and released each with its own `madvise`,
/// which flushes the TLB of every core the process runs on (an IPI each, costly in a VM): 10%
/// of the broker's CPU in a consume of 100 partitions (bench/README.md). A scan of this many
/// entries costs far less than one of those calls.
const MERGE_SCAN: usize = 256;

/// How far before its first byte a new range is recorded from. A read's first fault maps the
/// pages around it too (the kernel's `fault_around_bytes`, 64 KiB by default), and its header
/// walk starts at the index mark before the offset asked for: pages in front of the range.
/// While each read had a range of its own they lay in the previous read's range, still
/// recorded; once a partition's range is released and its next read starts a new one, they
/// would stay mapped, unrecorded, for the segment's life (VmRSS grew from 54 to 203 MiB in a
/// consume of 100 partitions).
const LEAD_BYTES: usize = 64 << 10;

/// A released range is widened to this alignment in the file. A fault maps more than the page
/// it touches, and not only the 64 KiB of the kernel's fault-around: ext4 caches a file in
/// folios as large as the writes that filled them (up to 2 MiB), and a fault can map its whole
/// folio. Those pages lie outside the range that faulted them, and unless a release covers them
/// they stay mapped for the segment's life. Measured on this machine's Linux 6.18, reading 94
/// MiB of 16 partitions round robin (appended 256 KiB at a time) under a 1 MiB budget: 19 MiB
/// stayed mapped, growing with the history read, with [`LEAD_BYTES`] of 64 KiB alone; 3 MiB
/// with a 128 KiB lead; at most 1.8 MiB with releases widened (storage/tests/partition_log.rs).
/// One shard after a consume of 100 partitions read from disk (readahead fills large folios):
/// 675 MiB of segment pages mapped after 5.9 GiB read and 432 MiB after 2.5 GiB with the lead
/// alone, 159-231 MiB with releases widened — what stays is the budget and up to a folio on
/// either side of each recorded range, however much history is read (bench/README.md). Widening
/// only unmaps more: a page of a newer range it reaches is faulted back from the page cache if
/// that range is read again.
const RELEASE_ALIGN_BYTES: usize = 2 << 20;

/// `[start, start + len)` widened to [`RELEASE_ALIGN_BYTES`] on both sides, within a mapping
/// of `map_len` bytes: the (offset, length) to release.
fn release_span(start: usize, len: usize, map_len: usize) -> (usize, usize) {
    let from = start - start % RELEASE_ALIGN_BYTES;
    let to = start
        .saturating_add(len)
        .div_ceil(RELEASE_ALIGN_BYTES)
        .saturating_mul(RELEASE_ALIGN_BYTES)
        .min(map_len);
    (from.min(map_len), to.saturating_sub(from))
}

/// The owner of a segment mapping inside `Bytes` (zero-copy slices keep it alive); the segment
/// keeps a `Weak` to it, so releasing never extends a mapping's life. Listed in [`MAPPINGS`]
/// for as long as it lives.
struct MapOwner(Arc<Mmap>);

impl AsRef<[u8]> for MapOwner {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

impl Drop for MapOwner {
    fn drop(&mut self) {
        // Unlisted before the mapping can be unmapped (the field drops after this), so no
        // lookup can find an address that a new mapping reuses.
        if !self.0.is_empty() {
            lock_mappings().remove(&(self.0.as_ptr() as usize));
        }
    }
}

/// A segment file's descriptor as `sendfile` may use it: `Some` while the segment holds the
/// file open. Shared by the segment and its mappings' [`MAPPINGS`] entries.
pub type SendableFd = Arc<RwLock<Option<RawFd>>>;

/// A new [`SendableFd`] for a segment whose file is open as `fd`.
pub fn sendable(fd: RawFd) -> SendableFd {
    Arc::new(RwLock::new(Some(fd)))
}

thread_local! {
    /// Revocations that found a `sendfile` from the descriptor running on another thread, each
    /// with what keeps that descriptor open until the revocation completes.
    static PENDING: RefCell<Vec<(SendableFd, Box<dyn std::any::Any>)>> = const { RefCell::new(Vec::new()) };
}

/// Called by a segment before its file can be closed (dropped, or replaced by a cleaned
/// copy), with `keep_open`, a handle that keeps the descriptor open. No `sendfile` starts from
/// the descriptor afterwards. One running on another thread (it holds the read lock) is not
/// waited for — it may be reading from disk, and this thread serves other partitions — the
/// handle is kept instead, and released once that send ended by a later call here or by
/// [`release_revoked`], which the shard calls every tick.
pub fn revoke(fd: &SendableFd, keep_open: Box<dyn std::any::Any>) {
    let _ = PENDING.try_with(|pending| {
        let mut pending = pending.borrow_mut();
        pending.retain(|(fd, _)| !try_revoke(fd));
        if !try_revoke(fd) {
            pending.push((fd.clone(), keep_open));
        }
    });
}

/// Completes the revocations on this thread whose `sendfile` has ended, closing the files they
/// kept open; returns how many are still waiting. Without it a deleted segment that a cold
/// read held at its revocation (a blocking-thread `sendfile` of history holds the lock for
/// the disk's time, and history is what retention deletes) kept its descriptor, and its disk
/// space, until the next revocation on the shard — hours on a quiet one.
pub fn release_revoked() -> usize {
    PENDING
        .try_with(|pending| {
            let mut pending = pending.borrow_mut();
            pending.retain(|(fd, _)| !try_revoke(fd));
            pending.len()
        })
        .unwrap_or(0)
}

/// Cold reads (a `sendfile` or `pread` that waits for the disk) a shard runs on its blocking
/// threads at once. The group commit's syncs and directory fsyncs share those threads, which
/// take jobs first come first served: with no bound, one fetch of many cold partitions, or
/// many consumers catching up at once, queued enough reads ahead of a sync to stall acks=all
/// produce for seconds. A shard has more blocking threads than this (`kaas_shard`'s
/// `BLOCKING_THREADS`), so a sync always finds one free.
pub const COLD_READS_IN_FLIGHT: usize = 2;

/// Runs `read`, a call that waits for the disk, on this shard's blocking threads, with at
/// most [`COLD_READS_IN_FLIGHT`] such calls queued or running at once; the rest wait here, on
/// the shard, where waiting costs nothing. For the shard's thread (a glommio executor).
pub async fn off_shard<R: Send + 'static>(read: impl FnOnce() -> R + Send + 'static) -> R {
    thread_local! {
        static SLOTS: Rc<glommio::sync::Semaphore> =
            Rc::new(glommio::sync::Semaphore::new(COLD_READS_IN_FLIGHT as u64));
    }
    let slots = SLOTS.with(Rc::clone);
    // The semaphore is never closed, so the permit always comes.
    let _slot = slots.acquire_permit(1).await.expect("never closed");
    glommio::executor().spawn_blocking(read).await
}

/// Sets the descriptor to `None` unless a `sendfile` holds the read lock.
fn try_revoke(fd: &SendableFd) -> bool {
    match fd.try_write() {
        Ok(mut g) => *g = None,
        Err(std::sync::TryLockError::Poisoned(p)) => *p.into_inner() = None,
        Err(std::sync::TryLockError::WouldBlock) => return false,
    }
    true
}

/// Every live segment mapping: start address → (length, the segment's descriptor).
static MAPPINGS: Mutex<BTreeMap<usize, (usize, SendableFd)>> = Mutex::new(BTreeMap::new());

fn lock_mappings() -> std::sync::MutexGuard<'static, BTreeMap<usize, (usize, SendableFd)>> {
    // The table is consistent after any panic (each operation is one insert or remove).
    MAPPINGS.lock().unwrap_or_else(|e| e.into_inner())
}

/// When `bytes` are a slice of a segment mapping made by [`map_file`] and the segment still
/// holds its file open, runs `f(fd, offset)`, where the file's bytes `[offset, offset + len)`
/// are `bytes`, with the descriptor guaranteed open until `f` returns. `None` otherwise (the
/// caller copies `bytes`, which are valid either way). `f` should make one system call: while
/// it runs, the segment's descriptor cannot be released (its revocation waits for
/// [`release_revoked`]).
pub fn with_file_backing<R>(bytes: &Bytes, f: impl FnOnce(RawFd, u64) -> R) -> Option<R> {
    let addr = bytes.as_ptr() as usize;
    let (offset, sendable) = {
        let table = lock_mappings();
        let (&start, (len, sendable)) = table.range(..=addr).next_back()?;
        if addr + bytes.len() > start + len {
            return None;
        }
        ((addr - start) as u64, sendable.clone())
    };
    let fd = sendable.read().unwrap_or_else(|e| e.into_inner());
    fd.map(|fd| f(fd, offset))
}

/// Whether every page under `bytes` is in the page cache (`mincore`), so that sending them
/// with `sendfile` will not wait for the disk. For a file mapping `mincore` answers from the
/// page cache whether or not this process has the pages mapped, and it faults nothing in.
/// False when the answer is unknown (the call failed), so that the caller takes the path that
/// cannot block its thread. Since Linux 5.2 the answer is real only for a file this process
/// owns or may write (for any other, every page is said to be cached, and cold reads would
/// run on the shard again); a broker's segments are files it wrote, under its own user.
pub fn in_page_cache(bytes: &[u8]) -> bool {
    if bytes.is_empty() {
        return true;
    }
    let page = page_size();
    let end = bytes.as_ptr() as usize + bytes.len();
    let mut at = bytes.as_ptr() as usize & !(page - 1);
    // One call per 2 MiB of 4 KiB pages, answered into a buffer on the stack.
    let mut vec = [0u8; 512];
    while at < end {
        let len = (end - at).min(vec.len() * page);
        // SAFETY: `[at, at + len)` lies within the pages of `bytes`, which are mapped while
        // the borrow lives; `at` is page-aligned and `vec` has room for `len / page` rounded up.
        let rc = unsafe { libc::mincore(at as *mut libc::c_void, len, vec.as_mut_ptr()) };
        if rc != 0 || vec[..len.div_ceil(page)].iter().any(|v| v & 1 == 0) {
            return false;
        }
        at += len;
    }
    true
}

/// Whether the window `bytes` of a record set is in the page cache, for the choice between
/// sending it from the shard's thread and reading it elsewhere. While cold history is read
/// past the page cache (`crate::memory_limit`: memory is short and pages are being evicted)
/// every page is asked about ([`in_page_cache`]). Otherwise only the first, the middle and the
/// last page are: with memory to spare a window read sequentially is cached or evicted from
/// its ends, and asking about each of its 256 pages was a tenth of the broker's CPU in a
/// consume from the page cache (bench/README.md). A hole the probes miss costs the shard one
/// synchronous read, not a wrong answer.
pub fn window_in_page_cache(bytes: &[u8]) -> bool {
    let page = page_size();
    if bytes.len() <= 3 * page || crate::memory_limit::read_past_page_cache() {
        return in_page_cache(bytes);
    }
    let probe = |at: usize| in_page_cache(&bytes[at..at + 1]);
    probe(0) && probe(bytes.len() / 2) && probe(bytes.len() - 1)
}

/// Reads `bytes`, a slice of a segment mapping, from its file into the page cache (a `pread`
/// into a scratch buffer: the pages are not mapped into this process, so they do not count
/// against the resident budget). For a blocking thread: it waits for the disk. Errors are
/// left to the reader that follows, which meets them itself.
///
/// While cold history is read past the page cache (`crate::memory_limit`), only these pages
/// are read: the `pread` goes through a second descriptor of the file with the kernel's
/// readahead off (`POSIX_FADV_RANDOM`). These are a few KiB of batch headers,
/// and readahead (8 MiB per read on the benchmark machine's disk) filled the page cache with
/// the record sets behind them, which are read past the page cache (`crate::direct`): every
/// cold fetch read its data twice and charged a pod's memory limit for it. The segment's own
/// descriptor keeps its readahead, for the `sendfile`s that use it.
pub fn read_into_cache(bytes: &Bytes) {
    thread_local! {
        static SCRATCH: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
    }
    SCRATCH.with(|scratch| {
        let mut buf = scratch.borrow_mut();
        buf.resize(bytes.len(), 0);
        with_file_backing(bytes, |fd, offset| {
            // With room in the page cache, the readahead brings in the record sets behind
            // the headers, which the `sendfile`s that follow then find cached.
            let exact = crate::memory_limit::read_past_page_cache()
                .then(|| without_readahead(fd))
                .flatten();
            let fd = exact.as_ref().map_or(fd, |f| f.as_raw_fd());
            // SAFETY: `fd` is open while this closure runs (`with_file_backing`, or owned
            // here); `buf` has `bytes.len()` writable bytes.
            unsafe {
                libc::pread(
                    fd,
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                    offset as libc::off_t,
                )
            }
        });
    });
}

/// A second descriptor of the file open as `fd`, read-only with `flags` added: a new open
/// file description of the same file (through `/proc/self/fd`, so whatever happened to its
/// name), whose own flags and readahead state do not touch the segment's descriptor. The
/// caller keeps `fd` open for the call (`with_file_backing`).
pub fn reopen(fd: RawFd, flags: i32) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(flags)
        .open(format!("/proc/self/fd/{fd}"))
}

/// A second descriptor of the file open as `fd`, with readahead off; `None` if none can be
/// opened (the caller reads through `fd`, with readahead).
fn without_readahead(fd: RawFd) -> Option<std::fs::File> {
    let file = reopen(fd, 0).ok()?;
    // SAFETY: advice on a descriptor owned here, integer arguments.
    unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_RANDOM) };
    Some(file)
}

fn page_size() -> usize {
    static PAGE: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    // SAFETY: sysconf with a valid name has no preconditions.
    *PAGE.get_or_init(|| match unsafe { libc::sysconf(libc::_SC_PAGESIZE) } {
        n if n > 0 => n as usize,
        _ => 4096,
    })
}
/// A read-only shared mapping of the first `len` bytes of the segment file open as `sendable`
/// (`path` names it in errors), as zero-copy `Bytes`, and the handle [`touched`] takes.
/// Mapped from the segment's own descriptor, so the mapping and the descriptor `sendfile`
/// uses are the same file by construction (a path could name a newer file renamed over it).
///
/// # Safety
/// The caller guarantees that the first `len` bytes of the file are not modified or truncated
/// while the mapping lives (see the module docs), and that `sendable` is not revoked (its
/// segment is alive).
pub(crate) unsafe fn map_file(
    path: &Path,
    len: u64,
    sendable: &SendableFd,
) -> Result<(Bytes, Weak<Mmap>), StorageError> {
    let fd = sendable
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .expect("a live segment's descriptor is not revoked");
    // SAFETY: forwarded to the caller.
    let map = unsafe { memmap2::MmapOptions::new().len(len as usize).map(fd) }
        .map_err(|e| StorageError::io("mapping segment", path, e))?;
    let map = Arc::new(map);
    let handle = Arc::downgrade(&map);
    if !map.is_empty() {
        lock_mappings().insert(map.as_ptr() as usize, (map.len(), sendable.clone()));
    }
    Ok((Bytes::from_owner(MapOwner(map)), handle))
}

/// The ranges a shard's reads touched, oldest first, and their total.
#[derive(Default)]
pub struct Ranges {
    held: usize,
    queue: VecDeque<(Weak<Mmap>, usize, usize)>,
}

impl Ranges {
    /// Records that `[from, to)` of `map` was read, and returns the ranges to release so that
    /// at most `budget` bytes stay recorded (the newest range is never released).
    pub fn record(
        &mut self,
        map: &Weak<Mmap>,
        from: usize,
        to: usize,
        budget: usize,
    ) -> Vec<(Weak<Mmap>, usize, usize)> {
        if to <= from {
            return Vec::new();
        }
        // The range this read continues, among the newest: it moves to the back, so the
        // queue stays in order of last use.
        let continued = self
            .queue
            .iter()
            .enumerate()
            .rev()
            .take(MERGE_SCAN)
            .find(|(_, (m, start, len))| {
                Weak::ptr_eq(m, map) && *start + *len == from && *len < MAX_RANGE_BYTES
            })
            .map(|(i, _)| i);
        // Where the bytes this read adds to the record begin.
        let recorded_from = match continued.and_then(|i| self.queue.remove(i)) {
            Some((m, start, len)) => {
                self.queue.push_back((m, start, len + (to - from)));
                from
            }
            None => {
                let start = from.saturating_sub(LEAD_BYTES);
                self.queue.push_back((map.clone(), start, to - start));
                start
            }
        };
        self.held += to - recorded_from;
        let mut release = Vec::new();
        while self.held > budget && self.queue.len() > 1 {
            let (m, start, len) = self.queue.pop_front().expect("more than one range");
            self.held -= len;
            release.push((m, start, len));
        }
        release
    }

    /// Bytes recorded and not yet released.
    pub fn held(&self) -> usize {
        self.held
    }
}

thread_local! {
    static RANGES: RefCell<(Ranges, usize)> = RefCell::new((Ranges::default(), BUDGET_BYTES));
    static WARNED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Sets this thread's budget (tests use a small one to see releases happen).
pub fn set_budget(bytes: usize) {
    RANGES.with(|r| r.borrow_mut().1 = bytes);
}

/// Records a read of `[from, to)` of the mapping behind `map`, releasing the oldest ranges
/// past this thread's budget. A range whose mapping is gone needs no release.
pub(crate) fn touched(map: &Weak<Mmap>, from: usize, to: usize) {
    // No read-ahead advice here: a large range normally goes to the socket with `sendfile`
    // (`with_file_backing`), which reads through the page cache with the file's own sequential
    // read-ahead. The MADV_WILLNEED this used to issue for every read cost more than it gained
    // (bench/README.md); the ranges still copied (small ones, revoked ones) fault their pages
    // in as they did before it. The whole range is recorded, though `sendfile` maps none of
    // it: releasing ranges that hold no pages is cheap, and a range copied instead is covered.
    let release = RANGES.with(|r| {
        let (ranges, budget) = &mut *r.borrow_mut();
        ranges.record(map, from, to, *budget)
    });
    for (m, start, len) in release {
        let Some(m) = m.upgrade() else { continue };
        let (start, len) = release_span(start, len, m.len());
        if len == 0 {
            continue;
        }
        // SAFETY: a shared, read-only mapping of file bytes that do not change while mapped
        // (module docs): after MADV_DONTNEED, any access reads the same bytes from the page
        // cache. memmap2 aligns the range to pages.
        if let Err(e) =
            unsafe { m.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, start, len) }
        {
            // Not expected on Linux; the pages then simply stay resident. Said once.
            if !WARNED.replace(true) {
                tracing::warn!(error = %e, "cannot release read segment pages from this shard's mappings (madvise); they stay resident until their segment closes");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Proves: a release covers every folio its range touches (whole 2 MiB steps of the file,
    // so any large folio a fault in the range mapped), within the mapping.
    #[test]
    fn a_release_is_widened_to_whole_folios() {
        const A: usize = RELEASE_ALIGN_BYTES;
        assert_eq!(release_span(A + 5000, 100, 10 * A), (A, A));
        assert_eq!(release_span(A - 1, 2, 10 * A), (0, 2 * A));
        assert_eq!(release_span(0, A, 10 * A), (0, A));
        assert_eq!(
            release_span(3 * A + 1, A, 3 * A + 4096 * 3),
            (3 * A, 4096 * 3)
        );
        assert_eq!(
            release_span(3 * A + 1, 10, 3 * A),
            (3 * A, 0),
            "past the mapping"
        );
    }

    // Proves: recorded ranges never exceed the budget by more than the newest range, the
    // oldest go first, and contiguous reads of one mapping merge up to MAX_RANGE_BYTES.
    #[test]
    fn oldest_ranges_are_released_past_the_budget() {
        let a = Arc::new(
            memmap2::MmapMut::map_anon(4096)
                .unwrap()
                .make_read_only()
                .unwrap(),
        );
        let b = Arc::new(
            memmap2::MmapMut::map_anon(4096)
                .unwrap()
                .make_read_only()
                .unwrap(),
        );
        let (wa, wb) = (Arc::downgrade(&a), Arc::downgrade(&b));
        let mut r = Ranges::default();
        assert!(r.record(&wa, 0, 100, 250).is_empty());
        assert!(
            r.record(&wa, 100, 200, 250).is_empty(),
            "merged with the first"
        );
        assert_eq!(r.queue.len(), 1);
        let out = r.record(&wb, 0, 100, 250);
        assert_eq!(out.len(), 1);
        assert!(Weak::ptr_eq(&out[0].0, &wa) && out[0].1 == 0 && out[0].2 == 200);
        assert_eq!(r.held(), 100);
        // A single range over the budget stays: it is the one being read.
        assert!(r.record(&wb, 100, 1000, 250).is_empty());
        assert_eq!(r.held(), 1000);
        // Reads of several mappings interleaved continue each mapping's own range, which
        // moves to the back (the newest is never released).
        let mut r = Ranges::default();
        r.record(&wa, 0, 100, usize::MAX);
        r.record(&wb, 0, 100, usize::MAX);
        r.record(&wa, 100, 200, usize::MAX);
        r.record(&wb, 100, 200, usize::MAX);
        assert_eq!(r.queue.len(), 2);
        let out = r.record(&wa, 200, 300, 300);
        assert_eq!(out.len(), 1, "b's range is now the oldest");
        assert!(Weak::ptr_eq(&out[0].0, &wb) && out[0].1 == 0 && out[0].2 == 200);
        // A read that does not continue a range (a gap) starts a new one.
        r.record(&wa, 400, 500, usize::MAX);
        assert_eq!(r.queue.len(), 2);
        // A new range starts LEAD_BYTES early: the pages its first fault maps around it.
        let mut r = Ranges::default();
        r.record(&wa, LEAD_BYTES + 5000, LEAD_BYTES + 6000, usize::MAX);
        assert_eq!((r.queue[0].1, r.queue[0].2), (5000, LEAD_BYTES + 1000));
        assert_eq!(r.held(), LEAD_BYTES + 1000);
        // Merging stops at MAX_RANGE_BYTES.
        let mut r = Ranges::default();
        r.record(&wa, 0, MAX_RANGE_BYTES, usize::MAX);
        r.record(&wa, MAX_RANGE_BYTES, MAX_RANGE_BYTES + 1, usize::MAX);
        assert_eq!(r.queue.len(), 2);
    }

    // Proves: a slice of a mapping is found with the segment's descriptor and the offset that
    // holds its bytes; memory that is not a mapping is not; a revoked descriptor is not handed
    // out (the slice is still readable); a dropped mapping is unlisted.
    #[test]
    fn slices_of_a_mapping_are_found_with_their_file_and_offset() {
        use std::os::fd::AsRawFd;
        use std::os::unix::fs::FileExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("00000000000000000000.log");
        let data: Vec<u8> = (0..3 * 4096u32).map(|i| (i % 251) as u8).collect();
        std::fs::write(&path, &data).unwrap();
        let file = std::fs::File::open(&path).unwrap();
        let fd = sendable(file.as_raw_fd());
        // SAFETY: the file is open and not modified while mapped.
        let (map, _handle) = unsafe { map_file(&path, data.len() as u64, &fd) }.unwrap();
        let slice = map.slice(5000..9000);
        let (got, offset) = with_file_backing(&slice, |fd, offset| (fd, offset)).unwrap();
        assert_eq!((got, offset), (file.as_raw_fd(), 5000));
        let mut read = vec![0; slice.len()];
        file.read_exact_at(&mut read, offset).unwrap();
        assert_eq!(&read[..], &slice[..]);
        assert_eq!(with_file_backing(&map, |_, o| o), Some(0));
        assert!(
            with_file_backing(&Bytes::from(data.clone()), |_, o| o).is_none(),
            "heap bytes"
        );

        // A send in progress on another thread: the revocation keeps the file open instead
        // of waiting, and completes at this thread's next tick once the send ended.
        let reader = {
            let fd = fd.clone();
            let (held, release) = (
                std::sync::Arc::new(std::sync::Barrier::new(2)),
                std::sync::Arc::new(std::sync::Barrier::new(2)),
            );
            let (h, r) = (held.clone(), release.clone());
            let t = std::thread::spawn(move || {
                let _g = fd.read().unwrap();
                h.wait();
                r.wait();
            });
            held.wait();
            (t, release)
        };
        let kept = std::rc::Rc::new(());
        revoke(&fd, Box::new(kept.clone()));
        assert_eq!(
            std::rc::Rc::strong_count(&kept),
            2,
            "kept open while the send runs"
        );
        assert_eq!(release_revoked(), 1, "the send still runs");
        assert_eq!(std::rc::Rc::strong_count(&kept), 2);
        reader.1.wait();
        reader.0.join().unwrap();
        assert_eq!(release_revoked(), 0);
        assert_eq!(
            std::rc::Rc::strong_count(&kept),
            1,
            "released once it ended"
        );
        assert!(with_file_backing(&slice, |_, o| o).is_none(), "revoked");
        assert_eq!(&slice[..], &data[5000..9000]);
        let start = map.as_ptr() as usize;
        drop((map, slice));
        assert!(
            !lock_mappings().contains_key(&start),
            "unlisted when dropped"
        );
    }

    // Proves: with memory to spare a window is looked at its first, middle and last page (a
    // hole elsewhere goes unseen), and at every page while cold history is read past the page
    // cache.
    #[test]
    fn a_window_is_looked_at_its_ends_and_middle() {
        use std::os::fd::AsRawFd;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("00000000000000000000.log");
        let data: Vec<u8> = (0..(1u32 << 20)).map(|i| (i % 251) as u8).collect();
        std::fs::write(&path, &data).unwrap();
        let file = std::fs::File::open(&path).unwrap();
        file.sync_all().unwrap();
        let fd = sendable(file.as_raw_fd());
        // SAFETY: the file is open and not modified while mapped.
        let (map, _handle) = unsafe { map_file(&path, data.len() as u64, &fd) }.unwrap();
        assert!(window_in_page_cache(&map));
        let evict = |at: usize| {
            // SAFETY: advice on an open descriptor, integer arguments.
            let rc = unsafe {
                libc::posix_fadvise(file.as_raw_fd(), at as i64, 4096, libc::POSIX_FADV_DONTNEED)
            };
            assert_eq!(rc, 0);
        };
        evict(8 << 12);
        if !in_page_cache(&map) {
            // Not tmpfs (where the page cache is the only copy): a page did leave.
            assert_eq!(
                window_in_page_cache(&map),
                crate::memory_limit::read_past_page_cache(),
                "a hole off the probes is looked for only when memory is short"
            );
            evict(map.len() - 4096);
            assert!(!window_in_page_cache(&map), "the last page is probed");
            assert!(!window_in_page_cache(&map[..map.len() - 4096 + 1]));
            assert!(
                !window_in_page_cache(&map[8 << 12..]),
                "the first page is probed"
            );
            assert!(window_in_page_cache(
                &map[(8 << 12) + 4096..map.len() - 4096]
            ));
        }
    }

    // Proves: `in_page_cache` says whether sending a slice would wait for the disk — true for
    // pages just written (in the page cache, never touched through the mapping), false once
    // the file's pages were evicted, true again after they were read back.
    #[test]
    fn residency_is_answered_from_the_page_cache_without_faulting() {
        use std::os::fd::AsRawFd;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("00000000000000000000.log");
        // More than one mincore call's worth (2 MiB), not a whole number of pages.
        let data: Vec<u8> = (0..(3 << 20) + 1000u32).map(|i| (i % 251) as u8).collect();
        std::fs::write(&path, &data).unwrap();
        let file = std::fs::File::open(&path).unwrap();
        file.sync_all().unwrap();
        let fd = sendable(file.as_raw_fd());
        // SAFETY: the file is open and not modified while mapped.
        let (map, _handle) = unsafe { map_file(&path, data.len() as u64, &fd) }.unwrap();
        assert!(in_page_cache(&map), "just written");
        assert!(in_page_cache(&map[5000..3 << 20]));
        assert!(in_page_cache(&[]));

        // Clean pages not mapped by anyone are dropped by DONTNEED — except on tmpfs, where
        // the page cache is the only copy.
        // SAFETY: statfs fills the zeroed struct from a valid C path.
        let tmpfs = unsafe {
            let mut st: libc::statfs = std::mem::zeroed();
            let c = std::ffi::CString::new(dir.path().as_os_str().as_encoded_bytes()).unwrap();
            libc::statfs(c.as_ptr(), &mut st) == 0 && st.f_type == libc::TMPFS_MAGIC
        };
        if tmpfs {
            eprintln!("eviction not checked: the temporary directory is on tmpfs");
            return;
        }
        // SAFETY: advice on an open descriptor, integer arguments.
        let rc = unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
        assert_eq!(rc, 0);
        assert!(!in_page_cache(&map), "evicted");
        assert!(
            !in_page_cache(&map[map.len() - 10..]),
            "the last, partial page"
        );
        assert!(
            !in_page_cache(&map[5000..3 << 20]),
            "checking faulted nothing in"
        );

        let mut back = vec![0u8; data.len()];
        std::os::unix::fs::FileExt::read_exact_at(&file, &mut back, 0).unwrap();
        assert!(in_page_cache(&map), "read back");
    }
}
