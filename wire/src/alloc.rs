//! The process allocator, with one guard for untrusted length fields. The broker binary
//! installs it (`#[global_allocator]` in `src/main.rs`), and so do the fuzz targets (`fuzz/`),
//! so that they see the broker's behaviour for lying lengths.
//!
//! The generated Kafka decoders size vectors from array lengths read off the wire before they
//! know the elements are there (`Vec::with_capacity(n)`). With a lying length, that asks for up
//! to hundreds of gigabytes; under the kernel's default overcommit heuristic such a request
//! fails and Rust aborts the whole process — one bad client would kill the broker. The decode
//! fails a moment later anyway (the bytes are not there), so the memory is never touched.
//! Allocations of [`HUGE_BYTES`] or more are therefore served by an `mmap` with
//! `MAP_NORESERVE`, which reserves address space without committing memory: the bogus request
//! costs nothing, and the decoder then returns its error. Real allocations are far smaller
//! (frames are capped at `--max-frame-bytes`), so they never take this path.

use std::alloc::{GlobalAlloc, Layout, System};

pub const HUGE_BYTES: usize = 1 << 30;
const PAGE: usize = 4096;

pub struct GuardedAlloc;

fn is_huge(layout: &Layout) -> bool {
    layout.size() >= HUGE_BYTES && layout.align() <= PAGE
}

unsafe fn map(size: usize) -> *mut u8 {
    let p = libc::mmap(
        std::ptr::null_mut(),
        size,
        libc::PROT_READ | libc::PROT_WRITE,
        libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
        -1,
        0,
    );
    if p == libc::MAP_FAILED {
        std::ptr::null_mut()
    } else {
        p as *mut u8
    }
}

unsafe impl GlobalAlloc for GuardedAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if is_huge(&layout) {
            map(layout.size())
        } else {
            System.alloc(layout)
        }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if is_huge(&layout) {
            map(layout.size()) // anonymous mappings are zero-filled
        } else {
            System.alloc_zeroed(layout)
        }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if is_huge(&layout) {
            libc::munmap(ptr as *mut libc::c_void, layout.size());
        } else {
            System.dealloc(ptr, layout)
        }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let new_layout = Layout::from_size_align_unchecked(new_size, layout.align());
        if !is_huge(&layout) && !is_huge(&new_layout) {
            return System.realloc(ptr, layout, new_size);
        }
        let new = self.alloc(new_layout);
        if !new.is_null() {
            std::ptr::copy_nonoverlapping(ptr, new, layout.size().min(new_size));
            self.dealloc(ptr, layout);
        }
        new
    }
}
