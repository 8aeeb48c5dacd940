use std::io::Read;
use std::os::unix::fs::MetadataExt;

use super::*;

fn payload(files: &[(&str, &str)]) -> Payload {
    files
        .iter()
        .map(|(path, text)| (path.to_string(), FileProjection::new(*text, 0o644)))
        .collect()
}

fn link(dir: &Path, name: &str) -> Option<PathBuf> {
    std::fs::read_link(dir.join(name)).ok()
}

fn read(dir: &Path, path: &str) -> String {
    std::fs::read_to_string(dir.join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// Names in `dir` that start with `..` and are directories (the timestamped ones).
fn data_dirs(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .expect("list")
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(".."))
        .collect();
    names.sort();
    names
}

fn written(outcome: Outcome) -> String {
    match outcome {
        Outcome::Written { data_dir } => data_dir,
        Outcome::Unchanged => panic!("expected a write"),
    }
}

#[test]
fn first_write_lays_out_the_kubelets_layout() {
    let volume = tempfile::tempdir().expect("tempdir");
    let writer = AtomicWriter::new(volume.path()).expect("writer");
    let mut files = payload(&[("hosts", "10.96.0.20 api\n")]);
    files.insert("nested/dir/key".into(), FileProjection::new("v", 0o600));
    let data_dir = written(writer.write(&files).expect("write"));

    // `..2026_12_04_13_45_57.<n>`: the time in UTC, as MkdirTemp's pattern in the kubelet.
    let stamp = data_dir.strip_prefix("..").expect("leading ..");
    let (time, suffix) = stamp.rsplit_once('.').expect("a suffix");
    assert_eq!(time.len(), "2026_12_04_13_45_57".len(), "{data_dir}");
    assert!(
        time.split('_')
            .all(|p| p.chars().all(|c| c.is_ascii_digit()))
    );
    assert!(!suffix.is_empty() && suffix.chars().all(|c| c.is_ascii_digit()));
    assert_eq!(data_dirs(volume.path()), vec![data_dir.clone()]);
    let mode = std::fs::metadata(volume.path().join(&data_dir))
        .expect("data dir")
        .mode();
    assert_eq!(mode & 0o777, 0o755);

    assert_eq!(
        link(volume.path(), DATA_DIR),
        Some(PathBuf::from(&data_dir))
    );
    assert_eq!(
        link(volume.path(), "hosts"),
        Some(PathBuf::from("..data/hosts"))
    );
    // Nested paths: one link for the top-level directory only.
    assert_eq!(
        link(volume.path(), "nested"),
        Some(PathBuf::from("..data/nested"))
    );
    assert_eq!(read(volume.path(), "hosts"), "10.96.0.20 api\n");
    assert_eq!(read(volume.path(), "nested/dir/key"), "v");
    let key_mode = std::fs::metadata(volume.path().join("nested/dir/key"))
        .expect("key")
        .mode();
    assert_eq!(key_mode & 0o7777, 0o600);
    assert_eq!(
        writer.current_data_dir().expect("current"),
        Some(data_dir.clone())
    );
    assert!(link(volume.path(), NEW_DATA_DIR).is_none());
}

#[test]
fn an_update_swaps_data_and_removes_the_previous_directory() {
    let volume = tempfile::tempdir().expect("tempdir");
    let writer = AtomicWriter::new(volume.path()).expect("writer");
    let first = written(writer.write(&payload(&[("records", "[1]")])).expect("v1"));
    // A reader that opened the file before the update keeps the old contents (its inode).
    let mut open_before = std::fs::File::open(volume.path().join("records")).expect("open");
    let inode_before = std::fs::metadata(volume.path().join("records"))
        .expect("meta")
        .ino();

    let second = written(writer.write(&payload(&[("records", "[2]")])).expect("v2"));
    assert_ne!(first, second);
    assert_eq!(
        data_dirs(volume.path()),
        vec![second.clone()],
        "old dir gone"
    );
    assert_eq!(link(volume.path(), DATA_DIR), Some(PathBuf::from(&second)));
    assert_eq!(
        link(volume.path(), "records"),
        Some(PathBuf::from("..data/records")),
        "the visible link itself is not replaced"
    );
    assert_eq!(read(volume.path(), "records"), "[2]");
    let inode_after = std::fs::metadata(volume.path().join("records"))
        .expect("meta")
        .ino();
    assert_ne!(inode_before, inode_after, "a new file, not a rewrite");
    let mut old = String::new();
    open_before.read_to_string(&mut old).expect("read old");
    assert_eq!(old, "[1]");
}

#[test]
fn an_unchanged_payload_writes_nothing() {
    let volume = tempfile::tempdir().expect("tempdir");
    let writer = AtomicWriter::new(volume.path()).expect("writer");
    let files = payload(&[("a", "1"), ("b", "2")]);
    let first = written(writer.write(&files).expect("first"));
    assert_eq!(writer.write(&files).expect("again"), Outcome::Unchanged);
    // A mode change alone is no change (as in the kubelet).
    let mut chmod = files.clone();
    chmod.get_mut("a").expect("a").mode = 0o600;
    assert_eq!(writer.write(&chmod).expect("chmod"), Outcome::Unchanged);
    assert_eq!(data_dirs(volume.path()), vec![first]);
}

#[test]
fn a_removed_key_loses_its_link() {
    let volume = tempfile::tempdir().expect("tempdir");
    let writer = AtomicWriter::new(volume.path()).expect("writer");
    let mut files = payload(&[("keep", "same"), ("gone", "x")]);
    files.insert("tree/leaf".into(), FileProjection::new("y", 0o644));
    written(writer.write(&files).expect("v1"));
    // Only a key leaves (the others are unchanged): still a new data directory.
    let second = written(writer.write(&payload(&[("keep", "same")])).expect("v2"));
    assert_eq!(data_dirs(volume.path()), vec![second]);
    assert!(
        link(volume.path(), "gone").is_none(),
        "link of the removed key"
    );
    assert!(
        link(volume.path(), "tree").is_none(),
        "link of the removed tree"
    );
    assert!(!volume.path().join("gone").exists());
    assert_eq!(read(volume.path(), "keep"), "same");
    // And back: the link is created again.
    written(
        writer
            .write(&payload(&[("keep", "same"), ("gone", "z")]))
            .expect("v3"),
    );
    assert_eq!(read(volume.path(), "gone"), "z");
}

#[test]
fn an_empty_payload_is_an_empty_volume() {
    // An optional ConfigMap that does not exist (or whose listed keys are all missing).
    let volume = tempfile::tempdir().expect("tempdir");
    let writer = AtomicWriter::new(volume.path()).expect("writer");
    let empty = written(writer.write(&Payload::new()).expect("empty"));
    assert_eq!(link(volume.path(), DATA_DIR), Some(PathBuf::from(&empty)));
    let visible: Vec<_> = std::fs::read_dir(volume.path())
        .expect("list")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| !n.starts_with(".."))
        .collect();
    assert!(visible.is_empty(), "{visible:?}");
    assert_eq!(
        writer.write(&Payload::new()).expect("again"),
        Outcome::Unchanged
    );
    written(writer.write(&payload(&[("hosts", "h")])).expect("created"));
    assert_eq!(read(volume.path(), "hosts"), "h");
    written(writer.write(&Payload::new()).expect("deleted again"));
    assert!(link(volume.path(), "hosts").is_none());
}

#[test]
fn entries_that_are_not_ours_are_left_alone() {
    let volume = tempfile::tempdir().expect("tempdir");
    // A mount point a container runtime created inside the volume, and a plain file.
    std::fs::create_dir(volume.path().join("custom")).expect("dir");
    std::fs::write(volume.path().join("plain"), "mine").expect("file");
    let writer = AtomicWriter::new(volume.path()).expect("writer");
    written(writer.write(&payload(&[("a", "1")])).expect("v1"));
    written(
        writer
            .write(&payload(&[("a", "2"), ("plain", "theirs")]))
            .expect("v2"),
    );
    assert!(volume.path().join("custom").is_dir());
    assert_eq!(
        read(volume.path(), "plain"),
        "mine",
        "not replaced by a link"
    );
    written(writer.write(&payload(&[("a", "3")])).expect("v3"));
    assert!(volume.path().join("custom").is_dir());
}

#[test]
fn a_link_left_by_an_interrupted_write_is_replaced() {
    let volume = tempfile::tempdir().expect("tempdir");
    symlink("..nowhere", volume.path().join(NEW_DATA_DIR)).expect("stale link");
    let writer = AtomicWriter::new(volume.path()).expect("writer");
    let dir = written(writer.write(&payload(&[("a", "1")])).expect("write"));
    assert_eq!(link(volume.path(), DATA_DIR), Some(PathBuf::from(dir)));
    assert!(link(volume.path(), NEW_DATA_DIR).is_none());
}

#[test]
fn paths_are_validated_and_normalized() {
    for bad in [
        "",
        "/etc/passwd",
        "a/../b",
        "..",
        "..data",
        "..x/y",
        "./..data",
        ".",
        &"n".repeat(256),
    ] {
        assert!(
            clean_path(bad).is_err(),
            "{bad:?} accepted as {:?}",
            clean_path(bad)
        );
    }
    assert_eq!(clean_path("a//b/./c").expect("clean"), "a/b/c");
    assert_eq!(clean_path("..").ok(), None);
    let volume = tempfile::tempdir().expect("tempdir");
    let writer = AtomicWriter::new(volume.path()).expect("writer");
    let refused = writer.write(&payload(&[("ok", "1"), ("../escape", "x")]));
    assert!(refused.is_err_and(|e| e.to_string().contains("'..'")));
    assert!(data_dirs(volume.path()).is_empty(), "nothing written");
}

#[test]
fn the_target_must_exist() {
    let volume = tempfile::tempdir().expect("tempdir");
    assert!(AtomicWriter::new(volume.path().join("missing")).is_err());
}
