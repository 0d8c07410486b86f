//! The scenarios: each one firn, its faults, and what is watched.

use std::{
    fs,
    process::{Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context, Result};

use super::{
    Ctx, Scenario,
    fixtures::{Blackhole, Firn, Guard, Parca, Tmpfs, free_port},
    monitor::{Counters, Monitor},
    report::{Outcome, Resumed},
    workloads::{self, Plant},
};

/// Recovery phases last at least this long when delivery has not resumed
/// yet: firn's backoff reaches 10 s and a push to a server that never
/// answered times out after 30 s.
const MIN_RECOVERY: Duration = Duration::from_secs(75);

/// One firn under watch.
struct Run {
    firn: Option<Firn>,
    monitor: Monitor,
    outcome: Outcome,
}

impl Run {
    fn start(ctx: &Ctx, scenario: Scenario, args: &[String]) -> Result<Self> {
        let profile = ctx.profile_seconds();
        let mut all = vec!["--profiling-duration".to_owned(), format!("{profile}s")];
        all.extend_from_slice(args);
        let firn = Firn::start(&ctx.firn, &ctx.dir(scenario), &all)?;
        let monitor = Monitor::start(firn.pid(), firn.metrics);
        let mut outcome = Outcome::new(scenario, profile);
        outcome.notes.push(format!("firn {}", all.join(" ")));
        Ok(Self {
            firn: Some(firn),
            monitor,
            outcome,
        })
    }

    fn phase(&mut self, name: &str) {
        self.monitor.phase(name);
    }

    fn firn(&mut self) -> &mut Firn {
        self.firn.as_mut().expect("running until finish")
    }

    /// Lets the phase run for `length`, calling `watch` every half second;
    /// stops early if firn exits.
    fn hold_watching(&mut self, length: Duration, mut watch: impl FnMut(&Firn)) {
        let end = Instant::now() + length;
        while Instant::now() < end {
            if self.firn().exited() {
                self.outcome.notes.push(format!(
                    "firn EXITED on its own at {:.0} s",
                    self.monitor.started.elapsed().as_secs_f64()
                ));
                return;
            }
            watch(self.firn.as_ref().expect("running"));
            thread::sleep(Duration::from_millis(500));
        }
    }

    fn hold(&mut self, length: Duration) {
        self.hold_watching(length, |_| {});
    }

    /// The recovery phase: at least `length`, and until `counter` grows
    /// past its value now (delivery resumed), at most [`MIN_RECOVERY`] or
    /// `length` if longer.
    fn recover(&mut self, length: Duration, counter: fn(&Counters) -> f64, what: &str) {
        let began = Instant::now();
        let base = self.monitor.latest().map_or(0.0, |c| counter(&c));
        let deadline = length.max(MIN_RECOVERY);
        let mut resumed = None;
        while began.elapsed() < deadline {
            if self.firn().exited() {
                break;
            }
            if resumed.is_none()
                && self
                    .monitor
                    .latest()
                    .is_some_and(|counters| counter(&counters) > base)
            {
                resumed = Some(began.elapsed().as_secs_f64());
            }
            if resumed.is_some() && began.elapsed() >= length {
                break;
            }
            thread::sleep(Duration::from_millis(500));
        }
        self.outcome.resumed = Some(match resumed {
            Some(seconds) => Resumed::After(seconds, what.to_owned()),
            None => Resumed::No(began.elapsed().as_secs_f64(), what.to_owned()),
        });
    }

    fn finish(mut self) -> Outcome {
        let firn = self.firn.take().expect("running");
        self.outcome.log = firn.log.clone();
        self.outcome.exit = Some(firn.terminate());
        self.outcome.series = Some(self.monitor.finish());
        self.outcome
    }
}

fn remote(address: &str) -> Vec<String> {
    vec![
        "--remote-store-address".to_owned(),
        address.to_owned(),
        "--remote-store-insecure".to_owned(),
    ]
}

pub fn run(ctx: &Ctx, scenario: Scenario) -> Result<Outcome> {
    let dir = ctx.dir(scenario);
    if dir.exists() {
        fs::remove_dir_all(&dir)?;
    }
    fs::create_dir_all(&dir)?;
    match scenario {
        Scenario::Churn => churn(ctx),
        Scenario::ServerDown => server_fault(ctx, scenario),
        Scenario::ServerKill => server_fault(ctx, scenario),
        Scenario::Blackhole => blackhole(ctx),
        Scenario::StoreFull => store_full(ctx),
        Scenario::HostileFiles => hostile_files(ctx),
        Scenario::BigBinary => big_binary(ctx),
    }
}

fn sent(counters: &Counters) -> f64 {
    counters.sent
}

fn written(counters: &Counters) -> f64 {
    counters.written
}

fn churn(ctx: &Ctx) -> Result<Outcome> {
    const FAULT: f64 = 600.0;
    let dir = ctx.dir(Scenario::Churn);
    let churn = workloads::churn(&dir)?;
    let mut parca = Parca::new(&dir.join("parca"), free_port()?)?;
    parca.start()?;
    let _busy = workloads::busy(&ctx.chain)?;
    let mut run = Run::start(ctx, Scenario::Churn, &remote(&parca.address()))?;
    run.phase("warm");
    run.hold(ctx.phase(30.0, FAULT));
    run.phase("churn");
    run.outcome.fault_phase = 1;
    let length = ctx.phase(FAULT, FAULT);
    let output = dir.join("churn.out");
    let mut driver = Guard::spawn(
        Command::new(&churn)
            .arg(ctx.exec_rate.to_string())
            .arg(format!("{:.1}", length.as_secs_f64()))
            .arg("/bin/true")
            .stdout(fs::File::create(&output)?)
            .stderr(Stdio::null()),
    )?;
    run.hold(length);
    let (status, _) = driver.signal_and_wait(0, Duration::from_secs(30));
    let rate = fs::read_to_string(&output).unwrap_or_default();
    run.outcome.notes.push(match status {
        Some(_) => format!("exec churn achieved: {}", rate.trim()),
        None => "the churn driver did not finish in time".to_owned(),
    });
    run.phase("after");
    run.hold(ctx.phase(30.0, FAULT));
    Ok(run.finish())
}

/// server-down: SIGTERM, down for the fault phase, started again.
/// server-kill: SIGKILL, down briefly, started again.
fn server_fault(ctx: &Ctx, scenario: Scenario) -> Result<Outcome> {
    let kill = scenario == Scenario::ServerKill;
    let fault = if kill { 10.0 } else { 300.0 };
    // The kill's phases are scaled as if its fault were 5 minutes long.
    let base = 300.0;
    let dir = ctx.dir(scenario);
    let mut parca = Parca::new(&dir.join("parca"), free_port()?)?;
    parca.start()?;
    let _busy = workloads::busy(&ctx.chain)?;
    let mut run = Run::start(ctx, scenario, &remote(&parca.address()))?;
    run.phase("warm");
    run.hold(ctx.phase(60.0, base));
    if kill {
        parca.kill();
        run.phase("killed");
    } else {
        parca.stop();
        run.phase("down");
    }
    run.outcome.fault_phase = 1;
    run.hold(ctx.phase(fault, base).max(Duration::from_secs(5)));
    parca.start()?;
    run.phase("recover");
    run.recover(ctx.phase(120.0, base), sent, "profiles sent");
    Ok(run.finish())
}

fn blackhole(ctx: &Ctx) -> Result<Outcome> {
    const FAULT: f64 = 300.0;
    let dir = ctx.dir(Scenario::Blackhole);
    let port = free_port()?;
    let mut hole = Blackhole::start(port)?;
    let _busy = workloads::busy(&ctx.chain)?;
    let mut run = Run::start(
        ctx,
        Scenario::Blackhole,
        &remote(&format!("127.0.0.1:{port}")),
    )?;
    run.phase("blackhole");
    run.hold(ctx.phase(FAULT, FAULT));
    hole.stop();
    let mut parca = Parca::new(&dir.join("parca"), port)?;
    parca.start()?;
    run.phase("parca");
    run.recover(ctx.phase(120.0, FAULT), sent, "profiles sent");
    Ok(run.finish())
}

fn store_full(ctx: &Ctx) -> Result<Outcome> {
    const FAULT: f64 = 300.0;
    let dir = ctx.dir(Scenario::StoreFull);
    let store = Tmpfs::mount(&dir.join("store"), 1 << 20)?;
    let _busy = workloads::busy(&ctx.chain)?;
    let mut run = Run::start(
        ctx,
        Scenario::StoreFull,
        &[
            "--local-store-directory".to_owned(),
            store.dir.display().to_string(),
            "--local-store-max-bytes".to_owned(),
            "512KiB".to_owned(),
        ],
    )?;
    run.phase("warm");
    run.hold(ctx.phase(30.0, FAULT));
    store.fill("filler").context("could not fill the tmpfs")?;
    run.phase("full");
    run.outcome.fault_phase = 1;
    run.hold(ctx.phase(FAULT, FAULT));
    fs::remove_file(store.dir.join("filler"))?;
    run.phase("space");
    run.recover(ctx.phase(60.0, FAULT), written, "profiles written");
    let leftovers = fs::read_dir(&store.dir)?
        .filter_map(Result::ok)
        .filter(|entry| entry.file_name().to_string_lossy().ends_with(".tmp"))
        .count();
    run.outcome
        .notes
        .push(format!("temporary files left in the store: {leftovers}"));
    Ok(run.finish())
}

fn hostile_files(ctx: &Ctx) -> Result<Outcome> {
    const FAULT: f64 = 120.0;
    let dir = ctx.dir(Scenario::HostileFiles);
    let linked = workloads::container(&ctx.root, &dir, Plant::Symlink, 1)?;
    let fifo = workloads::container(&ctx.root, &dir, Plant::Fifo, 2)?;
    let _busy = workloads::busy(&ctx.chain)?;
    let mut run = Run::start(
        ctx,
        Scenario::HostileFiles,
        &[
            "--local-store-directory".to_owned(),
            dir.join("profiles").display().to_string(),
        ],
    )?;
    run.phase("warm");
    run.hold(ctx.phase(30.0, FAULT));

    run.phase("symlink");
    let before = run.monitor.latest().unwrap_or_default();
    let mut opened = Vec::new();
    {
        let _app = workloads::in_container(&linked.root, "/app")?;
        let _jit = workloads::in_container(&linked.root, "/jit")?;
        run.hold_watching(ctx.phase(FAULT, FAULT), |firn| {
            for path in firn.open_files() {
                if linked.host_targets.contains(&path) && !opened.contains(&path) {
                    opened.push(path);
                }
            }
        });
    }
    let after = run.monitor.latest().unwrap_or_default();
    run.outcome.notes.push(if opened.is_empty() {
        format!(
            "absolute symlinks in the container: no host file opened (debug files found +{})",
            after.debug_found - before.debug_found
        )
    } else {
        format!(
            "absolute symlinks in the container: firn OPENED HOST FILES {} (debug files found +{})",
            opened
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", "),
            after.debug_found - before.debug_found
        )
    });

    run.phase("fifo");
    run.outcome.fault_phase = 2;
    let _app = workloads::in_container(&fifo.root, "/app")?;
    let _jit = workloads::in_container(&fifo.root, "/jit")?;
    // Long enough to tell a stall (10 s without a sample) at any scale.
    run.hold(ctx.phase(FAULT, FAULT).max(Duration::from_secs(30)));
    Ok(run.finish())
}

fn big_binary(ctx: &Ctx) -> Result<Outcome> {
    const FAULT: f64 = 600.0;
    let dir = ctx.dir(Scenario::BigBinary);
    let binary = workloads::big_binary(&ctx.root, &ctx.cache)?;
    let size = fs::metadata(&binary)?.len();
    let _big = workloads::busy(&binary)?;
    // The server is down from the start: nothing listens on its port.
    let mut parca = Parca::new(&dir.join("parca"), free_port()?)?;
    let mut run = Run::start(ctx, Scenario::BigBinary, &remote(&parca.address()))?;
    run.outcome.notes.push(format!(
        "busy binary {} of {:.0} MB",
        binary.display(),
        size as f64 / 1e6
    ));
    run.outcome.targets = true;
    run.phase("warm");
    run.hold(ctx.phase(30.0, FAULT));
    run.phase("down");
    run.outcome.fault_phase = 1;
    run.hold(ctx.phase(FAULT, FAULT));
    parca.start()?;
    run.phase("recover");
    run.recover(ctx.phase(120.0, FAULT), sent, "profiles sent");
    Ok(run.finish())
}
