//! The gate in front of raft-rs: every raft message from the network is
//! checked here before `RawNode::step` sees it, against what this node
//! knows (its id, the voters, its term, its log). raft-rs 0.7 trusts its
//! peers: a forged or buggy message can reach its `fatal!` paths, make it
//! persist a term that overflows at the next election, count an
//! acknowledgement for an entry no follower holds, or install a snapshot
//! that erases locks and moves fencing tokens backwards. docs/security.md
//! lists raft-rs's fatal paths and the check here that closes each.
//!
//! What it owns: the rules, as one pure function ([`check`]) and the
//! reasons a message is refused ([`Refusal`]). What it does not: counting
//! and logging refusals (the replica does), authenticating the peer (the
//! transport does).

use fencelock_fsm::LockTable;
use fencelock_types::{ClusterId, FencingToken, LEVEL};
use raft::prelude::{EntryType, Message, MessageType};

use crate::types::NodeId;

/// The largest term any message may carry: far enough below `u64::MAX`
/// that raft-rs's `term + 1` never overflows. No accepted message can lead
/// a node there: see [`TERM_JUMP_MAX`].
pub const TERM_MAX: u64 = 1 << 62;

/// How far past the node's own term a peer's message may go: a million
/// elections. A real peer is never that far ahead (every election moves the
/// term by one, and a node hears of each within an election timeout or
/// catches up in one step). A forged term further out is refused, so that
/// one message cannot carry a node (and through its answers, the cluster)
/// to where its next campaign's term is refused by every gate: from the
/// cluster's term, reaching [`TERM_MAX`] would take 2^42 forged messages,
/// each adopted. The cluster then simply holds an election at the forged
/// term plus one.
pub const TERM_JUMP_MAX: u64 = 1 << 20;

/// The bound in place of [`TERM_JUMP_MAX`] for a node still at term 0 (blank,
/// or a learner never contacted): it may be joining a cluster whose term is
/// past a million (for example one that took a forged term under a build
/// before the relative bound). What such a node adopts, others refuse to
/// follow further than [`TERM_JUMP_MAX`] past their own term.
pub const TERM_FIRST_MAX: u64 = 1 << 48;

/// The largest term a message to a node at `own` term may carry.
pub fn term_bound(own: u64) -> u64 {
    match own {
        0 => TERM_FIRST_MAX,
        own => own.saturating_add(TERM_JUMP_MAX).min(TERM_MAX),
    }
}

/// The largest log index a peer may name: raft-rs adds counts of entries
/// to indexes, which must not overflow.
pub const INDEX_MAX: u64 = 1 << 62;

/// The most entries one append may carry. raft-rs's own appends hold at
/// most `max_size_per_msg_bytes` (1 MiB) of entries, and fencelock's
/// smallest entry takes over 20 bytes: about 52,000. Decoded, each entry
/// costs about 120 bytes, so the bound keeps one message's entries near
/// 16 MB; the transport counts them before decoding ([`crate::scan`]).
pub const ENTRIES_MAX: usize = 1 << 17;

/// The highest fencing token a peer may move this node's counter to, by
/// a snapshot or a `Bootstrap`'s floor: far past any real use (a billion
/// grants a second for a century is 2^62 / 1,500), and far enough below
/// `u64::MAX` that no forged message spends the tokens for good.
pub const TOKENS_MAX: u64 = 1 << 62;

/// Why a message was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// Addressed to another node.
    NotForThisNode,
    /// From this node itself, or from a node that is not a member of its
    /// configuration (save what a leader sends and what a candidate asks,
    /// at a term no lower than this node's: it may be a member of a
    /// configuration this node has not applied).
    NotAPeer,
    /// A type peers never send: local ones (`MsgHup`, `MsgBeat`...), and
    /// proposals, read requests and leadership transfers, which fencelock
    /// never forwards (a follower answers its clients `NOT_LEADER`).
    ForbiddenType,
    /// A term of 0 (raft-rs would take it for a local message), a message
    /// term more than [`TERM_JUMP_MAX`] past this node's own, or any term
    /// past [`TERM_MAX`] (in the message, its log term or an entry).
    BadTerm,
    /// An index past [`INDEX_MAX`], or an append whose entries do not
    /// follow its index one by one with terms in order, or too many.
    BadEntries,
    /// A log entry fencelock never proposes: a version-1 conf change, or a
    /// version-2 one that does not decode or is out of bounds; or a
    /// `Bootstrap` whose token floor is past [`TOKENS_MAX`].
    ForbiddenEntry,
    /// An acknowledgement of an index past this node's last one (or a
    /// rejection hinting past it, or asking for a snapshot).
    AckPastLastIndex,
    /// A message this node cannot take in its state: a vote answer while
    /// its own log is not yet durable (raft-rs would assert), a
    /// `MsgTimeoutNow` not from its leader in its term.
    NotNow,
    /// A snapshot that does not restore, whose configuration raft-rs could
    /// not restore, that is not ahead of this node's commit, or whose
    /// fencing tokens are behind this node's or past [`TOKENS_MAX`].
    BadSnapshot,
    /// An entry (a `RaiseLevel` or `Bootstrap`) or a snapshot that would
    /// take the command level past this build's `LEVEL`: applied, it would
    /// stop this node, and every restart, replaying it. Honest leaders
    /// raise the level only to what every member runs, so it is forged,
    /// or this node was downgraded: upgrade it.
    AboveBuildLevel,
}

impl Refusal {
    /// Every reason, in a fixed order (for counters).
    pub const ALL: [Refusal; 10] = [
        Refusal::NotForThisNode,
        Refusal::NotAPeer,
        Refusal::ForbiddenType,
        Refusal::BadTerm,
        Refusal::BadEntries,
        Refusal::ForbiddenEntry,
        Refusal::AckPastLastIndex,
        Refusal::NotNow,
        Refusal::BadSnapshot,
        Refusal::AboveBuildLevel,
    ];

    /// A short name, for the metric's label and the log.
    /// Whether honest peers send such messages in routine operations: a
    /// vote's answer that comes while this node's log is not yet durable
    /// (after a hand-off or an election), the last answers of a node just
    /// removed. Logged at info, not warn; docs/operations.md alerts on them
    /// only at a rate.
    pub fn is_routine(self) -> bool {
        matches!(self, Refusal::NotNow | Refusal::NotAPeer)
    }

    pub fn name(self) -> &'static str {
        match self {
            Refusal::NotForThisNode => "not_for_this_node",
            Refusal::NotAPeer => "not_a_peer",
            Refusal::ForbiddenType => "forbidden_type",
            Refusal::BadTerm => "bad_term",
            Refusal::BadEntries => "bad_entries",
            Refusal::ForbiddenEntry => "forbidden_entry",
            Refusal::AckPastLastIndex => "ack_past_last_index",
            Refusal::NotNow => "not_now",
            Refusal::BadSnapshot => "bad_snapshot",
            Refusal::AboveBuildLevel => "above_build_level",
        }
    }

    fn at(self) -> usize {
        Refusal::ALL.iter().position(|reason| *reason == self).unwrap_or(0)
    }
}

/// Refused messages, counted by reason.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Refusals([u64; Refusal::ALL.len()]);

impl Refusals {
    pub fn count(&mut self, reason: Refusal) {
        self.0[reason.at()] += 1;
    }

    pub fn get(&self, reason: Refusal) -> u64 {
        self.0[reason.at()]
    }

    pub fn total(&self) -> u64 {
        self.0.iter().sum()
    }
}

/// How often each reason is logged at most, on the node's clock.
pub const LOG_EVERY_MS: u64 = 10_000;

/// One log line per reason per [`LOG_EVERY_MS`]: a peer that floods the
/// node with bad messages does not flood its log.
#[derive(Clone, Copy, Debug, Default)]
pub struct RefusalLog {
    last_ms: [Option<u64>; Refusal::ALL.len()],
    /// Refusals not logged since the last line, by reason.
    quiet: [u64; Refusal::ALL.len()],
}

impl RefusalLog {
    /// Whether to log this refusal now: `Some(n)` with the count of those
    /// of its reason left unlogged since its last line.
    pub fn should_log(&mut self, reason: Refusal, now_ms: u64) -> Option<u64> {
        let at = reason.at();
        if self.last_ms[at].is_some_and(|last| now_ms < last.saturating_add(LOG_EVERY_MS)) {
            self.quiet[at] += 1;
            return None;
        }
        self.last_ms[at] = Some(now_ms);
        Some(std::mem::take(&mut self.quiet[at]))
    }
}

/// What the gate checks a message against.
#[derive(Debug)]
pub struct Local<'a> {
    pub id: NodeId,
    pub voters: &'a [NodeId],
    pub term: u64,
    /// The leader it knows of in its term, 0 for none.
    pub leader: u64,
    pub last_index: u64,
    /// The last index durable in its own log.
    pub persisted: u64,
    pub commit: u64,
    /// The last fencing token of this node's table.
    pub last_token: Option<FencingToken>,
    /// The cluster's id, once this node has applied it.
    pub cluster_id: Option<ClusterId>,
}

/// Checks one message from the network: `Err` with the reason to drop it.
pub fn check(message: &Message, local: &Local<'_>) -> Result<(), Refusal> {
    check_with(message, local, None)
}

/// Like [`check`], with a snapshot message's table decoded already
/// (`None`: decoded here).
pub fn check_with(message: &Message, local: &Local<'_>, table: Option<&LockTable>) -> Result<(), Refusal> {
    if message.to != local.id.0 {
        return Err(Refusal::NotForThisNode);
    }
    let kind = message.get_msg_type();
    if message.from == local.id.0 || message.from == 0 {
        return Err(Refusal::NotAPeer);
    }
    if !local.voters.contains(&NodeId(message.from)) && !from_a_newer_member(kind, message.term, local) {
        return Err(Refusal::NotAPeer);
    }
    if !matches!(
        kind,
        MessageType::MsgAppend
            | MessageType::MsgAppendResponse
            | MessageType::MsgRequestVote
            | MessageType::MsgRequestVoteResponse
            | MessageType::MsgRequestPreVote
            | MessageType::MsgRequestPreVoteResponse
            | MessageType::MsgSnapshot
            | MessageType::MsgHeartbeat
            | MessageType::MsgHeartbeatResponse
            | MessageType::MsgTimeoutNow
    ) {
        return Err(Refusal::ForbiddenType);
    }
    // raft-rs sets the term of every message a peer sends; a term of 0
    // is how it tells a local message.
    if message.term == 0
        || message.term > term_bound(local.term)
        || message.log_term > TERM_MAX
        || message.commit_term > TERM_MAX
    {
        return Err(Refusal::BadTerm);
    }
    if message.index > INDEX_MAX || message.commit > INDEX_MAX || message.reject_hint > INDEX_MAX {
        return Err(Refusal::BadEntries);
    }
    // Every entry past 0 has a term (raft-rs takes a log term of 0 past
    // its own log for a match), and none has one past the sender's.
    let names_a_log_position =
        matches!(kind, MessageType::MsgAppend | MessageType::MsgRequestVote | MessageType::MsgRequestPreVote);
    if names_a_log_position
        && ((message.index > 0 && message.log_term == 0) || message.log_term > message.term)
    {
        return Err(Refusal::BadTerm);
    }
    let entries = message.get_entries();
    if !entries.is_empty() && kind != MessageType::MsgAppend {
        return Err(Refusal::BadEntries);
    }
    if entries.len() > ENTRIES_MAX {
        return Err(Refusal::BadEntries);
    }
    let mut previous_term = message.log_term;
    for (at, entry) in entries.iter().enumerate() {
        // Entries follow the index the append names, one by one, with
        // terms that never go down and never pass the leader's.
        if Some(entry.index) != message.index.checked_add(at as u64 + 1) {
            return Err(Refusal::BadEntries);
        }
        if entry.term == 0 || entry.term < previous_term || entry.term > message.term {
            return Err(Refusal::BadTerm);
        }
        previous_term = entry.term;
        match entry.get_entry_type() {
            EntryType::EntryNormal => {
                // Applied, a level past this build's would stop this node
                // (and every restart, replaying it); a floor near the top
                // would spend the tokens for good.
                let raises = fencelock_types::raises(&entry.data);
                if raises.level > LEVEL {
                    return Err(Refusal::AboveBuildLevel);
                }
                if raises.token_floor > TOKENS_MAX {
                    return Err(Refusal::ForbiddenEntry);
                }
            }
            EntryType::EntryConfChangeV2 if conf_change_decodes(entry) => {}
            _ => return Err(Refusal::ForbiddenEntry),
        }
    }
    match kind {
        MessageType::MsgAppendResponse => {
            // A rejection may name any index (it only says "not that one");
            // what it hints at, and what an acceptance acknowledges, this
            // node must have written.
            let acknowledged = !message.reject && message.index > local.last_index;
            if acknowledged || message.reject_hint > local.last_index || message.request_snapshot != 0 {
                return Err(Refusal::AckPastLastIndex);
            }
        }
        MessageType::MsgRequestVoteResponse | MessageType::MsgRequestPreVoteResponse
            if local.persisted < local.last_index =>
        {
            return Err(Refusal::NotNow);
        }
        MessageType::MsgTimeoutNow if message.term != local.term || message.from != local.leader => {
            return Err(Refusal::NotNow);
        }
        MessageType::MsgSnapshot => check_snapshot(message, local, table)?,
        _ => {}
    }
    Ok(())
}

/// Whether a message from a node outside this node's configuration may
/// pass: what a leader sends its followers (appends, heartbeats,
/// snapshots) and what a candidate asks (votes, pre-votes), at a term no
/// lower than this node's. A member that missed a configuration change
/// (it was down or cut off while a node was added, and that node now leads
/// or campaigns) would otherwise refuse it for ever: it would never learn
/// the configuration that names it, and its vote would be missing from
/// every election, leaving the cluster one failure from a stall. The
/// transport delivers a non-member's messages only when its hello named
/// this node's cluster (under TLS, only what its certificate names).
///
/// Raft processes requests without consulting the configuration (the
/// Raft thesis, 4.1): a leader of a term holds the votes of a majority of
/// its own configuration, the follower's log checks (term, index) as for
/// any leader, and a vote counts only in the candidate's configuration.
/// A removed node cannot disrupt: pre-vote and check-quorum have a node
/// that hears from its leader refuse it. Answers from non-members (votes,
/// acknowledgements) stay refused: they count only in a configuration
/// that names their sender.
fn from_a_newer_member(kind: MessageType, term: u64, local: &Local<'_>) -> bool {
    matches!(
        kind,
        MessageType::MsgAppend
            | MessageType::MsgHeartbeat
            | MessageType::MsgSnapshot
            | MessageType::MsgRequestVote
            | MessageType::MsgRequestPreVote
    ) && term >= local.term
}

fn check_snapshot(message: &Message, local: &Local<'_>, table: Option<&LockTable>) -> Result<(), Refusal> {
    let snapshot = message.get_snapshot();
    let metadata = snapshot.get_metadata();
    if metadata.index <= local.commit || metadata.index > INDEX_MAX {
        return Err(Refusal::BadSnapshot);
    }
    if metadata.term == 0 || metadata.term > message.term {
        return Err(Refusal::BadTerm);
    }
    // raft-rs restores the snapshot's configuration and dies on one it
    // cannot.
    if !conf_state_restores(metadata.get_conf_state()) {
        return Err(Refusal::BadSnapshot);
    }
    let restored;
    let table = match table {
        Some(table) => table,
        None => {
            restored = LockTable::restore(snapshot.get_data()).map_err(|_| Refusal::BadSnapshot)?;
            &restored
        }
    };
    if table.last_token() < local.last_token {
        return Err(Refusal::BadSnapshot);
    }
    // As for entries (above): no level this build cannot apply, no token
    // counter near its end.
    if table.level() > LEVEL {
        return Err(Refusal::AboveBuildLevel);
    }
    if table.last_token().map_or(0, FencingToken::get) > TOKENS_MAX {
        return Err(Refusal::BadSnapshot);
    }
    // Another cluster's table, or one from before this cluster was named.
    if local.cluster_id.is_some() && table.cluster_id() != local.cluster_id {
        return Err(Refusal::BadSnapshot);
    }
    Ok(())
}

/// The most members a configuration may name: far beyond any real
/// cluster, and a bound on the work of checking one.
pub const MEMBERS_MAX: usize = 64;

/// Whether a conf-change entry is one fencelock proposes: a `ConfChangeV2`
/// of at most [`MEMBERS_MAX`] changes, none of node 0, and a context that is
/// a `ConfChangeContext` (or empty: raft-rs's own entry that leaves a joint
/// configuration). Whether raft takes the change is decided when it
/// applies, alike on every replica.
fn conf_change_decodes(entry: &raft::prelude::Entry) -> bool {
    use protobuf::Message as _;
    let Ok(change) = raft::prelude::ConfChangeV2::parse_from_bytes(&entry.data) else { return false };
    let context_ok = entry.context.is_empty()
        || fencelock_types::pb::ConfChangeContext::parse_from_bytes(&entry.context)
            .is_ok_and(|context| context.members.len() <= MEMBERS_MAX);
    context_ok
        && change.get_changes().len() <= MEMBERS_MAX
        && change.get_changes().iter().all(|single| single.node_id != 0)
}

/// Whether raft-rs can restore `conf_state` (it dies on one it cannot):
/// the same steps as its own restore, on an empty tracker.
pub fn conf_state_restores(conf_state: &raft::prelude::ConfState) -> bool {
    use raft::prelude::{ConfChangeSingle, ConfChangeType};
    let single =
        |node_id: u64, change_type: ConfChangeType| raft_proto::new_conf_change_single(node_id, change_type);
    let named = conf_state.voters.len()
        + conf_state.learners.len()
        + conf_state.voters_outgoing.len()
        + conf_state.learners_next.len();
    if conf_state.voters.is_empty() || named > 4 * MEMBERS_MAX {
        return false;
    }
    let all = || {
        conf_state
            .voters
            .iter()
            .chain(&conf_state.learners)
            .chain(&conf_state.voters_outgoing)
            .chain(&conf_state.learners_next)
    };
    if all().any(|id| *id == 0) {
        return false;
    }
    let outgoing: Vec<ConfChangeSingle> =
        conf_state.voters_outgoing.iter().map(|id| single(*id, ConfChangeType::AddNode)).collect();
    let incoming: Vec<ConfChangeSingle> = conf_state
        .voters_outgoing
        .iter()
        .map(|id| single(*id, ConfChangeType::RemoveNode))
        .chain(conf_state.voters.iter().map(|id| single(*id, ConfChangeType::AddNode)))
        .chain(
            conf_state
                .learners
                .iter()
                .chain(&conf_state.learners_next)
                .map(|id| single(*id, ConfChangeType::AddLearnerNode)),
        )
        .collect();
    let mut tracker = raft::ProgressTracker::new(1);
    let mut apply = |changes: &[ConfChangeSingle], joint: bool| -> bool {
        let changed = match joint {
            true => raft::Changer::new(&tracker).enter_joint(conf_state.auto_leave, changes),
            false => raft::Changer::new(&tracker).simple(changes),
        };
        match changed {
            Ok((conf, changes)) => {
                tracker.apply_conf(conf, changes, 1);
                true
            }
            Err(_) => false,
        }
    };
    let restored = if outgoing.is_empty() {
        incoming.iter().all(|change| apply(std::slice::from_ref(change), false))
    } else {
        outgoing.iter().all(|change| apply(std::slice::from_ref(change), false)) && apply(&incoming, true)
    };
    // And it restores to what it says (a voter named a learner too would
    // quietly become one).
    let sorted = |ids: &[u64]| {
        let mut ids = ids.to_vec();
        ids.sort_unstable();
        ids
    };
    let got = tracker.conf().to_conf_state();
    restored
        && sorted(&got.voters) == sorted(&conf_state.voters)
        && sorted(&got.learners) == sorted(&conf_state.learners)
        && sorted(&got.voters_outgoing) == sorted(&conf_state.voters_outgoing)
        && sorted(&got.learners_next) == sorted(&conf_state.learners_next)
}

#[cfg(test)]
#[path = "gate_tests.rs"]
mod tests;
