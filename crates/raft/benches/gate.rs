//! The cost of the raft gate on the messages of the request path: an
//! append of 20 entries (a follower's), its acknowledgement and a
//! heartbeat (the leader's). Run with `cargo bench -p fencelock-raft --bench gate`.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion};
use fencelock_raft::gate::{check, Local};
use fencelock_raft::NodeId;
use fencelock_types::FencingToken;
use raft::prelude::{Entry, Message, MessageType};

const VOTERS: [NodeId; 3] = [NodeId(1), NodeId(2), NodeId(3)];

fn message(kind: MessageType) -> Message {
    let mut message = Message::default();
    message.set_msg_type(kind);
    message.from = 1;
    message.to = 2;
    message.term = 7;
    message
}

fn gate(c: &mut Criterion) {
    let local = Local {
        id: NodeId(2),
        voters: &VOTERS,
        term: 7,
        leader: 1,
        last_index: 1_000,
        persisted: 1_000,
        commit: 990,
        last_token: FencingToken::new(500),
        cluster_id: None,
    };
    let mut append = message(MessageType::MsgAppend);
    append.index = 1_000;
    append.log_term = 7;
    append.commit = 995;
    let entries: Vec<Entry> = (1..=20)
        .map(|i| Entry { index: 1_000 + i, term: 7, data: vec![0; 64].into(), ..Default::default() })
        .collect();
    append.set_entries(entries.into());
    let mut ack = message(MessageType::MsgAppendResponse);
    ack.index = 1_000;
    let heartbeat = message(MessageType::MsgHeartbeat);
    let mut group = c.benchmark_group("gate");
    group.bench_function("append of 20 entries", |b| b.iter(|| check(black_box(&append), &local)));
    group.bench_function("append response", |b| b.iter(|| check(black_box(&ack), &local)));
    group.bench_function("heartbeat", |b| b.iter(|| check(black_box(&heartbeat), &local)));
    group.finish();
}

criterion_group!(benches, gate);
criterion_main!(benches);
