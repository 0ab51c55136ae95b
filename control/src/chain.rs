//! Compare-and-swap on a shared directory without a lock: a record's successive versions are
//! separate files `<stem>.<seq>.json`, each created exactly once.
//!
//! Runs on tokio's blocking pool of the control thread (callers wrap it in `spawn_blocking`).
//! Used by the `file` Lease ([`crate::lease::file`]) and by `assignment.json`
//! ([`crate::assignment`]).
//!
//! # Why not a lock
//!
//! A writer frozen (SIGSTOP, a stalled VM) while holding a lock keeps it, and nobody can write
//! until it resumes or dies: one paused broker would stop the Lease election, or a new
//! controller's first assignment, for as long as the pause lasts. Breaking such a lock after a
//! timeout is worse — the frozen writer resumes and writes what it computed from a version that
//! is no longer current. So no write here waits for anyone.
//!
//! # Why the compare-and-swap is atomic
//!
//! A writer that read version `n` writes its record to a private temporary file, fsyncs it and
//! `link()`s it to `<stem>.<n+1>.json`. `link` fails with `EEXIST` when the name exists, on
//! local filesystems and on NFS alike (the classic NFS lock-file technique), so of all writers
//! that read version `n` exactly one creates version `n+1`; the others get
//! [`AppendError::Conflict`]. A version is never written twice and never overwritten.
//!
//! Old versions are removed ([`KEEP`] stay), and a writer frozen long enough could re-create a
//! removed name. So after linking, the writer lists the directory again: if any version above
//! its own exists, its record is not the newest — it removes it and reports a conflict. Versions
//! are removed only below the newest, which exists before the removal, so that check always sees
//! it. Readers take the highest version; a resurrected low version is never the highest.
//!
//! # The mirror
//!
//! After each write, `<stem>.json` is replaced (by rename) with a copy of the new record, for
//! operators, scripts and tests that read one well-known file. It is informational: a writer
//! frozen between its link and its rename can leave an older copy there for a moment, so
//! nothing in kaas decides from it — except when no versioned file exists yet, where it is the
//! record written by an older kaas, the chain's starting point (see [`Chain::read_head`]).
//!
//! Every read reopens files and relists the directory: NFS guarantees a fresh view only on
//! `open()` (close-to-open consistency).

use std::fs::{self, File, OpenOptions};
use std::io::{self, ErrorKind, Read, Write};
use std::path::{Path, PathBuf};

/// How many versions stay on disk: enough for an operator to see the last few writes.
pub const KEEP: u64 = 8;

/// One record's versions in one directory.
#[derive(Debug, Clone)]
pub struct Chain {
    dir: PathBuf,
    stem: &'static str,
}

/// The newest version and its bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The version: `n` for `<stem>.<n>.json`; for a record found only in the mirror (written
    /// by an older kaas), what `legacy_seq` read from it.
    pub seq: u64,
    /// The record.
    pub bytes: Vec<u8>,
}

/// Why an [`Chain::append`] did not write.
#[derive(Debug, thiserror::Error)]
pub enum AppendError {
    /// Someone else wrote the version after the base (or a later one): re-read and decide again.
    #[error("a newer version was written by someone else")]
    Conflict,
    /// The directory or the files could not be used.
    #[error(transparent)]
    Io(#[from] io::Error),
}

impl Chain {
    /// The versions of `<dir>/<stem>.json`. Nothing is touched until the first read or write.
    pub fn new(dir: impl Into<PathBuf>, stem: &'static str) -> Self {
        Self {
            dir: dir.into(),
            stem,
        }
    }

    /// `<stem>.json`, the informational copy of the newest version.
    pub fn mirror_path(&self) -> PathBuf {
        self.dir.join(format!("{}.json", self.stem))
    }

    /// `<stem>.<seq>.json`.
    pub fn entry_path(&self, seq: u64) -> PathBuf {
        self.dir.join(format!("{}.{seq}.json", self.stem))
    }

    /// The versions on disk now, ascending.
    pub fn versions(&self) -> io::Result<Vec<u64>> {
        let prefix = format!("{}.", self.stem);
        let mut out = Vec::new();
        let entries = match fs::read_dir(&self.dir) {
            Ok(e) => e,
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(out),
            Err(e) => return Err(e),
        };
        for entry in entries {
            let name = entry?.file_name();
            let Some(name) = name.to_str() else { continue };
            let seq = name
                .strip_prefix(&prefix)
                .and_then(|rest| rest.strip_suffix(".json"))
                .filter(|digits| !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()))
                .and_then(|digits| digits.parse::<u64>().ok());
            out.extend(seq);
        }
        out.sort_unstable();
        Ok(out)
    }

    /// The newest version, or — when there is none yet — the mirror left by an older kaas, its
    /// version read by `legacy_seq` (`None`: the mirror is not a usable record). `Ok(None)`
    /// when nothing was ever written.
    pub fn read_head(
        &self,
        legacy_seq: impl Fn(&[u8]) -> Option<u64>,
    ) -> io::Result<Option<Entry>> {
        // A newer writer can remove the version we listed (it keeps KEEP), so a vanished file
        // means "list again", a bounded number of times.
        for _ in 0..8 {
            let Some(&seq) = self.versions()?.last() else {
                return Ok(read_optional(&self.mirror_path())?
                    .and_then(|bytes| legacy_seq(&bytes).map(|seq| Entry { seq, bytes })));
            };
            if let Some(bytes) = read_optional(&self.entry_path(seq))? {
                return Ok(Some(Entry { seq, bytes }));
            }
        }
        Err(io::Error::other(format!(
            "{}: versions keep disappearing while being read",
            self.dir.display()
        )))
    }

    /// Writes `bytes` as the version after `base`, the `seq` of the head it was decided from
    /// (`None`: nothing was read, the first version). Returns the new version.
    /// Durable when it returns: the file and the directory entry are fsynced.
    pub fn append(&self, base: Option<u64>, bytes: &[u8]) -> Result<u64, AppendError> {
        kaas_durable::create_dir_all(&self.dir)?;
        let seq = base.map_or(1, |b| b + 1);
        // Unique across brokers, which share the volume and are each process 1 of their
        // container: a deposed controller may still be writing its own.
        let tmp = self.dir.join(format!(
            ".{}.{}.tmp",
            self.stem,
            kaas_durable::unique_suffix()
        ));
        let linked = (|| {
            let mut f = OpenOptions::new().write(true).create_new(true).open(&tmp)?;
            f.write_all(bytes)?;
            f.sync_all()?;
            fs::hard_link(&tmp, self.entry_path(seq))
        })();
        let _ = fs::remove_file(&tmp);
        match linked {
            Ok(()) => {}
            Err(e) if e.kind() == ErrorKind::AlreadyExists => return Err(AppendError::Conflict),
            Err(e) => return Err(e.into()),
        }
        kaas_durable::sync_dir(&self.dir)?;
        let versions = self.versions()?;
        let newest = versions.last().copied().unwrap_or(seq);
        if newest > seq {
            // We re-created a removed old name after a long freeze: not the newest, not ours.
            let _ = fs::remove_file(self.entry_path(seq));
            return Err(AppendError::Conflict);
        }
        debug_assert_eq!(newest, seq, "the version just linked is listed");
        for old in versions.into_iter().filter(|v| v + KEEP <= seq) {
            let _ = fs::remove_file(self.entry_path(old));
        }
        // Informational (see the module docs), so a failure costs a warning, not the write.
        if let Err(e) = self.mirror(bytes) {
            tracing::warn!(path = %self.mirror_path().display(), "cannot update the copy of the newest version: {e}");
        }
        Ok(seq)
    }

    /// Replaces the mirror with `bytes` (rename, no fsync: it is only a copy).
    pub fn mirror(&self, bytes: &[u8]) -> io::Result<()> {
        let tmp = self.dir.join(format!(
            ".{}.json.{}.tmp",
            self.stem,
            kaas_durable::unique_suffix()
        ));
        let result = fs::write(&tmp, bytes).and_then(|()| fs::rename(&tmp, self.mirror_path()));
        if result.is_err() {
            let _ = fs::remove_file(&tmp);
        }
        result
    }
}

/// A file's bytes through a fresh `open()`; `None` if it does not exist.
pub fn read_optional(path: &Path) -> io::Result<Option<Vec<u8>>> {
    let mut file = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes)?;
    Ok(Some(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn no_legacy(_: &[u8]) -> Option<u64> {
        None
    }

    /// Two controllers building on the same version must not both win: the second append conflicts.
    #[test]
    fn versions_count_up_and_a_stale_base_conflicts() {
        let dir = tempfile::tempdir().unwrap();
        let chain = Chain::new(dir.path(), "rec");
        assert_eq!(chain.read_head(no_legacy).unwrap(), None);
        assert_eq!(chain.append(None, b"a").unwrap(), 1);
        assert!(matches!(
            chain.append(None, b"x"),
            Err(AppendError::Conflict)
        ));
        assert_eq!(chain.append(Some(1), b"b").unwrap(), 2);
        assert!(matches!(
            chain.append(Some(1), b"x"),
            Err(AppendError::Conflict)
        ));
        let head = chain.read_head(no_legacy).unwrap().unwrap();
        assert_eq!((head.seq, head.bytes.as_slice()), (2, &b"b"[..]));
        assert_eq!(fs::read(chain.mirror_path()).unwrap(), b"b");
    }

    /// A controller paused past cleanup must not write a version that reuses a cleaned-up number.
    #[test]
    fn a_writer_frozen_past_the_cleanup_cannot_resurrect_its_version() {
        let dir = tempfile::tempdir().unwrap();
        let chain = Chain::new(dir.path(), "rec");
        let mut seq = chain.append(None, b"0").unwrap();
        // A writer reads version 1 and freezes; others write KEEP + 4 more versions.
        let frozen_base = seq;
        for i in 0..KEEP + 4 {
            seq = chain.append(Some(seq), i.to_string().as_bytes()).unwrap();
        }
        assert!(
            !chain.entry_path(frozen_base + 1).exists(),
            "version 2 was cleaned up"
        );
        // It wakes and links version 2 — a name that no longer exists.
        assert!(matches!(
            chain.append(Some(frozen_base), b"stale"),
            Err(AppendError::Conflict)
        ));
        assert!(!chain.entry_path(frozen_base + 1).exists());
        assert_eq!(chain.read_head(no_legacy).unwrap().unwrap().seq, seq);
        assert_eq!(chain.versions().unwrap().len() as u64, KEEP);
    }

    /// Upgrades: a data directory written by an older kaas continues from its version, not from 1.
    #[test]
    fn an_older_kaas_mirror_is_the_starting_point() {
        let dir = tempfile::tempdir().unwrap();
        let chain = Chain::new(dir.path(), "rec");
        fs::write(chain.mirror_path(), b"41").unwrap();
        let legacy = |b: &[u8]| std::str::from_utf8(b).ok()?.parse().ok();
        let head = chain.read_head(legacy).unwrap().unwrap();
        assert_eq!(head.seq, 41);
        assert_eq!(chain.append(Some(41), b"42").unwrap(), 42);
        assert_eq!(chain.read_head(legacy).unwrap().unwrap().seq, 42);
    }

    /// The compare-and-swap holds under real threads racing: exactly one writer per base wins.
    #[test]
    fn concurrent_writers_from_one_base_have_one_winner() {
        let dir = tempfile::tempdir().unwrap();
        let chain = Chain::new(dir.path(), "rec");
        let base = chain.append(None, b"base").unwrap();
        for round in 0..20u64 {
            let wins: usize = std::thread::scope(|s| {
                let handles: Vec<_> = (0..6)
                    .map(|w| {
                        let chain = chain.clone();
                        s.spawn(move || chain.append(Some(base + round), &[w]).is_ok())
                    })
                    .collect();
                handles
                    .into_iter()
                    .map(|h| usize::from(h.join().unwrap()))
                    .sum()
            });
            assert_eq!(wins, 1, "round {round}");
        }
    }
}
