//! `fencelock-bench wakeup`: the round trip of one byte between two
//! threads over loopback TCP. Every hop of a commit (client to leader,
//! leader to follower and back, leader to client) wakes a thread that was
//! waiting on a socket; on a virtual machine whose idle cores halt, that
//! wake-up, not the bytes, is most of a hop's cost. The figure says how
//! much of the cluster's latency the machine itself sets.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::Instant;

use anyhow::{Context, Result};

use crate::report::{new_histogram, record, LatencySummary, WakeupReport};

/// Times `count` round trips of one byte between this thread and an echo
/// thread, each blocked in `read` until the other writes. With two cores
/// or more the threads are pinned to the first two, so that every wake-up
/// crosses cores, as the servers' do (left alone, the scheduler puts two
/// threads that only talk to each other on one core).
pub fn measure(count: usize) -> Result<WakeupReport> {
    let cores = core_affinity::get_core_ids().unwrap_or_default();
    let (here, there) = match cores.as_slice() {
        [first, second, ..] => (Some(*first), Some(*second)),
        _ => (None, None),
    };
    let listener = TcpListener::bind("127.0.0.1:0").context("cannot listen on 127.0.0.1")?;
    let addr = listener.local_addr().context("no local address")?;
    // Connected before either thread starts (the kernel completes it in
    // the backlog), so that no thread is left waiting on a failure.
    let mut stream = TcpStream::connect(addr).context("cannot connect to the echo thread")?;
    stream.set_nodelay(true).context("cannot set TCP_NODELAY")?;
    let echo = std::thread::Builder::new()
        .name("wakeup-echo".into())
        .spawn(move || -> std::io::Result<()> {
            if let Some(core) = there {
                core_affinity::set_for_current(core);
            }
            let (mut stream, _) = listener.accept()?;
            stream.set_nodelay(true)?;
            let mut byte = [0u8; 1];
            // Ends when the other side closes.
            while stream.read(&mut byte)? == 1 {
                stream.write_all(&byte)?;
            }
            Ok(())
        })
        .context("cannot start the echo thread")?;
    // Timed on a thread of its own too, so that the caller's stays unpinned.
    let timer = std::thread::Builder::new()
        .name("wakeup-timer".into())
        .spawn(move || -> Result<(bool, hdrhistogram::Histogram<u64>)> {
            let pinned = here.is_some_and(core_affinity::set_for_current);
            let mut histogram = new_histogram();
            let mut byte = [7u8; 1];
            for _ in 0..count {
                let started = Instant::now();
                stream.write_all(&byte).context("cannot write to the echo thread")?;
                stream.read_exact(&mut byte).context("cannot read from the echo thread")?;
                record(&mut histogram, started.elapsed());
            }
            // Dropping the stream ends the echo thread.
            Ok((pinned, histogram))
        })
        .context("cannot start the timing thread")?;
    let timed = timer.join().map_err(|_| anyhow::anyhow!("the timing thread panicked"))?;
    let echoed = echo.join().map_err(|_| anyhow::anyhow!("the echo thread panicked"))?;
    let (pinned, histogram) = timed?;
    echoed.context("echo thread")?;
    Ok(WakeupReport { count, across_cores: pinned, round_trip_us: LatencySummary::of(&histogram) })
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_round_trip_is_timed() {
        let report = super::measure(50).unwrap();
        assert_eq!(report.count, 50);
        assert_eq!(report.round_trip_us.count, 50);
        assert!(report.round_trip_us.p50_us >= 1);
    }
}
