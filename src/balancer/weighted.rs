//! Smooth weighted round robin (nginx's algorithm, fork F16), precomputed.
//!
//! nginx keeps a running credit per target: each pick adds every target's weight to its
//! credit, the richest target serves and pays back the total. Done per request that needs
//! a lock around every credit. But the sequence it produces depends on nothing but the
//! weights, and repeats every `total` picks (each target is chosen exactly `weight` times
//! per cycle and every credit returns to zero). So the cycle is computed once, when the
//! set of healthy targets changes, and a request takes the next slot of it with one atomic
//! increment: no lock, no allocation, and the exact interleaving nginx would give
//! (1:5 → `b b a b b b`, never `a` twice in a row).

/// One cycle of picks: indexes into the healthy targets it was computed for.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Schedule(Box<[u32]>);

impl Schedule {
    /// The cycle for these weights, or `None` when they are all equal: then plain round
    /// robin is the same split, and keeps upstream's order.
    pub fn for_weights(weights: &[u32]) -> Option<Schedule> {
        let first = *weights.first()?;
        if weights.iter().all(|&w| w == first) {
            return None;
        }
        // Scaling every weight by a common factor leaves nginx's sequence unchanged (every
        // credit scales with it), so the cycle is kept as short as the weights allow.
        let divisor = weights.iter().copied().fold(0, gcd).max(1);
        let weights: Vec<i64> = weights.iter().map(|&w| i64::from(w / divisor)).collect();
        let total: i64 = weights.iter().sum();
        let mut credit = vec![0i64; weights.len()];
        let mut cycle = Vec::with_capacity(usize::try_from(total).unwrap_or(0));
        for _ in 0..total {
            let mut best = 0;
            for (i, w) in weights.iter().enumerate() {
                credit[i] += w;
                // Ties go to the first listed, as nginx's strict `>`.
                if credit[i] > credit[best] {
                    best = i;
                }
            }
            credit[best] -= total;
            cycle.push(u32::try_from(best).unwrap_or(0));
        }
        Some(Schedule(cycle.into_boxed_slice()))
    }

    /// The index of the `n`th pick.
    pub fn pick(&self, n: usize) -> usize {
        // Never empty: built from at least two distinct weights.
        self.0
            .get(n % self.0.len().max(1))
            .map_or(0, |&i| i as usize)
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

fn gcd(a: u32, b: u32) -> u32 {
    if b == 0 { a } else { gcd(b, a % b) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::balancer::health::{self, HealthCheckConfig};
    use crate::balancer::spec::TargetSpec;
    use crate::balancer::tests::{picks, pool};
    use crate::balancer::{Health, LoadBalancer, affinity::PinKey};

    fn cycle(weights: &[u32]) -> Vec<usize> {
        let s = Schedule::for_weights(weights).unwrap();
        (0..s.len()).map(|n| s.pick(n)).collect()
    }

    #[test]
    fn nginx_s_interleaving() {
        // nginx's documented example: weights 5, 1, 1 → a a b a c a a.
        assert_eq!(cycle(&[5, 1, 1]), [0, 0, 1, 0, 2, 0, 0]);
        // Fork `TestTargetList_WeightedSelectionIsSmooth`: 1, 2, 3.
        assert_eq!(cycle(&[1, 2, 3]), [2, 1, 0, 2, 1, 2]);
        assert_eq!(cycle(&[1, 5]), [1, 1, 0, 1, 1, 1]);
    }

    #[test]
    fn equal_weights_are_plain_round_robin() {
        assert_eq!(Schedule::for_weights(&[3, 3, 3]), None);
        assert_eq!(Schedule::for_weights(&[1]), None);
        assert_eq!(Schedule::for_weights(&[]), None);
    }

    #[test]
    fn a_common_factor_shortens_the_cycle_not_the_split() {
        assert_eq!(cycle(&[200, 1000]), cycle(&[1, 5]));
        let s = Schedule::for_weights(&[1000, 999]).unwrap();
        assert_eq!(s.len(), 1999);
        let firsts = (0..s.len()).filter(|&n| s.pick(n) == 0).count();
        assert_eq!(firsts, 1000);
    }

    #[test]
    fn weights_split_smoothly_over_healthy_targets_readers_apart() {
        let lb = pool(
            &["w1:1", "w2:1;weight=5"],
            &["r1:1;weight=2", "r2:1", "r3:1"],
        );
        lb.mark_all_healthy();
        assert_eq!(
            picks(&lb, false, 6),
            ["w2:1", "w2:1", "w1:1", "w2:1", "w2:1", "w2:1"]
        );
        let reads = picks(&lb, true, 400);
        let count = |a: &str| reads.iter().filter(|r| *r == a).count();
        assert_eq!(
            (count("r1:1"), count("r2:1"), count("r3:1")),
            (200, 100, 100)
        );
        // The writers' cycle went on untouched by the reads.
        assert_eq!(
            picks(&lb, false, 6).iter().filter(|a| *a == "w1:1").count(),
            1
        );

        // A target that fails its check leaves the cycle; the rest keep their proportions.
        let lb = pool(&["aa:1", "bb:1;weight=2", "cc:1;weight=3"], &[]);
        lb.mark_all_healthy();
        lb.writers[2].set_health(Health::Unhealthy);
        lb.rebuild_healthy();
        let split = picks(&lb, false, 300);
        assert_eq!(split.iter().filter(|a| *a == "aa:1").count(), 100);
        assert_eq!(split.iter().filter(|a| *a == "bb:1").count(), 200);
    }

    #[test]
    fn a_weight_out_of_range_cannot_build_a_pool() {
        let spec = TargetSpec {
            address: "web:80".into(),
            weight: 0,
        };
        let err = LoadBalancer::new(
            "app",
            &[spec],
            &[],
            PinKey::generate().unwrap(),
            HealthCheckConfig::default(),
            health::probe_client(),
        )
        .err()
        .unwrap();
        assert_eq!(err, "invalid target weight: 0 is outside 1-1000");
    }
}
