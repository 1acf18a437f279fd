//! The in-memory fence: one value guarded by one mutex, for a resource inside one process.

use crate::clock::WallClock;
use crate::refusal::Refusal;
use crate::rule::{self, Admission, FenceRecord, Policy, Presented};
use std::sync::{Mutex, MutexGuard};

/// A value that only current grants may change. The admission check and the change happen under
/// one mutex, so a refused token can never race a write.
///
/// The highest token lives in memory only: if the process restarts, so does the fence. Use
/// [`crate::FencedStore`] when the resource outlives the process.
///
/// ```
/// use picket_fence::{Guarded, Policy, Presented};
///
/// let balance = Guarded::new("accounts/42", Policy::new("accounts"), 100_i64);
/// let as_holder = |token| Presented::new("accounts", token);
/// balance.write(&as_holder(34), |value| *value -= 30).unwrap();
/// // The paused former holder wakes up with token 33: refused, the value is untouched.
/// assert!(balance.write(&as_holder(33), |value| *value -= 30).is_err());
/// assert_eq!(balance.read("accounts", 34, |value| *value).unwrap(), 70);
/// ```
#[derive(Debug)]
pub struct Guarded<T> {
    resource: String,
    policy: Policy,
    clock: WallClock,
    state: Mutex<(Option<FenceRecord>, T)>,
}

/// What an admitted write returned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Written<R> {
    /// How it was admitted.
    pub admission: Admission,
    /// The closure's result; `None` for a duplicate, whose closure did not run again.
    pub output: Option<R>,
}

impl<T> Guarded<T> {
    /// Guards `value` as `resource` under `policy`.
    pub fn new(resource: impl Into<String>, policy: Policy, value: T) -> Self {
        Self {
            resource: resource.into(),
            policy,
            clock: WallClock::system(),
            state: Mutex::new((None, value)),
        }
    }

    /// The same guard reading the time it gives the rule from `clock` (the system's wall clock
    /// unless told otherwise).
    #[must_use]
    pub fn with_clock(mut self, clock: WallClock) -> Self {
        self.clock = clock;
        self
    }

    fn lock_state(&self) -> MutexGuard<'_, (Option<FenceRecord>, T)> {
        // A panic inside a caller's closure poisons the mutex. The fence record then holds
        // the write's token as a registration (see `write`), so it is consistent and can be
        // used; the value is the caller's.
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Runs `mutate` on the value if the rule admits `presented`. All the changes `mutate` makes
    /// are one unit: checked once, applied together. The write is remembered (its `seq` and
    /// idempotency key) only once `mutate` returned: a closure that panics leaves its token
    /// recorded as the highest (as a registration would), so older grants stay refused over
    /// whatever it changed, but not the write itself, so its retry is applied, not answered as
    /// a duplicate of a write that did not finish. The fence cannot undo what a panicking
    /// closure changed in the value before it panicked.
    ///
    /// # Errors
    /// The [`Refusal`] when the write must not land; the value is then untouched.
    pub fn write<R>(
        &self,
        presented: &Presented,
        mutate: impl FnOnce(&mut T) -> R,
    ) -> Result<Written<R>, Refusal> {
        let mut state = self.lock_state();
        // Read under the lock, so the keys' times follow their order of admission.
        let now_ms = self.clock.now_ms();
        let (admission, record) =
            rule::admit(&self.resource, state.0.as_ref(), &self.policy, presented, now_ms)?;
        if !admission.should_apply() {
            state.0 = Some(record);
            return Ok(Written { admission, output: None });
        }
        let (lock, token) = (presented.lock.as_str(), presented.stamp.token);
        // Admitted, so the token is not below the highest: registering it cannot be refused,
        // and a failure leaves the record as it was, at least as high.
        if let Ok(floor) =
            rule::register(&self.resource, state.0.as_ref(), &self.policy, lock, token)
        {
            state.0 = Some(floor);
        }
        let output = mutate(&mut state.1);
        state.0 = Some(record);
        Ok(Written { admission, output: Some(output) })
    }

    /// Fence on acquire: makes `token` the highest so older grants are refused from now on.
    ///
    /// # Errors
    /// The [`Refusal`] when `token` is stale or of another lock.
    pub fn register(&self, lock: &str, token: u64) -> Result<(), Refusal> {
        let mut state = self.lock_state();
        let record = rule::register(&self.resource, state.0.as_ref(), &self.policy, lock, token)?;
        state.0 = Some(record);
        Ok(())
    }

    /// Reads the value if `token` is not stale.
    ///
    /// # Errors
    /// The [`Refusal`] when `token` is stale or of another lock.
    pub fn read<R>(
        &self,
        lock: &str,
        token: u64,
        read: impl FnOnce(&T) -> R,
    ) -> Result<R, Refusal> {
        let state = self.lock_state();
        rule::check_read(&self.resource, state.0.as_ref(), &self.policy, lock, token)?;
        Ok(read(&state.1))
    }

    /// The highest token admitted or registered, 0 if none.
    pub fn highest_token(&self) -> u64 {
        self.lock_state().0.as_ref().map_or(0, |record| record.highest_token)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// SPEC: a retry with the same stamp and key gets the original outcome, never a second
    /// application. A keyed write whose closure panicked did not finish: its record (with the
    /// key) was kept all the same, so its retry was answered `Duplicate` and never applied.
    /// Whatever the panicking closure changed stays fenced: a paused older holder is still
    /// refused (found in review: with the record stored only after the closure, token 6 was
    /// admitted over token 7's partial write).
    #[test]
    fn a_write_whose_closure_panicked_is_not_remembered_and_its_retry_applies() {
        let guarded = Guarded::new("accounts/42", Policy::new("accounts"), 0_i64);
        guarded.write(&Presented::new("accounts", 6), |value| *value = 1).unwrap();
        let keyed = Presented::new("accounts", 7).with_idempotency_key("k1");
        let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            guarded.write(&keyed, |value: &mut i64| {
                *value = 100;
                panic!("the caller's code failed halfway")
            })
        }));
        assert!(panicked.is_err());
        assert_eq!(guarded.highest_token(), 7, "its token fences what it changed");
        let older = guarded.write(&Presented::new("accounts", 6), |value| *value = 2);
        assert!(older.is_err(), "the older holder stays refused");
        let retried = guarded.write(&keyed, |value| *value += 30).unwrap();
        assert_eq!(retried.output, Some(()), "applied: {:?}", retried.admission);
        let again = guarded.write(&keyed, |value| *value += 30).unwrap();
        assert_eq!(again.output, None, "now a duplicate: {:?}", again.admission);
        assert_eq!(guarded.read("accounts", 7, |value| *value).unwrap(), 130);
    }
}
