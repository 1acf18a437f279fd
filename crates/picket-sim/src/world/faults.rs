//! The scenario's faults: partitions, resource restarts, clock steps, and the authority's tick.

use super::{Event, TICK_US, World};
use crate::config::Scenario;

impl World {
    pub(super) fn schedule_faults(&mut self) {
        match self.config.scenario {
            Scenario::Partition => {
                let at = self.rng.exp_us(8_000_000.0);
                self.schedule(at, Event::PartitionStart);
            }
            Scenario::Clock => {
                let at = self.rng.exp_us(5_000_000.0);
                self.schedule(at, Event::ClockStep);
            }
            Scenario::Restart => {
                let restart = self.rng.exp_us(10_000_000.0);
                let failover = self.rng.exp_us(15_000_000.0);
                self.schedule(restart, Event::ResourceRestart);
                self.schedule(failover, Event::Failover);
            }
            Scenario::Canonical | Scenario::Recreate => {}
        }
    }

    pub(super) fn tick(&mut self) {
        let heard: Vec<bool> = (0..self.clients.len())
            .map(|c| !self.is_paused(c) && !self.clients[c].partitioned)
            .collect();
        let grants = self.authority.tick(self.now_us, &heard);
        for granted in grants {
            self.deliver(granted);
        }
        self.maybe_recreate();
        self.schedule(TICK_US, Event::Tick);
    }

    pub(super) fn maybe_recreate(&mut self) {
        if self.config.scenario == Scenario::Recreate && self.rng.chance(0.3) {
            self.authority.recreate_if_idle();
        }
    }

    pub(super) fn partition(&mut self) {
        let c = usize::try_from(self.rng.range(0, self.clients.len() as u64)).unwrap_or(0);
        if !self.clients[c].partitioned {
            self.clients[c].partitioned = true;
            let length = self.rng.exp_us(3_000_000.0);
            #[allow(clippy::cast_precision_loss)]
            let seconds = length as f64 / 1e6;
            self.note(format!("client{c} is cut off from the lock service for {seconds:.3}s"));
            self.schedule(length, Event::PartitionEnd(c));
        }
        let next = self.rng.exp_us(8_000_000.0);
        self.schedule(next, Event::PartitionStart);
    }

    pub(super) fn restart_resource(&mut self) {
        if !self.resource.durable {
            self.resource.record = None;
        }
        self.note(format!(
            "the resource restarts ({})",
            if self.resource.durable { "highest token on disk" } else { "highest token forgotten" }
        ));
        let next = self.rng.exp_us(10_000_000.0);
        self.schedule(next, Event::ResourceRestart);
    }

    pub(super) fn clock_step(&mut self) {
        let c = usize::try_from(self.rng.range(0, self.clients.len() as u64)).unwrap_or(0);
        let step = i64::try_from(self.rng.exp_us(1_000_000.0)).unwrap_or(0);
        let step = if self.rng.chance(0.5) { step } else { -step };
        self.clients[c].clock_offset_us += step;
        let node_step = i64::try_from(self.rng.exp_us(1_500_000.0) / 1_000).unwrap_or(0);
        let node = self.rng.next_u64();
        self.authority.step_node_clock(node, node_step);
        self.note(format!(
            "client{c}'s clock steps by {step} µs; a lock node's wall clock jumps {node_step} ms"
        ));
        let next = self.rng.exp_us(5_000_000.0);
        self.schedule(next, Event::ClockStep);
    }
}
