//! Page-locking many host buffers in place at once ([`register_many`]). The driver
//! page-locks whole pages, so buffers that share a page (small allocations side by side
//! in a heap) are registered as one range, one driver call for a run of them; each buffer
//! becomes a view of its range's block.
//!
//! ```text
//!  pages:    |    p0    |    p1    |    p2    |    p3    |    p4    |
//!  buffers:     [a ]  [b    ]         [c]                   [ d  ]
//!  groups:      [a ... b] (p0-p1)     [c] (p2)              [d] (p4)
//! ```
//!
//! Every page a group's range touches holds bytes of one of its buffers, so the pages
//! stay mapped while those buffers live, whatever else the process allocates or frees
//! around them.
//!
//! Memory inside a live registration of pinlane's (an earlier call's) is not registered
//! again (the driver would refuse it): it becomes a block that holds that registration
//! and its own owner (see the registry in `pinned.rs`). The owner matters: a group's range
//! may take in the bytes of other allocations between its buffers, which the group's
//! registration does not keep alive.

use super::pinned::{page_size, register, registered, PinnedBlock, PinnedBuf};
use crate::error::Result;
use std::sync::Arc;

/// Spans registered as one range: bytes `start..end` (the lowest start and the highest
/// end of its spans), and its spans' indices.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Group {
    pub start: usize,
    pub end: usize,
    pub members: Vec<usize>,
}

/// Groups the spans `(address, length)` (each length > 0, none reaching past the address
/// space) so that no two groups touch the same page of `page` bytes (a power of two) and
/// every page a group's range touches holds bytes of one of its spans. Groups come in
/// address order, their members in address order.
pub(crate) fn group_by_page(spans: &[(usize, usize)], page: usize) -> Vec<Group> {
    let mut order: Vec<usize> = (0..spans.len()).collect();
    order.sort_by_key(|&i| spans[i].0);
    let mut groups: Vec<Group> = Vec::new();
    // The last page the current group touches.
    let mut last_page = 0;
    for i in order {
        let (at, len) = spans[i];
        let end = at.saturating_add(len.max(1));
        let (first, last) = (at / page, (end - 1) / page);
        match groups.last_mut() {
            Some(g) if first <= last_page => {
                g.end = g.end.max(end);
                g.members.push(i);
                last_page = last_page.max(last);
            }
            _ => {
                groups.push(Group {
                    start: at,
                    end,
                    members: vec![i],
                });
                last_page = last;
            }
        }
    }
    groups
}

/// Page-locks the host buffers `spans` (`(address, length)`, lengths > 0) in place, for
/// every context, mapped for the devices (`cuMemHostRegister` under `device`'s context):
/// one registration per group of buffers that share pages ([`group_by_page`]); a buffer
/// inside a live registration of pinlane's becomes a view of it instead, holding that
/// registration and the buffer's own owner. Returns a page-locked view of each buffer, in
/// order; a group's registration ends when the last view of it (or of memory inside it)
/// drops, and then its members' owners drop. On an error nothing new stays registered.
///
/// # Safety
/// Each span is host memory that `owners[i]` keeps allocated while it lives (so its pages
/// stay mapped; pinlane reads only the spans' own bytes, never the rest of a group's
/// range). `owners` has one owner per span.
pub(crate) unsafe fn register_many(
    spans: &[(*const u8, usize)],
    owners: Vec<Arc<dyn Send + Sync>>,
    device: usize,
) -> Result<Vec<PinnedBuf>> {
    let addrs: Vec<(usize, usize)> = spans.iter().map(|&(p, n)| (p as usize, n)).collect();
    let mut views: Vec<Option<PinnedBuf>> = vec![None; spans.len()];
    // Memory inside a live registration of pinlane's: a view of it (the driver would
    // refuse a second registration). The rest is registered by groups.
    let mut rest = Vec::with_capacity(addrs.len());
    for (i, &(at, n)) in addrs.iter().enumerate() {
        // SAFETY: the caller's obligation for span `i`.
        match unsafe { view_of_live(at, n, &owners[i]) } {
            Some(view) => views[i] = Some(view?),
            None => rest.push(i),
        }
    }
    let spans_left: Vec<(usize, usize)> = rest.iter().map(|&i| addrs[i]).collect();
    for mut g in group_by_page(&spans_left, page_size()) {
        for m in &mut g.members {
            *m = rest[*m];
        }
        let kept: Vec<Arc<dyn Send + Sync>> =
            g.members.iter().map(|&i| owners[i].clone()).collect();
        let (start, len) = (g.start as *const u8, g.end - g.start);
        // SAFETY: every page of `start..start + len` holds bytes of a member span
        // (group_by_page), which `kept` keeps allocated until the block has unregistered
        // the range; the bytes between the spans (which may be other allocations) are
        // read by nobody through this block: its views are its members' spans, and memory
        // between them registered again later becomes a view that holds its own owner
        // (`view_of_live`).
        match unsafe { register(start, len, device, Box::new(kept)) } {
            Ok(block) => {
                for &i in &g.members {
                    let (at, n) = addrs[i];
                    views[i] = Some(PinnedBuf::view(&block, at - g.start, n)?);
                }
            }
            // The bytes between the spans may be another registration's (the driver
            // refuses a range that overlaps one, not one that only shares its pages):
            // each span alone. The span's own error is the call's (the group's said
            // only that some byte of its range was taken).
            Err(_) if g.members.len() > 1 => {
                for &i in &g.members {
                    let (at, n) = addrs[i];
                    // The same buffer twice in the list: registered a moment ago.
                    // SAFETY: the caller's obligation for span `i`.
                    if let Some(view) = unsafe { view_of_live(at, n, &owners[i]) } {
                        views[i] = Some(view?);
                        continue;
                    }
                    let owner = Box::new(owners[i].clone());
                    // SAFETY: the span's own bytes, which its owner keeps allocated until
                    // the block has unregistered them.
                    let block = unsafe { register(at as *const u8, n, device, owner) }?;
                    views[i] = Some(PinnedBuf::view(&block, 0, n)?);
                }
            }
            Err(e) => return Err(e),
        }
    }
    views
        .into_iter()
        .map(|v| {
            v.ok_or_else(|| crate::error::Error::Internal {
                op: "register_pinned_many",
                reason: "a span belongs to no group".into(),
            })
        })
        .collect()
}

/// A page-locked view of the `n` bytes at `at` when they lie inside a live registration
/// of pinlane's: a block that holds the registration and `owner` (the registration keeps
/// only its own members' owners alive, and the span may be another allocation that lies
/// between them). `None` when no live registration holds them all.
///
/// # Safety
/// `at..at + n` is host memory that `owner` keeps allocated, unchanged by pinlane's
/// writes, while it lives.
unsafe fn view_of_live(
    at: usize,
    n: usize,
    owner: &Arc<dyn Send + Sync>,
) -> Option<Result<PinnedBuf>> {
    let registration = registered(at, n).inside()?;
    // SAFETY: the caller's obligation keeps the bytes allocated while `owner` lives; the
    // registration, which holds all of them (`registered` found them inside it) and which
    // the block holds, keeps them page-locked; not writable.
    let block = unsafe {
        PinnedBlock::foreign_in(
            at as *mut u8,
            n,
            Box::new(owner.clone()),
            false,
            Some(registration),
        )
    };
    Some(PinnedBuf::view(&block, 0, n))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const PAGE: usize = 4096;

    #[test]
    fn buffers_sharing_a_page_are_one_group() {
        let spans = [
            (5000, 10),
            (100, 50),
            (200, 4000),
            (3 * PAGE + 1, PAGE),
            (9 * PAGE, 1),
        ];
        let g = group_by_page(&spans, PAGE);
        assert_eq!(
            g,
            vec![
                Group {
                    start: 100,
                    end: 5010,
                    members: vec![1, 2, 0]
                },
                Group {
                    start: 3 * PAGE + 1,
                    end: 4 * PAGE + 1,
                    members: vec![3]
                },
                Group {
                    start: 9 * PAGE,
                    end: 9 * PAGE + 1,
                    members: vec![4]
                },
            ]
        );
        // Adjacent pages are not shared: two groups.
        assert_eq!(group_by_page(&[(0, PAGE), (PAGE, 1)], PAGE).len(), 2);
    }

    #[test]
    fn the_page_size_is_a_power_of_two() {
        assert!(page_size().is_power_of_two());
    }

    proptest! {
        /// Every span is in exactly one group, inside its range; no two groups touch the
        /// same page; every page of a group's range holds bytes of a member.
        #[test]
        fn groups_cover_their_spans_and_share_no_page(
            raw in proptest::collection::vec((0usize..64 * PAGE, 1usize..3 * PAGE), 0..40),
        ) {
            let g = group_by_page(&raw, PAGE);
            let mut seen = vec![0; raw.len()];
            for grp in &g {
                for &i in &grp.members {
                    seen[i] += 1;
                    let (at, n) = raw[i];
                    prop_assert!(grp.start <= at && at + n <= grp.end);
                }
                for p in grp.start / PAGE..=(grp.end - 1) / PAGE {
                    let held = grp.members.iter().any(|&i| {
                        let (at, n) = raw[i];
                        at / PAGE <= p && p <= (at + n - 1) / PAGE
                    });
                    prop_assert!(held, "page {} of {:?} holds no member's bytes", p, grp);
                }
            }
            prop_assert!(seen.iter().all(|&s| s == 1));
            for w in g.windows(2) {
                prop_assert!((w[0].end - 1) / PAGE < w[1].start / PAGE, "{:?}", w);
            }
        }
    }
}
