//! Tests of the parser, without sockets: field bounds, rights over TLS, and
//! what a node's certificate may ask.

use fencelock_types::client_pb as proto;
use fencelock_types::client_pb::{ErrorCode, Request_oneof_kind as Kind};
use fencelock_types::{Command, FencingToken, Key, LeaseMs, Owner, Share, Value};

use super::*;
use crate::access::{Access, Right, RuleConfig};

/// alice may lock and read `jobs/alice/`, read `jobs/`; ops may force
/// `jobs/`; carol may only read; root is an admin.
fn access() -> Access {
    let rule = |users: &[&str], prefixes: &[&str], rights: &[Right]| RuleConfig {
        users: users.iter().map(|user| user.to_string()).collect(),
        prefixes: prefixes.iter().map(|prefix| prefix.to_string()).collect(),
        rights: rights.to_vec(),
    };
    Access::new(
        vec!["root".into()],
        vec![
            rule(&["alice"], &["jobs/alice/"], &[Right::Lock, Right::Read]),
            rule(&["alice"], &["jobs/"], &[Right::Read]),
            rule(&["ops"], &["jobs/"], &[Right::Force, Right::Lock]),
            rule(&["carol"], &[""], &[Right::Read]),
        ],
    )
    .expect("valid rules")
}

fn request(kind: Kind) -> proto::Request {
    proto::Request { id: 7, kind: Some(kind), ..Default::default() }
}

fn plain(kind: Kind) -> Result<Parsed, Refused> {
    parse(request(kind), None, &Rules { access: None, wait_max_ms: 60_000 })
}

fn over_tls(user: Option<&str>, kind: Kind) -> Result<Parsed, Refused> {
    let access = access();
    parse(request(kind), user, &Rules { access: Some(&access), wait_max_ms: 60_000 })
}

fn acquire(key: &str, owner: &str) -> proto::AcquireRequest {
    proto::AcquireRequest {
        key: key.as_bytes().to_vec(),
        owner: owner.as_bytes().to_vec(),
        lease_ms: 10_000,
        ..Default::default()
    }
}

fn code(parsed: Result<Parsed, Refused>) -> ErrorCode {
    match parsed {
        Ok(parsed) => panic!("accepted: {parsed:?}"),
        Err(refused) => refused.code,
    }
}

fn key(name: &str) -> Key {
    Key::new(name.as_bytes().to_vec()).unwrap()
}

fn token(n: u64) -> FencingToken {
    FencingToken::new(n).unwrap()
}

#[test]
fn a_plain_acquire_becomes_the_nodes_acquire() {
    let parsed = plain(Kind::acquire(acquire("jobs/x", "w1"))).unwrap();
    assert_eq!(
        parsed,
        Parsed::Acquire {
            key: key("jobs/x"),
            request: ClientRequest::Acquire {
                key: key("jobs/x"),
                lease_ms: LeaseMs::new(10_000).unwrap(),
                owner: Owner::new(b"w1".to_vec()).unwrap(),
                value: Value::none(),
                wait_ms: 0,
            },
        }
    );
}

#[test]
fn shared_and_session_acquires_carry_their_grant() {
    let read = proto::AcquireRequest { share: proto::Share::READ, ..acquire("rw", "w1") };
    assert!(matches!(
        plain(Kind::acquire(read)),
        Ok(Parsed::Acquire { request: ClientRequest::AcquireShared { share: Share::Read, .. }, .. })
    ));
    // Under a session the lease may be 0: it is the session's.
    let session = proto::AcquireRequest { session: 5, lease_ms: 0, ..acquire("k", "w1") };
    match plain(Kind::acquire(session)) {
        Ok(Parsed::Acquire {
            request: ClientRequest::AcquireWith { grant: Command::Grant { session, .. }, .. },
            ..
        }) => {
            assert_eq!(session, Some(token(5)))
        }
        other => panic!("{other:?}"),
    }
    let permits =
        proto::AcquireRequest { share: proto::Share::PERMIT, permits: 3, session: 5, ..acquire("s", "w1") };
    assert!(matches!(
        plain(Kind::acquire(permits)),
        Ok(Parsed::Acquire {
            request: ClientRequest::AcquireWith {
                grant: Command::GrantShared { share: Share::Permit(3), .. },
                ..
            },
            ..
        })
    ));
}

#[test]
fn malformed_requests_are_invalid_arguments_that_name_the_field() {
    let cases: Vec<(Kind, &str)> = vec![
        (Kind::acquire(acquire("", "w1")), "key"),
        (Kind::acquire(acquire(&"k".repeat(fencelock_types::KEY_LEN_MAX + 1), "w1")), "key"),
        (Kind::acquire(acquire("k", "")), "owner"),
        (Kind::acquire(proto::AcquireRequest { lease_ms: 0, ..acquire("k", "w1") }), "lease_ms"),
        (Kind::acquire(proto::AcquireRequest { permits: 2, ..acquire("k", "w1") }), "permits"),
        (
            Kind::acquire(proto::AcquireRequest { share: proto::Share::PERMIT, ..acquire("k", "w1") }),
            "PERMIT",
        ),
        (
            Kind::acquire(proto::AcquireRequest {
                share: proto::Share::READ,
                value: b"v".to_vec(),
                ..acquire("k", "w1")
            }),
            "carries no value",
        ),
        (Kind::acquire(proto::AcquireRequest { wait_ms: 60_001, ..acquire("k", "w1") }), "wait_ms"),
        (
            Kind::release(proto::ReleaseRequest { key: b"k".to_vec(), ..Default::default() }),
            "token, or force",
        ),
        (Kind::renew(proto::RenewRequest { lease_ms: 1_000, ..Default::default() }), "names no lock"),
        (
            Kind::renew(proto::RenewRequest {
                lease_ms: 1_000,
                locks: vec![proto::LockRef { key: b"k".to_vec(), ..Default::default() }].into(),
                ..Default::default()
            }),
            "each lock's token",
        ),
        (Kind::check(proto::CheckRequest { key: b"k".to_vec(), ..Default::default() }), "needs a token"),
        (Kind::proclaim(proto::ProclaimRequest { key: b"k".to_vec(), ..Default::default() }), "lock's token"),
        (
            Kind::session_open(proto::SessionOpenRequest { owner: b"o".to_vec(), ..Default::default() }),
            "ttl_ms",
        ),
        (Kind::session_keep_alive(proto::SessionKeepAliveRequest::default()), "never 0"),
        (Kind::watch(proto::WatchRequest { wait_ms: 60_001, ..Default::default() }), "wait_ms"),
        (
            Kind::watch(proto::WatchRequest {
                prefix: vec![b'p'; fencelock_types::KEY_LEN_MAX + 1],
                ..Default::default()
            }),
            "prefix",
        ),
        (
            Kind::member_add(proto::MemberAddRequest {
                id: 4,
                peer_addr: "nonsense".into(),
                client_addr: "127.0.0.1:7004".into(),
                ..Default::default()
            }),
            "peer address",
        ),
        (
            Kind::member_add(proto::MemberAddRequest {
                id: 0,
                peer_addr: "127.0.0.1:7104".into(),
                client_addr: "127.0.0.1:7004".into(),
                ..Default::default()
            }),
            "reserved",
        ),
    ];
    for (kind, names) in cases {
        let shown = format!("{kind:?}");
        match plain(kind) {
            Err(Refused { code: ErrorCode::INVALID_ARGUMENT, message }) => {
                assert!(message.contains(names), "{shown}: {message} names no {names:?}")
            }
            other => panic!("{shown}: {other:?}"),
        }
    }
    let empty = proto::Request { id: 1, kind: None, ..Default::default() };
    assert_eq!(
        code(parse(empty, None, &Rules { access: None, wait_max_ms: 0 })),
        ErrorCode::INVALID_ARGUMENT
    );
}

#[test]
fn limits_are_clamped_to_the_servers_maximum() {
    let list = proto::ListRequest { limit: u32::MAX, ..Default::default() };
    assert_eq!(
        plain(Kind::list(list)),
        Ok(Parsed::List { prefix: Vec::new(), limit: LIST_LIMIT_MAX as usize })
    );
    match plain(Kind::watch(proto::WatchRequest { after_index: 9, ..Default::default() })) {
        Ok(Parsed::Watch(query)) => {
            assert_eq!((query.after, query.limit), (Some(9), WATCH_LIMIT_MAX as usize))
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn over_tls_a_connection_without_a_user_is_refused() {
    assert_eq!(code(over_tls(None, Kind::status(Default::default()))), ErrorCode::PERMISSION_DENIED);
}

#[test]
fn over_tls_rights_are_checked_per_key_and_prefix() {
    assert!(over_tls(Some("alice"), Kind::acquire(acquire("jobs/alice/a", "alice/w1"))).is_ok());
    // No `lock` right there.
    assert_eq!(
        code(over_tls(Some("alice"), Kind::acquire(acquire("jobs/bob/z", "alice")))),
        ErrorCode::PERMISSION_DENIED
    );
    // Another user's owner name.
    assert_eq!(
        code(over_tls(Some("alice"), Kind::acquire(acquire("jobs/alice/a", "bob")))),
        ErrorCode::PERMISSION_DENIED
    );
    // Reads: a key under `jobs/`, but not a list of everything.
    let get = proto::GetRequest { key: b"jobs/bob/z".to_vec(), ..Default::default() };
    assert!(over_tls(Some("alice"), Kind::get(get)).is_ok());
    assert_eq!(code(over_tls(Some("alice"), Kind::list(Default::default()))), ErrorCode::PERMISSION_DENIED);
    assert_eq!(code(over_tls(Some("alice"), Kind::watch(Default::default()))), ErrorCode::PERMISSION_DENIED);
    let listed = proto::ListRequest { prefix: b"jobs/".to_vec(), ..Default::default() };
    assert!(over_tls(Some("alice"), Kind::list(listed)).is_ok());
}

#[test]
fn over_tls_a_release_names_its_user_unless_the_user_may_force() {
    let release = |user| {
        let release = proto::ReleaseRequest { key: b"jobs/alice/a".to_vec(), token: 3, ..Default::default() };
        over_tls(Some(user), Kind::release(release))
    };
    assert_eq!(
        release("alice"),
        Ok(Parsed::Release {
            key: key("jobs/alice/a"),
            token: Some(token(3)),
            user: Some(Owner::new(b"alice".to_vec()).unwrap())
        })
    );
    assert_eq!(
        release("ops"),
        Ok(Parsed::Release { key: key("jobs/alice/a"), token: Some(token(3)), user: None })
    );
    let force = proto::ReleaseRequest { key: b"jobs/alice/a".to_vec(), force: true, ..Default::default() };
    assert_eq!(code(over_tls(Some("alice"), Kind::release(force.clone()))), ErrorCode::PERMISSION_DENIED);
    assert_eq!(
        over_tls(Some("ops"), Kind::release(force)),
        Ok(Parsed::Release { key: key("jobs/alice/a"), token: None, user: None })
    );
}

#[test]
fn over_tls_membership_backups_and_peer_addresses_are_for_admins() {
    assert_eq!(
        code(over_tls(Some("alice"), Kind::member_list(Default::default()))),
        ErrorCode::PERMISSION_DENIED
    );
    assert_eq!(code(over_tls(Some("alice"), Kind::backup(Default::default()))), ErrorCode::PERMISSION_DENIED);
    let transfer = proto::LeaderTransferRequest { id: 2, ..Default::default() };
    assert_eq!(
        code(over_tls(Some("alice"), Kind::leader_transfer(transfer.clone()))),
        ErrorCode::PERMISSION_DENIED
    );
    assert_eq!(over_tls(Some("root"), Kind::leader_transfer(transfer)), Ok(Parsed::Transfer(NodeId(2))));
    assert_eq!(
        over_tls(Some("alice"), Kind::status(Default::default())),
        Ok(Parsed::Status { admin: false })
    );
    assert_eq!(over_tls(Some("root"), Kind::status(Default::default())), Ok(Parsed::Status { admin: true }));
    assert_eq!(plain(Kind::status(Default::default())), Ok(Parsed::Status { admin: true }));
}

#[test]
fn a_nodes_certificate_may_only_join_as_itself() {
    let add = |id| proto::MemberAddRequest {
        id,
        peer_addr: "127.0.0.1:7104".into(),
        client_addr: "127.0.0.1:7004".into(),
        ..Default::default()
    };
    let node = Some("node/4");
    assert_eq!(
        over_tls(node, Kind::member_add(add(4))),
        Ok(Parsed::Confirm {
            node: 4,
            peer_addr: "127.0.0.1:7104".into(),
            client_addr: "127.0.0.1:7004".into()
        })
    );
    assert_eq!(code(over_tls(node, Kind::member_add(add(5)))), ErrorCode::PERMISSION_DENIED);
    let promote = |id| Kind::member_promote(proto::MemberPromoteRequest { id, ..Default::default() });
    assert_eq!(over_tls(node, promote(4)), Ok(Parsed::Members(Some(MemberChange::Promote(NodeId(4))))));
    assert_eq!(code(over_tls(node, promote(5))), ErrorCode::PERMISSION_DENIED);
    let remove = Kind::member_remove(proto::MemberRemoveRequest { id: 4, ..Default::default() });
    assert_eq!(code(over_tls(node, remove)), ErrorCode::PERMISSION_DENIED);
    assert_eq!(code(over_tls(node, Kind::acquire(acquire("jobs/x", "node")))), ErrorCode::PERMISSION_DENIED);
    assert_eq!(over_tls(node, Kind::status(Default::default())), Ok(Parsed::Status { admin: false }));
}

#[test]
fn member_addresses_are_host_port_and_nonsense_is_refused() {
    for good in ["127.0.0.1:7001", "[::1]:7001", "lock-4.example.com:7101", "localhost:1"] {
        assert_eq!(host_port(good), Ok(()), "{good}");
    }
    let long = format!("{}:7001", "a".repeat(fencelock_fsm::MEMBER_ADDR_MAX));
    for bad in ["", "7001", "host:", "host:0", "host:65536", ":7001", "a b:1", "x..y:1", "-:", long.as_str()]
    {
        assert!(host_port(bad).is_err(), "{bad:?}");
    }
}

#[test]
fn a_session_needs_the_lock_right_somewhere() {
    let open = |owner: &str| {
        Kind::session_open(proto::SessionOpenRequest {
            owner: owner.as_bytes().to_vec(),
            ttl_ms: 5_000,
            ..Default::default()
        })
    };
    assert!(matches!(over_tls(Some("alice"), open("alice/w")), Ok(Parsed::OpenSession { .. })));
    assert!(matches!(over_tls(Some("root"), open("root")), Ok(Parsed::OpenSession { .. })));
    let refused = format!("{:?}", over_tls(Some("carol"), open("carol/w")));
    assert!(refused.contains("no `lock` right on any key"), "{refused}");
    assert_eq!(code(over_tls(Some("carol"), open("carol/w"))), ErrorCode::PERMISSION_DENIED);
    assert!(matches!(plain(open("anyone")), Ok(Parsed::OpenSession { .. })));
}
