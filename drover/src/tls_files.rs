//! `drover tls ca create` and `drover tls cert create`: a cluster CA and the
//! certificates signed by it, written as PEM files named as Nomad names
//! them (with `drover` for `nomad`). Existing files are never overwritten.

use std::path::{Path, PathBuf};

use transport::tls::{CertificateAuthority, Identity, Role, TlsError};

/// The CA certificate's file name.
pub const CA_CERT: &str = "drover-agent-ca.pem";
/// The CA key's file name.
pub const CA_KEY: &str = "drover-agent-ca-key.pem";

/// Why files could not be written.
#[derive(Debug, thiserror::Error)]
pub enum TlsFilesError {
    /// Making or reading the material failed.
    #[error(transparent)]
    Tls(#[from] TlsError),
    /// A file exists already.
    #[error("{0} exists; remove it first or write elsewhere (--dir)")]
    Exists(PathBuf),
    /// Writing failed.
    #[error("writing {path}: {source}")]
    Write {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

/// Writes a new CA into `dir`; returns the files written.
pub fn create_ca(dir: &Path) -> Result<Vec<PathBuf>, TlsFilesError> {
    let ca = CertificateAuthority::generate()?;
    write_pair(dir, CA_CERT, CA_KEY, ca.identity())
}

/// Writes a new certificate for `role` signed by the CA in `ca_cert` and
/// `ca_key`, with `extra_names`, into `dir`; returns the files written.
pub fn create_cert(
    dir: &Path,
    role: Role,
    ca_cert: &Path,
    ca_key: &Path,
    extra_names: &[String],
) -> Result<Vec<PathBuf>, TlsFilesError> {
    let ca = CertificateAuthority::load(ca_cert, ca_key)?;
    let identity = ca.issue(role, extra_names)?;
    let stem = match role {
        Role::Server => "global-server-drover",
        Role::Client => "global-client-drover",
        Role::Operator => "global-cli-drover",
    };
    write_pair(dir, &format!("{stem}.pem"), &format!("{stem}-key.pem"), &identity)
}

fn write_pair(dir: &Path, cert: &str, key: &str, identity: &Identity) -> Result<Vec<PathBuf>, TlsFilesError> {
    let cert = dir.join(cert);
    let key = dir.join(key);
    for path in [&cert, &key] {
        if path.exists() {
            return Err(TlsFilesError::Exists(path.clone()));
        }
    }
    write(&cert, &identity.cert_pem, 0o644)?;
    write(&key, &identity.key_pem, 0o600)?;
    Ok(vec![cert, key])
}

fn write(path: &Path, text: &str, mode: u32) -> Result<(), TlsFilesError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let failed = |source| TlsFilesError::Write { path: path.to_path_buf(), source };
    let mut file = std::fs::OpenOptions::new().write(true).create_new(true).mode(mode).open(path).map_err(failed)?;
    file.write_all(text.as_bytes()).map_err(failed)?;
    file.sync_all().map_err(failed)
}
