//! A client's read-modify-write cycle, step by step: acquire, fence on acquire, read, the last
//! check of its own deadline, write, release.

use super::{ACQUIRE_TIMEOUT_US, Event, Grant, Phase, World, token_text};
use crate::authority::{AcquireReply, Granted};

impl World {
    pub(super) fn start_cycle(&mut self, c: usize) {
        let client = &mut self.clients[c];
        client.phase = Phase::Acquiring;
        client.grant = None;
        client.attempt += 1;
        self.ask(c);
    }

    pub(super) fn ask(&mut self, c: usize) {
        let now = self.now_us;
        self.clients[c].asked_at_us = self.clients[c].clock_us(now);
        let attempt = self.clients[c].attempt;
        self.send_to_authority(c, Event::AcquireArrives(c));
        self.schedule(ACQUIRE_TIMEOUT_US, Event::AcquireRetry(c, attempt));
    }

    /// Records a grant in the ground truth and sends it to its client.
    pub(super) fn deliver(&mut self, granted: Granted) {
        let c = granted.client;
        let id = if granted.fresh {
            self.grants_made += 1;
            self.stats.grants += 1;
            self.newest_grant = self.grants_made;
            if let Some(token) = granted.token {
                if self.last_token.is_some_and(|last| token <= last) {
                    self.stats.token_regressions += 1;
                    self.note(format!(
                        "TOKEN REGRESSION: grant {} got token {token} after {}",
                        self.grants_made,
                        self.last_token.unwrap_or(0)
                    ));
                }
                self.last_token = Some(token);
            }
            self.note(format!(
                "lock service grants the lock to client{c}{}",
                token_text(granted.token)
            ));
            self.granted_id[c] = self.grants_made;
            self.grants_made
        } else {
            self.granted_id[c]
        };
        let grant = Grant { id, token: granted.token };
        self.send_to_authority(c, Event::GrantArrives(c, grant, granted.lease_ms));
    }

    pub(super) fn authority_acquire(&mut self, c: usize) {
        match self.authority.acquire(self.now_us, c) {
            AcquireReply::Granted(granted) => self.deliver(granted),
            AcquireReply::Queued => {}
            AcquireReply::Busy => self.send_to_authority(c, Event::Busy(c)),
        }
    }

    pub(super) fn on_grant(&mut self, c: usize, grant: Grant, lease_ms: u64) {
        if self.clients[c].phase != Phase::Acquiring {
            // A grant the client no longer wants (it retried and moved on): give it back.
            self.send_to_authority(c, Event::ReleaseArrives(c));
            return;
        }
        let client = &mut self.clients[c];
        client.grant = Some(grant);
        client.deadline_us =
            client.asked_at_us + (lease_ms.saturating_sub(self.config.client_margin_ms)) * 1_000;
        if self.strategy.fence_on_acquire() {
            client.phase = Phase::Registering;
            self.send(Event::RegisterArrives(c, grant));
        } else {
            client.phase = Phase::Reading;
            self.send(Event::ReadArrives(c, grant));
        }
    }

    pub(super) fn on_registered(&mut self, c: usize, ok: bool) {
        if !ok {
            self.give_up(c);
            return;
        }
        let grant = self.clients[c].grant.expect("a registering client holds a grant");
        self.clients[c].phase = Phase::Reading;
        self.send(Event::ReadArrives(c, grant));
    }

    pub(super) fn on_read(&mut self, c: usize, value: Option<u64>) {
        let Some(value) = value else {
            self.note(format!(
                "client{c} is told its grant is stale before it writes; it gives up"
            ));
            self.give_up(c);
            return;
        };
        // The last check: is my lease still valid by my own clock?
        let now = self.now_us;
        let client = &self.clients[c];
        if client.clock_us(now) >= client.deadline_us {
            self.note(format!("client{c} sees its lease ran out and does not write"));
            self.give_up(c);
            return;
        }
        self.clients[c].phase = Phase::Writing;
        self.clients[c].value_to_write = value + 1;
        if self.rng.chance(self.config.pause_rate) {
            let pause = self.rng.exp_us(self.config.mean_pause_ms * 1_000.0);
            self.clients[c].paused_until_us = self.now_us + pause;
            #[allow(clippy::cast_precision_loss)]
            let seconds = pause as f64 / 1e6;
            self.note(format!(
                "client{c} checked its lease, then pauses for {seconds:.3}s (GC) before writing"
            ));
            self.schedule(pause, Event::PauseEnd(c));
        } else {
            self.write(c);
        }
    }

    pub(super) fn write(&mut self, c: usize) {
        if self.clients[c].phase != Phase::Writing {
            return;
        }
        let grant = self.clients[c].grant.expect("a writing client holds a grant");
        let value = self.clients[c].value_to_write;
        self.send(Event::WriteArrives(c, grant, value));
    }

    pub(super) fn on_write_reply(&mut self, c: usize, ok: bool) {
        if ok {
            self.clients[c].acked += 1;
        }
        self.give_up(c);
    }

    /// Ends the cycle: release (the authority ignores a release of a grant already gone), wait
    /// for the release to be confirmed (or give up on it after a timeout), then think before the
    /// next cycle. Waiting keeps a client's next acquire from overtaking its own release.
    pub(super) fn give_up(&mut self, c: usize) {
        self.clients[c].phase = Phase::Releasing;
        self.clients[c].grant = None;
        let attempt = self.clients[c].attempt;
        self.send_to_authority(c, Event::ReleaseArrives(c));
        self.schedule(ACQUIRE_TIMEOUT_US, Event::ReleaseTimeout(c, attempt));
    }

    pub(super) fn released(&mut self, c: usize, timed_out_attempt: Option<u64>) {
        let client = &self.clients[c];
        if client.phase != Phase::Releasing
            || timed_out_attempt.is_some_and(|attempt| attempt != client.attempt)
        {
            return;
        }
        self.clients[c].phase = Phase::Idle;
        let think = self.rng.range(1_000, 20_000);
        self.schedule(think, Event::Think(c));
    }
}
