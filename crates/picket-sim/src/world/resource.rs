//! The shared resource: registration, reads and writes, each decided by the strategy's rule
//! (the fence's own, for Picket) against the ground truth.

use super::{Event, Grant, World, token_text};
use crate::authority::LOCK;
use picket_fence::rule::{self, Presented};

impl World {
    pub(super) fn presented(grant: Grant) -> Presented {
        Presented::new(LOCK, grant.token.unwrap_or(0))
    }

    pub(super) fn resource_register(&mut self, c: usize, grant: Grant) {
        let ok = match rule::register(
            LOCK,
            self.resource.record.as_ref(),
            &self.policy,
            LOCK,
            grant.token.unwrap_or(0),
        ) {
            Ok(record) => {
                self.resource.record = Some(record);
                self.newest_at_resource = self.newest_at_resource.max(grant.id);
                self.note(format!(
                    "client{c} registers{} with the resource",
                    token_text(grant.token)
                ));
                true
            }
            Err(_) => false,
        };
        self.send(Event::RegisterReply(c, ok));
    }

    pub(super) fn resource_read(&mut self, c: usize, grant: Grant) {
        // Picket clients send their stamp with reads too, and hear at once when it is stale.
        let stale = self.strategy.is_picket()
            && rule::check_read(
                LOCK,
                self.resource.record.as_ref(),
                &self.policy,
                LOCK,
                grant.token.unwrap_or(0),
            )
            .is_err();
        let value = (!stale).then_some(self.resource.value);
        self.send(Event::ReadReply(c, value));
    }

    pub(super) fn resource_write(&mut self, c: usize, grant: Grant, value: u64) {
        let highest = self.resource.record.as_ref().map_or(0, |record| record.highest_token);
        let advancing = grant.token.is_some_and(|token| token > highest);
        if self.strategy == crate::config::Strategy::PicketVerify
            && advancing
            && !self.config.mutations.fence_admits_everything
        {
            // Verify on advance: ask the lock service before a newer token may land, and hold the
            // resource until the answer is in.
            self.resource.verifying = true;
            self.send(Event::VerifyArrives(c, grant, value));
            return;
        }
        self.decide_write(c, grant, value, None);
    }

    pub(super) fn decide_write(
        &mut self,
        c: usize,
        grant: Grant,
        value: u64,
        verified: Option<bool>,
    ) {
        let admitted =
            if !self.strategy.resource_checks() || self.config.mutations.fence_admits_everything {
                true
            } else if verified == Some(false) {
                false
            } else {
                match rule::admit(
                    LOCK,
                    self.resource.record.as_ref(),
                    &self.policy,
                    &Self::presented(grant),
                    self.now_us / 1_000,
                ) {
                    Ok((_, record)) => {
                        self.resource.record = Some(record);
                        true
                    }
                    Err(_) => false,
                }
            };
        let behind = grant.id < self.newest_at_resource;
        let highest = self.resource.record.as_ref().map_or(0, |record| record.highest_token);
        if admitted {
            self.stats.writes_admitted += 1;
            if behind {
                self.stats.stale_admitted += 1;
            }
            if grant.id < self.newest_grant {
                self.stats.superseded_admitted += 1;
            }
            self.newest_at_resource = self.newest_at_resource.max(grant.id);
            self.resource.value = value;
            let label = if behind {
                "  <- STALE WRITE ADMITTED"
            } else if grant.id < self.newest_grant {
                "  <- superseded grant, admitted"
            } else {
                ""
            };
            self.note(format!(
                "resource ACCEPTS client{c}'s write{} (counter = {value}){label}",
                token_text(grant.token)
            ));
        } else {
            if behind {
                self.stats.stale_refused += 1;
            } else if grant.id >= self.newest_grant {
                self.stats.newest_grant_refused += 1;
            } else {
                self.stats.stale_refused += 1;
            }
            let why = if verified == Some(false) {
                "the lock service says it is not the current grant".to_owned()
            } else {
                format!("highest seen is {highest}")
            };
            self.note(format!(
                "resource REFUSES client{c}'s write{}: {why}",
                token_text(grant.token)
            ));
        }
        self.send(Event::WriteReply(c, admitted));
    }
}
