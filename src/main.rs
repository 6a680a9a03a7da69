//! The `abe` binary: a thin CLI over the library. Parses arguments, calls the library, and
//! turns library errors into messages and exit codes. No logic lives here.

use abe::config::{Config, FlagOverrides};
use clap::{Args, Parser, Subcommand};
use std::io::Write as _;
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
    /// Compare strategies on one workload in virtual time (deterministic simulator).
    #[command(
        long_about = "Runs one workload through several batching strategies with the real \
scheduling core in virtual time (no sleeping), each strategy on the identical request \
sequence generated from --seed, and reports throughput, latency percentiles, queue wait, \
SLA attainment, batch sizes, utilisation and refusals.",
        after_long_help = abe::sim::help::AFTER_HELP
    )]
    Simulate(SimulateArgs),
    /// Play a simulator workload open-loop against a live OpenAI-compatible server.
    #[command(
        long_about = "Sends the request sequence of a simulator scenario (same --scenario and \
--seed as `abe simulate`, so the same requests) to a live server's POST /v1/completions (or \
/v1/embeddings with --embeddings), each at its scheduled time whatever the server does (open loop: no coordinated omission), over a \
fixed pool of keep-alive connections. Latency runs from the scheduled send time to the \
response's last byte. Prints progress on stderr every second and the simulator's report \
columns at the end. This sends real traffic to --url; only loopback targets are accepted \
unless --allow-remote is given."
    )]
    Loadgen(LoadgenArgs),
    /// Print the roofline latency model's step times for a model on a GPU.
    #[command(
        long_about = "Prints what the `roofline` latency model charges (the same arithmetic \
the simulator and `abe serve` use): one replica's KV capacity and max_model_len, a decode \
step's time for several batch sizes at one context length, and a prompt's first token alone \
on the replica, prefilled in chunks. The defaults are `abe serve`'s in continuous mode \
(Llama-3.1-8B on one H100 SXM, prefill chunk 512)."
    )]
    Latency(LatencyArgs),
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
    /// Batching strategy: auto, fixed, queue_depth, latency_aware, dynamic, multi_bin (overrides batching.strategy).
    #[arg(long)]
    strategy: Option<String>,
    /// Number of simulated workers (overrides workers.count).
    #[arg(long)]
    workers: Option<usize>,
}

#[derive(Args, Debug)]
struct SimulateArgs {
    /// Built-in scenario name or path of a scenario TOML file (default: steady_state; with
    /// --trace, a replay base on Llama-3.1-8B / H100).
    #[arg(long)]
    scenario: Option<String>,
    /// Replay a trace file (abe's CSV/JSONL, an Azure LLM CSV or a Mooncake JSONL): its
    /// arrivals and request shapes replace the scenario's.
    #[arg(long, value_name = "FILE")]
    trace: Option<PathBuf>,
    /// Play the workload this many times faster (rates times it; a trace's timestamps
    /// divided by it).
    #[arg(long, value_name = "K")]
    rate_scale: Option<f64>,
    /// Comma-separated strategies to compare (default: all).
    #[arg(long, value_delimiter = ',')]
    strategies: Vec<String>,
    /// Seed for the workload, the latency noise and the core.
    #[arg(long, default_value_t = 7)]
    seed: u64,
    /// Requests to simulate (default: the scenario's; a trace's first N rows, default all).
    #[arg(long)]
    requests: Option<u64>,
    /// Latency model: none, linear, calibrated, max_of_batch, affine_step, roofline (default: the scenario's).
    #[arg(long, value_name = "MODEL")]
    latency_model: Option<String>,
    /// Latency-model parameter, key=value (repeatable; keys listed below).
    #[arg(long = "latency", value_name = "KEY=VALUE")]
    latency_params: Vec<String>,
    /// Number of workers (overrides the scenario).
    #[arg(long)]
    workers: Option<usize>,
    /// Most requests per batch (overrides the scenario).
    #[arg(long)]
    max_batch_size: Option<usize>,
    /// Latency target for SLA attainment, ms (default: the scenario's, 1000).
    #[arg(long)]
    sla_ms: Option<f64>,
    /// Batching mode: request (strategies form batches) or continuous (iteration-level; default: the scenario's).
    #[arg(long, value_name = "MODE")]
    mode: Option<abe::core::BatchingMode>,
    /// Continuous mode's goodput target for time to first token, ms (default: the scenario's, 500).
    #[arg(long)]
    ttft_target_ms: Option<f64>,
    /// Continuous mode's goodput target for time per output token, ms (default: the scenario's, 50).
    #[arg(long)]
    tpot_target_ms: Option<f64>,
    /// Sweep a key over values, key=v1,v2,... (repeatable: grid).
    #[arg(long, value_name = "KEY=V1,V2,...")]
    sweep: Vec<String>,
    /// Time-series window, ms.
    #[arg(long, default_value_t = 1000.0)]
    window_ms: f64,
    /// Runs executed in parallel (0: one per core). Results do not depend on it.
    #[arg(long, default_value_t = 0)]
    jobs: usize,
    /// Write the report as JSON.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
    /// Write the per-window time series as CSV.
    #[arg(long, value_name = "FILE")]
    csv: Option<PathBuf>,
    /// Write SVG charts into this folder.
    #[arg(long, value_name = "DIR")]
    svg: Option<PathBuf>,
}

#[derive(Args, Debug)]
struct LoadgenArgs {
    /// Base URL of the target server (plain http; loopback unless --allow-remote).
    #[arg(long, default_value = "http://127.0.0.1:8080")]
    url: String,
    /// Built-in scenario name or path of a scenario TOML file (as for `abe simulate`;
    /// default: steady_state, with --trace the same replay base as `abe simulate --trace`).
    #[arg(long)]
    scenario: Option<String>,
    /// Replay a trace file (as `abe simulate --trace`): its arrivals and shapes, and prompt
    /// text derived from its hash_ids (equal ids, equal text), so the server's prefix cache
    /// sees the trace's reuse.
    #[arg(long, value_name = "FILE")]
    trace: Option<PathBuf>,
    /// Seed of the workload (same seed, same requests as `abe simulate`).
    #[arg(long, default_value_t = 7)]
    seed: u64,
    /// Requests to send (default: the scenario's).
    #[arg(long)]
    requests: Option<u64>,
    /// Send only the requests scheduled within this many seconds.
    #[arg(long, value_name = "SECONDS")]
    duration: Option<f64>,
    /// Connections (one thread and one keep-alive connection each).
    #[arg(long, default_value_t = 64)]
    connections: usize,
    /// Closed loop: this many clients, each sending its next request as soon as (or
    /// --think-ms after) the answer to its last; stops after --requests or --duration.
    /// Default: the scenario's clients if its arrivals are `closed`, else open loop.
    #[arg(long, value_name = "N")]
    clients: Option<usize>,
    /// Closed loop: think time between an answer and the client's next request, ms.
    #[arg(long, value_name = "MS")]
    think_ms: Option<f64>,
    /// Play the workload this many times faster, as `abe simulate --rate-scale` does (rates
    /// times it; a trace's timestamps divided by it), so both replay one sequence.
    #[arg(long, default_value_t = 1.0)]
    rate_scale: f64,
    /// Switch the target to this strategy first (POST /admin/strategy/NAME).
    #[arg(long, value_name = "NAME")]
    strategy: Option<String>,
    /// Bearer token for the target's /admin endpoints (default: $ABE_LOADGEN_ADMIN_TOKEN,
    /// which keeps it out of the process list).
    #[arg(long, value_name = "TOKEN")]
    admin_token: Option<String>,
    /// `model` field of every request (default: omitted).
    #[arg(long)]
    model: Option<String>,
    /// Latency target for SLA attainment, ms (default: the scenario's).
    #[arg(long)]
    sla_ms: Option<f64>,
    /// A request not answered within this many ms of its send fails with `timeout`.
    #[arg(long, default_value_t = 60_000.0)]
    timeout_ms: f64,
    /// Omit abe's request extensions (`priority`, `predicted_output_tokens`).
    #[arg(long)]
    no_extensions: bool,
    /// Send POST /v1/embeddings (the prompt as `input`) instead of /v1/completions.
    #[arg(long)]
    embeddings: bool,
    /// Allow a target that is not a loopback address.
    #[arg(long)]
    allow_remote: bool,
    /// No progress lines on stderr.
    #[arg(long, short)]
    quiet: bool,
    /// Write the report as JSON.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
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

fn flags(args: &ServeArgs) -> FlagOverrides {
    FlagOverrides {
        host: args.host.clone(),
        port: args.port,
        strategy: args.strategy.clone(),
        workers: args.workers,
    }
}

/// The effective config, validated (`config check`, `config show`).
fn load(args: &ServeArgs) -> Result<Config, abe::config::ConfigError> {
    Config::load(args.config.as_deref(), std::env::vars(), &flags(args))
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
    // Checked once, by `Running::start`.
    let config = Config::layered(args.config.as_deref(), std::env::vars(), &flags(args))
        .map_err(|e| e.to_string())?;
    let signals = abe::serve::install_signals().map_err(|e| e.to_string())?;
    let running = abe::serve::Running::start(config).map_err(|e| e.to_string())?;
    // A reload (SIGHUP, POST /admin/reload) reads file, environment and flags as above.
    let (file, overrides) = (args.config.clone(), flags(args));
    running.set_config_source(Box::new(move || {
        Config::layered(file.as_deref(), std::env::vars(), &overrides)
    }));
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

fn simulate(args: &SimulateArgs) -> Result<(), String> {
    let scenario = match (&args.scenario, &args.trace) {
        (Some(s), _) => s.clone(),
        // An empty name: the trace's replay base.
        (None, Some(_)) => String::new(),
        (None, None) => "steady_state".into(),
    };
    let opts = abe::sim::SimulateOptions {
        scenario,
        strategies: args.strategies.clone(),
        seed: args.seed,
        requests: args.requests,
        trace: args.trace.clone(),
        rate_scale: args.rate_scale,
        latency_model: args.latency_model.clone(),
        latency_params: args.latency_params.clone(),
        engine: abe::sim::settings::EngineSettings {
            workers: args.workers,
            max_batch_size: args.max_batch_size,
            mode: args.mode,
            ..Default::default()
        },
        sla_ms: args.sla_ms,
        ttft_target_ms: args.ttft_target_ms,
        tpot_target_ms: args.tpot_target_ms,
        sweep: args.sweep.clone(),
        window_ms: args.window_ms,
        jobs: args.jobs,
    };
    let report = abe::sim::simulate(&opts).map_err(|e| e.to_string())?;
    // A closed stdout (`| head`) must not stop the files from being written.
    let mut stdout = std::io::stdout().lock();
    let _ = write!(stdout, "{}", report.table());
    let paths = abe::sim::output::OutputPaths {
        json: args.json.clone(),
        csv: args.csv.clone(),
        svg_dir: args.svg.clone(),
    };
    for file in abe::sim::output::write_outputs(&report, &paths).map_err(|e| e.to_string())? {
        let _ = writeln!(stdout, "wrote {}", file.display());
    }
    Ok(())
}

fn loadgen(args: &LoadgenArgs) -> Result<(), String> {
    let opts = abe::loadgen::LoadgenOptions {
        url: args.url.clone(),
        scenario: match (&args.scenario, &args.trace) {
            (Some(s), _) => s.clone(),
            (None, Some(_)) => String::new(),
            (None, None) => "steady_state".into(),
        },
        trace: args.trace.clone(),
        seed: args.seed,
        requests: args.requests,
        duration_s: args.duration,
        connections: args.connections,
        clients: args.clients,
        think_ms: args.think_ms,
        rate_scale: args.rate_scale,
        strategy: args.strategy.clone(),
        admin_token: args
            .admin_token
            .clone()
            .or_else(|| std::env::var("ABE_LOADGEN_ADMIN_TOKEN").ok()),
        sla_ms: args.sla_ms,
        timeout_ms: args.timeout_ms,
        body: abe::loadgen::prompt::BodyOptions {
            model: args.model.clone(),
            abe_extensions: !args.no_extensions,
            embeddings: args.embeddings,
        },
        allow_remote: args.allow_remote,
    };
    let quiet = args.quiet;
    let report = abe::loadgen::run(&opts, &mut |p| {
        if !quiet {
            eprintln!("{}", p.line());
        }
    })
    .map_err(|e| e.to_string())?;
    // A closed stdout (`| head`) must not stop the report file from being written.
    let mut stdout = std::io::stdout().lock();
    let _ = write!(stdout, "{}", report.table());
    if let Some(path) = &args.json {
        report.write_json(path).map_err(|e| e.to_string())?;
        let _ = writeln!(stdout, "wrote {}", path.display());
    }
    Ok(())
}

#[derive(Args, Debug)]
struct LatencyArgs {
    /// Model preset (as `[workers] llm`).
    #[arg(long, default_value = "llama-3.1-8b")]
    llm: String,
    /// GPU preset (as `[workers] gpu`).
    #[arg(long, default_value = "h100-sxm")]
    gpu: String,
    /// GPUs one replica is sharded over (tensor parallelism).
    #[arg(long, default_value_t = 1)]
    tp: u32,
    /// Achieved / peak FLOP/s, in (0, 1].
    #[arg(long, default_value_t = abe::exec::roofline::Roofline::DEFAULT.flops_efficiency)]
    flops_efficiency: f64,
    /// Achieved / peak memory bandwidth, in (0, 1].
    #[arg(long, default_value_t = abe::exec::roofline::Roofline::DEFAULT.bandwidth_efficiency)]
    bandwidth_efficiency: f64,
    /// Context each decoding sequence holds, tokens.
    #[arg(long, default_value_t = 800)]
    context: u32,
    /// Batch sizes to time, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,16,64,256")]
    batch: Vec<u32>,
    /// Prompt whose first token is timed, tokens.
    #[arg(long, default_value_t = 750)]
    prompt: u32,
    /// Prefill chunk, tokens (`continuous.prefill_chunk`).
    #[arg(long, default_value_t = 512)]
    prefill_chunk: u32,
}

fn latency(args: &LatencyArgs) -> Result<(), String> {
    use abe::exec::roofline::{explain, Roofline};
    let r = Roofline {
        llm: args.llm.parse()?,
        gpu: args.gpu.parse()?,
        tp: args.tp,
        flops_efficiency: args.flops_efficiency,
        bandwidth_efficiency: args.bandwidth_efficiency,
    };
    r.check()?;
    if args.prefill_chunk == 0 {
        return Err("--prefill-chunk must be at least 1".into());
    }
    let e = explain::Explain {
        context: args.context,
        batches: args.batch.clone(),
        prompt: args.prompt,
        prefill_chunk: args.prefill_chunk,
    };
    print!("{}", explain::render(&r, &e));
    Ok(())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logs();
    let result = match &cli.command {
        Command::Serve(args) => serve(args),
        Command::Simulate(args) => simulate(args),
        Command::Loadgen(args) => loadgen(args),
        Command::Latency(args) => latency(args),
        Command::Config(ConfigCommand::Check { file }) => {
            let args = ServeArgs {
                config: Some(file.clone()),
                ..Default::default()
            };
            Config::layered(args.config.as_deref(), std::env::vars(), &flags(&args))
                .and_then(Config::check)
                .map(|s| {
                    if let Some(w) = s.routing_warning {
                        eprintln!("abe: warning: {w}");
                    }
                    println!("{}: ok", file.display())
                })
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
