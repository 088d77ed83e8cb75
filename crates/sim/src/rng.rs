//! The simulation's only source of randomness: SplitMix64, seeded from the
//! run's seed, so that a seed replays byte for byte on any machine.

#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number in `low..high` (`low` when the range is empty).
    pub fn range(&mut self, low: u64, high: u64) -> u64 {
        if high <= low {
            return low;
        }
        low + self.next_u64() % (high - low)
    }

    /// True with probability `per_million` / 1,000,000.
    pub fn chance(&mut self, per_million: u64) -> bool {
        self.next_u64() % 1_000_000 < per_million
    }

    /// One of `choices`, which must not be empty.
    pub fn pick<T: Copy>(&mut self, choices: &[T]) -> T {
        choices[(self.next_u64() % choices.len() as u64) as usize]
    }
}

#[cfg(test)]
mod tests {
    use super::Rng;

    #[test]
    fn a_seed_gives_one_sequence() {
        let a: Vec<u64> = (0..5).scan(Rng::new(42), |rng, _| Some(rng.next_u64())).collect();
        let b: Vec<u64> = (0..5).scan(Rng::new(42), |rng, _| Some(rng.next_u64())).collect();
        let c: Vec<u64> = (0..5).scan(Rng::new(43), |rng, _| Some(rng.next_u64())).collect();
        assert_eq!(a, b);
        assert_ne!(a, c);
    }

    #[test]
    fn ranges_and_chances_stay_in_bounds() {
        let mut rng = Rng::new(7);
        for _ in 0..1000 {
            let n = rng.range(10, 20);
            assert!((10..20).contains(&n));
        }
        assert!(!(0..1000).any(|_| rng.chance(0)));
        assert!((0..1000).all(|_| rng.chance(1_000_000)));
    }
}
