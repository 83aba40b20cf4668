use std::{path::PathBuf, process::ExitCode};

use clap::{Parser, Subcommand, ValueEnum};
use nodeward_agent::{check, config::Config};

/// nodeward's node agent.
#[derive(Parser)]
#[command(name = "nodeward-agent", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run every local detector once on this machine (no cluster needed), print the findings
    /// and exit 1 if a problem was found, 2 if the configuration is invalid.
    Check {
        /// Configuration file (default: /etc/nodeward/agent.yaml when it exists).
        #[arg(long, env = "NODEWARD_CONFIG")]
        config: Option<PathBuf>,
        /// Output format.
        #[arg(long, short, value_enum, default_value_t = Output::Table)]
        output: Output,
    },
}

#[derive(Clone, Copy, ValueEnum)]
enum Output {
    Table,
    Json,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Check { config, output } => {
            let config = match Config::load(config.as_deref()) {
                Ok(c) => c,
                Err(e) => {
                    eprintln!("nodeward-agent: {e}");
                    return ExitCode::from(2);
                }
            };
            let runtime = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(r) => r,
                Err(e) => {
                    eprintln!("nodeward-agent: cannot start the async runtime: {e}");
                    return ExitCode::FAILURE;
                }
            };
            let findings = runtime.block_on(check::run(&config));
            match output {
                Output::Table => print!("{}", check::render_table(&findings)),
                Output::Json => println!("{}", check::render_json(&findings)),
            }
            ExitCode::from(check::exit_code(&findings))
        }
    }
}
