//! Identifiers. Nodes, allocations and evaluations are named by UUIDs (16
//! bytes, `Copy`, cheap to hash); jobs by their user-chosen name within a
//! namespace.

use std::fmt;
use std::sync::Arc;

use std::cell::RefCell;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

thread_local! {
    /// Where this thread's new ids come from: seeded from the OS, or by
    /// [`seed_thread_ids`] in a simulation.
    static ID_RNG: RefCell<SmallRng> = RefCell::new(SmallRng::from_os_rng());
}

/// Makes the ids this thread creates from now on a function of `seed`, so a
/// single-threaded simulation replays exactly (same ids, same order, same
/// placements). Other threads are unaffected.
pub fn seed_thread_ids(seed: u64) {
    ID_RNG.with(|rng| *rng.borrow_mut() = SmallRng::seed_from_u64(seed));
}

macro_rules! uuid_id {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        #[serde(transparent)]
        pub struct $name(pub Uuid);

        impl $name {
            /// A fresh random identifier, drawn from this thread's id
            /// generator (see [`seed_thread_ids`]).
            pub fn new_random() -> Self {
                ID_RNG.with(|rng| Self::from_rng(&mut *rng.borrow_mut()))
            }

            /// An identifier drawn from `rng`, so seeded simulations are reproducible.
            pub fn from_rng(rng: &mut impl Rng) -> Self {
                $name(uuid::Builder::from_random_bytes(rng.random()).into_uuid())
            }

            /// An identifier made from a number; for tests and generated fixtures.
            pub const fn from_u128(value: u128) -> Self {
                $name(Uuid::from_u128(value))
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Display::fmt(&self.0, f)
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                // The first eight hex digits, as Nomad's CLI shows them.
                let text = self.0.simple().to_string();
                write!(f, "{}({})", stringify!($name), &text[..8])
            }
        }

        impl std::str::FromStr for $name {
            type Err = uuid::Error;
            fn from_str(text: &str) -> Result<Self, Self::Err> {
                Uuid::parse_str(text).map($name)
            }
        }
    };
}

uuid_id!(
    /// Identifies a client node.
    NodeId
);
uuid_id!(
    /// Identifies an allocation.
    AllocId
);
uuid_id!(
    /// Identifies an evaluation.
    EvalId
);
uuid_id!(
    /// Identifies a deployment.
    DeploymentId
);

/// A job's identity: its namespace and its id within it.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct JobKey {
    /// The namespace the job lives in.
    pub namespace: Arc<str>,
    /// The job's id, unique within its namespace.
    pub id: Arc<str>,
}

impl JobKey {
    /// The key of job `id` in `namespace`.
    pub fn new(namespace: &str, id: &str) -> Self {
        JobKey { namespace: Arc::from(namespace), id: Arc::from(id) }
    }
}

impl fmt::Display for JobKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.id)
    }
}

impl fmt::Debug for JobKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "JobKey({self})")
    }
}
