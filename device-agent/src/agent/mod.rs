//! The device agent daemon: holds a WebSocket link to the hub and forwards the spool's
//! files over it, deleting each only once the hub acknowledged it.
//!
//! One loop ([`Daemon::run_loop`]) selects over every source and turns it into an
//! [`Event`]; [`Daemon::handle`] is the one place state changes (rust-analyzer's
//! `main_loop.rs` shape). The sources:
//! - the current link's reader and writer tasks ([`link`]): hub frames, and why the link
//!   died;
//! - the dial in progress, and the reconnect timer;
//! - the spool watcher ([`cortex_host::spool::SpoolWatcher`]), polled at all times: its inotify
//!   instance is also the remote file and flock waits' (one instance per agent), whose
//!   events it routes; a file it announces while the forwarding queue is full only makes
//!   the forwarder list the spool again once there is room;
//! - a tick for retries, the ack timeout, the debounced status and the systemd watchdog,
//!   armed only while one of them has work (an idle agent has no timer but the keepalive);
//! - shutdown (SIGTERM/SIGINT in `main`).
//!
//! The agent is useful offline: it reports READY to systemd once the spool is watched, not
//! once the hub answers, and files simply wait on disk while the hub is away.
//!
//! Link rules: a dial (TCP, TLS, upgrade) is bounded by `connect_timeout`, the welcome by
//! `welcome_timeout`; failures back off with full jitter from 1 s doubling to a 60 s cap
//! ([`backoff`]); a refused token or a protocol mismatch waits near the cap; a
//! `retry_after_ms` from the hub is a floor.
//!
//! Several hubs (`Config::hubs`): one link at a time. A failed dial or a lost link moves
//! to the next URL in order, wrapping, and dials it at once; the backoff (and its cap and
//! floor) applies once per round of as many failures as there are URLs ([`rotation`]); a
//! link that lived `lived_after` starts a new round when it ends (its hub worked, so a
//! rolling restart or a hub's death costs no wait), and a round that ended on a hub whose
//! store is away (`store_unavailable`) waits at most `busy_cap`. A
//! hub that refuses the token counts as a failure like any other (the next hub may know
//! the device, e.g. a standby with a newer store); the wait is near the cap only when
//! every hub of the round needed an operator. With one URL this is the rule above.
//!
//! A refused token (or the device revoked) makes the agent read its token file again
//! (`Config::token_file`): a new token there is dialed at once, to the hub that refused
//! the old one, whatever the backoff or the hub's floor (they were about the old one); the
//! same one is said plainly (enrol again, write the new token there, no restart needed),
//! and the file is read again each [`TOKEN_POLL`] until it changes. A token from the environment cannot change: the agent
//! says to restart it. The token itself is never logged. The backoff resets on the first ack of a link,
//! or once a link stayed up for `stable_after` (an idle device gets no acks).
//!
//! Remote waits ([`waits`]): the hub's `WaitArm`, `WaitCancel` and `WaitAck` arms in
//! [`Daemon::on_hub`], one more source (each armed wait's task reports its outcome as
//! [`Event::WaitDone`]), and the held ids in every hello. Their state is saved on the
//! tick when it changed, and restored (every wait armed again) before the first dial.
//!
//! Exec ([`exec`], only with `--allow-exec`, which adds `exec` to the hello's
//! capabilities): the hub's `Exec` arm in [`Daemon::on_hub`] starts the command (or
//! answers for the run already started under that id), and SIGCHLD is one more source,
//! on which the loop reaps the children that exited. A pid wait that fires asks the
//! runs first, so one of ours is reaped then and its exit code joins the payload.

pub mod backoff;
pub mod config;
pub mod exec;
pub mod forward;
pub mod host;
pub mod link;
pub mod notify;
pub mod rotation;
pub mod tls;
pub mod waits;

#[cfg(test)]
mod tests;

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use cortex_protocol::mesh::{
    self, AgentFrame, CloseReason, Frame, Hello, HostFacts, HubFrame, MESH_VERSION,
};
use tokio::sync::mpsc;
use tokio::time::Instant;

use backoff::Backoff;
use cortex_host::spool::{Spool, SpoolError, SpoolEvent, SpoolWatcher};
use forward::{Forwarder, Outbox};
use link::{ConnectError, Connected, Dialer, Down, Link, LinkMsg, LinkMsgKind, Outgoing};
use notify::SystemdNotifier;
use rotation::{Rotation, Step};
use waits::{RemoteWaits, WaitsStore};

/// Where a frame for the hub goes (the link's outbox); false when it cannot take one now.
pub trait FrameSink {
    fn try_send(&mut self, frame: Vec<u8>) -> bool;
}

/// The wall clock in ms since the epoch (0 before it).
pub(crate) fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

pub use config::{Config, ConfigError, HubUrl, HubUrls, Timing, Token, TokenSource};

/// What every agent can do, as the hello says; one run with `--allow-exec` adds
/// [`mesh::CAP_EXEC`].
pub const CAPABILITIES: &[&str] = &[
    "spool",
    mesh::CAP_WAIT_PID,
    mesh::CAP_WAIT_FILE,
    mesh::CAP_WAIT_FLOCK,
    mesh::CAP_WAIT_LOG,
    mesh::CAP_WAIT_SILENCE,
    mesh::CAP_WAIT_ANY,
    mesh::CAP_WAIT_PID_MUST_EXIST,
];

/// How often the token file is read again while the hub refuses the token.
pub const TOKEN_POLL: Duration = Duration::from_secs(1);

/// Outcomes of remote waits waiting for the loop; a task whose outcome finds it full
/// waits its turn.
const WAIT_EVENTS: usize = 1024;

/// The hub's link messages waiting for the loop; the window bounds what a hub sends.
const LINK_EVENTS: usize = 1024;

/// Why the agent could not start. Once running, nothing is fatal: the link reconnects and
/// the spool watcher retries.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error(transparent)]
    Spool(#[from] SpoolError),
    #[error(transparent)]
    Tls(#[from] tls::TlsError),
}

/// Everything the loop reacts to.
#[derive(Debug)]
pub enum Event {
    /// A frame from the hub on the current link.
    Hub(HubFrame),
    Spool(Result<SpoolEvent, SpoolError>),
    /// The dial in progress finished.
    Dialed(Result<Box<Connected>, ConnectError>),
    /// The reconnect delay passed.
    Redial,
    Tick,
    /// The current link died.
    LinkDown(Down),
    /// A remote wait's task ended (fired, timed out, broke).
    WaitDone(waits::Finished),
    /// SIGCHLD: a child (an exec's command) may have exited.
    Child,
    Shutdown,
}

/// Run the agent until `shutdown` completes: then close the link with a close frame and
/// return. Files not yet acknowledged stay in the spool.
pub async fn run(config: Config, shutdown: impl Future<Output = ()>) -> Result<(), AgentError> {
    tls::install_provider();
    let tls = if config.hubs.any_tls() {
        Some(tls::client_config(config.ca_cert.as_deref())?)
    } else {
        None
    };
    let spool = Arc::new(Spool::open(&config.spool_dir())?);
    // One collector per spool: refused, naming the holder, when the hub or another agent
    // on this home collects it.
    spool.claim(&cortex_host::spool::Collector::new(
        "cortex-device-agent",
        Some(&config.name),
    ))?;
    // Watch first, then list: the watcher's first event is the listing.
    let mut watcher = SpoolWatcher::new(spool.clone(), Some(config.timing.rescan))?;
    let mut notifier = SystemdNotifier::from_env();
    notifier.ready();
    notifier.status(&format!("connecting to {}", config.hubs.get(0)));
    // Children are reaped on SIGCHLD; without the stream (it cannot fail on Linux short
    // of running out of descriptors) they are reaped on each tick instead.
    let sigchld = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::child()) {
        Ok(s) => Some(s),
        Err(e) => {
            tracing::warn!(error = %e, "cannot watch SIGCHLD; exec's commands are reaped on the tick");
            None
        }
    };
    let exec_home = std::path::absolute(&config.home).unwrap_or_else(|_| config.home.clone());
    let execs = exec::Execs::new(
        config.exec_policy(),
        exec::ExecStore::under(&exec_home),
        std::env::var_os("HOME")
            .map(std::path::PathBuf::from)
            .filter(|h| h.is_dir())
            .unwrap_or_else(|| exec_home.clone()),
        config.exec_launcher.clone(),
    );
    if !config.allow_exec && !config.exec_allow.is_empty() {
        tracing::warn!("--exec-allow has no effect without --allow-exec: exec is off");
    }
    if config.allow_exec {
        if config.exec_allow.is_empty() {
            tracing::warn!(
                "--allow-exec: the hub's agents may start any command on this device as this user"
            );
        } else {
            tracing::info!(allow = ?config.exec_allow, "--allow-exec: the hub's agents may start these programs");
        }
    }
    let host = host::gather().await;
    tracing::info!(
        hostname = %host.hostname,
        kernel = %host.kernel,
        cpus = host.cpus,
        gpus = ?host.gpus,
        "host facts"
    );
    let dialer = Arc::new(Dialer::new(
        config.name.clone(),
        config.token.clone(),
        tls,
        config.timing.connect_timeout,
        config.timing.welcome_timeout,
    ));
    let (link_tx, link_rx) = mpsc::channel(LINK_EVENTS);
    let (wait_tx, wait_rx) = mpsc::channel(WAIT_EVENTS);
    let fd_limit = waits::raise_fd_limit();
    tracing::debug!(?fd_limit, "open-file limit");
    // The spool's inotify instance serves every file and flock wait too.
    let mut remote = RemoteWaits::new(watcher.waits(), WaitsStore::under(&config.home), wait_tx);
    remote.restore();
    let now = Instant::now();
    let daemon = Daemon {
        backoff: Backoff::new(
            config.timing.backoff_base,
            config.timing.backoff_cap,
            backoff::random_seed(),
        ),
        forward: Forwarder::new(spool.clone(), config.timing.retry_delay),
        spool,
        notifier,
        dialer,
        host,
        rotation: Rotation::new(config.hubs.len()),
        link: LinkState::Waiting { at: now },
        generation: 0,
        link_tx,
        link_rx,
        remote,
        wait_rx,
        execs,
        sigchld,
        frame_at: now,
        link_line: format!("connecting to {}", config.hubs.get(0)),
        counts: None,
        counts_sent: None,
        last_counts_at: None,
        last_watchdog: now,
        last_tick: now,
        refused: false,
        config,
    };
    daemon.run_loop(watcher, shutdown).await;
    Ok(())
}

type Dialing = Pin<Box<dyn Future<Output = Result<Connected, ConnectError>> + Send>>;

enum LinkState {
    /// No link; dial at `at`.
    Waiting {
        at: Instant,
    },
    Dialing(Dialing),
    Up {
        link: Link,
        since: Instant,
        /// The backoff was reset for this link (first ack, or up long enough).
        stable: bool,
    },
}

struct Daemon {
    config: Config,
    spool: Arc<Spool>,
    forward: Forwarder,
    notifier: SystemdNotifier,
    dialer: Arc<Dialer>,
    host: HostFacts,
    backoff: Backoff,
    /// Which of `config.hubs` the link dials, and when a round of them ends.
    rotation: Rotation,
    link: LinkState,
    /// Increments per link, so messages of a replaced link are recognised.
    generation: u64,
    link_tx: mpsc::Sender<LinkMsg>,
    link_rx: mpsc::Receiver<LinkMsg>,
    remote: RemoteWaits,
    wait_rx: mpsc::Receiver<waits::Finished>,
    execs: exec::Execs,
    sigchld: Option<tokio::signal::unix::Signal>,
    /// When the hub frame being handled was read off the socket.
    frame_at: Instant,
    /// The link part of the systemd status line.
    link_line: String,
    counts: Option<cortex_host::spool::SpoolTally>,
    /// What the hub was last told (hello or status frame) on the current link.
    counts_sent: Option<mesh::SpoolCounts>,
    last_counts_at: Option<Instant>,
    last_watchdog: Instant,
    last_tick: Instant,
    /// The hub refused the token (or revoked the device) and no link came up since: the
    /// token file is read again each [`TOKEN_POLL`].
    refused: bool,
}

/// Whether the loop goes on.
#[derive(Debug, PartialEq, Eq)]
enum Flow {
    Continue,
    Stop,
}

impl Daemon {
    async fn run_loop(mut self, mut watcher: SpoolWatcher, shutdown: impl Future<Output = ()>) {
        let mut shutdown = std::pin::pin!(shutdown);
        loop {
            // No timer while idle: only the keepalive wakes an agent with nothing to do.
            let next_tick = self.next_tick();
            // Unbiased: under a steady stream of acks the tick (which feeds the watchdog)
            // and the spool must still get their turns.
            let ev = tokio::select! {
                () = &mut shutdown => Event::Shutdown,
                Some(msg) = self.link_rx.recv() => {
                    if !self.is_current(msg.generation) {
                        continue;
                    }
                    match msg.kind {
                        LinkMsgKind::Frame(f) => {
                            self.frame_at = msg.at;
                            Event::Hub(f)
                        }
                        LinkMsgKind::Down(d) => Event::LinkDown(d),
                    }
                }
                ev = link_timer(&mut self.link) => ev,
                // Always: remote file waits' events come through it too.
                ev = watcher.next() => Event::Spool(ev),
                Some(done) = self.wait_rx.recv() => Event::WaitDone(done),
                Some(()) = sigchld(&mut self.sigchld) => Event::Child,
                () = sleep_until(next_tick) => Event::Tick,
            };
            if self.handle(ev) == Flow::Stop {
                break;
            }
            if self.remote.has_unlogged() {
                // The link's writer runs first and sends the outcomes' frames; then the
                // log lines, off the path of the hub's record. Between them the thread
                // yields its CPU: the frame woke the hub, and the scheduler often queues
                // the hub's thread on this CPU, behind us (measured: the hub had the frame
                // ~40 us sooner in 4 of 5 interleaved pairs). With nothing queued here
                // the yield returns at once.
                tokio::task::yield_now().await;
                std::thread::yield_now();
                self.remote.log_ended();
            }
        }
        self.remote.log_ended();
        self.remote.persist();
        self.stop().await;
    }

    /// The one place state changes.
    fn handle(&mut self, ev: Event) -> Flow {
        let now = Instant::now();
        match ev {
            Event::Shutdown => return Flow::Stop,
            Event::Hub(frame) => self.on_hub(frame, now),
            Event::LinkDown(down) => self.link_lost(down, now),
            Event::Dialed(Ok(connected)) => self.link_up(*connected, now),
            Event::Dialed(Err(e)) => self.dial_failed(e, now),
            Event::Redial => self.dial(),
            Event::Spool(Ok(SpoolEvent::File(name))) => self.forward.file(name),
            Event::Spool(Ok(SpoolEvent::Rescan(why))) => {
                tracing::debug!(reason = %why, "spool rescan");
                self.forward.rescan();
            }
            Event::Spool(Err(e @ SpoolError::LockLost { .. })) => {
                // Remote waits go on; the spool's files are another collector's now.
                tracing::error!(error = %e, "the device agent stopped forwarding its spool");
                self.forward.stop();
            }
            Event::Spool(Err(e)) => {
                // The watcher retries by itself, with its own backoff.
                tracing::error!(error = %e, "the spool watch failed; retrying");
            }
            Event::WaitDone(done) => {
                let execs = &mut self.execs;
                self.remote
                    .finished(done, |pid, start| execs.exit_of(pid, start));
            }
            Event::Child => self.execs.reap(),
            Event::Tick => self.on_tick(now),
        }
        if let LinkState::Up { link, .. } = &self.link {
            if link.params.hub_waits {
                self.remote.pump(&mut LinkOutbox(link.outbox()));
            }
            self.execs.pump(&mut LinkOutbox(link.outbox()));
            let mut out = LinkOutbox(link.outbox());
            self.forward.pump(&mut out, now);
        }
        Flow::Continue
    }

    fn on_hub(&mut self, frame: HubFrame, now: Instant) {
        match frame {
            HubFrame::Ack { name, outcome } => {
                if self.forward.ack(&name, outcome, now)
                    && let LinkState::Up { stable, .. } = &mut self.link
                    && !*stable
                {
                    // The hub's first ack: the link is proven, not just connected.
                    *stable = true;
                    self.backoff.reset();
                    self.rotation.new_round();
                }
            }
            HubFrame::Rescan => self.forward.rescan(),
            HubFrame::Welcome { .. } => {
                tracing::warn!("the hub sent a second welcome on one link; ignored");
            }
            HubFrame::WaitArm {
                wait_id,
                spec,
                timeout_ms,
                ..
            } => self
                .remote
                .arm(wait_id, &spec, Duration::from_millis(timeout_ms)),
            HubFrame::WaitCancel { wait_id } => self.remote.cancel(&wait_id),
            HubFrame::WaitAck { wait_id } => self.remote.ack(&wait_id),
            HubFrame::Exec(req) => {
                let waited = now.saturating_duration_since(self.frame_at);
                self.execs.start(req, waited);
            }
        }
    }

    fn dial(&mut self) {
        let counts = self.read_counts();
        self.counts_sent = counts.map(to_wire);
        let hello = Hello {
            version: MESH_VERSION,
            device: self.config.name.clone(),
            agent_version: env!("CARGO_PKG_VERSION").to_owned(),
            host: self.host.clone(),
            capabilities: self.capabilities(),
            spool: self.counts_sent.unwrap_or_default(),
            waits: self.remote.ids(),
        };
        let hub = self.hub().clone();
        tracing::debug!(hub = %hub, "dialing the hub");
        self.link = LinkState::Dialing(Box::pin(self.dialer.clone().dial(hub, hello)));
    }

    /// The hub the next dial goes to, or the current link is to.
    fn hub(&self) -> &HubUrl {
        self.config.hubs.get(self.rotation.current())
    }

    /// After a failed dial or a lost link: moves on to the next hub and returns how long to
    /// wait before dialing it (nothing within a round; at a round's end the backoff, near
    /// its cap when every hub of the round `needs_operator`, and at least `retry_after`).
    /// `busy`: the failure that ends a round was a hub saying its store is away for now,
    /// so the wait is at most `busy_cap`.
    fn after_failure(
        &mut self,
        needs_operator: bool,
        busy: bool,
        retry_after: Option<Duration>,
    ) -> Duration {
        match self.rotation.failed(needs_operator) {
            Step::Now => Duration::ZERO,
            Step::Backoff { at_cap } => {
                let delay = if at_cap {
                    self.backoff.fail_at_cap()
                } else if busy {
                    self.backoff.fail_within(self.config.timing.busy_cap)
                } else {
                    self.backoff.fail()
                };
                delay.max(retry_after.unwrap_or_default())
            }
        }
    }

    /// Says which hub is next, when there are several (one hub: nothing to say).
    fn log_next(&self, delay: Duration) {
        if self.config.hubs.len() > 1 {
            tracing::info!(hub = %self.hub(), delay = %secs(delay), "trying the next hub");
        }
    }

    /// The hello's capabilities: [`CAPABILITIES`], and `exec` with `--allow-exec`.
    fn capabilities(&self) -> Vec<String> {
        let mut caps: Vec<String> = CAPABILITIES.iter().map(|c| (*c).to_owned()).collect();
        if self.config.allow_exec {
            caps.push(mesh::CAP_EXEC.to_owned());
        }
        caps
    }

    fn dial_failed(&mut self, e: ConnectError, now: Instant) {
        let hub = self.hub().clone();
        if matches!(e, ConnectError::Unauthorized { .. }) {
            self.refused = true;
            if self.reload_token(now) {
                return;
            }
        }
        let delay = self.after_failure(e.needs_operator(), e.hub_busy(), e.retry_after());
        if matches!(e, ConnectError::Unauthorized { .. }) {
            let todo = self.refused_todo();
            tracing::error!(hub = %hub, device = %self.config.name, error = %e, retry_in = %secs(delay), "cannot join the hub: {todo}");
        } else if e.needs_operator() {
            tracing::error!(hub = %hub, device = %self.config.name, error = %e, retry_in = %secs(delay), "cannot join the hub");
        } else {
            tracing::warn!(hub = %hub, error = %e, retry_in = %secs(delay), failures = self.backoff.failures(), "cannot reach the hub");
        }
        self.log_next(delay);
        self.set_link_line(self.unreachable_line(&hub, &e, delay));
        self.link = LinkState::Waiting { at: now + delay };
    }

    /// The systemd status while no link is up: the hub, why, and what comes next.
    fn unreachable_line(
        &self,
        hub: &HubUrl,
        why: &dyn std::fmt::Display,
        delay: Duration,
    ) -> String {
        if self.config.hubs.len() > 1 {
            format!(
                "hub {hub} unreachable: {why}, trying {} in {}",
                self.hub(),
                secs(delay)
            )
        } else {
            format!("hub unreachable: {why}, retrying in {}", secs(delay))
        }
    }

    /// Reads the token file again; a token there other than the one refused is used from
    /// now on and dialed at once (true). Nothing to read, or the same token: false.
    fn reload_token(&mut self, now: Instant) -> bool {
        let Some(path) = self.config.token_file.clone() else {
            return false;
        };
        let token = match config::read_token_file(&path) {
            Ok(t) => t,
            Err(e) => {
                tracing::debug!(error = %e, "the token file cannot be read again");
                return false;
            }
        };
        if token.same_as(&self.dialer.token()) {
            return false;
        }
        self.dialer.set_token(token);
        tracing::info!(file = %path.display(), "the token file holds a new token; dialing the hub with it");
        self.set_link_line(format!("dialing {} with the new token", self.hub()));
        self.backoff.reset();
        self.rotation.new_round();
        self.link = LinkState::Waiting { at: now };
        true
    }

    /// What a person does about a refused token, for the log (never the token).
    fn refused_todo(&self) -> String {
        let name = &self.config.name;
        match &self.config.token_file {
            Some(path) => format!(
                "{} still holds the token the hub refuses; on the hub enrol the device again (`cortex device add {name}`, after `cortex device revoke {name}` if it is still enrolled) and write the new token to {}: this agent reads that file again each second and uses a new token without a restart",
                path.display(),
                path.display()
            ),
            None => format!(
                "the token came from CORTEX_DEVICE_TOKEN, which a running agent cannot read again; enrol the device again on the hub (`cortex device add {name}`) and restart this agent with the new token (better in a file: --token-file)"
            ),
        }
    }

    fn link_up(&mut self, connected: Connected, now: Instant) {
        self.refused = false;
        self.generation += 1;
        let params = connected.params;
        let link = Link::start(connected, self.generation, self.link_tx.clone());
        self.forward
            .link_up(params.window, params.max_message_bytes);
        self.remote.link_up();
        self.execs.link_changed();
        tracing::info!(
            hub = %self.hub(),
            ping = ?params.ping_interval,
            window = params.window,
            "connected to the hub"
        );
        self.set_link_line(format!("connected to {}", self.hub()));
        self.link = LinkState::Up {
            link,
            since: now,
            stable: false,
        };
    }

    fn link_lost(&mut self, down: Down, now: Instant) {
        let old = std::mem::replace(&mut self.link, LinkState::Waiting { at: now });
        if let LinkState::Up { link, since, .. } = old {
            tokio::spawn(link.close_for(&down));
            // Its hub worked until now: the next one is dialed at once.
            if now.saturating_duration_since(since) >= self.config.timing.lived_after {
                self.rotation.new_round();
            }
        }
        let unacked = self.forward.unacked();
        self.forward.link_down();
        self.remote.link_down();
        self.execs.link_changed();
        let revoked = matches!(&down, Down::Closed(info)
            if info.reason.as_ref().is_some_and(|r| r.code == "revoked"));
        if revoked {
            self.refused = true;
            if self.reload_token(now) {
                return;
            }
        }
        let hub = self.hub().clone();
        let delay = self.after_failure(false, false, down.retry_after());
        if revoked {
            let todo = self.refused_todo();
            tracing::error!(hub = %hub, reason = %down, unacked, retry_in = %secs(delay), "this device was revoked on the hub: {todo}");
        } else {
            tracing::warn!(hub = %hub, reason = %down, unacked, retry_in = %secs(delay), "lost the link to the hub; unacknowledged files stay in the spool");
        }
        self.log_next(delay);
        self.set_link_line(self.unreachable_line(&hub, &down, delay));
        self.link = LinkState::Waiting { at: now + delay };
    }

    fn on_tick(&mut self, now: Instant) {
        self.last_tick = now;
        if self.refused && matches!(self.link, LinkState::Waiting { .. }) {
            self.reload_token(now);
        }
        if self.sigchld.is_none() {
            self.execs.reap();
        }
        self.forward.tick(now);
        // Remote waits are saved here, at most once a tick, not on each change: a burst of
        // a thousand arms is one write, and no fsync sits between a process's exit and its
        // report. A crash in between loses nothing the hub wants (it re-sends what this
        // agent lacks, and an outcome lost is found again by re-arming).
        self.remote.persist();
        if let LinkState::Up { since, stable, .. } = &mut self.link
            && !*stable
            && now.saturating_duration_since(*since) >= self.config.timing.stable_after
        {
            *stable = true;
            self.backoff.reset();
            self.rotation.new_round();
        }
        if matches!(self.link, LinkState::Up { .. })
            && let Some(age) = self.forward.oldest_unacked(now)
            && age >= self.config.timing.ack_timeout
        {
            self.link_lost(Down::AckTimeout(age), now);
        }
        self.report_counts(now);
        if let Some(every) = self.notifier.watchdog_every()
            && now.saturating_duration_since(self.last_watchdog) >= every
        {
            self.notifier.watchdog();
            self.last_watchdog = now;
        }
    }

    /// Status frame and systemd STATUS, when the counts changed, at most once per
    /// `status_every`.
    fn report_counts(&mut self, now: Instant) {
        if self
            .last_counts_at
            .is_some_and(|t| now.saturating_duration_since(t) < self.config.timing.status_every)
        {
            return;
        }
        if !self.forward.take_dirty() && self.counts.is_some() {
            return;
        }
        self.last_counts_at = Some(now);
        self.read_counts();
        self.update_status();
        let Some(counts) = self.counts.map(to_wire) else {
            return;
        };
        if let LinkState::Up { link, .. } = &self.link
            && self.counts_sent != Some(counts)
        {
            match (AgentFrame::Status { spool: counts }).encode() {
                Ok(bytes) => {
                    if link.outbox().try_send(Outgoing::Frame(bytes)).is_ok() {
                        self.counts_sent = Some(counts);
                    } else {
                        // The writer is busy: try again on a later tick.
                        self.forward.mark_dirty();
                    }
                }
                Err(e) => tracing::error!(error = %e, "cannot encode a status frame"),
            }
        }
    }

    fn read_counts(&mut self) -> Option<cortex_host::spool::SpoolTally> {
        match self.spool.counts() {
            Ok(c) => self.counts = Some(c),
            Err(e) => tracing::warn!(error = %e, "cannot count the spool"),
        }
        self.counts
    }

    fn set_link_line(&mut self, line: String) {
        self.link_line = line;
        self.update_status();
    }

    fn update_status(&mut self) {
        let line = match self.counts {
            Some(c) => notify::status_line(&self.link_line, c.pending, c.bad),
            None => self.link_line.clone(),
        };
        self.notifier.status(&line);
    }

    fn is_current(&self, generation: u64) -> bool {
        matches!(&self.link, LinkState::Up { link, .. } if link.generation == generation)
    }

    /// When the next tick is due, or `None` when nothing needs one. Anchored to the last
    /// tick, not to now, so a steady stream of events cannot keep pushing it away.
    fn next_tick(&self) -> Option<Instant> {
        let mut next: Option<Instant> = None;
        let mut at = |t: Instant| next = Some(next.map_or(t, |n: Instant| n.min(t)));
        let reap_on_tick = self.sigchld.is_none() && self.execs.running() > 0;
        if self.forward.busy() || self.remote.dirty() || reap_on_tick {
            at(self.last_tick + self.tick_every());
        }
        if let LinkState::Up {
            since,
            stable: false,
            ..
        } = &self.link
        {
            at(*since + self.config.timing.stable_after);
        }
        if let Some(every) = self.notifier.watchdog_every() {
            at(self.last_watchdog + every);
        }
        if self.refused
            && self.config.token_file.is_some()
            && matches!(self.link, LinkState::Waiting { .. })
        {
            at(self.last_tick + TOKEN_POLL);
        }
        next
    }

    /// Tick often enough for the status debounce and the watchdog, and at least each second
    /// for retries and the ack timeout.
    fn tick_every(&self) -> Duration {
        let mut every = Duration::from_secs(1).min(self.config.timing.status_every);
        if let Some(w) = self.notifier.watchdog_every() {
            every = every.min(w);
        }
        every.max(Duration::from_millis(10))
    }

    async fn stop(mut self) {
        self.notifier.stopping();
        let unacked = self.forward.unacked();
        let old = std::mem::replace(&mut self.link, LinkState::Waiting { at: Instant::now() });
        if let LinkState::Up { link, .. } = old {
            link.close(CloseReason {
                code: "shutting_down".into(),
                message: "the device agent is stopping".into(),
                retry_after_ms: None,
            })
            .await;
        }
        tracing::info!(
            unacked,
            "stopped; files not yet acknowledged stay in the spool and are sent after the next start"
        );
    }
}

/// The next SIGCHLD; never without the stream.
async fn sigchld(s: &mut Option<tokio::signal::unix::Signal>) -> Option<()> {
    match s {
        Some(s) => s.recv().await,
        None => std::future::pending().await,
    }
}

/// The end of the dial in progress, or the reconnect time; never while a link is up.
/// Sleeps until `at`, or forever when there is nothing to wake for.
async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

async fn link_timer(link: &mut LinkState) -> Event {
    match link {
        LinkState::Dialing(f) => Event::Dialed(f.await.map(Box::new)),
        LinkState::Waiting { at } => {
            tokio::time::sleep_until(*at).await;
            Event::Redial
        }
        LinkState::Up { .. } => std::future::pending().await,
    }
}

struct LinkOutbox<'a>(&'a mpsc::Sender<Outgoing>);

impl FrameSink for LinkOutbox<'_> {
    fn try_send(&mut self, frame: Vec<u8>) -> bool {
        self.0.try_send(Outgoing::Frame(frame)).is_ok()
    }
}

impl Outbox for LinkOutbox<'_> {
    fn has_room(&self) -> bool {
        self.0.capacity() > 0
    }

    fn send(&mut self, frame: Vec<u8>) -> bool {
        self.0.try_send(Outgoing::Frame(frame)).is_ok()
    }
}

/// A delay for people: `0.5s`, `42.0s`.
fn secs(d: Duration) -> String {
    format!("{:.1}s", d.as_secs_f64())
}

fn to_wire(c: cortex_host::spool::SpoolTally) -> mesh::SpoolCounts {
    mesh::SpoolCounts {
        pending: u32::try_from(c.pending).unwrap_or(u32::MAX),
        bad: u32::try_from(c.bad).unwrap_or(u32::MAX),
    }
}
