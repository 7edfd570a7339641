//! A small seeded generator (xorshift64*): the fuzz loops and the
//! simulated cluster reproduce a run from its seed.

/// Seeded pseudo-random numbers.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// A generator for `seed`, spread over the state's bits.
    pub fn new(seed: u64) -> Rng {
        Rng::from_state(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15))
    }

    /// A generator starting at `state` (made odd: zero would stay zero).
    pub fn from_state(state: u64) -> Rng {
        Rng(state | 1)
    }

    /// The current state (`from_state` resumes there): a failing run
    /// names it.
    pub fn state(&self) -> u64 {
        self.0
    }

    /// The next number.
    #[allow(clippy::should_implement_trait)]
    pub fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// A number below `n` (0 when `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next() % n
        }
    }

    /// True with probability `p` percent.
    pub fn percent(&mut self, p: u64) -> bool {
        self.below(100) < p
    }

    /// True once in `n` draws on average.
    pub fn one_in(&mut self, n: u64) -> bool {
        self.below(n) == 0
    }

    /// Puts `items` in a random order (Fisher–Yates: every order alike).
    pub fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            let j = self.below(i as u64 + 1) as usize;
            items.swap(i, j);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_gives_the_same_numbers_again() {
        let a: Vec<u64> = (0..5).scan(Rng::new(7), |r, _| Some(r.next())).collect();
        let b: Vec<u64> = (0..5).scan(Rng::new(7), |r, _| Some(r.next())).collect();
        assert_eq!(a, b);
        assert_ne!(
            a,
            (0..5)
                .scan(Rng::new(8), |r, _| Some(r.next()))
                .collect::<Vec<_>>()
        );
        assert_eq!(Rng::new(1).below(0), 0);
    }

    #[test]
    fn a_shuffle_keeps_every_item_and_its_seed_repeats_it() {
        let shuffled = |seed| {
            let mut v: Vec<u32> = (0..20).collect();
            Rng::new(seed).shuffle(&mut v);
            v
        };
        let a = shuffled(3);
        let mut sorted = a.clone();
        sorted.sort();
        assert_eq!(sorted, (0..20).collect::<Vec<_>>());
        assert_eq!(a, shuffled(3));
        assert_ne!(a, (0..20).collect::<Vec<_>>());
    }
}
