//! What a run's client threads share, below the workloads and the event
//! loop that both drive them: the phase (warm-up, measure, stop), the
//! clock's origin for grant records, and each thread's counts.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::{Duration, Instant};

use anyhow::{anyhow, Result};
use fencelock_client::ClientError;
use hdrhistogram::Histogram;

use crate::order::GrantRecord;
use crate::report::{new_histogram, record};

/// Threads check this between requests.
pub(crate) const WARMUP: u8 = 0;
pub(crate) const MEASURE: u8 = 1;
pub(crate) const STOP: u8 = 2;

/// The pause after a failed request, so that a cluster in trouble is not
/// hammered (the client has already retried within its own budget).
pub(crate) const ERROR_PAUSE: Duration = Duration::from_millis(10);

/// What the client threads share: the phase, and the clock's origin for
/// grant records.
pub(crate) struct Shared {
    phase: AtomicU8,
    origin: Instant,
}

impl Shared {
    pub(crate) fn new() -> Shared {
        Shared { phase: AtomicU8::new(WARMUP), origin: Instant::now() }
    }

    pub(crate) fn set_phase(&self, phase: u8) {
        self.phase.store(phase, Ordering::Relaxed);
    }

    pub(crate) fn phase(&self) -> u8 {
        self.phase.load(Ordering::Relaxed)
    }

    pub(crate) fn nanos(&self, at: Instant) -> u64 {
        u64::try_from(at.duration_since(self.origin).as_nanos()).unwrap_or(u64::MAX)
    }
}

/// One thread's counts, merged into the run's at the end.
#[derive(Debug, Default)]
pub(crate) struct Tally {
    pub(crate) cycles: u64,
    pub(crate) latency: BTreeMap<&'static str, Histogram<u64>>,
    pub(crate) errors: BTreeMap<String, u64>,
    pub(crate) grants: Vec<GrantRecord>,
    pub(crate) locks_renewed: u64,
    pub(crate) not_renewed: u64,
}

impl Tally {
    pub(crate) fn time(&mut self, kind: &'static str, elapsed: Duration) {
        record(self.latency.entry(kind).or_insert_with(new_histogram), elapsed);
    }

    pub(crate) fn error(&mut self, request: &str, error: &ClientError) {
        self.count(format!("{request}:{}", error.code()));
    }

    pub(crate) fn count(&mut self, what: String) {
        *self.errors.entry(what).or_default() += 1;
    }

    pub(crate) fn merge(&mut self, other: Tally) -> Result<()> {
        self.cycles += other.cycles;
        self.locks_renewed += other.locks_renewed;
        self.not_renewed += other.not_renewed;
        for (kind, histogram) in other.latency {
            self.latency
                .entry(kind)
                .or_insert_with(new_histogram)
                .add(&histogram)
                .map_err(|err| anyhow!("cannot merge {kind} histograms: {err:?}"))?;
        }
        for (what, count) in other.errors {
            *self.errors.entry(what).or_default() += count;
        }
        self.grants.extend(other.grants);
        Ok(())
    }
}
