//! Oracle pre-binning: multi-bin batching emulated by the order requests are fed to the core.
//!
//! For a saturated backlog (every request at t = 0) a FIFO core with a fixed batch size `B`
//! and full batches only takes requests `B` at a time in admission order. Sorting the backlog
//! into `K` equal-mass bins by output length (the oracle prediction) and then feeding it as
//! whole groups of `B` from one bin after another, round robin over the bins, makes every
//! batch the real core forms come from a single bin: exactly the multi-bin policy of
//! Guldogan et al. (Algorithm 1 of the paper: bins fill to `B`, full batches served in
//! order). It stands in for the `multi_bin` strategy until that strategy exists, and is only
//! meaningful for saturated arrivals (the driver refuses it otherwise). It reorders; it never
//! adds, drops or changes a request.

use super::workload::SimRequest;

/// The requests reordered into `B`-sized single-bin groups, round robin over `bins`
/// equal-mass bins by output length. Ties in length keep their original order; bin `i`
/// holds ranks `[i n / K, (i + 1) n / K)`.
pub fn interleave_bins(requests: &[SimRequest], bins: usize, batch: usize) -> Vec<SimRequest> {
    let n = requests.len();
    let bins = bins.max(1);
    let batch = batch.max(1);
    if bins == 1 || n == 0 {
        return requests.to_vec();
    }
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by_key(|&i| (requests[i].output_tokens, i));
    // Bin of each request by rank; within a bin keep arrival (index) order.
    let mut per_bin: Vec<Vec<usize>> = vec![Vec::with_capacity(n / bins + 1); bins];
    for (rank, &i) in order.iter().enumerate() {
        per_bin[rank * bins / n].push(i);
    }
    for b in &mut per_bin {
        b.sort_unstable();
    }
    let mut cursor = vec![0usize; bins];
    let mut out = Vec::with_capacity(n);
    while out.len() < n {
        for (b, members) in per_bin.iter().enumerate() {
            let from = cursor[b];
            let to = (from + batch).min(members.len());
            out.extend(members[from..to].iter().map(|&i| requests[i]));
            cursor[b] = to;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::Priority;

    fn req(out: u32) -> SimRequest {
        SimRequest {
            arrival_ns: 0,
            prompt_tokens: 0,
            output_tokens: out,
            predicted_output_tokens: out,
            priority: Priority::Normal,
            prefix: Default::default(),
        }
    }

    #[test]
    fn groups_of_b_come_from_one_bin_and_nothing_is_lost() {
        // 16 requests, lengths 16..1 descending; K = 2, B = 4.
        let reqs: Vec<SimRequest> = (1..=16).rev().map(req).collect();
        let out = interleave_bins(&reqs, 2, 4);
        let lens: Vec<u32> = out.iter().map(|r| r.output_tokens).collect();
        // Bin 0 = lengths 1..=8, bin 1 = 9..=16, each in original (descending) order.
        assert_eq!(
            lens,
            [8, 7, 6, 5, 16, 15, 14, 13, 4, 3, 2, 1, 12, 11, 10, 9]
        );
        let mut sorted = lens.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (1..=16).collect::<Vec<u32>>());
        assert_eq!(interleave_bins(&reqs, 1, 4), reqs);
    }
}
