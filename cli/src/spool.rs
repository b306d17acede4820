//! Writes one signal into the spool directory, durably and atomically, for the hub (or a
//! device agent) to collect: `<unix_nanos>-<pid>-<rand>.tmp` created exclusively with mode
//! 0600, fsynced, renamed to `.json`, and the directory fsynced. It never reads the spool.

use std::fs::DirBuilder;
use std::io;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use cortex_host::atomic::TempFile;

#[derive(Debug, thiserror::Error)]
#[error("cannot write the spool file in {dir}: {source}")]
pub struct SpoolError {
    pub dir: PathBuf,
    #[source]
    pub source: io::Error,
}

/// Writes `body` as a new file in `dir` (created with mode 0700 if missing) and returns the
/// final `.json` path.
pub fn write(dir: &Path, body: &[u8]) -> Result<PathBuf, SpoolError> {
    let err = |source| SpoolError {
        dir: dir.to_path_buf(),
        source,
    };
    DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(err)?;
    // A fresh name each time: the collector treats the name as the signal's identity.
    let mut attempts = 0;
    let file = loop {
        match TempFile::create_new(dir.join(format!("{}.tmp", file_stem())), 0o600) {
            Ok(f) => break f,
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists && attempts < 8 => attempts += 1,
            Err(e) => return Err(err(e)),
        }
    };
    let done = file.path().with_extension("json");
    file.commit(body, &done).map_err(err)?;
    Ok(done)
}

fn file_stem() -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!(
        "{nanos}-{}-{:08x}",
        std::process::id(),
        crate::random::u32()
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn writes_a_private_json_file_and_nothing_else() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path().join("home/tmp/signals");
        let a = write(&dir, br#"{"id":"wp_1"}"#).expect("spool");
        let b = write(&dir, br#"{"id":"wp_2"}"#).expect("spool");
        assert_ne!(a, b);
        assert_eq!(std::fs::read(&a).expect("read"), br#"{"id":"wp_1"}"#);
        let name = a.file_name().and_then(|n| n.to_str()).expect("name");
        let parts: Vec<&str> = name.trim_end_matches(".json").split('-').collect();
        assert_eq!(parts.len(), 3, "{name}");
        assert!(
            parts[0].parse::<u128>().is_ok() && parts[1] == std::process::id().to_string(),
            "{name}"
        );
        assert!(name.ends_with(".json"));
        let mode = |p: &Path| std::fs::metadata(p).expect("meta").permissions().mode() & 0o777;
        assert_eq!(mode(&a), 0o600);
        assert_eq!(mode(&dir), 0o700);
        let entries: Vec<_> = std::fs::read_dir(&dir).expect("ls").collect();
        assert_eq!(entries.len(), 2, "no .tmp left behind");
    }

    #[test]
    fn reports_an_unwritable_place() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let file = tmp.path().join("not-a-dir");
        std::fs::write(&file, b"x").expect("write");
        let e = write(&file.join("signals"), b"{}").expect_err("not a dir");
        assert!(e.to_string().contains("cannot write the spool file"), "{e}");
    }
}
