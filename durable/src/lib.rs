//! Filesystem durability, the one place that says what makes a name survive power loss.
//!
//! POSIX makes a file's *contents* durable with `fsync` of the file, and its *name* durable only
//! with `fsync` of the directory that holds it. A directory created with `mkdir` is a name in
//! its parent like any other: until the parent is fsynced, a power cut may take the directory
//! and everything fsynced inside it. kaas lost a whole data directory this way on a test
//! filesystem that drops what was not synced (`lazyfs/`, `tests/test_power_loss.py`): the
//! segments and manifests inside `<topic>~<id>/<p>/` were fsynced, the directories holding them
//! were not.
//!
//! No dependencies and no runtime: the storage engine, the shards, the control thread and the
//! binary all use it. It blocks; the shards call it where they already do blocking file work
//! (opening a partition, the catalog).

use std::fs::File;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

/// A part of a temporary file's name that no other writer of the same directory uses at the
/// same time: a number drawn at random once per process, and a count of the calls.
///
/// The process id is not that. Every broker in a container is process 1 of its own PID
/// namespace, and in cluster mode the brokers share one volume: three brokers starting
/// together all wrote `.heartbeat.key.1.tmp`; one removed another's file halfway, and a broker
/// ended up signing its heartbeats with a key no other broker had, locked out of the cluster
/// (the chart's cluster test saw the controller alone in the assignment). The same held for
/// every file two brokers may replace at once (a partition's leader claim and manifest during
/// a handover, the catalog, the assignment chain when a deposed controller still writes).
pub fn unique_suffix() -> String {
    use std::hash::{BuildHasher, RandomState};
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::OnceLock;
    static PROCESS: OnceLock<u64> = OnceLock::new();
    static CALLS: AtomicU64 = AtomicU64::new(0);
    // `RandomState` keys its hasher from the operating system's randomness.
    let process = *PROCESS.get_or_init(|| RandomState::new().hash_one(std::process::id()));
    format!("{process:016x}.{}", CALLS.fetch_add(1, Ordering::Relaxed))
}

/// `fsync` of directory `dir`: makes the names in it (created, renamed, linked) durable.
pub fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// `mkdir -p` whose result survives power loss: each directory it creates is fsynced into its
/// parent (the parent of the topmost new one included). Directories that already existed are
/// left as they are. Safe against another process creating the same directories at once.
pub fn create_dir_all(path: &Path) -> io::Result<()> {
    // One look, not two: another broker on the shared volume may create the directory
    // between an `is_dir` and an `exists` (three brokers starting together failed that way).
    match std::fs::metadata(path) {
        Ok(m) if m.is_dir() => return Ok(()),
        Ok(_) => {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!("{} exists and is not a directory", path.display()),
            ))
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    // The missing components, deepest first.
    let mut missing: Vec<&Path> = Vec::new();
    let mut p = path;
    while !p.exists() {
        missing.push(p);
        match p.parent() {
            Some(parent) if !parent.as_os_str().is_empty() => p = parent,
            _ => break,
        }
    }
    for dir in missing.into_iter().rev() {
        match std::fs::create_dir(dir) {
            Ok(()) => {}
            // Another broker on the shared volume, or another shard, made it first; its entry
            // may not be synced yet, so sync the parent all the same.
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists && dir.is_dir() => {}
            Err(e) => return Err(e),
        }
        sync_dir(parent_of(dir))?;
    }
    Ok(())
}

/// Replaces `target` with `bytes` so that after a crash or power loss it is wholly old or
/// wholly new: written to `tmp` (which the caller names, unique per writer), fsynced, renamed
/// over `target`, and the directory fsynced. On failure the temporary file is removed and the
/// error names the path and the step that failed.
pub fn replace_file(target: &Path, tmp: &Path, bytes: &[u8]) -> Result<(), Failed> {
    let written = (|| {
        let mut f = File::create(tmp).map_err(|e| failed(tmp, "creating", e))?;
        f.write_all(bytes).map_err(|e| failed(tmp, "writing", e))?;
        f.sync_all().map_err(|e| failed(tmp, "fsyncing", e))
    })();
    if let Err(e) = written {
        // A partial temporary file would hold space a full volume needs.
        let _ = std::fs::remove_file(tmp);
        return Err(e);
    }
    std::fs::rename(tmp, target).map_err(|e| failed(target, "renaming into", e))?;
    let dir = parent_of(target);
    sync_dir(dir).map_err(|e| failed(dir, "fsyncing directory", e))
}

/// Which path a durable write failed on, and at which step.
#[derive(Debug)]
pub struct Failed {
    pub path: PathBuf,
    pub op: &'static str,
    pub error: io::Error,
}

fn failed(path: &Path, op: &'static str, error: io::Error) -> Failed {
    Failed {
        path: path.to_path_buf(),
        op,
        error,
    }
}

/// The directory holding `p` ("." for a bare name).
fn parent_of(p: &Path) -> &Path {
    match p.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Nested directories are all created, and an existing one is fine.
    #[test]
    fn creates_every_missing_component_once() {
        let root = tempfile::tempdir().unwrap();
        let deep = root.path().join("a/b/c");
        create_dir_all(&deep).unwrap();
        assert!(deep.is_dir());
        create_dir_all(&deep).unwrap();
        create_dir_all(root.path()).unwrap();
    }

    // Brokers starting together create the same directories at once: every one succeeds
    // (one of three brokers refused to start, "exists and is not a directory").
    #[test]
    fn concurrent_creators_all_succeed() {
        let root = tempfile::tempdir().unwrap();
        for round in 0..300 {
            let deep = std::sync::Arc::new(root.path().join(format!("d{round}")));
            let start = std::sync::Arc::new(std::sync::Barrier::new(6));
            let threads: Vec<_> = (0..6)
                .map(|_| {
                    let (deep, start) = (deep.clone(), start.clone());
                    std::thread::spawn(move || {
                        start.wait();
                        create_dir_all(&deep)
                    })
                })
                .collect();
            for t in threads {
                t.join().unwrap().unwrap();
            }
            assert!(deep.is_dir());
        }
    }

    // Proves: temporary-name suffixes differ between calls, also from many threads at once
    // (all of one process, as brokers in containers all are process 1).
    #[test]
    fn unique_suffixes_differ() {
        let threads: Vec<_> = (0..4)
            .map(|_| std::thread::spawn(|| (0..1000).map(|_| unique_suffix()).collect::<Vec<_>>()))
            .collect();
        let all: Vec<String> = threads
            .into_iter()
            .flat_map(|t| t.join().unwrap())
            .collect();
        let distinct: std::collections::HashSet<_> = all.iter().collect();
        assert_eq!(distinct.len(), all.len());
    }

    // A file where a directory should be is an error, not a silent success.
    #[test]
    fn a_file_in_the_way_is_an_error() {
        let root = tempfile::tempdir().unwrap();
        std::fs::write(root.path().join("f"), b"x").unwrap();
        assert!(create_dir_all(&root.path().join("f/g")).is_err());
        assert!(create_dir_all(&root.path().join("f")).is_err());
    }

    // replace_file leaves the new contents and no temporary file; a failure names its step.
    #[test]
    fn replace_file_replaces_and_cleans_up() {
        let root = tempfile::tempdir().unwrap();
        let target = root.path().join("x.json");
        let tmp = root.path().join("x.json.tmp");
        replace_file(&target, &tmp, b"one").unwrap();
        replace_file(&target, &tmp, b"two").unwrap();
        assert_eq!(std::fs::read(&target).unwrap(), b"two");
        assert!(!tmp.exists());
        let e = replace_file(
            &root.path().join("missing/x"),
            &root.path().join("missing/t"),
            b"",
        )
        .unwrap_err();
        assert_eq!(e.op, "creating");
    }
}
