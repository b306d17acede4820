//! The hub's side of the device mesh: the WebSocket listener on `--mesh-listen`
//! (`/mesh/v1`, `ws://` on loopback or `wss://` with rustls), one task per device link,
//! and the sweep's rescan of every connected agent. The frames are
//! `cortex_protocol::mesh`'s and `docs/protocol.md` lists them.
//!
//! - [`link`]: one connection: upgrade and auth, hello, files and acks, keepalive, close.
//! - [`tls`]: the rustls acceptor.
//! - [`waits`]: remote waits on a link: what the agent holds reconciled with the store.
//! - [`exec`]: starting a command on a device (`device_exec`): one `Exec` over its live
//!   link and the agent's answer.
//!
//! The listener caps its connections (`crate::admission`, as the API's does): those
//! still in their handshake, and all of them, from the descriptor limit. Past the
//! handshake cap the oldest connection without a hello is evicted for the new one; past
//! the total cap, with every connection a live link, the new one is closed at once. Each
//! is counted in a warning at most every ten seconds.
//!
//! Only this module and the agent's link touch the mesh's sockets. A device's file goes
//! through the same store operation as the signal route; an ack is sent only after the
//! commit holding the signal returned.

pub mod exec;
pub mod link;
pub mod tls;
pub mod waits;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use cortex_protocol::mesh::{DEFAULT_PING_MS, MESH_PATH};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

use crate::admission::{self, Conns, Throttle};
use crate::state::AppState;
use crate::time::now_ms;

use crate::registry::End;

/// Errors of starting the mesh; each says what to do.
#[derive(Debug, thiserror::Error)]
pub enum MeshError {
    #[error(
        "--mesh-listen {0} is not a loopback address and the mesh has no TLS: devices would send their tokens in the clear; give --tls-cert PEM --tls-key PEM, or --mesh-insecure if the network is trusted"
    )]
    PlainOffLoopback(SocketAddr),
    #[error("--tls-cert and --tls-key go together; give both (PEM files) or neither")]
    TlsHalf,
    #[error("--public-url {0}")]
    PublicUrl(String),
    #[error(transparent)]
    Tls(#[from] tls::TlsError),
    #[error(
        "cannot listen for devices on {addr}: {source}; is another hub running? (set --mesh-listen ADDR, or off)"
    )]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
}

/// What the mesh listener is asked to be.
#[derive(Debug, Clone)]
pub struct MeshSetup {
    pub listen: SocketAddr,
    /// `--tls-cert`, `--tls-key`.
    pub tls: Option<(PathBuf, PathBuf)>,
    /// `--mesh-insecure`: plaintext off loopback is allowed.
    pub insecure: bool,
    /// The keepalive interval told to agents (`CORTEX_MESH_PING_MS`, default 20 s).
    pub ping_ms: u64,
    /// `--public-url`: the URL agents dial, when it is not the listen address (a proxy,
    /// a DNS name); printed and put in install lines as given.
    pub public_url: Option<String>,
}

impl MeshSetup {
    pub fn new(listen: SocketAddr) -> Self {
        MeshSetup {
            listen,
            tls: None,
            insecure: false,
            ping_ms: DEFAULT_PING_MS,
            public_url: None,
        }
    }

    /// The start rule: plaintext only on loopback, unless `--mesh-insecure`.
    pub fn check(&self) -> Result<(), MeshError> {
        if self.tls.is_none() && !self.insecure && !self.listen.ip().is_loopback() {
            return Err(MeshError::PlainOffLoopback(self.listen));
        }
        Ok(())
    }
}

/// A bound mesh listener, ready for [`crate::server::run_with_mesh`].
pub struct Bound {
    pub listener: TcpListener,
    pub tls: Option<TlsAcceptor>,
    /// `ws://127.0.0.1:3002/mesh/v1`: what an agent's `--hub` is given.
    pub url: String,
    pub ping: Duration,
}

impl Bound {
    /// Checks the rules, loads TLS and binds. Nothing is listening if this fails.
    pub async fn bind(setup: &MeshSetup) -> Result<Bound, MeshError> {
        setup.check()?;
        let tls = match &setup.tls {
            Some((cert, key)) => Some(tls::acceptor(cert, key)?),
            None => None,
        };
        let listener = TcpListener::bind(setup.listen)
            .await
            .map_err(|source| MeshError::Bind {
                addr: setup.listen,
                source,
            })?;
        let addr = listener.local_addr().map_err(|source| MeshError::Bind {
            addr: setup.listen,
            source,
        })?;
        let url = match (&setup.public_url, &setup.tls) {
            (Some(u), _) => u.clone(),
            (None, Some((cert, _))) => {
                let hostname = cortex_host::hostname();
                match tls::url_host(cert, addr, hostname.as_deref()) {
                    Some(host) => format!("wss://{host}:{}{MESH_PATH}", addr.port()),
                    None => {
                        let u = url(addr, true);
                        tracing::warn!(url = %u, cert = %cert.display(), "the mesh certificate names neither this address nor this host: agents dialing the printed URL will fail the certificate check; give --public-url with a name the certificate is valid for");
                        u
                    }
                }
            }
            (None, None) => url(addr, false),
        };
        Ok(Bound {
            listener,
            url,
            tls,
            ping: Duration::from_millis(setup.ping_ms.max(1)),
        })
    }
}

/// The URL agents connect to. An unspecified address (`0.0.0.0`) is shown with this
/// machine's host name, which is what a device can reach.
fn url(addr: SocketAddr, tls: bool) -> String {
    let scheme = if tls { "wss" } else { "ws" };
    let host = if addr.ip().is_unspecified() {
        cortex_host::hostname().unwrap_or_else(|| "HUB-HOST".into())
    } else if addr.is_ipv6() {
        format!("[{}]", addr.ip())
    } else {
        addr.ip().to_string()
    };
    format!("{scheme}://{host}:{}{MESH_PATH}", addr.port())
}

/// `--public-url` checked: `ws://` or `wss://` as the mesh serves it, a host, and the
/// mesh's path (added when the URL has none).
pub fn public_url(given: &str, tls: bool) -> Result<String, MeshError> {
    let bad = |why: &str| MeshError::PublicUrl(format!("{given:?}: {why}"));
    let want = if tls { "wss://" } else { "ws://" };
    let rest = given.trim().strip_prefix(want).ok_or_else(|| {
        bad(&format!(
            "this mesh is served as {want}…, so the URL starts with {want}"
        ))
    })?;
    let (host, path) = match rest.find('/') {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    if host.is_empty() || host.contains(char::is_whitespace) {
        return Err(bad("no host in it"));
    }
    let path = match path.trim_end_matches('/') {
        "" => MESH_PATH,
        p if p == MESH_PATH => MESH_PATH,
        _ => return Err(bad(&format!("the mesh's path is {MESH_PATH}"))),
    };
    Ok(format!("{want}{host}{path}"))
}

/// How long [`start`] waits for the store to answer before the hub gives up.
const START_PATIENCE: Duration = Duration::from_secs(60);

/// Loads the allowed devices into the registry and records the links a killed hub left
/// "online" as offline; every device is offline now, and its loss is told `loss_grace_ms`
/// after the later of its last seen and this start, unless it reconnects first (a restart
/// alone is no loss). Runs before anything listens.
pub async fn start(state: &AppState, loss_grace_ms: u64) -> anyhow::Result<()> {
    use anyhow::Context;
    // A database restarting as the hub starts is waited for, a while, not a reason to
    // exit: the store's connections are made again as it comes back.
    let patience = tokio::time::Instant::now() + START_PATIENCE;
    loop {
        let me = state.claims.hub.clone();
        let r = state
            .store
            .exec(move |t| {
                let now = now_ms();
                t.devices_restarted(now, &me)?;
                t.device_losses_restarted(now, loss_grace_ms)
            })
            .await;
        match r {
            Ok(()) => break,
            Err(e) if tokio::time::Instant::now() < patience => {
                tracing::warn!(error = %e, "cannot record the devices of the previous run offline yet; trying again");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(e) => {
                return Err(anyhow::anyhow!("{e}"))
                    .context("recording the devices of the previous run offline");
            }
        }
    }
    let records = loop {
        match state.store.read(|r| r.devices()).await {
            Ok(r) => break r,
            Err(e) if tokio::time::Instant::now() < patience => {
                tracing::warn!(error = %e, "cannot read the devices yet; trying again");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(e) => return Err(anyhow::anyhow!("{e}")).context("reading the devices"),
        }
    };
    state
        .devices
        .load(records.into_iter().map(|r| (r.name, r.token_hash)));
    Ok(())
}

/// Accepts device connections until the hub stops, then ends every link with a reason
/// and waits for them (their in-flight files are answered first).
pub async fn serve(state: AppState, bound: Bound) {
    let Bound {
        listener,
        tls,
        ping,
        ..
    } = bound;
    let (cap, handshake_cap) = admission::mesh_caps(admission::nofile());
    tracing::info!(
        cap,
        handshake_cap,
        handshake_timeout_s = link::HANDSHAKE_TIMEOUT.as_secs(),
        "mesh connections"
    );
    let handshakes =
        Conns::new("mesh handshake cap reached: evicting the oldest connections without a hello");
    let all =
        Conns::new("mesh connection cap reached: evicting the oldest connections without a hello");
    let mut refused = Throttle::default();
    let mut accept_errors = Throttle::default();
    let mut conns = tokio::task::JoinSet::new();
    loop {
        tokio::select! {
            r = listener.accept() => match r {
                Ok((tcp, peer)) => {
                    // The handshake's place first: the connection it evicts (the oldest
                    // without a hello) is also the one the total cap would pick.
                    let places = handshakes
                        .admit(handshake_cap)
                        .and_then(|handshake| Some(link::Places { handshake, link: all.admit(cap)? }));
                    let Some(places) = places else {
                        // Every connection is a live link: this one is closed at once.
                        if refused.due() {
                            tracing::warn!(cap, refused = refused.take(), "mesh connection cap reached with every connection a live link: refusing new ones");
                        }
                        continue;
                    };
                    // Acks are small and latency matters more than packing them.
                    let _ = tcp.set_nodelay(true);
                    conns.spawn(link::connection(state.clone(), tls.clone(), tcp, peer, ping, places));
                }
                Err(e) => {
                    // EMFILE and friends: do not spin; the listener recovers by itself.
                    if accept_errors.due() {
                        tracing::warn!(error = %e, times = accept_errors.take(), "mesh accept failed; retrying in 100 ms");
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            },
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
            () = state.shutdown.cancelled() => break,
        }
    }
    drop(listener);
    state.devices.end_all(End::Shutdown);
    while conns.join_next().await.is_some() {}
}

/// The sweep's half for the mesh: every `every`, ask each connected agent to list its
/// spool again (the backstop to inotify), and save live links' last seen.
pub async fn sweep(state: AppState, every: Duration) {
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            () = state.shutdown.cancelled() => return,
        }
        let links = state.devices.links();
        if links.is_empty() {
            continue;
        }
        state.devices.rescan_all();
        let live: Vec<_> = links
            .iter()
            .map(|l| (l.device.clone(), l.id, l.last_seen(), l.spool()))
            .collect();
        if let Err(e) = state.store.exec(move |t| t.touch_devices(&live)).await {
            tracing::warn!(error = %e, "saving the devices' last seen failed; it is saved again at the next sweep");
        }
    }
}

#[cfg(test)]
mod tests;
