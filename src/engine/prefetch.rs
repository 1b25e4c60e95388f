//! [`Prefetcher`]: host batches in, device batches out, moved on a worker thread up to
//! `depth` batches ahead of the consumer.

use super::{transfer_tensor_h2d_with, H2dOptions};
use crate::batch::Batch;
use crate::device::Device;
use crate::error::{Error, Result};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender};
use std::sync::Arc;
use std::thread::JoinHandle;

/// Wraps an iterator of host batches and yields them on the device, moving up to `depth`
/// of them ahead on a worker thread while the consumer works on the current one.
///
/// * **Order**: batches come out in the order the source gives them, each as the
///   `Result` of its [`transfer_tensor_h2d_with`]; a failed transfer is an `Err` at its
///   place and the next batches still come (the consumer decides whether to stop). An
///   error recorded for the device by earlier work ([`Error::Deferred`], from an owner's
///   drop somewhere), which the worker's transfer meets before it touches the batch, is
///   an `Err` of its own, and the batch it was moving comes after it.
/// * **Bounded**: at most `depth` batches are moved ahead of the consumer: `depth - 1`
///   wait in a queue, and the worker holds one more, moving or ready (it then blocks
///   until the consumer takes one). Device memory is bounded by those and the batches the
///   consumer still holds; the worker's thread also keeps its last
///   [`H2dOptions::num_caches`] batches referenced, as any thread does.
/// * **Ready**: each yielded batch is on the device (the worker's transfer synchronised),
///   usable on any stream; give [`H2dOptions::consumer_stream`] so that its memory is
///   freed in order on the stream that uses it.
/// * **Stopping**: dropping the prefetcher stops the worker: it finishes the batch it is
///   moving (or waits for the source to give the one it is asking for) and exits, and
///   the drop returns after it; the batches moved and not taken are dropped. A panic in
///   the source iterator ends the stream with [`Error::Worker`] at its place.
/// * **Errors nobody takes**: dropped before the consumer took them, an error recorded
///   by earlier work ([`Error::Deferred`]) goes back to be reported by the device's next
///   call on any thread, and so does a panic of the source or of a batch's code; a
///   batch's own failure is dropped with the batch.
///
/// ```
/// use pinlane::{H2dOptions, Prefetcher, Tensor};
/// # fn main() -> pinlane::Result<()> {
/// let host = (0..8).map(|i| vec![Tensor::from_vec(vec![i as f32; 1024], [1024]).unwrap()]);
/// for (i, on_gpu) in Prefetcher::new(host, 2, H2dOptions::default())?.enumerate() {
///     let on_gpu = on_gpu?; // on cuda:{LOCAL_RANK} (as is without CUDA)
///     assert_eq!(on_gpu[0].dims(), &[1024]);
///     // ... launch work on batch i while batch i + 1 and i + 2 move ...
/// #   let _ = i;
/// }
/// # Ok(()) }
/// ```
pub struct Prefetcher<B> {
    /// `None` once dropped (so the worker's sends fail and it exits).
    rx: Option<Receiver<Parcel<B>>>,
    stop: Arc<AtomicBool>,
    worker: Option<JoinHandle<()>>,
}

/// An item on its way to the consumer, with the device where an error nobody takes is
/// kept. Dropped unopened (not sent, drained by the prefetcher's drop, or left in the
/// channel when its receiver drops, on whichever thread that is), it keeps its error as
/// [`unreceived`] says and drops its batch as [`drop_batch`] does: no path that lets go of
/// an item loses an error or lets a batch's panic unwind (session 87: a send completed
/// after a drop that gave up on the worker had drained for the last time left its item to
/// the channel's own drop, which did neither).
struct Parcel<B> {
    /// `None` once opened.
    item: Option<Result<B>>,
    /// The transfers' device, resolved once by the worker.
    device: Option<usize>,
}

impl<B> Parcel<B> {
    fn new(item: Result<B>, device: Option<usize>) -> Parcel<B> {
        Parcel {
            item: Some(item),
            device,
        }
    }

    /// The item, taken by the consumer (its error is then the consumer's).
    fn open(mut self) -> Option<Result<B>> {
        self.item.take()
    }
}

impl<B> Drop for Parcel<B> {
    fn drop(&mut self) {
        match self.item.take() {
            Some(Err(e)) => unreceived(self.device, e),
            Some(Ok(batch)) => drop_batch(self.device, batch),
            None => {}
        }
    }
}

impl<B: Batch + Send + 'static> Prefetcher<B> {
    /// The largest `depth`: the queue's places are allocated when the prefetcher is made,
    /// and each place ahead holds a batch's device memory.
    pub const MAX_DEPTH: usize = 1024;

    /// Starts the worker over `batches`, moving up to `depth` batches ahead with `opts`.
    ///
    /// # Errors
    /// [`Error::InvalidOption`] for a `depth` of 0 or above [`Prefetcher::MAX_DEPTH`], or an
    /// option the transfer would refuse
    /// (checked here, before the worker starts); [`Error::Worker`] when the worker
    /// thread cannot be started.
    pub fn new<I>(batches: I, depth: usize, opts: H2dOptions) -> Result<Prefetcher<B>>
    where
        I: IntoIterator<Item = B>,
        I::IntoIter: Send + 'static,
    {
        if depth == 0 || depth > Self::MAX_DEPTH {
            return Err(Error::InvalidOption {
                name: "depth",
                reason: format!(
                    "a prefetcher needs a depth of 1 to {}, not {depth}",
                    Self::MAX_DEPTH
                ),
            });
        }
        opts.device.check()?;
        opts.check()?;
        // depth - 1 waiting in the channel, plus the one the worker holds while blocked
        // on a full channel: depth ahead of the consumer.
        let (tx, rx) = mpsc::sync_channel(depth - 1);
        let stop = Arc::new(AtomicBool::new(false));
        let iter = batches.into_iter();
        let worker = {
            let stop = stop.clone();
            std::thread::Builder::new()
                .name("pinlane-prefetch".into())
                .spawn(move || {
                    // Errors raised where no call returns them (owners' drops, the cache
                    // ring's at exit) go to the device's next call on any thread.
                    crate::driver::deferred::mark_background_thread("prefetch");
                    let device = super::ordinal_of(&opts.device);
                    let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        work(iter, &opts, device, &tx, &stop)
                    }));
                    if let Err(panic) = run {
                        // User code `work` runs outside its own catches: the source's
                        // drop, a host batch dropped unmoved (session 64: the panic went
                        // unreported).
                        report(device, &tx, &stop, panic);
                    }
                })
                .map_err(|e| Error::Worker {
                    reason: format!("cannot start the worker thread: {e}"),
                })?
        };
        Ok(Prefetcher {
            rx: Some(rx),
            stop,
            worker: Some(worker),
        })
    }
}

/// A panic on the worker outside a batch's move (the source's drop, a host batch dropped
/// unmoved): an error after the batches already sent, if the consumer still listens,
/// else kept for the device's next call.
fn report<B>(
    device: Option<usize>,
    tx: &SyncSender<Parcel<B>>,
    stop: &AtomicBool,
    panic: Box<dyn std::any::Any + Send>,
) {
    let e = Error::Panicked {
        thread: "prefetch",
        what: "dropping the source or a batch it gave",
        message: crate::error::panic_message(panic),
    };
    send(tx, stop, Parcel::new(Err(e), device));
}

/// Sends `parcel` to the consumer: `false` if it is gone or going (`stop`: its drop may
/// have received for the last time), and then the parcel is dropped here (which keeps
/// its error, see [`Parcel`]).
fn send<B>(tx: &SyncSender<Parcel<B>>, stop: &AtomicBool, parcel: Parcel<B>) -> bool {
    !stop.load(Ordering::Acquire) && tx.send(parcel).is_ok()
}

/// An error the consumer will not take (it dropped the prefetcher before receiving it):
/// one recorded for the device by earlier work and taken by a transfer of the worker's
/// ([`Error::Deferred`]: somebody else's error) goes back to the record, and a panic of
/// user code (the source's, a batch's) is recorded as one (what `report` does), each for
/// the device's next call (session 86: before, both were dropped with the channel). A
/// batch's own failure goes with the batch nobody asked for. Kept for the device's next
/// call on any thread, whichever thread finds it: they are the worker's, a thread of
/// pinlane's, and the one it took came from the device's record.
fn unreceived(device: Option<usize>, e: Error) {
    let Some(d) = device else { return };
    match e {
        // Given back, not counted again as an error of pinlane's threads.
        Error::Deferred(earlier) => crate::driver::deferred::put_back(Device::cuda(d), *earlier),
        e @ (Error::Panicked { .. } | Error::Worker { .. }) => {
            crate::driver::deferred::record_for_device(d, e)
        }
        _ => {}
    }
}

/// Drops a batch nobody took, on the thread dropping the prefetcher: a panic in its code
/// is caught and kept for the device's next call, as the worker keeps its own.
fn drop_batch<B>(device: Option<usize>, batch: B) {
    let dropped = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| drop(batch)));
    if let Err(panic) = dropped {
        // The payload is dropped under its own catch, device or not.
        let message = crate::error::panic_message(panic);
        if let Some(d) = device {
            let e = Error::Panicked {
                thread: "prefetch",
                what: "dropping a batch the consumer did not take",
                message,
            };
            crate::driver::deferred::record_for_device(d, e);
        }
    }
}

/// The worker: moves each batch and hands it over, until the source ends, the consumer
/// is gone, or it is told to stop.
fn work<B: Batch, I: Iterator<Item = B>>(
    mut iter: I,
    opts: &H2dOptions,
    device: Option<usize>,
    tx: &SyncSender<Parcel<B>>,
    stop: &AtomicBool,
) {
    while !stop.load(Ordering::Acquire) {
        let next = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| iter.next()));
        let batch = match next {
            Ok(Some(b)) => b,
            Ok(None) => return,
            Err(panic) => {
                let reason = crate::error::panic_message(panic);
                let e = Error::Worker {
                    reason: format!("the source iterator panicked: {reason}"),
                };
                send(tx, stop, Parcel::new(Err(e), device));
                return;
            }
        };
        if stop.load(Ordering::Acquire) {
            return;
        }
        // The batch's own code runs here too (its `Batch::visit` and `rebuild`, its drop
        // and its tensors' owners'): a panic there is that batch's error, in its place,
        // not the silent end of the stream that the worker's death would look like.
        let panicked = |panic: Box<dyn std::any::Any + Send>| Error::Panicked {
            thread: "prefetch",
            what: "moving a batch (its Batch::visit or rebuild, or its drop)",
            message: crate::error::panic_message(panic),
        };
        // An error recorded for the device by earlier work (`Error::Deferred`: an owner's
        // drop somewhere) is no fault of this batch, which the transfer has not touched
        // when it returns it: an item of its own, and the batch is moved again. Each try
        // takes one such error, so the tries are bounded; each runs under its own catch,
        // so a panic in a retry loses none of the errors taken before it.
        let mut earlier = Vec::new();
        let mut item = loop {
            let tried = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                transfer_tensor_h2d_with(&batch, opts)
            }));
            match tried {
                Ok(Err(e @ Error::Deferred(_))) if earlier.len() < DEFERRED_TRIES => {
                    earlier.push(Err(e));
                }
                Ok(r) => break r,
                Err(panic) => break Err(panicked(panic)),
            }
        };
        let dropped = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| drop(batch)));
        if let Err(panic) = dropped {
            item = Err(panicked(panic));
        }
        let mut parcels = earlier
            .into_iter()
            .chain(std::iter::once(item))
            .map(|item| Parcel::new(item, device));
        while let Some(parcel) = parcels.next() {
            if !send(tx, stop, parcel) {
                // The consumer is gone: what it will not take is kept or dropped here,
                // each as a parcel (the map makes them).
                parcels.for_each(drop);
                return;
            }
        }
    }
}

/// How many errors recorded by earlier work one batch's transfer may meet before the
/// last one is that batch's error (each try of the transfer takes one).
const DEFERRED_TRIES: usize = 4;

impl<B> Iterator for Prefetcher<B> {
    type Item = Result<B>;

    /// The next device batch, waiting (asleep) for the worker if it is not moved yet;
    /// `None` after the source's last batch.
    ///
    /// The wait is as long as the source takes to give the batch (pinlane cannot bound
    /// the caller's iterator) plus its transfer, a blocking call on the worker: with
    /// [`Config::sync_wait`](crate::config::Config::sync_wait) set, a device that does not
    /// finish the copies in time is an `Err` in the batch's place, not a hang.
    ///
    /// In a child process forked after the prefetcher was made, the worker is not there:
    /// the first call is an [`Error::ForkedChild`], and the iterator ends.
    fn next(&mut self) -> Option<Result<B>> {
        let rx = self.rx.as_ref()?;
        if let Err(e) = crate::driver::fork::check("Prefetcher::next") {
            // The batches waiting in the channel are the parent's (device memory, page-
            // locked blocks): left alone, not dropped in the child.
            std::mem::forget(self.rx.take());
            return Some(Err(e));
        }
        rx.recv().ok().and_then(Parcel::open)
    }
}

impl<B> Drop for Prefetcher<B> {
    /// Stops the worker and waits for it to exit, at most
    /// [`Config::drop_sync_wait`](crate::config::Config::drop_sync_wait): a worker still inside
    /// the source's `next()` (which pinlane cannot interrupt) is then left to exit on its
    /// own when that returns, and the drop returns.
    fn drop(&mut self) {
        if crate::driver::fork::marked() {
            // A forked child: the worker is the parent's (not here to stop or wait for),
            // and so are the batches in the channel.
            std::mem::forget(self.rx.take());
            std::mem::forget(self.worker.take());
            return;
        }
        self.stop.store(true, Ordering::Release);
        let Some(rx) = self.rx.take() else { return };
        // What waits in the channel, and what the worker sent before it saw `stop`, is
        // received here until it exits (which unblocks a worker waiting to send), and
        // dropped: a parcel keeps its error and catches its batch's panic (`Parcel`).
        let drain = |rx: &Receiver<Parcel<B>>| rx.try_iter().for_each(drop);
        let Some(w) = self.worker.take() else {
            drain(&rx);
            return;
        };
        // The process's setting, read without the runtime (after a `shutdown`, asking
        // for it would set a new one up, inside a drop).
        let limit = crate::memory::waits::drop_wait();
        let mut patience = super::patience::Patience::new(limit);
        while !w.is_finished() {
            drain(&rx);
            if patience.pause().is_err() {
                // Detached: what it sent so far is received here; from now on it keeps
                // what it would send (it sees `stop`; dropping the receiver fails a send
                // begun before, and drops a parcel a send that passed `stop` before the
                // drop set it left in the channel), and it exits when the source's
                // `next()` returns.
                drain(&rx);
                return;
            }
        }
        // The worker catches the source's panics; a panic elsewhere in it has been
        // reported by the thread already, and Drop must not panic. Joined first: its
        // last sends are then seen by the drain.
        let _ = w.join();
        drain(&rx);
    }
}

impl<B> std::fmt::Debug for Prefetcher<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Prefetcher")
            .field("running", &self.worker.is_some())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::driver::deferred;

    /// Device ordinals no other test records for (the records are process-wide).
    const DEVICE: usize = 87;

    struct Bomb;
    impl Drop for Bomb {
        fn drop(&mut self) {
            panic!("the batch's drop panicked on purpose");
        }
    }

    fn earlier() -> Error {
        Error::Deferred(Box::new(Error::StreamWithoutDevice))
    }

    /// What a send that passed `stop` just before a drop that gave up on the worker puts
    /// in the channel after the drop's last drain: the channel's own drop lets go of it.
    #[test]
    fn parcels_the_channel_drops_keep_their_errors_and_catch_their_panics() {
        let (tx, rx) = mpsc::sync_channel(2);
        assert!(tx.send(Parcel::new(Ok(Bomb), Some(DEVICE))).is_ok());
        assert!(tx
            .send(Parcel::new(Err(earlier()), Some(DEVICE + 1)))
            .is_ok());
        let dropped = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            drop(rx);
            drop(tx);
        }));
        assert!(
            dropped.is_ok(),
            "a batch's panic unwound out of the channel's drop"
        );
        match deferred::take(Device::cuda(DEVICE)) {
            Some(Error::Panicked {
                thread: "prefetch",
                message,
                ..
            }) => assert!(message.contains("on purpose"), "{message}"),
            other => panic!("the batch's panic was not kept: {other:?}"),
        }
        assert_eq!(
            deferred::take(Device::cuda(DEVICE + 1)),
            Some(Error::StreamWithoutDevice),
            "the earlier error went back to the device's record"
        );
    }

    /// A parcel the consumer opened is the consumer's: nothing is kept for it.
    #[test]
    fn an_opened_parcel_keeps_nothing() {
        let p = Parcel::<Bomb>::new(Err(earlier()), Some(DEVICE + 2));
        assert_eq!(p.open().map(|r| r.err()), Some(Some(earlier())));
        assert_eq!(deferred::take(Device::cuda(DEVICE + 2)), None);
    }
}
