//! Watching a running firn once a second: its memory and CPU from `/proc`,
//! its counters from `/metrics`.

use std::{
    collections::HashMap,
    io::{Read, Write},
    net::{SocketAddr, TcpStream},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicU64, Ordering},
        mpsc,
    },
    thread::{self, JoinHandle},
    time::{Duration, Instant},
};

/// firn's counters that the soak reports, summed over their labels.
#[derive(Clone, Copy, Debug, Default)]
pub struct Counters {
    pub samples: f64,
    pub lost: f64,
    pub written: f64,
    pub sent: f64,
    pub dropped: f64,
    pub dropped_pipeline: f64,
    pub dropped_queue: f64,
    pub queue_bytes: f64,
    pub push_failures: f64,
    pub processes: f64,
    pub objects: f64,
    pub debug_found: f64,
    pub events_lost: f64,
}

/// One `/metrics` answer: every series (`name{labels}`) with its value.
#[derive(Clone, Debug, Default)]
pub struct Scrape {
    series: HashMap<String, f64>,
}

impl Scrape {
    pub fn parse(text: &str) -> Self {
        let mut series: HashMap<String, f64> = HashMap::new();
        for line in text.lines().filter(|line| !line.starts_with('#')) {
            let Some((name, value)) = line.rsplit_once(' ') else {
                continue;
            };
            let Ok(value) = value.parse::<f64>() else {
                continue;
            };
            *series.entry(name.to_owned()).or_default() += value;
        }
        Self { series }
    }

    /// The series of `family` (e.g. `firn_samples_total`) by their label
    /// sets (`stage="sample"`; empty for an unlabelled series).
    pub fn family(&self, family: &str) -> impl Iterator<Item = (&str, f64)> {
        self.series.iter().filter_map(move |(name, &value)| {
            let labels = match name.strip_prefix(family)? {
                "" => "",
                rest => rest.strip_prefix('{')?.strip_suffix('}')?,
            };
            Some((labels, value))
        })
    }

    /// Whether firn exposed `family` at all.
    pub fn has(&self, family: &str) -> bool {
        self.family(family).next().is_some()
    }

    /// `family` summed over its labels.
    pub fn sum(&self, family: &str) -> f64 {
        self.family(family).map(|(_, value)| value).sum()
    }

    /// One series, `name{labels}` exactly as exposed; 0 when absent.
    pub fn one(&self, series: &str) -> f64 {
        self.series.get(series).copied().unwrap_or(0.0)
    }
}

impl Counters {
    #[cfg(test)]
    fn parse(text: &str) -> Self {
        Self::from_scrape(&Scrape::parse(text))
    }

    pub fn from_scrape(scrape: &Scrape) -> Self {
        let sum = |name: &str| scrape.sum(name);
        let one = |series: &str| scrape.one(series);
        Self {
            samples: sum("firn_samples_total"),
            lost: sum("firn_samples_lost_total"),
            written: sum("firn_profiles_written_total"),
            sent: sum("firn_profiles_sent_total"),
            dropped: sum("firn_profiles_dropped_total"),
            dropped_pipeline: one("firn_profiles_dropped_total{reason=\"pipeline\"}"),
            dropped_queue: one("firn_profiles_dropped_total{reason=\"queue\"}"),
            queue_bytes: sum("firn_queue_bytes"),
            push_failures: sum("firn_push_failures_total"),
            processes: sum("firn_processes_tracked"),
            objects: sum("firn_objects_tracked"),
            debug_found: one("firn_debug_files_total{result=\"found\"}"),
            events_lost: sum("firn_process_events_lost_total"),
        }
    }
}

/// One look at firn.
#[derive(Clone, Debug, Default)]
pub struct Point {
    /// Seconds since the monitor started.
    pub at: f64,
    pub phase: usize,
    pub rss_kb: u64,
    pub hwm_kb: u64,
    pub anon_kb: u64,
    pub file_kb: u64,
    pub cpu_seconds: f64,
    /// Whether this look asked `/metrics`.
    pub scraping: bool,
    /// None when `/metrics` was not asked or did not answer within 2 s.
    pub counters: Option<Counters>,
    /// Every series of that answer.
    pub scrape: Option<Arc<Scrape>>,
}

/// Longest one look at firn may take (the `/metrics` scrape alone may
/// take 3 s).
const LOOK_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Default)]
struct Shared {
    points: Mutex<Vec<Point>>,
    phases: Mutex<Vec<String>>,
    stop: AtomicBool,
    unanswered: AtomicU64,
}

pub struct Monitor {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
    pub started: Instant,
}

/// What the monitor saw, phase by phase.
pub struct Series {
    pub points: Vec<Point>,
    pub phases: Vec<String>,
    /// Seconds from the start to the end of watching.
    pub end: f64,
    /// Looks at /proc that took longer than 5 s.
    pub unanswered: u64,
}

impl Monitor {
    /// Looks once a second, `/metrics` included.
    pub fn start(pid: u32, metrics: SocketAddr) -> Self {
        Self::start_scraping_every(pid, metrics, 1)
    }

    /// Looks at `/proc` once a second and at `/metrics` every
    /// `scrape_every` looks, the first included: each scrape costs firn
    /// CPU (~0.3 ms), which a once-a-second scrape adds to every figure.
    pub fn start_scraping_every(pid: u32, metrics: SocketAddr, scrape_every: u32) -> Self {
        let scrape_every = scrape_every.max(1);
        let shared = Arc::new(Shared::default());
        let started = Instant::now();
        let thread = {
            let shared = shared.clone();
            thread::spawn(move || {
                let mut next = Instant::now();
                // A look at /proc can block (a process whose memory map is
                // locked): each runs on a thread of its own, and the
                // monitor counts the ticks it did not answer in time.
                let mut pending: Option<mpsc::Receiver<Option<Point>>> = None;
                let mut tick: u32 = 0;
                while !shared.stop.load(Ordering::Relaxed) {
                    let scraping = tick.is_multiple_of(scrape_every);
                    tick = tick.wrapping_add(1);
                    let receiver = pending.take().unwrap_or_else(|| {
                        let (sender, receiver) = mpsc::channel();
                        thread::spawn(move || {
                            let _ = sender.send(look(pid, scraping.then_some(metrics)));
                        });
                        receiver
                    });
                    match receiver.recv_timeout(LOOK_TIMEOUT) {
                        Ok(Some(mut point)) => {
                            point.at = started.elapsed().as_secs_f64();
                            point.phase = lock(&shared.phases).len().saturating_sub(1);
                            lock(&shared.points).push(point);
                        }
                        Ok(None) | Err(mpsc::RecvTimeoutError::Disconnected) => break,
                        Err(mpsc::RecvTimeoutError::Timeout) => {
                            shared.unanswered.fetch_add(1, Ordering::Relaxed);
                            pending = Some(receiver);
                        }
                    }
                    next += Duration::from_secs(1);
                    thread::sleep(next.saturating_duration_since(Instant::now()));
                }
            })
        };
        Self {
            shared,
            thread: Some(thread),
            started,
        }
    }

    /// Starts the next phase: the following points belong to it.
    pub fn phase(&self, name: &str) {
        eprintln!("soak:   phase {name}");
        lock(&self.shared.phases).push(name.to_owned());
    }

    /// The newest counters that were read.
    pub fn latest(&self) -> Option<Counters> {
        lock(&self.shared.points)
            .iter()
            .rev()
            .find_map(|point| point.counters)
    }

    pub fn finish(mut self) -> Series {
        self.shared.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        Series {
            points: std::mem::take(&mut *lock(&self.shared.points)),
            phases: std::mem::take(&mut *lock(&self.shared.phases)),
            end: self.started.elapsed().as_secs_f64(),
            unanswered: self.shared.unanswered.load(Ordering::Relaxed),
        }
    }
}

impl Drop for Monitor {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn look(pid: u32, metrics: Option<SocketAddr>) -> Option<Point> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rollup = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).unwrap_or_default();
    let field = |text: &str, name: &str| -> u64 {
        text.lines()
            .find_map(|line| line.strip_prefix(name)?.strip_prefix(':'))
            .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
            .unwrap_or(0)
    };
    // utime and stime are fields 14 and 15, counted after the `(comm)`.
    let after_comm = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let fields: Vec<&str> = after_comm.split_whitespace().collect();
    let ticks = |index: usize| -> f64 {
        fields
            .get(index)
            .and_then(|value| value.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    let ticks_seconds = (ticks(11) + ticks(12)) / hz;
    let rss_kb = field(&status, "VmRSS");
    let anon_kb = field(&rollup, "Anonymous");
    let scrape = metrics
        .and_then(scrape)
        .map(|text| Arc::new(Scrape::parse(&text)));
    Some(Point {
        rss_kb,
        hwm_kb: field(&status, "VmHWM"),
        anon_kb,
        file_kb: field(&rollup, "Rss").saturating_sub(anon_kb),
        cpu_seconds: process_cpu_seconds(pid).unwrap_or(ticks_seconds),
        scraping: metrics.is_some(),
        counters: scrape.as_deref().map(Counters::from_scrape),
        scrape,
        ..Point::default()
    })
}

/// A GET over plain HTTP/1.1 with short deadlines: the body on a 200.
/// The process's CPU time (user and system, every thread, exited ones
/// included) to the nanosecond, from its CPU-time clock. `/proc/PID/stat`
/// counts in ticks of 10 ms: over a 30 s steady window at 100 Hz that is
/// 1.7 µs a sample.
fn process_cpu_seconds(pid: u32) -> Option<f64> {
    let mut clock: libc::clockid_t = 0;
    // SAFETY: `clock` is a valid place for the id.
    if unsafe { libc::clock_getcpuclockid(pid as libc::pid_t, &mut clock) } != 0 {
        return None;
    }
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `now` is a valid place for the time.
    if unsafe { libc::clock_gettime(clock, &mut now) } != 0 {
        return None;
    }
    Some(now.tv_sec as f64 + now.tv_nsec as f64 * 1e-9)
}

pub fn get(address: SocketAddr, path: &str) -> Option<(u16, String)> {
    let mut stream = TcpStream::connect_timeout(&address, Duration::from_secs(1)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    stream
        .set_write_timeout(Some(Duration::from_secs(2)))
        .ok()?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    let status = response.split(' ').nth(1)?.parse().ok()?;
    let body = response.split_once("\r\n\r\n")?.1.to_owned();
    Some((status, body))
}

fn scrape(address: SocketAddr) -> Option<String> {
    match get(address, "/metrics")? {
        (200, body) => Some(body),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_sum_over_labels() {
        let text = "# TYPE firn_samples_lost counter\n\
                    firn_samples_lost_total{reason=\"ring_buffer_full\"} 3\n\
                    firn_samples_lost_total{reason=\"scratch_unavailable\"} 4\n\
                    firn_samples_total 100\n\
                    firn_profiles_dropped_total{reason=\"queue\"} 2\n\
                    firn_profiles_dropped_total{reason=\"pipeline\"} 1\n\
                    firn_queue_bytes 4096\n";
        let counters = Counters::parse(text);
        assert_eq!(counters.samples, 100.0);
        assert_eq!(counters.lost, 7.0);
        assert_eq!(counters.dropped, 3.0);
        assert_eq!(counters.dropped_queue, 2.0);
        assert_eq!(counters.dropped_pipeline, 1.0);
        assert_eq!(counters.queue_bytes, 4096.0);
    }

    #[test]
    fn scrape_reads_families_by_labels() {
        let scrape = Scrape::parse(
            "firn_cpu_seconds_total{stage=\"sample\"} 1.5\n\
             firn_cpu_seconds_total{stage=\"push\"} 0.25\n\
             firn_cpu_seconds_total_other 9\n\
             firn_samples_total 7\n\
             # EOF\n",
        );
        let mut stages: Vec<(&str, f64)> = scrape.family("firn_cpu_seconds_total").collect();
        stages.sort_by(|a, b| a.0.cmp(b.0));
        assert_eq!(
            stages,
            [("stage=\"push\"", 0.25), ("stage=\"sample\"", 1.5)]
        );
        assert_eq!(scrape.sum("firn_samples_total"), 7.0);
        assert!(!scrape.has("firn_bpf_run_time_seconds_total"));
    }
}
