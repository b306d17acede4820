//! The TLS client configuration for a `wss://` hub: rustls with the ring provider, the
//! system's trust anchors (`rustls-native-certs`) plus those of `--ca-cert` for a hub whose
//! certificate a private CA signed (or a self-signed one, given as its own CA).
//!
//! The config names its provider itself, so it does not depend on the process default; the
//! process default is installed too ([`install_provider`]), since tokio-tungstenite's
//! rustls features otherwise panic at run time when anything asks for it.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::{ClientConfig, RootCertStore};
use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject;

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read CA certificates from {}: {why}; give a PEM file with one or more CERTIFICATE blocks", .path.display())]
    CaFile { path: PathBuf, why: String },

    #[error("{} holds no usable CA certificate: {why}", .path.display())]
    CaCert { path: PathBuf, why: String },

    #[error(
        "no trust anchors for wss://: the system has no CA certificates (install the ca-certificates package) and no --ca-cert was given"
    )]
    NoRoots,

    #[error("building the TLS configuration: {0}")]
    Config(String),
}

/// Installs ring as the process's rustls provider. Idempotent: a second call (or one after
/// another part of the process installed one) changes nothing.
pub fn install_provider() {
    // An error only says a provider is already installed, which is what we want.
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// The client config for a `wss://` hub.
pub fn client_config(ca_cert: Option<&Path>) -> Result<Arc<ClientConfig>, TlsError> {
    let mut roots = RootCertStore::empty();
    let native = rustls_native_certs::load_native_certs();
    for e in &native.errors {
        tracing::debug!(error = %e, "a system CA certificate could not be loaded");
    }
    let (added, ignored) = roots.add_parsable_certificates(native.certs);
    tracing::debug!(added, ignored, "system CA certificates");
    if let Some(path) = ca_cert {
        add_pem(&mut roots, path)?;
    }
    if roots.is_empty() {
        return Err(TlsError::NoRoots);
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Config(e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Arc::new(config))
}

fn add_pem(roots: &mut RootCertStore, path: &Path) -> Result<(), TlsError> {
    let iter = CertificateDer::pem_file_iter(path).map_err(|e| TlsError::CaFile {
        path: path.to_owned(),
        why: e.to_string(),
    })?;
    let mut n = 0;
    for cert in iter {
        let cert = cert.map_err(|e| TlsError::CaFile {
            path: path.to_owned(),
            why: e.to_string(),
        })?;
        roots.add(cert).map_err(|e| TlsError::CaCert {
            path: path.to_owned(),
            why: e.to_string(),
        })?;
        n += 1;
    }
    if n == 0 {
        return Err(TlsError::CaCert {
            path: path.to_owned(),
            why: "no CERTIFICATE block".into(),
        });
    }
    Ok(())
}
