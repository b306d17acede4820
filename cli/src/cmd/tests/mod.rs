//! Tests of `cortex`'s commands against canned hubs on port 0: flags to request bodies,
//! tables, `--json`, and exit codes.

use clap::Parser;
use cortex_protocol::api::{HowToSignal, SessionView, WaitpointCreated, WaitpointHead};
use serde_json::{Value, json};

use super::*;
use crate::testserver::{TestServer, json as answer};

mod devices_exits_pipes;
mod flags;
mod model_sessions;
mod sessions_and_waits;

/// `wait create --session s --label l --intent i EXTRA…`'s request body, as JSON.
fn create_body_of(extra: &[&str]) -> Value {
    let mut argv = vec![
        "wait",
        "create",
        "--session",
        "s",
        "--label",
        "l",
        "--intent",
        "i",
    ];
    argv.extend_from_slice(extra);
    let cli = parse(&argv).expect("parse");
    let Command::Wait(WaitCommand::Create(args)) = cli.command else {
        panic!("not wait create")
    };
    serde_json::to_value(wait::create_body(&args).expect("body")).expect("ser")
}

fn parse(argv: &[&str]) -> Result<Cli, clap::Error> {
    Cli::try_parse_from(std::iter::once("cortex").chain(argv.iter().copied()))
}

fn env() -> CortexEnv {
    CortexEnv {
        webhook_port: None,
        token: Some("tok".into()),
        cortex_home: Err(HomeError::NoHome),
        user: Some("ada".into()),
        term: Term::default(),
    }
}

/// Runs `cortex --hub <server> argv…`; returns exit status, stdout, stderr.
fn exec(server: &TestServer, argv: &[&str]) -> (u8, String, String) {
    let url = server.url("");
    let mut full = vec!["--hub", url.as_str()];
    full.extend_from_slice(argv);
    let cli = parse(&full).expect("flags parse");
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let code = run(&cli, &env(), &mut out, &mut err);
    (
        code,
        String::from_utf8(out).expect("utf8"),
        String::from_utf8(err).expect("utf8"),
    )
}

fn session_view(id: &str, title: Option<&str>, armed: u32) -> SessionView {
    SessionView {
        id: id.into(),
        title: title.map(Into::into),
        created_at: 1_786_615_445_000,
        last_seq: 3,
        armed_waitpoints: armed,
        spawned_from: None,
        runs: true,
        state: Default::default(),
        config: None,
    }
}

fn some_events() -> Value {
    json!({"events": [
        {"seq": 1, "ts": 1_786_615_445_000u64, "kind": "message", "text": "hello\nsecond line", "when": "now"},
        {"seq": 2, "ts": 1_786_615_446_000u64, "kind": "wake", "waitpoint": {"id": "wp_1", "label": "nightly", "intent": "i"},
         "reason": "fired", "waited_ms": 10, "signals": [], "text": "Waitpoint nightly fired.\n\nData: ok"},
        {"seq": 3, "ts": 1_786_615_447_000u64, "kind": "tool-start", "tool": "wait_check"}
    ]})
}

fn created() -> WaitpointCreated {
    WaitpointCreated {
        head: WaitpointHead {
            id: "wp_1a2b".into(),
            state: "armed".into(),
            session: "ses_1".into(),
            label: "nightly".into(),
            intent: "compare".into(),
            created_at: 1,
            expires_at: 1_786_615_445_000,
            members: vec!["arm2".into()],
            quorum: 1,
            fail_fast: true,
            max_signals: 1,
            device: None,
            silence_after_ms: None,
            coalesce_ms: None,
            spawn: false,
        },
        secret: "s3cr3t".into(),
        how_to_signal: HowToSignal {
            env: "export CORTEX_SIGNAL_ID=wp_1a2b CORTEX_SIGNAL_SECRET=s3cr3t".into(),
            cli: "cortex-signal --exit-code $? --member MEMBER".into(),
            curl: "curl …".into(),
            shell: "printf …".into(),
            attach_to_pid: "(while kill -0 PID …".into(),
            recommended: "cli".into(),
        },
        member_note: Some("replace MEMBER with one of: arm2".into()),
    }
}
