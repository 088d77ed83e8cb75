//! [`Builds`]: what each node's build says of itself, and when the old ones
//! upgrade, drawn from a stream of their own. `upgrade.rs` carries the
//! upgrades out and says why.

use fencelock_types::LEVEL;

use crate::rng::Rng;

/// The salt that sets the upgrades' stream apart from the seed's main one.
const UPGRADE_SALT: u64 = 0x7570_6772_6164_6573;

/// What each node's build says of itself, and when the old ones upgrade.
#[derive(Clone, Debug)]
pub(crate) struct Builds {
    /// Per node: the level its hellos say until its upgrade, and when.
    pub old: Vec<Option<(u32, u64)>>,
    /// The upgrades' own stream.
    pub rng: Rng,
}

impl Builds {
    /// Draws the builds of a cluster of `nodes` founded at
    /// `founding_level`: none old when it is [`LEVEL`].
    pub(crate) fn draw(seed: u64, nodes: usize, founding_level: u32, fault_ms: u64) -> Builds {
        let mut rng = Rng::new(seed ^ UPGRADE_SALT);
        let old = (0..nodes)
            .map(|_| {
                if founding_level >= LEVEL || !rng.chance(500_000) {
                    return None;
                }
                // A cluster at level 1 may run builds before levels (their
                // hellos say 0) and level-2 builds; one at 2, level-2 ones.
                let said: Vec<u32> = (founding_level == 1).then_some(0).into_iter().chain(2..LEVEL).collect();
                let level = rng.pick(&said);
                Some((level, rng.range(0, fault_ms)))
            })
            .collect();
        Builds { old, rng }
    }
}
