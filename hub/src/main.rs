//! `cortex-hub`: parses flags, binds the listeners (the API's and the device mesh's), and
//! hands over to `cortex_hub::server::run_with_mesh`.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Context;
use clap::Parser;
use cortex_hub::cli::Args;
use cortex_hub::config;

fn main() -> std::process::ExitCode {
    cortex_daemon::main("cortex-hub", || real_main(Args::parse()))
}

/// `--recover-journal`: see [`Args`].
fn recover_journal(home: &std::path::Path, settings: config::HubSettings) -> anyhow::Result<()> {
    let db = home.join("hub").join("hub.redb");
    anyhow::ensure!(db.exists(), "no store at {}", db.display());
    let r = cortex_hub::store::Store::recover_journal(&db, settings.engine)
        .with_context(|| format!("recovering the store {}", db.display()))?;
    let lost: u64 = r.lost.iter().map(|(a, b)| b - a + 1).sum();
    let ranges: Vec<String> = r
        .lost
        .iter()
        .map(|(a, b)| {
            if a == b {
                a.to_string()
            } else {
                format!("{a}-{b}")
            }
        })
        .collect();
    println!(
        "recovered {}: {} journal records applied, {} lost{}, {} unreadable bytes; the journal starts over",
        db.display(),
        r.applied,
        lost,
        if ranges.is_empty() {
            String::new()
        } else {
            format!(" (records {})", ranges.join(", "))
        },
        r.unreadable_bytes
    );
    Ok(())
}

fn real_main(args: Args) -> anyhow::Result<()> {
    // Everything the hub creates (its directory, the store, the journal, the token, parked
    // spool files) is the operator's alone, whatever umask the shell or unit gave it.
    rustix::process::umask(rustix::fs::Mode::from_raw_mode(0o077));
    raise_nofile();
    let home = args.home.unwrap_or_else(config::default_home);
    // One hub per home, checked before anything is bound or printed; held until exit.
    let _home_lock = cortex_hub::home_lock::HomeLock::take(&home)?;
    let mut settings = config::load_settings(&home)?;
    if let Some(url) = &args.store {
        settings.store = Some(config::store_url("--store", url)?);
    }
    if args.recover_journal {
        anyhow::ensure!(
            settings.store.is_none(),
            "the store is on PostgreSQL, which keeps no journal of the hub's: --recover-journal is for the redb store under the home"
        );
        return recover_journal(&home, settings);
    }
    let listen = match args.listen {
        Some(a) => a,
        None => {
            let port = match std::env::var("WEBHOOK_PORT") {
                Ok(p) if !p.is_empty() => p
                    .parse::<u16>()
                    .with_context(|| format!("WEBHOOK_PORT={p:?} is not a port number"))?,
                _ => cortex_protocol::DEFAULT_WEBHOOK_PORT,
            };
            SocketAddr::from(([127, 0, 0, 1], port))
        }
    };
    config::check_loopback(listen)?;
    let mut mesh = mesh_setup(
        &args.mesh_listen,
        args.tls_cert,
        args.tls_key,
        args.mesh_insecure,
    )?;
    if let (Some(m), Some(u)) = (&mut mesh, &args.public_url) {
        m.public_url = Some(cortex_hub::mesh::public_url(u, m.tls.is_some())?);
    }
    if let Some(m) = &mesh {
        // Refused before anything starts, with the reason.
        m.check()?;
    }
    cortex_hub::server::create_private_dir(&home.join("hub"))?;
    let token = config::operator_token(&home, std::env::var("CORTEX_WEBHOOK_TOKEN").ok())?;
    // Before any TLS: tokio-tungstenite's rustls features leave rustls without a provider.
    cortex_hub::mesh::tls::install_provider();
    let (model, model_name) = match model_setup(&settings)? {
        Some((m, name)) => (Some(m), Some(name)),
        None => (None, None),
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the runtime")?;
    let config = cortex_hub::server::Config {
        home: home.clone(),
        settings,
        token,
        model,
        model_name,
    };
    // The store first: a connection is accepted only once it is open (until then none is,
    // so a client is refused at once rather than left hanging through a long recovery).
    let opened = rt.block_on(async { cortex_hub::server::open(&config) })?;
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind(listen)
            .await
            .with_context(|| format!("cannot listen on {listen}; is another hub running? (set --listen or WEBHOOK_PORT)"))?;
        let addr = listener.local_addr().context("reading the bound address")?;
        let mesh = match &mesh {
            Some(m) => Some(cortex_hub::mesh::Bound::bind(m).await?),
            None => None,
        };
        let mesh_text = mesh
            .as_ref()
            .map_or_else(|| "mesh off".to_string(), |m| format!("mesh {}", m.url));
        if config.model.is_none() {
            tracing::info!("no model configured (CORTEX_LLM_BASE_URL or settings.json llm): sessions record messages and wakes, and no turn runs");
        }
        // Beside the token: where `cortex` and `cortex-signal` on this machine find a hub
        // started on any port (port 0 included). Removed again on a clean stop;
        // written before the line below, so whoever reads the line finds it.
        let url_file = home.join("hub").join("url");
        cortex_host::atomic::write_file(&url_file, format!("http://{addr}\n").as_bytes(), 0o600)
            .with_context(|| format!("writing the hub's address to {}", url_file.display()))?;
        // Tests and scripts read this line: keep its prefix and the mesh's place. One
        // write, so a reader never sees half of it (eprintln! writes piece by piece).
        let line = format!(
            "cortex-hub listening on http://{addr} (signal route /webhook/signal, API /api), {mesh_text}, home {}\n",
            home.display()
        );
        let _ = std::io::Write::write_all(&mut std::io::stderr().lock(), line.as_bytes());
        let shutdown = async {
            cortex_host::shutdown_signal().await;
        };
        let ran = cortex_hub::server::run_opened(config, opened, listener, mesh, shutdown).await;
        if let Err(e) = std::fs::remove_file(&url_file)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!(error = %e, path = %url_file.display(), "cannot remove the hub's address file");
        }
        ran
    })
}

/// The model the runner calls and its name, from settings.json `llm` and `CORTEX_LLM_*`;
/// `None` when no model server is set.
fn model_setup(
    settings: &config::HubSettings,
) -> anyhow::Result<Option<(std::sync::Arc<dyn cortex_hub::model::Model>, String)>> {
    let env = |k: &str| std::env::var(k).ok();
    let Some(cfg) = cortex_hub::model::llm_config(settings.llm.as_ref(), &env)
        .context("reading the model's settings")?
    else {
        return Ok(None);
    };
    tracing::info!(base_url = %cfg.base_url, model = %cfg.model, "the runner calls this model");
    let name = cfg.model.clone();
    let cfg = cfg.with_limits(&settings.limits);
    let client = cortex_hub::model::ModelClient::new(cfg).context("setting up the model client")?;
    Ok(Some((std::sync::Arc::new(client), name)))
}

/// The mesh's setup from the flags and `CORTEX_MESH_PING_MS`; `None` for `off`.
fn mesh_setup(
    listen: &str,
    cert: Option<PathBuf>,
    key: Option<PathBuf>,
    insecure: bool,
) -> anyhow::Result<Option<cortex_hub::mesh::MeshSetup>> {
    if listen.trim().eq_ignore_ascii_case("off") {
        return Ok(None);
    }
    let addr: SocketAddr = listen.trim().parse().with_context(|| {
        format!(
            "--mesh-listen {listen:?} is not an address; give IP:PORT (e.g. 127.0.0.1:3002) or off"
        )
    })?;
    let mut m = cortex_hub::mesh::MeshSetup::new(addr);
    m.tls = match (cert, key) {
        (Some(c), Some(k)) => Some((c, k)),
        (None, None) => None,
        _ => return Err(cortex_hub::mesh::MeshError::TlsHalf.into()),
    };
    m.insecure = insecure;
    if let Ok(p) = std::env::var("CORTEX_MESH_PING_MS")
        && !p.trim().is_empty()
    {
        m.ping_ms = match p.trim().parse::<u64>() {
            Ok(n) if n >= 10 => n,
            _ => anyhow::bail!(
                "CORTEX_MESH_PING_MS={p:?} is not usable; give the keepalive interval in milliseconds, at least 10 (default 20000)"
            ),
        };
    }
    Ok(Some(m))
}

/// Raises the soft descriptor limit to the hard one: the API's connection cap is derived
/// from it (`server::http::connection_cap`), and a low soft limit (1,024 is common) would
/// make that cap small for no reason.
fn raise_nofile() {
    use rustix::process::{Resource, getrlimit, setrlimit};
    let lim = getrlimit(Resource::Nofile);
    if lim.current != lim.maximum {
        let raised = rustix::process::Rlimit {
            current: lim.maximum,
            maximum: lim.maximum,
        };
        if let Err(e) = setrlimit(Resource::Nofile, raised) {
            tracing::warn!(error = %e, "cannot raise the descriptor limit to the hard limit");
        }
    }
}
