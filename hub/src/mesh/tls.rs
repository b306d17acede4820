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

/// The host agents should dial for a mesh served with `cert` (PEM chain, leaf first) on
/// `addr`: one the certificate is valid for, so the printed URL works when pasted. In
/// order: the listen address itself (an IP in the certificate), this machine's host name,
/// the certificate's first DNS name that is not a wildcard. `None` when it names none of
/// them (the caller keeps the address and warns).
pub fn url_host(cert: &Path, addr: std::net::SocketAddr, hostname: Option<&str>) -> Option<String> {
    use rustls_pki_types::ServerName;
    let der = CertificateDer::pem_file_iter(cert).ok()?.next()?.ok()?;
    let leaf = webpki::EndEntityCert::try_from(&der).ok()?;
    let valid = |name: &str| {
        ServerName::try_from(name)
            .ok()
            .is_some_and(|n| leaf.verify_is_valid_for_subject_name(&n).is_ok())
    };
    let ip = addr.ip();
    if !ip.is_unspecified() && valid(&ip.to_string()) {
        return Some(if ip.is_ipv6() {
            format!("[{ip}]")
        } else {
            ip.to_string()
        });
    }
    if let Some(h) = hostname.filter(|h| valid(h)) {
        return Some(h.to_string());
    }
    leaf.valid_dns_names()
        .find(|n| !n.starts_with('*'))
        .map(str::to_string)
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
