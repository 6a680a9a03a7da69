//! Unit tests for `bins` (kept here so `bins.rs` stays short) and a worked example of the
//! building blocks together: statistics -> boundaries -> per-bin caps -> `min(b_mem, b_sla)`.
//! Every expected number is computed by hand in the comment beside it.

use super::batch_stats::{BatchObservation, BatchStats};
use super::bins::{
    choose_age_aware, longest_queue, BinBoundaries, BinPolicy, LengthPredictor, PredictorKind,
    RoundRobin,
};
use super::memory::MemoryModel;
use super::sla::{SlaController, SlaParams};
use crate::core::request::{Kind, Priority, RequestMeta};

#[test]
fn initial_boundaries_are_equal_width() {
    let b = BinBoundaries::new(4, 4096, 16);
    // 1 + floor(i x 4095 / 4): 1, 1024, 2048, 3072, 4096.
    assert_eq!(b.edges(), &[1, 1024, 2048, 3072, 4096]);
    assert_eq!(b.bounds(1), (1024, 2048));
    assert_eq!(b.bin_of(0), 0); // below the first edge: bin 0, not the last bin
    assert_eq!(b.bin_of(1023), 0);
    assert_eq!(b.bin_of(1024), 1);
    assert_eq!(b.bin_of(3071), 2);
    assert_eq!(b.bin_of(4096), 3);
    assert_eq!(b.bin_of(u32::MAX), 3);
}

#[test]
fn equal_mass_boundaries_are_linear_quantiles() {
    let mut b = BinBoundaries::new(4, 4096, 128);
    let samples: Vec<u32> = (1..=100).rev().collect();
    assert!(b.recompute_equal_mass(&samples));
    // numpy quantile of 1..=100 at 0, .25, .5, .75: 1, 25.75, 50.5, 75.25 -> int.
    assert_eq!(b.edges(), &[1, 25, 50, 75, 4096]);
    assert_eq!(b.bin_of(24), 0);
    assert_eq!(b.bin_of(25), 1);
    assert_eq!(b.bin_of(75), 3);
    // Unsorted input, K = 2: sorted 1 3 7 10, h = 1.5 -> 3 + 0.5 x 4 = 5.
    let mut b = BinBoundaries::new(2, 4096, 4);
    assert!(b.recompute_equal_mass(&[10, 1, 7, 3]));
    assert_eq!(b.edges(), &[1, 5, 4096]);
    // K = 3 over [1, 2]: 1.33 and 1.67 truncate to 1: bin 1 is the empty [1, 1).
    let mut b = BinBoundaries::new(3, 4096, 4);
    assert!(b.recompute_equal_mass(&[2, 1]));
    assert_eq!(b.edges(), &[1, 1, 1, 4096]);
    assert_eq!(b.bin_of(1), 2);
    assert_eq!(b.bin_of(0), 0);
}

#[test]
fn repeated_values_make_empty_bins_and_the_value_lands_in_the_last() {
    let mut b = BinBoundaries::new(4, 4096, 16);
    assert!(b.recompute_equal_mass(&[5; 10]));
    assert_eq!(b.edges(), &[5, 5, 5, 5, 4096]);
    assert_eq!(b.bin_of(5), 3); // [5, 5) x 3 are empty, [5, 4096) holds 5
    assert_eq!(b.bin_of(4), 0);
}

#[test]
fn recompute_keeps_boundaries_without_samples_and_caps_at_the_limit() {
    let mut b = BinBoundaries::new(2, 100, 8);
    assert!(!b.recompute_equal_mass(&[]));
    // 1 + floor(99 / 2) = 50.
    assert_eq!(b.edges(), &[1, 50, 100]);
    // Samples above the limit clamp to it; only the first 8 (scratch size) are used:
    // 8 x 500 -> every quantile 500 -> clamped to 100.
    let mut samples = [500u32; 12];
    samples[10] = 1;
    assert!(b.recompute_equal_mass(&samples));
    assert_eq!(b.edges(), &[100, 100, 100]);
    b.reset_equal_width();
    assert_eq!(b.edges(), &[1, 50, 100]);
}

#[test]
fn a_single_bin_takes_everything() {
    let mut b = BinBoundaries::new(1, 4096, 8);
    assert_eq!(b.edges(), &[1, 4096]);
    assert!(b.recompute_equal_mass(&[7, 9, 300]));
    assert_eq!(b.edges(), &[7, 4096]);
    for len in [0, 7, 4096, u32::MAX] {
        assert_eq!(b.bin_of(len), 0);
    }
}

#[test]
fn round_robin_scans_from_after_the_last_served_bin() {
    let mut s = RoundRobin::default();
    let lens = [0, 3, 0, 2];
    assert_eq!(s.choose(&lens), Some(1));
    assert_eq!(s.choose(&lens), Some(3));
    assert_eq!(s.choose(&lens), Some(1)); // wraps past the empty bin 0
    assert_eq!(s.choose(&[0, 0, 0, 0]), None);
    assert_eq!(s.choose(&[4, 0, 0, 0]), Some(0)); // cursor was at 2: wraps to 0
    assert_eq!(s.choose(&[]), None);
    // K = 1.
    let mut s = RoundRobin::default();
    assert_eq!(s.choose(&[5]), Some(0));
    assert_eq!(s.choose(&[5]), Some(0));
    assert_eq!(s.choose(&[0]), None);
}

#[test]
fn longest_queue_breaks_ties_to_the_lowest_index() {
    assert_eq!(longest_queue(&[2, 5, 5, 1]), Some(1));
    assert_eq!(longest_queue(&[0, 0, 3]), Some(2));
    assert_eq!(longest_queue(&[0, 0]), None);
    assert_eq!(longest_queue(&[9]), Some(0));
}

#[test]
fn policy_and_predictor_names_round_trip_and_typos_are_errors() {
    for p in BinPolicy::ALL {
        assert_eq!(p.as_str().parse::<BinPolicy>().unwrap(), p);
    }
    for k in PredictorKind::ALL {
        assert_eq!(k.as_str().parse::<PredictorKind>().unwrap(), k);
    }
    let e = "weighted".parse::<BinPolicy>().unwrap_err();
    assert_eq!(
        e.to_string(),
        "unknown bin policy 'weighted': valid values are age_aware, response_ratio, round_robin, longest_queue"
    );
    assert!("oracle".parse::<PredictorKind>().is_err());
}

#[test]
fn max_tokens_predictor_and_hint_precedence() {
    let p = LengthPredictor::new(PredictorKind::MaxTokens);
    assert_eq!(p.predict(100, 256, 0), 256);
    assert_eq!(p.predict(100, 256, 50), 50); // the hint wins
    assert_eq!(p.predict(100, 256, 500), 256); // never above max_tokens
    assert_eq!(p.predict(100, 0, 0), 0); // embedding
}

#[test]
fn ema_predictor_learns_per_prompt_bucket() {
    let mut p = LengthPredictor::new(PredictorKind::EmaByPromptBucket);
    // No observation: fall back to max_tokens.
    assert_eq!(p.predict(100, 256, 0), 256);
    p.observe(100, 40); // bucket 0 (<= 128 prompt tokens) seeded at 40
    assert_eq!(p.predict(50, 256, 0), 40);
    p.observe(128, 90); // 0.2 x 90 + 0.8 x 40 = 50
    assert_eq!(p.bucket_ema(0), Some(50.0));
    assert_eq!(p.predict(1, 256, 0), 50);
    assert_eq!(p.predict(1, 30, 0), 30); // capped at max_tokens
    assert_eq!(p.predict(1, 256, 7), 7); // the hint still wins
                                         // Bucket 2 is unobserved.
    assert_eq!(p.predict(600, 256, 0), 256);
    // From a request: 400 prompt bytes = 100 tokens, estimate 100 + 256 = 356.
    let mut meta = RequestMeta::new(Priority::Normal, Kind::Completion, 400, 256, 0);
    assert_eq!(p.predict_for(&meta), 50);
    meta.predicted_output_tokens = 12;
    assert_eq!(p.predict_for(&meta), 12);
    p.set_kind(PredictorKind::MaxTokens);
    meta.predicted_output_tokens = 0;
    assert_eq!(p.predict_for(&meta), 256);
}

/// Algorithms 1-7 on one hand-worked run, with the reference's defaults.
#[test]
fn building_blocks_compose_into_a_batch_size() {
    let mem = MemoryModel::default();
    let mut stats = BatchStats::new(64);
    let mut bins = BinBoundaries::new(4, 10_000, 64);
    // No statistics: b_mem 76 (38,400 / 500), b_sla the warm-up midpoint 64 -> 64.
    let mut sla = SlaController::new(SlaParams::default());
    assert_eq!(
        mem.b_mem(stats.mean_tokens_per_request(), None)
            .min(sla.b_sla(0)),
        64
    );

    // Observed outputs 1..=40 (x1) -> quantiles 1, 10.75, 20.5, 30.25 -> [1, 10, 20, 30].
    for len in 1..=40 {
        stats.record_output_tokens(len);
    }
    assert!(bins.recompute_equal_mass(stats.output_samples()));
    assert_eq!(bins.edges(), &[1, 10, 20, 30, 10_000]);
    // Per-bin caps: short bins 128; the last [30, 10000): avg (30 + 4096) / 2 = 2063,
    // 7 / (4126 x 1.875e-4) = 9.05 -> 9.
    let caps: Vec<u32> = (0..4)
        .map(|i| {
            let (lo, hi) = bins.bounds(i);
            mem.per_bin_cap(lo, hi)
        })
        .collect();
    assert_eq!(caps, [128, 128, 128, 9]);

    // Three batches of 8 requests, mean prompt 1,000, mean output 1,500, TBT 7.3 ms.
    for _ in 0..3 {
        let obs = BatchObservation {
            batch_size: 8,
            prompt_tokens_sum: 8_000,
            output_tokens_sum: 12_000,
            decode_tbt_ms: 7.3,
        };
        stats.observe_batch(&obs);
        sla.update(obs.decode_tbt_ms, obs.batch_size);
    }
    // prompt EMA 300 -> 440 -> 552 -> 641.6; output 200 -> 460 -> 668 -> 834.4; sum 1476.
    let mean = stats.mean_tokens_per_request().unwrap();
    assert!((mean - 1476.0).abs() < 1e-9);
    // b_mem = floor(38,400 / 1476) = floor(26.02) = 26; in the last bin capped at 9.
    assert_eq!(mem.b_mem(Some(mean), None), 26);
    assert_eq!(mem.b_mem(Some(mean), Some(caps[3])), 9);
    // TBT 7.3 is in [5, 15]: interval [8 - 2, 8 + 2] = [6, 10], b_sla 8.
    assert_eq!((sla.b_low(), sla.b_high(), sla.b_sla(0)), (6, 10, 8));
    assert_eq!(mem.b_mem(Some(mean), None).min(sla.b_sla(0)), 8);
    // Algorithm 3's check on a full 8-request batch: 8 x 2,500 = 20,000 <= 37,333.
    assert!(mem.fits(20_000));
}

#[test]
fn age_aware_choice_serves_past_the_bound_first_then_by_ratio_and_skips_empty_bins() {
    let bound = 1_000;
    // Equal expected times: the oldest head.
    assert_eq!(
        choose_age_aware(&[Some(5), None, Some(9)], &[1.0; 3], bound),
        Some(2)
    );
    // Response ratio: bin 0 waited 100 of a 100 batch (2.0), bin 1 300 of 1000 (1.3).
    assert_eq!(
        choose_age_aware(&[Some(100), Some(300)], &[100.0, 1000.0], bound),
        Some(0)
    );
    // A head past the bound wins whatever the ratios; the oldest of those.
    let waits = [Some(900), Some(1_000), Some(2_000)];
    assert_eq!(choose_age_aware(&waits, &[1.0, 1e9, 1e9], bound), Some(2));
    assert_eq!(choose_age_aware(&[None, None], &[1.0, 1.0], bound), None);
}

#[test]
fn least_second_moment_boundaries_give_the_long_tail_a_bin() {
    // K = 2 over 1 x4, 10 x2, 100 x1. Cuts at changes of value: 4, 6, 7.
    // Split at 4: [1 x4] 4 x 1^2 + [10 x2, 100] 3 x 100^2 = 30,004; at 6: [1 x4, 10 x2]
    // 6 x 10^2 + [100] 1 x 100^2 = 10,600, which wins.
    let samples = [10, 1, 100, 1, 10, 1, 1];
    let mut b = BinBoundaries::new(2, 4096, 16);
    assert!(b.recompute_min_second_moment(&samples));
    assert_eq!(b.edges(), &[1, 100, 4096]);
    // Equal mass on the same sample: the median is 1, so 10 and 100 share a bin.
    let mut e = BinBoundaries::new(2, 4096, 16);
    assert!(e.recompute_equal_mass(&samples));
    assert_eq!(e.edges(), &[1, 1, 4096]);
    // K = 3: 4 x 1 + 2 x 100 + 1 x 10,000 = 10,204, one bin per length.
    let mut b = BinBoundaries::new(3, 4096, 16);
    assert!(b.recompute_min_second_moment(&samples));
    assert_eq!(b.edges(), &[1, 10, 100, 4096]);
    assert_eq!(
        (b.bin_of(1), b.bin_of(10), b.bin_of(99), b.bin_of(100)),
        (0, 1, 1, 2)
    );
}

#[test]
fn least_second_moment_boundaries_split_a_bimodal_sample_where_equal_mass_cannot() {
    // 70 short (64), 25 long (1,000), 5 longest (3,000): only three distinct lengths, so
    // K = 4 leaves bin 0 empty and gives each length a bin of its own.
    let mut samples = vec![64u32; 70];
    samples.extend([1_000; 25]);
    samples.extend([3_000; 5]);
    let mut b = BinBoundaries::new(4, 32_768, 128);
    assert!(b.recompute_min_second_moment(&samples));
    assert_eq!(b.edges(), &[64, 64, 1_000, 3_000, 32_768]);
    assert_eq!((b.bin_of(64), b.bin_of(1_000), b.bin_of(3_000)), (1, 2, 3));
    // Equal mass: quantiles 64, 64, 1,000 (position 74.25): 1,000 and 3,000 share bin 3.
    let mut e = BinBoundaries::new(4, 32_768, 128);
    assert!(e.recompute_equal_mass(&samples));
    assert_eq!(e.edges(), &[64, 64, 64, 1_000, 32_768]);
    assert_eq!(e.bin_of(1_000), e.bin_of(3_000));
}

#[test]
fn least_second_moment_boundaries_handle_edge_cases() {
    let mut b = BinBoundaries::new(3, 100, 8);
    // No samples: keep the equal-width boundaries.
    assert!(!b.recompute_min_second_moment(&[]));
    assert_eq!(b.edges(), &[1, 34, 67, 100]);
    // One length: one non-empty bin, the top one; lengths past the limit clamp to it.
    assert!(b.recompute_min_second_moment(&[5, 5, 5]));
    assert_eq!(b.edges(), &[5, 5, 5, 100]);
    assert_eq!(b.bin_of(5), 2);
    assert!(b.recompute_min_second_moment(&[500, 7]));
    assert_eq!(b.edges(), &[7, 7, 100, 100]);
    // A sample larger than the cut grid and the scratch: only the first 8 are used.
    let mut b = BinBoundaries::new(2, 10_000, 8);
    let many: Vec<u32> = (1..=1_000).collect();
    assert!(b.recompute_min_second_moment(&many));
    // 1..=8, K = 2: split after 5 (5 x 25 + 3 x 64 = 317) or 6 (6 x 36 + 2 x 64 = 344)
    // or 4 (4 x 16 + 4 x 64 = 320): after 5.
    assert_eq!(b.edges(), &[1, 6, 10_000]);
}
