//! `cargo bench --bench refcount`: what one atomic reference-count increment per output
//! tensor costs this host's CPU, against one increment per batch. No GPU is used.
//!
//! A batch's outputs each share its allocation through an `Arc` (one `lock`-prefixed
//! increment per tensor as the batch is rebuilt, one decrement per tensor as it is
//! dropped). On the CI machine (AMD EPYC) that is about 2 ns a tensor; the Rust bench's
//! per-tensor phases on the H200's host (an Intel Xeon under KVM) run 2 to 2.5 times
//! slower than here across the board, and a locked instruction on Intel drains the store
//! buffer, so this probe measures it where it matters before anything is built around it.
//!
//! Each case builds 1000 values laid out like `pinlane::Tensor` (104 bytes: a shape, a
//! size, a storage enum holding an `Arc` and an address) from 1000 sources, into a new
//! `Vec`, then drops it: with an `Arc` clone per value, or with plain pointers and one
//! counted add for the batch. "cold" flushes the sources' cache lines before each build
//! (as when a batch was made long before the call); "hot" does not. Prints the median ns
//! per value of the build and of the drop, over 1001 builds each. A `pinlane::Tensor`
//! clone of the same sources (its storage's `Arc`) is printed beside, for scale.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

const N: usize = 1000;
const REPS: usize = 1001;

/// The same layout as `pinlane::Tensor`, with the owner of the bytes as `O`.
#[allow(dead_code)] // written and read only through black_box: the layout is the point
#[derive(Clone)]
struct Value<O: Clone> {
    dtype: u8,
    shape: Shape,
    nbytes: usize,
    storage: Storage<O>,
}

#[allow(dead_code)]
#[derive(Clone)]
enum Shape {
    Inline { len: u8, dims: [usize; 4] },
    Shared(Arc<[usize]>),
}

#[allow(dead_code)]
#[derive(Clone)]
enum Storage<O: Clone> {
    Host {
        owner: O,
        offset: usize,
        nbytes: usize,
        at: usize,
    },
    Pinned {
        owner: O,
        offset: usize,
        nbytes: usize,
        at: usize,
        mapped: bool,
    },
}

fn value<O: Clone>(owner: O, k: usize) -> Value<O> {
    Value {
        dtype: 1,
        shape: Shape::Inline {
            len: 1,
            dims: [256, 0, 0, 0],
        },
        nbytes: 1024,
        storage: Storage::Pinned {
            owner,
            offset: k * 1024,
            nbytes: 1024,
            at: 0x1000 + k * 1024,
            mapped: true,
        },
    }
}

/// Writes the cache lines of `v`'s elements back and out of every cache level.
fn flush<T>(v: &[T]) {
    #[cfg(target_arch = "x86_64")]
    {
        let start = v.as_ptr() as usize;
        let end = start + std::mem::size_of_val(v);
        for line in (start & !63..end).step_by(64) {
            // SAFETY: `line` is inside `v`'s live allocation (or the start of the line
            // holding its first byte); clflush only evicts, it changes no value.
            unsafe { std::arch::x86_64::_mm_clflush(line as *const u8) };
        }
        // SAFETY: a fence has no memory operands.
        unsafe { std::arch::x86_64::_mm_mfence() };
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Median ns per value of `build` (timed), and of dropping what it built.
fn time<S, T>(sources: &[S], cold: bool, build: impl Fn(&[S]) -> Vec<T>) -> (f64, f64) {
    let (mut b, mut d) = (Vec::with_capacity(REPS), Vec::with_capacity(REPS));
    for _ in 0..REPS {
        if cold {
            flush(sources);
        }
        let t0 = Instant::now();
        let out = std::hint::black_box(build(sources));
        let t1 = Instant::now();
        drop(out);
        let t2 = Instant::now();
        b.push((t1 - t0).as_secs_f64() * 1e9 / sources.len() as f64);
        d.push((t2 - t1).as_secs_f64() * 1e9 / sources.len() as f64);
    }
    (median(b), median(d))
}

/// One count for a whole batch of values over `owner`: raised by `n` once, lowered once.
struct Batch<'a> {
    values: Vec<Value<usize>>,
    count: &'a AtomicUsize,
}

impl Drop for Batch<'_> {
    fn drop(&mut self) {
        self.count.fetch_sub(self.values.len(), Ordering::Release);
    }
}

fn main() {
    let block = Arc::new(vec![0u8; N * 1024]);
    let count = AtomicUsize::new(1);
    let arcs: Vec<Value<Arc<Vec<u8>>>> = (0..N).map(|k| value(block.clone(), k)).collect();
    let plain: Vec<Value<usize>> = (0..N).map(|k| value(0x1000, k)).collect();
    let tensors: Vec<pinlane::Tensor> = {
        let one = pinlane::Tensor::from_vec(vec![0f32; 256 * N], [N, 256]).expect("tensor");
        (0..N).map(|_| one.clone()).collect()
    };
    println!(
        "{N} values of {} bytes, medians of {REPS} builds (ns per value)",
        std::mem::size_of::<Value<usize>>()
    );
    for cold in [false, true] {
        let state = if cold { "cold" } else { "hot" };
        let each = time(&arcs, cold, |s| {
            s.iter()
                .map(|v| {
                    value(
                        match &v.storage {
                            Storage::Pinned { owner, .. } | Storage::Host { owner, .. } => {
                                owner.clone()
                            }
                        },
                        v.nbytes,
                    )
                })
                .collect()
        });
        let one = time(&plain, cold, |s| {
            count.fetch_add(s.len(), Ordering::Relaxed);
            let values = s.iter().map(|v| value(0x1000usize, v.nbytes)).collect();
            vec![Batch {
                values,
                count: &count,
            }]
        });
        let clone = time(&tensors, cold, |s| s.to_vec());
        println!(
            "{state:>4}: an Arc per value: build {:.2}, drop {:.2}; one count per batch: build {:.2}, drop {:.2}; pinlane::Tensor clones: build {:.2}, drop {:.2}",
            each.0, each.1, one.0, one.1, clone.0, clone.1
        );
    }
}
