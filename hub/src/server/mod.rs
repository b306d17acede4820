//! The hub's server: `run(config, listener, shutdown)` starts everything `main` and the
//! tests need — the HTTP listener (signal route and API), the timer that delivers decided
//! wakes, the sweep, the local spool intake and, with [`run_with_mesh`], the device
//! mesh — and stops it all cleanly.

pub mod api;
pub mod devices;
pub mod error;
pub mod log;
pub mod signal;
pub(crate) mod spool;

use std::future::Future;
use std::ops::Deref;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use axum::Router;
use axum::routing::{get, post};
use tokio::sync::watch;

use crate::config::HubSettings;
use crate::store::Store;
use crate::store::ops::PASS_LIMIT;
use crate::time::now_ms;

/// What `run` needs.
#[derive(Debug, Clone)]
pub struct Config {
    pub home: PathBuf,
    pub settings: HubSettings,
    pub token: String,
}

/// A shutdown flag every task can wait on.
#[derive(Clone)]
pub struct Shutdown(watch::Sender<bool>);

impl Shutdown {
    fn new() -> Self {
        Shutdown(watch::channel(false).0)
    }

    pub fn cancel(&self) {
        self.0.send_replace(true);
    }

    pub async fn cancelled(&self) {
        let mut rx = self.0.subscribe();
        let _ = rx.wait_for(|v| *v).await;
    }
}

pub struct Inner {
    pub store: Store,
    pub token_hash: [u8; 32],
    pub misses: signal::MissBudget,
    /// The signal route's URL, for `how_to_signal`.
    pub signal_url: String,
    pub shutdown: Shutdown,
    /// Devices allowed to connect and their live links.
    pub devices: crate::mesh::Registry,
    /// The mesh's URL for agents (`None` with `--mesh-listen off`).
    pub mesh_url: Option<String>,
}

#[derive(Clone)]
pub struct AppState(Arc<Inner>);

impl Deref for AppState {
    type Target = Inner;
    fn deref(&self) -> &Inner {
        &self.0
    }
}

pub fn router(state: AppState) -> Router {
    let api = Router::new()
        .route(
            "/sessions",
            post(api::create_session).get(api::list_sessions),
        )
        .route(
            "/sessions/{sid}",
            get(api::get_session).delete(api::delete_session),
        )
        .route("/sessions/{sid}/messages", post(api::post_message))
        .route("/sessions/{sid}/events", get(api::events))
        .route(
            "/sessions/{sid}/waitpoints",
            post(api::create_waitpoint).get(api::session_waitpoints),
        )
        .route(
            "/waitpoints/{id}",
            get(api::get_waitpoint).delete(api::cancel_waitpoint),
        )
        .route(
            "/devices",
            post(devices::create_device).get(devices::list_devices),
        )
        .route(
            "/devices/{name}",
            get(devices::get_device).delete(devices::revoke_device),
        )
        .route("/devices/{name}/waits", post(devices::create_wait))
        .route("/events", get(devices::hub_events))
        .route_layer(axum::middleware::from_fn_with_state(
            state.clone(),
            api::auth,
        ));
    Router::new()
        .route(
            "/healthz",
            get(|| async { axum::Json(serde_json::json!({"ok": true})) }),
        )
        .route("/webhook/signal", post(signal::route))
        .nest("/api", api)
        .fallback(api::not_found)
        .with_state(state)
}

/// Runs the hub on `listener` until `shutdown` resolves, then stops accepting, finishes
/// what is in flight, lets the store commit what it holds, and returns. No device mesh:
/// see [`run_with_mesh`].
pub async fn run(
    config: Config,
    listener: tokio::net::TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    run_with_mesh(config, listener, None, shutdown).await
}

/// [`run`], plus the device mesh on `mesh` when given.
pub async fn run_with_mesh(
    config: Config,
    listener: tokio::net::TcpListener,
    mesh: Option<crate::mesh::Bound>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let hub_dir = config.home.join("hub");
    create_private_dir(&hub_dir)?;
    let spool_dir = config.home.join("tmp").join("signals");
    let spool = cortex_host::spool::Spool::open(&spool_dir)
        .with_context(|| format!("opening the local spool {}", spool_dir.display()))?;
    let db_path = hub_dir.join("hub.redb");
    let (store, writer) = Store::open(&db_path, config.settings.engine.clone())
        .with_context(|| format!("opening the store {}", db_path.display()))?;
    let addr = listener
        .local_addr()
        .context("reading the listener's address")?;
    let state = AppState(Arc::new(Inner {
        store,
        token_hash: crate::secret::hash(&config.token),
        misses: signal::MissBudget::default(),
        signal_url: format!("http://{addr}/webhook/signal"),
        shutdown: Shutdown::new(),
        devices: crate::mesh::Registry::default(),
        mesh_url: mesh.as_ref().map(|m| m.url.clone()),
    }));
    crate::mesh::start(&state).await?;

    // What fell due while the hub was down is delivered first, once.
    fire_due(&state).await;
    if config.settings.sweep_ms > 0 {
        sweep_once(&state).await;
    }
    let mut tasks = tokio::task::JoinSet::new();
    tasks.spawn(timer_task(state.clone()));
    tasks.spawn(device_wait_task(state.clone()));
    if config.settings.sweep_ms > 0 {
        tasks.spawn(sweep_task(
            state.clone(),
            Duration::from_millis(config.settings.sweep_ms),
        ));
    }
    let rescan =
        (config.settings.sweep_ms > 0).then(|| Duration::from_millis(config.settings.sweep_ms));
    tasks.spawn(spool::intake(state.clone(), Arc::new(spool), rescan));
    if let Some(bound) = mesh {
        tasks.spawn(crate::mesh::serve(state.clone(), bound));
        if config.settings.sweep_ms > 0 {
            tasks.spawn(crate::mesh::sweep(
                state.clone(),
                Duration::from_millis(config.settings.sweep_ms),
            ));
        }
    }

    let app = router(state.clone());
    let stop = state.shutdown.clone();
    let serve = axum::serve(listener, app).with_graceful_shutdown(async move {
        tokio::select! {
            () = shutdown => {}
            () = stop.cancelled() => {}
        }
        stop.cancel();
    });
    let served = serve.await.context("serving HTTP");
    state.shutdown.cancel();
    while tasks.join_next().await.is_some() {}
    drop(state);
    // Every handle is gone: the writer commits what it holds and ends.
    tokio::task::spawn_blocking(move || writer.join())
        .await
        .ok();
    served
}

fn create_private_dir(dir: &std::path::Path) -> anyhow::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .with_context(|| format!("creating {}", dir.display()))
}

/// Runs a store pass (due wakes, the sweep, overdue remote waits) again while it takes a
/// full page, so a backlog is cleared in bounded transactions. A failing store is logged;
/// the pass runs again at its next timer or tick.
async fn drain<C>(state: &AppState, what: &str, mut pass: impl FnMut() -> C)
where
    C: for<'a> FnOnce(&mut crate::store::Tx<'a>) -> Result<usize, crate::store::StoreError>
        + Send
        + 'static,
{
    loop {
        let pass = pass();
        // A pass that found nothing due changed nothing, and waits for no commit.
        match state
            .store
            .exec_if(move |t| pass(t).map(|n| (n, n > 0)))
            .await
        {
            Ok(n) if n >= PASS_LIMIT => continue,
            Ok(_) => return,
            Err(e) => {
                tracing::error!(error = %e, "{what} failed; it runs again shortly");
                return;
            }
        }
    }
}

async fn fire_due(state: &AppState) {
    drain(state, "delivering due wakes", || {
        |t| t.fire_timers(now_ms())
    })
    .await;
}

async fn sweep_once(state: &AppState) {
    drain(state, "the sweep", || |t| t.sweep(now_ms())).await;
}

/// Sleeps until the time `next` holds (the store updates it after each commit), runs
/// `fire`, and sleeps again. No polling; a store that keeps failing is retried every
/// 200 ms, not in a spin.
async fn timer_loop(
    state: &AppState,
    mut next: watch::Receiver<Option<u64>>,
    fire: impl AsyncFn(&AppState),
) {
    loop {
        let due = *next.borrow_and_update();
        let now = now_ms();
        match due {
            Some(t) if t <= now => {
                fire(state).await;
                if next.borrow().is_some_and(|t| t <= now_ms()) {
                    tokio::select! {
                        () = tokio::time::sleep(Duration::from_millis(200)) => {}
                        () = state.shutdown.cancelled() => return,
                    }
                }
            }
            Some(t) => {
                tokio::select! {
                    () = tokio::time::sleep(Duration::from_millis(t - now)) => {}
                    r = next.changed() => if r.is_err() { return },
                    () = state.shutdown.cancelled() => return,
                }
            }
            None => {
                tokio::select! {
                    r = next.changed() => if r.is_err() { return },
                    () = state.shutdown.cancelled() => return,
                }
            }
        }
    }
}

/// Delivers decided wakes (a barrier's 3 s, the hourly cap) when they fall due.
async fn timer_task(state: AppState) {
    let next = state.store.next_timer.clone();
    timer_loop(&state, next, async |s: &AppState| fire_due(s).await).await;
}

/// After a start, devices get this long to reconnect before the device-wait timer judges
/// the waits that fell due while the hub was down: an agent's reconnect backoff tops out
/// at 60 s, and its own outcome (kept until acknowledged) is better than the hub's guess.
const DEVICE_WAIT_RESTART_GRACE: Duration = Duration::from_secs(60);

async fn device_waits_due(state: &AppState) {
    drain(state, "ending overdue remote waits", || {
        let online: std::collections::HashSet<String> = state
            .devices
            .links()
            .iter()
            .map(|l| l.device.clone())
            .collect();
        move |t| t.device_waits_due(now_ms(), &online)
    })
    .await;
}

/// Sleeps until the earliest remote wait's hub deadline (its bound plus a grace for the
/// agent's own report) and ends what is due: `timed_out` on an online device, `broke` on
/// an offline one. Like the wake timer, it wakes on the store's watch, never polls.
async fn device_wait_task(state: AppState) {
    let next = state.store.next_device_wait.clone();
    // Waits that fell due while the hub was down are judged only once their devices had
    // the time to reconnect and report; waits created after the start are not held back.
    if next.borrow().is_some_and(|t| t <= now_ms()) {
        tokio::select! {
            () = tokio::time::sleep(DEVICE_WAIT_RESTART_GRACE) => {}
            () = state.shutdown.cancelled() => return,
        }
    }
    timer_loop(&state, next, async |s: &AppState| device_waits_due(s).await).await;
}

async fn sweep_task(state: AppState, every: Duration) {
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => sweep_once(&state).await,
            () = state.shutdown.cancelled() => return,
        }
    }
}
