//! Tokens per KV block and the arithmetic on it: whole blocks in a token count, blocks a
//! count needs, a count's offset in its last block. The block size is a setting, so a
//! division by it is a hardware divide (tens of cycles on x86, several per admission, step
//! and finish); for a power of two (vLLM's sizes, abe's default 16) these are shifts and
//! masks. Pure arithmetic: nothing here allocates or branches on anything but the size.

/// Tokens per KV block (at least 1), with its shift and mask when it is a power of two.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct BlockSize {
    tokens: u32,
    /// `log2(tokens)` when `tokens` is a power of two, else [`NOT_POW2`].
    shift: u32,
}

/// [`BlockSize::shift`] of a size that is not a power of two.
const NOT_POW2: u32 = u32::MAX;

impl BlockSize {
    /// `tokens` a block (0 reads as 1).
    pub(super) fn new(tokens: u32) -> BlockSize {
        let tokens = tokens.max(1);
        let shift = if tokens.is_power_of_two() {
            tokens.trailing_zeros()
        } else {
            NOT_POW2
        };
        BlockSize { tokens, shift }
    }

    /// Tokens a block holds.
    #[inline(always)]
    pub(super) fn tokens(self) -> u32 {
        self.tokens
    }

    /// Whole blocks in `n` tokens: `n / tokens`.
    #[inline(always)]
    pub(super) fn whole(self, n: u32) -> u32 {
        if self.shift != NOT_POW2 {
            n >> self.shift
        } else {
            n / self.tokens
        }
    }

    /// Blocks `n` tokens take: `ceil(n / tokens)`.
    #[inline(always)]
    pub(super) fn needed(self, n: u32) -> u32 {
        if self.shift != NOT_POW2 {
            // In 64 bits: `n + tokens - 1` does not wrap.
            ((u64::from(n) + u64::from(self.tokens - 1)) >> self.shift) as u32
        } else {
            n.div_ceil(self.tokens)
        }
    }

    /// `n`'s offset in its block: `n % tokens`.
    #[inline(always)]
    pub(super) fn offset(self, n: u32) -> u32 {
        if self.shift != NOT_POW2 {
            n & (self.tokens - 1)
        } else {
            n % self.tokens
        }
    }
}

#[cfg(test)]
mod tests {
    use super::BlockSize;

    #[test]
    fn shifts_and_divisions_agree_for_every_size() {
        for tokens in [
            0u32,
            1,
            2,
            3,
            5,
            7,
            15,
            16,
            17,
            31,
            32,
            48,
            64,
            100,
            256,
            1 << 20,
        ] {
            let bs = BlockSize::new(tokens);
            let t = tokens.max(1);
            assert_eq!(bs.tokens(), t);
            for n in (0..600).chain([u32::MAX - 1, u32::MAX, (1 << 31) + 5]) {
                assert_eq!(bs.whole(n), n / t, "{n} / {t}");
                assert_eq!(bs.needed(n), n.div_ceil(t), "ceil({n} / {t})");
                assert_eq!(bs.offset(n), n % t, "{n} % {t}");
            }
        }
    }
}
