//! `cargo xtask canaries`: deliberate bugs that the tests must catch.
//!
//! Each canary is a small edit that brings back a bug we know (or fear):
//! applied to a scratch copy of the repository at `HEAD` (a detached git
//! worktree), its catching test is run there and must FAIL. A canary whose
//! test passes has survived: the test no longer guards what it claims to,
//! and the task fails naming it. A canary whose text is no longer found in
//! its file is stale and fails too: update the canary with the code.
//!
//! Not part of `cargo xtask ci`: it builds the workspace once per canary
//! (incrementally, in `target/canaries`), several minutes in all.

use std::path::Path;
use std::process::Command;
use std::time::Instant;

use anyhow::{bail, Context, Result};

/// One deliberate bug.
struct Canary {
    name: &'static str,
    /// What the mutation models.
    models: &'static str,
    file: &'static str,
    /// (found exactly once, replaced by)
    edits: &'static [(&'static str, &'static str)],
    /// The cargo arguments of the test that must catch it.
    test: &'static [&'static str],
}

const CANARIES: &[Canary] = &[
    Canary {
        name: "handler-believes-every-answer-delivered",
        models: "fencelockd's handler neither reports closed connections nor failed deliveries: no ghost release",
        file: "crates/server/src/handler.rs",
        edits: &[
            ("        let _ = self.driver.send(DriverRequest::ConnectionClosed(ConnId(connection)));", "        let _ = connection;"),
            ("            sink.send(response)\n        })", "            sink.send(response);\n            true\n        })"),
        ],
        test: &["test", "-p", "fencelock-server", "--test", "ghost", "an_acquire_closed_unanswered_and_never_retried_leaves_its_key_free_on_one_node"],
    },
    Canary {
        name: "read-without-read-index",
        models: "a linearizable read answered from the applied table at once, without ReadIndex",
        file: "crates/node/src/replica.rs",
        edits: &[(
            "        self.service.reads.waiting.insert(id, query);\n        if self.service.leader_ready {",
            "        if id.0 > 0 {\n            let answer = self.answer(query);\n            self.service.reply(id, Ok(answer));\n            return;\n        }\n        self.service.reads.waiting.insert(id, query);\n        if self.service.leader_ready {",
        )],
        test: &["test", "-p", "fencelock-node", "--lib", "a_deposed_leader_cut_off_from_the_others_never_answers_a_read_from_its_stale_table"],
    },
    Canary {
        name: "leases-not-rearmed-after-restart",
        models: "leases restored from a snapshot at restart are not armed again",
        file: "crates/node/src/service.rs",
        edits: &[("            need_restore: true,", "            need_restore: false,")],
        test: &["test", "-p", "fencelock-node", "--lib", "leases_restored_from_a_snapshot_at_restart_run_out_and_their_locks_expire"],
    },
    Canary {
        name: "client-lease-from-the-answer",
        models: "the Rust client counts a lease from when the answer came (now + lease), not from the send",
        file: "crates/client/src/client.rs",
        edits: &[(
            "Ok((Grant { token: response.token, lease, existing: response.existing }, sent))",
            "Ok((Grant { token: response.token, lease, existing: response.existing }, Instant::now()))",
        )],
        test: &["test", "-p", "fencelock-client", "a_lease_counts_from_when_the_acquire_was_sent_not_from_its_answer"],
    },
    Canary {
        name: "store-skips-fsync",
        models: "the raft-engine store skips fsync while its counters still look healthy",
        file: "crates/raft/src/storage.rs",
        edits: &[(
            "self.engine.write(&mut log_batch, sync)?;",
            "self.engine.write(&mut log_batch, false)?;",
        )],
        test: &["test", "-p", "fencelock-raft", "--lib", "every_synced_write_of_the_engine_store_reaches_an_fsync_before_it_returns"],
    },
    Canary {
        name: "ghost-release-of-a-re-grant",
        models: "a ghost release goes whatever happened to the lock since (the retry race of issue 13)",
        file: "crates/node/src/service.rs",
        edits: &[("        let index = pending.ghost_of?;\n", "        let index = pending.ghost_of?;\n        if index > 0 {\n            return None;\n        }\n")],
        test: &["test", "-p", "fencelock-node", "--lib", "node::tests::a_retry_on_a_second_connection_keeps_the_lock_when_the_first_closes_before_its_answer"],
    },
    Canary {
        name: "raft-gate-open",
        models: "raft messages from the network reach raft-rs unchecked (the gate of issue 14 lets all through)",
        file: "crates/node/src/gate.rs",
        edits: &[(
            "pub fn check(message: &Message, local: &Local<'_>) -> Result<(), Refusal> {\n",
            "pub fn check(message: &Message, local: &Local<'_>) -> Result<(), Refusal> {\n    if message.to != u64::MAX {\n        return Ok(());\n    }\n",
        )],
        test: &["test", "-p", "fencelock-node", "--lib", "tests::forged_raft_messages_are_dropped_and_the_cluster_serves_on"],
    },
    Canary {
        name: "owners-not-checked",
        models: "a TLS user releases or renews another user's lock with its token (issue 14's owner check is off)",
        file: "crates/fsm/src/lib.rs",
        edits: &[(
            "                if user.is_some_and(|user| !lock.owner.is_of_user(user.as_bytes())) {\n",
            "                if user.is_some_and(|user| user.as_bytes().is_empty()) {\n",
        )],
        test: &["test", "-p", "fencelock-fsm", "--lib", "tests::"],
    },
];

pub fn run(root: &Path) -> Result<()> {
    let target = root.join("target").join("canaries");
    let mut survived = Vec::new();
    for canary in CANARIES {
        let started = Instant::now();
        let caught = try_canary(root, &target, canary).with_context(|| format!("canary {}", canary.name))?;
        let verdict = if caught { "caught" } else { "SURVIVED" };
        println!(
            "canary {:<42} {verdict:<9} {:>5.0} s  ({})",
            canary.name,
            started.elapsed().as_secs_f64(),
            canary.models
        );
        if !caught {
            survived.push(canary.name);
        }
    }
    if !survived.is_empty() {
        bail!("canaries survived, their tests no longer catch them: {}", survived.join(", "));
    }
    println!("xtask canaries: all {} caught", CANARIES.len());
    Ok(())
}

/// Applies `canary` to a scratch worktree of `HEAD` and runs its test
/// there: true when the test failed (the canary was caught).
fn try_canary(root: &Path, target: &Path, canary: &Canary) -> Result<bool> {
    let scratch =
        std::env::temp_dir().join(format!("fencelock-canary-{}-{}", std::process::id(), canary.name));
    let _ = std::fs::remove_dir_all(&scratch);
    git(root, &["worktree", "add", "--detach", "--quiet", path_str(&scratch)?, "HEAD"])?;
    let result = mutate_and_test(&scratch, target, canary);
    let removed = git(root, &["worktree", "remove", "--force", path_str(&scratch)?]);
    let caught = result?;
    removed?;
    Ok(caught)
}

fn mutate_and_test(scratch: &Path, target: &Path, canary: &Canary) -> Result<bool> {
    let file = scratch.join(canary.file);
    let mut text =
        std::fs::read_to_string(&file).with_context(|| format!("cannot read {}", file.display()))?;
    for (find, replace) in canary.edits {
        let found = text.matches(find).count();
        if found != 1 {
            bail!("stale: {:?} occurs {found} times in {}, not once", find, canary.file);
        }
        text = text.replacen(find, replace, 1);
    }
    std::fs::write(&file, text).with_context(|| format!("cannot write {}", file.display()))?;
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    eprintln!("$ cargo {}   (canary {})", canary.test.join(" "), canary.name);
    let output = Command::new(cargo)
        .args(canary.test)
        .env("CARGO_TARGET_DIR", target)
        .current_dir(scratch)
        .output()
        .context("cannot run cargo")?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    if stderr.contains("error[E") || stderr.contains("could not compile") {
        bail!("the mutated tree does not build:\n{stderr}");
    }
    // The test must have run: a filter that matches nothing passes too.
    let ran =
        stdout.lines().any(|line| line.contains("test result:") && !line.contains(" 0 passed; 0 failed"));
    if !ran {
        bail!("its test did not run:\n{stdout}");
    }
    Ok(!output.status.success())
}

fn git(root: &Path, args: &[&str]) -> Result<()> {
    let status = Command::new("git").args(args).current_dir(root).status().context("cannot run git")?;
    if !status.success() {
        bail!("`git {}` failed with {status}", args.join(" "));
    }
    Ok(())
}

fn path_str(path: &Path) -> Result<&str> {
    path.to_str().with_context(|| format!("{} is not UTF-8", path.display()))
}
