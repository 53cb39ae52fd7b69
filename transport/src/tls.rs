//! Mutual TLS for the client↔server endpoint.
//!
//! A cluster has one CA. Servers present a certificate for
//! [`SERVER_NAME`] (plus any names an operator adds), clients one for
//! [`CLIENT_NAME`]; both are signed by the cluster CA, and each side
//! accepts only a peer whose chain ends at that CA. Clients check the
//! server's name, as Nomad's `verify_server_hostname` does. A certificate
//! says "a member of this cluster", not which node: nodes are identified by
//! node id and secret, so every client may share one client certificate.
//!
//! Crypto provider: aws-lc-rs, the only one compiled in. Handshake cost is
//! what a reconnect storm of 10,000 clients pays: rustls measured 64% fewer
//! instructions for an ECDSA TLS 1.3 client handshake with aws-lc-rs than
//! with ring, and its P-256 verification is several times faster than the
//! pure-Rust one. Certificates are ECDSA P-256 (rcgen's default, and the
//! cheapest signature aws-lc-rs verifies). TLS 1.3 only (QUIC requires it);
//! servers issue stateless session tickets so a returning client resumes
//! without certificate signatures; no 0-RTT (calls have side effects).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::RootCertStore;

/// The name every server certificate carries and every client checks.
pub const SERVER_NAME: &str = "server.global.drover";
/// The name client certificates carry.
pub const CLIENT_NAME: &str = "client.global.drover";
/// The name operator certificates carry: a client certificate that may also
/// make operator calls (register jobs, read the cluster report), as
/// Nomad's `cli` certificates are for its CLI.
pub const OPERATOR_NAME: &str = "operator.global.drover";
/// The application protocol both sides insist on.
pub const ALPN: &[u8] = b"drover/1";
/// The ALPN of the server-to-server endpoint (raft, forwarding): a client
/// connection can never be taken for a peer's, or the other way round.
pub const PEER_ALPN: &[u8] = b"drover-peer/1";

/// How long a new CA is valid (as Nomad's `tls ca create`: five years).
const CA_VALIDITY: Duration = Duration::from_secs(5 * 365 * 24 * 3600);
/// How long a new server or client certificate is valid (one year).
const CERT_VALIDITY: Duration = Duration::from_secs(365 * 24 * 3600);

/// Why TLS material could not be made, read or used.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file could not be read.
    #[error("reading {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        source: std::io::Error,
    },
    /// A file holds no usable PEM of the kind expected.
    #[error("{path}: {what}")]
    BadPem {
        /// The file (or a description of in-memory material).
        path: PathBuf,
        /// What is missing or wrong.
        what: String,
    },
    /// Generating a key or certificate failed.
    #[error("generating a certificate: {0}")]
    Generate(#[from] rcgen::Error),
    /// rustls refused the material.
    #[error("TLS configuration: {0}")]
    Rustls(#[from] rustls::Error),
    /// The client verifier could not be built from the CA.
    #[error("the CA cannot verify clients: {0}")]
    Verifier(String),
    /// quinn refused the TLS configuration.
    #[error("QUIC TLS configuration: {0}")]
    Quic(String),
}

/// Which side a certificate is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// A server: presents [`SERVER_NAME`], authenticates as a TLS server.
    Server,
    /// A client agent: presents [`CLIENT_NAME`], authenticates as a TLS client.
    Client,
    /// An operator tool: presents [`OPERATOR_NAME`], authenticates as a TLS client.
    Operator,
}

/// A certificate and its private key, in PEM.
#[derive(Clone)]
pub struct Identity {
    /// The certificate (a chain, leaf first).
    pub cert_pem: String,
    /// The private key.
    pub key_pem: String,
}

impl std::fmt::Debug for Identity {
    /// Never prints the key.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Identity").field("cert_pem", &self.cert_pem).finish_non_exhaustive()
    }
}

/// A cluster CA that can sign certificates.
#[derive(Debug)]
pub struct CertificateAuthority {
    identity: Identity,
}

impl CertificateAuthority {
    /// A new CA with a new P-256 key.
    pub fn generate() -> Result<CertificateAuthority, TlsError> {
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, "Drover cluster CA");
        params.distinguished_name.push(DnType::OrganizationName, "Drover");
        params.key_usages =
            vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
        set_validity(&mut params, CA_VALIDITY);
        let cert = params.self_signed(&key)?;
        Ok(CertificateAuthority { identity: Identity { cert_pem: cert.pem(), key_pem: key.serialize_pem() } })
    }

    /// The CA from its certificate and key files.
    pub fn load(cert: &Path, key: &Path) -> Result<CertificateAuthority, TlsError> {
        let identity = Identity { cert_pem: read(cert)?, key_pem: read(key)? };
        Issuer::from_ca_cert_pem(&identity.cert_pem, key_pair(&identity.key_pem, key)?)
            .map_err(|error| bad(cert, format!("not a CA certificate: {error}")))?;
        Ok(CertificateAuthority { identity })
    }

    /// The CA's certificate and key.
    pub fn identity(&self) -> &Identity {
        &self.identity
    }

    /// A new certificate for `role`, with `extra_names` (DNS names or IP
    /// addresses) besides the role's name, signed by this CA.
    pub fn issue(&self, role: Role, extra_names: &[String]) -> Result<Identity, TlsError> {
        let issuer = Issuer::from_ca_cert_pem(&self.identity.cert_pem, KeyPair::from_pem(&self.identity.key_pem)?)?;
        let name = match role {
            Role::Server => SERVER_NAME,
            Role::Client => CLIENT_NAME,
            Role::Operator => OPERATOR_NAME,
        };
        let mut names = vec![name.to_string()];
        if role == Role::Server {
            // As Nomad's `tls cert create -server`: tools on the server's own
            // machine (the CLI, curl) reach its HTTP API by these names.
            names.extend(["localhost".to_string(), "127.0.0.1".to_string()]);
        }
        names.extend(extra_names.iter().cloned());
        let mut params = CertificateParams::new(names)?;
        params.distinguished_name.push(DnType::CommonName, name);
        params.use_authority_key_identifier_extension = true;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        // A server is also a client of the other servers (raft, forwarding),
        // as Nomad's server certificates are.
        params.extended_key_usages = match role {
            Role::Server => vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth],
            Role::Client | Role::Operator => vec![ExtendedKeyUsagePurpose::ClientAuth],
        };
        set_validity(&mut params, CERT_VALIDITY);
        let key = KeyPair::generate()?;
        let cert = params.signed_by(&key, &issuer)?;
        Ok(Identity { cert_pem: cert.pem(), key_pem: key.serialize_pem() })
    }
}

/// What one side of a connection needs: the cluster CA's certificate (to
/// check the peer) and its own identity.
#[derive(Clone, Debug)]
pub struct TlsMaterial {
    /// The cluster CA's certificate, PEM.
    pub ca_pem: String,
    /// This side's certificate and key.
    pub identity: Identity,
}

impl TlsMaterial {
    /// Reads the CA certificate, this side's certificate and its key.
    pub fn from_files(ca: &Path, cert: &Path, key: &Path) -> Result<TlsMaterial, TlsError> {
        let material =
            TlsMaterial { ca_pem: read(ca)?, identity: Identity { cert_pem: read(cert)?, key_pem: read(key)? } };
        roots(&material.ca_pem, ca)?;
        chain(&material.identity.cert_pem, cert)?;
        private_key(&material.identity.key_pem, key)?;
        Ok(material)
    }

    /// A throwaway CA in memory and material for one server and one
    /// client signed by it: `--dev` mode only.
    pub fn dev_pair() -> Result<(CertificateAuthority, TlsMaterial, TlsMaterial), TlsError> {
        let ca = CertificateAuthority::generate()?;
        let local = ["localhost".to_string(), "127.0.0.1".to_string()];
        let server = TlsMaterial { ca_pem: ca.identity.cert_pem.clone(), identity: ca.issue(Role::Server, &local)? };
        let client = TlsMaterial { ca_pem: ca.identity.cert_pem.clone(), identity: ca.issue(Role::Client, &[])? };
        Ok((ca, server, client))
    }

    /// The server side: requires a client certificate signed by the CA,
    /// issues stateless session tickets, TLS 1.3 only.
    pub fn server_crypto(&self) -> Result<Arc<quinn::crypto::rustls::QuicServerConfig>, TlsError> {
        self.quic_server_crypto(ALPN)
    }

    /// The server-to-server endpoint's side: as [`TlsMaterial::server_crypto`]
    /// with [`PEER_ALPN`]; the caller checks the peer is a server
    /// ([`is_server`]).
    pub fn peer_server_crypto(&self) -> Result<Arc<quinn::crypto::rustls::QuicServerConfig>, TlsError> {
        self.quic_server_crypto(PEER_ALPN)
    }

    fn quic_server_crypto(&self, alpn: &[u8]) -> Result<Arc<quinn::crypto::rustls::QuicServerConfig>, TlsError> {
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let roots = Arc::new(roots(&self.ca_pem, Path::new("<cluster CA>"))?);
        let verifier = WebPkiClientVerifier::builder_with_provider(roots, provider.clone())
            .build()
            .map_err(|error| TlsError::Verifier(error.to_string()))?;
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13])?
            .with_client_cert_verifier(verifier)
            .with_single_cert(
                chain(&self.identity.cert_pem, Path::new("<server certificate>"))?,
                private_key(&self.identity.key_pem, Path::new("<server key>"))?,
            )?;
        config.alpn_protocols = vec![alpn.to_vec()];
        // Stateless tickets: a reconnecting client resumes with a PSK and a
        // fresh key exchange, skipping the signature and both chain
        // verifications, and the server keeps no per-client session state.
        config.ticketer = rustls::crypto::aws_lc_rs::Ticketer::new()?;
        config.send_tls13_tickets = 1;
        config.max_early_data_size = 0;
        let quic = quinn::crypto::rustls::QuicServerConfig::try_from(config)
            .map_err(|error| TlsError::Quic(error.to_string()))?;
        Ok(Arc::new(quic))
    }

    /// The HTTP API's side (HTTPS, TLS 1.2 and 1.3, HTTP/1.1): the server's
    /// certificate; clients are not asked for one unless `verify_clients`
    /// (Nomad's `verify_https_client`), since the API authenticates
    /// requests with ACL tokens and browsers and scripts have no cluster
    /// certificate.
    pub fn https_server_config(&self, verify_clients: bool) -> Result<Arc<rustls::ServerConfig>, TlsError> {
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let builder =
            rustls::ServerConfig::builder_with_provider(provider.clone()).with_safe_default_protocol_versions()?;
        let builder = if verify_clients {
            let roots = Arc::new(roots(&self.ca_pem, Path::new("<cluster CA>"))?);
            let verifier = WebPkiClientVerifier::builder_with_provider(roots, provider)
                .build()
                .map_err(|error| TlsError::Verifier(error.to_string()))?;
            builder.with_client_cert_verifier(verifier)
        } else {
            builder.with_no_client_auth()
        };
        let mut config = builder.with_single_cert(
            chain(&self.identity.cert_pem, Path::new("<server certificate>"))?,
            private_key(&self.identity.key_pem, Path::new("<server key>"))?,
        )?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Arc::new(config))
    }

    /// The client side: checks the server's chain and name, presents this
    /// side's certificate. `sessions` is how many resumption tickets the
    /// config keeps; connections made with one config share them.
    pub fn client_crypto(&self, sessions: usize) -> Result<Arc<quinn::crypto::rustls::QuicClientConfig>, TlsError> {
        self.quic_client_crypto(ALPN, sessions)
    }

    /// A server's side when it calls another server: its own server
    /// certificate, [`PEER_ALPN`].
    pub fn peer_client_crypto(&self) -> Result<Arc<quinn::crypto::rustls::QuicClientConfig>, TlsError> {
        self.quic_client_crypto(PEER_ALPN, 8)
    }

    fn quic_client_crypto(
        &self,
        alpn: &[u8],
        sessions: usize,
    ) -> Result<Arc<quinn::crypto::rustls::QuicClientConfig>, TlsError> {
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let mut config = rustls::ClientConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13])?
            .with_root_certificates(roots(&self.ca_pem, Path::new("<cluster CA>"))?)
            .with_client_auth_cert(
                chain(&self.identity.cert_pem, Path::new("<client certificate>"))?,
                private_key(&self.identity.key_pem, Path::new("<client key>"))?,
            )?;
        config.alpn_protocols = vec![alpn.to_vec()];
        config.resumption = rustls::client::Resumption::in_memory_sessions(sessions);
        let quic = quinn::crypto::rustls::QuicClientConfig::try_from(config)
            .map_err(|error| TlsError::Quic(error.to_string()))?;
        Ok(Arc::new(quic))
    }
}

/// Whether the peer of `connection` presented a certificate naming
/// [`OPERATOR_NAME`] (the handshake already checked it is the cluster CA's).
pub fn is_operator(connection: &quinn::Connection) -> bool {
    presents_name(connection, OPERATOR_NAME)
}

/// Whether the peer of `connection` presented a certificate naming
/// [`SERVER_NAME`]: another server of the cluster.
pub fn is_server(connection: &quinn::Connection) -> bool {
    presents_name(connection, SERVER_NAME)
}

fn presents_name(connection: &quinn::Connection, wanted: &str) -> bool {
    let Some(identity) = connection.peer_identity() else { return false };
    let Ok(chain) = identity.downcast::<Vec<CertificateDer<'static>>>() else { return false };
    let Some(leaf) = chain.first() else { return false };
    let Ok((_, cert)) = x509_parser::parse_x509_certificate(leaf) else { return false };
    let Ok(Some(names)) = cert.subject_alternative_name() else { return false };
    names
        .value
        .general_names
        .iter()
        .any(|name| matches!(name, x509_parser::extensions::GeneralName::DNSName(dns) if *dns == wanted))
}

/// Valid from an hour ago (clock skew) for `validity`.
fn set_validity(params: &mut CertificateParams, validity: Duration) {
    let now = SystemTime::now();
    params.not_before = (now - Duration::from_secs(3600)).into();
    params.not_after = (now + validity).into();
}

fn read(path: &Path) -> Result<String, TlsError> {
    std::fs::read_to_string(path).map_err(|source| TlsError::Read { path: path.to_path_buf(), source })
}

fn bad(path: &Path, what: impl Into<String>) -> TlsError {
    TlsError::BadPem { path: path.to_path_buf(), what: what.into() }
}

fn key_pair(pem: &str, path: &Path) -> Result<KeyPair, TlsError> {
    KeyPair::from_pem(pem).map_err(|error| bad(path, format!("not a private key: {error}")))
}

/// The certificates in `pem`, leaf first; at least one.
fn chain(pem: &str, path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_slice_iter(pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|error| bad(path, format!("unreadable certificate PEM: {error}")))?;
    if certs.is_empty() {
        return Err(bad(path, "no certificate in the file"));
    }
    Ok(certs)
}

fn private_key(pem: &str, path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    PrivateKeyDer::from_pem_slice(pem.as_bytes()).map_err(|error| bad(path, format!("no usable private key: {error}")))
}

fn roots(pem: &str, path: &Path) -> Result<RootCertStore, TlsError> {
    let mut store = RootCertStore::empty();
    for cert in chain(pem, path)? {
        store.add(cert).map_err(|error| bad(path, format!("not a usable CA certificate: {error}")))?;
    }
    Ok(store)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn issued_certificates_load_back_and_build_both_sides() {
        let (ca, server, client) = TlsMaterial::dev_pair().expect("dev material");
        server.server_crypto().expect("server config");
        client.client_crypto(4).expect("client config");
        let dir = std::env::temp_dir().join(format!("drover-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let write = |name: &str, text: &str| {
            let path = dir.join(name);
            std::fs::write(&path, text).expect("write");
            path
        };
        let ca_cert = write("ca.pem", &ca.identity().cert_pem);
        let ca_key = write("ca-key.pem", &ca.identity().key_pem);
        let reloaded = CertificateAuthority::load(&ca_cert, &ca_key).expect("CA loads");
        let issued = reloaded.issue(Role::Client, &[]).expect("issued by the reloaded CA");
        let cert = write("client.pem", &issued.cert_pem);
        let key = write("client-key.pem", &issued.key_pem);
        TlsMaterial::from_files(&ca_cert, &cert, &key).expect("files load").client_crypto(1).expect("config");
        std::fs::remove_dir_all(&dir).expect("clean up");
    }

    #[test]
    fn a_file_without_pem_is_named_in_the_error() {
        let path = std::env::temp_dir().join(format!("drover-not-pem-{}", std::process::id()));
        std::fs::write(&path, "hello").expect("write");
        let error = TlsMaterial::from_files(&path, &path, &path).expect_err("not PEM");
        assert!(error.to_string().contains(&path.display().to_string()), "{error}");
        std::fs::remove_file(&path).expect("clean up");
    }
}
