//! The hot-key checks: from what each client saw of its grants (when it sent
//! the acquire, when the grant arrived, when it sent the release, and the
//! token), count what would show a broken lock or a broken queue.
//!
//! All times come from one monotonic clock in one process, so grants of
//! different clients compare. What the server does lies between the times
//! the clients see: it grants after the acquire was sent and before the
//! grant arrives, and releases after the release was sent.

/// One grant of the hot key, as its client saw it. Times are nanoseconds
/// since the run started.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GrantRecord {
    /// Sent inside the measured window (not during the warm-up).
    pub measured: bool,
    pub client: usize,
    pub token: u64,
    pub sent_ns: u64,
    pub granted_ns: u64,
    pub release_sent_ns: u64,
}

/// Grants that arrived before the release of a lower token had even been
/// sent: two holders at once. If holds are exclusive, grant `B` (the higher
/// token) is applied after the release of `A` is applied, which is after
/// `A`'s release was sent; and `B`'s grant arrives after it was applied. So
/// every grant must arrive after every lower token's release was sent.
pub fn granted_while_held(records: &[GrantRecord]) -> u64 {
    let mut by_token: Vec<&GrantRecord> = records.iter().collect();
    by_token.sort_by_key(|record| (record.token, record.granted_ns));
    let mut released_after = None;
    let mut violations = 0;
    for record in by_token {
        if released_after.is_some_and(|sent: u64| record.granted_ns <= sent) {
            violations += 1;
        }
        released_after =
            Some(released_after.map_or(record.release_sent_ns, |sent| sent.max(record.release_sent_ns)));
    }
    violations
}

/// Grants whose token is not above the previous grant's, in arrival order.
/// With exclusive holds (see [`granted_while_held`]) grants arrive in the
/// order their tokens were issued, so tokens must strictly increase.
pub fn token_order_violations(records: &[GrantRecord]) -> u64 {
    let mut by_arrival: Vec<&GrantRecord> = records.iter().collect();
    by_arrival.sort_by_key(|record| (record.granted_ns, record.token));
    by_arrival.windows(2).filter(|pair| pair[1].token <= pair[0].token).count() as u64
}

/// Pairs of grants whose acquires were sent more than `slack_ns` apart, the
/// earlier one granted later (a higher token). Each client waits for its
/// grant before it sends again, so pairs are always of two clients.
pub fn fifo_inversions(records: &[GrantRecord], slack_ns: u64) -> u64 {
    let (by_send, ranks, distinct) = by_send_with_token_ranks(records);
    let mut earlier = Fenwick::new(distinct);
    let mut inserted = 0;
    let mut inversions = 0;
    for (j, record) in by_send.iter().enumerate() {
        while inserted < j && by_send[inserted].sent_ns.saturating_add(slack_ns) < record.sent_ns {
            earlier.add(reversed(ranks[inserted], distinct), 1);
            inserted += 1;
        }
        // Reversed ranks below this one's are the higher tokens.
        inversions += earlier.prefix_sum(reversed(ranks[j], distinct));
    }
    inversions
}

/// The largest gap between the sends of an inverted pair (sent earlier,
/// granted later), in nanoseconds; 0 when grants came in send order.
pub fn fifo_max_inversion_gap_ns(records: &[GrantRecord]) -> u64 {
    let (by_send, ranks, distinct) = by_send_with_token_ranks(records);
    let mut earliest = FenwickMin::new(distinct);
    let mut inserted = 0;
    let mut gap = 0;
    for (j, record) in by_send.iter().enumerate() {
        while inserted < j && by_send[inserted].sent_ns < record.sent_ns {
            earliest.lower(reversed(ranks[inserted], distinct), by_send[inserted].sent_ns);
            inserted += 1;
        }
        if let Some(first_sent) = earliest.prefix_min(reversed(ranks[j], distinct)) {
            gap = gap.max(record.sent_ns - first_sent);
        }
    }
    gap
}

/// Records in send order, each one's token rank (0 for the lowest token),
/// and the number of distinct tokens.
fn by_send_with_token_ranks(records: &[GrantRecord]) -> (Vec<GrantRecord>, Vec<usize>, usize) {
    let mut by_send = records.to_vec();
    by_send.sort_by_key(|record| (record.sent_ns, record.token));
    let mut tokens: Vec<u64> = by_send.iter().map(|record| record.token).collect();
    tokens.sort_unstable();
    tokens.dedup();
    let ranks = by_send
        .iter()
        .map(|record| tokens.binary_search(&record.token).unwrap_or_else(|insert_at| insert_at))
        .collect();
    (by_send, ranks, tokens.len())
}

/// Ranks counted from the highest token, so that "every higher token" is a
/// prefix.
fn reversed(rank: usize, distinct: usize) -> usize {
    distinct - 1 - rank
}

/// A Fenwick tree of counts: add at a position, sum a prefix.
struct Fenwick(Vec<u64>);

impl Fenwick {
    fn new(len: usize) -> Fenwick {
        Fenwick(vec![0; len + 1])
    }

    fn add(&mut self, at: usize, value: u64) {
        let mut i = at + 1;
        while i < self.0.len() {
            self.0[i] += value;
            i += i & i.wrapping_neg();
        }
    }

    /// The sum over positions `0..len`.
    fn prefix_sum(&self, len: usize) -> u64 {
        let mut i = len;
        let mut sum = 0;
        while i > 0 {
            sum += self.0[i];
            i -= i & i.wrapping_neg();
        }
        sum
    }
}

/// A Fenwick tree of minimums: lower a position, take a prefix's minimum.
struct FenwickMin(Vec<u64>);

impl FenwickMin {
    fn new(len: usize) -> FenwickMin {
        FenwickMin(vec![u64::MAX; len + 1])
    }

    fn lower(&mut self, at: usize, value: u64) {
        let mut i = at + 1;
        while i < self.0.len() {
            self.0[i] = self.0[i].min(value);
            i += i & i.wrapping_neg();
        }
    }

    /// The minimum over positions `0..len`, if any was set.
    fn prefix_min(&self, len: usize) -> Option<u64> {
        let mut i = len;
        let mut min = u64::MAX;
        while i > 0 {
            min = min.min(self.0[i]);
            i -= i & i.wrapping_neg();
        }
        (min != u64::MAX).then_some(min)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grant(client: usize, token: u64, sent_ns: u64, granted_ns: u64, release_sent_ns: u64) -> GrantRecord {
        GrantRecord { measured: true, client, token, sent_ns, granted_ns, release_sent_ns }
    }

    /// Brute force over all pairs, the definition the fast count must meet.
    fn inversions_naive(records: &[GrantRecord], slack_ns: u64) -> u64 {
        let mut count = 0;
        for a in records {
            for b in records {
                if a.sent_ns.saturating_add(slack_ns) < b.sent_ns && a.token > b.token {
                    count += 1;
                }
            }
        }
        count
    }

    #[test]
    fn a_clean_fifo_handoff_chain_shows_nothing() {
        // Three clients queued in send order, each granted after the
        // previous release.
        let records = [grant(0, 1, 0, 10, 11), grant(1, 2, 1, 20, 21), grant(2, 3, 2, 30, 31)];
        assert_eq!(granted_while_held(&records), 0);
        assert_eq!(token_order_violations(&records), 0);
        assert_eq!(fifo_inversions(&records, 0), 0);
        assert_eq!(fifo_max_inversion_gap_ns(&records), 0);
    }

    #[test]
    fn two_holders_at_once_are_counted() {
        // Client 1 is granted while client 0 has not sent its release.
        let records = [grant(0, 1, 0, 10, 30), grant(1, 2, 1, 20, 40), grant(2, 3, 2, 50, 60)];
        assert_eq!(granted_while_held(&records), 1);
        // Also when the lower token's grant arrives last.
        let records = [grant(0, 1, 0, 25, 30), grant(1, 2, 1, 20, 21)];
        assert_eq!(granted_while_held(&records), 1);
        // A token issued out of order shows too.
        let records = [grant(0, 5, 0, 10, 11), grant(1, 4, 1, 20, 21)];
        assert_eq!(token_order_violations(&records), 1);
    }

    #[test]
    fn queue_jumps_are_counted_with_and_without_slack() {
        // Client 2 sent last (at 5 ms) but was granted first.
        let ms = 1_000_000;
        let records = [
            grant(0, 2, 0, 10 * ms, 11 * ms),
            grant(1, 3, 2 * ms, 20 * ms, 21 * ms),
            grant(2, 1, 5 * ms, 6 * ms, 7 * ms),
        ];
        assert_eq!(fifo_inversions(&records, 0), 2);
        // Only client 0 sent more than 4 ms before client 2.
        assert_eq!(fifo_inversions(&records, 4 * ms), 1);
        assert_eq!(fifo_max_inversion_gap_ns(&records), 5 * ms);
    }

    #[test]
    fn the_fast_inversion_count_matches_the_definition() {
        // A deterministic shuffle of 200 grants.
        let mut state = 0x2545_f491_u64;
        let records: Vec<GrantRecord> = (0..200)
            .map(|i| {
                state = state.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
                let sent = (state >> 33) % 1_000;
                grant(i % 7, i as u64 + 1, sent, sent + 5, sent + 6)
            })
            .collect();
        for slack in [0, 1, 10, 100, 999] {
            assert_eq!(fifo_inversions(&records, slack), inversions_naive(&records, slack), "slack {slack}");
        }
        assert_eq!(fifo_inversions(&[], 0), 0);
        assert_eq!(fifo_max_inversion_gap_ns(&[]), 0);
    }
}
