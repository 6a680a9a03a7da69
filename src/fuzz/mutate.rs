//! Mutations of one input: bit flips, random bytes, dictionary tokens (the grammar's
//! delimiters and edge numbers), deletions, duplications and splices with another corpus
//! entry; one to four stacked per execution. Deterministic in the RNG passed in.
//!
//! What must never happen here: an input past `len_max` (a target's limits are tested by
//! its own seeds, not by ever-growing inputs), or reading any randomness but `rng`.

use rand::rngs::SmallRng;
use rand::Rng;

/// Numbers that sit on edges: zero, signs, overflow of u32/u64/usize, floats that are not.
pub const EDGE_NUMBERS: &[&[u8]] = &[
    b"0",
    b"-1",
    b"+1",
    b"1e309",
    b"-0",
    b"4294967296",
    b"18446744073709551615",
    b"18446744073709551616",
    b"99999999999999999999999",
    b"NaN",
    b"0.5",
    b"1e-7",
];

/// Produces mutants of corpus entries.
pub struct Mutator {
    /// Tokens of the target's grammar, inserted whole.
    pub dictionary: &'static [&'static [u8]],
    /// Longest mutant, in bytes.
    pub len_max: usize,
}

impl Mutator {
    /// A mutant of `base`, sometimes spliced with `other`.
    pub fn mutate(&self, rng: &mut SmallRng, base: &[u8], other: &[u8]) -> Vec<u8> {
        let mut out = base.to_vec();
        let rounds = rng.gen_range(1..=4);
        for _ in 0..rounds {
            self.once(rng, &mut out, other);
        }
        out.truncate(self.len_max);
        out
    }

    fn once(&self, rng: &mut SmallRng, out: &mut Vec<u8>, other: &[u8]) {
        let at = |rng: &mut SmallRng, len: usize| rng.gen_range(0..=len);
        match rng.gen_range(0..9) {
            0 if !out.is_empty() => {
                let i = rng.gen_range(0..out.len());
                out[i] ^= 1 << rng.gen_range(0..8);
            }
            1 if !out.is_empty() => {
                let i = rng.gen_range(0..out.len());
                out[i] = rng.gen();
            }
            2 | 3 if !self.dictionary.is_empty() => {
                let token = self.dictionary[rng.gen_range(0..self.dictionary.len())];
                let i = at(rng, out.len());
                out.splice(i..i, token.iter().copied());
            }
            4 => {
                let token = EDGE_NUMBERS[rng.gen_range(0..EDGE_NUMBERS.len())];
                // Replace a run of digits (or insert where there is none).
                let i = at(rng, out.len());
                let end = i + out[i..].iter().take_while(|b| b.is_ascii_digit()).count();
                out.splice(i..end, token.iter().copied());
            }
            5 if !out.is_empty() => {
                let i = rng.gen_range(0..out.len());
                let n = rng.gen_range(1..=16).min(out.len() - i);
                out.drain(i..i + n);
            }
            6 if !out.is_empty() => {
                let i = rng.gen_range(0..out.len());
                let n = rng.gen_range(1..=32).min(out.len() - i);
                let piece = out[i..i + n].to_vec();
                let j = at(rng, out.len());
                out.splice(j..j, piece);
            }
            7 if !other.is_empty() => {
                let i = at(rng, out.len());
                let j = rng.gen_range(0..other.len());
                out.truncate(i);
                out.extend_from_slice(&other[j..]);
            }
            _ => {
                let i = at(rng, out.len());
                let n = rng.gen_range(1..=8);
                let bytes: Vec<u8> = (0..n).map(|_| rng.gen()).collect();
                out.splice(i..i, bytes);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn the_same_seed_makes_the_same_mutants_within_the_length_bound() {
        let m = Mutator {
            dictionary: &[b"\r\n", b": "],
            len_max: 64,
        };
        let run = |seed| {
            let mut rng = SmallRng::seed_from_u64(seed);
            (0..200)
                .map(|_| m.mutate(&mut rng, b"GET / HTTP/1.1\r\n\r\n", b"Host: x\r\n"))
                .collect::<Vec<_>>()
        };
        let a = run(7);
        assert_eq!(a, run(7));
        assert_ne!(a, run(8));
        assert!(a.iter().all(|m| m.len() <= 64));
        assert!(a.iter().any(|m| m.as_slice() != b"GET / HTTP/1.1\r\n\r\n"));
    }
}
