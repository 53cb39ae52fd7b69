//! Ranking: how good a feasible node with room is for one placement.
//!
//! Components, each in [-1, 1] but the spread sum, averaged over those
//! that apply (as Nomad normalizes its scorers):
//! - fit: bin-pack (fuller nodes score higher) or spread (emptier higher),
//!   Nomad's `10^free` curve over cpu and memory after the placement;
//! - job anti-affinity: a penalty growing with the allocations of the same
//!   job and group already on the node (applies only when there are some);
//! - reschedule penalty: -1 on nodes where the allocation just failed;
//! - affinity and spread: the group's preferences for the node
//!   ([`super::preference`]), each applying only when not zero.

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

/// The components of one node's score.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Score {
    /// The fit component.
    pub fit: f64,
    /// The job anti-affinity component, when it applies.
    pub anti_affinity: Option<f64>,
    /// Whether the reschedule penalty applies.
    pub penalized: bool,
    /// The affinity component, when the node matches affinities.
    pub affinity: Option<f64>,
    /// The spread component, when it is not zero.
    pub spread: Option<f64>,
}

impl Score {
    /// The final score: the mean of the components that apply.
    pub fn combined(&self) -> f64 {
        let penalty = self.penalized.then_some(-1.0);
        let optional = [self.anti_affinity, penalty, self.affinity, self.spread];
        let (sum, count) =
            optional.into_iter().flatten().fold((self.fit, 1.0), |(sum, count), x| (sum + x, count + 1.0));
        sum / count
    }
}

/// The final score of fit, anti-affinity and the reschedule penalty alone.
pub fn combine(fit: f64, anti_affinity: Option<f64>, penalized: bool) -> f64 {
    Score { fit, anti_affinity, penalized, ..Score::default() }.combined()
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

    #[test]
    fn preferences_are_terms_of_the_mean() {
        let plain = Score { fit: 0.2, ..Score::default() };
        let preferred = Score { affinity: Some(1.0), ..plain };
        let avoided = Score { affinity: Some(-0.5), spread: Some(-1.0), ..plain };
        assert!((preferred.combined() - 0.6).abs() < 1e-12, "(0.2 + 1) / 2");
        assert!((avoided.combined() - (0.2 - 1.5) / 3.0).abs() < 1e-12);
        assert!(avoided.combined() < plain.combined() && plain.combined() < preferred.combined());
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
