//! Whether the broker's memory cgroup leaves the page cache room to keep history that is read:
//! the choice [`crate::direct`] makes between reading cold history past the page cache and
//! through it ([`ColdReads`]). Asked from the shards' threads; the answer is sampled from the
//! cgroup files at most every [`SAMPLE_MS`] and shared by every thread.
//!
//! The page cache is charged to the cgroup of the process that reads a page. With a limit the
//! history does not fit under, every page read evicts another first, on the reading thread,
//! and nothing read stays long enough to be read again: there reading past the page cache
//! costs less. Without a limit (a laptop, a VM) or under a roomy one, history read once stays
//! cached, so a second consumer of it reads memory (1.9-2.4M msg/s against 1.0-1.1M from
//! disk, bench/README.md "Cold reads go past the page cache only under a tight limit").

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::Instant;

/// How history that is not in the page cache is read (`--cold-reads`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ColdReads {
    /// Past the page cache while the broker's memory cgroup is near its limit
    /// ([`page_cache_is_tight`]), through it otherwise.
    #[default]
    Auto,
    /// Always through the page cache (`sendfile`, with the kernel's readahead), as Kafka does.
    PageCache,
    /// Always past it (`O_DIRECT`).
    Direct,
}

impl ColdReads {
    const ALL: [ColdReads; 3] = [ColdReads::Auto, ColdReads::PageCache, ColdReads::Direct];

    /// The flag's spelling.
    pub fn name(self) -> &'static str {
        match self {
            ColdReads::Auto => "auto",
            ColdReads::PageCache => "page-cache",
            ColdReads::Direct => "direct",
        }
    }
}

impl std::str::FromStr for ColdReads {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|m| m.name() == s)
            .ok_or_else(|| {
                format!(
                    "unknown cold-read mode {s:?}: expected \"auto\", \"page-cache\" or \"direct\""
                )
            })
    }
}

/// The process's [`ColdReads`], set once at start (`set_cold_reads`); `auto` until then.
static MODE: OnceLock<ColdReads> = OnceLock::new();

pub fn set_cold_reads(mode: ColdReads) {
    let _ = MODE.set(mode);
}

pub fn cold_reads() -> ColdReads {
    MODE.get().copied().unwrap_or_default()
}

/// Whether history that is not in the page cache should be read past it now.
pub fn read_past_page_cache() -> bool {
    match cold_reads() {
        ColdReads::PageCache => false,
        ColdReads::Direct => true,
        ColdReads::Auto => page_cache_is_tight(),
    }
}

/// How often the cgroup's usage is read again.
const SAMPLE_MS: u64 = 100;

/// The last sample: bit 0 whether it was tight, the rest milliseconds since [`epoch`] at
/// which it was taken, plus one (0: never sampled).
static SAMPLE: AtomicU64 = AtomicU64::new(0);

fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

/// The process's memory cgroup and whether it is v2, looked up once: a process stays in its
/// cgroup, so each sample reads only the limit and usage files.
fn own() -> Option<&'static (PathBuf, bool)> {
    static OWN: OnceLock<Option<(PathBuf, bool)>> = OnceLock::new();
    OWN.get_or_init(|| {
        let own = std::fs::read_to_string("/proc/self/cgroup").ok()?;
        own_cgroup(Path::new(CGROUP_ROOT), &own)
    })
    .as_ref()
}

/// Where the cgroup file system is mounted.
const CGROUP_ROOT: &str = "/sys/fs/cgroup";

/// Whether the broker's memory cgroup (or one above it) is within a quarter of its limit:
/// the page cache cannot grow there without evicting. False without a limit, or when the
/// cgroup files cannot be read.
pub fn page_cache_is_tight() -> bool {
    let now = epoch().elapsed().as_millis() as u64 + 1;
    let last = SAMPLE.load(Ordering::Relaxed);
    if last != 0 && now.saturating_sub(last >> 1) < SAMPLE_MS {
        return last & 1 == 1;
    }
    let tight = own()
        .and_then(|(dir, v2)| tightest(Path::new(CGROUP_ROOT), dir.clone(), *v2))
        .is_some_and(|u| u.tight());
    SAMPLE.store(now << 1 | tight as u64, Ordering::Relaxed);
    tight
}

/// A cgroup's memory limit and what is charged to it, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Usage {
    pub limit: u64,
    pub current: u64,
}

impl Usage {
    /// Within a quarter of the limit. A cgroup fills up to its limit with page cache and stays
    /// there, so "near the limit" means the cache is already being evicted to make room.
    pub fn tight(&self) -> bool {
        self.current.saturating_add(self.limit / 4) >= self.limit
    }
}

/// The tightest limit over the process's memory cgroup and the cgroups above it, under the
/// cgroup file system mounted at `root` (cgroup v2 there, or v1's `memory` hierarchy at
/// `root/memory`), `own` being `/proc/self/cgroup`. `None` without any limit. The broker
/// looks its cgroup up once ([`own`]); this is the same lookup whole, for the tests.
#[cfg(test)]
fn usage(root: &Path, own: &str) -> Option<Usage> {
    let (dir, v2) = own_cgroup(root, own)?;
    tightest(root, dir, v2)
}

/// [`usage`] from the process's cgroup directory `dir`, under `root`.
fn tightest(root: &Path, mut dir: PathBuf, v2: bool) -> Option<Usage> {
    let (limit_file, current_file) = if v2 {
        ("memory.max", "memory.current")
    } else {
        ("memory.limit_in_bytes", "memory.usage_in_bytes")
    };
    let top = if v2 {
        root.to_path_buf()
    } else {
        root.join("memory")
    };
    let mut tightest: Option<Usage> = None;
    loop {
        let read = |f: &str| std::fs::read_to_string(dir.join(f)).ok();
        if let (Some(limit), Some(current)) = (
            read(limit_file).and_then(|s| parse_limit(&s)),
            read(current_file).and_then(|s| s.trim().parse().ok()),
        ) {
            let u = Usage { limit, current };
            let room = |u: &Usage| u.limit.saturating_sub(u.current);
            if tightest.is_none_or(|t| room(&u) < room(&t)) {
                tightest = Some(u);
            }
        }
        if dir == top || !dir.pop() || !dir.starts_with(&top) {
            return tightest;
        }
    }
}

/// The process's memory cgroup directory from `/proc/self/cgroup`, and whether it is v2.
fn own_cgroup(root: &Path, own: &str) -> Option<(PathBuf, bool)> {
    let under = |base: PathBuf, path: &str| base.join(path.trim_start_matches('/'));
    for line in own.lines() {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        if controllers.split(',').any(|c| c == "memory") {
            return Some((under(root.join("memory"), path), false));
        }
    }
    // cgroup v2: one line "0::/path", when the unified hierarchy is mounted at `root`.
    let path = own.lines().find_map(|l| l.strip_prefix("0::"))?;
    root.join("cgroup.controllers")
        .exists()
        .then(|| (under(root.to_path_buf(), path), true))
}

/// A limit file's value: `max` (v2) and v1's "unlimited" (the page-rounded largest i64) are
/// no limit.
fn parse_limit(s: &str) -> Option<u64> {
    let v: u64 = s.trim().parse().ok()?;
    (v < 1 << 62).then_some(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, files: &[(&str, &str)]) {
        std::fs::create_dir_all(dir).unwrap();
        for (name, value) in files {
            std::fs::write(dir.join(name), value).unwrap();
        }
    }

    #[test]
    fn modes_parse_as_the_flag_spells_them() {
        assert_eq!("auto".parse(), Ok(ColdReads::Auto));
        assert_eq!("page-cache".parse(), Ok(ColdReads::PageCache));
        assert_eq!("direct".parse(), Ok(ColdReads::Direct));
        assert!("O_DIRECT".parse::<ColdReads>().is_err());
        for mode in ColdReads::ALL {
            assert_eq!(mode.name().parse(), Ok(mode));
        }
    }

    #[test]
    fn a_quarter_of_the_limit_left_is_tight() {
        let gib = 1u64 << 30;
        assert!(Usage {
            limit: gib,
            current: gib
        }
        .tight());
        assert!(Usage {
            limit: gib,
            current: gib / 4 * 3
        }
        .tight());
        assert!(!Usage {
            limit: gib,
            current: gib / 2
        }
        .tight());
        assert!(!Usage {
            limit: 8 * gib,
            current: 2 * gib
        }
        .tight());
    }

    #[test]
    fn v2_takes_the_tightest_limit_up_to_the_root() {
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        write(r, &[("cgroup.controllers", "cpu memory")]);
        // The pod's limit is 1 GiB and full; the container below it sets none.
        write(
            &r.join("pod"),
            &[
                ("memory.max", "1073741824\n"),
                ("memory.current", "1073000000\n"),
            ],
        );
        write(
            &r.join("pod/ctr"),
            &[("memory.max", "max\n"), ("memory.current", "1073000000\n")],
        );
        let u = usage(r, "0::/pod/ctr\n").unwrap();
        assert_eq!(
            u,
            Usage {
                limit: 1 << 30,
                current: 1_073_000_000
            }
        );
        assert!(u.tight());
        // No limit anywhere: nothing to be tight against.
        write(
            &r.join("free"),
            &[("memory.max", "max\n"), ("memory.current", "5\n")],
        );
        assert_eq!(usage(r, "0::/free\n"), None);
    }

    #[test]
    fn v1_reads_the_memory_hierarchy() {
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        let unlimited = "9223372036854771712\n";
        write(
            &r.join("memory"),
            &[
                ("memory.limit_in_bytes", unlimited),
                ("memory.usage_in_bytes", "9\n"),
            ],
        );
        write(
            &r.join("memory/kaas"),
            &[
                ("memory.limit_in_bytes", "1073741824\n"),
                ("memory.usage_in_bytes", "536870912\n"),
            ],
        );
        let own = "12:pids:/kaas\n7:cpu,cpuacct:/\n4:memory:/kaas\n";
        let u = usage(r, own).unwrap();
        assert_eq!(
            u,
            Usage {
                limit: 1 << 30,
                current: 1 << 29
            }
        );
        assert!(!u.tight());
        assert_eq!(
            usage(r, "4:memory:/\n"),
            None,
            "the root's unlimited value is no limit"
        );
        assert_eq!(
            usage(r, "4:memory:/gone\n"),
            None,
            "an unreadable cgroup counts as none"
        );
    }
}
