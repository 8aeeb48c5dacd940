//! Percentiles of samples and the spread of repeated measurements.

use std::time::Duration;

/// The `p`-th percentile (0..=100) by nearest rank; `None` for no samples.
pub fn percentile(sorted: &[Duration], p: f64) -> Option<Duration> {
    if sorted.is_empty() {
        return None;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

/// Median with min and max of repeated measurements of one quantity.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Spread {
    pub median: f64,
    pub min: f64,
    pub max: f64,
}

impl Spread {
    pub fn of(values: &[f64]) -> Option<Spread> {
        let mut sorted: Vec<f64> = values.iter().copied().filter(|v| v.is_finite()).collect();
        if sorted.is_empty() {
            return None;
        }
        sorted.sort_by(f64::total_cmp);
        let middle = sorted.len() / 2;
        let median = if sorted.len() % 2 == 1 {
            sorted[middle]
        } else {
            (sorted[middle - 1] + sorted[middle]) / 2.0
        };
        Some(Spread {
            median,
            min: sorted[0],
            max: sorted[sorted.len() - 1],
        })
    }

    /// `median (min–max)` with `decimals`, or just the median for a single run.
    pub fn show(&self, decimals: usize) -> String {
        if self.min == self.max {
            format!("{:.*}", decimals, self.median)
        } else {
            format!(
                "{:.*} ({:.*}–{:.*})",
                decimals, self.median, decimals, self.min, decimals, self.max
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let samples: Vec<Duration> = (1..=100).map(Duration::from_micros).collect();
        assert_eq!(percentile(&samples, 50.0), Some(Duration::from_micros(50)));
        assert_eq!(percentile(&samples, 99.0), Some(Duration::from_micros(99)));
        assert_eq!(
            percentile(&samples[..1], 99.0),
            Some(Duration::from_micros(1))
        );
        assert_eq!(percentile(&[], 50.0), None);
    }

    #[test]
    fn spread_of_repeats() {
        let spread = Spread::of(&[3.0, 1.0, 2.0]).map(|s| (s.median, s.min, s.max));
        assert_eq!(spread, Some((2.0, 1.0, 3.0)));
        assert_eq!(Spread::of(&[1.0, 3.0]).map(|s| s.median), Some(2.0));
        assert_eq!(Spread::of(&[]), None);
    }
}
