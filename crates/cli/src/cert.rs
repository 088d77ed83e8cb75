//! `fencelock cert`: makes a cluster's certificates with `fencelock-tls`,
//! and says which files it wrote (plain, or `{"written": [...]}` with
//! `--json`).

use anyhow::Result;
use fencelock_tls::{create_ca, create_client, create_node, Layout};
use serde_json::json;

use crate::args::{CertCommand, Cli};
use crate::commands::print_json;
use crate::output::Exit;

pub fn run(cli: &Cli, command: &CertCommand) -> Result<Exit> {
    let written = match command {
        CertCommand::CreateCa(dir) => create_ca(&Layout::new(&dir.certs_dir), dir.overwrite)?,
        CertCommand::CreateNode { dir, id, hosts } => {
            create_node(&Layout::new(&dir.certs_dir), *id, hosts, dir.overwrite)?
        }
        CertCommand::CreateClient { dir, name } => {
            create_client(&Layout::new(&dir.certs_dir), name, dir.overwrite)?
        }
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
