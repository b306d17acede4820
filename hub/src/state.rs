//! What every part of the running hub shares: its configuration ([`Config`]), the stop
//! flag ([`Shutdown`]) and the handles the routes, the mesh and the background tasks
//! hold ([`AppState`]: the store, the device registry, the miss budgets, the URLs).
//!
//! It sits below `server` and `mesh` and imports neither, so both can hold it without
//! importing each other.

use std::ops::Deref;
use std::path::PathBuf;
use std::sync::Arc;

use tokio::sync::watch;

use crate::config::{AgentDefaults, HubSettings};
use crate::intake::{DeviceMisses, MissBudget};
use crate::live::Live;
use crate::model::Model;
use crate::registry::Registry;
use crate::store::Store;

/// What `server::run` needs.
#[derive(Clone)]
pub struct Config {
    pub home: PathBuf,
    pub settings: HubSettings,
    pub token: String,
    /// The model the runner calls; `None`: no turn runs (sessions still record messages
    /// and wakes for outside agents).
    pub model: Option<Arc<dyn Model>>,
    /// The model's name as the runner asks for it (`CORTEX_LLM_MODEL`, settings.json
    /// `llm.model`), shown in a session's configuration; never a key.
    pub model_name: Option<String>,
}

impl std::fmt::Debug for Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Config")
            .field("home", &self.home)
            .field("settings", &self.settings)
            .field("model", &self.model.is_some())
            .finish_non_exhaustive()
    }
}

/// A shutdown flag every task can wait on.
#[derive(Clone)]
pub struct Shutdown(watch::Sender<bool>);

impl Default for Shutdown {
    fn default() -> Self {
        Shutdown(watch::channel(false).0)
    }
}

impl Shutdown {
    pub fn cancel(&self) {
        self.0.send_replace(true);
    }

    pub fn is_cancelled(&self) -> bool {
        *self.0.borrow()
    }

    pub async fn cancelled(&self) {
        let mut rx = self.0.subscribe();
        let _ = rx.wait_for(|v| *v).await;
    }
}

pub struct Inner {
    pub store: Store,
    pub token_hash: [u8; 32],
    /// Seals the `device_exec` asks passed to another hub through a shared store
    /// (`mesh::exec`): derived from the operator token the hubs share.
    pub exec_key: [u8; 32],
    /// The signal route's budget of unknown ids and wrong secrets.
    pub misses: MissBudget,
    /// Each device's budget of unknown ids and wrong secrets in its files.
    pub device_misses: DeviceMisses,
    /// The signal route's URL, for `how_to_signal`.
    pub signal_url: String,
    pub shutdown: Shutdown,
    /// Devices allowed to connect and their live links.
    pub devices: Registry,
    /// The mesh's URL for agents (`None` with `--mesh-listen off`).
    pub mesh_url: Option<String>,
    /// The model's text as it streams, to the sessions' followers.
    pub live: Live,
    /// What a session gets when its creator does not say.
    pub agent_defaults: AgentDefaults,
    /// Whether the hub runs a model (a message to a session then starts a turn).
    pub runs_model: bool,
    /// The model's name (`GET /api/sessions/{sid}` `config.model`), when it runs one.
    pub model_name: Option<String>,
    /// What the model server can enforce (an output schema's transport is chosen by it).
    pub caps: crate::model::Caps,
    /// Stops for the turns being driven (a cancel rings them).
    pub stops: Arc<crate::stops::Stops>,
    /// The sessions this hub holds a claim on, and its name among the hubs on the store.
    pub claims: crate::claims::Claims,
    /// The names the listener answers to, besides loopback and `localhost`.
    pub hosts: crate::hosts::Hosts,
    /// The hub's settings as read at start; `limits` bounds what a client may cost.
    pub settings: HubSettings,
}

/// The shared state, cheap to clone (one `Arc`).
#[derive(Clone)]
pub struct AppState(Arc<Inner>);

impl AppState {
    pub fn new(inner: Inner) -> Self {
        AppState(Arc::new(inner))
    }
}

impl Deref for AppState {
    type Target = Inner;
    fn deref(&self) -> &Inner {
        &self.0
    }
}
