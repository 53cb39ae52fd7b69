//! `drover tls ca create` and `drover tls cert create`: a cluster CA and the
//! certificates signed by it, written as PEM files named as Nomad names
//! them (with `drover` for `nomad`). Existing files are never overwritten.
//! Keys are readable by their owner only (0600), from their creation on,
//! as Nomad writes them; certificates are 0644.

use std::path::{Path, PathBuf};

use transport::tls::{CertificateAuthority, Identity, Role, TlsError};

/// The CA certificate's file name.
pub const CA_CERT: &str = "drover-agent-ca.pem";
/// The CA key's file name.
pub const CA_KEY: &str = "drover-agent-ca-key.pem";

/// The mode of a key file: its owner's only.
pub const KEY_MODE: u32 = 0o600;

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
    write(&key, &identity.key_pem, KEY_MODE)?;
    Ok(vec![cert, key])
}

fn write(path: &Path, text: &str, mode: u32) -> Result<(), TlsFilesError> {
    storage::write_atomic(path, text.as_bytes(), mode)
        .map_err(|source| TlsFilesError::Write { path: path.to_path_buf(), source })
}

/// Writes a key to `path`, replacing the file if there is one (a dev
/// server's throwaway client key, written again on every start), owner-only:
/// a new file with [`KEY_MODE`] is renamed over the old one, so a file an
/// older build left readable goes with its mode.
pub fn replace_key(path: &Path, text: &str) -> Result<(), TlsFilesError> {
    storage::write_atomic(path, text.as_bytes(), KEY_MODE)
        .map_err(|source| TlsFilesError::Write { path: path.to_path_buf(), source })
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    fn mode(path: &Path) -> u32 {
        std::fs::metadata(path).expect("exists").permissions().mode() & 0o777
    }

    /// A fresh directory for one test.
    fn temp_dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("drover-tls-files-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("temp dir");
        dir
    }

    #[test]
    fn keys_are_owner_only_and_certificates_readable() {
        let dir = temp_dir("modes");
        let written = create_ca(&dir).expect("writes the CA");
        assert_eq!((mode(&written[0]), mode(&written[1])), (0o644, KEY_MODE), "{written:?}");
        let ca = (dir.join(CA_CERT), dir.join(CA_KEY));
        let written = create_cert(&dir, Role::Server, &ca.0, &ca.1, &[]).expect("writes a certificate");
        assert_eq!((mode(&written[0]), mode(&written[1])), (0o644, KEY_MODE), "{written:?}");
        std::fs::remove_dir_all(&dir).expect("clean up");
    }

    #[test]
    fn a_replaced_key_is_owner_only_even_over_a_readable_file() {
        let dir = temp_dir("replace");
        let path = dir.join("client-key.pem");
        std::fs::write(&path, "old").expect("writes");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).expect("loosens");
        replace_key(&path, "new key").expect("replaces");
        assert_eq!(mode(&path), KEY_MODE);
        assert_eq!(std::fs::read_to_string(&path).expect("reads"), "new key");
        std::fs::remove_dir_all(&dir).expect("clean up");
    }
}
