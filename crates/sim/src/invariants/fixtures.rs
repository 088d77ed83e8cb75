//! What the invariants' tests build their histories from: one key, tokens,
//! applied changes of it, and tables.

#![allow(clippy::unwrap_used)]

use fencelock_fsm::LockTable;
use fencelock_raft::AppliedEvent;
use fencelock_types::{Command, FencingToken, Key, LeaseMs, Owner};

/// The key every history is about.
pub(crate) fn key() -> Key {
    Key::new(b"k".to_vec()).unwrap()
}

pub(crate) fn token(n: u64) -> FencingToken {
    FencingToken::new(n).unwrap()
}

/// `key()` granted under token `n` for 1 s.
pub(crate) fn granted(n: u64, existing: bool) -> AppliedEvent {
    AppliedEvent::Granted {
        key: key(),
        token: token(n),
        lease_ms: LeaseMs::new(1_000).unwrap(),
        existing,
        session: None,
    }
}

pub(crate) fn released(n: u64) -> AppliedEvent {
    AppliedEvent::Released { key: key(), token: token(n) }
}

pub(crate) fn expired(n: u64) -> AppliedEvent {
    AppliedEvent::Expired { key: key(), token: token(n), proposer: None }
}

/// A Grant of `key()` to `owner` for 1 s.
pub(crate) fn grant(owner: &[u8]) -> Command {
    Command::Grant {
        session: None,
        key: key(),
        lease_ms: LeaseMs::new(1_000).unwrap(),
        owner: Owner::new(owner.to_vec()).unwrap(),
        value: fencelock_types::Value::none(),
    }
}

/// The table `commands` make, in order.
pub(crate) fn table(commands: Vec<Command>) -> LockTable {
    let mut table = LockTable::new();
    for command in commands {
        table.apply(command);
    }
    table
}
