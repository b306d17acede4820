//! The exec launcher as the agent runs it: `cortex-device-agent --cortex-exec-launch
//! PROGRAM ARGV0 ARGS…` leads a new session, keeps its pid (it `exec`s in place) and hands
//! the command its argv[0]; a program that cannot run is one line on stderr and exit 127.
//! (This file also makes Cargo build the binary, which the agent's own exec tests launch.)

use std::process::Command;

const AGENT: &str = env!("CARGO_BIN_EXE_cortex-device-agent");

/// Field `n` (1-based, as proc(5) counts) of a /proc/PID/stat line.
fn stat_field(stat: &str, n: usize) -> String {
    let after = &stat[stat.rfind(')').expect("comm") + 1..];
    after
        .split_whitespace()
        .nth(n - 3)
        .expect("field")
        .to_owned()
}

#[test]
fn the_launcher_leads_a_new_session_and_becomes_the_command() {
    // Prints its $0, its pid, and its /proc stat line.
    let script = r#"echo "$0 $$"; cat /proc/$$/stat"#;
    let child = Command::new(AGENT)
        .args(["--cortex-exec-launch", "/bin/sh", "my-name", "-c", script])
        .output()
        .expect("run the launcher");
    assert!(child.status.success(), "{child:?}");
    let out = String::from_utf8(child.stdout).expect("utf8");
    let (first, stat) = out.split_once('\n').expect("two lines");
    let (name, pid) = first.split_once(' ').expect("name pid");
    assert_eq!(name, "my-name");
    // pid == pgrp == session: the leader of its own session and group.
    assert_eq!(stat_field(stat, 5), pid, "{out}");
    assert_eq!(stat_field(stat, 6), pid, "{out}");
    let mine = std::fs::read_to_string("/proc/self/stat").expect("stat");
    assert_ne!(stat_field(&mine, 6), pid);
}

#[test]
fn a_program_that_cannot_run_exits_127_saying_why() {
    let out = Command::new(AGENT)
        .args(["--cortex-exec-launch", "/nonexistent/prog", "prog"])
        .output()
        .expect("run the launcher");
    assert_eq!(out.status.code(), Some(127));
    let err = String::from_utf8(out.stderr).expect("utf8");
    assert!(err.contains("cannot run /nonexistent/prog"), "{err}");
    let out = Command::new(AGENT)
        .arg("--cortex-exec-launch")
        .output()
        .expect("run the launcher");
    assert_eq!(out.status.code(), Some(127));
}
