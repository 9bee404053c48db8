//! A figure measured without and with something beside it, in interleaved runs, and compared
//! as the ratio of the sums of its runs.
//!
//! The runs go without, with, with, without (two rounds, the second in the other order), so a
//! drift of the machine's speed that is steady over the runs cancels out. A ratio of the best
//! run of each instead compares two lucky runs: on this shared two-core machine two runs of the
//! same work a minute apart differ by a fifth.

use serde_json::{Value, json};

/// The order of the runs in round `round`: false is without, true with.
pub(crate) fn order(round: usize) -> [bool; 2] {
    if round.is_multiple_of(2) {
        [false, true]
    } else {
        [true, false]
    }
}

/// One figure's values without and with, in the order they were measured.
#[derive(Debug, Default)]
pub(crate) struct Paired {
    pub without: Vec<f64>,
    pub with: Vec<f64>,
}

impl Paired {
    pub(crate) fn push(&mut self, with: bool, value: f64) {
        if with {
            self.with.push(value);
        } else {
            self.without.push(value);
        }
    }

    /// The sum with over the sum without: for a rate, higher is better.
    pub(crate) fn ratio(&self) -> f64 {
        sum(&self.with) / sum(&self.without)
    }

    /// The sum without over the sum with: for a latency, so that higher is better here too.
    pub(crate) fn inverse_ratio(&self) -> f64 {
        sum(&self.without) / sum(&self.with)
    }

    pub(crate) fn mean_with(&self) -> f64 {
        sum(&self.with) / self.with.len().max(1) as f64
    }

    pub(crate) fn mean_without(&self) -> f64 {
        sum(&self.without) / self.without.len().max(1) as f64
    }

    pub(crate) fn to_json(&self) -> Value {
        json!({"without": self.without, "with": self.with})
    }
}

pub(crate) fn sum(values: &[f64]) -> f64 {
    values.iter().sum()
}
