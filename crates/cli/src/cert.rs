//! `fencelock cert`: makes a cluster's certificates with `fencelock-tls`,
//! and says which files it wrote (plain, or `{"written": [...]}` with
//! `--json`).

use anyhow::{Context, Result};
use fencelock_tls::{create_ca_named, create_client_for, create_node_for, Layout};
use serde_json::json;

use crate::args::{CertCommand, Cli};
use crate::commands::print_json;
use crate::output::Exit;

pub fn run(cli: &Cli, command: &CertCommand) -> Result<Exit> {
    let dir = cli.certs_dir.as_ref().context("name the certificates directory with --certs-dir DIR")?;
    let layout = Layout::new(dir);
    let written = match command {
        CertCommand::CreateCa { overwrite, cluster } => {
            create_ca_named(&layout, cluster.as_deref(), overwrite.overwrite)?
        }
        CertCommand::CreateNode { overwrite, lifetime, id, hosts, cluster } => {
            create_node_for(&layout, *id, hosts, overwrite.overwrite, lifetime.lifetime, cluster.as_deref())?
        }
        CertCommand::CreateClient { overwrite, lifetime, name, cluster } => {
            create_client_for(&layout, name, overwrite.overwrite, lifetime.lifetime, cluster.as_deref())?
        }
    };
    // The cluster the new certificate names (docs/security.md,
    // "Cluster-bound identity"): a CA rotation must name it again.
    let cluster = written
        .first()
        .and_then(|path| std::fs::read(path).ok())
        .and_then(|pem| fencelock_tls::cluster_of_pem(&pem));
    if cli.json {
        let paths: Vec<String> = written.iter().map(|path| path.display().to_string()).collect();
        let mut out = json!({ "written": paths });
        if let (Some(cluster), Some(object)) = (&cluster, out.as_object_mut()) {
            object.insert("cluster".into(), json!(cluster));
        }
        print_json(&out);
    } else {
        for path in &written {
            println!("wrote {}", path.display());
        }
        if let Some(cluster) = &cluster {
            println!("cluster {cluster}");
        }
    }
    Ok(Exit::Done)
}
