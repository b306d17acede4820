//! Unit tests of the agent's pure parts (backoff, configuration, host facts, notify
//! messages, close reasons); the forwarder against a fake outbox (`tests/forward.rs`); the
//! whole daemon against a minimal in-test hub (`tests/daemon.rs`, `tests/fake_hub.rs`), and
//! its remote waits the same way (`tests/remote.rs`), and exec with real commands
//! (`tests/exec.rs`).

#![allow(clippy::unwrap_used)]
// The in-test hub's upgrade callbacks return tungstenite's own (large) error type.
#![allow(clippy::result_large_err)]

mod daemon;
mod exec;
mod fake_hub;
mod forward;
mod remote;
mod rotation;

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::backoff::Backoff;
use super::config::{self, ConfigError, HubUrl, HubUrls, Token, TokenSource};
use super::host;
use super::link;
use super::notify;

// ---------------------------------------------------------------- backoff

const S: Duration = Duration::from_secs(1);

#[test]
fn backoff_ceiling_doubles_from_one_second_to_the_cap() {
    let mut b = Backoff::new(S, 60 * S, 7);
    let mut ceilings = Vec::new();
    for _ in 0..9 {
        ceilings.push(b.ceiling().as_secs());
        b.fail();
    }
    assert_eq!(ceilings, [1, 2, 4, 8, 16, 32, 60, 60, 60]);
}

#[test]
fn backoff_draws_stay_within_floor_and_ceiling_and_spread_out() {
    for seed in 0..50 {
        let mut b = Backoff::new(S, 60 * S, seed);
        for _ in 0..12 {
            let ceiling = b.ceiling();
            let d = b.fail();
            assert!(d <= ceiling, "{d:?} over {ceiling:?}");
            assert!(d >= S / 10, "{d:?} under the floor");
        }
    }
    // Full jitter: at the cap, draws cover the range rather than clustering at the top.
    let mut b = Backoff::new(S, 60 * S, 42);
    for _ in 0..10 {
        b.fail();
    }
    let draws: Vec<Duration> = (0..1000).map(|_| b.fail()).collect();
    assert!(draws.iter().any(|d| *d < 15 * S), "no low draws");
    assert!(draws.iter().any(|d| *d > 45 * S), "no high draws");
    let mean = draws.iter().sum::<Duration>() / 1000;
    assert!(mean > 25 * S && mean < 35 * S, "mean {mean:?}");
}

#[test]
fn backoff_resets_to_the_base_only_when_told() {
    let mut b = Backoff::new(S, 60 * S, 1);
    for _ in 0..5 {
        b.fail();
    }
    assert_eq!(b.ceiling(), 32 * S);
    b.reset();
    assert_eq!(b.failures(), 0);
    assert_eq!(b.ceiling(), S);
    assert!(b.fail() <= S);
}

#[test]
fn an_operator_failure_waits_near_the_cap_and_leaves_the_backoff_there() {
    for seed in 0..50 {
        let mut b = Backoff::new(S, 60 * S, seed);
        let d = b.fail_at_cap();
        assert!(d >= 30 * S && d <= 60 * S, "{d:?}");
        assert_eq!(b.ceiling(), 60 * S);
    }
}

#[test]
fn a_busy_hubs_wait_stays_under_its_cap_while_the_failures_still_count() {
    for seed in 0..50 {
        let mut b = Backoff::new(S, 60 * S, seed);
        for _ in 0..8 {
            let d = b.fail_within(4 * S);
            assert!(d <= 4 * S, "{d:?}");
        }
        assert_eq!(b.failures(), 8);
        assert_eq!(
            b.ceiling(),
            60 * S,
            "an ordinary failure next waits as usual"
        );
    }
}

// ---------------------------------------------------------------- config

#[test]
fn hub_urls_follow_the_plaintext_rule() {
    let ok = |u: &str| HubUrl::parse(u, false).map(|h| h.as_str().to_owned());
    assert_eq!(
        ok("ws://127.0.0.1:3002/mesh/v1").unwrap(),
        "ws://127.0.0.1:3002/mesh/v1"
    );
    assert_eq!(
        ok("ws://localhost:3002").unwrap(),
        "ws://localhost:3002/mesh/v1"
    );
    assert_eq!(ok("ws://[::1]:3002/").unwrap(), "ws://[::1]:3002/mesh/v1");
    assert_eq!(
        ok("wss://hub.example:443/mesh/v1").unwrap(),
        "wss://hub.example:443/mesh/v1"
    );
    assert!(HubUrl::parse("wss://hub.example", false).unwrap().is_tls());
    assert!(matches!(
        HubUrl::parse("ws://10.0.0.5:3002/mesh/v1", false),
        Err(ConfigError::Insecure { .. })
    ));
    assert!(HubUrl::parse("ws://10.0.0.5:3002/mesh/v1", true).is_ok());
    for bad in [
        "http://127.0.0.1:3002/mesh/v1",
        "127.0.0.1:3002",
        "ws://user:pw@127.0.0.1:3002/mesh/v1",
        "",
    ] {
        assert!(
            matches!(HubUrl::parse(bad, true), Err(ConfigError::BadUrl { .. })),
            "{bad}"
        );
    }
}

#[test]
fn several_hub_urls_are_each_checked_and_an_empty_one_is_an_error() {
    let urls = HubUrls::parse(&["ws://127.0.0.1:1/mesh/v1", " wss://hub.example "], false).unwrap();
    assert_eq!(urls.len(), 2);
    assert_eq!(urls.get(0).as_str(), "ws://127.0.0.1:1/mesh/v1");
    assert_eq!(urls.get(1).as_str(), "wss://hub.example/mesh/v1");
    assert_eq!(urls.get(2), urls.get(0), "wraps");
    assert!(urls.any_tls());
    assert_eq!(
        urls.to_string(),
        "ws://127.0.0.1:1/mesh/v1,wss://hub.example/mesh/v1"
    );
    let one = HubUrls::parse(&["ws://127.0.0.1:1"], false).unwrap();
    assert_eq!(
        one,
        HubUrls::one(HubUrl::parse("ws://127.0.0.1:1", false).unwrap())
    );
    assert!(!one.any_tls());

    let empty = HubUrls::parse(&["ws://127.0.0.1:1", "", "wss://b"], false).unwrap_err();
    assert!(
        matches!(
            empty,
            ConfigError::EmptyUrl {
                position: 2,
                count: 3
            }
        ),
        "{empty:?}"
    );
    assert!(
        empty.to_string().contains("number 2 of 3 is empty"),
        "{empty}"
    );
    assert!(matches!(
        HubUrls::parse::<&str>(&[], false),
        Err(ConfigError::NoHub)
    ));
    assert!(matches!(
        HubUrls::parse(&[" "], false),
        Err(ConfigError::NoHub)
    ));
    // The bad one is named, whichever it is.
    let bad = HubUrls::parse(&["wss://a", "http://b:3002/mesh/v1"], false).unwrap_err();
    assert!(
        bad.to_string().contains("\"http://b:3002/mesh/v1\""),
        "{bad}"
    );
    assert!(bad.to_string().contains("ws:// or wss://"), "{bad}");
    let plain = HubUrls::parse(&["wss://a", "ws://10.0.0.5:3002"], false).unwrap_err();
    assert!(matches!(plain, ConfigError::Insecure { ref url } if url == "ws://10.0.0.5:3002"));
}

#[test]
fn device_names_must_fit_a_header() {
    assert!(config::check_name("gpu1").is_ok());
    assert!(config::check_name("trainer-03.lab").is_ok());
    for bad in ["", "gpu 1", "gpu\n1", &"x".repeat(129)] {
        assert!(config::check_name(bad).is_err(), "{bad:?}");
    }
}

#[test]
fn the_token_is_never_in_debug_output_or_errors() {
    let t = Token::new("  tok_s3cret\n", "test").unwrap();
    assert_eq!(t.expose(), "tok_s3cret");
    assert!(!format!("{t:?}").contains("s3cret"));
    let e = Token::new("has space s3cret", "the file x").unwrap_err();
    assert!(!e.to_string().contains("s3cret"), "{e}");
}

#[test]
fn a_token_file_comes_before_the_credential_and_the_environment() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("token");
    std::fs::write(&file, "from-file\n").unwrap();
    let creds = dir.path().join("creds");
    std::fs::create_dir(&creds).unwrap();
    std::fs::write(creds.join("token"), "from-credential").unwrap();

    let (t, src) = config::load_token(Some(&file), Some(&creds), Some("from-env")).unwrap();
    assert_eq!(
        (t.expose(), src),
        ("from-file", TokenSource::File(file.clone()))
    );
    let (t, src) = config::load_token(None, Some(&creds), Some("from-env")).unwrap();
    assert_eq!(
        (t.expose(), src),
        (
            "from-credential",
            TokenSource::Credential(creds.join("token"))
        )
    );
    let empty = dir.path().join("no-creds");
    let (t, src) = config::load_token(None, Some(&empty), Some("from-env")).unwrap();
    assert_eq!((t.expose(), src), ("from-env", TokenSource::Environment));
    assert!(matches!(
        config::load_token(None, None, None),
        Err(ConfigError::NoToken)
    ));
    assert!(matches!(
        config::load_token(Some(&dir.path().join("missing")), None, Some("x")),
        Err(ConfigError::TokenFile { .. })
    ));
}

#[test]
fn home_defaults_to_dot_cortex() {
    assert_eq!(
        config::home_or_default(None, Some(PathBuf::from("/home/me"))).unwrap(),
        Path::new("/home/me/.cortex")
    );
    assert_eq!(
        config::home_or_default(Some(PathBuf::from("/x")), None).unwrap(),
        Path::new("/x")
    );
    assert!(config::home_or_default(None, None).is_err());
}

// ---------------------------------------------------------------- host facts

/// `/proc/driver/nvidia/gpus/0000:3b:00.0/information` as the 535 driver writes it.
const NVIDIA_INFORMATION: &str = "Model: \t\t NVIDIA A100-SXM4-40GB
IRQ:   \t\t 156
GPU UUID: \t GPU-6a1b2c3d-0000-1111-2222-333344445555
Video BIOS: \t 92.00.36.00.10
Bus Type: \t PCIe
DMA Size: \t 47 bits
DMA Mask: \t 0x7fffffffffff
Bus Location: \t 0000:3b:00.0
Device Minor: \t 0
GPU Excluded:\t No
";

#[test]
fn gpu_models_come_from_proc_driver_nvidia() {
    assert_eq!(
        host::parse_information(NVIDIA_INFORMATION).as_deref(),
        Some("NVIDIA A100-SXM4-40GB")
    );
    assert_eq!(host::parse_information("IRQ: 1\n"), None);
    assert_eq!(host::parse_information("Model:   \n"), None);

    let dir = tempfile::tempdir().unwrap();
    for (bus, model) in [
        ("0000:af:00.0", "NVIDIA H100"),
        ("0000:3b:00.0", "NVIDIA A100"),
    ] {
        let d = dir.path().join(bus);
        std::fs::create_dir(&d).unwrap();
        std::fs::write(
            d.join("information"),
            format!("Model: \t\t {model}\nIRQ: 1\n"),
        )
        .unwrap();
    }
    assert_eq!(
        host::proc_driver_nvidia(dir.path()),
        ["NVIDIA A100", "NVIDIA H100"],
        "in bus order"
    );
    assert!(host::proc_driver_nvidia(&dir.path().join("absent")).is_empty());
}

#[test]
fn nvidia_smi_output_is_one_name_per_line() {
    assert_eq!(
        host::parse_smi("NVIDIA A100-SXM4-40GB\nNVIDIA A100-SXM4-40GB\n\n"),
        ["NVIDIA A100-SXM4-40GB", "NVIDIA A100-SXM4-40GB"]
    );
    assert!(host::parse_smi("").is_empty());
}

#[tokio::test]
async fn host_facts_of_this_machine() {
    let h = host::gather().await;
    assert!(!h.hostname.is_empty());
    assert!(!h.kernel.is_empty());
    assert!(h.cpus >= 1);
}

#[test]
fn the_status_line_names_the_link_and_the_spool() {
    assert_eq!(
        notify::status_line("connected to ws://127.0.0.1:3002/mesh/v1", 3, 1),
        "connected to ws://127.0.0.1:3002/mesh/v1; 3 pending, 1 bad"
    );
}

// ---------------------------------------------------------------- link details

#[test]
fn close_reasons_fit_a_close_frame() {
    use cortex_protocol::mesh::CloseReason;
    let long = CloseReason {
        code: "ping_timeout".into(),
        message: "é\"".repeat(200),
        retry_after_ms: Some(5000),
    };
    let text = link::close_text(&long);
    assert!(text.len() <= 123, "{} bytes", text.len());
    let back: CloseReason = serde_json::from_str(&text).unwrap();
    assert_eq!(back.code, "ping_timeout");
    assert_eq!(back.retry_after_ms, Some(5000));
    let short = CloseReason {
        code: "shutting_down".into(),
        message: "bye".into(),
        retry_after_ms: None,
    };
    assert_eq!(
        serde_json::from_str::<CloseReason>(&link::close_text(&short)).unwrap(),
        short
    );
}

#[test]
fn certificate_errors_say_what_to_do() {
    assert!(link::tls_hint("invalid peer certificate: UnknownIssuer").contains("--ca-cert"));
    assert!(
        link::tls_hint("invalid peer certificate: Other(OtherError(CaUsedAsEndEntity))")
            .contains("CA:FALSE")
    );
    assert_eq!(link::tls_hint("Connection refused (os error 111)"), "");
}

#[test]
fn only_what_an_operator_must_fix_is_retried_near_the_cap() {
    use cortex_protocol::mesh::CloseReason;
    use link::{CloseInfo, ConnectError};
    let closed = |code: &str, retry: Option<u64>| {
        ConnectError::Closed(CloseInfo {
            code: 1008,
            reason: Some(CloseReason {
                code: code.into(),
                message: "m".into(),
                retry_after_ms: retry,
            }),
            text: String::new(),
        })
    };
    let unauthorized = ConnectError::Unauthorized {
        status: 403,
        reason: None,
    };
    assert!(unauthorized.needs_operator());
    assert!(unauthorized.to_string().contains("cortex device add NAME"));
    assert!(ConnectError::Version { hub: 2, ours: 1 }.needs_operator());
    assert!(closed("protocol_error", None).needs_operator());
    assert!(!closed("replaced", Some(30_000)).needs_operator());
    assert_eq!(
        closed("replaced", Some(30_000)).retry_after(),
        Some(Duration::from_secs(30))
    );
    assert!(!ConnectError::Timeout(Duration::from_secs(10)).needs_operator());
    assert_eq!(
        ConnectError::Http {
            status: 503,
            reason: None,
            retry_after: Some(Duration::from_secs(7)),
        }
        .retry_after(),
        Some(Duration::from_secs(7))
    );
}
