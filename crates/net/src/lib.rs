//! fencelock's network layer: frames, the client listener and the node
//! loop. It moves frames between sockets, channels and a core.
//!
//! - [`frame`]: a 4-byte big-endian length, then one protobuf message;
//!   readers refuse lengths over their limit before allocating.
//! - [`ClientListener`]: one event loop (mio) for every client connection:
//!   pipelined requests handed to a [`Handler`], responses written as they
//!   complete, from whichever thread completes them.
//! - [`Wire`]: one connection's bytes on a non-blocking socket, plain or
//!   TLS (a rustls session driven by the caller's event loop).
//! - [`NodeLoop`]: the same loop serving a node's peers as well (one
//!   outgoing connection per peer, opened without blocking and reopened
//!   with backoff, a bounded output per peer that drops when full; incoming
//!   connections open with a `PeerHello`), and running the node's [`Core`]
//!   (the server's raft driver) between rounds of events: one thread for
//!   the whole node's network and consensus work.
//!
//! Modules, each using only those before it: `frame`, `wire`, `throttle`,
//! `shared` (what other threads share with a loop), `peers` (a node's peer
//! side), `client` (the event loop: client connections, and a node's peers
//! and [`Core`] when it has them), `node` (starts a node's loop).
//!
//! Architecture invariants: this crate knows frames, sockets and channels,
//! and nothing of the driver, raft or the lock table: peer messages are any
//! protobuf message type (the server uses raft's), client requests go to a
//! `Handler` trait object. Nothing a peer or client sends can panic it; a
//! malformed frame closes that one connection.
//!
//! ```no_run
//! use std::sync::Arc;
//! use fencelock_net::{error_response, ClientConfig, ClientListener, Handler, ResponseSink};
//! use fencelock_types::client_pb::{ErrorCode, Request};
//!
//! struct Unavailable;
//! impl Handler for Unavailable {
//!     fn handle(&self, request: Request, sink: ResponseSink) {
//!         sink.send(error_response(request.id, ErrorCode::UNAVAILABLE, "not yet"));
//!     }
//! }
//! let logger = slog::Logger::root(slog::Discard, slog::o!());
//! let config = ClientConfig {
//!     listen_addr: "127.0.0.1:7101".parse()?,
//!     connections_max: 1024,
//!     per_address_max: 1024,
//!     idle_timeout: None,
//!     in_flight_max: 1024,
//!     frame_bytes_max: 1 << 20,
//!     input_total_max: fencelock_net::INPUT_TOTAL_MAX,
//!     output_total_max: fencelock_net::OUTPUT_TOTAL_MAX,
//!     tls: None,
//! };
//! let listener = ClientListener::start(config, Arc::new(Unavailable), &logger)?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod client;
pub mod frame;
mod node;
mod peers;
mod shared;
mod throttle;
mod wire;

pub use client::{
    error_response, ClientConfig, ClientListener, Core, Handler, NodeIo, ResponseSink, Turn, INPUT_TOTAL_MAX,
    OUTPUT_TOTAL_MAX,
};
pub use frame::{
    decode_frame, decode_piece, encode_frame, encode_parts, read_frame, write_frame, FrameError, PART_FLAG,
};
pub use node::{BindError, Listeners, NodeLoop};
pub use peers::{ClientAddrs, Greetings, PeerBook, PeerConfig, PeerTls, Route, PART_BYTES};
pub use shared::LoopWaker;
pub use wire::{Got, Reloadable, Wire};

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tls_tests;
