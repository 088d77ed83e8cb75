//! Figures of a run (availability during faults, recovery after losing the
//! leader, what fencing turned away) and the readable summary.

use serde::Serialize;

use crate::checker::Check;
use crate::converge::Convergence;
use crate::history::{Op, OpKind, Outcome};
use crate::nemesis::FaultRecord;

/// Who led, as the monitor thread saw it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct LeaderSample {
    pub at_us: u64,
    pub leader: Option<u64>,
    pub term: Option<u64>,
}

/// How long the cluster took to come back after one fault took its leader,
/// counted from the fault's start (for kill-all, from the restart).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Recovery {
    pub fault: String,
    pub at_s: f64,
    /// Until the monitor saw a leader of a later term.
    pub new_leader_ms: Option<f64>,
    /// Until an operation invoked after the fault was committed (a grant
    /// or a release): the outage as a client sees it.
    pub first_commit_ms: Option<f64>,
}

/// The figures of one run.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Figures {
    /// Calls to the cluster (acquire, check, release), and how many got a
    /// definite answer or none.
    pub calls: usize,
    pub definite: usize,
    pub unknown: usize,
    pub grants: usize,
    pub held: usize,
    pub wait_timed_out: usize,
    pub released: usize,
    pub writes_accepted: usize,
    /// Writes the fenced store turned away: stale tokens, the point of
    /// fencing.
    pub stale_rejections: usize,
    /// Holders that paused past their lease.
    pub pauses: usize,
    /// Writes after such a pause that the store turned away.
    pub pause_rejections: usize,
    /// Writes after such a pause that the store still took: nobody newer had
    /// written yet, so nothing was overwritten.
    pub pause_late_accepts: usize,
    /// Sessions opened, and keep-alives that found their session open.
    pub sessions_opened: usize,
    pub session_keep_alives: usize,
    pub fault_s: f64,
    pub quiet_s: f64,
    /// Definite answers per second while a fault of the cluster was on, and
    /// while none was.
    pub calls_per_s_faults: Option<f64>,
    pub calls_per_s_quiet: Option<f64>,
    pub grants_per_s_faults: Option<f64>,
    pub grants_per_s_quiet: Option<f64>,
    pub recoveries: Vec<Recovery>,
    /// The worst `first_commit_ms` of the recoveries.
    pub recovery_ms_max: Option<f64>,
    pub recovery_ms_mean: Option<f64>,
}

fn round1(x: f64) -> f64 {
    (x * 10.0).round() / 10.0
}

/// Computes the figures. `run_us` is when the workload ended.
pub fn figures(ops: &[Op], faults: &[FaultRecord], samples: &[LeaderSample], run_us: u64) -> Figures {
    let mut f = Figures::default();
    let mut paused_tokens = Vec::new();
    for op in ops {
        match (&op.kind, &op.outcome) {
            (OpKind::Pause { token, .. }, _) => {
                f.pauses += 1;
                paused_tokens.push((op.client, *token));
            }
            (OpKind::Write { .. }, Outcome::Accepted) => f.writes_accepted += 1,
            (OpKind::Write { .. }, Outcome::Rejected { .. }) => f.stale_rejections += 1,
            (OpKind::Write { .. } | OpKind::Observe, _) => {}
            (_, outcome) => {
                f.calls += 1;
                if outcome.is_definite() {
                    f.definite += 1;
                } else {
                    f.unknown += 1;
                }
                match outcome {
                    Outcome::Granted { .. } => f.grants += 1,
                    Outcome::Held { .. } => f.held += 1,
                    Outcome::WaitTimedOut { .. } => f.wait_timed_out += 1,
                    Outcome::Released => f.released += 1,
                    Outcome::SessionOpened { .. } => f.sessions_opened += 1,
                    Outcome::SessionFound if matches!(op.kind, OpKind::KeepAlive { .. }) => {
                        f.session_keep_alives += 1
                    }
                    _ => {}
                }
            }
        }
    }
    for op in ops {
        if let OpKind::Write { token } = op.kind {
            if paused_tokens.contains(&(op.client, token)) {
                match op.outcome {
                    Outcome::Rejected { .. } => f.pause_rejections += 1,
                    Outcome::Accepted => f.pause_late_accepts += 1,
                    _ => {}
                }
            }
        }
    }

    // Fault windows of the cluster, within the workload's run.
    let windows: Vec<(u64, u64)> = faults
        .iter()
        .filter(|fault| fault.fault.is_cluster_fault())
        .map(|fault| (fault.start_us.min(run_us), fault.end_us.min(run_us)))
        .filter(|(start, end)| end > start)
        .collect();
    let in_fault = |at: u64| windows.iter().any(|(start, end)| (*start..*end).contains(&at));
    let fault_us: u64 = windows.iter().map(|(start, end)| end - start).sum();
    let quiet_us = run_us.saturating_sub(fault_us);
    f.fault_s = round1(fault_us as f64 / 1e6);
    f.quiet_s = round1(quiet_us as f64 / 1e6);
    let (mut calls_fault, mut calls_quiet, mut grants_fault, mut grants_quiet) = (0u64, 0u64, 0u64, 0u64);
    for op in ops.iter().filter(|op| op.complete_us <= run_us) {
        if matches!(op.kind, OpKind::Write { .. } | OpKind::Pause { .. } | OpKind::Observe)
            || !op.outcome.is_definite()
        {
            continue;
        }
        let granted = matches!(op.outcome, Outcome::Granted { .. });
        if in_fault(op.complete_us) {
            calls_fault += 1;
            grants_fault += u64::from(granted);
        } else {
            calls_quiet += 1;
            grants_quiet += u64::from(granted);
        }
    }
    let rate = |count: u64, us: u64| (us > 0).then(|| round1(count as f64 * 1e6 / us as f64));
    f.calls_per_s_faults = rate(calls_fault, fault_us);
    f.calls_per_s_quiet = rate(calls_quiet, quiet_us);
    f.grants_per_s_faults = rate(grants_fault, fault_us);
    f.grants_per_s_quiet = rate(grants_quiet, quiet_us);

    for fault in faults.iter().filter(|fault| fault.leader_lost && fault.error.is_none()) {
        let from = fault.recover_from_us;
        let new_leader_ms = samples
            .iter()
            .filter(|sample| sample.at_us >= from && sample.leader.is_some())
            .find(|sample| match (sample.term, fault.term_before) {
                (Some(term), Some(before)) => term > before,
                _ => false,
            })
            .map(|sample| round1((sample.at_us - from) as f64 / 1e3));
        let first_commit_ms = ops
            .iter()
            .filter(|op| op.invoke_us >= from && op.outcome.is_committed())
            .map(|op| op.complete_us)
            .min()
            .map(|complete| round1((complete - from) as f64 / 1e3));
        f.recoveries.push(Recovery {
            fault: fault.kind.name().to_owned(),
            at_s: round1(fault.start_us as f64 / 1e6),
            new_leader_ms,
            first_commit_ms,
        });
    }
    let times: Vec<f64> = f.recoveries.iter().filter_map(|r| r.first_commit_ms).collect();
    f.recovery_ms_max = times.iter().copied().reduce(f64::max);
    f.recovery_ms_mean = (!times.is_empty()).then(|| round1(times.iter().sum::<f64>() / times.len() as f64));
    f
}

fn or_dash(value: Option<f64>, unit: &str) -> String {
    value.map_or_else(|| "-".to_owned(), |v| format!("{v}{unit}"))
}

/// The readable summary of one run.
#[allow(clippy::too_many_arguments)]
pub fn summary(
    name: &str,
    seed: u64,
    nodes: u64,
    duration_s: f64,
    faults: &[FaultRecord],
    figures: &Figures,
    convergence: &Convergence,
    checks: &[Check],
) -> String {
    let failed = checks.iter().any(Check::fails_run);
    let mut text = format!(
        "suite {name} (seed {seed}, {nodes} nodes, {duration_s}s): {}\n",
        if failed { "VIOLATION" } else { "ok" }
    );
    let mut kinds: Vec<String> = Vec::new();
    for fault in faults {
        let label = match &fault.error {
            Some(error) => format!("{} (not carried out: {error})", fault.kind.name()),
            None => fault.kind.name().to_owned(),
        };
        kinds.push(label);
    }
    text += &format!(
        "  faults ({}): {}\n",
        faults.len(),
        if kinds.is_empty() { "none".into() } else { kinds.join(", ") }
    );
    let f = figures;
    text += &format!(
        "  calls: {} ({} definite, {} without answer); {} granted, {} held, {} wait timed out, {} released\n",
        f.calls, f.definite, f.unknown, f.grants, f.held, f.wait_timed_out, f.released
    );
    text += &format!(
        "  availability: {} answers/s and {} grants/s during faults ({}s); {} and {} when quiet ({}s)\n",
        or_dash(f.calls_per_s_faults, ""),
        or_dash(f.grants_per_s_faults, ""),
        f.fault_s,
        or_dash(f.calls_per_s_quiet, ""),
        or_dash(f.grants_per_s_quiet, ""),
        f.quiet_s
    );
    if !f.recoveries.is_empty() {
        let each: Vec<String> = f
            .recoveries
            .iter()
            .map(|r| {
                format!(
                    "{} at {}s: leader {}, commit {}",
                    r.fault,
                    r.at_s,
                    or_dash(r.new_leader_ms, " ms"),
                    or_dash(r.first_commit_ms, " ms")
                )
            })
            .collect();
        text += &format!(
            "  recovery after losing the leader: max {}, mean {} ({})\n",
            or_dash(f.recovery_ms_max, " ms"),
            or_dash(f.recovery_ms_mean, " ms"),
            each.join("; ")
        );
    }
    text += &format!(
        "  fencing: {} writes accepted, {} stale tokens turned away ({} of {} holders that paused past their lease; {} paused holders wrote before anyone newer)\n",
        f.writes_accepted, f.stale_rejections, f.pause_rejections, f.pauses, f.pause_late_accepts
    );
    text += &format!(
        "  sessions: {} opened, {} keep-alives found them open\n",
        f.sessions_opened, f.session_keep_alives
    );
    text += &format!(
        "  after healing: leader {}, serving {}, identical tables {} (bound {} ms)\n",
        or_dash(convergence.leader_ms.map(|v| v as f64), " ms"),
        or_dash(convergence.serving_ms.map(|v| v as f64), " ms"),
        or_dash(convergence.converged_ms.map(|v| v as f64), " ms"),
        convergence.bound_ms
    );
    for check in checks {
        let verdict = match (check.passed(), check.enforced) {
            (true, _) => "ok".to_owned(),
            (false, true) => format!("{} VIOLATION(S)", check.violations),
            (false, false) => format!("{} (what the skew does; not failing)", check.violations),
        };
        text += &format!("  check {:<17} {verdict}\n", check.name);
        for example in check.examples.iter().take(5) {
            text += &format!("      {example}\n");
        }
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nemesis::{Fault, FaultKind};

    fn op(client: usize, invoke_ms: u64, complete_ms: u64, kind: OpKind, outcome: Outcome) -> Op {
        Op {
            id: 0,
            client,
            owner: format!("o{client}"),
            key: "k".into(),
            invoke_us: invoke_ms * 1_000,
            complete_us: complete_ms * 1_000,
            kind,
            outcome,
        }
    }

    #[test]
    fn figures_split_faults_from_quiet_and_time_the_recovery() {
        let acquire = OpKind::Acquire { lease_ms: 1_000, wait_ms: 0 };
        let granted = |token| Outcome::Granted { token, lease_ms: 1_000, existing: false };
        let ops = vec![
            op(0, 0, 100, acquire.clone(), granted(1)),
            op(0, 150, 200, OpKind::Release { token: 1 }, Outcome::Released),
            // During the fault (1 s to 3 s): one answer, one without.
            op(1, 900, 2_900, acquire.clone(), Outcome::Unknown { error: "timeout".into() }),
            op(1, 1_100, 1_500, acquire.clone(), Outcome::Held { holder_token: Some(1) }),
            // The first commit of an op invoked after the fault started.
            op(2, 1_200, 1_700, acquire.clone(), granted(2)),
            op(2, 1_701, 1_701, OpKind::Pause { token: 2, ms: 1_100 }, Outcome::Paused),
            op(2, 2_800, 2_800, OpKind::Write { token: 2 }, Outcome::Rejected { highest: 3 }),
            op(3, 3_500, 3_600, acquire, granted(3)),
        ];
        let fault = FaultRecord {
            kind: FaultKind::KillLeader,
            fault: Fault::KillLeader,
            nodes: vec![1],
            start_us: 1_000_000,
            end_us: 3_000_000,
            begin_us: 1_000_000,
            recover_from_us: 1_000_000,
            leader_before: Some(1),
            term_before: Some(2),
            leader_lost: true,
            links_cut: Vec::new(),
            note: None,
            error: None,
        };
        let samples = [
            LeaderSample { at_us: 1_100_000, leader: None, term: None },
            LeaderSample { at_us: 1_400_000, leader: Some(2), term: Some(3) },
        ];
        let f = figures(&ops, &[fault], &samples, 4_000_000);
        assert_eq!((f.calls, f.definite, f.unknown, f.grants, f.held), (6, 5, 1, 3, 1));
        assert_eq!((f.pauses, f.pause_rejections, f.stale_rejections), (1, 1, 1));
        assert_eq!((f.fault_s, f.quiet_s), (2.0, 2.0));
        // Faults: the Held and the grant at 1.7 s; quiet: the rest.
        assert_eq!(f.calls_per_s_faults, Some(1.0));
        assert_eq!(f.calls_per_s_quiet, Some(1.5));
        assert_eq!(f.recoveries.len(), 1);
        assert_eq!(f.recoveries[0].new_leader_ms, Some(400.0));
        assert_eq!(f.recoveries[0].first_commit_ms, Some(700.0));
        assert_eq!(f.recovery_ms_max, Some(700.0));
    }
}
