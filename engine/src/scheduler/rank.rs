//! Ranking: how good a feasible node with room is for one placement.
//!
//! Components, each in [-1, 1], averaged over those that apply (as Nomad
//! normalizes its scorers):
//! - fit: bin-pack (fuller nodes score higher) or spread (emptier higher),
//!   Nomad's `10^free` curve over cpu and memory after the placement;
//! - job anti-affinity: a penalty growing with the allocations of the same
//!   job and group already on the node (applies only when there are some);
//! - reschedule penalty: -1 on nodes where the allocation just failed.

use crate::structs::Resources;

use super::Algorithm;

/// The fit component for a node of `capacity` that would use `used_after`.
pub fn fit_score(algorithm: Algorithm, capacity: Resources, used_after: Resources) -> f64 {
    let fraction = |used: u64, total: u64| if total == 0 { 1.0 } else { (used as f64 / total as f64).min(1.0) };
    let used_cpu = fraction(used_after.cpu, capacity.cpu);
    let used_memory = fraction(used_after.memory_mb, capacity.memory_mb);
    // Nomad's curve: 20 - (10^a + 10^b), in [0, 18], over free (bin-pack) or used (spread) fractions.
    let (a, b) = match algorithm {
        Algorithm::Binpack => (1.0 - used_cpu, 1.0 - used_memory),
        Algorithm::Spread => (used_cpu, used_memory),
    };
    let raw = 20.0 - (10f64.powf(a) + 10f64.powf(b));
    (raw / 18.0).clamp(0.0, 1.0)
}

/// The anti-affinity component: `None` when the node holds none of the group yet.
pub fn anti_affinity_score(collisions: u32, desired_count: u32) -> Option<f64> {
    (collisions > 0).then(|| -((f64::from(collisions) + 1.0) / f64::from(desired_count.max(1))).min(1.0))
}

/// The final score: the mean of the components that apply.
pub fn combine(fit: f64, anti_affinity: Option<f64>, penalized: bool) -> f64 {
    let mut sum = fit;
    let mut count = 1.0;
    if let Some(score) = anti_affinity {
        sum += score;
        count += 1.0;
    }
    if penalized {
        sum -= 1.0;
        count += 1.0;
    }
    sum / count
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const NODE: Resources = Resources::new(4000, 8192, 0);

    #[test]
    fn binpack_prefers_fuller_nodes_and_spread_emptier() {
        let nearly_full = Resources::new(3800, 7800, 0);
        let nearly_empty = Resources::new(200, 300, 0);
        assert!(fit_score(Algorithm::Binpack, NODE, nearly_full) > fit_score(Algorithm::Binpack, NODE, nearly_empty));
        assert!(fit_score(Algorithm::Spread, NODE, nearly_empty) > fit_score(Algorithm::Spread, NODE, nearly_full));
    }

    #[test]
    fn anti_affinity_applies_only_with_collisions() {
        assert_eq!(anti_affinity_score(0, 5), None);
        assert!(anti_affinity_score(1, 5).expect("collides") < 0.0);
        assert!(anti_affinity_score(3, 5) < anti_affinity_score(1, 5));
        assert!(combine(0.8, None, true) < combine(0.8, None, false));
    }

    proptest! {
        #[test]
        fn scores_stay_in_range(cpu in 0u64..10_000, memory in 0u64..20_000, collisions in 0u32..50, count in 1u32..50) {
            for algorithm in [Algorithm::Binpack, Algorithm::Spread] {
                let fit = fit_score(algorithm, NODE, Resources::new(cpu, memory, 0));
                prop_assert!((0.0..=1.0).contains(&fit));
                let score = combine(fit, anti_affinity_score(collisions, count), collisions % 2 == 0);
                prop_assert!((-1.0..=1.0).contains(&score));
            }
        }
    }
}
