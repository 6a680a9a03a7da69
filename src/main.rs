//! The `abe` binary: a thin CLI over the library. Parses arguments, calls the library, and
//! turns library errors into messages and exit codes. No logic lives here.

use abe::config::{Config, FlagOverrides};
use clap::{Args, Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser, Debug)]
#[command(
    name = "abe",
    version = abe::build_info::VERSION_LINE,
    about = "abe: an adaptive batching engine for LLM inference (OpenAI-compatible server)"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run the OpenAI-compatible server (embedded defaults; no config file needed).
    Serve(ServeArgs),
    /// Validate or print configuration.
    #[command(subcommand)]
    Config(ConfigCommand),
    /// Print build information (version, git revision, profile).
    Version,
}

#[derive(Args, Debug, Default)]
struct ServeArgs {
    /// TOML config file (every key is documented in config.toml).
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Address to bind (overrides server.host).
    #[arg(long)]
    host: Option<String>,
    /// Port to listen on, 0 for any free port (overrides server.port).
    #[arg(long)]
    port: Option<u16>,
    /// Batching strategy: fixed, queue_depth, latency_aware (overrides batching.strategy).
    #[arg(long)]
    strategy: Option<String>,
    /// Number of simulated workers (overrides workers.count).
    #[arg(long)]
    workers: Option<usize>,
}

#[derive(Subcommand, Debug)]
enum ConfigCommand {
    /// Validate a config file (with ABE_* overrides applied); exit 1 with the reason if bad.
    Check {
        /// The TOML file to check.
        file: PathBuf,
    },
    /// Print the effective configuration (defaults, file, ABE_* environment, flags).
    Show(ServeArgs),
}

fn load(args: &ServeArgs) -> Result<Config, abe::config::ConfigError> {
    let flags = FlagOverrides {
        host: args.host.clone(),
        port: args.port,
        strategy: args.strategy.clone(),
        workers: args.workers,
    };
    Config::load(args.config.as_deref(), std::env::vars(), &flags)
}

fn init_logs() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
}

fn serve(args: &ServeArgs) -> Result<(), String> {
    let config = load(args).map_err(|e| e.to_string())?;
    let signals = abe::serve::install_signals().map_err(|e| e.to_string())?;
    let running = abe::serve::Running::start(config).map_err(|e| e.to_string())?;
    println!("abe listening on http://{}", running.local_addr());
    tracing::info!(
        addr = %running.local_addr(),
        version = abe::build_info::VERSION_LINE,
        "abe serving"
    );
    let report = running.run_until_signal(signals);
    tracing::info!(
        completed = report.completed,
        failed = report.failed,
        aborted = report.aborted,
        clean = report.clean,
        "abe stopped"
    );
    Ok(())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logs();
    let result = match &cli.command {
        Command::Serve(args) => serve(args),
        Command::Config(ConfigCommand::Check { file }) => {
            let args = ServeArgs {
                config: Some(file.clone()),
                ..Default::default()
            };
            load(&args)
                .map(|_| println!("{}: ok", file.display()))
                .map_err(|e| e.to_string())
        }
        Command::Config(ConfigCommand::Show(args)) => load(args)
            .map(|c| print!("{}", c.to_toml()))
            .map_err(|e| e.to_string()),
        Command::Version => {
            println!("abe {}", abe::build_info::VERSION_LINE);
            Ok(())
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("abe: {message}");
            ExitCode::FAILURE
        }
    }
}
