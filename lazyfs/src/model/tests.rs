//! Unit tests of `model.rs`, kept beside it so the state machine reads on its own.

use super::*;

fn name(s: &str) -> &OsStr {
    OsStr::new(s)
}

/// A power cut: drop the daemon's memory and load what the backing directory holds.
fn cut(fs: Fs) -> Fs {
    let backing = fs.backing.clone();
    drop(fs);
    Fs::load(&backing).unwrap()
}

fn contents(fs: &mut Fs, parent: u64, n: &str) -> Option<Vec<u8>> {
    let a = fs.lookup(parent, name(n)).ok()?;
    Some(fs.read(a.ino, 0, u32::MAX).unwrap())
}

fn new_fs() -> (tempfile::TempDir, Fs) {
    let dir = tempfile::tempdir().unwrap();
    let fs = Fs::load(dir.path()).unwrap();
    (dir, fs)
}

#[test]
fn unsynced_file_and_name_are_lost() {
    // Nothing synced, nothing kept: the simulated cut really drops volatile state.
    let (_d, mut fs) = new_fs();
    let a = fs.create(ROOT, name("a"), 0o644).unwrap();
    fs.write(a.ino, 0, b"hello").unwrap();
    let mut fs = cut(fs);
    assert_eq!(contents(&mut fs, ROOT, "a"), None);
}

#[test]
fn file_fsync_without_dir_fsync_loses_the_name() {
    // fsync of a file does not make its directory entry durable.
    let (_d, mut fs) = new_fs();
    let a = fs.create(ROOT, name("a"), 0o644).unwrap();
    fs.write(a.ino, 0, b"hello").unwrap();
    fs.fsync_file(a.ino).unwrap();
    let mut fs = cut(fs);
    assert_eq!(contents(&mut fs, ROOT, "a"), None);
    // ... and its orphaned data is collected, so a reused inode number cannot see it.
    assert!(!data_path(&fs.backing, a.ino).exists());
}

#[test]
fn dir_fsync_without_file_fsync_keeps_an_empty_file() {
    // A durable name pointing at unsynced contents comes back empty, as on a real disk.
    let (_d, mut fs) = new_fs();
    let a = fs.create(ROOT, name("a"), 0o644).unwrap();
    fs.write(a.ino, 0, b"hello").unwrap();
    fs.fsync_dir(ROOT).unwrap();
    let mut fs = cut(fs);
    assert_eq!(contents(&mut fs, ROOT, "a"), Some(Vec::new()));
}

#[test]
fn both_synced_survives_and_later_writes_do_not() {
    // Only what the last fsync covered survives; writes and truncations after it vanish.
    let (_d, mut fs) = new_fs();
    let a = fs.create(ROOT, name("a"), 0o644).unwrap();
    fs.write(a.ino, 0, &vec![7u8; 10_000]).unwrap();
    fs.fsync_file(a.ino).unwrap();
    fs.fsync_dir(ROOT).unwrap();
    fs.write(a.ino, 5_000, b"later").unwrap();
    fs.write(a.ino, 20_000, b"past the end").unwrap();
    fs.truncate(a.ino, 100).unwrap();
    assert_eq!(fs.attr(a.ino).unwrap().size, 100);
    let mut fs = cut(fs);
    assert_eq!(contents(&mut fs, ROOT, "a"), Some(vec![7u8; 10_000]));
}

#[test]
fn truncate_then_extend_reads_zeros_and_syncs_them() {
    // A shrink hides durable bytes; growing again must show zeros, before and after sync.
    let (_d, mut fs) = new_fs();
    let a = fs.create(ROOT, name("a"), 0o644).unwrap();
    fs.write(a.ino, 0, &vec![1u8; 9000]).unwrap();
    fs.fsync_file(a.ino).unwrap();
    fs.fsync_dir(ROOT).unwrap();
    fs.truncate(a.ino, 10).unwrap();
    fs.truncate(a.ino, 9000).unwrap();
    let mut want = vec![1u8; 10];
    want.resize(9000, 0);
    assert_eq!(fs.read(a.ino, 0, 9000).unwrap(), want);
    fs.fsync_file(a.ino).unwrap();
    let mut fs = cut(fs);
    assert_eq!(contents(&mut fs, ROOT, "a"), Some(want));
}

#[test]
fn rename_is_durable_only_after_both_directories_sync() {
    // tmp + fsync + rename needs the directory fsync; before it the old name is what survives.
    let (_d, mut fs) = new_fs();
    let old = fs.create(ROOT, name("m"), 0o644).unwrap();
    fs.write(old.ino, 0, b"v1").unwrap();
    fs.fsync_file(old.ino).unwrap();
    fs.fsync_dir(ROOT).unwrap();
    let tmp = fs.create(ROOT, name("m.tmp"), 0o644).unwrap();
    fs.write(tmp.ino, 0, b"v2").unwrap();
    fs.fsync_file(tmp.ino).unwrap();
    fs.rename(ROOT, name("m.tmp"), ROOT, name("m"), false)
        .unwrap();
    assert_eq!(contents(&mut fs, ROOT, "m"), Some(b"v2".to_vec()));
    let mut fs = cut(fs);
    assert_eq!(contents(&mut fs, ROOT, "m"), Some(b"v1".to_vec()));
    let tmp = fs.create(ROOT, name("m.tmp"), 0o644).unwrap();
    fs.write(tmp.ino, 0, b"v3").unwrap();
    fs.fsync_file(tmp.ino).unwrap();
    fs.rename(ROOT, name("m.tmp"), ROOT, name("m"), false)
        .unwrap();
    fs.fsync_dir(ROOT).unwrap();
    let mut fs = cut(fs);
    assert_eq!(contents(&mut fs, ROOT, "m"), Some(b"v3".to_vec()));
    assert_eq!(contents(&mut fs, ROOT, "m.tmp"), None);
}

#[test]
fn link_refuses_an_existing_name_and_survives_a_dir_sync() {
    // kaas's version chains compare-and-swap with link(2): EEXIST must hold, durably.
    let (_d, mut fs) = new_fs();
    let t = fs.create(ROOT, name("t"), 0o644).unwrap();
    fs.write(t.ino, 0, b"epoch 1").unwrap();
    fs.fsync_file(t.ino).unwrap();
    fs.link(t.ino, ROOT, name("v1")).unwrap();
    assert_eq!(fs.link(t.ino, ROOT, name("v1")).unwrap_err(), libc::EEXIST);
    fs.unlink(ROOT, name("t")).unwrap();
    assert_eq!(fs.attr(t.ino).unwrap().nlink, 1);
    fs.fsync_dir(ROOT).unwrap();
    let mut fs = cut(fs);
    assert_eq!(contents(&mut fs, ROOT, "v1"), Some(b"epoch 1".to_vec()));
    assert_eq!(contents(&mut fs, ROOT, "t"), None);
    let v1 = fs.lookup(ROOT, name("v1")).unwrap();
    assert_eq!(fs.link(v1.ino, ROOT, name("v1")).unwrap_err(), libc::EEXIST);
}

#[test]
fn unsynced_unlink_and_mkdir_are_undone() {
    // Removals are volatile too: a durable file unlinked without a dir fsync comes back.
    let (_d, mut fs) = new_fs();
    let a = fs.create(ROOT, name("a"), 0o644).unwrap();
    fs.write(a.ino, 0, b"kept").unwrap();
    fs.fsync_file(a.ino).unwrap();
    fs.fsync_dir(ROOT).unwrap();
    fs.unlink(ROOT, name("a")).unwrap();
    fs.mkdir(ROOT, name("d"), 0o755).unwrap();
    let mut fs = cut(fs);
    assert_eq!(contents(&mut fs, ROOT, "a"), Some(b"kept".to_vec()));
    assert!(fs.lookup(ROOT, name("d")).is_err());
}

#[test]
fn new_directory_needs_its_parent_synced() {
    // mkdir -p then a synced file inside: lost unless every new directory's parent synced.
    let (_d, mut fs) = new_fs();
    let d = fs.mkdir(ROOT, name("d"), 0o755).unwrap();
    let f = fs.create(d.ino, name("f"), 0o644).unwrap();
    fs.write(f.ino, 0, b"x").unwrap();
    fs.fsync_file(f.ino).unwrap();
    fs.fsync_dir(d.ino).unwrap();
    let mut fs = cut(fs);
    assert!(fs.lookup(ROOT, name("d")).is_err());
    let d = fs.mkdir(ROOT, name("d"), 0o755).unwrap();
    let f = fs.create(d.ino, name("f"), 0o644).unwrap();
    fs.write(f.ino, 0, b"x").unwrap();
    fs.fsync_file(f.ino).unwrap();
    fs.fsync_dir(d.ino).unwrap();
    fs.fsync_dir(ROOT).unwrap();
    let mut fs = cut(fs);
    let d = fs.lookup(ROOT, name("d")).unwrap();
    assert_eq!(contents(&mut fs, d.ino, "f"), Some(b"x".to_vec()));
}

#[test]
fn open_unlinked_file_stays_readable() {
    // Retention unlinks segments that fetches still read through an open handle.
    let (_d, mut fs) = new_fs();
    let a = fs.create(ROOT, name("a"), 0o644).unwrap();
    fs.open(a.ino).unwrap();
    fs.write(a.ino, 0, b"data").unwrap();
    fs.unlink(ROOT, name("a")).unwrap();
    assert_eq!(fs.read(a.ino, 0, 10).unwrap(), b"data");
    fs.release(a.ino);
    assert_eq!(fs.attr(a.ino).unwrap_err(), libc::ENOENT);
}

#[test]
fn sync_all_makes_everything_durable() {
    // What a syncfs would do if FUSE forwarded it.
    let (_d, mut fs) = new_fs();
    let d = fs.mkdir(ROOT, name("d"), 0o755).unwrap();
    let f = fs.create(d.ino, name("f"), 0o644).unwrap();
    fs.write(f.ino, 3, b"x").unwrap();
    fs.sync_all().unwrap();
    let mut fs = cut(fs);
    let d = fs.lookup(ROOT, name("d")).unwrap();
    assert_eq!(contents(&mut fs, d.ino, "f"), Some(b"\0\0\0x".to_vec()));
}

#[test]
fn rename_replaces_and_checks_kinds() {
    // rename(2)'s replace rules, which manifests and compaction (rename over a segment) use.
    let (_d, mut fs) = new_fs();
    fs.create(ROOT, name("a"), 0o644).unwrap();
    let b = fs.create(ROOT, name("b"), 0o644).unwrap();
    fs.mkdir(ROOT, name("d"), 0o755).unwrap();
    assert_eq!(
        fs.rename(ROOT, name("a"), ROOT, name("d"), false),
        Err(libc::EISDIR)
    );
    assert_eq!(
        fs.rename(ROOT, name("a"), ROOT, name("b"), true),
        Err(libc::EEXIST)
    );
    fs.rename(ROOT, name("a"), ROOT, name("b"), false).unwrap();
    assert_eq!(fs.attr(b.ino).unwrap_err(), libc::ENOENT);
    let names: Vec<_> = fs.list(ROOT).unwrap().into_iter().map(|e| e.0).collect();
    assert_eq!(names, vec![OsString::from("b"), OsString::from("d")]);
}
