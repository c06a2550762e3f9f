//! Small statistics shared by the benchmarks.

/// The `q` quantile (0..=1) of `v`, nearest rank; the default of `T` when `v` is empty.
pub fn quantile<T: PartialOrd + Copy + Default>(v: &[T], q: f64) -> T {
    if v.is_empty() {
        return T::default();
    }
    let mut v = v.to_vec();
    v.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
    let rank = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len());
    v[rank - 1]
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn quantiles_are_nearest_rank() {
        let v = [5.0, 1.0, 3.0, 2.0, 4.0];
        assert_eq!((quantile(&v, 0.5), quantile(&v, 0.99), quantile(&v, 0.0)), (3.0, 5.0, 1.0));
        assert_eq!(quantile::<f64>(&[], 0.5), 0.0);
        let d: Vec<Duration> = (1..=100).rev().map(Duration::from_millis).collect();
        assert_eq!(quantile(&d, 0.99), Duration::from_millis(99));
        assert_eq!(quantile(&d, 1.0), Duration::from_millis(100));
    }
}
