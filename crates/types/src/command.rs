//! Commands: the checked [`Command`] enum, and the batch codec for raft log
//! entries.

use protobuf::Message;

use crate::pb::{self, Command_oneof_kind as Kind};
use crate::{
    optional_token, token_value, ClusterId, FencingToken, InvalidReason, Key, LeaseMs, Owner, Share, Value,
    KEY_LEN_MAX,
};

/// A replicated command, valid by construction. The leader proposes these;
/// every replica applies them in log order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Command {
    /// Acquire `key` for `owner`. The token is assigned at apply time. The
    /// `value` goes with the lock (an election candidate's value); a retry
    /// by the holder keeps the value the lock has.
    ///
    /// With a `session`, the lock is held under that session (opened by
    /// [`Command::OpenSession`], of the same owner) instead of a lease of
    /// its own, and `lease_ms` is ignored.
    Grant { key: Key, lease_ms: LeaseMs, owner: Owner, value: Value, session: Option<FencingToken> },
    /// Release `key`; with a token only while that token holds it, without
    /// one unconditionally (the administrative force-release). With a
    /// `user` (the authenticated caller), only a lock that user owns
    /// ([`Owner::is_of_user`]).
    Release { key: Key, token: Option<FencingToken>, user: Option<Owner> },
    /// Lease expiry, proposed by the leader; acts only while `token` holds
    /// `key`. With a `delay` (lock-delay, the leader's configuration for the
    /// key), a live lock is held back for that long instead of removed: it
    /// is granted to no one until an Expire of the same token without a
    /// delay removes it (one with a delay is then a repeat, and changes
    /// nothing).
    Expire { key: Key, token: FencingToken, delay: Option<LeaseMs> },
    /// The holder of `token` extends its lease on `key` to `lease_ms`. With
    /// a `user` (the authenticated caller), only a lock that user owns, and
    /// never to a shorter lease than it has.
    Renew { key: Key, token: FencingToken, lease_ms: LeaseMs, user: Option<Owner> },
    /// Acquire `key` for `owner` in a shared mode: a reader or the writer of
    /// a read-write lock, or a permit of a semaphore. Each holder gets a
    /// token of its own; a retry by a holder answers its own token.
    /// A `session` as Grant's.
    GrantShared { key: Key, lease_ms: LeaseMs, owner: Owner, share: Share, session: Option<FencingToken> },
    /// The holder of `token` replaces the value of its lock on `key` (an
    /// election leader proclaims). With a `user`, only a lock that user owns.
    Proclaim { key: Key, token: FencingToken, value: Value, user: Option<Owner> },
    /// Opens a session for `owner` with a time to live of `ttl_ms`: its
    /// id is a token from the one counter. What is held under it lives as
    /// long as it does: it is renewed by [`Command::RenewSession`] (or a
    /// Renew of anything it holds), and when it ends every holder under it
    /// goes in that one command. It counts as one lock in its owner's
    /// quota.
    OpenSession { owner: Owner, ttl_ms: LeaseMs },
    /// Renews `session` (for its TTL, from when each node applies it).
    /// With a `user`, only a session that user owns.
    RenewSession { session: FencingToken, user: Option<Owner> },
    /// Closes `session`: everything held under it is released. With a
    /// `user`, only a session that user owns.
    CloseSession { session: FencingToken, user: Option<Owner> },
    /// The leader's: `session` lapsed. Everything held under it expires,
    /// a holder whose key a rule of `delays` covers (the longest prefix)
    /// held back for the rule's delay as [`Command::Expire`] with a delay
    /// does.
    ExpireSession { session: FencingToken, delays: Vec<(Vec<u8>, LeaseMs)> },
    /// Does nothing; a barrier the driver may put in the log.
    Noop,
    /// Founds the cluster, if it has no id yet (the first one applied
    /// stays): names it, and raises the token counter to `token_floor` (the
    /// founding leader's wall clock in microseconds), so that a cluster
    /// re-created from nothing issues tokens above its old ones.
    /// `level` is the command level the cluster starts at (see
    /// [`LEVEL`](crate::LEVEL)).
    Bootstrap { cluster_id: ClusterId, token_floor: u64, level: u32 },
    /// Raises the cluster's command level to `level`, never lowering it:
    /// proposed by the leader once every member applies that level.
    RaiseLevel { level: u32 },
}

impl Command {
    /// The lowest command level of the cluster at which the command applies
    /// (see [`LEVEL`](crate::LEVEL)).
    pub fn level(&self) -> u32 {
        match self {
            Command::OpenSession { .. }
            | Command::RenewSession { .. }
            | Command::CloseSession { .. }
            | Command::ExpireSession { .. }
            | Command::Grant { session: Some(_), .. }
            | Command::GrantShared { session: Some(_), .. } => 3,
            Command::GrantShared { .. } | Command::Proclaim { .. } => 2,
            // What raises the level applies at any: it is proposed only
            // once every member knows it.
            _ => 1,
        }
    }

    /// The key the command acts on, `None` for [`Command::Noop`].
    pub fn key(&self) -> Option<&Key> {
        match self {
            Command::Grant { key, .. }
            | Command::GrantShared { key, .. }
            | Command::Release { key, .. }
            | Command::Expire { key, .. }
            | Command::Renew { key, .. }
            | Command::Proclaim { key, .. } => Some(key),
            Command::Noop
            | Command::Bootstrap { .. }
            | Command::RaiseLevel { .. }
            | Command::OpenSession { .. }
            | Command::RenewSession { .. }
            | Command::CloseSession { .. }
            | Command::ExpireSession { .. } => None,
        }
    }

    /// Checks a decoded protobuf command. Consumes it so that keys and owners
    /// move instead of being copied.
    pub fn from_pb(command: pb::Command) -> Result<Command, InvalidReason> {
        let Some(kind) = command.kind else {
            // A command kind newer than this replica decodes to an empty oneof.
            return Err(InvalidReason::UnknownCommand);
        };
        Ok(match kind {
            Kind::grant(grant) => Command::Grant {
                key: Key::new(grant.key)?,
                lease_ms: LeaseMs::new(grant.lease_ms)?,
                owner: Owner::new(grant.owner)?,
                value: Value::new(grant.value)?,
                session: FencingToken::new(grant.session),
            },
            Kind::release(release) => Command::Release {
                key: Key::new(release.key)?,
                token: optional_token(release.token),
                user: optional_user(release.user)?,
            },
            Kind::expire(expire) => Command::Expire {
                key: Key::new(expire.key)?,
                token: FencingToken::new(expire.token).ok_or(InvalidReason::ZeroToken)?,
                delay: match expire.delay_ms {
                    0 => None,
                    ms => Some(LeaseMs::new(ms)?),
                },
            },
            Kind::renew(renew) => Command::Renew {
                key: Key::new(renew.key)?,
                token: FencingToken::new(renew.token).ok_or(InvalidReason::ZeroToken)?,
                lease_ms: LeaseMs::new(renew.lease_ms)?,
                user: optional_user(renew.user)?,
            },
            Kind::grant_shared(grant) => Command::GrantShared {
                key: Key::new(grant.key)?,
                lease_ms: LeaseMs::new(grant.lease_ms)?,
                owner: Owner::new(grant.owner)?,
                share: Share::from_pb(grant.share, grant.permits)?,
                session: FencingToken::new(grant.session),
            },
            Kind::proclaim(proclaim) => Command::Proclaim {
                key: Key::new(proclaim.key)?,
                token: FencingToken::new(proclaim.token).ok_or(InvalidReason::ZeroToken)?,
                value: Value::new(proclaim.value)?,
                user: optional_user(proclaim.user)?,
            },
            Kind::noop(_) => Command::Noop,
            Kind::bootstrap(bootstrap) => Command::Bootstrap {
                cluster_id: ClusterId::from_slice(&bootstrap.cluster_id)?,
                token_floor: bootstrap.token_floor,
                level: bootstrap.level.max(1),
            },
            Kind::raise_level(raise) => Command::RaiseLevel { level: raise.level },
            Kind::open_session(open) => {
                Command::OpenSession { owner: Owner::new(open.owner)?, ttl_ms: LeaseMs::new(open.ttl_ms)? }
            }
            Kind::renew_session(renew) => Command::RenewSession {
                session: FencingToken::new(renew.session).ok_or(InvalidReason::ZeroToken)?,
                user: optional_user(renew.user)?,
            },
            Kind::close_session(close) => Command::CloseSession {
                session: FencingToken::new(close.session).ok_or(InvalidReason::ZeroToken)?,
                user: optional_user(close.user)?,
            },
            Kind::expire_session(expire) => Command::ExpireSession {
                session: FencingToken::new(expire.session).ok_or(InvalidReason::ZeroToken)?,
                delays: expire
                    .delays
                    .into_iter()
                    .map(|rule| {
                        if rule.prefix.len() > KEY_LEN_MAX {
                            return Err(InvalidReason::KeyTooLong);
                        }
                        Ok((rule.prefix, LeaseMs::new(rule.delay_ms)?))
                    })
                    .collect::<Result<_, _>>()?,
            },
        })
    }

    pub fn to_pb(&self) -> pb::Command {
        self.clone().into_pb()
    }

    /// The command in the wire format, its bytes moved, not copied.
    pub fn into_pb(self) -> pb::Command {
        let kind = match self {
            Command::Grant { key, lease_ms, owner, value, session } => Kind::grant(pb::Grant {
                key: key.into_bytes(),
                lease_ms: lease_ms.get(),
                owner: owner.into_bytes(),
                value: value.into_bytes(),
                session: token_value(session),
                ..Default::default()
            }),
            Command::GrantShared { key, lease_ms, owner, share, session } => {
                let (share, permits) = share.to_pb();
                Kind::grant_shared(pb::GrantShared {
                    key: key.into_bytes(),
                    lease_ms: lease_ms.get(),
                    owner: owner.into_bytes(),
                    share,
                    permits,
                    session: token_value(session),
                    ..Default::default()
                })
            }
            Command::Proclaim { key, token, value, user } => Kind::proclaim(pb::Proclaim {
                key: key.into_bytes(),
                token: token.get(),
                value: value.into_bytes(),
                user: user_value(user),
                ..Default::default()
            }),
            Command::Release { key, token, user } => Kind::release(pb::Release {
                key: key.into_bytes(),
                token: token_value(token),
                user: user_value(user),
                ..Default::default()
            }),
            Command::Expire { key, token, delay } => Kind::expire(pb::Expire {
                key: key.into_bytes(),
                token: token.get(),
                delay_ms: delay.map_or(0, LeaseMs::get),
                ..Default::default()
            }),
            Command::Renew { key, token, lease_ms, user } => Kind::renew(pb::Renew {
                key: key.into_bytes(),
                token: token.get(),
                lease_ms: lease_ms.get(),
                user: user_value(user),
                ..Default::default()
            }),
            Command::Noop => Kind::noop(pb::Noop::default()),
            Command::Bootstrap { cluster_id, token_floor, level } => Kind::bootstrap(pb::Bootstrap {
                cluster_id: cluster_id.as_bytes().to_vec(),
                token_floor,
                level,
                ..Default::default()
            }),
            Command::RaiseLevel { level } => {
                Kind::raise_level(pb::RaiseLevel { level, ..Default::default() })
            }
            Command::OpenSession { owner, ttl_ms } => Kind::open_session(pb::OpenSession {
                owner: owner.into_bytes(),
                ttl_ms: ttl_ms.get(),
                ..Default::default()
            }),
            Command::RenewSession { session, user } => Kind::renew_session(pb::RenewSession {
                session: session.get(),
                user: user_value(user),
                ..Default::default()
            }),
            Command::CloseSession { session, user } => Kind::close_session(pb::CloseSession {
                session: session.get(),
                user: user_value(user),
                ..Default::default()
            }),
            Command::ExpireSession { session, delays } => Kind::expire_session(pb::ExpireSession {
                session: session.get(),
                delays: delays
                    .into_iter()
                    .map(|(prefix, delay)| pb::DelayRule {
                        prefix,
                        delay_ms: delay.get(),
                        ..Default::default()
                    })
                    .collect(),
                ..Default::default()
            }),
        };
        pb::Command { kind: Some(kind), ..Default::default() }
    }
}

/// A user field of the wire format: empty means none.
fn optional_user(bytes: Vec<u8>) -> Result<Option<Owner>, InvalidReason> {
    if bytes.is_empty() {
        return Ok(None);
    }
    Owner::new(bytes).map(Some)
}

fn user_value(user: Option<Owner>) -> Vec<u8> {
    user.map_or_else(Vec::new, Owner::into_bytes)
}

/// Encodes commands as the payload of one raft log entry: the bytes
/// protobuf writes for a `CommandBatch` of them, the hot commands written
/// directly (see `fast_batch`), the others through protobuf.
pub fn encode_batch(commands: &[Command]) -> Vec<u8> {
    let mut out = Vec::with_capacity(commands.len() * 48);
    for command in commands {
        if !crate::fast_batch::encode(command, &mut out) {
            // A batch is its commands' fields one after the other: one
            // command's batch is its field.
            out.extend(encode_batch_pb(std::iter::once(command.to_pb())));
        }
    }
    out
}

/// [`encode_batch`] of commands given up.
pub fn encode_owned_batch(commands: Vec<Command>) -> Vec<u8> {
    encode_batch(&commands)
}

/// A batch encoded by protobuf alone: the reference of [`encode_batch`].
pub(crate) fn encode_batch_pb(commands: impl Iterator<Item = pb::Command>) -> Vec<u8> {
    let batch = pb::CommandBatch { commands: commands.collect(), ..Default::default() };
    batch.write_to_bytes().expect("encoding a CommandBatch into a Vec cannot fail")
}

/// Decodes the payload of one raft log entry. The outer error means the
/// bytes are not a batch at all; otherwise each command is checked on its
/// own, so one invalid command does not void the others.
pub fn decode_batch(bytes: &[u8]) -> Result<Vec<Result<Command, InvalidReason>>, InvalidReason> {
    if let Some(commands) = crate::fast_batch::decode(bytes) {
        return Ok(commands);
    }
    decode_batch_pb(bytes)
}

/// [`decode_batch`] through protobuf alone: the reference the fast path
/// must agree with, and what decodes every batch the fast path declines.
pub(crate) fn decode_batch_pb(bytes: &[u8]) -> Result<Vec<Result<Command, InvalidReason>>, InvalidReason> {
    let batch = pb::CommandBatch::parse_from_bytes(bytes).map_err(|_| InvalidReason::Undecodable)?;
    Ok(batch.commands.into_iter().map(Command::from_pb).collect())
}

/// What a batch's `RaiseLevel` and `Bootstrap` commands would raise if it
/// were applied: the highest command level and token floor any of them
/// names (0 for none).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Raises {
    pub level: u32,
    pub token_floor: u64,
}

/// See [`Raises`]. A batch of hot commands (the common one) is recognised
/// from its bytes without decoding it, and raises nothing; any other is
/// decoded as every replica decodes it to apply it, so that what is read
/// here is exactly what applying would raise, however the bytes are laid
/// out.
pub fn raises(bytes: &[u8]) -> Raises {
    if crate::fast_batch::only_hot_kinds(bytes) {
        return Raises::default();
    }
    // Bytes that are not a batch change nothing when applied.
    let commands = decode_batch_pb(bytes).unwrap_or_default();
    commands.iter().flatten().fold(Raises::default(), |raises, command| match command {
        Command::RaiseLevel { level } => Raises { level: raises.level.max(*level), ..raises },
        Command::Bootstrap { level, token_floor, .. } => {
            Raises { level: raises.level.max(*level), token_floor: raises.token_floor.max(*token_floor) }
        }
        _ => raises,
    })
}
