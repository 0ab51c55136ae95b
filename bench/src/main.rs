//! `kaas-bench`: see the library's documentation and `bench/README.md`.

use std::process::ExitCode;

use anyhow::Context;
use clap::Parser;
use kaas_bench::args::Cli;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let opts = cli.mode.opts();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(opts.threads as usize)
        .enable_all()
        .build()
        .expect("building the tokio runtime");
    kaas_bench::pacer::epoch();
    let result = runtime.block_on(async {
        let r = kaas_bench::run::run(&cli.mode).await?;
        print!("{}", r.report.table());
        if let Some(path) = &cli.mode.opts().json {
            let json = serde_json::to_string_pretty(&r.report)?;
            std::fs::write(path, json + "\n")
                .with_context(|| format!("writing {}", path.display()))?;
        }
        anyhow::Ok(r.ok)
    });
    // Tasks blocked on a dead broker must not keep the process alive.
    runtime.shutdown_timeout(std::time::Duration::from_millis(100));
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("kaas-bench: {e:#}");
            ExitCode::from(2)
        }
    }
}
