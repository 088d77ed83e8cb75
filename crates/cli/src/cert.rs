//! `fencelock cert`: makes a cluster's certificates with `fencelock-tls`,
//! and says which files it wrote (plain, or `{"written": [...]}` with
//! `--json`).

use anyhow::{Context, Result};
use fencelock_tls::{create_ca, create_client, create_node, Layout};
use serde_json::json;

use crate::args::{CertCommand, Cli};
use crate::commands::print_json;
use crate::output::Exit;

pub fn run(cli: &Cli, command: &CertCommand) -> Result<Exit> {
    let dir = cli.certs_dir.as_ref().context("name the certificates directory with --certs-dir DIR")?;
    let layout = Layout::new(dir);
    let written = match command {
        CertCommand::CreateCa(overwrite) => create_ca(&layout, overwrite.overwrite)?,
        CertCommand::CreateNode { overwrite, id, hosts } => {
            create_node(&layout, *id, hosts, overwrite.overwrite)?
        }
        CertCommand::CreateClient { overwrite, name } => create_client(&layout, name, overwrite.overwrite)?,
    };
    if cli.json {
        let paths: Vec<String> = written.iter().map(|path| path.display().to_string()).collect();
        print_json(&json!({ "written": paths }));
    } else {
        for path in &written {
            println!("wrote {}", path.display());
        }
    }
    Ok(Exit::Done)
}
