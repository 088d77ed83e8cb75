//! What the load generator reports: latency summaries taken from HDR
//! histograms, and the JSON documents it prints on stdout (one per command)
//! for `cargo xtask bench` to collect and render.

use std::collections::BTreeMap;
use std::time::Duration;

use hdrhistogram::Histogram;
use serde::Serialize;

/// The longest latency a histogram holds, in microseconds: a minute, well
/// over the longest acquire wait of any workload. Longer ones are clamped.
pub const LATENCY_MAX_US: u64 = 60_000_000;

/// A histogram of microseconds, 1 µs to [`LATENCY_MAX_US`], with three
/// significant digits (0.1 % error at any value).
pub fn new_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, LATENCY_MAX_US, 3).expect("constant bounds are valid")
}

/// Records `elapsed` in microseconds. Sub-microsecond times count as 1 µs,
/// the histogram's floor, and anything past its ceiling as the ceiling.
pub fn record(histogram: &mut Histogram<u64>, elapsed: Duration) {
    let micros = u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX).max(1);
    histogram.saturating_record(micros);
}

/// The percentiles reported for one kind of request, in microseconds.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct LatencySummary {
    pub count: u64,
    pub min_us: u64,
    pub p50_us: u64,
    pub p90_us: u64,
    pub p99_us: u64,
    pub p999_us: u64,
    pub max_us: u64,
    pub mean_us: f64,
}

impl LatencySummary {
    /// The summary of `histogram`; all zeros when it is empty.
    pub fn of(histogram: &Histogram<u64>) -> LatencySummary {
        if histogram.is_empty() {
            return LatencySummary::default();
        }
        LatencySummary {
            count: histogram.len(),
            min_us: histogram.min(),
            p50_us: histogram.value_at_quantile(0.50),
            p90_us: histogram.value_at_quantile(0.90),
            p99_us: histogram.value_at_quantile(0.99),
            p999_us: histogram.value_at_quantile(0.999),
            max_us: histogram.max(),
            mean_us: (histogram.mean() * 10.0).round() / 10.0,
        }
    }
}

/// `fencelock-bench fsync`: how long `sync_data` takes after a small append.
#[derive(Clone, Debug, Serialize)]
pub struct FsyncReport {
    pub dir: String,
    pub count: usize,
    pub bytes: usize,
    /// The `sync_data` call alone; the write before it is not timed.
    pub sync_data_us: LatencySummary,
}

/// `fencelock-bench wakeup`: one byte's round trip between two threads
/// over loopback TCP.
#[derive(Clone, Debug, Serialize)]
pub struct WakeupReport {
    pub count: usize,
    /// Whether the two threads were pinned to two different cores.
    pub across_cores: bool,
    pub round_trip_us: LatencySummary,
}

/// `fencelock-bench ready`: the leader every node agreed on.
#[derive(Clone, Debug, Serialize)]
pub struct ReadyReport {
    pub leader_id: u64,
    pub leader_addr: String,
    pub term: u64,
    /// From the start of the command until a probe lock was granted and
    /// released through the leader.
    pub waited_ms: u64,
}

/// `fencelock-bench run`: one workload's figures.
#[derive(Clone, Debug, Serialize)]
pub struct RunReport {
    /// `distinct`, `hot-key` or `renew`.
    pub workload: String,
    /// Client connections: one `Client` and one thread each.
    pub clients: usize,
    pub leader_id: u64,
    /// The leader (or its term) differed after the measurement: the figures
    /// then include an election and are not comparable.
    pub leader_changed: bool,
    pub warmup_s: f64,
    pub measured_s: f64,
    /// Completed cycles in the measured window: acquire plus release for
    /// the lock workloads, one renew request for `renew`.
    pub cycles: u64,
    pub cycles_per_s: f64,
    /// By request kind: `acquire`, `release`, `renew`.
    pub latency_us: BTreeMap<String, LatencySummary>,
    /// Failed requests by `<request>:<error code>`, over the whole run
    /// (warm-up included).
    pub errors: BTreeMap<String, u64>,
    /// The leader's commit index moved this much during the window.
    pub entries_committed: u64,
    /// Client requests completed in the window per log entry committed:
    /// how well the leader batches.
    pub requests_per_entry: f64,
    /// CPU time (user and system) the load generator itself used in the
    /// window, in seconds: compare with `measured_s` times the cores.
    pub generator_cpu_s: f64,
    /// CPU time of the whole generator process, set-up included, so that
    /// the caller can tell its share of the machine from other processes'.
    pub generator_cpu_total_s: f64,
    pub hot_key: Option<HotKeyReport>,
    pub renew: Option<RenewReport>,
}

/// The one-key workload: order and exclusion as far as the clients see them.
#[derive(Clone, Debug, Default, Serialize)]
pub struct HotKeyReport {
    pub lease_ms: u64,
    pub wait_ms: u64,
    /// Grants observed over the whole run (warm-up included); the two
    /// exclusion checks below cover all of them.
    pub grants: u64,
    /// Grants that arrived before the release of a lower token was sent:
    /// the server let two clients hold the key at once. Must be 0. (Holders
    /// release at once, so the window this can catch is short.)
    pub granted_while_held: u64,
    /// Grants, in arrival order, whose token is not above the previous
    /// one's. With exclusive holds arrival order is grant order, so this
    /// must be 0.
    pub token_order_violations: u64,
    /// Pairs of granted acquires sent in one order and granted in the other,
    /// among those sent in the measured window. Requests on different
    /// connections can reach the leader in either order, so a few with small
    /// gaps are transit, not queue order.
    pub fifo_inversions: u64,
    /// Of those, pairs whose sends were more than 1 ms apart.
    pub fifo_inversions_over_1ms: u64,
    /// The largest gap between the sends of an inverted pair, in
    /// microseconds: compare with the acquire latency (the queue wait).
    pub fifo_max_inversion_gap_us: u64,
    /// Grants per client: FIFO queueing gives every client about the same.
    pub grants_per_client_min: u64,
    pub grants_per_client_max: u64,
}

/// The renewal workload.
#[derive(Clone, Debug, Default, Serialize)]
pub struct RenewReport {
    pub locks_held: u64,
    pub locks_per_request: u64,
    pub lease_ms: u64,
    /// How long acquiring every lock took before the measurement.
    pub setup_s: f64,
    /// Locks renewed in the measured window, and per second.
    pub locks_renewed: u64,
    pub locks_renewed_per_s: f64,
    pub requests_per_s: f64,
    /// Renewals answered `renewed: false` (the lock was lost): must be 0.
    pub not_renewed: u64,
}

/// Seconds of `duration`, rounded to the millisecond for readable JSON.
pub fn seconds(duration: Duration) -> f64 {
    (duration.as_secs_f64() * 1000.0).round() / 1000.0
}

/// `count / seconds`, rounded to one decimal; 0 for an empty window.
pub fn rate(count: u64, seconds: f64) -> f64 {
    if seconds <= 0.0 {
        return 0.0;
    }
    (count as f64 / seconds * 10.0).round() / 10.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_come_from_the_histogram_in_microseconds() {
        let mut histogram = new_histogram();
        // 1..=1000 µs once each: p50 is 500, p99 990, p99.9 999.
        for micros in 1..=1000 {
            record(&mut histogram, Duration::from_micros(micros));
        }
        let summary = LatencySummary::of(&histogram);
        assert_eq!(summary.count, 1000);
        assert_eq!(summary.min_us, 1);
        assert_eq!(summary.p50_us, 500);
        assert_eq!(summary.p90_us, 900);
        assert_eq!(summary.p99_us, 990);
        assert_eq!(summary.p999_us, 999);
        assert_eq!(summary.max_us, 1000);
        assert!((summary.mean_us - 500.5).abs() < 0.5, "{}", summary.mean_us);
    }

    #[test]
    fn out_of_range_latencies_are_clamped_not_lost() {
        let mut histogram = new_histogram();
        record(&mut histogram, Duration::from_nanos(10));
        record(&mut histogram, Duration::from_secs(3600));
        let summary = LatencySummary::of(&histogram);
        assert_eq!(summary.count, 2);
        assert_eq!(summary.min_us, 1);
        // Three significant digits: the ceiling reads back within 0.1 %.
        assert!(summary.max_us >= LATENCY_MAX_US && summary.max_us <= LATENCY_MAX_US / 1000 * 1001);
        assert_eq!(LatencySummary::of(&new_histogram()), LatencySummary::default());
    }

    #[test]
    fn the_run_report_has_the_shape_xtask_reads() {
        let mut latency_us = BTreeMap::new();
        latency_us.insert("acquire".to_owned(), LatencySummary { count: 3, p50_us: 7, ..Default::default() });
        let report = RunReport {
            workload: "hot-key".into(),
            clients: 64,
            leader_id: 2,
            leader_changed: false,
            warmup_s: 1.0,
            measured_s: 10.0,
            cycles: 30_000,
            cycles_per_s: rate(30_000, 10.0),
            latency_us,
            errors: BTreeMap::new(),
            entries_committed: 15_000,
            requests_per_entry: 4.0,
            generator_cpu_s: 3.5,
            generator_cpu_total_s: 4.0,
            hot_key: Some(HotKeyReport { grants: 31_000, ..Default::default() }),
            renew: None,
        };
        let json = serde_json::to_value(&report).unwrap();
        for key in ["workload", "clients", "cycles_per_s", "latency_us", "errors", "hot_key", "renew"] {
            assert!(json.get(key).is_some(), "{key} missing in {json}");
        }
        assert_eq!(json["cycles_per_s"], 3000.0);
        assert_eq!(json["latency_us"]["acquire"]["p50_us"], 7);
        assert_eq!(json["hot_key"]["grants"], 31_000);
        assert!(json["renew"].is_null());
    }

    #[test]
    fn rates_and_seconds_round_and_never_divide_by_zero() {
        assert_eq!(rate(10, 0.0), 0.0);
        assert_eq!(rate(1, 3.0), 0.3);
        assert_eq!(seconds(Duration::from_micros(1_234_567)), 1.235);
    }
}
