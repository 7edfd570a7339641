//! The simulation's seeded generator: the test kit's, so a run
//! reproduces from its seed.

pub use lockstep_launcher::rng::Rng;
