//! A node that starts with an empty store: a new cluster, or a lost disk.
//!
//! Raft assumes a node never forgets its vote or its log. A node whose data
//! directory was wiped, replaced or mistyped starts blank, and if it took
//! part as a voter again at once it could vote twice in one term, or help
//! elect a leader without entries it had acknowledged: two leaders, or a
//! committed grant lost, and a fencing token issued twice.
//!
//! So a node that starts blank first asks its peers (in the hello that opens
//! every peer connection) whether they have had raft messages from it
//! before, and how far their term and log go, and [`decide`]s:
//!
//! - every peer answered and none knows it: a new cluster, it bootstraps as
//!   a voter ([`Start::Fresh`]);
//! - with [`ClusterState::New`] (the operator says the cluster is new): a
//!   majority of the cluster, itself counted, answered, and every answer is
//!   blank (no term, no log, does not know it): it bootstraps too, so that a
//!   new cluster starts once a majority is up;
//! - some peer knows it, and a majority of the cluster not counting itself
//!   answered: it lost its data. It rejoins ([`Start::Rejoin`]): it takes
//!   entries and acknowledges them like any follower, but neither votes nor
//!   campaigns until [`Replica`](crate::Replica) sees it has [`caught_up`];
//! - otherwise it waits for more answers.
//!
//! Why that is safe: whatever term the lost store voted in, and whatever
//! entry it acknowledged, some node of every majority without it has seen
//! that term or holds that entry, so the largest term and last index among
//! the answers ([`Floor`]) bound them. Once the node holds a committed entry
//! past that log, or from a later term, its log contains every entry
//! committed before the loss; once its term is past the floor, or equal to
//! it with its vote given to that term's leader, it cannot vote twice.
//!
//! What it does not do: tell a node apart from another process with the
//! same id, or bring back a node that no majority of the others can vouch
//! for (that needs the lost data back, or the cluster rebuilt).

use std::collections::{BTreeMap, BTreeSet};

/// What a node keeps about its membership beside its raft state.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Membership {
    /// The peers this node has had raft messages from.
    pub known: BTreeSet<u64>,
    /// Set when the node started blank in a cluster that knew it: it does
    /// not vote until it has caught up past this.
    pub rejoin: Option<Floor>,
}

/// A stored membership record that does not decode.
#[derive(Debug, thiserror::Error)]
#[error("stored membership record is corrupt: {0}")]
pub struct CorruptMembership(pub String);

/// The largest term and last log index a majority of the other nodes
/// reported when a node started again without its data.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Floor {
    pub term: u64,
    pub last_index: u64,
}

/// What a peer said of itself and of this node: what its hello carries
/// ([`fencelock_types::hello`]).
pub use fencelock_types::hello::PeerReport;

/// The newest configuration that named reports give, with the peer that
/// gave it: the voters of the report applied furthest (configurations
/// change only by applying entries, in log order).
pub fn newest_configuration(reports: &BTreeMap<u64, PeerReport>) -> Option<(u64, &[u64])> {
    reports
        .iter()
        .filter(|(_, report)| report.named && !report.voters.is_empty())
        .max_by_key(|(id, report)| (report.applied, std::cmp::Reverse(**id)))
        .map(|(id, report)| (*id, report.voters.as_slice()))
}

/// What the operator says of the cluster a node with an empty store starts
/// in (`--initial-cluster-state`, as etcd has it). A node with data ignores
/// it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ClusterState {
    /// A new cluster: it starts once a majority of its nodes is up and
    /// finds only blank peers. The risk the operator takes: were this node
    /// in fact one that lost its data, with the peers that hold the
    /// cluster's history all down and blank ones up, it would found a
    /// second cluster (whose id the old nodes refuse; its tokens start
    /// above the old ones, from the wall clock).
    #[default]
    New,
    /// A cluster that runs already: a blank node never founds one. It
    /// starts as a member of the cluster its peers name (every peer
    /// answered, none knows it, and one names the cluster), rejoins one
    /// that knows it, and otherwise waits.
    Existing,
}

/// How a node that found its store empty starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Start {
    /// Not enough answers yet.
    Wait,
    /// A new cluster: bootstrap as a voter.
    Fresh,
    /// This node lost its data: rejoin without voting until past `Floor`.
    Rejoin(Floor),
}

/// Decides how a blank node starts from its peers' reports. `peers` are
/// the other voters; reports from anyone else are ignored.
pub fn decide(peers: &BTreeSet<u64>, reports: &BTreeMap<u64, PeerReport>, state: ClusterState) -> Start {
    let answered: Vec<&PeerReport> =
        reports.iter().filter(|(id, _)| peers.contains(id)).map(|(_, report)| report).collect();
    let cluster_size = peers.len() + 1;
    if answered.iter().any(|report| report.knows_you) {
        // A majority of the cluster, this node not counted.
        if answered.len() > cluster_size / 2 {
            let floor = Floor {
                term: answered.iter().map(|report| report.term).max().unwrap_or(0),
                last_index: answered.iter().map(|report| report.last_index).max().unwrap_or(0),
            };
            return Start::Rejoin(floor);
        }
        return Start::Wait;
    }
    if answered.len() == peers.len() {
        // With every peer heard, none knowing this node: a voter of the
        // configuration its peers started with that starts late (they name
        // their cluster), or the first start of a new cluster. The latter
        // is founding, which `Existing` never does. A peer with a history
        // (a term, a log) is a cluster that formed, named or not yet (its
        // first leader's Bootstrap may be uncommitted still).
        let formed = |report: &&PeerReport| report.named || report.term > 0 || report.last_index > 0;
        if state == ClusterState::Existing && !answered.iter().any(formed) {
            return Start::Wait;
        }
        return Start::Fresh;
    }
    // A majority of the cluster, this node counted, and all of it blank: a
    // peer that took part in any election (even a lone pre-vote round does
    // not move the term) or holds any entry would have said so.
    let blank = |report: &&PeerReport| !report.knows_you && report.term == 0 && report.last_index == 0;
    if state == ClusterState::New && answered.len() + 1 > cluster_size / 2 && answered.iter().all(blank) {
        return Start::Fresh;
    }
    Start::Wait
}

/// What a rejoining node's raft state says, for [`caught_up`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RaftPosition {
    pub term: u64,
    pub vote: u64,
    pub leader_id: u64,
    pub committed: u64,
    /// The term of the entry at `committed`.
    pub committed_term: u64,
}

/// Whether a rejoining node may vote again, and if so whether it must
/// first give its vote in the current term to that term's leader (the
/// term is the floor's, and the lost store may have voted in it).
pub fn caught_up(floor: Floor, at: RaftPosition) -> Option<PinVote> {
    let log_ok = at.committed > 0 && (at.committed_term > floor.term || at.committed >= floor.last_index);
    if !log_ok {
        return None;
    }
    if at.term > floor.term || (at.term == floor.term && at.vote != 0) {
        Some(PinVote::No)
    } else if at.term == floor.term && at.leader_id != 0 {
        Some(PinVote::To(at.leader_id))
    } else {
        None
    }
}

/// Whether a node that caught up must record a vote first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PinVote {
    No,
    To(u64),
}

const VERSION: u8 = 1;

impl Membership {
    /// The stored form: a version byte, the floor (a flag, then term and
    /// last index), the count of known peers, then their ids; integers
    /// little-endian.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(22 + 8 * self.known.len());
        out.push(VERSION);
        let floor = self.rejoin.unwrap_or_default();
        out.push(u8::from(self.rejoin.is_some()));
        out.extend_from_slice(&floor.term.to_le_bytes());
        out.extend_from_slice(&floor.last_index.to_le_bytes());
        out.extend_from_slice(&(self.known.len() as u32).to_le_bytes());
        for id in &self.known {
            out.extend_from_slice(&id.to_le_bytes());
        }
        out
    }

    pub fn decode(bytes: &[u8]) -> Result<Membership, CorruptMembership> {
        let corrupt = |detail: String| CorruptMembership(detail);
        let mut reader = Reader(bytes);
        let version = reader.u8().ok_or_else(|| corrupt("empty".into()))?;
        if version != VERSION {
            return Err(corrupt(format!("unknown version {version}")));
        }
        let truncated = || corrupt(format!("truncated at {} bytes", bytes.len()));
        let has_floor = match reader.u8().ok_or_else(truncated)? {
            0 => false,
            1 => true,
            other => return Err(corrupt(format!("bad floor flag {other}"))),
        };
        let floor = Floor {
            term: reader.u64().ok_or_else(truncated)?,
            last_index: reader.u64().ok_or_else(truncated)?,
        };
        let count = reader.u32().ok_or_else(truncated)?;
        if reader.0.len() != count as usize * 8 {
            return Err(corrupt(format!("{count} peers in {} bytes", reader.0.len())));
        }
        let mut known = BTreeSet::new();
        for _ in 0..count {
            known.insert(reader.u64().ok_or_else(truncated)?);
        }
        Ok(Membership { known, rejoin: has_floor.then_some(floor) })
    }
}

struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn take<const N: usize>(&mut self) -> Option<[u8; N]> {
        let (head, rest) = self.0.split_first_chunk::<N>()?;
        self.0 = rest;
        Some(*head)
    }

    fn u8(&mut self) -> Option<u8> {
        self.take::<1>().map(|[byte]| byte)
    }

    fn u32(&mut self) -> Option<u32> {
        self.take().map(u32::from_le_bytes)
    }

    fn u64(&mut self) -> Option<u64> {
        self.take().map(u64::from_le_bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(knows_you: bool, term: u64, last_index: u64) -> PeerReport {
        PeerReport {
            knows_you,
            term,
            last_index,
            level: fencelock_types::LEVEL,
            named: term > 0,
            ..Default::default()
        }
    }

    fn peers(ids: &[u64]) -> BTreeSet<u64> {
        ids.iter().copied().collect()
    }

    #[test]
    fn a_new_cluster_needs_every_peer_to_answer() {
        let three = peers(&[2, 3]);
        let mut reports = BTreeMap::new();
        assert_eq!(decide(&three, &reports, ClusterState::Existing), Start::Wait);
        reports.insert(2, report(false, 0, 0));
        assert_eq!(
            decide(&three, &reports, ClusterState::Existing),
            Start::Wait,
            "node 3 may be the one that knows us"
        );
        reports.insert(3, report(false, 4, 9));
        assert_eq!(decide(&three, &reports, ClusterState::Existing), Start::Fresh);
        // A single node has nobody to ask: it founds when told the cluster
        // is new, never when told it exists.
        assert_eq!(decide(&BTreeSet::new(), &BTreeMap::new(), ClusterState::New), Start::Fresh);
        assert_eq!(decide(&BTreeSet::new(), &BTreeMap::new(), ClusterState::Existing), Start::Wait);
        // Every peer answered, none of them with a cluster: founding, which
        // `Existing` never does.
        let blank_peers: BTreeMap<u64, PeerReport> =
            [(2, report(false, 0, 0)), (3, report(false, 0, 0))].into_iter().collect();
        assert_eq!(decide(&three, &blank_peers, ClusterState::Existing), Start::Wait);
        // A peer with a term is a cluster that formed, though not named yet.
        let unnamed: BTreeMap<u64, PeerReport> =
            [(2, report(false, 0, 0)), (3, PeerReport { term: 1, ..report(false, 0, 0) })]
                .into_iter()
                .collect();
        assert_eq!(decide(&three, &unnamed, ClusterState::Existing), Start::Fresh);
        assert_eq!(decide(&three, &blank_peers, ClusterState::New), Start::Fresh);
        // Reports from strangers count for nothing.
        let stranger: BTreeMap<u64, PeerReport> = [(9, report(false, 0, 0))].into_iter().collect();
        assert_eq!(decide(&peers(&[2]), &stranger, ClusterState::New), Start::Wait);
    }

    #[test]
    fn a_lost_store_rejoins_once_a_majority_without_it_answered() {
        let five = peers(&[2, 3, 4, 5]);
        let mut reports: BTreeMap<u64, PeerReport> = [(2, report(true, 7, 40))].into_iter().collect();
        assert_eq!(decide(&five, &reports, ClusterState::New), Start::Wait);
        reports.insert(3, report(false, 9, 35));
        assert_eq!(decide(&five, &reports, ClusterState::New), Start::Wait, "2 of 5 is no majority");
        reports.insert(4, report(false, 8, 52));
        assert_eq!(
            decide(&five, &reports, ClusterState::New),
            Start::Rejoin(Floor { term: 9, last_index: 52 })
        );
        // In a cluster of three, both others must answer.
        let three = peers(&[2, 3]);
        let one: BTreeMap<u64, PeerReport> = [(3, report(true, 2, 5))].into_iter().collect();
        assert_eq!(decide(&three, &one, ClusterState::New), Start::Wait);
    }

    #[test]
    fn a_new_cluster_starts_with_a_majority_of_blank_nodes_and_an_existing_one_waits_for_all() {
        let five = peers(&[2, 3, 4, 5]);
        let blank = report(false, 0, 0);
        let mut reports: BTreeMap<u64, PeerReport> = [(2, blank.clone())].into_iter().collect();
        assert_eq!(decide(&five, &reports, ClusterState::New), Start::Wait, "2 of 5");
        reports.insert(3, blank.clone());
        assert_eq!(decide(&five, &reports, ClusterState::New), Start::Fresh, "3 of 5, all blank");
        assert_eq!(decide(&five, &reports, ClusterState::Existing), Start::Wait);
        // A peer with any history: the cluster runs (or ran), and this node
        // may be one that lost its data. It waits, to rejoin or to hear
        // from everyone.
        for history in [report(false, 1, 0), report(false, 0, 3)] {
            let mut reports = reports.clone();
            reports.insert(4, history.clone());
            assert_eq!(decide(&five, &reports, ClusterState::New), Start::Wait, "{history:?}");
        }
        // Two of three nodes of a new cluster.
        let three = peers(&[2, 3]);
        let one: BTreeMap<u64, PeerReport> = [(3, blank)].into_iter().collect();
        assert_eq!(decide(&three, &one, ClusterState::New), Start::Fresh);
        assert_eq!(decide(&three, &one, ClusterState::Existing), Start::Wait);
        // A peer that knows this node: a lost store, whatever the flag.
        let knows: BTreeMap<u64, PeerReport> = [(3, report(true, 0, 0))].into_iter().collect();
        assert_eq!(decide(&three, &knows, ClusterState::New), Start::Wait);
    }

    #[test]
    fn a_rejoining_node_votes_again_only_past_the_floor() {
        let floor = Floor { term: 5, last_index: 100 };
        let at = |term, vote, leader_id, committed, committed_term| RaftPosition {
            term,
            vote,
            leader_id,
            committed,
            committed_term,
        };
        // Nothing committed yet, or committed below the floor's log from
        // an earlier term.
        assert_eq!(caught_up(floor, at(6, 0, 2, 0, 0)), None);
        assert_eq!(caught_up(floor, at(6, 0, 2, 99, 5)), None);
        // A committed entry from a later term, or at the floor's last index.
        assert_eq!(caught_up(floor, at(6, 0, 2, 50, 6)), Some(PinVote::No));
        assert_eq!(caught_up(floor, at(6, 0, 2, 100, 4)), Some(PinVote::No));
        // In the floor's own term the vote goes to that term's leader first;
        // with no leader known it waits; below the floor's term it waits.
        assert_eq!(caught_up(floor, at(5, 0, 3, 100, 5)), Some(PinVote::To(3)));
        assert_eq!(caught_up(floor, at(5, 3, 0, 100, 5)), Some(PinVote::No));
        assert_eq!(caught_up(floor, at(5, 0, 0, 100, 5)), None);
        assert_eq!(caught_up(floor, at(4, 0, 2, 120, 4)), None);
    }

    #[test]
    fn membership_records_round_trip_and_garbage_is_refused() {
        let records = [
            Membership::default(),
            Membership { known: peers(&[2, 3, u64::MAX]), rejoin: None },
            Membership { known: peers(&[1]), rejoin: Some(Floor { term: 3, last_index: u64::MAX }) },
        ];
        for record in records {
            let bytes = record.encode();
            assert_eq!(Membership::decode(&bytes).unwrap(), record);
            for cut in 0..bytes.len() {
                assert!(Membership::decode(&bytes[..cut]).is_err(), "a record cut at {cut} was read");
            }
            let mut longer = bytes.clone();
            longer.push(0);
            assert!(Membership::decode(&longer).is_err());
        }
        let mut bad_flag = Membership::default().encode();
        bad_flag[1] = 2;
        assert!(Membership::decode(&bad_flag).is_err());
        assert!(Membership::decode(&[9]).is_err(), "unknown version");
    }
}
