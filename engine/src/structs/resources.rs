//! Resources: what a node offers and what an allocation asks for.

use serde::{Deserialize, Serialize};

/// CPU in MHz, memory and disk in MiB.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Resources {
    /// CPU shares in MHz.
    pub cpu: u64,
    /// Memory in MiB.
    pub memory_mb: u64,
    /// Disk in MiB.
    pub disk_mb: u64,
}

impl Resources {
    /// Resources of the given sizes.
    pub const fn new(cpu: u64, memory_mb: u64, disk_mb: u64) -> Self {
        Resources { cpu, memory_mb, disk_mb }
    }

    /// The sum of two resource vectors.
    pub fn plus(self, other: Resources) -> Resources {
        Resources {
            cpu: self.cpu.saturating_add(other.cpu),
            memory_mb: self.memory_mb.saturating_add(other.memory_mb),
            disk_mb: self.disk_mb.saturating_add(other.disk_mb),
        }
    }

    /// What is left of `self` after taking `other`, floored at zero.
    pub fn minus(self, other: Resources) -> Resources {
        Resources {
            cpu: self.cpu.saturating_sub(other.cpu),
            memory_mb: self.memory_mb.saturating_sub(other.memory_mb),
            disk_mb: self.disk_mb.saturating_sub(other.disk_mb),
        }
    }

    /// Whether `self` holds at least `other` in every dimension.
    pub fn covers(self, other: Resources) -> bool {
        self.cpu >= other.cpu && self.memory_mb >= other.memory_mb && self.disk_mb >= other.disk_mb
    }

    /// The first dimension in which `self` does not hold `other`, named as in
    /// placement metrics ("cpu", "memory", "disk").
    pub fn exhausted_dimension(self, other: Resources) -> Option<&'static str> {
        if self.cpu < other.cpu {
            Some("cpu")
        } else if self.memory_mb < other.memory_mb {
            Some("memory")
        } else if self.disk_mb < other.disk_mb {
            Some("disk")
        } else {
            None
        }
    }

    /// Whether every dimension is zero.
    pub fn is_zero(self) -> bool {
        self == Resources::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn covers_and_exhausted_dimension_agree() {
        let node = Resources::new(1000, 2048, 10_000);
        assert!(node.covers(Resources::new(1000, 2048, 10_000)));
        assert_eq!(node.exhausted_dimension(Resources::new(1001, 1, 1)), Some("cpu"));
        assert_eq!(node.exhausted_dimension(Resources::new(1, 4096, 1)), Some("memory"));
        assert_eq!(node.exhausted_dimension(Resources::new(1, 1, 10_001)), Some("disk"));
        assert_eq!(node.exhausted_dimension(Resources::new(1, 1, 1)), None);
    }

    #[test]
    fn arithmetic_saturates() {
        let small = Resources::new(1, 1, 1);
        assert_eq!(small.minus(Resources::new(5, 5, 5)), Resources::default());
        assert_eq!(Resources::new(u64::MAX, 0, 0).plus(small).cpu, u64::MAX);
    }
}
