//! [`Patience`]: how a polling loop that waits for the device paces itself, and when it
//! gives up.
//!
//! A loop that asks the driver without blocking (an event query) would otherwise burn a
//! core for as long as the device takes, forever on a hung one. Waiting briefly it spins
//! (the answer is usually microseconds away, and a sleep would cost more than the wait),
//! then yields its core, then sleeps in growing naps; once it has waited its limit with
//! no progress, it says so, and the loop gives up (with the error that fits it).

use std::time::{Duration, Instant};

/// Spinning for this long costs less than one sleep's wake-up.
const SPIN: Duration = Duration::from_micros(50);
/// Then yielding, for this long; then sleeping.
const YIELD: Duration = Duration::from_millis(1);
/// The first nap, and the longest.
const FIRST_NAP: Duration = Duration::from_micros(20);
const LONGEST_NAP: Duration = Duration::from_millis(1);

/// One wait of a polling loop; see the module docs.
pub(crate) struct Patience {
    limit: Duration,
    /// When the loop last stopped making progress; `None` while it makes some.
    since: Option<Instant>,
    nap: Duration,
}

impl Patience {
    /// A wait that gives up after `limit` without progress.
    pub(crate) fn new(limit: Duration) -> Patience {
        Patience {
            limit,
            since: None,
            nap: FIRST_NAP,
        }
    }

    /// The loop made progress: the next pause starts a fresh wait.
    pub(crate) fn progress(&mut self) {
        self.since = None;
        self.nap = FIRST_NAP;
    }

    /// One pause of a loop that made no progress this turn.
    ///
    /// # Errors
    /// How long the loop has waited without progress, once that is `limit` or more.
    pub(crate) fn pause(&mut self) -> Result<(), Duration> {
        let since = *self.since.get_or_insert_with(Instant::now);
        let waited = since.elapsed();
        if waited >= self.limit {
            return Err(waited);
        }
        if waited < SPIN {
            std::hint::spin_loop();
        } else if waited < YIELD {
            std::thread::yield_now();
        } else {
            std::thread::sleep(self.nap.min(self.limit - waited));
            self.nap = (self.nap * 2).min(LONGEST_NAP);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wait_without_progress_ends_after_its_limit_and_progress_restarts_it() {
        let mut p = Patience::new(Duration::from_millis(30));
        let t0 = Instant::now();
        let mut pauses = 0u64;
        let waited = loop {
            match p.pause() {
                Ok(()) => pauses += 1,
                Err(w) => break w,
            }
        };
        let took = t0.elapsed();
        assert!(waited >= Duration::from_millis(30), "{waited:?}");
        assert!(
            took >= Duration::from_millis(30) && took < Duration::from_secs(2),
            "{took:?}"
        );
        // It slept rather than spun: far fewer pauses than a spinning loop makes in 30 ms.
        assert!(pauses < 200_000, "{pauses} pauses");
        p.progress();
        assert!(p.pause().is_ok(), "progress starts a fresh wait");
    }
}
