//! The hub's server: `run(config, listener, shutdown)` starts everything `main` and the
//! tests need — the HTTP listener (signal route and API), the timer that delivers decided
//! wakes, the sweep, the local spool intake, the outgoing notices and, with [`run_with_mesh`], the device
//! mesh — and stops it all cleanly.

pub mod api;
mod cluster;
pub mod consumers;
pub mod devices;
pub mod error;
pub mod hosts;
pub mod http;
pub mod log;
pub mod mcp_tokens;
pub mod metrics;
mod notices;
pub mod openapi;
pub mod page;
pub mod people;
pub mod signal;
pub(crate) mod spool;
mod timers;
mod watchdog;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use axum::Router;
use axum::routing::{delete, get, post};

pub use crate::state::Config;
use crate::state::{AppState, Inner, Shutdown};
use crate::store::Store;

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
        .route("/sessions/{sid}/answers", post(people::answer))
        .route("/sessions/{sid}/cancel", post(people::cancel))
        .route("/sessions/{sid}/compact", post(people::compact))
        .route("/approvals", get(people::approvals))
        .route("/sessions/{sid}/result", get(api::session_result))
        .route("/sessions/{sid}/events", get(api::events))
        .route(
            "/sessions/{sid}/waitpoints",
            post(api::create_waitpoint).get(api::session_waitpoints),
        )
        .route("/waitpoints", get(api::armed_waitpoints))
        .route(
            "/waitpoints/{id}",
            get(api::get_waitpoint).delete(api::cancel_waitpoint),
        )
        .route(
            "/waitpoints/{id}/consumers/{name}",
            get(consumers::get).put(consumers::put),
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
        .route("/devices/{name}/revoked", delete(devices::remove_device))
        .route("/devices/{name}/files", get(devices::device_files))
        .route("/events", get(devices::hub_events))
        .route(
            "/mcp/tokens",
            post(mcp_tokens::create).get(mcp_tokens::list),
        )
        .route("/mcp/tokens/{name}", delete(mcp_tokens::revoke))
        .route("/openapi.json", get(openapi::serve))
        .route_layer(axum::middleware::from_fn_with_state(
            state.clone(),
            api::auth,
        ));
    Router::new()
        .route(
            "/healthz",
            get(|| async { axum::Json(cortex_protocol::api::Health { ok: true }) }),
        )
        .route("/metrics", get(metrics::route))
        .route("/webhook/signal", post(signal::route))
        .route("/", get(page::index))
        .route("/login", post(page::login))
        .route("/logout", post(page::logout))
        .route("/page/app.js", get(page::script))
        .route("/page/app.css", get(page::style))
        .nest("/api", api)
        .merge(crate::mcp::router(state.clone()))
        .fallback(api::not_found)
        .layer(axum::Extension(page::Logins::shared()))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            hosts::check,
        ))
        .layer(axum::middleware::from_fn(http::edge))
        .with_state(state)
}

/// The host of a URL like `wss://hub.example:3002/mesh/v1`.
fn url_host(url: &str) -> Option<String> {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let authority = rest.split('/').next()?;
    crate::hosts::name_of(authority).map(str::to_string)
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
    let opened = open(&config)?;
    run_opened(config, opened, listener, mesh, shutdown).await
}

/// The store and the spool, open: what must be ready before a connection is accepted.
pub struct Opened {
    store: Store,
    writer: crate::store::WriterGuard,
    spool: cortex_host::spool::Spool,
}

/// Opens the spool and the store (replaying the journal, and redb's own repair after a
/// stop that was not clean), saying what it does and how far it is. `main` calls it
/// before it binds the listener, so no connection waits on a store that is not open: one
/// is refused instead, which a client reads as the hub being away (`cortex-signal`
/// spools).
pub fn open(config: &Config) -> anyhow::Result<Opened> {
    let hub_dir = config.home.join("hub");
    create_private_dir(&hub_dir)?;
    let spool_dir = config.home.join("tmp").join("signals");
    let spool = spool::open(&spool_dir)?;
    let started = std::time::Instant::now();
    let (store, writer) = match &config.settings.store {
        Some(url) => {
            tracing::info!("opening the store on PostgreSQL");
            Store::open_postgres(
                url,
                config.settings.engine.clone(),
                config.settings.limits.clone(),
                crate::secret::hash(&config.token),
                !config.settings.store_unannounced,
            )
            .context("opening the store on PostgreSQL")?
        }
        None => {
            let db_path = hub_dir.join("hub.redb");
            tracing::info!(path = %db_path.display(), "opening the store");
            Store::open_limited(
                &db_path,
                config.settings.engine.clone(),
                config.settings.limits.clone(),
            )
            .with_context(|| format!("opening the store {}", db_path.display()))?
        }
    };
    tracing::info!(
        elapsed_ms = started.elapsed().as_millis() as u64,
        "the store is open"
    );
    Ok(Opened {
        store,
        writer,
        spool,
    })
}

/// [`run_with_mesh`] on a store [`open`] opened.
pub async fn run_opened(
    config: Config,
    opened: Opened,
    listener: tokio::net::TcpListener,
    mesh: Option<crate::mesh::Bound>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let Opened {
        store,
        writer,
        spool,
    } = opened;
    let addr = listener
        .local_addr()
        .context("reading the listener's address")?;
    let state = AppState::new(Inner {
        store,
        token_hash: crate::secret::hash(&config.token),
        exec_key: crate::secret::derive_key(&config.token, crate::mesh::exec::ASK_KEY),
        misses: crate::intake::MissBudget::default(),
        device_misses: crate::intake::DeviceMisses::default(),
        signal_url: format!("http://{addr}/webhook/signal"),
        shutdown: Shutdown::default(),
        devices: crate::registry::Registry::default(),
        mesh_url: mesh.as_ref().map(|m| m.url.clone()),
        live: crate::live::Live::default(),
        stops: Arc::default(),
        claims: crate::claims::Claims::new(
            crate::claims::hub_name(&config.home)?,
            config.settings.agent.lease_ms(),
        ),
        agent_defaults: config.settings.agent.clone(),
        runs_model: config.model.is_some(),
        model_name: config.model.as_ref().and(config.model_name.clone()),
        caps: config.model.as_ref().map(|m| m.caps()).unwrap_or_default(),
        hosts: crate::hosts::Hosts::new(
            config
                .settings
                .allowed_hosts
                .iter()
                .cloned()
                .chain(mesh.as_ref().and_then(|m| url_host(&m.url))),
        ),
        settings: config.settings.clone(),
    });
    // Sessions stored before they said whether a model runs them are decided once, before
    // anything can queue a turn for them (written only when there are such; a failed
    // write leaves each decided as it is read, and the hub still serves).
    let hub_default = config.settings.agent.instructions.clone();
    match state.store.read(|r| r.unsettled_runs()).await {
        Ok(false) => {}
        Ok(true) => match state
            .store
            .exec(move |t| t.settle_runs(hub_default.as_deref()))
            .await
        {
            Ok(settled) => tracing::info!(
                settled,
                "stored sessions decided: agent sessions or mailboxes"
            ),
            Err(e) => tracing::error!(error = %e, "cannot record which stored sessions run turns"),
        },
        Err(e) => tracing::error!(error = %e, "cannot read which stored sessions run turns"),
    }
    // The events some notice target wants, before anything that may queue one runs.
    let targets = Arc::new(config.settings.notify.clone());
    let wanted = crate::notify::wanted(&targets);
    if let Err(e) = state.store.exec(move |t| t.set_notice_events(wanted)).await {
        // The hub still serves; notices follow the events the last run recorded.
        tracing::error!(error = %e, "cannot record which events the notice targets want");
    }
    crate::mesh::start(&state, config.settings.device_loss_grace_ms).await?;

    let sweep =
        (config.settings.sweep_ms > 0).then(|| Duration::from_millis(config.settings.sweep_ms));
    // What fell due while the hub was down is delivered first, once.
    timers::start(&state, sweep.is_some()).await;
    let mut tasks = tokio::task::JoinSet::new();
    tasks.spawn(timers::run(state.clone(), sweep));
    // Also without targets: what an earlier run left pending is closed (given up).
    tasks.spawn(notices::run(state.clone(), targets));
    let rescan =
        (config.settings.sweep_ms > 0).then(|| Duration::from_millis(config.settings.sweep_ms));
    tasks.spawn(spool::collect(state.clone(), Arc::new(spool), rescan));
    if let Some(model) = config.model.clone() {
        tasks.spawn(crate::runner::run(state.clone(), model));
    }
    state.store.announce_hub(&state.claims.hub);
    tasks.spawn(cluster::keep(state.clone()));
    tasks.spawn(cluster::end_gone_hubs(state.clone()));
    tasks.spawn(cluster::follow_devices(state.clone()));
    tasks.spawn(cluster::serve_exec_asks(state.clone()));
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
    let mut fatal = state.store.fatal.clone();
    let stopping = async move {
        tokio::select! {
            () = shutdown => {}
            () = stop.cancelled() => {}
            _ = fatal.wait_for(Option::is_some) => {}
        }
        stop.cancel();
    };
    tasks.spawn(watchdog::feed(state.clone()));
    let mut notifier = watchdog::ready(&format!(
        "serving the API on http://{addr}, {}",
        state
            .mesh_url
            .as_deref()
            .map_or_else(|| "mesh off".to_string(), |u| format!("mesh {u}"))
    ));
    let cap = http::connection_cap();
    tracing::info!(
        cap,
        header_timeout_s = http::HEADER_TIMEOUT.as_secs(),
        body_timeout_s = http::BODY_TIMEOUT.as_secs(),
        "API connections"
    );
    http::serve(listener, app, cap, stopping, state.shutdown.clone()).await;
    notifier.stopping();
    state.shutdown.cancel();
    let fatal = state.store.fatal.borrow().clone();
    while tasks.join_next().await.is_some() {}
    drop(state);
    // Every handle is gone: the writer commits what it holds and ends. Waited for with a
    // bound: a writer that cannot finish (its last checkpoint cannot be written, as after
    // redb's I/O error on a full disk) must not keep the process up, or the service
    // manager never restarts it. Leaving it is a crash at worst, which the journal is for:
    // every acknowledged change is in it, and the next start applies it.
    let bound = if fatal.is_some() {
        WRITER_BOUND_AFTER_FAILURE
    } else {
        WRITER_BOUND
    };
    if !join_writer(writer, bound).await {
        tracing::error!(
            bound_s = bound.as_secs(),
            "the store's writer did not finish its last checkpoint in time; stopping without it (the journal holds every acknowledged change, and the next start applies it)"
        );
        if fatal.is_none() {
            anyhow::bail!(
                "the store could not finish its last checkpoint within {} s; the next start applies the journal",
                bound.as_secs()
            );
        }
    }
    match fatal {
        Some(why) => Err(anyhow::anyhow!("the store stopped working: {why}")),
        None => Ok(()),
    }
}

/// How long a stop waits for the store's writer to checkpoint what it holds: a checkpoint
/// is at most a few MiB of changes, seconds on the slowest disk.
const WRITER_BOUND: Duration = Duration::from_secs(60);
/// ... and after the store failed, when a last checkpoint is not expected to work.
const WRITER_BOUND_AFTER_FAILURE: Duration = Duration::from_secs(5);

/// Joins the store's writer on a thread of its own, waiting at most `bound`; false if it
/// had not ended by then (the thread is left; the process ends without it). Not
/// `spawn_blocking`: the runtime's drop would wait for that task without a bound.
async fn join_writer(writer: crate::store::WriterGuard, bound: Duration) -> bool {
    let (done, ended) = tokio::sync::oneshot::channel();
    let spawned = std::thread::Builder::new()
        .name("store-join".into())
        .spawn(move || {
            writer.join();
            let _ = done.send(());
        });
    if let Err(e) = spawned {
        tracing::error!(error = %e, "cannot start a thread to wait for the store's writer");
        return false;
    }
    tokio::time::timeout(bound, ended)
        .await
        .is_ok_and(|r| r.is_ok())
}

/// Creates `dir` (and its parents) mode 0700, and makes an existing one and every file in
/// it private (0700, 0600): a hub that ran before under a wider umask leaves its store
/// readable to others otherwise.
pub fn create_private_dir(dir: &std::path::Path) -> anyhow::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .with_context(|| format!("creating {}", dir.display()))?;
    let tighten = |path: &std::path::Path, mode: u32| -> anyhow::Result<()> {
        let meta = std::fs::symlink_metadata(path)
            .with_context(|| format!("reading {}", path.display()))?;
        if !meta.file_type().is_symlink() && meta.permissions().mode() & 0o077 != 0 {
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
                .with_context(|| format!("making {} private", path.display()))?;
        }
        Ok(())
    };
    tighten(dir, 0o700)?;
    let entries = std::fs::read_dir(dir).with_context(|| format!("listing {}", dir.display()))?;
    for entry in entries {
        let entry = entry.with_context(|| format!("listing {}", dir.display()))?;
        let kind = entry
            .file_type()
            .with_context(|| format!("reading {}", entry.path().display()))?;
        if kind.is_file() {
            tighten(&entry.path(), 0o600)?;
        } else if kind.is_dir() {
            tighten(&entry.path(), 0o700)?;
        }
    }
    Ok(())
}
