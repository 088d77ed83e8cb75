//! `fencelock-bench fsync`: the latency of one `sync_data` after a small
//! append, on the file system the servers' data lives on. Every raft write
//! is synced, so this is the floor under every commit, and the issue's
//! targets assume about 140 µs at the median.

use std::fs::OpenOptions;
use std::io::Write;
use std::path::Path;
use std::time::Instant;

use anyhow::{Context, Result};

use crate::report::{new_histogram, record, FsyncReport, LatencySummary};

/// Appends `bytes` to a fresh file in `dir` and syncs it, `count` times,
/// timing each `sync_data`. The file is removed afterwards.
pub fn measure(dir: &Path, count: usize, bytes: usize) -> Result<FsyncReport> {
    let path = dir.join(format!("fsync-probe-{}", std::process::id()));
    let result = time_syncs(&path, count, bytes);
    // Best effort: a leftover probe file in a temporary directory is harmless.
    let _ = std::fs::remove_file(&path);
    let histogram = result?;
    Ok(FsyncReport {
        dir: dir.display().to_string(),
        count,
        bytes,
        sync_data_us: LatencySummary::of(&histogram),
    })
}

fn time_syncs(path: &Path, count: usize, bytes: usize) -> Result<hdrhistogram::Histogram<u64>> {
    let mut file = OpenOptions::new()
        .create_new(true)
        .write(true)
        .open(path)
        .with_context(|| format!("cannot create {}", path.display()))?;
    // Not zeros only, so that no layer can skip or compress the write.
    let block: Vec<u8> = (0..bytes).map(|i| (i % 251) as u8).collect();
    let mut histogram = new_histogram();
    for _ in 0..count {
        file.write_all(&block).with_context(|| format!("cannot write {}", path.display()))?;
        let started = Instant::now();
        file.sync_data().with_context(|| format!("cannot sync {}", path.display()))?;
        record(&mut histogram, started.elapsed());
    }
    Ok(histogram)
}
