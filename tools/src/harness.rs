//! The drivers' run phase, shared by `shoal ycsb` and `shoal tpcc`: streams of operations on
//! worker threads (several per thread with `--tasks`), a warm-up then a measured interval, and
//! a supervisor that wakes once a second (and, if asked, more often to notice the end early).
//!
//! A driver implements [`Workload`] (what one stream does until the phase says stop) and
//! [`Supervisor`] (the baseline at the start of the measurement, each second's line and row,
//! an early stop); [`run`] does the rest and returns every stream's result with the measured
//! time. Where the run is (warm-up, measurement, stopped) the streams read from a [`RunState`].
//!
//! It must not know what the operations are: it runs streams and keeps time.

use std::sync::atomic::{AtomicU8, Ordering};
use std::time::{Duration, Instant};

const WARMUP: u8 = 0;
const MEASURE: u8 = 1;
const STOP: u8 = 2;

/// Where a run is: warm-up, measurement, or stopped. Streams read it before each operation
/// (Relaxed: a stop signal; results travel through the threads' joins).
pub struct RunState(AtomicU8);

impl RunState {
    fn new() -> RunState {
        RunState(AtomicU8::new(WARMUP))
    }

    pub fn warming_up(&self) -> bool {
        self.0.load(Ordering::Relaxed) == WARMUP
    }

    pub fn measuring(&self) -> bool {
        self.0.load(Ordering::Relaxed) == MEASURE
    }

    pub fn stopped(&self) -> bool {
        self.0.load(Ordering::Relaxed) == STOP
    }

    fn set(&self, p: u8) {
        assert!(
            p > self.0.load(Ordering::Relaxed),
            "a phase never goes back"
        );
        self.0.store(p, Ordering::Relaxed);
    }
}

/// Where one stream runs.
#[derive(Debug, Clone, Copy)]
pub struct Stream {
    /// The worker thread (numbered over every node of the run) and the engine it works on.
    pub thread: usize,
    pub engine: usize,
    /// The task on its thread (0 without `--tasks`).
    pub task: usize,
    /// Its number among all streams of the run (`thread * tasks + task`), and how many there
    /// are.
    pub index: usize,
    pub streams: usize,
}

/// What one stream does.
pub trait Workload: Sync {
    type Out: Send;
    /// Run stream `s` until `phase` says stop (or its own work is done).
    fn stream(&self, s: Stream, phase: &RunState) -> Self::Out;
}

/// What the run's supervisor does while the streams run.
pub trait Supervisor {
    /// The warm-up is over: the measurement starts now (take the counters' baseline).
    fn measuring(&mut self) {}
    /// A second ended at `tick` seconds after the start (`warm`: it began in the warm-up), or
    /// the run ended between two ticks (`whole` false).
    fn second(&mut self, tick: u64, warm: bool, whole: bool) -> anyhow::Result<()>;
    /// Stop the run now (a stream failed).
    fn failed(&self) -> bool {
        false
    }
}

/// How long a run lasts and when it ends early.
#[derive(Debug, Clone, Copy)]
pub struct Timing {
    pub warmup: Duration,
    pub duration: Duration,
    /// Also look this often (not only once a second) whether the run is over.
    pub poll: Option<Duration>,
    /// The run ends when every stream finished (each does a fixed share of work); otherwise a
    /// stream that finishes before the stop is an error, and the run ends at once.
    pub until_all_finished: bool,
}

/// What a run produced.
pub struct Ran<T> {
    /// Per worker thread, its streams' results in task order; `Err`: its tasks could not be
    /// started or it panicked.
    pub threads: Vec<Result<Vec<T>, String>>,
    /// The measured interval (from the end of the warm-up to the stop).
    pub measured: f64,
}

/// Run `w` on one worker thread per entry of `threads` (the index of the engine it works on),
/// `tasks` streams on each, for `timing`, with `sup` watching.
pub fn run<W: Workload, S: Supervisor>(
    threads: &[usize],
    tasks: usize,
    timing: Timing,
    w: &W,
    sup: &mut S,
) -> anyhow::Result<Ran<W::Out>> {
    assert!(tasks >= 1, "a thread runs at least one stream");
    let phase = RunState::new();
    if timing.warmup.is_zero() {
        // no warm-up: every operation counts, the first ones too
        sup.measuring();
        phase.set(MEASURE);
    }
    let streams = threads.len() * tasks;
    std::thread::scope(|s| {
        let hs: Vec<_> = threads
            .iter()
            .enumerate()
            .map(|(thread, &engine)| {
                let phase = &phase;
                let unit = move |task: usize| {
                    let st = Stream {
                        thread,
                        engine,
                        task,
                        index: thread * tasks + task,
                        streams,
                    };
                    w.stream(st, phase)
                };
                s.spawn(move || -> Result<Vec<W::Out>, String> {
                    if tasks == 1 {
                        return Ok(vec![unit(0)]);
                    }
                    let out: Vec<std::cell::RefCell<Option<W::Out>>> =
                        (0..tasks).map(|_| Default::default()).collect();
                    shoal_engine::tasks::run(tasks, |k| {
                        *out[k].borrow_mut() = Some(unit(k));
                    })
                    .map_err(|e| format!("tasks: cannot map a task's stack: {e}"))?;
                    Ok(out
                        .into_iter()
                        .map(|r| r.into_inner().expect("every task ran to its end"))
                        .collect())
                })
            })
            .collect();
        let finished = || {
            (
                hs.iter().any(|h| h.is_finished()),
                hs.iter().all(|h| h.is_finished()),
            )
        };
        let measured = supervise(&phase, timing, sup, finished);
        phase.set(STOP);
        let measured = measured.map(|m0| m0.elapsed().as_secs_f64());
        let threads = hs
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err("a worker thread panicked".into()))
            })
            .collect();
        Ok(Ran {
            threads,
            measured: measured?,
        })
    })
}

/// Wake once a second (and every `timing.poll`), end the warm-up, and return when the run is
/// over: the time is up, Ctrl-C, the supervisor says a stream failed, or the streams finished
/// (see [`Timing::until_all_finished`]). Returns when the measurement began.
fn supervise<S: Supervisor>(
    phase: &RunState,
    timing: Timing,
    sup: &mut S,
    finished: impl Fn() -> (bool, bool),
) -> anyhow::Result<Instant> {
    let start = Instant::now();
    let end = timing.warmup + timing.duration;
    let mut measure_start = start;
    let mut tick = 1u64;
    loop {
        let next = start + Duration::from_secs(tick);
        let stop_at = start + end;
        let mut wake = next.min(stop_at);
        if let Some(p) = timing.poll {
            wake = wake.min(Instant::now() + p);
        }
        // the phase of the second that ends at `wake`
        let was_warm = phase.warming_up();
        if phase.warming_up() && start + timing.warmup <= wake {
            if !crate::stop::sleep_until(start + timing.warmup) {
                break;
            }
            sup.measuring();
            measure_start = Instant::now();
            phase.set(MEASURE);
        }
        if !crate::stop::sleep_until(wake) {
            break; // Ctrl-C: report what was measured so far
        }
        if sup.failed() {
            break;
        }
        let (any, all) = finished();
        if timing.until_all_finished {
            if all {
                break; // every stream did its share (or failed)
            }
        } else if any {
            break; // a stream stopped early: an error; collected by the driver
        }
        if wake < next && wake < stop_at {
            continue; // a poll between ticks
        }
        sup.second(tick, was_warm, wake == next)?;
        if wake >= stop_at {
            break;
        }
        tick += 1;
    }
    Ok(measure_start)
}

/// Wait until `at` (sleeping, then spinning the last 100 us), or until the run stops.
pub fn wait_until(at: Instant, phase: &RunState) {
    loop {
        let now = Instant::now();
        if now >= at || phase.stopped() {
            return;
        }
        let left = at - now;
        if shoal_engine::tasks::yield_now() {
            continue; // a task: the thread's other tasks run meanwhile
        }
        if left > Duration::from_micros(200) {
            std::thread::sleep((left - Duration::from_micros(100)).min(Duration::from_millis(10)));
        } else {
            std::hint::spin_loop();
        }
    }
}
