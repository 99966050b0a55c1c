//! Optional TLS: a certificate chain and private key (PEM files) loaded
//! once at startup into a rustls server configuration.
//!
//! ```text
//! client ── SSLRequest ──► 'S' (TLS configured) or 'N' (not)
//!        ── TLS handshake (rustls, ring) ──► StartupMessage over TLS
//! ```
//!
//! pgwire does the negotiation (`process_socket` with a `TlsAcceptor`),
//! including PostgreSQL 17's direct TLS (`sslnegotiation=direct`, ALPN
//! `postgresql`). With [`crate::Config::require_tls`] the startup handler
//! refuses a StartupMessage that arrived in plaintext with SQLSTATE 28000.
//! When a password is configured too, SCRAM offers channel binding
//! (SCRAM-SHA-256-PLUS) over TLS.

use std::path::Path;
use std::sync::Arc;

use pgwire::tokio::tokio_rustls::rustls;
use pgwire::tokio::TlsAcceptor;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use crate::Error;

/// ALPN protocol name of PostgreSQL's direct TLS negotiation.
const ALPN_POSTGRESQL: &[u8] = b"postgresql";

/// A loaded certificate and key, ready to accept TLS connections.
#[derive(Clone)]
pub struct Tls {
    pub(crate) acceptor: TlsAcceptor,
    /// The certificate chain as PEM, for SCRAM channel binding.
    pub(crate) cert_pem: Arc<Vec<u8>>,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tls").finish_non_exhaustive()
    }
}

impl Tls {
    /// Reads a PEM certificate chain (the server's certificate first) and
    /// a PEM private key (PKCS#8, PKCS#1 or SEC1) from files.
    pub fn from_pem_files(cert: &Path, key: &Path) -> Result<Tls, Error> {
        let read = |path: &Path| {
            std::fs::read(path).map_err(|source| Error::TlsFile {
                path: path.display().to_string(),
                source,
            })
        };
        let cert_pem = read(cert)?;
        let key_pem = read(key)?;
        Self::from_pem_named(
            &cert_pem,
            &key_pem,
            &cert.display().to_string(),
            &key.display().to_string(),
        )
    }

    /// The same from PEM text in memory.
    pub fn from_pem(cert: &[u8], key: &[u8]) -> Result<Tls, Error> {
        Self::from_pem_named(cert, key, "certificate", "private key")
    }

    fn from_pem_named(
        cert_pem: &[u8],
        key_pem: &[u8],
        cert_name: &str,
        key_name: &str,
    ) -> Result<Tls, Error> {
        let invalid = |path: &str, message: String| Error::TlsInvalid {
            path: path.to_string(),
            message,
        };
        let chain = CertificateDer::pem_slice_iter(cert_pem)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| invalid(cert_name, format!("not a PEM certificate chain: {e}")))?;
        if chain.is_empty() {
            return Err(invalid(
                cert_name,
                "no certificate found (expected a PEM \"BEGIN CERTIFICATE\" block)".into(),
            ));
        }
        let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(|e| {
            invalid(
                key_name,
                format!("no PEM private key found (PKCS#8, PKCS#1 or SEC1): {e}"),
            )
        })?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .and_then(|b| b.with_no_client_auth().with_single_cert(chain, key))
            .map_err(|e| Error::TlsRejected(e.to_string()))?;
        config.alpn_protocols = vec![ALPN_POSTGRESQL.to_vec()];
        Ok(Tls {
            acceptor: TlsAcceptor::from(Arc::new(config)),
            cert_pem: Arc::new(cert_pem.to_vec()),
        })
    }
}
