//! [`first_overlap`]: whether byte ranges overlap, for the checks of destinations.

/// The first two of `ranges` (`(start address, length)` of byte ranges; empty ones never
/// overlap) that overlap, as indices, the lower first; `None` when none do. What the
/// copies into existing tensors check their destinations with (the Python package's
/// `copy_into` too, for destinations torch writes).
///
/// ```
/// use pinlane::memory::first_overlap;
/// assert_eq!(first_overlap(&[(0, 10), (10, 10)]), None); // touching
/// assert_eq!(first_overlap(&[(10, 10), (0, 11)]), Some((0, 1)));
/// ```
pub fn first_overlap(ranges: &[(u64, usize)]) -> Option<(usize, usize)> {
    let mut order: Vec<usize> = (0..ranges.len()).filter(|&i| ranges[i].1 > 0).collect();
    order.sort_unstable_by_key(|&i| ranges[i].0);
    // The range reaching furthest so far: a later start below its end overlaps it.
    let mut furthest: Option<(usize, u128)> = None;
    for &i in &order {
        let (start, len) = ranges[i];
        if let Some((j, end)) = furthest {
            if u128::from(start) < end {
                return Some((i.min(j), i.max(j)));
            }
        }
        let end = u128::from(start) + len as u128;
        if furthest.is_none_or(|(_, e)| end > e) {
            furthest = Some((i, end));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn overlaps_are_found_in_any_order() {
        assert_eq!(first_overlap(&[]), None);
        assert_eq!(
            first_overlap(&[(0, 10), (10, 10)]),
            None,
            "touching is fine"
        );
        assert_eq!(first_overlap(&[(10, 10), (0, 11)]), Some((0, 1)));
        assert_eq!(
            first_overlap(&[(5, 0), (0, 10)]),
            None,
            "empty ranges never overlap"
        );
        // Inside a long range that an earlier, shorter one follows.
        assert_eq!(first_overlap(&[(0, 100), (10, 5), (50, 5)]), Some((0, 1)));
        assert_eq!(first_overlap(&[(u64::MAX - 1, 2), (0, 1)]), None);
    }

    proptest! {
        /// Agrees with the pairwise check.
        #[test]
        fn first_overlap_agrees_with_brute_force(
            ranges in proptest::collection::vec((0u64..200, 0usize..40), 0..12)
        ) {
            let overlap = |a: (u64, usize), b: (u64, usize)| {
                a.1 > 0 && b.1 > 0 && a.0 < b.0 + b.1 as u64 && b.0 < a.0 + a.1 as u64
            };
            let any = (0..ranges.len())
                .any(|i| (i + 1..ranges.len()).any(|j| overlap(ranges[i], ranges[j])));
            let found = first_overlap(&ranges);
            prop_assert_eq!(found.is_some(), any);
            if let Some((i, j)) = found {
                prop_assert!(i < j && overlap(ranges[i], ranges[j]));
            }
        }
    }
}
