//! Entries that are never delivered.

use super::*;

/// Undoes [`escape_name`].
fn unescape(s: &str) -> Vec<u8> {
    let mut out = Vec::new();
    let b = s.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && b.get(i + 1) == Some(&b'\\') {
            out.push(b'\\');
            i += 2;
        } else if b[i] == b'\\' && b.get(i + 1) == Some(&b'x') {
            out.push(u8::from_str_radix(&s[i + 2..i + 4], 16).expect("hex"));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    out
}

#[test]
fn escaped_names_are_lossless() {
    for name in [
        &b"plain.json"[..],
        b"caf\xc3\xa9.json",
        b"\xff\xfe.json",
        b"back\\slash\\x41.json",
        b"\\xff\xff",
        b"\xe2\x82",
    ] {
        let e = escape_name(name);
        assert_eq!(unescape(&e), name, "{e}");
    }
    assert_eq!(escape_name(b"a\xffb\\"), "a\\xffb\\\\");
}

#[test]
fn a_name_that_is_not_utf8_is_parked_under_its_escape() {
    let f = fixture();
    let raw = OsStr::from_bytes(b"sig\xff\\.json");
    fs::write(f.dir.join(raw), b"{}").expect("write");
    let long: Vec<u8> = std::iter::repeat_n(0xfeu8, 120).collect();
    fs::write(f.dir.join(OsStr::from_bytes(&long)), b"{}").expect("write");
    // A writer's temporaries, even with such names, are left alone.
    fs::write(f.dir.join(OsStr::from_bytes(b"t\xff.tmp")), b"{").expect("write");
    fs::write(f.dir.join(OsStr::from_bytes(b".\xffdot")), b"{").expect("write");
    assert_eq!(f.spool.list().expect("list"), Vec::<String>::new());
    let parked = f.dir.join("bad/sig\\xff\\\\.json");
    assert_eq!(fs::read(&parked).expect("parked under its escape"), b"{}");
    let reason = fs::read_to_string(f.dir.join("bad/sig\\xff\\\\.json.reason")).expect("reason");
    assert!(
        reason.contains("not UTF-8") && reason.contains("sig\\xff\\\\.json"),
        "{reason}"
    );
    // The long one: cut in its parked name, whole in its reason.
    let escaped = escape_name(&long);
    let cut = &escaped[..MAX_PARKED_NAME];
    assert!(f.dir.join("bad").join(cut).is_file());
    let reason =
        fs::read_to_string(f.dir.join("bad").join(format!("{cut}.reason"))).expect("reason");
    assert!(reason.contains(&escaped), "{reason}");
    assert!(f.dir.join(OsStr::from_bytes(b"t\xff.tmp")).exists());
    assert!(f.dir.join(OsStr::from_bytes(b".\xffdot")).exists());
    assert_eq!(f.spool.counts().expect("counts").bad, 2);
}

#[test]
fn temporaries_and_the_lock_are_never_touched() {
    let f = fixture();
    f.spool.claim(&hub()).expect("claim");
    for name in [".x.json", "x.json.tmp", ".hidden"] {
        fs::write(f.dir.join(name), b"{").expect("write");
    }
    fs::create_dir(f.dir.join(".dotdir.json")).expect("mkdir");
    for _ in 0..2 {
        assert_eq!(f.spool.list().expect("list"), Vec::<String>::new());
    }
    for name in [
        LOCK_FILE,
        ".x.json",
        "x.json.tmp",
        ".hidden",
        ".dotdir.json",
    ] {
        assert!(f.dir.join(name).exists(), "{name} left alone");
    }
    assert_eq!(f.spool.counts().expect("counts").bad, 0);
}

/// A `MakeWriter` that keeps what the subscriber writes.
#[derive(Clone, Default)]
struct Captured(Arc<std::sync::Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("lock").extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Captured {
    type Writer = Captured;
    fn make_writer(&'a self) -> Captured {
        self.clone()
    }
}

#[test]
fn other_odd_names_are_logged_once_per_process() {
    let f = fixture();
    fs::write(f.dir.join("notes.txt"), b"x").expect("write");
    fs::create_dir(f.dir.join("subdir")).expect("mkdir");
    let out = Captured::default();
    let sub = tracing_subscriber::fmt()
        .with_writer(out.clone())
        .with_ansi(false)
        .finish();
    tracing::subscriber::with_default(sub, || {
        for _ in 0..3 {
            assert_eq!(f.spool.list().expect("list"), Vec::<String>::new());
        }
    });
    let text = String::from_utf8(out.0.lock().expect("lock").clone()).expect("utf8");
    assert_eq!(text.matches("notes.txt").count(), 1, "{text}");
    assert_eq!(text.matches("subdir").count(), 1, "{text}");
    assert!(
        !text.contains("name=bad"),
        "bad/ itself is no odd name:\n{text}"
    );
    assert!(f.dir.join("notes.txt").exists() && f.dir.join("subdir").is_dir());
    assert_eq!(f.spool.counts().expect("counts").bad, 0);
}
