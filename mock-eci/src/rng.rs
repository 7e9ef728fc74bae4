//! A tiny deterministic generator (SplitMix64): ids, delays in a range and fault draws must be
//! reproducible from `--seed`, and a bijective mix guarantees distinct ids for distinct counters.

/// One step of SplitMix64's output function: a bijection on `u64`.
pub fn mix(mut value: u64) -> u64 {
    value = value.wrapping_add(0x9E37_79B9_7F4A_7C15);
    value = (value ^ (value >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    value = (value ^ (value >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    value ^ (value >> 31)
}

/// A stable 64-bit hash of bytes (FNV-1a, then mixed): stable across processes and versions,
/// unlike `DefaultHasher`, so it can be persisted.
pub fn stable_hash(bytes: &[u8]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in bytes {
        hash ^= u64::from(*byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    mix(hash)
}

/// A seeded stream of pseudo-random numbers.
#[derive(Debug, Clone)]
pub struct SplitMix {
    state: u64,
}

impl SplitMix {
    /// A stream starting from `seed`.
    pub fn new(seed: u64) -> Self {
        Self { state: seed }
    }

    /// The next number.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        mix(self.state)
    }

    /// A number in `[0, 1)`.
    pub fn next_f64(&mut self) -> f64 {
        // 53 random bits, the precision of an f64 mantissa.
        #[allow(clippy::cast_precision_loss)]
        let value = (self.next_u64() >> 11) as f64;
        value / (1u64 << 53) as f64
    }
}

/// Renders `value` in base 36 with lowercase digits, left-padded with zeros to `width`.
pub fn base36(mut value: u64, width: usize) -> String {
    const DIGITS: &[u8; 36] = b"0123456789abcdefghijklmnopqrstuvwxyz";
    let mut out = Vec::with_capacity(width);
    while value > 0 {
        out.push(DIGITS[(value % 36) as usize]);
        value /= 36;
    }
    while out.len() < width {
        out.push(b'0');
    }
    out.reverse();
    String::from_utf8(out).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_stream() {
        let mut a = SplitMix::new(7);
        let mut b = SplitMix::new(7);
        for _ in 0..10 {
            assert_eq!(a.next_u64(), b.next_u64());
        }
        let x = SplitMix::new(1).next_f64();
        assert!((0.0..1.0).contains(&x));
    }

    #[test]
    fn base36_pads_and_encodes() {
        assert_eq!(base36(0, 3), "000");
        assert_eq!(base36(35, 2), "0z");
        assert_eq!(base36(36, 1), "10");
        assert_eq!(base36(u64::MAX, 13).len(), 13);
    }

    #[test]
    fn stable_hash_is_stable() {
        assert_eq!(stable_hash(b"abc"), stable_hash(b"abc"));
        assert_ne!(stable_hash(b"abc"), stable_hash(b"abd"));
    }
}
