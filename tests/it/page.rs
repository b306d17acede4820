//! The hub's page in a real headless Chromium, driven only through its `data-test` hooks
//! and its routes, against a real hub (running a scripted model) and a real device agent:
//! a wrong token refused (401, the error shown), the login form, a device going online and
//! then offline when its agent stops (no reload), a session's capsule following signals,
//! its panel and a cancel behind a confirmation, an approval answered with a click, and
//! logout. No URL the browser visits holds the token or a waitpoint's secret, and the
//! console has no error. Screenshots of the devices page and of a session with a capsule,
//! wide and narrow, go to `target/page-screenshots/`. With 1,000 devices and 1,000 armed
//! waitpoints it prints (never asserts) how long each page takes from navigation to ready.
//! Skipped where chromium or chromedriver is missing, except under `CI=true`.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use cortex_cli::http::Method;
use cortex_tests::agent::Agent;
use cortex_tests::scripted_model::{Reply, ScriptedModel};
use cortex_tests::webdriver::{Browser, browser_or_skip, screenshot_dir};
use cortex_tests::{Hub, body, wait_until};
use serde_json::{Value, json};

use super::runner::{hub, new_session, run_end, say};

/// Bound on each wait for the page.
const T: Duration = Duration::from_secs(20);
/// Bound on the pages with 1,000 rows.
const BIG: Duration = Duration::from_secs(120);
const WIDE: (u32, u32) = (1280, 800);
const NARROW: (u32, u32) = (390, 844);
/// What the model is asked in the approval step; it answers with a gated `devices` call.
const ASK: &str = "please list the devices";
/// How many devices and waitpoints the performance step has.
const MANY: usize = 1_000;

/// The scripted model: a `devices` call for [`ASK`], plain text for anything else.
fn model_rule(req: &Value) -> Reply {
    let last = req["messages"]
        .as_array()
        .and_then(|m| m.last())
        .cloned()
        .unwrap_or(Value::Null);
    if last["role"] == "user" && last["content"].to_string().contains(ASK) {
        Reply::tool_call("devices", "{}")
    } else {
        Reply::text("done")
    }
}

#[test]
fn the_page_in_a_browser() {
    let Some(b) = browser_or_skip("page", WIDE.0, WIDE.1) else {
        return;
    };
    let model = ScriptedModel::start_with_default(vec![], Reply::from_fn(model_rule));
    let (hub, _tmp) = hub(&model);
    let shots = screenshot_dir();
    std::fs::create_dir_all(&shots).expect("screenshot dir");

    let allowed_severe = wrong_token_is_refused(&b, &hub);
    log_in(&b, &hub);
    let _agent = device_goes_online_then_offline(&b, &hub, &shots);
    enrol_and_revoke(&b, &hub);
    let secret = capsule_follows_signals(&b, &hub, &shots);
    approval_is_answered(&b, &hub);
    performance(&b, &hub);
    log_out(&b, &hub);

    // No URL the browser was at or loaded holds the token or a secret.
    let visited = b.visited();
    assert!(visited.len() > 5, "{visited:#?}");
    for url in &visited {
        assert!(!url.contains(&hub.token), "a URL holds the token");
        assert!(
            !url.contains(&secret),
            "a URL holds a waitpoint's secret: {url}"
        );
    }
    println!("page: {} URLs visited, none holds the token", visited.len());

    // The console: no error, but the 401 of the wrong login (the contract's answer).
    let log = b.console_log();
    let severe: Vec<String> = log
        .iter()
        .filter(|e| e.level == "SEVERE" && !allowed_severe.contains(&e.message))
        .map(|e| e.message.clone())
        .collect();
    assert!(severe.is_empty(), "console errors: {severe:#?}");
}

/// `GET /` shows the login form; a wrong token is answered 401 with the form and
/// `[data-test=login-error]`. Returns the console's SEVERE lines that step caused and
/// that name the 401 of `/login` (Chrome logs a failed status as a resource error).
fn wrong_token_is_refused(b: &Browser, hub: &Hub) -> Vec<String> {
    b.goto(&hub.url("/"));
    let form = b.wait_for("form[data-test=login]", T);
    assert!(
        b.attr(&form, "method")
            .is_some_and(|m| m.eq_ignore_ascii_case("post")),
        "the login form posts, so the token is in no URL"
    );
    let input = b.wait_for("form[data-test=login] input[name=token]", T);
    assert_eq!(b.attr(&input, "type").as_deref(), Some("password"));
    let before = b.console_log().len();
    b.send_keys(&input, "not-the-operator-token");
    b.click_on("button[data-test=login-submit]", T);
    // Found afresh each time: the form's own page may hold a hidden error element, which
    // the navigation replaces.
    b.wait("a 401 answer showing [data-test=login-error]", T, |b| {
        let err = b.find("[data-test=login-error]")?;
        (b.displayed(&err) && navigation_status(b) == 401).then_some(())
    });
    b.wait_for("form[data-test=login] input[name=token]", T);
    assert!(b.find("button[data-test=logout]").is_none());
    println!("page: wrong token refused at {}", b.url());
    b.console_log()[before..]
        .iter()
        .filter(|e| {
            e.level == "SEVERE" && e.message.contains("/login") && e.message.contains("401")
        })
        .map(|e| e.message.clone())
        .collect()
}

/// The right token through the form: the shell, on the devices route.
fn log_in(b: &Browser, hub: &Hub) {
    let input = b.wait_for("form[data-test=login] input[name=token]", T);
    b.clear(&input);
    b.send_keys(&input, &hub.token);
    b.click_on("button[data-test=login-submit]", T);
    for hook in [
        "a[data-test=nav-devices]",
        "a[data-test=nav-sessions]",
        "a[data-test=nav-approvals]",
        "button[data-test=logout]",
    ] {
        b.wait_for(hook, T);
    }
    ready(b);
    let url = b.url();
    assert!(url.starts_with(&hub.url("/")), "{url}");
    assert!(b.find("form[data-test=login]").is_none(), "logged in");
    println!("page: logged in, at {url}");
}

/// A device enrolled and its agent started shows online on `#/devices`; the agent stopped,
/// it turns offline in the same document (no reload). Returns the stopped agent (its temp
/// home lives until the test ends).
fn device_goes_online_then_offline(b: &Browser, hub: &Hub, shots: &Path) -> Agent {
    let token = hub.add_device("gpu1");
    let mut agent = Agent::start(hub, "gpu1", &token);
    hub.wait_online("gpu1");
    b.click_on("a[data-test=nav-devices]", T);
    let online = "[data-test=device][data-name=gpu1][data-state=online]";
    b.wait_for(online, T);
    ready(b);
    let state = inside(b, online, "[data-test=device-state]");
    assert!(state.contains("online"), "{state:?}");
    // And the hub that holds its link, by the name it gave itself.
    let me = std::fs::read_to_string(hub.home.join("hub/hub-name")).expect("hub-name");
    assert!(state.contains(&format!("on {}", me.trim())), "{state:?}");
    let version = inside(b, online, "[data-test=device-version]");
    assert!(version.contains(env!("CARGO_PKG_VERSION")), "{version:?}");
    for hook in [
        "[data-test=device-last-seen]",
        "[data-test=device-host]",
        "[data-test=device-spool]",
        "[data-test=device-waits]",
    ] {
        b.wait_for(&format!("{online} {hook}"), T);
    }
    screenshots(b, shots, "devices", "[data-test=device][data-name=gpu1]");

    // A mark in this document: still there after the change means no reload.
    b.execute("window.__cortexNoReload = true;", vec![]);
    assert!(agent.stop().success(), "{}", agent.log());
    let offline = "[data-test=device][data-name=gpu1][data-state=offline]";
    b.wait_for(offline, T);
    let state = inside(b, offline, "[data-test=device-state]");
    assert!(state.contains("offline"), "{state:?}");
    assert_eq!(
        b.execute("return window.__cortexNoReload === true;", vec![]),
        json!(true),
        "the page reloaded to show the device offline"
    );
    println!("page: gpu1 went online, then offline without a reload");

    // Its own page says so too.
    b.goto(&hub.url("/#/device/gpu1"));
    b.wait_for("[data-test=device-detail][data-state=offline]", T);
    b.wait_for("button[data-test=revoke]", T);
    ready(b);
    agent
}

/// Enrol through the page: the new device's token is shown once with the install lines
/// filled in, and the hub knows the device; revoke from its page asks first, and once
/// confirmed the hub no longer knows it.
fn enrol_and_revoke(b: &Browser, hub: &Hub) {
    b.goto(&hub.url("/#/devices"));
    ready(b);
    b.click_on("button[data-test=enrol]", T);
    let name = b.wait_for("input[data-test=enrol-name]", T);
    b.send_keys(&name, "box9");
    b.click_on("button[data-test=enrol-submit]", T);
    let token = b.wait_text("[data-test=enrol-token]", T, |t| t.trim().len() >= 16);
    let token = token.trim().to_string();
    let install = b.wait_text("[data-test=enrol-install]", T, |t| !t.is_empty());
    assert!(
        install.contains(&token),
        "the install lines hold the token: {install}"
    );
    assert!(
        install.contains("box9"),
        "the install lines name the device: {install}"
    );
    let (st, _) = hub.api(Method::Get, "/api/devices/box9", None);
    assert_eq!(st, 200, "the hub knows the enrolled device");
    b.wait_for("[data-test=device][data-name=box9]", T);

    b.goto(&hub.url("/#/device/box9"));
    ready(b);
    b.click_on("button[data-test=revoke]", T);
    b.wait_for("[data-test=confirm]", T);
    b.click_on("button[data-test=confirm-no]", T);
    b.wait_gone("[data-test=confirm]", T);
    assert_eq!(
        hub.api(Method::Get, "/api/devices/box9", None).0,
        200,
        "no kept it"
    );
    b.click_on("button[data-test=revoke]", T);
    b.wait_for("[data-test=confirm]", T);
    b.click_on("button[data-test=confirm-yes]", T);
    wait_until(T, "the device revoked", || {
        (hub.api(Method::Get, "/api/devices/box9", None).0 == 404).then_some(())
    });
    // The fleet view keeps it, as revoked.
    b.goto(&hub.url("/#/devices"));
    ready(b);
    b.wait_for("[data-test=device][data-name=box9][data-state=revoked]", T);
    println!(
        "page: box9 enrolled (token shown once, install lines filled in) and revoked after a confirmation"
    );
}

/// A two-member waitpoint on a session: the capsule reads `0/2`, then `1/2` after a
/// signal; narrow, just the count; its panel shows the intent, members and the signal
/// with its source and never the secret; a cancel asks first, `no` keeps it, `yes`
/// cancels it and the capsule goes. Returns the secret (checked against every URL later).
fn capsule_follows_signals(b: &Browser, hub: &Hub, shots: &Path) -> String {
    let sid = hub.session();
    let wp = hub.waitpoint(
        &sid,
        json!({"label": "ladder", "intent": "both arms report", "members": ["a", "b"], "expires_in_hours": 3}),
    );
    let wid = wp["id"].as_str().expect("id").to_string();
    let secret = wp["secret"].as_str().expect("secret").to_string();
    b.goto(&hub.url(&format!("/#/session/{sid}")));
    b.wait_for("[data-test=transcript]", T);
    b.wait_for("textarea[data-test=composer]", T);
    b.wait_for("button[data-test=send]", T);
    let capsule = "[data-test=capsule]";
    let t = b.wait_text(capsule, T, |t| one_waitpoint(t, "ladder", 0, 2));
    println!("page: capsule {t:?}");
    ready(b);
    assert!(
        b.find("[data-test=capsule] [data-test=capsule-dot]")
            .is_none(),
        "no badge yet (no wake, no failure, no retry), so no [data-test=capsule-dot]"
    );
    let above = b.execute(
        "const c = document.querySelector('[data-test=capsule]').getBoundingClientRect();
         const t = document.querySelector('textarea[data-test=composer]').getBoundingClientRect();
         return c.bottom <= t.top + 1;",
        vec![],
    );
    assert_eq!(above, json!(true), "the capsule sits above the composer");

    let (st, v) = hub.signal(&body(&wp, json!({"member": "a", "message": "arm a done"})));
    assert_eq!(st, 202, "{v}");
    let t = b.wait_text(capsule, T, |t| one_waitpoint(t, "ladder", 1, 2));
    println!("page: capsule {t:?} after a signal");
    screenshots(b, shots, "session", capsule);

    // Narrow: just the number of armed waitpoints.
    b.set_window_size(NARROW.0, NARROW.1);
    b.wait_text(capsule, T, |t| t == "1");
    b.set_window_size(WIDE.0, WIDE.1);
    b.wait_text(capsule, T, |t| one_waitpoint(t, "ladder", 1, 2));

    // The panel.
    b.click_on(capsule, T);
    b.wait_for("[data-test=wp-panel]", T);
    let one = format!("[data-test=wp-panel] [data-test=wp][data-id=\"{wid}\"]");
    b.wait_for(&one, T);
    let intent = inside(b, &one, "[data-test=wp-intent]");
    assert!(intent.contains("both arms report"), "{intent:?}");
    let quorum = inside(b, &one, "[data-test=wp-quorum]");
    assert!(quorum.contains('2'), "{quorum:?}");
    wait_count(b, &format!("{one} [data-test=wp-member]"), 2);
    wait_count(b, &format!("{one} [data-test=wp-signal]"), 1);
    let signal = b.wait_text(&format!("{one} [data-test=wp-signal]"), T, |t| {
        t.contains("http")
    });
    println!("page: the panel's signal row {signal:?}");
    let html = b.execute("return document.documentElement.outerHTML;", vec![]);
    assert!(
        !html.as_str().unwrap_or_default().contains(&secret),
        "the secret is in the page"
    );

    // Cancel: asked first; no keeps it, yes cancels it.
    let cancel = format!("{one} button[data-test=wp-cancel]");
    b.click_on(&cancel, T);
    b.wait_for("[data-test=confirm]", T);
    b.click_on("[data-test=confirm] button[data-test=confirm-no]", T);
    b.wait_gone("[data-test=confirm]", T);
    assert_eq!(hub.get_waitpoint(&wid)["state"], "armed", "no kept it");
    if b.find(&cancel).is_none() {
        // The panel closed with the dialog: open it again.
        b.click_on(capsule, T);
    }
    b.click_on(&cancel, T);
    b.wait_for("[data-test=confirm]", T);
    b.click_on("[data-test=confirm] button[data-test=confirm-yes]", T);
    wait_until(T, "the waitpoint cancelled", || {
        (hub.get_waitpoint(&wid)["state"] == "cancelled").then_some(())
    });
    b.wait_gone(capsule, T);
    println!("page: waitpoint cancelled through the panel; the capsule is gone");
    secret
}

/// A session parked on an approval: amber on `#/sessions`, listed on `#/approvals`,
/// answered with `approve` on its own page; the API shows it answered and the run ends.
fn approval_is_answered(b: &Browser, hub: &Hub) {
    let sid = new_session(
        hub,
        json!({"title": "approval", "policy": {"requireApproval": ["devices"]}}),
    );
    say(hub, &sid, json!({ "text": ASK }));
    let req = hub.wait_event(&sid, T, |e| e["kind"] == "approval-required")["approval"].clone();
    let rid = req["id"].as_str().expect("request id").to_string();

    b.goto(&hub.url("/#/sessions"));
    let row = format!("[data-test=session][data-id=\"{sid}\"]");
    b.wait_for(&format!("{row} [data-test=amber]"), T);
    b.wait_for(
        &format!("{row} [data-test=state][data-state=waiting_on_you]"),
        T,
    );
    ready(b);
    assert!(
        b.find(&format!("{row} [data-test=ring]")).is_none(),
        "blocked on a person, not on a signal"
    );

    b.goto(&hub.url("/#/approvals"));
    b.wait_for(&format!("[data-test=approval][data-id=\"{rid}\"]"), T);
    ready(b);

    b.goto(&hub.url(&format!("/#/session/{sid}")));
    let one = format!("[data-test=approval][data-id=\"{rid}\"]");
    b.wait_for(&one, T);
    let args = inside(b, &one, "[data-test=approval-args]");
    let parsed: Result<Value, _> = serde_json::from_str(args.trim());
    assert!(parsed.is_ok(), "the call's arguments as JSON: {args:?}");
    b.wait_for(&format!("{one} button[data-test=deny]"), T);
    b.click_on(&format!("{one} button[data-test=approve]"), T);

    let answer = hub.wait_event(&sid, T, |e| e["kind"] == "answer");
    assert_eq!(answer["decision"], "allow", "{answer}");
    let end = run_end(hub, &sid, 1);
    assert_eq!(end["result"]["ok"], true, "{end}");
    let (st, list) = hub.api(Method::Get, "/api/approvals", None);
    assert_eq!(st, 200, "{list}");
    assert_eq!(list["approvals"], json!([]), "{list}");
    b.wait_gone(&one, T);
    println!("page: approval {rid} answered through the page");
}

/// 1,000 devices and a session with 1,000 armed waitpoints: the time from navigation to a
/// ready page with all of them, printed.
fn performance(b: &Browser, hub: &Hub) {
    let start = Instant::now();
    // gpu1 is one already.
    for i in 1..MANY {
        hub.add_device(&format!("perf-{i:04}"));
    }
    let sid = hub.session();
    for i in 0..MANY {
        hub.waitpoint(
            &sid,
            json!({"label": format!("job {i:04}"), "intent": "a load test"}),
        );
    }
    println!(
        "page: {MANY} devices and {MANY} waitpoints created in {:.1} s",
        start.elapsed().as_secs_f64()
    );

    let ms = b.time_until(
        &hub.url("/#/devices"),
        &format!(
            "document.body.dataset.ready === '1' && document.querySelectorAll('[data-test=device]:not([data-state=revoked])').length >= {MANY}"
        ),
        BIG,
    );
    println!("page: #/devices with {MANY} devices: ready {ms:.0} ms after navigation");
    // box9, revoked above, is listed beside them.
    assert_eq!(
        b.find_all("[data-test=device]:not([data-state=revoked])")
            .len(),
        MANY
    );

    let prefix = format!("{MANY} waiting items · ");
    // `innerText`: the capsule's text as shown, as WebDriver reads it (text hidden by CSS,
    // such as a narrow screen's variant, left out).
    let ms = b.time_until(
        &hub.url(&format!("/#/session/{sid}")),
        &format!(
            "document.body.dataset.ready === '1' && ((c) => c !== null && c.innerText.replace(/\\s+/g, ' ').trim().startsWith({prefix:?}))(document.querySelector('[data-test=capsule]'))"
        ),
        BIG,
    );
    println!("page: #/session with {MANY} armed waitpoints: ready {ms:.0} ms after navigation");
    let t = b.wait_text("[data-test=capsule]", T, |t| t.starts_with(&prefix));
    assert!(t.len() > prefix.len(), "the first label follows: {t:?}");
}

/// Logout leaves the login form, and the cookie no longer opens the shell.
fn log_out(b: &Browser, hub: &Hub) {
    b.click_on("button[data-test=logout]", T);
    b.wait_for("form[data-test=login]", T);
    // A new document (not a fragment change of this one) asks the hub again.
    b.goto("about:blank");
    b.goto(&hub.url("/#/devices"));
    b.wait_for("form[data-test=login]", T);
    assert!(b.find("button[data-test=logout]").is_none());
    println!("page: logged out");
}

/// Waits for `body[data-ready="1"]`.
fn ready(b: &Browser) {
    b.wait_for("body[data-ready='1']", T);
}

/// Waits until exactly `n` elements match `css` (found afresh each time: the page may
/// render them again as events arrive).
fn wait_count(b: &Browser, css: &str, n: usize) {
    b.wait(&format!("{n} elements matching {css}"), T, |b| {
        (b.find_all(css).len() == n).then_some(())
    });
}

/// The text of the first `inner` inside the first `outer`, waiting for it.
fn inside(b: &Browser, outer: &str, inner: &str) -> String {
    let e = b.wait_for(&format!("{outer} {inner}"), T);
    b.text(&e)
}

/// `LABEL · R/Q received · expires in 3h` (the expiry in m, h or d).
fn one_waitpoint(text: &str, label: &str, r: u32, q: u32) -> bool {
    let Some(rest) = text.strip_prefix(&format!("{label} · {r}/{q} received · expires in "))
    else {
        return false;
    };
    let unit = rest.trim_start_matches(|c: char| c.is_ascii_digit());
    unit.len() < rest.len() && matches!(unit, "m" | "h" | "d")
}

/// The HTTP status of the current document (Chrome's navigation timing); 0 while unknown
/// (mid-navigation).
fn navigation_status(b: &Browser) -> u64 {
    let script = json!({
        "script": "const n = performance.getEntriesByType('navigation')[0]; return n ? n.responseStatus : 0;",
        "args": [],
    });
    b.command(Method::Post, "/execute/sync", Some(&script))
        .ok()
        .and_then(|v| v.as_u64())
        .unwrap_or(0)
}

/// Screenshots of the current page, wide then narrow (waiting for `hook` at each size),
/// as `NAME-1280x800.png` and `NAME-390x844.png`; the window is wide again after.
fn screenshots(b: &Browser, dir: &Path, name: &str, hook: &str) {
    for (w, h) in [WIDE, NARROW] {
        b.set_window_size(w, h);
        b.wait_for(hook, T);
        ready(b);
        let path: PathBuf = dir.join(format!("{name}-{w}x{h}.png"));
        b.screenshot(&path);
        println!("page: screenshot {}", path.display());
    }
    b.set_window_size(WIDE.0, WIDE.1);
}

#[test]
fn one_waitpoint_text_is_read_as_the_contract_writes_it() {
    assert!(one_waitpoint(
        "ladder · 1/2 received · expires in 3h",
        "ladder",
        1,
        2
    ));
    assert!(one_waitpoint(
        "ladder · 1/2 received · expires in 12m",
        "ladder",
        1,
        2
    ));
    assert!(!one_waitpoint(
        "ladder · 0/2 received · expires in 3h",
        "ladder",
        1,
        2
    ));
    assert!(!one_waitpoint(
        "ladder · 1/2 received · expires in h",
        "ladder",
        1,
        2
    ));
    assert!(!one_waitpoint(
        "ladder · 1/2 received · expires in 3 hours",
        "ladder",
        1,
        2
    ));
}
