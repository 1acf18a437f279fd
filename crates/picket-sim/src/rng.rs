//! A small seeded random number generator (SplitMix64), written out so that a seed gives the same
//! run on every platform and every version of every dependency.

/// SplitMix64: fast, good enough for simulation, and fully specified.
#[derive(Clone, Debug)]
pub struct Rng {
    state: u64,
}

impl Rng {
    /// A generator for `seed`.
    #[must_use]
    pub fn new(seed: u64) -> Self {
        Self { state: seed ^ 0x9E37_79B9_7F4A_7C15 }
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        #[allow(clippy::cast_precision_loss)]
        let value = (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
        value
    }

    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        self.unit() < p
    }

    /// Uniform in [low, high).
    pub fn range(&mut self, low: u64, high: u64) -> u64 {
        assert!(low < high, "empty range");
        low + self.next_u64() % (high - low)
    }

    /// Exponentially distributed with the given mean, in microseconds.
    pub fn exp_us(&mut self, mean_us: f64) -> u64 {
        let sample = -mean_us * (1.0 - self.unit()).ln();
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let sample = sample.min(1e12) as u64;
        sample
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_seed_gives_the_same_stream() {
        let (mut a, mut b) = (Rng::new(7), Rng::new(7));
        for _ in 0..100 {
            assert_eq!(a.next_u64(), b.next_u64());
        }
        assert_ne!(Rng::new(7).next_u64(), Rng::new(8).next_u64());
        let mut rng = Rng::new(1);
        // Draws of a mean of 1,000 us are far below 2^52: exact in an f64.
        #[allow(clippy::cast_precision_loss)]
        let mean: f64 = (0..10_000).map(|_| rng.exp_us(1_000.0) as f64).sum::<f64>() / 10_000.0;
        assert!((900.0..1_100.0).contains(&mean), "{mean}");
    }
}
