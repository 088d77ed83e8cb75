//! A client that hangs up mid-request, for the reset-clients nemesis.
//!
//! `fencelock_client` never abandons a request it has sent: it waits for
//! the answer or its timeout. A real client is less tidy: its process dies,
//! its network drops, its connection is reset, and it retries from a new
//! connection. [`HangUp`] speaks the wire protocol itself (docs/protocol.md)
//! on a connection of its own: it sends one acquire to the leader and closes
//! the connection at once, before any answer can come back, so that the
//! leader applies the acquire for a client that is gone. The caller then
//! retries the same acquire through its `Client`, on another connection.

use std::io::Write;
use std::net::{Shutdown, TcpStream, ToSocketAddrs};
use std::time::Duration;

use fencelock_client::Client;
use fencelock_types::client_pb::{AcquireRequest, Request, Request_oneof_kind};

/// One client's connection-dropping sender, with the leader it last found.
#[derive(Debug)]
pub struct HangUp {
    endpoints: Vec<String>,
    /// Where the last abandoned acquire went: asked first next time.
    leader: Option<String>,
    /// The endpoint tried next when no node names a leader.
    next: usize,
    timeout: Duration,
}

impl HangUp {
    pub fn new(endpoints: &[String], timeout: Duration) -> HangUp {
        HangUp { endpoints: endpoints.to_vec(), leader: None, next: 0, timeout }
    }

    /// Sends `acquire` to the leader on a fresh connection and closes it
    /// without reading. `Err` says why nothing was sent (no leader found, or
    /// no connection); after `Ok` the acquire may or may not take effect.
    pub fn acquire(&mut self, client: &Client, acquire: AcquireRequest) -> Result<(), String> {
        let leader = self.find_leader(client).ok_or_else(|| "no node named a leader".to_owned())?;
        let addr = leader
            .to_socket_addrs()
            .ok()
            .and_then(|mut addrs| addrs.next())
            .ok_or_else(|| format!("{leader}: not an address"))?;
        let mut stream =
            TcpStream::connect_timeout(&addr, self.timeout).map_err(|err| format!("{leader}: {err}"))?;
        let _ = stream.set_nodelay(true);
        let _ = stream.set_write_timeout(Some(self.timeout));
        let request =
            Request { id: 1, kind: Some(Request_oneof_kind::acquire(acquire)), ..Default::default() };
        let mut frame = Vec::new();
        fencelock_net::encode_frame(&request, &mut frame);
        // A failed write may still have sent the request: the caller
        // records it as unanswered either way.
        let _ = stream.write_all(&frame);
        // Both directions, now: the server reads the request, then the end
        // of the stream, and has nowhere to send its answer.
        let _ = stream.shutdown(Shutdown::Both);
        Ok(())
    }

    /// The leader's client address: the last one found if it still leads,
    /// else whichever node is named leader, asking at most every node once
    /// more than there are nodes.
    fn find_leader(&mut self, client: &Client) -> Option<String> {
        let count = self.endpoints.len();
        let mut addr =
            self.leader.take().or_else(|| self.endpoints.get(self.next % count.max(1)).cloned())?;
        for _ in 0..=count {
            match client.status(&addr) {
                Ok(status) if status.role == "leader" => {
                    self.leader = Some(addr.clone());
                    return Some(addr);
                }
                Ok(status) if !status.leader_addr.is_empty() && status.leader_addr != addr => {
                    addr = status.leader_addr;
                }
                _ => {
                    self.next += 1;
                    addr = self.endpoints[self.next % count].clone();
                }
            }
        }
        None
    }
}
