//! The `abe` binary: a thin CLI over the library. Parses arguments, calls the library, and
//! turns library errors into messages and exit codes. No logic lives here.

use clap::{Parser, Subcommand};
use std::process::ExitCode;

#[derive(Parser, Debug)]
#[command(name = "abe", version = abe::build_info::VERSION_LINE, about = "Adaptive batching engine for LLM inference")]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Print build information (version, git revision, profile).
    Version,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Some(Command::Version) | None => {
            println!("abe {}", abe::build_info::VERSION_LINE);
            ExitCode::SUCCESS
        }
    }
}
