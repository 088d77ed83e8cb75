//! `fencelock member list | add | remove | promote` and `fencelock leader
//! transfer`: membership and leadership, on the leader (admins only under
//! TLS). Each change is one raft conf change; a retried change that already
//! applied is answered with the membership as it is.

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use fencelock_client::Membership;
use serde_json::json;

use crate::args::Cli;
use crate::commands::{connect, print_json};
use crate::output::Exit;

#[derive(Debug, Subcommand)]
pub enum MemberCommand {
    /// List the members: id, role (voter or learner), peer and client
    /// addresses. With --json: {"members": [...], "index": N}.
    List,
    /// Add node ID as a learner: it takes the log but does not vote until
    /// promoted. Start it with `fencelockd --id ID --join ENDPOINTS`, which
    /// also adds it (this command is for adding it ahead).
    Add(AddArgs),
    /// Remove node ID, voter or learner. Removing the leader hands
    /// leadership over first. The removed node stops (exit code 3).
    Remove(IdArg),
    /// Make learner ID a voter, once it has caught up (retried until then,
    /// within --retry-for).
    Promote(IdArg),
}

#[derive(Debug, Args)]
pub struct AddArgs {
    /// The new node's id (never reuse a removed node's).
    pub id: u64,
    /// HOST:PORT where peers reach it.
    pub peer_addr: String,
    /// HOST:PORT where clients reach it.
    pub client_addr: String,
}

#[derive(Debug, Args)]
pub struct IdArg {
    /// The node's id.
    pub id: u64,
}

#[derive(Debug, Subcommand)]
pub enum LeaderCommand {
    /// Hand leadership to voter ID; prints the new leader once it leads.
    Transfer(IdArg),
}

pub fn run(cli: &Cli, command: &MemberCommand) -> Result<Exit> {
    let client = connect(cli)?;
    let (what, membership) = match command {
        MemberCommand::List => ("list", client.member_list().context("cannot list the members")?),
        MemberCommand::Add(args) => (
            "added",
            client
                .member_add(args.id, &args.peer_addr, &args.client_addr)
                .with_context(|| format!("cannot add node {}", args.id))?,
        ),
        MemberCommand::Remove(args) => (
            "removed",
            client.member_remove(args.id).with_context(|| format!("cannot remove node {}", args.id))?,
        ),
        MemberCommand::Promote(args) => (
            "promoted",
            client.member_promote(args.id).with_context(|| format!("cannot promote node {}", args.id))?,
        ),
    };
    if cli.json {
        print_json(&members_json(&membership));
    } else {
        if what != "list" {
            println!("{what}; members at index {}:", membership.index);
        }
        for member in &membership.members {
            let peer = if member.peer_addr.is_empty() { "-" } else { &member.peer_addr };
            let client_addr = if member.client_addr.is_empty() { "-" } else { &member.client_addr };
            println!("{}  {}  peer {}  client {}", member.id, member.role, peer, client_addr);
        }
    }
    Ok(Exit::Done)
}

pub fn run_leader(cli: &Cli, command: &LeaderCommand) -> Result<Exit> {
    let LeaderCommand::Transfer(args) = command;
    let client = connect(cli)?;
    let leader = client
        .leader_transfer(args.id)
        .with_context(|| format!("cannot hand leadership to node {}", args.id))?;
    if cli.json {
        print_json(&json!({ "leader_id": leader }));
    } else {
        println!("node {leader} leads");
    }
    Ok(Exit::Done)
}

fn members_json(membership: &Membership) -> serde_json::Value {
    json!({
        "index": membership.index,
        "members": membership.members.iter().map(|member| json!({
            "id": member.id,
            "role": member.role,
            "peer_addr": member.peer_addr,
            "client_addr": member.client_addr,
        })).collect::<Vec<_>>(),
    })
}
