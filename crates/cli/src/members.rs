//! `fencelock member list | add | remove | promote` and `fencelock leader
//! transfer`: membership and leadership, on the leader (admins only under
//! TLS). Each change is one raft conf change; a retried change that already
//! applied is answered with the membership as it is.

use anyhow::{Context, Result};
use fencelock_client::Membership;
use serde_json::json;

use crate::args::{AddArgs, Cli, LeaderCommand, MemberCommand};
use crate::commands::{connect, print_json};
use crate::output::Exit;

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
    let start = match command {
        MemberCommand::Add(args) => Some(StartCommand::for_added(args, &membership)),
        _ => None,
    };
    if cli.json {
        let mut out = members_json(&membership);
        if let (Some(start), Some(object)) = (&start, out.as_object_mut()) {
            object.insert("start".into(), start.json());
        }
        print_json(&out);
    } else {
        if what != "list" {
            println!("{what}; members at index {}:", membership.index);
        }
        for member in &membership.members {
            let peer = if member.peer_addr.is_empty() { "-" } else { &member.peer_addr };
            let client_addr = if member.client_addr.is_empty() { "-" } else { &member.client_addr };
            println!("{}  {}  peer {}  client {}", member.id, member.role, peer, client_addr);
        }
        if let Some(start) = &start {
            println!("start node {} with (on its machine, with an empty data directory):", start.id);
            println!("  {}", start.command());
            println!("plus --data-dir, and the cluster's --config file (its admins and rules)");
            if cli.certs_dir.is_some() {
                println!(
                    "and --certs-dir holding ca.crt, node-{0}.crt and node-{0}.key: the node joins with its own \
                     certificate (no admin key)",
                    start.id
                );
            }
        }
    }
    Ok(Exit::Done)
}

/// How to start a node that `member add` added, as `etcdctl member add`
/// prints it: with `--join` and the other members' client endpoints, so
/// that it catches up as the cluster's learner and never founds a cluster
/// of its own.
#[derive(Debug, PartialEq, Eq)]
pub struct StartCommand {
    pub id: u64,
    pub peer_addr: String,
    pub client_addr: String,
    /// The other members' client endpoints, voters first.
    pub join: Vec<String>,
}

impl StartCommand {
    pub fn for_added(args: &AddArgs, membership: &Membership) -> StartCommand {
        let others = || membership.members.iter().filter(|member| member.id != args.id);
        let endpoints = others()
            .filter(|member| member.role.starts_with("voter"))
            .chain(others().filter(|member| !member.role.starts_with("voter")))
            .filter(|member| !member.client_addr.is_empty())
            .map(|member| member.client_addr.clone())
            .collect();
        StartCommand {
            id: args.id,
            peer_addr: args.peer_addr.clone(),
            client_addr: args.client_addr.clone(),
            join: endpoints,
        }
    }

    pub fn command(&self) -> String {
        format!(
            "fencelockd --id {} --peers {}={} --client-addr {} --join {}",
            self.id,
            self.id,
            self.peer_addr,
            self.client_addr,
            self.join.join(",")
        )
    }

    fn json(&self) -> serde_json::Value {
        json!({
            "id": self.id,
            "peer_addr": self.peer_addr,
            "client_addr": self.client_addr,
            "join": self.join,
            "command": self.command(),
        })
    }
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

#[cfg(test)]
mod tests {
    use fencelock_client::Member;

    use super::*;

    #[test]
    fn member_add_prints_how_to_start_the_node_with_join() {
        let member = |id: u64, role: &str, client_addr: &str| Member {
            id,
            role: role.into(),
            peer_addr: format!("10.0.0.{id}:7001"),
            client_addr: client_addr.into(),
            reachable: true,
        };
        let membership = Membership {
            index: 12,
            members: vec![
                member(1, "voter", "10.0.0.1:7101"),
                member(2, "learner", "10.0.0.2:7101"),
                member(3, "voter", "10.0.0.3:7101"),
                member(4, "learner", "10.0.0.4:7101"),
            ],
        };
        let args = AddArgs { id: 4, peer_addr: "10.0.0.4:7001".into(), client_addr: "10.0.0.4:7101".into() };
        let start = StartCommand::for_added(&args, &membership);
        assert_eq!(start.join, ["10.0.0.1:7101", "10.0.0.3:7101", "10.0.0.2:7101"]);
        assert_eq!(
            start.command(),
            "fencelockd --id 4 --peers 4=10.0.0.4:7001 --client-addr 10.0.0.4:7101 --join \
             10.0.0.1:7101,10.0.0.3:7101,10.0.0.2:7101"
        );
        let json = start.json();
        assert_eq!(json["id"], 4);
        assert_eq!(json["join"][0], "10.0.0.1:7101");
        assert_eq!(json["command"], start.command());
    }
}
