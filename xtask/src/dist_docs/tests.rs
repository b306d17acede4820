//! The generated completions and man pages exist and name every subcommand; every
//! command of the four binaries documents its positional arguments and shows an example.

use super::*;

/// Every command of `cmd`'s tree (itself included) with its path, leaving out clap's own
/// `help`.
fn walk(cmd: &clap::Command, path: &str, all: &mut Vec<(String, clap::Command)>) {
    all.push((path.to_string(), cmd.clone()));
    for sub in cmd.get_subcommands() {
        if sub.get_name() != "help" {
            walk(sub, &format!("{path} {}", sub.get_name()), all);
        }
    }
}

fn every_command() -> Vec<(String, clap::Command)> {
    let mut all = Vec::new();
    for cmd in commands() {
        let name = cmd.get_name().to_string();
        walk(&cmd, &name, &mut all);
    }
    all
}

#[test]
fn every_positional_argument_has_help_text() {
    let mut missing = Vec::new();
    for (path, cmd) in every_command() {
        for arg in cmd.get_arguments().filter(|a| a.is_positional()) {
            let help = arg.get_help().map(|h| h.to_string()).unwrap_or_default();
            if help.trim().is_empty() {
                missing.push(format!("{path} <{}>", arg.get_id()));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "positional arguments without help: {missing:?}"
    );
}

#[test]
fn every_command_has_a_description_and_an_example() {
    let mut missing = Vec::new();
    let all = every_command();
    assert!(all.len() > 20, "the tree was walked: {}", all.len());
    for (path, cmd) in all {
        let about = cmd.get_about().map(|a| a.to_string()).unwrap_or_default();
        let after = cmd
            .get_after_help()
            .map(|a| a.to_string())
            .unwrap_or_default();
        if about.trim().is_empty() {
            missing.push(format!("{path}: no description"));
        }
        if !after.contains("Examples:") {
            missing.push(format!("{path}: no example"));
        }
    }
    assert!(missing.is_empty(), "{missing:#?}");
}

#[test]
fn the_daemons_help_names_their_environment_and_files() {
    for cmd in commands().into_iter().skip(2) {
        let help = cmd.clone().render_long_help().to_string();
        assert!(help.contains("RUST_LOG"), "{}: {help}", cmd.get_name());
    }
    let hub = cortex_hub::cli::Args::command()
        .render_long_help()
        .to_string();
    for word in [
        "CORTEX_WEBHOOK_TOKEN",
        "settings.json",
        "CORTEX_HOME",
        "WEBHOOK_PORT",
    ] {
        assert!(hub.contains(word), "cortex-hub --help names {word}");
    }
    let agent = cortex_device_agent::cli::Args::command()
        .render_long_help()
        .to_string();
    for word in ["CORTEX_DEVICE_TOKEN", "CREDENTIALS_DIRECTORY", "waits.json"] {
        assert!(
            agent.contains(word),
            "cortex-device-agent --help names {word}"
        );
    }
}

#[test]
fn completions_and_man_pages_are_generated() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let written = completions(&tmp.path().join("completions")).expect("completions");
    for file in [
        "cortex.bash",
        "_cortex",
        "cortex.fish",
        "cortex-signal.bash",
        "cortex-hub.bash",
        "_cortex-device-agent",
        "_cortex.ps1",
        "cortex.elv",
    ] {
        let path = tmp.path().join("completions").join(file);
        assert!(path.is_file(), "{} in {written:?}", path.display());
    }
    let bash = std::fs::read_to_string(tmp.path().join("completions/cortex.bash")).expect("read");
    assert!(
        bash.contains("--must-exist"),
        "flags of subcommands are completed"
    );

    let man_dir = tmp.path().join("man");
    man(&man_dir).expect("man");
    for (path, cmd) in every_command() {
        let file = man_dir.join(format!("{}.1", path.replace(' ', "-")));
        let text =
            std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        assert!(
            text.starts_with(".ie") || text.contains(".TH"),
            "{}",
            file.display()
        );
        // A page names each of its subcommands.
        for sub in cmd.get_subcommands().filter(|s| s.get_name() != "help") {
            assert!(
                // roff writes a name's hyphens escaped (`mcp\-token`).
                text.contains(sub.get_name()) || text.contains(&sub.get_name().replace('-', "\\-")),
                "{} does not name {}",
                file.display(),
                sub.get_name()
            );
        }
    }
    let top = std::fs::read_to_string(man_dir.join("cortex.1")).expect("cortex.1");
    for sub in [
        "sessions",
        "session",
        "wait",
        "devices",
        "device",
        "approvals",
        "answer",
        "chat",
    ] {
        assert!(top.contains(sub), "cortex.1 names {sub}");
    }
    let wait_for = std::fs::read_to_string(man_dir.join("cortex-wait-for.1")).expect("page");
    assert!(
        wait_for.contains("Exit status"),
        "the after-help is on the page"
    );
}
