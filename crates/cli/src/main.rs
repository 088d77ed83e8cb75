//! `fencelock`, the command-line tool for a fencelock cluster.
//!
//! It owns argument parsing, output (plain or `--json`: one JSON object on
//! stdout) and exit codes; every call goes through `fencelock-client`. It
//! owns no protocol logic of its own.
//!
//! ```text
//! fencelock lock jobs/nightly --ttl 10s -- ./nightly.sh   # run while holding
//! fencelock acquire jobs/x --ttl 1m                        # prints the token
//! fencelock elect svc/leader --value h1:80 -- ./serve.sh    # run while leading
//! fencelock observe svc/leader                              # print each leader
//! fencelock release jobs/x --token 42
//! fencelock status --endpoints h1:7101,h2:7101,h3:7101
//! fencelock cert create-ca --certs-dir certs                 # then create-node, create-client
//! fencelock snapshot save backup.flkt                       # fencelockd --restore backup.flkt
//! S=$(fencelock session open --ttl 10s)                      # many locks, one keep-alive
//! fencelock acquire jobs/a --session $S; fencelock session keepalive $S --every 3s
//! ```
//!
//! Exit codes: 0 done; 1 error (cluster unreachable, bad arguments, refused
//! request); 2 not obtained (held by another owner, the wait timed out,
//! `check` answering no, `release` or `renew` of a lock not held; `status`
//! with nodes answering but no leader, or a leader without a quorum); 3 the
//! lock was lost while `lock`'s command ran; 4 no such session (`session
//! keepalive`/`close` of a session that is not open, `acquire --session`
//! under one). Otherwise `lock` exits with its
//! command's code (128+N if the command died of signal N); its
//! `--conflict-exit-code` and `--lost-exit-code` replace 2 and 3, and its
//! JSON goes to stderr or `--json-file`, never to its command's stdout.

mod args;
mod cert;
mod commands;
mod elect;
mod lock;
mod members;
mod output;
mod snapshot;
mod watchdog;

use std::process::ExitCode;

use anyhow::Result;
use clap::Parser;

use crate::args::{Cli, Command};
use crate::output::{error_exit_code, error_json, Exit, EXIT_ERROR};

fn main() -> ExitCode {
    // `fencelock lock`'s watchdog, started by it, not by users.
    if std::env::args_os().nth(1).is_some_and(|first| first == watchdog::WATCHDOG_COMMAND) {
        let rest: Vec<String> =
            std::env::args_os().skip(2).map(|arg| arg.to_string_lossy().into_owned()).collect();
        return watchdog::run(&rest);
    }
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(error) => {
            let _ = error.print();
            // Help and version are not errors; everything else is exit 1,
            // not clap's 2, which here means "not obtained".
            return ExitCode::from(if error.use_stderr() { EXIT_ERROR } else { 0 });
        }
    };
    match run(&cli) {
        Ok(exit) => ExitCode::from(exit.code()),
        Err(error) => {
            eprintln!("fencelock: {error:#}");
            match &cli.command {
                // `lock`'s stdout is its command's.
                Command::Lock(args) => {
                    if let Err(sink) = lock::emit_json(&cli, args, &error_json(&error)) {
                        eprintln!("fencelock: {sink:#}");
                    }
                }
                Command::Elect(args) => {
                    if let Err(sink) = lock::emit_json(&cli, &args.as_lock(), &error_json(&error)) {
                        eprintln!("fencelock: {sink:#}");
                    }
                }
                _ if cli.json => commands::print_json(&error_json(&error)),
                _ => {}
            }
            ExitCode::from(error_exit_code(&error))
        }
    }
}

fn run(cli: &Cli) -> Result<Exit> {
    match &cli.command {
        Command::Lock(args) => lock::run(cli, args),
        Command::Acquire(args) => commands::acquire(cli, args),
        Command::Release(args) => commands::release(cli, args),
        Command::Renew(args) => commands::renew(cli, args),
        Command::Get(args) => commands::get(cli, args),
        Command::Check(args) => commands::check(cli, args),
        Command::List(args) => commands::list(cli, args),
        Command::Status => commands::status(cli),
        Command::Cert(command) => cert::run(cli, command),
        Command::Snapshot(command) => snapshot::run(cli, command),
        Command::Member(command) => members::run(cli, command),
        Command::Leader(command) => members::run_leader(cli, command),
        Command::Elect(args) => elect::elect(cli, args),
        Command::Observe(args) => elect::observe(cli, args),
        Command::Proclaim(args) => elect::proclaim(cli, args),
        Command::Watch(args) => elect::watch(cli, args),
        Command::Session(command) => commands::session(cli, command),
    }
}
