//! Codec and validation tests: every command and result round-trips, and no
//! bytes from outside can panic a decoder.

use proptest::prelude::*;
use protobuf::Message;

use crate::pb::Command_oneof_kind as Kind;
use crate::*;

fn key() -> impl Strategy<Value = Key> {
    proptest::collection::vec(any::<u8>(), 1..=KEY_LEN_MAX).prop_map(|b| Key::new(b).unwrap())
}

fn owner() -> impl Strategy<Value = Owner> {
    proptest::collection::vec(any::<u8>(), 1..=OWNER_LEN_MAX).prop_map(|b| Owner::new(b).unwrap())
}

fn lease() -> impl Strategy<Value = LeaseMs> {
    (1..=LEASE_MS_MAX).prop_map(|ms| LeaseMs::new(ms).unwrap())
}

fn token() -> impl Strategy<Value = FencingToken> {
    (1..=u64::MAX).prop_map(|t| FencingToken::new(t).unwrap())
}

fn command() -> impl Strategy<Value = Command> {
    prop_oneof![
        (
            key(),
            lease(),
            owner(),
            proptest::collection::vec(any::<u8>(), 0..8),
            proptest::option::of(token())
        )
            .prop_map(|(key, lease_ms, owner, value, session)| Command::Grant {
                key,
                lease_ms,
                owner,
                value: Value::new(value).unwrap(),
                session
            }),
        (
            key(),
            lease(),
            owner(),
            prop_oneof![Just(Share::Read), Just(Share::Write), (1..=PERMITS_MAX).prop_map(Share::Permit)],
            proptest::option::of(token())
        )
            .prop_map(|(key, lease_ms, owner, share, session)| Command::GrantShared {
                key,
                lease_ms,
                owner,
                share,
                session
            }),
        (owner(), lease()).prop_map(|(owner, ttl_ms)| Command::OpenSession { owner, ttl_ms }),
        (token(), proptest::option::of(owner()))
            .prop_map(|(session, user)| Command::RenewSession { session, user }),
        (token(), proptest::option::of(owner()))
            .prop_map(|(session, user)| Command::CloseSession { session, user }),
        (token(), proptest::collection::vec((proptest::collection::vec(any::<u8>(), 0..8), lease()), 0..3))
            .prop_map(|(session, delays)| Command::ExpireSession { session, delays }),
        (key(), token(), proptest::collection::vec(any::<u8>(), 0..8), proptest::option::of(owner()))
            .prop_map(|(key, token, value, user)| Command::Proclaim {
                key,
                token,
                value: Value::new(value).unwrap(),
                user
            }),
        (key(), proptest::option::of(token()), proptest::option::of(owner()))
            .prop_map(|(key, token, user)| Command::Release { key, token, user }),
        (key(), token(), proptest::option::of(lease())).prop_map(|(key, token, delay)| Command::Expire {
            key,
            token,
            delay
        }),
        (key(), token(), lease(), proptest::option::of(owner()))
            .prop_map(|(key, token, lease_ms, user)| Command::Renew { key, token, lease_ms, user }),
        Just(Command::Noop),
        (any::<[u8; 16]>(), any::<u64>(), 1..=u32::MAX).prop_map(|(bytes, token_floor, level)| {
            Command::Bootstrap { cluster_id: ClusterId::new(bytes), token_floor, level }
        }),
        any::<u32>().prop_map(|level| Command::RaiseLevel { level }),
    ]
}

proptest! {
    #[test]
    fn command_batches_round_trip(commands in proptest::collection::vec(command(), 0..8)) {
        let bytes = encode_batch(&commands);
        let decoded = decode_batch(&bytes).unwrap();
        let expected: Vec<_> = commands.into_iter().map(Ok).collect();
        prop_assert_eq!(decoded, expected);
    }

    #[test]
    fn random_bytes_never_panic_decoders(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
        let _ = decode_batch(&bytes);
    }

    #[test]
    fn corrupted_batches_never_panic(
        commands in proptest::collection::vec(command(), 1..4),
        flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
    ) {
        let mut bytes = encode_batch(&commands);
        for (at, value) in flips {
            let i = at.index(bytes.len());
            bytes[i] = value;
        }
        let _ = decode_batch(&bytes);
        let _ = decode_batch(&bytes[..bytes.len() / 2]);
    }
}

/// Grants, Releases, Expires and Renews as raw protobuf, with any field
/// values (empty keys, zero leases and tokens, oversized owners), so that
/// the fast path meets the invalid ones too.
fn raw_hot_command() -> impl Strategy<Value = pb::Command> {
    let bytes = || {
        prop_oneof![
            proptest::collection::vec(any::<u8>(), 0..4),
            proptest::collection::vec(any::<u8>(), 0..300)
        ]
    };
    let number = || prop_oneof![Just(0u64), 1..100_000u64, any::<u64>()];
    (0..4u8, bytes(), number(), bytes(), bytes(), number()).prop_map(|(kind, key, a, b, c, d)| {
        let kind = match kind {
            0 => Kind::grant(pb::Grant {
                key,
                lease_ms: a,
                owner: b,
                value: c,
                session: d,
                ..Default::default()
            }),
            1 => Kind::release(pb::Release { key, token: a, user: b, ..Default::default() }),
            2 => Kind::expire(pb::Expire { key, token: a, delay_ms: d, ..Default::default() }),
            _ => Kind::renew(pb::Renew { key, token: a, lease_ms: d, user: b, ..Default::default() }),
        };
        pb::Command { kind: Some(kind), ..Default::default() }
    })
}

fn raw_batch(commands: Vec<pb::Command>) -> Vec<u8> {
    pb::CommandBatch { commands: commands.into(), ..Default::default() }.write_to_bytes().unwrap()
}

proptest! {
    /// Every batch of hot commands our encoder writes takes the fast path,
    /// and it reads what protobuf reads, invalid commands included.
    #[test]
    fn fast_path_takes_hot_batches_and_agrees(commands in proptest::collection::vec(raw_hot_command(), 0..12)) {
        let bytes = raw_batch(commands);
        let fast = crate::fast_batch::decode(&bytes);
        prop_assert!(fast.is_some(), "a canonical hot batch fell back to protobuf");
        prop_assert_eq!(Ok(fast.unwrap()), crate::command::decode_batch_pb(&bytes));
    }

    /// Whatever the fast path accepts, damaged or not, protobuf reads the
    /// same way: replicas of any version agree on a log entry.
    #[test]
    fn fast_path_agrees_with_protobuf_on_damaged_batches(
        commands in proptest::collection::vec(prop_oneof![raw_hot_command(), command().prop_map(|c| c.into_pb())], 1..6),
        flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..6),
        cut in any::<prop::sample::Index>(),
    ) {
        let mut bytes = raw_batch(commands);
        for (at, value) in flips {
            let i = at.index(bytes.len());
            bytes[i] = value;
        }
        for bytes in [&bytes[..], &bytes[..cut.index(bytes.len() + 1)]] {
            if let Some(fast) = crate::fast_batch::decode(bytes) {
                prop_assert_eq!(Ok(fast), crate::command::decode_batch_pb(bytes));
            }
        }
    }

    /// The batch encoder writes protobuf's bytes exactly: a log entry reads
    /// the same whichever version wrote it.
    #[test]
    fn batches_are_encoded_byte_for_byte_as_protobuf_encodes_them(
        commands in proptest::collection::vec(command(), 0..10),
    ) {
        let expected = crate::command::encode_batch_pb(commands.iter().map(Command::to_pb));
        prop_assert_eq!(&encode_batch(&commands), &expected);
        prop_assert_eq!(&encode_owned_batch(commands), &expected);
    }

    #[test]
    fn fast_path_agrees_with_protobuf_on_random_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
        if let Some(fast) = crate::fast_batch::decode(&bytes) {
            prop_assert_eq!(Ok(fast), crate::command::decode_batch_pb(&bytes));
        }
    }
}

proptest! {
    /// What a batch would raise, read from its bytes, is what applying its
    /// commands raises to (the highest level and token floor named).
    #[test]
    fn raises_read_from_bytes_are_the_commands(commands in proptest::collection::vec(command(), 0..8)) {
        let mut expected = Raises::default();
        for command in &commands {
            match command {
                Command::RaiseLevel { level } => expected.level = expected.level.max(*level),
                Command::Bootstrap { level, token_floor, .. } => {
                    expected.level = expected.level.max(*level);
                    expected.token_floor = expected.token_floor.max(*token_floor);
                }
                _ => {}
            }
        }
        prop_assert_eq!(raises(&encode_batch(&commands)), expected);
    }
}

/// A forged entry lays its bytes out as protobuf allows, not as our
/// encoder does: an unknown fixed-width field, then a `RaiseLevel`. Protobuf
/// skips the one and applies the other, so the level read must be it.
#[test]
fn raises_are_read_as_protobuf_reads_them_however_the_bytes_are_laid_out() {
    let mut command = vec![0xa1, 0x01]; // field 20, fixed64
    command.extend_from_slice(&[0xff; 8]);
    command.extend_from_slice(&[0x4a, 0x02, 0x08, 99]); // raise_level { level: 99 }
    let mut batch = vec![0x0a, command.len() as u8];
    batch.extend(command);
    assert_eq!(decode_batch(&batch).unwrap(), vec![Ok(Command::RaiseLevel { level: 99 })]);
    assert_eq!(raises(&batch), Raises { level: 99, token_floor: 0 });
    // A Grant's field, then a RaiseLevel's in the same command: protobuf
    // keeps the last of a oneof.
    let command = [0x0a, 0x00, 0x4a, 0x02, 0x08, 77];
    let mut batch = vec![0x0a, command.len() as u8];
    batch.extend(command);
    assert_eq!(decode_batch(&batch).unwrap(), vec![Ok(Command::RaiseLevel { level: 77 })]);
    assert_eq!(raises(&batch).level, 77);
    // Not a batch: nothing would apply, nothing is raised.
    assert_eq!(raises(&[0x0a, 0x7f, 0x01]), Raises::default());
}

/// Batches the fast path must hand to protobuf: a field twice, fields out
/// of order, an unknown field, another command kind, a wrong wire type.
#[test]
fn fast_path_declines_what_is_not_canonical() {
    let grant = |fields: &[u8]| {
        let mut command = vec![0x0a, fields.len() as u8];
        command.extend_from_slice(fields);
        let mut batch = vec![0x0a, command.len() as u8];
        batch.extend(command);
        batch
    };
    // key "k", lease 5, owner "o": canonical, taken.
    let canonical = grant(&[0x0a, 1, b'k', 0x10, 5, 0x1a, 1, b'o']);
    assert!(crate::fast_batch::decode(&canonical).is_some());
    for odd in [
        grant(&[0x0a, 1, b'k', 0x0a, 1, b'j', 0x10, 5, 0x1a, 1, b'o']), // key twice: protobuf keeps the last
        grant(&[0x10, 5, 0x0a, 1, b'k', 0x1a, 1, b'o']),                // out of order
        grant(&[0x0a, 1, b'k', 0x10, 5, 0x1a, 1, b'o', 0x30, 1]),       // field 6, unknown
        grant(&[0x0a, 1, b'k', 0x12, 1, 5, 0x1a, 1, b'o']),             // lease as bytes
        raw_batch(vec![Command::Noop.into_pb()]),
    ] {
        assert_eq!(crate::fast_batch::decode(&odd), None, "{odd:?}");
    }
    // What protobuf makes of the duplicate key: the last one.
    let twice = grant(&[0x0a, 1, b'k', 0x0a, 1, b'j', 0x10, 5, 0x1a, 1, b'o']);
    match decode_batch(&twice).unwrap().remove(0).unwrap() {
        Command::Grant { key, .. } => assert_eq!(key.as_bytes(), b"j"),
        other => panic!("not a grant: {other:?}"),
    }
}

/// Encodes one raw protobuf command as a batch, the way a buggy or newer
/// leader might have written it.
fn raw_entry(kind: pb::Command_oneof_kind) -> Vec<u8> {
    let command = pb::Command { kind: Some(kind), ..Default::default() };
    pb::CommandBatch { commands: vec![command].into(), ..Default::default() }.write_to_bytes().unwrap()
}

fn decode_one(bytes: &[u8]) -> Result<Command, InvalidReason> {
    let mut decoded = decode_batch(bytes).unwrap();
    assert_eq!(decoded.len(), 1);
    decoded.remove(0)
}

#[test]
fn invalid_commands_are_refused_with_their_reason() {
    use pb::Command_oneof_kind as K;
    let grant = |key: &[u8], lease_ms: u64, owner: &[u8]| {
        K::grant(pb::Grant { key: key.to_vec(), lease_ms, owner: owner.to_vec(), ..Default::default() })
    };
    let long_key = vec![b'k'; KEY_LEN_MAX + 1];
    let cases = [
        (grant(b"", 1000, b"o"), InvalidReason::EmptyKey),
        (grant(&long_key, 1000, b"o"), InvalidReason::KeyTooLong),
        (grant(b"k", 0, b"o"), InvalidReason::ZeroLease),
        (grant(b"k", LEASE_MS_MAX + 1, b"o"), InvalidReason::LeaseTooLong),
        (grant(b"k", 1000, b""), InvalidReason::EmptyOwner),
        (grant(b"k", 1000, &[b'o'; OWNER_LEN_MAX + 1]), InvalidReason::OwnerTooLong),
        (
            K::expire(pb::Expire { key: b"k".to_vec(), token: 0, ..Default::default() }),
            InvalidReason::ZeroToken,
        ),
        (
            K::renew(pb::Renew { key: b"k".to_vec(), token: 0, lease_ms: 5, ..Default::default() }),
            InvalidReason::ZeroToken,
        ),
        (
            K::renew(pb::Renew { key: b"k".to_vec(), token: 3, lease_ms: 0, ..Default::default() }),
            InvalidReason::ZeroLease,
        ),
        (
            K::release(pb::Release { key: Vec::new(), token: 3, ..Default::default() }),
            InvalidReason::EmptyKey,
        ),
    ];
    for (kind, reason) in cases {
        assert_eq!(decode_one(&raw_entry(kind)), Err(reason));
    }
}

#[test]
fn limits_are_inclusive() {
    assert!(Key::new(vec![b'k'; KEY_LEN_MAX]).is_ok());
    assert!(Owner::new(vec![b'o'; OWNER_LEN_MAX]).is_ok());
    assert!(LeaseMs::new(LEASE_MS_MAX).is_ok());
    assert!(LeaseMs::new(1).is_ok());
}

#[test]
fn release_without_token_is_a_force_release() {
    let bytes = raw_entry(pb::Command_oneof_kind::release(pb::Release {
        key: b"k".to_vec(),
        token: 0,
        ..Default::default()
    }));
    assert_eq!(
        decode_one(&bytes),
        Ok(Command::Release { key: Key::new(b"k".to_vec()).unwrap(), token: None, user: None })
    );
}

#[test]
fn cluster_ids_are_16_bytes_and_print_as_hex() {
    let id = ClusterId::new(*b"0123456789abcdef");
    assert_eq!(id.to_string(), "30313233343536373839616263646566");
    assert_eq!(ClusterId::from_hex(&id.to_string()), Some(id));
    assert_eq!(ClusterId::from_hex("30313233343536373839616263646566"[..30].as_ref()), None);
    assert_eq!(ClusterId::from_hex("zz313233343536373839616263646566"), None);
    assert_eq!(ClusterId::from_slice(&[1; 15]), Err(InvalidReason::BadClusterId));
    let bytes = raw_entry(pb::Command_oneof_kind::bootstrap(pb::Bootstrap {
        cluster_id: vec![7; 17],
        ..Default::default()
    }));
    assert_eq!(decode_one(&bytes), Err(InvalidReason::BadClusterId));
}

#[test]
fn an_owner_belongs_to_its_user_and_to_no_other() {
    let owner = |text: &str| Owner::new(text.as_bytes().to_vec()).unwrap();
    assert!(owner("alice").is_of_user(b"alice"));
    assert!(owner("alice/worker-3").is_of_user(b"alice"));
    assert!(owner("alice/").is_of_user(b"alice"));
    assert!(!owner("alicex").is_of_user(b"alice"));
    assert!(!owner("alice-2/x").is_of_user(b"alice"));
    assert!(!owner("bob/alice").is_of_user(b"alice"));
    assert!(!owner("ali").is_of_user(b"alice"));
    assert!(!owner("alice").is_of_user(b"alice/worker-3"));
}

#[test]
fn unknown_command_kinds_are_refused_not_dropped() {
    // A command whose oneof carries a field number this version does not
    // know (field 99, an empty message): what a newer leader could write.
    let command_bytes = [0x9a, 0x06, 0x00];
    let mut entry = vec![0x0a, command_bytes.len() as u8];
    entry.extend_from_slice(&command_bytes);
    assert_eq!(decode_batch(&entry).unwrap(), vec![Err(InvalidReason::UnknownCommand)]);
}

#[test]
fn one_invalid_command_does_not_void_the_batch() {
    let good = Command::Noop.to_pb();
    let bad = pb::Command::default();
    let bytes =
        pb::CommandBatch { commands: vec![good, bad].into(), ..Default::default() }.write_to_bytes().unwrap();
    assert_eq!(decode_batch(&bytes).unwrap(), vec![Ok(Command::Noop), Err(InvalidReason::UnknownCommand)]);
}

#[test]
fn garbage_is_undecodable() {
    // A length-delimited field whose length runs past the end.
    assert_eq!(decode_batch(&[0x0a, 0x7f, 0x01]), Err(InvalidReason::Undecodable));
}

#[test]
fn tokens_order_and_advance() {
    assert_eq!(FencingToken::FIRST.get(), 1);
    assert_eq!(FencingToken::new(0), None);
    let t = FencingToken::new(41).unwrap();
    assert_eq!(t.next().unwrap().get(), 42);
    assert!(t < t.next().unwrap());
    assert_eq!(FencingToken::new(u64::MAX).unwrap().next(), None);
}

#[test]
fn keys_and_owners_print_escaped() {
    let key = Key::new(b"jobs/\x00a".to_vec()).unwrap();
    assert_eq!(format!("{key:?}"), r#"Key("jobs/\x00a")"#);
    assert_eq!(key.to_string(), r"jobs/\x00a");
    assert_eq!(format!("{:?}", Owner::new(b"w-1".to_vec()).unwrap()), r#"Owner("w-1")"#);
}

#[test]
fn no_two_enums_of_a_proto_file_share_a_value_name() {
    // protoc (every other language's generator) scopes enum values as
    // siblings of their enum and refuses a file where two enums share a
    // value name; the pure-Rust parser of build.rs does not check it.
    for file in [crate::pb::file_descriptor_proto(), crate::client_pb::file_descriptor_proto()] {
        let mut seen = std::collections::HashMap::new();
        for an_enum in file.get_enum_type() {
            for value in an_enum.get_value() {
                if let Some(other) = seen.insert(value.get_name(), an_enum.get_name()) {
                    panic!(
                        "{}: {} is a value of both {other} and {}",
                        file.get_name(),
                        value.get_name(),
                        an_enum.get_name()
                    );
                }
            }
        }
        assert!(!seen.is_empty(), "{} has no enums", file.get_name());
    }
}
