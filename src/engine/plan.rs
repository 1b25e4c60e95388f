//! Pure planning: where each tensor goes in a batch's buffer, and how that buffer is cut
//! into staging windows. No unsafe, no driver: property-tested on every machine.

use crate::error::{Error, Result};

/// Places items of `sizes` bytes back to back, each at an offset aligned to `align` (a
/// power of two). Returns the offsets and the end of the last item.
///
/// ```text
///  sizes [5, 0, 300]  align 256  →  offsets [0, 256, 256], end 556
///  |item0|pad....|item2 (item1 is empty, placed at 256 too) ...|
/// ```
pub(crate) fn pack(
    sizes: impl Iterator<Item = usize>,
    align: usize,
) -> Result<(Vec<usize>, usize)> {
    debug_assert!(align.is_power_of_two());
    let overflow = || Error::InvalidOption {
        name: "batch size",
        reason: "the batch's total size overflows usize".into(),
    };
    let mut offsets = Vec::with_capacity(sizes.size_hint().0);
    let mut end = 0usize;
    for n in sizes {
        let at = end.checked_add(align - 1).ok_or_else(overflow)? & !(align - 1);
        offsets.push(at);
        end = at.checked_add(n).ok_or_else(overflow)?;
    }
    Ok((offsets, end))
}

/// The window size for a staged region of `total` bytes with slots of `slot` bytes: about
/// an eighth of the region (a power of two, at least 1 MiB), at most a slot. Small
/// batches get small windows, so their first copy starts after a short fill; large ones
/// get whole slots, so each copy runs at the link's full rate.
pub(crate) fn window_size(total: usize, slot: usize) -> usize {
    const MIN: usize = 1 << 20;
    (total / 8)
        .max(1)
        .next_power_of_two()
        .clamp(MIN.min(slot), slot.max(1))
}

/// The piece of one item that falls inside one window.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Part {
    /// Index of the item.
    pub item: usize,
    /// Offset of the piece inside the item.
    pub item_off: usize,
    /// Offset of the piece inside the window.
    pub window_off: usize,
    /// Bytes in the piece.
    pub len: usize,
}

/// One window: `[start, start + len)` of the batch's buffer. [`Window::parts`] lists the
/// item pieces in it, computed when asked for (no list is kept per window).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Window {
    pub start: usize,
    pub len: usize,
}

impl Window {
    /// The pieces of the items (`offsets[i]`, `sizes[i]`, sorted by offset and not
    /// overlapping) that fall inside this window, in item order. Empty items produce no
    /// piece. The iterator's upper size hint is exact but for empty items, so a list of
    /// the pieces is allocated once.
    pub(crate) fn parts<'a>(
        self,
        offsets: &'a [usize],
        sizes: &'a [usize],
    ) -> impl Iterator<Item = Part> + 'a {
        debug_assert_eq!(offsets.len(), sizes.len());
        let (start, stop) = (self.start, self.start + self.len);
        // The first item that ends after `start` and the first that starts at or after
        // `stop`: items are sorted and do not overlap, so their starts and ends are sorted
        // too (binary searches).
        let lo = partition(offsets.len(), |i| offsets[i] + sizes[i] <= start);
        let hi = lo + partition(offsets.len() - lo, |i| offsets[lo + i] < stop);
        (lo..hi).filter_map(move |i| {
            let (o, n) = (offsets[i], sizes[i]);
            let (a, b) = (o.max(start), (o + n).min(stop));
            (b > a).then_some(Part {
                item: i,
                item_off: a - o,
                window_off: a - start,
                len: b - a,
            })
        })
    }
}

/// How many of `0..n` come before the first `i` for which `pred(i)` is false, where `pred`
/// holds for a prefix of `0..n` only (a binary search).
fn partition(n: usize, pred: impl Fn(usize) -> bool) -> usize {
    let (mut lo, mut hi) = (0, n);
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if pred(mid) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    lo
}

/// The first window is never smaller than this (nor larger than a full one).
const RAMP_MIN: usize = 1 << 20;

/// The size of the first window: an eighth of a full one, at least [`RAMP_MIN`].
fn first_window(window: usize) -> usize {
    (window / 8).max(RAMP_MIN).min(window).max(1)
}

/// Cuts `[0, end)` into windows: a ramp first (an eighth of `window`, at least 1 MiB,
/// doubling up to `window`), then windows of `window` bytes (the last may be shorter).
/// The ramp lets the first copy start after a short fill instead of a whole slot's
/// (218 us for 8 MiB on the H200 host, with the copy threads waking up), while the copy
/// engine is then kept busy as the full windows fill.
pub(crate) fn windows(end: usize, window: usize) -> impl Iterator<Item = Window> {
    let window = window.max(1);
    let (mut start, mut size) = (0, first_window(window));
    std::iter::from_fn(move || {
        if start >= end {
            return None;
        }
        let w = Window {
            start,
            len: size.min(end - start),
        };
        start += w.len;
        size = (size * 2).min(window);
        Some(w)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn pack_aligns_and_places_empty_items() {
        let (offs, end) = pack([5usize, 0, 300].into_iter(), 256).unwrap();
        assert_eq!(offs, vec![0, 256, 256]);
        assert_eq!(end, 556);
        assert_eq!(pack(std::iter::empty(), 256).unwrap(), (vec![], 0));
    }

    #[test]
    fn pack_overflow_is_an_error() {
        assert!(pack([usize::MAX - 10, 100].into_iter(), 256).is_err());
    }

    #[test]
    fn window_size_grows_with_the_batch_up_to_a_slot() {
        let slot = 8 << 20;
        assert_eq!(window_size(1000, slot), 1 << 20);
        assert_eq!(window_size(9_633_792, slot), 2 << 20);
        assert_eq!(window_size(256 << 20, slot), slot);
        assert_eq!(window_size(1 << 30, slot), slot);
        assert_eq!(window_size(100, 4096), 4096, "never above the slot");
        assert_eq!(window_size(0, 4096), 4096);
    }

    #[test]
    fn windows_ramp_up_then_stay_full() {
        let mib = 1 << 20;
        let sizes = |end: usize, window: usize| {
            windows(end, window)
                .map(|w| w.len / (mib / 4))
                .collect::<Vec<_>>()
        };
        // 8 MiB windows: 1, 2, 4 MiB first (in quarter MiB here), then 8 MiB, the last
        // shorter.
        assert_eq!(sizes(30 * mib, 8 * mib), vec![4, 8, 16, 32, 32, 28]);
        assert_eq!(sizes(2 * mib, 8 * mib), vec![4, 4], "cut short by the end");
        // Windows of 1 MiB or less have no ramp.
        assert_eq!(sizes(3 * mib, mib), vec![4, 4, 4]);
        assert_eq!(windows(0, 8 * mib).count(), 0);
    }

    proptest! {
        #[test]
        fn windows_cover_the_region_once(
            end in 0usize..(64 << 20),
            shift in 12u32..24,
        ) {
            let window = 1usize << shift;
            let w: Vec<Window> = windows(end, window).collect();
            let mut at = 0;
            for x in &w {
                prop_assert_eq!(x.start, at);
                prop_assert!(x.len > 0 && x.len <= window);
                at += x.len;
            }
            prop_assert_eq!(at, end);
        }
    }

    #[test]
    fn one_item_spanning_three_windows() {
        let w: Vec<_> = windows(25, 10).collect();
        assert_eq!(w.len(), 3);
        assert_eq!(w[2].start, 20);
        assert_eq!(w[2].len, 5);
        assert_eq!(
            w[1].parts(&[0], &[25]).collect::<Vec<_>>(),
            vec![Part {
                item: 0,
                item_off: 10,
                window_off: 0,
                len: 10
            }]
        );
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(if cfg!(miri) { 8 } else { 512 }))]

        /// Every byte of every item lands in exactly one piece, at the right place, and
        /// pieces stay inside their windows.
        #[test]
        fn windows_cover_every_item_byte_exactly_once(
            sizes in proptest::collection::vec(0usize..3000, 0..40),
            align_pow in 0u32..9,
            window in 1usize..5000,
        ) {
            let align = 1usize << align_pow;
            let (offs, end) = pack(sizes.iter().copied(), align).unwrap();
            let mut covered: Vec<usize> = vec![0; sizes.len()];
            let mut next_start = 0;
            for w in windows(end, window) {
                prop_assert_eq!(w.start, next_start);
                prop_assert!(w.len > 0 && w.len <= window);
                next_start = w.start + w.len;
                // The size hint bounds the pieces, counting at most the empty items over.
                let hint = w.parts(&offs, &sizes).size_hint().1;
                let n = w.parts(&offs, &sizes).count();
                let empty = sizes.iter().filter(|&&s| s == 0).count();
                prop_assert!(hint.is_some_and(|h| h >= n && h <= n + empty), "{hint:?} for {n}");
                for p in w.parts(&offs, &sizes) {
                    prop_assert!(p.window_off + p.len <= w.len);
                    // the piece's place in the window is its place in the batch buffer
                    prop_assert_eq!(w.start + p.window_off, offs[p.item] + p.item_off);
                    // pieces of one item come in order, without gaps
                    prop_assert_eq!(p.item_off, covered[p.item]);
                    covered[p.item] += p.len;
                }
            }
            prop_assert_eq!(next_start, end);
            prop_assert_eq!(covered, sizes);
        }

        #[test]
        fn packed_items_do_not_overlap(sizes in proptest::collection::vec(0usize..5000, 0..50)) {
            let (offs, end) = pack(sizes.iter().copied(), 256).unwrap();
            for i in 0..sizes.len() {
                prop_assert_eq!(offs[i] % 256, 0);
                if i + 1 < sizes.len() {
                    prop_assert!(offs[i] + sizes[i] <= offs[i + 1]);
                }
            }
            prop_assert!(sizes.is_empty() || offs[sizes.len() - 1] + sizes[sizes.len() - 1] == end);
        }
    }
}
