//! The WebDriver client (`cortex_tests::webdriver`) against a tiny page this test serves
//! itself on loopback: finding, clicking, typing, reading text and attributes, scripts,
//! the console log, window sizes, screenshots, the timing of a page's readiness, a form
//! answered 401 (its status, and the console error Chrome logs for it), a wait that runs
//! out (its message and screenshot), and nothing left running once dropped.
//! Skipped where chromium or chromedriver is missing, except under `CI=true`.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::panic::AssertUnwindSafe;
use std::time::Duration;

use cortex_tests::webdriver::{Browser, browser_or_skip, screenshot_dir};
use serde_json::json;

const T: Duration = Duration::from_secs(20);

const PAGE: &str = r#"<!doctype html>
<html><head><title>webdriver test</title><link rel="icon" href="data:,"></head>
<body>
<button data-test="btn" id="b">before</button>
<input name="token" type="password" id="i">
<p id="out"></p>
<script>
document.getElementById('b').addEventListener('click', (e) => {
  e.target.textContent = 'after';
  setTimeout(() => {
    const d = document.createElement('div');
    d.id = 'late';
    d.textContent = 'late';
    document.body.appendChild(d);
  }, 200);
});
document.getElementById('i').addEventListener('input', (e) => {
  document.getElementById('out').textContent = 'typed ' + e.target.value.length;
});
console.error('deliberate error for the log test');
</script>
</body></html>"#;

/// Sets `body[data-ready="1"]` 150 ms after its script runs.
const TIMED: &str = r#"<!doctype html>
<html><head><title>timed</title><link rel="icon" href="data:,"></head>
<body><script>
setTimeout(() => { document.body.dataset.ready = '1'; }, 150);
</script></body></html>"#;

/// A form (at `/form`) that posts to `/login`, which answers 401 with this form again.
const LOGIN: &str = r#"<!doctype html>
<html><head><title>login</title><link rel="icon" href="data:,"></head>
<body><form method="post" action="/login"><input name="token" type="password">
<button data-test="go">go</button></form></body></html>"#;

/// Serves `PAGE` at `/`, `TIMED` at `/timed`, `LOGIN` at `/form` (200) and `/login`
/// (401), and 404 elsewhere, one request per
/// connection, on a loopback port; returns its base URL. The thread lives as long as the
/// test process.
fn serve() -> String {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = l.local_addr().expect("addr");
    std::thread::spawn(move || {
        for conn in l.incoming() {
            let Ok(mut conn) = conn else { continue };
            let mut reader = BufReader::new(conn.try_clone().expect("clone"));
            let mut first = String::new();
            if reader.read_line(&mut first).is_err() {
                continue;
            }
            // The rest of the head, up to the blank line.
            loop {
                let mut line = String::new();
                match reader.read_line(&mut line) {
                    Ok(0) | Err(_) => break,
                    Ok(_) if line == "\r\n" || line == "\n" => break,
                    Ok(_) => {}
                }
            }
            let path = first.split_whitespace().nth(1).unwrap_or("/");
            let (status, body) = match path {
                "/" => ("200 OK", PAGE),
                "/timed" => ("200 OK", TIMED),
                "/form" => ("200 OK", LOGIN),
                "/login" => ("401 Unauthorized", LOGIN),
                _ => ("404 Not Found", "not here"),
            };
            let _ = write!(
                conn,
                "HTTP/1.1 {status}\r\nContent-Type: text/html; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    format!("http://{addr}")
}

/// The width and height in a PNG's header.
fn png_size(png: &[u8]) -> (u32, u32) {
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n", "not a PNG");
    let be = |b: &[u8]| u32::from_be_bytes([b[0], b[1], b[2], b[3]]);
    (be(&png[16..20]), be(&png[20..24]))
}

/// Processes whose process group is `pgid` (from `/proc/PID/stat`), zombies aside.
fn group_members(pgid: u32) -> Vec<String> {
    let mut found = Vec::new();
    for e in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else {
            continue;
        };
        // `pid (comm) state ppid pgrp …`: comm may hold spaces, so split after its `)`.
        let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else {
            continue;
        };
        let fields: Vec<&str> = rest.split_whitespace().collect();
        if fields.get(2) == Some(&pgid.to_string().as_str()) && fields.first() != Some(&"Z") {
            found.push(stat);
        }
    }
    found
}

#[test]
fn webdriver_drives_a_page_served_here() {
    let Some(b) = browser_or_skip("webdriver", 1280, 800) else {
        return;
    };
    let base = serve();
    let home = format!("{base}/");
    b.goto(&home);
    assert_eq!(b.url(), home);

    // Find, read, click: the text changes, and an element added later is waited for.
    let btn = b.wait_for("button[data-test=btn]", T);
    assert_eq!(b.text(&btn), "before");
    assert_eq!(b.attr(&btn, "id").as_deref(), Some("b"));
    assert_eq!(b.attr(&btn, "data-nothing"), None);
    assert!(b.find("#late").is_none());
    b.click(&btn);
    assert_eq!(b.wait_text("#b", T, |t| t == "after"), "after");
    assert_eq!(b.text(&b.wait_for("#late", T)), "late");
    assert_eq!(b.find_all("button, input").len(), 2);
    let body = b.find("body").expect("body");
    assert_eq!(b.find_in(Some(&body), "button").len(), 1);

    // Typing fires the page's input events.
    let input = b.wait_for("input[name=token]", T);
    b.send_keys(&input, "abc");
    b.wait_text("#out", T, |t| t == "typed 3");
    b.clear(&input);
    assert_eq!(
        b.execute("return arguments[0].value;", vec![input.arg()]),
        ""
    );

    // Scripts: values and elements in and out.
    assert_eq!(
        b.execute("return arguments[0] + 1;", vec![json!(41)]),
        json!(42)
    );
    assert_eq!(b.execute("return arguments[0].id;", vec![btn.arg()]), "b");
    assert!(
        b.execute("return performance.now();", vec![])
            .as_f64()
            .is_some_and(|t| t > 0.0)
    );

    // Window sizes, each with a screenshot of the viewport's size.
    let dir = screenshot_dir();
    for (w, h, name) in [(390, 844, "phone"), (1280, 800, "desktop")] {
        b.set_window_size(w, h);
        let (iw, ih) = b.viewport();
        assert!(
            iw > 0 && iw <= u64::from(w) && ih > 0 && ih <= u64::from(h),
            "{iw}x{ih} in a {w}x{h} window"
        );
        let path = dir.join(format!("webdriver-selftest-{name}.png"));
        b.screenshot(&path);
        let png = std::fs::read(&path).expect("screenshot file");
        let (pw, ph) = png_size(&png);
        assert_eq!(
            (u64::from(pw), u64::from(ph)),
            (iw, ih),
            "{}",
            path.display()
        );
        println!("webdriver: screenshot {}", path.display());
    }
    assert!(b.viewport().0 > 600, "the desktop width is back");

    // The console: the page's console.error is a SEVERE entry; reading keeps them.
    let log = b.console_log();
    assert!(
        log.iter()
            .any(|e| e.level == "SEVERE" && e.message.contains("deliberate error")),
        "{log:#?}"
    );
    assert_eq!(b.console_log().len(), log.len(), "kept, not drained");

    // The page's own clock, from navigation to readiness: the page waits 150 ms.
    let ms = b.time_until(
        &format!("{base}/timed"),
        "document.body && document.body.dataset.ready === '1'",
        T,
    );
    assert!(ms >= 150.0, "{ms} ms, before the page's own 150 ms timer");
    println!("webdriver: the timed page was ready {ms:.1} ms after navigation");
    // The watcher is gone: a later load is not timed.
    b.goto(&format!("{base}/timed"));
    b.wait_for("body[data-ready='1']", T);
    assert_eq!(
        b.execute("return window.__cortexReadyAt ?? null;", vec![]),
        json!(null)
    );

    // A form posted and answered 401: the status is read from the page.
    b.goto(&format!("{base}/form"));
    let before = b.console_log().len();
    let input = b.wait_for("input[name=token]", T);
    b.send_keys(&input, "x");
    b.click_on("button[data-test=go]", T);
    b.wait("the POST's answer", T, |b| {
        let st = b.execute(
            "const n = performance.getEntriesByType('navigation')[0]; return n ? n.responseStatus : null;",
            vec![],
        );
        (st == 401 && b.find("body form").is_some()).then_some(())
    });
    // Chrome logs a document's error status as a console error: the page test allows
    // exactly this line for its wrong login.
    let log = b.console_log();
    assert!(
        log[before..].iter().any(|e| e.level == "SEVERE"
            && e.message.contains("/login")
            && e.message.contains("status of 401")),
        "{log:#?}"
    );

    // Every step's URL was recorded.
    let visited = b.visited();
    assert!(visited.contains(&home), "{visited:#?}");
    assert!(visited.contains(&format!("{base}/timed")), "{visited:#?}");

    // A wait that runs out says what it waited for and where, with a screenshot.
    let failed = std::panic::catch_unwind(AssertUnwindSafe(|| {
        b.wait_for("[data-test=nowhere]", Duration::from_millis(300));
    }));
    let msg = failed
        .err()
        .and_then(|p| p.downcast_ref::<String>().cloned())
        .expect("the wait panicked with a message");
    assert!(msg.contains("[data-test=nowhere]"), "{msg}");
    assert!(msg.contains(&format!("at URL: {base}/login")), "{msg}");
    let shot = msg
        .lines()
        .find_map(|l| l.strip_prefix("screenshot: "))
        .unwrap_or_else(|| panic!("no screenshot in {msg}"));
    assert!(std::path::Path::new(shot).is_file(), "{shot}");

    // Dropped: chromedriver and every Chromium process it started are gone.
    let pgid = b.driver_pid();
    assert!(
        group_members(pgid).len() > 1,
        "chromedriver and Chromium share a group"
    );
    drop::<Browser>(b);
    // SIGKILL is delivered at once, but a dying process shows until the kernel is done.
    cortex_tests::wait_until(T, "chromedriver's process group to be gone", || {
        group_members(pgid).is_empty().then_some(())
    });
}
