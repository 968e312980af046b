//! Operating-system noise of a daemon, for the noise benchmark (`scripts/bench-noise.sh`):
//! its wake-ups and CPU time over a window ([`Sampler`]), and a selfish-detour loop pinned
//! to one CPU ([`detour`]) that measures how much of that CPU other work took.
//!
//! - Wake-ups: the sum over the process's threads of `voluntary_ctxt_switches`
//!   (`/proc/<pid>/task/<tid>/status`, proc(5)): each time a thread blocks of its own
//!   accord (a sleep, a poll, a futex) it must later be woken. Threads are sampled every
//!   100 ms, so one born and gone between two samples is not counted.
//! - CPU: `utime + stime` of the process (`/proc/<pid>/stat`, in clock ticks).
//! - Selfish detour (after Beckman et al., "The influence of operating systems on the
//!   performance of collective operations at extreme scale", 2006): a loop reads the
//!   monotonic clock as fast as it can; a gap between two reads longer than the threshold
//!   is time the CPU spent elsewhere (another task, an interrupt). The sum of the gaps per
//!   second is the noise on that CPU.

use std::collections::HashMap;
use std::fs;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

/// Figures of a process over a window.
#[derive(Debug, Clone, Default)]
pub struct Figures {
    /// Voluntary context switches of all its threads.
    pub wakeups: u64,
    /// CPU time, in seconds.
    pub cpu_secs: f64,
    /// The window, in seconds.
    pub secs: f64,
    /// Wake-ups per thread name (`comm`), most first.
    pub threads: Vec<(String, u64)>,
}

impl Figures {
    /// Wake-ups per minute.
    pub fn wakeups_per_min(&self) -> f64 {
        self.wakeups as f64 * 60.0 / self.secs
    }

    /// CPU time per minute, in milliseconds.
    pub fn cpu_ms_per_min(&self) -> f64 {
        self.cpu_secs * 1000.0 * 60.0 / self.secs
    }
}

/// Samples processes' threads every 100 ms over a window.
pub struct Sampler {
    pids: Vec<u32>,
}

fn clock_ticks() -> f64 {
    // sysconf(_SC_CLK_TCK) is 100 on every Linux architecture this runs on.
    100.0
}

fn cpu_ticks(pid: u32) -> Result<u64> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat"))
        .with_context(|| format!("/proc/{pid}/stat"))?;
    let after = &stat[stat.rfind(')').context("stat without a command")? + 2..];
    let f: Vec<&str> = after.split_whitespace().collect();
    // Fields 14 and 15 (utime, stime) are 11 and 12 after the command name.
    Ok(f[11].parse::<u64>()? + f[12].parse::<u64>()?)
}

fn thread_name(pid: u32, tid: u32) -> String {
    fs::read_to_string(format!("/proc/{pid}/task/{tid}/comm"))
        .map(|c| c.trim().to_string())
        .unwrap_or_else(|_| format!("thread {tid}"))
}

fn voluntary(pid: u32) -> HashMap<u32, u64> {
    let mut out = HashMap::new();
    let Ok(dir) = fs::read_dir(format!("/proc/{pid}/task")) else {
        return out;
    };
    for e in dir.flatten() {
        let Some(tid) = e.file_name().to_str().and_then(|t| t.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(status) = fs::read_to_string(e.path().join("status")) else {
            continue;
        };
        if let Some(v) = status
            .lines()
            .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))
            .and_then(|v| v.trim().parse().ok())
        {
            out.insert(tid, v);
        }
    }
    out
}

impl Sampler {
    /// A sampler of these processes.
    pub fn new(pids: &[u32]) -> Sampler {
        Sampler {
            pids: pids.to_vec(),
        }
    }

    /// Watches the processes for `window` and returns each one's figures, in order.
    ///
    /// # Errors
    /// A process that is gone.
    pub fn run(&self, window: Duration) -> Result<Vec<Figures>> {
        let start = Instant::now();
        let cpu0: Vec<u64> = self
            .pids
            .iter()
            .map(|&p| cpu_ticks(p))
            .collect::<Result<_>>()?;
        // Per process, per thread: the count when first seen (0 for a thread born in the
        // window) and the last count seen.
        let mut first: Vec<HashMap<u32, u64>> = self.pids.iter().map(|&p| voluntary(p)).collect();
        let mut last = first.clone();
        let mut names: Vec<HashMap<u32, String>> = vec![HashMap::new(); self.pids.len()];
        while start.elapsed() < window {
            std::thread::sleep(Duration::from_millis(100));
            for (i, &p) in self.pids.iter().enumerate() {
                for (tid, v) in voluntary(p) {
                    first[i].entry(tid).or_insert(0);
                    last[i].insert(tid, v);
                    names[i].entry(tid).or_insert_with(|| thread_name(p, tid));
                }
            }
        }
        let secs = start.elapsed().as_secs_f64();
        let mut out = Vec::new();
        for (i, &p) in self.pids.iter().enumerate() {
            let wakeups = last[i]
                .iter()
                .map(|(tid, v)| v.saturating_sub(first[i][tid]))
                .sum();
            let cpu = cpu_ticks(p)?.saturating_sub(cpu0[i]);
            let mut threads: HashMap<String, u64> = HashMap::new();
            for (tid, v) in &last[i] {
                let name = names[i]
                    .get(tid)
                    .cloned()
                    .unwrap_or_else(|| format!("thread {tid}"));
                *threads.entry(name).or_insert(0) += v.saturating_sub(first[i][tid]);
            }
            let mut threads: Vec<(String, u64)> = threads.into_iter().collect();
            threads.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
            out.push(Figures {
                wakeups,
                cpu_secs: cpu as f64 / clock_ticks(),
                secs,
                threads,
            });
        }
        Ok(out)
    }
}

/// Pins every thread of `pid` (those there now; threads they start inherit it) to `cpu`.
///
/// # Errors
/// The process is gone or the affinity is refused.
pub fn pin_process(pid: u32, cpu: usize) -> Result<()> {
    let mut set = rustix::thread::CpuSet::new();
    set.set(cpu);
    for e in fs::read_dir(format!("/proc/{pid}/task"))?.flatten() {
        let Some(tid) = e.file_name().to_str().and_then(|t| t.parse::<i32>().ok()) else {
            continue;
        };
        let tid = rustix::process::Pid::from_raw(tid).context("tid 0")?;
        // A thread that ended since the listing is no error.
        let _ = rustix::thread::sched_setaffinity(Some(tid), &set);
    }
    Ok(())
}

/// What the selfish-detour loop saw.
#[derive(Debug, Clone, Copy, Default)]
pub struct Detour {
    /// Gaps longer than the threshold.
    pub detours: u64,
    /// Their total length, in nanoseconds.
    pub lost_ns: u64,
    /// The loop's length, in seconds.
    pub secs: f64,
}

impl Detour {
    /// CPU time lost to other work, in microseconds per second.
    pub fn lost_us_per_sec(&self) -> f64 {
        self.lost_ns as f64 / 1000.0 / self.secs
    }

    /// Adds another run's counts.
    pub fn add(&mut self, o: Detour) {
        self.detours += o.detours;
        self.lost_ns += o.lost_ns;
        self.secs += o.secs;
    }
}

/// The gap between two clock reads that counts as a detour: a read takes tens of
/// nanoseconds, a context switch several microseconds.
pub const DETOUR_THRESHOLD: Duration = Duration::from_micros(2);

/// Runs the selfish-detour loop on a thread pinned to `cpu` for `secs`.
///
/// # Errors
/// The affinity is refused, or the thread panicked.
pub fn detour(cpu: usize, secs: Duration) -> Result<Detour> {
    std::thread::spawn(move || -> Result<Detour> {
        let mut set = rustix::thread::CpuSet::new();
        set.set(cpu);
        rustix::thread::sched_setaffinity(None, &set).context("sched_setaffinity")?;
        let threshold = DETOUR_THRESHOLD.as_nanos() as u64;
        let start = Instant::now();
        let mut last = start;
        let mut d = Detour::default();
        loop {
            let now = Instant::now();
            let gap = now.duration_since(last).as_nanos() as u64;
            if gap > threshold {
                d.detours += 1;
                d.lost_ns += gap;
            }
            last = now;
            if now.duration_since(start) >= secs {
                d.secs = now.duration_since(start).as_secs_f64();
                return Ok(d);
            }
        }
    })
    .join()
    .map_err(|_| anyhow::anyhow!("the detour thread panicked"))?
}
