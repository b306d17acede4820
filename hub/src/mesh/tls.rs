//! `wss://` for the mesh: the certificate chain and key from PEM files, served with
//! rustls and its ring provider (installed explicitly; tokio-tungstenite's rustls
//! features otherwise leave rustls without one and panic at run time).

use std::path::Path;
use std::sync::Arc;

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::TlsAcceptor;

/// A certificate or key that cannot be served; the mesh's start error
/// (`MeshError::Tls`) carries it.
#[derive(Debug, thiserror::Error)]
#[error(
    "TLS: {path}: {why}; give a PEM certificate chain (--tls-cert) and its PEM private key (--tls-key)"
)]
pub struct TlsError {
    pub path: String,
    pub why: String,
}

/// Installs ring as the process's rustls provider; a second call is harmless.
pub fn install_provider() {
    // Err means a provider is already installed, which is all we want.
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// A TLS acceptor for `cert` (PEM chain, leaf first) and `key` (PEM private key).
pub fn acceptor(cert: &Path, key: &Path) -> Result<TlsAcceptor, TlsError> {
    install_provider();
    let bad = |path: &Path, why: String| TlsError {
        path: path.display().to_string(),
        why,
    };
    let certs = CertificateDer::pem_file_iter(cert)
        .map_err(|e| bad(cert, e.to_string()))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| bad(cert, e.to_string()))?;
    if certs.is_empty() {
        return Err(bad(cert, "no CERTIFICATE block in it".into()));
    }
    let key_der = PrivateKeyDer::from_pem_file(key).map_err(|e| bad(key, e.to_string()))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| bad(cert, e.to_string()))?
        .with_no_client_auth()
        .with_single_cert(certs, key_der)
        .map_err(|e| bad(key, format!("the key does not fit the certificate: {e}")))?;
    Ok(TlsAcceptor::from(Arc::new(config)))
}
