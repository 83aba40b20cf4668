//! Whose turn it is on the lab. A test that needs the whole lab (the chart's first look, a
//! rolling reboot, a policy over every node, peers that must all answer) has it alone. A test
//! that changes one VM and looks only at it takes a turn on that VM's lane, and the other
//! lane's tests run beside it: the lab's time is mostly a guest's boot or a pod's start under
//! software emulation, and two VMs use both cores.
//!
//! Two lanes, so that no two tests ever disrupt both coordinator replicas (the eviction
//! webhook's failure policy is Fail, and a reboot's drain cannot wait for a PodDisruptionBudget
//! past its deadline): the lab's chart keeps the coordinators off the first VM (its lane of
//! one), and the other lane, the coordinators' nodes, runs one test at a time.
//!
//! Tests for one lane wait for each other; a test for the whole lab waits until no lane test
//! runs or waits (lane tests go first, as a queue drains before a barrier). Each test needs its
//! own test thread to wait in: `tests/run` gives the lab's tests one each.

use std::{
    io::Write,
    sync::{Mutex, OnceLock},
    time::Instant,
};

use tokio::sync::Notify;

/// The lanes: the first VM's, and the coordinators' nodes'.
const LANES: usize = 2;

/// What a test needs of the lab.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Turn {
    Whole,
    /// The lane of the VM at this index among the lab's.
    Lane(usize),
}

impl Turn {
    /// The turn on the lane of the VM at `index`.
    pub fn beside(index: usize) -> Self {
        Self::Lane(index.min(LANES - 1))
    }

    /// The indexes of the lab's VMs (of `count`) this turn may change.
    pub fn vms(self, count: usize) -> std::ops::Range<usize> {
        match self {
            Self::Whole => 0..count,
            Self::Lane(0) => 0..count.min(1),
            Self::Lane(_) => count.min(1)..count,
        }
    }

    /// How many coordinator replicas must be Ready before a test with this turn starts: both
    /// where it may disrupt one (the other answers the eviction webhook), one on the first
    /// VM's lane (no coordinator runs there).
    pub fn coordinators_ready(self) -> i32 {
        match self {
            Self::Lane(0) => 1,
            _ => 2,
        }
    }

    /// The value of the test label on the objects a test with this turn creates: the reset of a
    /// lane deletes its own and leaves the other lane's.
    pub fn label(self) -> &'static str {
        match self {
            Self::Whole => "true",
            Self::Lane(0) => "lane-0",
            Self::Lane(_) => "lane-1",
        }
    }
}

#[derive(Default)]
struct Taken {
    whole: bool,
    lanes: [bool; LANES],
    lane_tests_waiting: usize,
}

impl Taken {
    fn free(&self, turn: Turn) -> bool {
        match turn {
            Turn::Whole => {
                !self.whole && !self.lanes.contains(&true) && self.lane_tests_waiting == 0
            }
            Turn::Lane(lane) => !self.whole && !self.lanes[lane],
        }
    }

    fn set(&mut self, turn: Turn, taken: bool) {
        match turn {
            Turn::Whole => self.whole = taken,
            Turn::Lane(lane) => self.lanes[lane] = taken,
        }
    }
}

static TAKEN: Mutex<Taken> = Mutex::new(Taken {
    whole: false,
    lanes: [false; LANES],
    lane_tests_waiting: 0,
});
static RELEASED: Notify = Notify::const_new();

fn taken() -> std::sync::MutexGuard<'static, Taken> {
    TAKEN.lock().unwrap_or_else(|p| p.into_inner())
}

/// A test's turn, given back when it is dropped (also when the test panics).
pub struct Held {
    turn: Turn,
    since: Instant,
}

impl Drop for Held {
    fn drop(&mut self) {
        taken().set(self.turn, false);
        RELEASED.notify_waiters();
        let held = self.since.elapsed().as_secs();
        say(format_args!("gives back {:?} after {held} s", self.turn));
    }
}

/// A line on the run's log as it happens (the test harness shows a test's own output only once
/// it ends, and a run that runs out of time never shows it): where the lab's time goes.
fn say(what: std::fmt::Arguments) {
    static START: OnceLock<Instant> = OnceLock::new();
    let at = START.get_or_init(Instant::now).elapsed().as_secs();
    let thread = std::thread::current();
    let test = thread.name().unwrap_or("?");
    // Not captured: written to the process's stderr, not through the harness's capture.
    let _ = writeln!(std::io::stderr().lock(), "lab turn [{at} s]: {test} {what}");
}

/// Waits for `turn` (each test runs on a runtime of its own: the lock is the runtime's-agnostic
/// kind).
pub async fn take(turn: Turn) -> Held {
    say(format_args!("waits for {turn:?}"));
    if turn != Turn::Whole {
        taken().lane_tests_waiting += 1;
    }
    loop {
        let released = RELEASED.notified();
        tokio::pin!(released);
        released.as_mut().enable();
        {
            let mut taken = taken();
            if taken.free(turn) {
                taken.set(turn, true);
                if turn != Turn::Whole {
                    taken.lane_tests_waiting -= 1;
                }
                drop(taken);
                say(format_args!("takes {turn:?}"));
                return Held {
                    turn,
                    since: Instant::now(),
                };
            }
        }
        released.await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lane_is_one_test_at_a_time_and_the_whole_lab_waits_for_every_lane_test() {
        let mut taken = Taken::default();
        taken.set(Turn::Lane(0), true);
        assert!(taken.free(Turn::Lane(1)));
        assert!(!taken.free(Turn::Lane(0)));
        assert!(!taken.free(Turn::Whole));
        taken.set(Turn::Lane(0), false);
        taken.lane_tests_waiting = 1;
        assert!(!taken.free(Turn::Whole), "a lane test waiting goes first");
        taken.lane_tests_waiting = 0;
        taken.set(Turn::Whole, true);
        assert!(!taken.free(Turn::Lane(1)));
    }

    #[test]
    fn the_first_vm_is_a_lane_of_its_own_and_the_rest_share_the_other() {
        assert_eq!(Turn::beside(0).vms(3), 0..1);
        assert_eq!(Turn::beside(2), Turn::Lane(1));
        assert_eq!(Turn::beside(1).vms(3), 1..3);
        assert_eq!(Turn::Whole.vms(3), 0..3);
    }
}
