//! Splitting a batch into forward passes by length.
//!
//! A forward pass pads every input to its longest, so one long input among short ones makes
//! every row pay for its length: 7 inputs of 16 tokens and 1 of 128 compute 8 x 128
//! positions, 4.3x the 240 real ones. The engine's token buckets keep such inputs apart
//! only when abe's estimate puts them in different buckets (the first one holds up to 128
//! estimated tokens), so the worker finishes the job: it sorts a batch's inputs longest
//! first and cuts the sorted list into the passes that minimise
//! `sum(PASS_COST_TOKENS + rows x longest)` (exact, by dynamic programming over the cuts
//! between runs of equal length: quadratic in the distinct lengths, not in the batch).
//! Inputs of one length never split: a second pass would only add its fixed cost.
//!
//! What must never happen here: reordering the answers (the caller scatters each vector
//! back to its input by index), or a plan that depends on anything but the lengths.

/// What one more forward pass costs, in padded token positions. A pass's time is about
/// fixed + per-position x positions; through batches of 8 and 64 inputs of 16 tokens with
/// abe's fused encoder (16 ms for 128 positions, 85-91 ms for 1024; 2026-11-24, the 2-vCPU
/// AVX-512 box: BENCHMARKS.md), the fixed part is worth ~70 positions. Smaller passes cost
/// more per position, so this errs on the side of fewer passes.
pub const PASS_COST_TOKENS: usize = 96;

/// Scratch for [`Plan::make`], kept by the executor so its vectors grow once, to the
/// largest batch, and are reused after.
#[derive(Debug, Default)]
pub struct Plan {
    /// Input indices, longest first (ties in input order).
    pub order: Vec<usize>,
    /// Ends of the passes in `order`: pass `k` is `order[cuts[k - 1]..cuts[k]]` (from 0).
    pub cuts: Vec<usize>,
    /// Where each run of equal lengths ends in `order`, and its length.
    runs: Vec<(usize, usize)>,
    /// `best[j]`: the least cost of the first `j` runs, and the run its last pass starts at.
    best: Vec<(usize, usize)>,
}

impl Plan {
    /// Plans the passes for inputs of `lens` tokens.
    ///
    /// An optimal plan never cuts between two inputs of one length (moving the cut to the
    /// run's edge costs no more), so the search runs over runs of equal length: O(d^2) for
    /// d distinct lengths (at most the model's max_seq_length), whatever the batch size.
    pub fn make(&mut self, lens: &[usize]) {
        let n = lens.len();
        self.order.clear();
        self.order.extend(0..n);
        // Stable: equal lengths keep their input order.
        self.order.sort_by(|&a, &b| lens[b].cmp(&lens[a]));
        self.runs.clear();
        for (at, &i) in self.order.iter().enumerate() {
            match self.runs.last_mut() {
                Some((end, len)) if *len == lens[i] => *end = at + 1,
                _ => self.runs.push((at + 1, lens[i])),
            }
        }
        self.best.clear();
        self.best.push((0, 0));
        for j in 1..=self.runs.len() {
            let end = self.runs[j - 1].0;
            // The last pass is runs i..j: from the end of run i - 1 to the end of run j - 1,
            // its longest the length of run i.
            let (cost, start) = (0..j)
                .map(|i| {
                    let begin = if i == 0 { 0 } else { self.runs[i - 1].0 };
                    let pass = PASS_COST_TOKENS + (end - begin) * self.runs[i].1;
                    (self.best[i].0 + pass, i)
                })
                .min()
                .expect("j >= 1");
            self.best.push((cost, start));
        }
        self.cuts.clear();
        let mut j = self.runs.len();
        while j > 0 {
            self.cuts.push(self.runs[j - 1].0);
            j = self.best[j].1;
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

    /// The least cost over every way of cutting the sorted lengths (2^(n-1) of them).
    fn brute_force(lens: &[usize]) -> usize {
        let mut sorted = lens.to_vec();
        sorted.sort_unstable_by(|a, b| b.cmp(a));
        let n = sorted.len();
        (0..1usize << (n - 1))
            .map(|cuts| {
                let (mut cost, mut begin) = (0, 0);
                for end in 1..=n {
                    if end == n || cuts & (1 << (end - 1)) != 0 {
                        cost += PASS_COST_TOKENS + (end - begin) * sorted[begin];
                        begin = end;
                    }
                }
                cost
            })
            .min()
            .unwrap()
    }

    #[test]
    fn the_plan_is_the_cheapest_cut_of_the_sorted_lengths() {
        let mut seed = 11u64;
        for n in 1..=10 {
            for _ in 0..30 {
                let lens: Vec<usize> = (0..n)
                    .map(|_| {
                        seed = seed
                            .wrapping_mul(6364136223846793005)
                            .wrapping_add(1442695040888963407);
                        // Few distinct lengths, so runs of equal ones occur.
                        [4, 16, 17, 40, 128, 256][(seed >> 33) as usize % 6]
                    })
                    .collect();
                let mut p = Plan::default();
                p.make(&lens);
                let cost: usize = p
                    .passes()
                    .map(|pass| {
                        PASS_COST_TOKENS + pass.len() * pass.iter().map(|&i| lens[i]).max().unwrap()
                    })
                    .sum();
                assert_eq!(cost, brute_force(&lens), "{lens:?}");
            }
        }
    }

    #[test]
    fn a_huge_batch_of_few_lengths_plans_at_once() {
        // 100,000 inputs of two lengths: two runs, so the search is tiny.
        let lens: Vec<usize> = (0..100_000)
            .map(|i| if i % 8 == 0 { 142 } else { 16 })
            .collect();
        let passes = plan(&lens);
        assert_eq!(passes.len(), 2);
        assert_eq!(passes[0].len(), 12_500);
        assert!(passes[0].iter().all(|&i| lens[i] == 142));
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
