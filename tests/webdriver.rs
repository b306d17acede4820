//! A minimal W3C WebDriver client for the browser tests: it starts `chromedriver` on a free
//! loopback port in a process group of its own, opens one headless Chromium session and
//! speaks the few JSON commands the tests use over `cortex_cli::http`. Dropping the
//! [`Browser`] ends the session and kills the group (chromedriver and every Chromium
//! process it started).
//!
//! Every wait is bounded; a wait that runs out panics with what it waited for, the page's
//! URL, the start of its HTML and a screenshot saved under `target/page-screenshots/`.

use std::cell::RefCell;
use std::fs::File;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use cortex_cli::http::{Method, Request};
use serde_json::{Value, json};

/// The key W3C WebDriver puts an element reference under.
const ELEMENT_KEY: &str = "element-6066-11e4-a52e-4f735466cecf";
/// How long one WebDriver command may take (a page load included).
const COMMAND_TIMEOUT: Duration = Duration::from_secs(60);
/// How long chromedriver may take to answer `/status` after it starts.
const START_LIMIT: Duration = Duration::from_secs(20);

/// Where the browser's programs are, found on `PATH` (Debian's `chromium` and
/// `chromium-driver` packages put both in `/usr/bin`).
#[derive(Debug, Clone)]
pub struct Tools {
    pub chromedriver: PathBuf,
    pub chromium: PathBuf,
}

/// The browser's programs, or what is missing.
pub fn tools() -> Result<Tools, String> {
    let find = |name: &str| {
        std::env::var_os("PATH").and_then(|p| {
            std::env::split_paths(&p)
                .map(|d| d.join(name))
                .find(|f| f.is_file())
        })
    };
    match (find("chromedriver"), find("chromium")) {
        (Some(chromedriver), Some(chromium)) => Ok(Tools {
            chromedriver,
            chromium,
        }),
        (None, None) => Err("chromium and chromedriver are not on PATH".into()),
        (None, _) => Err("chromedriver is not on PATH".into()),
        (_, None) => Err("chromium is not on PATH".into()),
    }
}

/// A headless browser at `width`x`height` for test `what`, or `None` (printing why) where
/// chromium or chromedriver is missing. With `CI=true` a missing browser fails the test:
/// CI installs both (`.ci/run`), so their absence there is a broken setup, not a skip.
pub fn browser_or_skip(what: &str, width: u32, height: u32) -> Option<Browser> {
    match tools() {
        Ok(t) => Some(Browser::start(&t, width, height)),
        Err(why) if std::env::var("CI").is_ok_and(|v| v == "true") => {
            panic!("{what}: {why}; CI must have them (apt-get install chromium chromium-driver)")
        }
        Err(why) => {
            eprintln!(
                "{what}: skipped: chromium/chromedriver not installed (apt install chromium chromium-driver): {why}"
            );
            None
        }
    }
}

/// An element of the current page, as WebDriver refers to it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Element(String);

/// One entry of the browser's console log.
#[derive(Debug, Clone)]
pub struct LogEntry {
    /// `SEVERE`, `WARNING`, `INFO`, `DEBUG`.
    pub level: String,
    pub message: String,
}

/// A WebDriver command that failed: its HTTP status and the `error`/`message` answered.
#[derive(Debug, Clone)]
pub struct CommandError {
    pub status: u16,
    pub error: String,
    pub message: String,
}

/// chromedriver and its one session.
pub struct Browser {
    driver: Child,
    /// `http://127.0.0.1:PORT/session/ID`.
    session: String,
    _tmp: tempfile::TempDir,
    /// Every URL the browser was seen at (after each navigation, click and wait) and every
    /// resource URL the pages loaded, in order.
    visited: RefCell<Vec<String>>,
    /// Console entries read so far (reading them from chromedriver drains its buffer).
    console: RefCell<Vec<LogEntry>>,
    shots: RefCell<u32>,
}

impl Browser {
    /// Starts chromedriver on a free loopback port and a headless Chromium session at
    /// `width`x`height`, its console log kept at every level. Panics if either fails.
    pub fn start(tools: &Tools, width: u32, height: u32) -> Browser {
        let tmp = tempfile::tempdir().expect("tempdir");
        let port = free_port();
        let log = File::create(tmp.path().join("chromedriver.log")).expect("log");
        let driver = Command::new(&tools.chromedriver)
            .arg(format!("--port={port}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            // A group of its own: Drop kills chromedriver and every Chromium it started.
            .process_group(0)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", tools.chromedriver.display()));
        let base = format!("http://127.0.0.1:{port}");
        let mut b = Browser {
            driver,
            session: String::new(),
            _tmp: tmp,
            visited: RefCell::new(Vec::new()),
            console: RefCell::new(Vec::new()),
            shots: RefCell::new(0),
        };
        b.wait_ready(&base);
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": tools.chromium,
                "args": [
                    "--headless=new",
                    // CI runs as root, where Chromium's sandbox refuses to start.
                    "--no-sandbox",
                    "--disable-gpu",
                    "--disable-dev-shm-usage",
                    format!("--window-size={width},{height}"),
                ],
            },
            "goog:loggingPrefs": {"browser": "ALL"},
        }}});
        let v = call(Method::Post, &format!("{base}/session"), Some(&caps))
            .unwrap_or_else(|e| panic!("new session: {e:?}\nchromedriver log:\n{}", b.log()));
        let id = v["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("no sessionId in {v}"));
        b.session = format!("{base}/session/{id}");
        b
    }

    /// Polls chromedriver's `/status` until it says ready.
    fn wait_ready(&mut self, base: &str) {
        let start = Instant::now();
        loop {
            if let Ok(Some(st)) = self.driver.try_wait() {
                panic!("chromedriver exited with {st}:\n{}", self.log());
            }
            let ready = call(Method::Get, &format!("{base}/status"), None)
                .is_ok_and(|v| v["ready"] == true);
            if ready {
                return;
            }
            assert!(
                start.elapsed() < START_LIMIT,
                "chromedriver not ready after {START_LIMIT:?}:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// chromedriver's process id, which is also its process group's.
    pub fn driver_pid(&self) -> u32 {
        self.driver.id()
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self._tmp.path().join("chromedriver.log")).unwrap_or_default()
    }

    /// One command of this session (`path` after `/session/ID`).
    pub fn command(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
    ) -> Result<Value, CommandError> {
        call(method, &format!("{}{path}", self.session), body)
    }

    /// [`Browser::command`], panicking with the command and the answer if it fails.
    fn cmd(&self, method: Method, path: &str, body: Option<&Value>) -> Value {
        self.command(method, path, body)
            .unwrap_or_else(|e| panic!("WebDriver {} {path}: {e:?}", method.as_str()))
    }

    /// Navigates to `url` and waits for its load (WebDriver's normal page-load strategy).
    pub fn goto(&self, url: &str) {
        self.cmd(Method::Post, "/url", Some(&json!({ "url": url })));
        self.record();
    }

    /// The page's current URL.
    pub fn url(&self) -> String {
        self.cmd(Method::Get, "/url", None)
            .as_str()
            .unwrap_or_default()
            .to_string()
    }

    /// Notes the current URL and the resources the page loaded so far in `visited`.
    pub fn record(&self) {
        let url = self.url();
        let resources = self
            .command(
                Method::Post,
                "/execute/sync",
                Some(&json!({
                    "script": "return performance.getEntriesByType('resource').map(e => e.name);",
                    "args": [],
                })),
            )
            .unwrap_or(Value::Null);
        let mut v = self.visited.borrow_mut();
        v.push(url);
        for r in resources.as_array().into_iter().flatten() {
            if let Some(r) = r.as_str()
                && !v.iter().any(|x| x == r)
            {
                v.push(r.to_string());
            }
        }
    }

    /// Every URL recorded so far: pages after each step and the resources they loaded.
    pub fn visited(&self) -> Vec<String> {
        self.visited.borrow().clone()
    }

    /// The first element matching `css`, if any.
    pub fn find(&self, css: &str) -> Option<Element> {
        self.find_all(css).into_iter().next()
    }

    /// Every element matching `css`.
    pub fn find_all(&self, css: &str) -> Vec<Element> {
        self.find_in(None, css)
    }

    /// Every element matching `css` inside `parent` (the whole page with `None`).
    pub fn find_in(&self, parent: Option<&Element>, css: &str) -> Vec<Element> {
        let path = match parent {
            Some(p) => format!("/element/{}/elements", p.0),
            None => "/elements".to_string(),
        };
        let body = json!({"using": "css selector", "value": css});
        match self.command(Method::Post, &path, Some(&body)) {
            Ok(v) => v
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|e| e[ELEMENT_KEY].as_str())
                .map(|id| Element(id.to_string()))
                .collect(),
            // The parent went away (the page re-rendered it): nothing inside it now.
            Err(e) if e.error == "stale element reference" => Vec::new(),
            Err(e) => panic!("finding {css:?}: {e:?}"),
        }
    }

    /// Waits (up to `limit`) for an element matching `css`; on timeout panics with the
    /// selector, the URL, the page's HTML and a screenshot.
    pub fn wait_for(&self, css: &str, limit: Duration) -> Element {
        let e = self.wait(&format!("an element matching {css}"), limit, |b| {
            b.find(css)
        });
        self.record();
        e
    }

    /// Waits (up to `limit`) until nothing matches `css`.
    pub fn wait_gone(&self, css: &str, limit: Duration) {
        self.wait(&format!("no element matching {css}"), limit, |b| {
            b.find(css).is_none().then_some(())
        });
        self.record();
    }

    /// Waits (up to `limit`) until the first element matching `css` has text for which
    /// `pred` holds; returns that text. On timeout the last text seen is in the message.
    pub fn wait_text(&self, css: &str, limit: Duration, pred: impl Fn(&str) -> bool) -> String {
        let last = RefCell::new(None::<String>);
        let found = self.try_wait(limit, |b| {
            let e = b.find(css)?;
            let t = b.try_text(&e)?;
            let ok = pred(&t);
            *last.borrow_mut() = Some(t.clone());
            ok.then_some(t)
        });
        match found {
            Some(t) => {
                self.record();
                t
            }
            None => self.fail(&format!(
                "timed out waiting for the text of {css} to match (waited {limit:?}; last seen: {:?})",
                last.borrow()
            )),
        }
    }

    /// Polls `f` until it returns `Some`, at most `limit`; on timeout panics as
    /// [`Browser::fail`] does, saying it waited for `what`.
    pub fn wait<T>(&self, what: &str, limit: Duration, f: impl FnMut(&Browser) -> Option<T>) -> T {
        match self.try_wait(limit, f) {
            Some(v) => v,
            None => self.fail(&format!("timed out waiting for {what} (waited {limit:?})")),
        }
    }

    /// Polls `f` until it returns `Some`, at most `limit`; `None` if it never did.
    pub fn try_wait<T>(
        &self,
        limit: Duration,
        mut f: impl FnMut(&Browser) -> Option<T>,
    ) -> Option<T> {
        let start = Instant::now();
        loop {
            if let Some(v) = f(self) {
                return Some(v);
            }
            if start.elapsed() >= limit {
                return None;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Panics saying what went wrong (`what`), with the URL, the start of the page's HTML, the
    /// console so far and the path of a screenshot taken now.
    pub fn fail(&self, what: &str) -> ! {
        let url = self
            .command(Method::Get, "/url", None)
            .map(|v| v.as_str().unwrap_or_default().to_string())
            .unwrap_or_else(|e| format!("(unknown: {e:?})"));
        let n = *self.shots.borrow();
        let shot = screenshot_dir().join(format!("failure-{}-{n}.png", std::process::id()));
        let saved = match self.try_screenshot(&shot) {
            Ok(()) => format!("screenshot: {}", shot.display()),
            Err(e) => format!("no screenshot: {e}"),
        };
        let html = self
            .command(
                Method::Post,
                "/execute/sync",
                Some(&json!({"script": "return document.documentElement.outerHTML;", "args": []})),
            )
            .map(|v| v.as_str().unwrap_or_default().to_string())
            .unwrap_or_default();
        let html: String = html.chars().take(3000).collect();
        let console: Vec<String> = self
            .console_log()
            .iter()
            .map(|e| format!("{} {}", e.level, e.message))
            .collect();
        panic!("{what}\nat URL: {url}\n{saved}\nconsole: {console:#?}\nHTML (start): {html}")
    }

    /// Clicks `e` (scrolled into view first by WebDriver), then notes the URL.
    pub fn click(&self, e: &Element) {
        self.cmd(
            Method::Post,
            &format!("/element/{}/click", e.0),
            Some(&json!({})),
        );
        self.record();
    }

    /// Clicks the first element matching `css`, trying again (up to `limit`) while there is
    /// none or it cannot take the click yet (covered, not yet shown, re-rendered).
    pub fn click_on(&self, css: &str, limit: Duration) {
        let last = RefCell::new(None::<CommandError>);
        let clicked = self.try_wait(limit, |b| {
            let e = b.find(css)?;
            let path = format!("/element/{}/click", e.0);
            match b.command(Method::Post, &path, Some(&json!({}))) {
                Ok(_) => Some(()),
                Err(err) => {
                    *last.borrow_mut() = Some(err);
                    None
                }
            }
        });
        match clicked {
            Some(()) => self.record(),
            None => self.fail(&format!(
                "could not click {css} within {limit:?} (last error: {:?})",
                last.borrow()
            )),
        }
    }

    /// Types `text` into `e` (`\u{E007}` is Enter).
    pub fn send_keys(&self, e: &Element, text: &str) {
        self.cmd(
            Method::Post,
            &format!("/element/{}/value", e.0),
            Some(&json!({ "text": text })),
        );
    }

    /// Empties an input or textarea.
    pub fn clear(&self, e: &Element) {
        self.cmd(
            Method::Post,
            &format!("/element/{}/clear", e.0),
            Some(&json!({})),
        );
    }

    /// The rendered text of `e`.
    pub fn text(&self, e: &Element) -> String {
        self.try_text(e)
            .unwrap_or_else(|| self.fail("the text of an element that went stale"))
    }

    /// The rendered text of `e`, `None` if it is no longer in the page.
    pub fn try_text(&self, e: &Element) -> Option<String> {
        self.command(Method::Get, &format!("/element/{}/text", e.0), None)
            .ok()
            .map(|v| v.as_str().unwrap_or_default().to_string())
    }

    /// Whether `e` is shown (WebDriver's "is element displayed"; false once it is gone).
    pub fn displayed(&self, e: &Element) -> bool {
        self.command(Method::Get, &format!("/element/{}/displayed", e.0), None)
            .is_ok_and(|v| v == true)
    }

    /// The attribute `name` of `e` (`None` when absent).
    pub fn attr(&self, e: &Element, name: &str) -> Option<String> {
        self.cmd(
            Method::Get,
            &format!("/element/{}/attribute/{name}", e.0),
            None,
        )
        .as_str()
        .map(str::to_string)
    }

    /// Runs `script` (a function body; `arguments[i]` are `args`) in the page and returns
    /// what it returns. An [`Element`] passes as `e.arg()`.
    pub fn execute(&self, script: &str, args: Vec<Value>) -> Value {
        self.cmd(
            Method::Post,
            "/execute/sync",
            Some(&json!({"script": script, "args": args})),
        )
    }

    /// Sets the window's outer size.
    pub fn set_window_size(&self, width: u32, height: u32) {
        self.cmd(
            Method::Post,
            "/window/rect",
            Some(&json!({"width": width, "height": height})),
        );
    }

    /// The viewport's inner width and height, as the page sees them.
    pub fn viewport(&self) -> (u64, u64) {
        let v = self.execute("return [window.innerWidth, window.innerHeight];", vec![]);
        (v[0].as_u64().unwrap_or(0), v[1].as_u64().unwrap_or(0))
    }

    /// Saves a PNG of the viewport to `path` (its directory created).
    pub fn screenshot(&self, path: &Path) {
        self.try_screenshot(path)
            .unwrap_or_else(|e| panic!("screenshot {}: {e}", path.display()));
    }

    fn try_screenshot(&self, path: &Path) -> Result<(), String> {
        let v = self
            .command(Method::Get, "/screenshot", None)
            .map_err(|e| format!("{e:?}"))?;
        let png = decode_base64(v.as_str().unwrap_or_default())
            .ok_or_else(|| "the screenshot is not base64".to_string())?;
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
        }
        std::fs::write(path, png).map_err(|e| e.to_string())?;
        *self.shots.borrow_mut() += 1;
        Ok(())
    }

    /// Every console entry so far (chromedriver's `se/log` for type `browser`; it drains
    /// its buffer on each read, so they are kept here).
    pub fn console_log(&self) -> Vec<LogEntry> {
        if let Ok(v) = self.command(Method::Post, "/se/log", Some(&json!({"type": "browser"}))) {
            let mut c = self.console.borrow_mut();
            for e in v.as_array().into_iter().flatten() {
                c.push(LogEntry {
                    level: e["level"].as_str().unwrap_or_default().to_string(),
                    message: e["message"].as_str().unwrap_or_default().to_string(),
                });
            }
        }
        self.console.borrow().clone()
    }

    /// A script run at the start of every document loaded from now on, before the page's
    /// own (Chrome's DevTools `Page.addScriptToEvaluateOnNewDocument`, through
    /// chromedriver's `goog/cdp/execute`); returns its id for
    /// [`Browser::remove_script_on_new_document`].
    pub fn add_script_on_new_document(&self, source: &str) -> String {
        let v = self.cmd(
            Method::Post,
            "/goog/cdp/execute",
            Some(&json!({
                "cmd": "Page.addScriptToEvaluateOnNewDocument",
                "params": {"source": source},
            })),
        );
        v["identifier"].as_str().unwrap_or_default().to_string()
    }

    pub fn remove_script_on_new_document(&self, id: &str) {
        self.cmd(
            Method::Post,
            "/goog/cdp/execute",
            Some(&json!({
                "cmd": "Page.removeScriptToEvaluateOnNewDocument",
                "params": {"identifier": id},
            })),
        );
    }

    /// Milliseconds from the start of navigating to `url` until `predicate` (a JavaScript
    /// expression over the document) first holds, as the page's own clock
    /// (`performance.now()`) reads it when a DOM change makes it true; waits up to `limit`.
    /// The browser is first sent to `about:blank`, so `url` loads as a new document even
    /// when only its fragment differs from the current one.
    pub fn time_until(&self, url: &str, predicate: &str, limit: Duration) -> f64 {
        // Installed before the page's scripts: the moment cannot be missed, however early.
        let watch = format!(
            "(() => {{
  if (location.protocol === 'about:') return;
  const ok = () => {{ try {{ return !!({predicate}); }} catch (_) {{ return false; }} }};
  const check = () => {{
    if (window.__cortexReadyAt === undefined && ok()) {{
      window.__cortexReadyAt = performance.now();
      obs.disconnect();
    }}
  }};
  const obs = new MutationObserver(check);
  obs.observe(document, {{subtree: true, childList: true, attributes: true, characterData: true}});
}})();"
        );
        self.goto("about:blank");
        let id = self.add_script_on_new_document(&watch);
        self.goto(url);
        let ms = self.wait(&format!("{predicate} to hold"), limit, |b| {
            b.execute("return window.__cortexReadyAt ?? null;", vec![])
                .as_f64()
        });
        self.remove_script_on_new_document(&id);
        self.record();
        ms
    }
}

impl Element {
    /// This element as a script argument for [`Browser::execute`].
    pub fn arg(&self) -> Value {
        json!({ ELEMENT_KEY: self.0 })
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        if !self.session.is_empty() {
            // Closes Chromium cleanly (its temp profile removed); bounded.
            let _ = Request::new(Method::Delete, &self.session)
                .timeout(Duration::from_secs(10))
                .send();
        }
        if let Some(pgid) = rustix::process::Pid::from_raw(self.driver.id() as i32) {
            let _ = rustix::process::kill_process_group(pgid, rustix::process::Signal::KILL);
        }
        let _ = self.driver.wait();
    }
}

/// `target/page-screenshots/`: where the browser tests save their screenshots.
pub fn screenshot_dir() -> PathBuf {
    let target = crate::target_dir();
    target
        .parent()
        .map_or_else(|| target.clone(), Path::to_path_buf)
        .join("page-screenshots")
}

/// One WebDriver call: the answer's `value`, or the error it carries.
fn call(method: Method, url: &str, body: Option<&Value>) -> Result<Value, CommandError> {
    let bytes = body.map(|b| serde_json::to_vec(b).expect("json"));
    let mut req = Request::new(method, url).timeout(COMMAND_TIMEOUT);
    if let Some(b) = &bytes {
        req = req.json(b);
    }
    let resp = req.send().map_err(|e| CommandError {
        status: 0,
        error: "no answer".into(),
        message: e.to_string(),
    })?;
    let v: Value = serde_json::from_slice(&resp.body).map_err(|_| CommandError {
        status: resp.status,
        error: "not JSON".into(),
        message: resp.text().into_owned(),
    })?;
    let value = v.get("value").cloned().unwrap_or(Value::Null);
    if resp.status == 200 {
        Ok(value)
    } else {
        Err(CommandError {
            status: resp.status,
            error: value["error"].as_str().unwrap_or_default().to_string(),
            message: value["message"].as_str().unwrap_or_default().to_string(),
        })
    }
}

/// A loopback port nothing listens on (bound, then released for chromedriver).
fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr").port()
}

/// Standard base64 (with or without padding) to bytes; `None` on any other character.
pub fn decode_base64(s: &str) -> Option<Vec<u8>> {
    fn sextet(c: u8) -> Option<u32> {
        Some(match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        } as u32)
    }
    let s = s.trim_end_matches('=').as_bytes();
    let mut out = Vec::with_capacity(s.len() * 3 / 4);
    for chunk in s.chunks(4) {
        let mut n = 0u32;
        for (i, &c) in chunk.iter().enumerate() {
            n |= sextet(c)? << (18 - 6 * i);
        }
        let bytes = n.to_be_bytes();
        match chunk.len() {
            4 => out.extend_from_slice(&bytes[1..4]),
            3 => out.extend_from_slice(&bytes[1..3]),
            2 => out.push(bytes[1]),
            _ => return None,
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::decode_base64;

    #[test]
    fn base64_decodes_with_and_without_padding() {
        assert_eq!(decode_base64("aGk=").as_deref(), Some(&b"hi"[..]));
        assert_eq!(decode_base64("aGk").as_deref(), Some(&b"hi"[..]));
        assert_eq!(decode_base64("aGV5").as_deref(), Some(&b"hey"[..]));
        assert_eq!(decode_base64("aA==").as_deref(), Some(&b"h"[..]));
        assert_eq!(decode_base64("").as_deref(), Some(&b""[..]));
        assert_eq!(decode_base64("a").as_deref(), None);
        assert_eq!(decode_base64("a*bc"), None);
    }
}
