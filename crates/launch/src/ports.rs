//! Ports for nodes to listen on, never handed out twice in one process.
//!
//! Binding port 0 and dropping the listener is not enough: two calls may
//! return the same port, and the kernel may give a returned port to an
//! outgoing connection (the nodes connect to their peers, the clients to the
//! nodes) before the node binds it, or while a killed node is down. So ports
//! come from outside the kernel's ephemeral range, which outgoing connections
//! never take, starting at a block chosen by the process id, so that
//! processes running at the same time (test binaries in other worktrees, a
//! suite beside a `cargo xtask cluster`) start apart. Each is checked by
//! binding it: one some other program listens on is skipped. This fixed a
//! flaky CI; keep it.

use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;

use crate::LaunchError;

/// A free 127.0.0.1 port outside the ephemeral range, never handed out
/// before in this process.
pub fn free_port() -> Result<u16, LaunchError> {
    static PORTS: OnceLock<Result<Ports, (u32, u32)>> = OnceLock::new();
    static HANDED_OUT: AtomicU32 = AtomicU32::new(0);
    let ports = PORTS
        .get_or_init(|| Ports::for_process(std::process::id(), ephemeral_range()))
        .map_err(|(min, max)| LaunchError::NoPortRange { min, max })?;
    loop {
        let n = HANDED_OUT.fetch_add(1, Ordering::Relaxed);
        if n >= ports.len {
            return Err(LaunchError::PortsExhausted { first: ports.first, len: ports.len });
        }
        let port = ports.nth(n);
        if TcpListener::bind((Ipv4Addr::LOCALHOST, port)).is_ok() {
            return Ok(port);
        }
    }
}

/// 127.0.0.1 and a [`free_port`].
pub fn free_addr() -> Result<SocketAddr, LaunchError> {
    Ok(SocketAddr::from((Ipv4Addr::LOCALHOST, free_port()?)))
}

/// The ports outside the ephemeral range, and where this process starts in
/// them.
#[derive(Clone, Copy, Debug)]
struct Ports {
    first: u32,
    len: u32,
    start: u32,
}

impl Ports {
    /// More ports than one process takes, so that processes whose blocks
    /// differ never meet.
    const BLOCK_LEN: u32 = 128;
    /// Ports below this one need privileges.
    const UNPRIVILEGED_MIN: u32 = 1024;

    /// The larger of the two stretches outside the ephemeral range
    /// `(min, max)`; the range itself when it leaves no room.
    fn for_process(pid: u32, (ephemeral_min, ephemeral_max): (u32, u32)) -> Result<Ports, (u32, u32)> {
        let below = (Ports::UNPRIVILEGED_MIN, ephemeral_min.saturating_sub(Ports::UNPRIVILEGED_MIN));
        let above = (ephemeral_max + 1, u32::from(u16::MAX) - ephemeral_max);
        let (first, len) = if below.1 >= above.1 { below } else { above };
        if len < Ports::BLOCK_LEN {
            return Err((ephemeral_min, ephemeral_max));
        }
        let start = pid % (len / Ports::BLOCK_LEN) * Ports::BLOCK_LEN;
        Ok(Ports { first, len, start })
    }

    fn nth(&self, n: u32) -> u16 {
        let port = self.first + (self.start + n) % self.len;
        // `first + len - 1` is at most 65,535 by construction.
        u16::try_from(port).expect("ports lie below 65,536")
    }
}

/// The ports the kernel picks from for outgoing connections.
fn ephemeral_range() -> (u32, u32) {
    // Linux's default, for when the file cannot be read.
    const DEFAULT: (u32, u32) = (32768, 60999);
    let Ok(text) = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range") else {
        return DEFAULT;
    };
    let mut numbers = text.split_whitespace().map(str::parse::<u32>);
    match (numbers.next(), numbers.next()) {
        (Some(Ok(min)), Some(Ok(max))) if min <= max && max <= u32::from(u16::MAX) => (min, max),
        _ => DEFAULT,
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    #[test]
    fn ports_are_never_handed_out_twice_and_lie_outside_the_ephemeral_range() {
        let (min, max) = ephemeral_range();
        let mut seen = BTreeSet::new();
        for _ in 0..200 {
            let port = free_port().expect("a free port");
            assert!(seen.insert(port), "port {port} handed out twice");
            assert!(!(min..=max).contains(&u32::from(port)), "port {port} lies in {min}-{max}");
        }
    }

    #[test]
    fn processes_start_in_different_blocks_and_wrap_within_the_stretch() {
        let default = (32768, 60999);
        let a = Ports::for_process(1, default).expect("room below");
        let b = Ports::for_process(2, default).expect("room below");
        assert_eq!((a.first, a.len), (1024, 31744));
        assert_eq!(b.nth(0) - a.nth(0), 128);
        assert_eq!(a.nth(a.len), a.nth(0));
        // A range that starts low leaves the room above it.
        let above = Ports::for_process(0, (1100, 40000)).expect("room above");
        assert_eq!(above.nth(0), 40001);
        assert_eq!(Ports::for_process(0, (1024, 65500)).err(), Some((1024, 65500)));
    }
}
