//! `cortex-signal`: signals a waitpoint. Thin: the logic is `cortex_cli::signal`.

use std::io::Write;
use std::process::ExitCode;

use cortex_cli::signal::{self, SignalArgs, SignalEnv};

fn main() -> ExitCode {
    // Run with no arguments, it prints its help and sends nothing (a usage error).
    if std::env::args_os().len() <= 1 {
        let _ = write!(std::io::stderr(), "{}", signal::help());
        return ExitCode::from(2);
    }
    let args = <SignalArgs as clap::Parser>::parse();
    let env = SignalEnv::from_process();
    let outcome = signal::run(
        &args,
        &env,
        &mut std::io::stdin().lock(),
        &mut std::io::stderr().lock(),
    );
    ExitCode::from(outcome.exit_code())
}
