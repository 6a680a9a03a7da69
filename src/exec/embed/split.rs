//! Splitting a batch into forward passes by length.
//!
//! A forward pass pads every input to its longest, so one long input among short ones makes
//! every row pay for its length: 7 inputs of 16 tokens and 1 of 128 compute 8 x 128
//! positions, 4.3x the 240 real ones. The engine's token buckets keep such inputs apart
//! only when abe's estimate puts them in different buckets (the first one holds up to 128
//! estimated tokens), so the worker finishes the job: it sorts a batch's inputs longest
//! first and cuts the sorted list into the passes that minimise
//! `sum(PASS_COST_TOKENS + rows x longest)` (exact, by dynamic programming over the cuts;
//! a batch holds at most a few hundred inputs). Inputs of one length never split: a second
//! pass would only add its fixed cost.
//!
//! What must never happen here: reordering the answers (the caller scatters each vector
//! back to its input by index), or a plan that depends on anything but the lengths.

/// What one more forward pass costs, in padded token positions. A pass's time is about
/// fixed + per-position x positions; through batches of 8 and 64 inputs of 16 tokens with
/// abe's fused encoder (16 ms for 128 positions, 85-91 ms for 1024; 2026-11-24, the 2-vCPU
/// AVX-512 box: BENCHMARKS.md), the fixed part is worth ~70 positions. Smaller passes cost
/// more per position, so this errs on the side of fewer passes.
pub const PASS_COST_TOKENS: usize = 96;

/// Scratch for [`Plan::make`], kept by the executor so a batch allocates nothing once the
/// vectors have grown to the largest batch.
#[derive(Debug, Default)]
pub struct Plan {
    /// Input indices, longest first (ties in input order).
    pub order: Vec<usize>,
    /// Ends of the passes in `order`: pass `k` is `order[cuts[k - 1]..cuts[k]]` (from 0).
    pub cuts: Vec<usize>,
    /// `best[j]`: the least cost of the first `j` sorted inputs, and where its last pass
    /// starts.
    best: Vec<(usize, usize)>,
}

impl Plan {
    /// Plans the passes for inputs of `lens` tokens.
    pub fn make(&mut self, lens: &[usize]) {
        let n = lens.len();
        self.order.clear();
        self.order.extend(0..n);
        // Stable: equal lengths keep their input order.
        self.order.sort_by(|&a, &b| lens[b].cmp(&lens[a]));
        self.best.clear();
        self.best.push((0, 0));
        for j in 1..=n {
            // The last pass is sorted inputs i..j; its longest is the first, order[i].
            let (cost, start) = (0..j)
                .map(|i| {
                    let rows = j - i;
                    let pass = PASS_COST_TOKENS + rows * lens[self.order[i]];
                    (self.best[i].0 + pass, i)
                })
                .min()
                .expect("j >= 1");
            self.best.push((cost, start));
        }
        self.cuts.clear();
        let mut end = n;
        while end > 0 {
            self.cuts.push(end);
            end = self.best[end].1;
        }
        self.cuts.reverse();
    }

    /// The passes, as slices of input indices, longest pass first.
    pub fn passes(&self) -> impl Iterator<Item = &[usize]> {
        let mut start = 0;
        self.cuts.iter().map(move |&end| {
            let pass = &self.order[start..end];
            start = end;
            pass
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(lens: &[usize]) -> Vec<Vec<usize>> {
        let mut p = Plan::default();
        p.make(lens);
        p.passes().map(<[usize]>::to_vec).collect()
    }

    #[test]
    fn one_long_input_among_short_ones_runs_alone() {
        let mut lens = vec![16; 7];
        lens.insert(3, 128);
        assert_eq!(plan(&lens), [vec![3], vec![0, 1, 2, 4, 5, 6, 7]]);
    }

    #[test]
    fn equal_or_close_lengths_stay_in_one_pass() {
        assert_eq!(plan(&[16; 64]), [(0..64).collect::<Vec<_>>()]);
        let lens: Vec<usize> = (0..64).map(|i| 14 + i % 5).collect();
        assert_eq!(plan(&lens).len(), 1);
        assert_eq!(plan(&[20]), [vec![0]]);
        assert!(plan(&[]).is_empty());
    }

    #[test]
    fn every_input_is_in_exactly_one_pass_and_the_plan_is_no_costlier_than_one_pass() {
        let cost = |lens: &[usize], passes: &[Vec<usize>]| -> usize {
            passes
                .iter()
                .map(|p| PASS_COST_TOKENS + p.len() * p.iter().map(|&i| lens[i]).max().unwrap())
                .sum()
        };
        let mut seed = 7u64;
        for n in 1..80 {
            let lens: Vec<usize> = (0..n)
                .map(|_| {
                    seed = seed
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    1 + (seed >> 33) as usize % 256
                })
                .collect();
            let passes = plan(&lens);
            let mut seen: Vec<usize> = passes.iter().flatten().copied().collect();
            seen.sort_unstable();
            assert_eq!(seen, (0..n).collect::<Vec<_>>());
            let one = vec![(0..n).collect::<Vec<_>>()];
            assert!(cost(&lens, &passes) <= cost(&lens, &one), "{lens:?}");
            // Each pass holds a contiguous run of lengths (no pass interleaves another's).
            for w in passes.windows(2) {
                let shortest_before = w[0].iter().map(|&i| lens[i]).min().unwrap();
                let longest_after = w[1].iter().map(|&i| lens[i]).max().unwrap();
                assert!(shortest_before >= longest_after, "{lens:?}");
            }
        }
    }
}
