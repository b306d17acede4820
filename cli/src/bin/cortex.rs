//! `cortex`: the operator's and agent's command line. Thin: the logic is `cortex_cli::cmd`.

use std::process::ExitCode;

use clap::Parser;
use cortex_cli::cmd::{self, Cli, CortexEnv};

fn main() -> ExitCode {
    let cli = Cli::parse();
    let env = CortexEnv::from_process();
    // Stdout is not held locked: `cortex mcp` writes it from several threads.
    let code = cmd::run(
        &cli,
        &env,
        &mut std::io::stdout(),
        &mut std::io::stderr().lock(),
    );
    ExitCode::from(code)
}
